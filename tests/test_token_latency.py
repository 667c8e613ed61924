"""TPOT and ITL beside TTFT: what a request's token times mean, the budgets' validation, the judge,
results.json, the stopping rule, update-thresholds and the streaming client over real HTTP.

Request records here are synthetic (built from guard.model.records' dataclasses, no engine): the
engine's own token times are the engine tests' (tests/test_e2e.py)."""

from __future__ import annotations

import json
import math

import pytest

from guard import cli
from guard.commands import update_thresholds as ut
from guard.config.loading import load_thresholds
from guard.errors import ConfigError
from guard.judge.evaluate import evaluate, evaluate_ab
from guard.judge.sequential import single_run_rule
from guard.measure.inprocess import TokenClock
from guard.measure.server import request_function, run_jobs_http
from guard.measure.side import Job, plan_jobs
from guard.model.jsonfiles import results_from_dict, results_to_dict, write_json_atomic
from guard.model.records import ITL, TPOT, TTFT, ABRecord, RequestOutcome, RunRecord, Status, Verdict, latency_samples
from guard.model.schema import RESULTS_SCHEMA, validate
from guard.report.markdown import render_markdown
from guard.report.terminal import render_terminal
from tests.test_server import SSEServer

ENV = {"hardware_profile": "cpu", "cuda": False, "gpu": None, "cpu": "Test CPU", "cpu_count": 2,
       "hardware_match": {"ok": True, "reason": None, "rule": {"cuda": False, "gpu_name_regex": None}},
       "gpu_state": None}


def budget_file(tmp_path, budgets: str, max_tokens: int = 16, modes: str = "") -> str:
    path = tmp_path / "t.yaml"
    path.write_text(f"""schema_version: 1
model: deepseek-ocr-2
profiles:
  cpu:
    match: {{cuda: false}}
    engine: {{model: 'guard:tiny-deepseek-ocr2', load_format: dummy, max_model_len: 2048}}
    workload:
      requests: 6
      image_sizes: [[640, 480]]
      prompt: "<image>\\nFree OCR."
      max_tokens: {max_tokens}
    statistics: {{confidence: 0.95, max_requests: 24, batch: 6}}
    headroom_pct: 15
    budgets:
      ttft_ms: {{p50: 7000}}
{budgets}{modes}""")
    return str(path)


def request(i: int, ttft_s: float = 5.0, gap_s: float = 0.002, tokens: int = 16, success: bool = True) -> RequestOutcome:
    gaps = tuple(gap_s * (1 + 0.01 * (k % 3)) for k in range(tokens - 1))
    return RequestOutcome(i, (640, 480), False, success, ttft_client_s=ttft_s, output_tokens=tokens,
                          latency_s=ttft_s + sum(gaps), itl_s=gaps)


def run_of(outcomes, path: str) -> RunRecord:
    return RunRecord(profile="cpu", thresholds_path=path, model="deepseek-ocr-2", environment=dict(ENV),
                     outcomes=list(outcomes), rounds=1)


# ----------------------------------------------------------------------------- what the numbers mean
def test_tpot_is_vllm_bench_serves_and_itl_pools_every_gap():
    a = RequestOutcome(0, (640, 480), False, True, ttft_client_s=1.0, output_tokens=5, latency_s=1.4,
                       itl_s=(0.1, 0.1, 0.1, 0.1))
    b = RequestOutcome(1, (640, 480), False, True, ttft_client_s=1.0, output_tokens=3, latency_s=1.6, itl_s=(0.3, 0.3))
    one_token = RequestOutcome(2, (640, 480), False, True, ttft_client_s=1.0, output_tokens=1, latency_s=1.0)
    failed = RequestOutcome(3, (640, 480), False, False, error="boom", itl_s=(9.0,))
    assert math.isclose(a.tpot_s, 0.1) and math.isclose(b.tpot_s, 0.3) and one_token.tpot_s is None
    outcomes = [a, b, one_token, failed]
    assert latency_samples(outcomes, TTFT) == [1.0, 1.0, 1.0]
    assert [round(t, 6) for t in latency_samples(outcomes, TPOT)] == [0.1, 0.3]
    assert latency_samples(outcomes, ITL) == [0.1] * 4 + [0.3] * 2  # a failed request's gaps are no sample


def test_the_in_process_clock_counts_a_gap_per_step_that_brought_tokens():
    clock = TokenClock(Job(0, (640, 480), False), submitted=10.0)
    clock.saw(0, 10.5)  # a step that returned nothing for it yet
    clock.saw(1, 12.0)
    clock.saw(1, 12.1)  # cumulative output unchanged: no token, no gap
    clock.saw(3, 12.3)  # two tokens in one step (speculative decoding): one gap, as one streamed chunk
    clock.saw(4, 12.4)
    assert clock.ttft == 2.0 and clock.tokens == 4
    assert [round(g, 6) for g in clock.gaps] == [0.3, 0.1]


# ----------------------------------------------------------------------------- the budget file
def test_token_budgets_load_beside_ttft_and_per_mode(tmp_path):
    path = budget_file(tmp_path, "      tpot_ms: {p50: 2.5}\n      itl_ms: {p50: 2.5, p90: 3}\n",
                       modes="      modes:\n        server: {ttft_ms: {p50: 14000}, tpot_ms: {p50: 30}}\n")
    cpu = load_thresholds(path).profile("cpu")
    assert cpu.latency_budgets == {TTFT: {"p50": 7000}, TPOT: {"p50": 2.5}, ITL: {"p50": 2.5, "p90": 3}}
    server = cpu.with_engine_mode("server")
    assert server.latency_budgets == {TTFT: {"p50": 14000}, TPOT: {"p50": 30}}  # the mode's own, no ITL there
    assert server.budget_key(TPOT) == ("modes", "server", "tpot_ms") and cpu.budget_key(ITL) == ("itl_ms",)


@pytest.mark.parametrize("budgets, modes, key", [
    ("      tpot_ms: {p50: 2.5}\n", "", "budgets.tpot_ms"),
    ("      itl_ms: {p90: 3}\n", "", "budgets.itl_ms"),
    ("", "      modes:\n        server: {ttft_ms: {p50: 14000}, itl_ms: {p50: 30}}\n", "budgets.modes.server.itl_ms"),
    ("      tpot_vs_baseline_pct: {p50: 5}\n", "", "budgets.tpot_vs_baseline_pct"),
])
def test_a_token_budget_over_one_token_requests_is_refused_by_file_line_and_key(tmp_path, budgets, modes, key):
    path = budget_file(tmp_path, budgets, max_tokens=1, modes=modes)
    with pytest.raises(ConfigError) as err:
        load_thresholds(path)
    said = str(err.value)
    assert f"t.yaml:" in said and f"profiles.cpu.{key}" in said and "max_tokens is 1" in said


def test_a_tpot_percentile_the_request_cap_cannot_decide_is_refused(tmp_path):
    """TPOT has one sample per request, like TTFT: p99 needs 368 requests at 95 %, the cap is 24."""
    with pytest.raises(ConfigError, match="tpot_ms.p99: cannot be decided within statistics.max_requests 24"):
        load_thresholds(budget_file(tmp_path, "      tpot_ms: {p99: 3}\n"))
    load_thresholds(budget_file(tmp_path, "      itl_ms: {p99: 3}\n"))  # ITL's samples are gaps, many a request


# ----------------------------------------------------------------------------- judged like TTFT
def test_tpot_and_itl_are_judged_beside_ttft_and_written_to_results(tmp_path):
    path = budget_file(tmp_path, "      tpot_ms: {p50: 2.5}\n      itl_ms: {p50: 1.5, p90: 3}\n")
    cpu = load_thresholds(path).profile("cpu")
    results = evaluate(cpu, run_of([request(i) for i in range(6)], path))
    by_label = {c.label: c for c in results.token_checks}
    assert set(by_label) == {"tpot p50", "itl p50", "itl p90"}
    assert by_label["tpot p50"].status == Status.PASS and by_label["tpot p50"].samples == 6
    assert by_label["itl p50"].status == Status.FAIL and by_label["itl p50"].samples == 90  # 2 ms gaps > 1.5 ms
    assert results.verdict == Verdict.REGRESSION and results.exit_code == 1
    data = json.loads(json.dumps(results_to_dict(results)))  # as results.json holds it
    validate(data, tmp_path / "results.json", RESULTS_SCHEMA)
    assert [c["percentile"] for c in data["checks"]["itl"]] == ["p50", "p90"] and "metric" not in data["checks"]["tpot"][0]
    again = results_from_dict(data)
    assert again.token_checks == results.token_checks and again.run.outcomes == results.run.outcomes
    terminal = render_terminal(results)
    assert "TPOT over 6 requests: p50 2.0" in terminal and "ITL over 90 inter-token gaps" in terminal
    assert "itl p50" in terminal and "FAIL" in terminal.upper()
    comment = render_markdown(results)
    assert "### Time per output token, inter-token latency" in comment and "`itl p50`" in comment
    assert "**1. ITL**" in comment and "ITL p50 2.02 ms is over its budget &lt;= 1.50 ms" in comment


def test_token_budgets_follow_ttfts_not_judged_rules(tmp_path):
    """Bound to another CPU they are shown, not judged; without a second token the run is invalid."""
    path = budget_file(tmp_path, "      tpot_ms: {p50: 1}\n      ttft_hardware: {cpu_model_regex: '^Other CPU$'}\n")
    cpu = load_thresholds(path).profile("cpu")
    shown = evaluate(cpu, run_of([request(i) for i in range(6)], path))
    assert [c.status for c in shown.token_checks] == [Status.NOT_JUDGED] and shown.verdict == Verdict.PASS
    path = budget_file(tmp_path, "      tpot_ms: {p50: 1}\n")
    one_token = evaluate(load_thresholds(path).profile("cpu"), run_of([request(i, tokens=1) for i in range(6)], path))
    assert one_token.verdict == Verdict.INVALID
    assert any("no TPOT samples were measured" in r.text for r in one_token.invalid_reasons)


def test_the_stopping_rule_resamples_while_a_tpot_budget_is_undecided(tmp_path):
    path = budget_file(tmp_path, "      tpot_ms: {p50: 2.05}\n")
    rule = single_run_rule(load_thresholds(path).profile("cpu"))
    close = [request(i, gap_s=0.0020 + 0.0001 * (i % 2)) for i in range(6)]  # TPOT straddles 2.05 ms
    pending = rule.undecided(close)
    assert [(d.metric, d.key) for d in pending] == [(TPOT, "p50")] and rule.next_batch(6, True) == 6
    assert "tpot p50" in rule.describe(pending)
    assert rule.undecided([request(i, gap_s=0.001) for i in range(6)]) == []


def test_update_thresholds_writes_tpot_and_itl_with_the_ttft_budget(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(ut, "git_commit", lambda cwd=None: None)
    path = budget_file(tmp_path, "      tpot_ms: {p50: 9}\n      itl_ms: {p90: 9}\n")
    results = evaluate(load_thresholds(path).profile("cpu"), run_of([request(i) for i in range(6)], path))
    write_json_atomic(tmp_path / "results.json", results_to_dict(results))
    code = cli.main(["update-thresholds", "--from", str(tmp_path / "results.json"), "--thresholds", path])
    out, err = capsys.readouterr()
    assert code == 0, err
    cpu = load_thresholds(path).profile("cpu")
    tpot = next(c for c in results.token_checks if c.metric == TPOT).measured_ms
    assert cpu.token_ms[TPOT]["p50"] == ut.ttft_budget(tpot, 15) and 2.0 < cpu.token_ms[TPOT]["p50"] < 2.6
    assert 2.0 < cpu.token_ms[ITL]["p90"] < 2.6 and "tpot_ms.p50" in out


# ----------------------------------------------------------------------------- through a server, real HTTP
@pytest.mark.parametrize("prefer_vllm", [True, False], ids=["vllm-request-func", "guard-fallback"])
def test_a_streamed_request_gives_ttft_tpot_and_itl_as_vllm_bench_serve_does(prefer_vllm):
    workload = load_thresholds("thresholds/deepseek-ocr-2.yaml").profile("cpu").workload
    _, func = request_function(prefer_vllm)
    with SSEServer(first_chunk_s=0.2, tokens=4, gap_s=0.05) as srv:
        (o,) = run_jobs_http(srv.url, "m", workload, plan_jobs(workload, 0, 1, False), func=func)
    assert o.success and 0.2 <= o.ttft_client_s < 0.4 and o.output_tokens == 4
    # the role chunk is the first with choices (TTFT), then one gap per token chunk
    assert len(o.itl_s) == 4 and all(0.04 <= g < 0.2 for g in o.itl_s[1:])
    assert math.isclose(o.latency_s, o.ttft_client_s + sum(o.itl_s), rel_tol=1e-6)
    assert 0.05 <= o.tpot_s < 0.12  # (latency - TTFT) / 3: the 4 gaps over 3 tokens after the first


# ----------------------------------------------------------------------------- A/B: the paired TPOT ratio
def ab_record(path: str, slower: float) -> ABRecord:
    """Both sides' timed requests, the candidate's decode steps ``slower`` times the baseline's, with a
    small per-pair wobble (synthetic)."""
    base = [request(i, gap_s=0.002 * (1 + 0.02 * ((i * 7) % 5 - 2))) for i in range(8)]
    cand = [request(i, gap_s=0.002 * (1 + 0.02 * ((i * 3) % 5 - 2)) * slower) for i in range(8)]
    return ABRecord(candidate=run_of(cand, path), baseline=run_of(base, path), baseline_python="/base/bin/python",
                    order=["candidate", "baseline"] * 4)


@pytest.mark.parametrize("slower, status", [(1.0, Status.PASS), (1.15, Status.FAIL)])
def test_ab_judges_each_requests_tpot_against_its_baseline_twin(tmp_path, slower, status):
    path = budget_file(tmp_path, "      ttft_vs_baseline_pct: {p50: 2.5}\n      tpot_vs_baseline_pct: {p50: 5}\n")
    cpu = load_thresholds(path).profile("cpu")
    results = evaluate_ab(cpu, ab_record(path, slower))
    (tpot,) = [c for c in results.ab_checks if c.metric == TPOT]
    assert tpot.label == "tpot p50 vs baseline" and tpot.pairs == 8 and tpot.status == status
    assert (tpot.measured_pct > 10) == (status == Status.FAIL)
    data = json.loads(json.dumps(results_to_dict(results)))
    validate(data, tmp_path / "results.json", RESULTS_SCHEMA)
    assert [c["percentile"] for c in data["checks"]["tpot_vs_baseline"]] == ["p50"]
    assert results_from_dict(data).ab_checks == results.ab_checks
    if status == Status.FAIL:
        assert "TPOT p50 is +15" in render_markdown(results) and "tpot p50 vs baseline" in render_terminal(results)
