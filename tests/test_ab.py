"""A/B mode's pure core (guard.judge.ab), its budgets in the YAML, and the worker protocol with real
worker processes (no engine: the protocol, the path mechanism and a dying worker)."""

from __future__ import annotations

import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from guard.measure.run import block_order, blocks
from guard.judge.sequential import ab_run_rule
from guard.model.checks import pairs
from guard.judge.ab import decide_ratio, op_diff, undecided_ratios
from guard.config.budgets import Statistics
from guard.config.loading import load_thresholds
from guard.errors import ConfigError, UsageError
from guard.model.records import BASELINE, CANDIDATE, InvalidReason, ReasonKind, RequestOutcome, ScopeCounts
from guard.measure.inprocess import parse_inject
from guard.measure.worker import GUARD_ROOT, WorkerClient, WorkerDied, WorkerError, worker_env
from tests.conftest import benchmark_script
from tests.test_budgets import GOOD, write


# ----------------------------------------------------------------------------- schedule
def test_blocks_alternate_abba_over_the_whole_run():
    firsts = [block_order(b)[0] for b in range(6)]
    assert firsts == [CANDIDATE, BASELINE] * 3
    assert all(set(block_order(b)) == {CANDIDATE, BASELINE} for b in range(6))
    # as a flat sequence of sides: A B B A A B B A ...
    assert "".join(s[0].upper() for b in range(4) for s in block_order(b)).replace("C", "A") == "ABBAABBA"


def test_blocks_follow_the_concurrency():
    assert blocks([0, 1, 2, 3, 4], 2) == [[0, 1], [2, 3], [4]]
    assert blocks([7, 8], 1) == [[7], [8]]
    assert blocks([1, 2], 0) == [[1], [2]]


# ----------------------------------------------------------------------------- pairs
def _o(i, s, warmup=False, success=True):
    return RequestOutcome(index=i, image_size=(640, 480), warmup=warmup, success=success,
                          ttft_client_s=s if success else None, error=None if success else "boom")


def test_pairs_match_measured_requests_by_index():
    cand = [_o(0, 9.0, warmup=True), _o(1, 6.6), _o(2, 6.0), _o(3, 5.0, success=False), _o(4, 7.0)]
    base = [_o(0, 1.0, warmup=True), _o(2, 5.0), _o(1, 6.0), _o(3, 5.0), _o(5, 3.0)]
    got = pairs(cand, base)
    assert [p.index for p in got] == [1, 2]  # warm-ups, failures and one-sided requests are not pairs
    assert got[0].ratio == pytest.approx(1.1) and got[1].ratio == pytest.approx(1.2)


# ----------------------------------------------------------------------------- verdict
def test_ratio_interval_decides_like_the_absolute_rule():
    ratios = [1.00, 1.01, 0.99, 1.02, 0.98, 1.005]  # n = 6: the signed-rank interval is [min, max]
    d = decide_ratio("p50", 5.0, ratios, 0.95)
    assert d.status == "pass" and d.pairs == 6
    assert d.interval_pct == pytest.approx((-2.0, 2.0))
    logs = [math.log(r) for r in ratios]  # Hodges-Lehmann: the median of the 21 Walsh averages of log r
    walsh = [(logs[i] + logs[j]) / 2 for i in range(6) for j in range(i, 6)]
    assert d.estimate_pct == pytest.approx((math.exp(statistics.median(walsh)) - 1) * 100)
    assert decide_ratio("p50", 1.0, ratios, 0.95).status == "inconclusive"
    slow = [r * 1.10 for r in ratios]
    assert decide_ratio("p50", 5.0, slow, 0.95).status == "fail"


def test_ratio_interval_side_missing_at_small_n_is_infinite():
    d = decide_ratio("p50", 5.0, [1.0] * 5, 0.95)  # 5 pairs: no two-sided 95 % interval for the median
    assert d.interval_pct == (-math.inf, math.inf) and d.status == "inconclusive"
    d = decide_ratio("p90", 5.0, [1.2] * 10, 0.95)  # p90: a lower bound exists early, no upper one
    assert d.status == "fail" and math.isinf(d.interval_pct[1])


def test_undecided_lists_only_straddling_budgets():
    ratios = [1.00, 1.01, 0.99, 1.02, 0.98, 1.005]
    stats = Statistics(confidence=0.95)
    assert undecided_ratios({"p50": 5.0}, ratios, stats) == []
    (u,) = undecided_ratios({"p50": 1.0}, ratios, stats)
    assert u.key == "p50"
    assert undecided_ratios({"p50": 1.0}, [], stats) == []
    with pytest.raises(ValueError):
        decide_ratio("p50", 1.0, [], 0.95)


def test_the_ab_run_rule_is_the_ratio_budgets_at_ab_statistics(ab_profile):
    """What ABRun is given (guard check, guard pr): ``undecided_ratios`` at ``Profile.ab_statistics``,
    in batches of ``ab.batch``; the progress line's words are each decision's own."""
    rule = ab_run_rule(ab_profile)
    stats = ab_profile.ab_statistics
    ratios = [1.00, 1.10, 0.92, 1.07, 0.95, 1.04]
    pending = rule.undecided(ratios)
    assert pending == undecided_ratios(ab_profile.ttft_vs_baseline_pct, ratios, stats) != []
    assert rule.next_batch(6, True) == min(ab_profile.ab.batch, stats.max_requests - 6) and rule.cap == stats.max_requests
    d = pending[0]
    assert rule.describe(pending).startswith(f"{d.key} interval [{d.interval_pct[0]:+.1f}, {d.interval_pct[1]:+.1f}] % "
                                             f"vs budget +{d.budget_pct:g} %")


def test_paired_ratio_cancels_drift_that_would_break_an_absolute_comparison():
    """A machine that slows down 30 % half way through: paired ratios stay at 1."""
    rng = random.Random(1)
    base = [6.0 * (1.3 if i >= 10 else 1.0) * rng.uniform(0.99, 1.01) for i in range(20)]
    cand = [b * rng.uniform(0.99, 1.01) for b in base]
    ratios = [c / b for c, b in zip(cand, base)]
    assert decide_ratio("p50", 3.0, ratios, 0.95).status == "pass"


# ----------------------------------------------------------------------------- op diff
def _sc(scope, counts, total, entered=1, size=(640, 480)):
    return ScopeCounts(scope=scope, image_size=size, entries=entered, calls_by_op=counts, total_calls=total)


def test_op_diff_shows_only_what_changed():
    base = [_sc("mask_path", {"aten::ones": 1, "aten::tril": 1}, 2)]
    cand = [_sc("mask_path", {"aten::ones": 1, "aten::_index_put_impl_": 513, "aten::nonzero": 2}, 516)]
    diff = op_diff(cand, base)
    assert [(d.op, d.baseline_calls, d.candidate_calls) for d in diff] == [
        ("aten::_index_put_impl_", 0, 513), ("aten::nonzero", 0, 2), ("aten::tril", 1, 0), ("total_ops", 2, 516)]
    assert diff[0].delta_calls == 513
    assert op_diff(base, base) == []


def test_op_diff_scope_on_one_side_only():
    diff = op_diff([_sc("s", {"a": 1}, 1)], [])
    assert {(d.op, d.baseline_calls, d.candidate_calls) for d in diff} == {("a", 0, 1), ("total_ops", 0, 1), ("entries", 0, 1)}


# ----------------------------------------------------------------------------- budgets
AB_GOOD = GOOD.replace("      ttft_ms: {p50: 9000, p99: 10000}",
                       "      ttft_ms: {p50: 9000, p99: 10000}\n      ttft_vs_baseline_pct: {p50: 2.5}")


def test_ab_budget_and_memory_split_load(tmp_path: Path):
    text = AB_GOOD.replace("    budgets:", "    ab:\n      gpu_memory_utilization: {candidate: 0.45, baseline: 0.4}\n    budgets:")
    p = load_thresholds(write(tmp_path, text)).profile("cpu")
    assert p.ttft_vs_baseline_pct == {"p50": 2.5}
    assert p.ab.gpu_memory_utilization(CANDIDATE) == 0.45 and p.ab.gpu_memory_utilization(BASELINE) == 0.4
    assert p.ab.batch is None  # resample by statistics.batch
    assert p.ab.confidence is None and p.ab_statistics.confidence == p.statistics.confidence


def test_ab_batch_loads_alone_or_with_the_memory_split(tmp_path: Path):
    alone = load_thresholds(write(tmp_path, AB_GOOD.replace("    budgets:", "    ab:\n      batch: 2\n    budgets:")))
    assert alone.profile("cpu").ab.batch == 2
    both = AB_GOOD.replace("    budgets:", "    ab:\n      batch: 3\n      gpu_memory_utilization: {candidate: 0.4}\n    budgets:")
    p = load_thresholds(write(tmp_path, both)).profile("cpu")
    assert (p.ab.batch, p.ab.gpu_memory_utilization(CANDIDATE)) == (3, 0.4)


def test_ab_confidence_sets_the_ratio_interval_level_and_nothing_else(tmp_path: Path):
    p = load_thresholds(write(tmp_path, AB_GOOD.replace("    budgets:", "    ab:\n      confidence: 0.8\n    budgets:"))).profile("cpu")
    assert p.ab.confidence == 0.8 and p.ab_statistics.confidence == 0.8
    assert p.statistics.confidence == 0.95  # absolute budgets keep theirs
    assert p.ab_statistics.max_requests == p.statistics.max_requests and p.ab_statistics.batch == p.statistics.batch


def test_ab_fail_confidence_sets_the_level_a_failing_look_needs(tmp_path: Path):
    text = AB_GOOD.replace("    budgets:", "    ab:\n      confidence: 0.8\n      fail_confidence: 0.95\n    budgets:")
    p = load_thresholds(write(tmp_path, text)).profile("cpu")
    assert (p.ab.confidence, p.ab.fail_confidence) == (0.8, 0.95)
    assert (p.ab_statistics.confidence, p.ab_statistics.fail_confidence) == (0.8, 0.95)
    assert p.statistics.fail_confidence is None  # absolute budgets: one level for both ends
    assert load_thresholds(write(tmp_path, AB_GOOD)).profile("cpu").ab_statistics.fail_confidence is None


def test_a_look_fails_only_on_the_stricter_lower_end():
    from guard.judge.ab import decide_ratio

    ratios = [1.045, 1.09, 1.05, 1.08, 1.025, 1.10]  # 80 %: [+4.5, +9.0] %; 95 %: [+2.5, +10.0] %
    sym = decide_ratio("p50", 3.0, ratios, 0.8)
    strict = decide_ratio("p50", 3.0, ratios, 0.8, fail_confidence=0.95)
    assert sym.status == Status.FAIL and strict.status == Status.INCONCLUSIVE
    assert strict.interval_pct[0] == pytest.approx(2.5) and strict.interval_pct[1] == sym.interval_pct[1]
    assert strict.fail_confidence == 0.95 and sym.fail_confidence is None
    # the pass side is the 80 % upper end either way; a "stricter" level that is not stricter is ignored
    quiet = [1.0, 1.01, 0.99, 1.005, 0.995, 1.02]
    assert decide_ratio("p50", 3.0, quiet, 0.8, fail_confidence=0.95).status == Status.PASS
    assert decide_ratio("p50", 3.0, ratios, 0.8, fail_confidence=0.8) == sym


def test_shipped_cpu_profile_has_an_ab_budget():
    from tests.conftest import SHIPPED_THRESHOLDS

    assert load_thresholds(SHIPPED_THRESHOLDS).profile("cpu").ttft_vs_baseline_pct.get("p50", 0) > 0


@pytest.mark.parametrize(("old", "new", "line", "key", "problem"), [
    ("ttft_vs_baseline_pct: {p50: 2.5}", "ttft_vs_baseline_pct: {median: 2}", 15,
     "profiles.cpu.budgets.ttft_vs_baseline_pct.median", "unknown percentile"),
    ("ttft_vs_baseline_pct: {p50: 2.5}", "ttft_vs_baseline_pct: {p50: -1}", 15,
     "profiles.cpu.budgets.ttft_vs_baseline_pct.p50", "must be >= 0"),
    ("    budgets:", "    ab:\n      gpu_memory_utilization: {candidate: 0.6, baseline: 0.6}\n    budgets:", 14,
     "profiles.cpu.ab.gpu_memory_utilization", "share one GPU"),
    ("    budgets:", "    ab:\n      gpu_memory_utilization: {candidate: 1.5}\n    budgets:", 14,
     "profiles.cpu.ab.gpu_memory_utilization.candidate", "fraction"),
    ("    budgets:", "    ab:\n      gpu_memory_utilisation: {candidate: 0.5}\n    budgets:", 14,
     "profiles.cpu.ab.gpu_memory_utilisation", "unknown key"),
    ("    budgets:", "    ab:\n      batch: 0\n    budgets:", 14, "profiles.cpu.ab.batch", ">= 1"),
    ("    budgets:", "    ab:\n      batch: two\n    budgets:", 14, "profiles.cpu.ab.batch", "integer"),
    ("    budgets:", "    ab:\n      confidence: 1\n    budgets:", 14, "profiles.cpu.ab.confidence", "[0.5, 1)"),
    ("    budgets:", "    ab:\n      confidence: high\n    budgets:", 14, "profiles.cpu.ab.confidence", "number"),
    ("    budgets:", "    ab:\n      confidence: 0.9\n      fail_confidence: 0.8\n    budgets:", 15,
     "profiles.cpu.ab.fail_confidence", "at least ab.confidence"),
    ("    budgets:", "    ab:\n      fail_confidence: 1.5\n    budgets:", 14, "profiles.cpu.ab.fail_confidence", "[0.5, 1)"),
])
def test_bad_ab_config_names_file_line_and_key(tmp_path: Path, old, new, line, key, problem):
    assert old in AB_GOOD
    path = write(tmp_path, AB_GOOD.replace(old, new, 1))
    with pytest.raises(ConfigError) as err:
        load_thresholds(path)
    assert err.value.line == line and key == err.value.key and problem in err.value.problem, str(err.value)


def test_inject_spec():
    assert parse_inject("slow-encoder:5%") == 5.0 and parse_inject("slow-encoder:2.5") == 2.5
    assert parse_inject(None) is None
    for bad in ("slow-encoder", "slow-encoder:0%", "slow-encoder:x", "fast-encoder:5%"):
        with pytest.raises(UsageError):
            parse_inject(bad)


# ----------------------------------------------------------------------------- worker protocol
@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """An environment without guard (and without yaml): a worker there must import guard
    from this checkout, through the path guard puts on PYTHONPATH."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    probe = subprocess.run([python, "-c", "import guard"], capture_output=True, text=True, cwd=venv)
    assert probe.returncode != 0, "the bare venv must not see guard by itself"
    return python


def test_worker_in_an_env_without_guard_imports_this_checkout(bare_python, tmp_path):
    w = WorkerClient("baseline", bare_python, tmp_path / "w.log", cwd=tmp_path)
    try:
        assert Path(w.hello.guard_file).resolve() == (GUARD_ROOT / "guard" / "__init__.py").resolve()
        assert Path(w.hello.python).parent == Path(bare_python).parent
        # the bare env has no yaml: starting an engine fails, as a message, and the worker lives on
        with pytest.raises(WorkerError, match="yaml"):
            w.call("start", "ready", thresholds=str(GUARD_ROOT / "thresholds" / "deepseek-ocr-2.yaml"),
                   profile="cpu", seed=0)
        with pytest.raises(WorkerError, match="unknown command"):
            w.call("dance", "done")
    finally:
        w.close()
    assert w.proc.returncode == 0  # shut down on request


def test_worker_that_dies_mid_command_is_reported_with_its_log(bare_python, tmp_path):
    w = WorkerClient("baseline", bare_python, tmp_path / "w.log", cwd=tmp_path)
    try:
        w.proc.kill()
        with pytest.raises(WorkerDied, match=r"exited with status -9"):
            w.call("run", "done", jobs=[])
    finally:
        w.close()


def _state(pid: int) -> str:
    """The process state letter from /proc: T = stopped, S/R = running or waiting."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_paused_worker_is_stopped_then_answers_again(bare_python, tmp_path):
    w = WorkerClient("baseline", bare_python, tmp_path / "w.log", cwd=tmp_path)
    try:
        with w.paused():
            assert _state(w.proc.pid) == "T"
            w.pause()  # idempotent: one SIGSTOP, one SIGCONT
        assert _state(w.proc.pid) != "T"
        with pytest.raises(WorkerError, match="unknown command"):  # it reads and answers again
            w.call("dance", "done")
        w.pause()
    finally:
        w.close()  # resumes first: a stopped worker could not answer "shutdown"
    assert w.proc.returncode == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_paused_worker_dies_with_a_killed_guard(bare_python, tmp_path):
    """guard killed (SIGKILL: no finally, no close) while the idle side is stopped: the stopped
    worker must not stay behind, frozen, holding its engine's memory."""
    parent = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from guard.measure.worker import WorkerClient\n"
        f"w = WorkerClient('baseline', {bare_python!r}, Path({str(tmp_path / 'w.log')!r}), cwd=Path({str(tmp_path)!r}))\n"
        "w.pause(); print(w.proc.pid, flush=True); time.sleep(600)\n")],
        stdout=subprocess.PIPE, text=True, cwd=GUARD_ROOT, env=worker_env())
    pid = int(parent.stdout.readline())
    assert _state(pid) == "T"
    parent.kill()
    parent.wait()
    for _ in range(100):
        if not Path(f"/proc/{pid}").exists() or _state(pid) == "Z":
            break
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists() or _state(pid) == "Z", "the stopped worker outlived guard"


def test_worker_that_cannot_start(tmp_path):
    with pytest.raises(WorkerDied, match="cannot start"):
        WorkerClient("baseline", str(tmp_path / "no-such-python"), tmp_path / "w.log", cwd=tmp_path)
    with pytest.raises(WorkerDied, match="exited with status 1"):
        WorkerClient("baseline", "/bin/false", tmp_path / "w2.log", cwd=tmp_path)


@pytest.mark.parametrize(("says", "message"), [
    (b"42\n", "garbled protocol line: '42"),  # JSON, but no message
    (b"\xff\xfe not text\n", "garbled protocol line"),  # not UTF-8
    (b'{"type": "hello"}\n', "did not start guard's worker"),  # a greeting without its fields
])
def test_a_baseline_python_that_speaks_no_protocol_is_a_worker_error(tmp_path, says, message):
    """--baseline names any executable; a wrapper that prints something else first is the worker's
    failure (an invalid run), never a crash of guard."""
    fake = tmp_path / "python"
    fake.write_text(f"#!{sys.executable}\nimport sys, time\nsys.stdout.buffer.write({says!r})\nsys.stdout.flush()\ntime.sleep(60)\n")
    fake.chmod(0o755)
    t0 = time.perf_counter()
    before = set(_children())
    with pytest.raises(WorkerError, match=message):
        WorkerClient("baseline", str(fake), tmp_path / "w.log", cwd=tmp_path)
    assert time.perf_counter() - t0 < 30
    assert set(_children()) <= before  # not left running to its sleep


def test_a_baseline_that_never_speaks_is_given_up_on_and_ended(tmp_path, monkeypatch):
    """A --baseline that starts and says nothing hung guard for ever, its candidate engine idle."""
    from guard.measure import worker

    monkeypatch.setattr(worker, "HELLO_TIMEOUT_S", 2.0)
    silent = tmp_path / "python"
    silent.write_text("#!/bin/sh\nexec sleep 3600\n")
    silent.chmod(0o755)
    before, t0 = set(_children()), time.perf_counter()
    with pytest.raises(WorkerError, match="said nothing for 2 s"):
        WorkerClient("baseline", str(silent), tmp_path / "w.log", cwd=tmp_path)
    assert time.perf_counter() - t0 < 10 and set(_children()) <= before


def _children() -> list[int]:
    path = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def test_a_worker_says_which_environment_it_is_without_starting_an_engine(tmp_path):
    """The "key" command (an op-only A/B run whose baseline pass is cached starts no baseline engine):
    a real worker in guard's own interpreter answers with its versions and its op-count cache key,
    and then still takes commands; no engine was started, so none can serve a request."""
    from guard.measure.worker import WorkerSide
    from tests.conftest import SHIPPED_THRESHOLDS

    cpu = load_thresholds(SHIPPED_THRESHOLDS).profile("cpu")
    side = WorkerSide("baseline", sys.executable, tmp_path, thresholds=SHIPPED_THRESHOLDS, profile=cpu)
    try:
        info = side.environment_key()
        assert info.cache_key and len(info.cache_key) == 24 and "installed distributions" in info.cache_key_covers
        assert info.versions["vllm"] and info.versions["torch"]
        assert side.environment["worker"]["vllm"] == info.versions["vllm"] and "init_s" not in side.environment["worker"]
        assert side.environment_key().cache_key == info.cache_key  # computed once per worker
        with pytest.raises(WorkerError, match="no engine started here"):
            side.client.call("run", "done", jobs=[[0, [640, 480], True]])
    finally:
        side.close()
    assert side.client.proc.returncode == 0


def test_a_baseline_that_cannot_start_ends_the_run_at_once_with_its_own_reason(bare_python, tmp_path, ab_profile):
    """A baseline environment without the engine's packages (the bare venv has no yaml, let alone
    vllm): the real candidate worker is killed mid engine start instead of finishing a 25-55 s
    start nothing will use, the reason names the baseline's python with advice about that
    environment (not guard's `uv sync`), and the baseline side shows no versions borrowed from
    guard's own environment."""
    from guard.measure.ab_run import ABRun, run_ab
    from guard.measure.hardware import detect
    from tests.conftest import SHIPPED_THRESHOLDS

    said: list[str] = []
    rec = run_ab(ABRun(load_thresholds(SHIPPED_THRESHOLDS), ab_profile, detect(quick=True), tmp_path, bare_python,
                       progress=said.append, rule=ab_run_rule(ab_profile)))
    reasons = rec.candidate.invalid_reasons
    assert len(reasons) == 1 and reasons[0].kind == ReasonKind.ENGINE
    why = reasons[0].text
    assert why.startswith("baseline worker: ModuleNotFoundError") and "yaml" in why
    assert f"hint: {bare_python} is the baseline environment's python" in why and "uv sync" not in why
    assert not any("engine ready" in m for m in said), said  # neither engine was waited for
    assert all(rec.side(side).environment.worker is None or rec.side(side).environment.worker.init_s is None
               for side in (CANDIDATE, BASELINE))
    assert rec.baseline.environment.vllm is None and rec.baseline.environment.torch is None
    assert rec.candidate.environment.vllm is not None  # guard's own environment is the candidate's
    assert rec.candidate.outcomes == [] and rec.baseline.outcomes == []


def test_worker_env_puts_this_checkout_first(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = worker_env()
    assert env["PYTHONPATH"].split(os.pathsep) == [str(GUARD_ROOT), "/elsewhere"]
    assert worker_env({})["PYTHONPATH"] == str(GUARD_ROOT)


# ----------------------------------------------------------------------------- evaluation and views
import dataclasses  # noqa: E402
import json  # noqa: E402

import jsonschema  # noqa: E402

from guard.model.records import ABRecord  # noqa: E402
from guard.judge.evaluate import evaluate_ab  # noqa: E402
from guard.report.markdown import render_markdown  # noqa: E402
from guard.model.jsonfiles import load_results, results_to_dict, write_json_atomic  # noqa: E402
from guard.model.records import Status, Verdict  # noqa: E402
from guard.model.schema import results_schema  # noqa: E402
from guard.report.terminal import render_terminal  # noqa: E402
from tests.ttft_scenarios import record  # noqa: E402

DRIFT = [6.0, 6.1, 6.9, 7.4, 7.0, 6.2, 6.05, 7.3]  # the machine's own drift, shared by both sides of each pair


ENCODER = "vllm/model_executor/models/deepseek_ocr2.py:DeepseekOCR2ForCausalLM._encode_global_features"
PROJECTOR = "vllm/model_executor/models/deepseek_ocr2.py:MlpProjector.forward"


def side_census(extra_copies: int = 0) -> dict:
    """A census as the workers count it, for both profiled image sizes of the cpu profile."""
    return {size: {ENCODER: {"aten::copy_": 1 + extra_copies, "aten::select": 1 + 2 * extra_copies},
                   PROJECTOR: {"aten::linear": 2}} for size in ("640x480", "800x400")}


def ab_record(factor: float, *, mask_calls: int = 0, extra_copies: int = 0) -> ABRecord:
    cand = record([s * factor * (1.002 if i % 2 else 0.998) for i, s in enumerate(DRIFT)])
    base = record(DRIFT)
    cand.census, base.census = side_census(extra_copies), side_census()
    cand.op_counts.append(ScopeCounts("mask_path", (640, 480), 1, {"aten::expand": 1, "aten::_index_put_impl_": mask_calls} if mask_calls
                                      else {"aten::expand": 1}, 1 + mask_calls))
    base.op_counts.append(ScopeCounts("mask_path", (640, 480), 1, {"aten::expand": 1}, 1))
    return ABRecord(candidate=cand, baseline=base, baseline_python="/tmp/baseline-venv/bin/python",
                    order=["candidate", "baseline"] * 4)


@pytest.fixture
def ab_profile():
    from tests.conftest import SHIPPED_THRESHOLDS

    cpu = load_thresholds(SHIPPED_THRESHOLDS).profile("cpu")  # with its op budgets (mask_path)
    return dataclasses.replace(cpu, ttft_ms={"p50": 6500.0}, ttft_vs_baseline_pct={"p50": 3.0},
                               workload=dataclasses.replace(cpu.workload, requests=8))


def test_identical_sides_pass_although_the_machine_drifts(ab_profile):
    res = evaluate_ab(ab_profile, ab_record(1.0))
    assert res.verdict == Verdict.PASS, res.invalid_reasons
    (c,) = res.ab_checks
    assert c.status == Status.PASS and c.pairs == 8 and abs(c.measured_pct) < 0.5
    # the absolute budget (6500 ms, below the drifting machine's median) is shown, not judged
    (a,) = res.ttft_checks
    assert a.status == Status.NOT_JUDGED and a.measured_ms > 6500 and "A/B mode" in a.note
    assert res.ab.op_diff == ()


def test_a_slower_candidate_fails_on_the_ratio(ab_profile):
    res = evaluate_ab(ab_profile, ab_record(1.06))
    assert res.verdict == Verdict.REGRESSION
    (c,) = res.ab_checks
    assert c.status == Status.FAIL and c.interval_pct[0] > 3.0
    assert c.candidate_ms > c.baseline_ms


def test_op_diff_and_candidate_op_budget(ab_profile):
    res = evaluate_ab(ab_profile, ab_record(1.0, mask_calls=513))
    assert res.verdict == Verdict.REGRESSION  # the candidate's op budget (max 0) fails
    assert [(d.op, d.baseline_calls, d.candidate_calls) for d in res.ab.op_diff] == [
        ("aten::_index_put_impl_", 0, 513), ("total_ops", 1, 514)]


def test_a_failed_baseline_request_or_too_few_pairs_is_invalid(ab_profile):
    rec = ab_record(1.0)
    rec.baseline.outcomes[3] = dataclasses.replace(rec.baseline.outcomes[3], success=False, ttft_client_s=None, error="boom")
    res = evaluate_ab(ab_profile, rec)
    assert res.verdict == Verdict.INVALID
    assert any(r.text.startswith("baseline: request 3") and r.kind == ReasonKind.REQUEST_FAILED for r in res.invalid_reasons)
    assert any("too few A/B pairs: 7 of 8" in r.text for r in res.invalid_reasons)


def test_worker_failure_recorded_by_the_run_stage_is_invalid(ab_profile):
    rec = ab_record(1.0)
    rec.candidate.invalid_reasons.append(InvalidReason(ReasonKind.ENGINE, "baseline worker: the engine process exited with status -9"))
    assert evaluate_ab(ab_profile, rec).exit_code == 3


def test_a_run_stage_that_stopped_is_reported_by_its_own_reason_alone(ab_profile):
    """The baseline's engine never started: no pairs, no op counts and no census on either side
    follow from it and are not listed as reasons of their own."""
    rec = ab_record(1.0)
    for side in (rec.candidate, rec.baseline):
        side.outcomes, side.op_counts, side.census = [], [], {}
    reason = InvalidReason(ReasonKind.ENGINE, "baseline worker: InvalidRunError: cannot import vllm: No module named 'vllm'")
    rec.candidate.invalid_reasons.append(reason)
    res = evaluate_ab(ab_profile, rec)
    assert res.exit_code == 3 and res.invalid_reasons == [reason]
    rec.candidate.invalid_reasons.clear()  # unexplained, the same gaps are the reasons
    reasons = evaluate_ab(ab_profile, rec).invalid_reasons
    assert any("no A/B pairs were measured" in r.text for r in reasons)
    assert any(r.text.startswith("baseline: op-count scope") and r.kind == ReasonKind.SCOPE_NOT_MEASURED for r in reasons)
    assert any("baseline side measured no census" in r.text and r.kind == ReasonKind.CENSUS_MISSING for r in reasons)


def test_a_side_profiled_by_itself_that_stopped_says_why_on_its_own_record(ab_profile):
    """guard pr --only ops profiles base, then head, each in its own run: a base whose engine never
    started (vLLM 0.30.0's GLM-4.1V processor against the transformers its venv resolved) keeps its
    reason on its own record, and that reason, not the gaps it left, is why nothing compares."""
    rec = ab_record(1.0)
    rec.baseline.outcomes, rec.baseline.op_counts, rec.baseline.census = [], [], {}
    reason = InvalidReason(ReasonKind.ENGINE, "base worker: InvalidRunError: engine failed to start: ValueError: ...")
    rec.baseline.invalid_reasons.append(reason)
    res = evaluate_ab(dataclasses.replace(ab_profile, ttft_vs_baseline_pct={}), rec)
    assert res.exit_code == 3
    assert res.invalid_reasons == [reason.prefixed("baseline: ")]


def test_a_busy_machine_is_reported_but_never_invalidates_the_ratio(ab_profile):
    """One busy core (0.81 of 2 cores, measured live: docs/campaigns/2026-11-30-ab-live-busy-core.md) would make an absolute
    check invalid; in A/B mode both members of every pair ran under it, so it is said, and the ratio
    verdict stands either way."""
    from guard.measure.contention import ContentionReading

    busy = ContentionReading(window_s=600.0, cpus=2, other_cores=0.81, steal_cores=0.0, own_cores=1.17,
                             tree_processes=3)
    for factor, verdict in ((1.0, Verdict.PASS), (1.06, Verdict.REGRESSION)):
        rec = ab_record(factor)
        rec.candidate.environment.cpu_contention = busy
        res = evaluate_ab(ab_profile, rec)
        assert res.verdict == verdict and not res.invalid_reasons
        (notice,) = [n for n in res.notices if n.startswith("busy machine")]
        assert "other processes used 0.81 of 2 cores" in notice and "guard's two engines used 1.17" in notice
        assert "A/B judges the ratio" in notice
        assert "guard's two engines used 1.17" in render_terminal(res)
        md = render_markdown(res)
        assert "Machine during the pairs: other processes used 0.81 of 2 cores" in md
        assert "Machine during measurement" not in md  # said once, in the A/B section
    quiet = dataclasses.replace(busy, other_cores=0.02)
    rec = ab_record(1.0)
    rec.candidate.environment.cpu_contention = quiet
    res = evaluate_ab(ab_profile, rec)
    assert not [n for n in res.notices if n.startswith("busy machine")]
    assert "Machine during the pairs: other processes used 0.02 of 2 cores" in render_markdown(res)


def test_pair_spread_is_the_sd_of_the_log_ratio():
    from guard.judge.ab import pair_spread_pct

    ratios = [math.exp(x) for x in (-0.05, 0.0, 0.05)]
    assert pair_spread_pct(ratios) == pytest.approx(5.0)
    assert pair_spread_pct([1.1] * 4) == 0.0 and pair_spread_pct([1.1]) is None


@pytest.mark.parametrize("centre_pct, level", [(6.0, 0.95), (-1.0, 0.8)])
def test_pairs_to_settle_lands_the_nearer_end_on_the_budget(centre_pct, level):
    """Normal pairs at the spread, centred where the run's estimate was: after the number of pairs
    the note quotes, the interval end that would decide (lower for a failure, at the failing
    level; upper for a pass) sits on the budget, within a small share of the distance."""
    from guard.judge.ab import decide_ratio, pairs_to_settle

    spread, budget = 8.0, 3.0
    n = pairs_to_settle(centre_pct, budget, spread, 0.8, 0.95)
    assert n is not None and n > 6
    dist = statistics.NormalDist()
    ratios = [(1 + centre_pct / 100) * math.exp(spread / 100 * dist.inv_cdf((i + 0.5) / n)) for i in range(n)]
    d = decide_ratio("p50", budget, ratios, 0.8, 0.95)
    end = d.interval_pct[0] if centre_pct > budget else d.interval_pct[1]
    assert abs(end - budget) < 0.15 * abs(centre_pct - budget)
    assert pairs_to_settle(budget, budget, spread, 0.8, 0.95) is None
    assert pairs_to_settle(centre_pct, budget, spread / 2, 0.8, 0.95) < n  # a quieter machine needs fewer


def test_the_cap_note_gives_the_spread_and_the_pairs_it_would_take():
    from guard.judge.ab import judge_ratio
    from guard.model.checks import Pair

    rng = random.Random(5)
    paired = [Pair(i, 6.0 * 1.05 * math.exp(rng.gauss(0, 0.10)), 6.0) for i in range(24)]
    c = judge_ratio("p50", 3.0, paired, 10, Statistics(confidence=0.8, fail_confidence=0.95, max_requests=24, batch=2))
    assert c.status in (Status.FAIL, Status.INCONCLUSIVE) and c.note is not None
    assert c.pair_spread_pct == pytest.approx(statistics.stdev(math.log(p.ratio) for p in paired) * 100)
    assert f"per-pair spread of {c.pair_spread_pct:.1f} %" in c.note and "pairs would settle it" in c.note
    p90 = judge_ratio("p90", 3.0, paired, 10, Statistics(confidence=0.8, fail_confidence=0.95, max_requests=24, batch=2))
    assert p90.pair_spread_pct == c.pair_spread_pct and "pairs would settle it" not in (p90.note or "")
    decided = judge_ratio("p50", 3.0, [Pair(i, 6.0, 6.0) for i in range(8)], 1, Statistics(confidence=0.8, max_requests=24))
    assert decided.note is None and decided.pair_spread_pct == 0.0


def test_ab_results_round_trip_validate_and_render_both_sides(ab_profile, tmp_path):
    res = evaluate_ab(ab_profile, ab_record(1.06, mask_calls=513))
    data = results_to_dict(res)
    jsonschema.Draft202012Validator(results_schema()).validate(json.loads(json.dumps(data)))
    assert data["ab"]["baseline_python"] == "/tmp/baseline-venv/bin/python" and len(data["ab"]["pairs"]) == 8
    assert data["checks"]["ttft_vs_baseline"][0]["percentile"] == "p50"
    path = tmp_path / "results.json"
    write_json_atomic(path, data)
    assert load_results(path) == res
    term = render_terminal(res)
    assert "candidate" in term and "baseline" in term and "ttft p50 vs baseline" in term
    assert "aten::_index_put_impl_" in term and "+513" in term
    md = render_markdown(res)
    assert "### A/B: candidate vs baseline" in md and "| TTFT p50 |" in md and md.count("xychart-beta") == 2
    assert "--baseline" in md and "+513" in md
    assert "over its budget of +3.0 %" in md  # the failure sentence names the ratio
    assert "per-pair spread" in term and "per-pair spread" in md and f"{res.ab_checks[0].pair_spread_pct:.1f} %" in term


def test_plain_results_have_no_ab_section(cpu):
    from guard.judge.evaluate import evaluate

    res = evaluate(cpu, record([6.0] * 6))
    data = results_to_dict(res)
    assert data["ab"] is None and data["checks"]["ttft_vs_baseline"] == []
    assert "A/B" not in render_markdown(res) and "A/B" not in render_terminal(res)


# ----------------------------------------------------------------------------- the slow-encoder hook
def test_slow_encoder_adds_its_share_of_ttft_after_calibration():
    import time

    import torch

    from guard.measure.inprocess import SlowEncoder

    class Qwen2Decoder2Encoder(torch.nn.Module):  # the vision encoder's class name in vLLM
        def forward(self, x):
            time.sleep(0.02)
            return x + 1

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = Qwen2Decoder2Encoder()

    class LLM:  # vLLM's LLM.apply_model, the one call the hook needs
        def __init__(self):
            self.model = Model()

        def apply_model(self, fn):
            return fn(self.model)

    llm = LLM()
    x = torch.zeros(1)
    (x + 1).item()  # torch's first-op set-up, outside the calibration (on a slow CPU it stretched it by half)
    hook = SlowEncoder(llm, 10.0)
    assert llm.model.enc(x).item() == 1.0 and hook.calls == 1 and hook.slept_s == 0  # warm-up: timed, not slowed
    hook.calibrate([0.1])  # TTFT 0.1 s for ~0.02 s of encoder time: k ~ 5
    assert 3 < hook.scale < 6
    before = hook.encoder_s
    t0 = time.perf_counter()
    llm.model.enc(x)
    spent = time.perf_counter() - t0
    # +10 % of a 0.1 s TTFT, scaled by this forward's own time (as the hook measured it, so a busy
    # machine's scheduling cannot blur the formula) against the calibration's: ~0.01 s on top of
    # the forward's own ~0.02 s
    forward_s = hook.encoder_s - before
    assert hook.slept_s == pytest.approx(0.1 * forward_s * hook.scale, rel=1e-9)
    assert hook.slept_s == pytest.approx(0.01, rel=0.35) and spent >= forward_s + hook.slept_s > 0.028
    with pytest.raises(RuntimeError, match="no Qwen2Decoder2Encoder"):
        class Empty:
            def apply_model(self, fn):
                return fn(torch.nn.Linear(1, 1))
        SlowEncoder(Empty(), 5.0)


def test_check_rejects_bad_ab_arguments_before_running(tmp_path):
    from tests.conftest import run_guard

    proc = run_guard("check", "--inject", "slow-encoder:5%", "--output", str(tmp_path / "o"))
    assert proc.returncode == 2 and "needs --baseline" in proc.stderr
    proc = run_guard("check", "--baseline", str(tmp_path / "nope" / "python"), "--output", str(tmp_path / "o"))
    assert proc.returncode == 2 and "no such executable" in proc.stderr
    proc = run_guard("check", "--baseline", sys.executable, "--inject", "slow-encoder:lots", "--output", str(tmp_path / "o"))
    assert proc.returncode == 2 and "bad --inject" in proc.stderr


def test_a_relative_baseline_python_is_made_absolute_before_the_worker_moves(tmp_path, monkeypatch):
    import argparse
    import os

    from guard.commands.check import check_arguments

    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)  # a venv's python is a symlink: it must stay one
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(inject=None, baseline="venv/bin/python", fresh_baseline=False, server_url=None,
                              output="guard-results")
    args = check_arguments(args)
    assert args.baseline == str(venv / "python") and os.path.islink(args.baseline)


# ----------------------------------------------------------------------------- the sensitivity simulation
@pytest.fixture(scope="module")
def ab_sensitivity():
    with benchmark_script("ab_sensitivity") as module:
        yield module


def test_simulated_ab_rule_separates_identical_from_slowed(ab_sensitivity, ab_profile):
    from guard.model.checks import Pair

    rng = random.Random(3)
    pool = [Pair(i, b * rng.gauss(1, 0.01), b) for i, b in enumerate(6 + rng.random() for _ in range(40))]
    profile = dataclasses.replace(ab_profile, workload=dataclasses.replace(ab_profile.workload, requests=6))
    same, n_same = ab_sensitivity.simulate_ab(pool, profile, {"p50": 3.0}, 300, random.Random(0))
    slow, n_slow = ab_sensitivity.simulate_ab(ab_sensitivity.slowed(pool, 8.0), profile, {"p50": 3.0}, 300, random.Random(0))
    assert same["p50"] < 0.01 and slow["p50"] > 0.99
    assert 6 <= n_same <= 24 and 6 <= n_slow <= 24
    # the absolute rule on the same candidate samples: a 7000 ms budget never sees an 8 % slowdown of ~6.5 s
    absolute, _ = ab_sensitivity.simulate_absolute([p.candidate_s * 1.08 for p in pool],
                                                   dataclasses.replace(profile, ttft_ms={"p50": 7500.0}), 200, random.Random(0))
    assert absolute["p50"] < 0.05


def test_grid_pools_have_the_spread_and_shift_they_claim(ab_sensitivity):
    same = ab_sensitivity.normal_pool(5.0, 0.0, random.Random(0))
    slow = ab_sensitivity.normal_pool(5.0, 5.0, random.Random(0))
    logs = [math.log(p.ratio) for p in same]
    assert abs(statistics.stdev(logs) - 0.05) < 0.003 and abs(statistics.median(logs)) < 0.004
    assert abs(statistics.median(p.ratio for p in slow) - 1.05) < 0.005


def test_grid_prints_one_row_per_confidence_and_spread(ab_sensitivity, capsys):
    from tests.conftest import SHIPPED_THRESHOLDS

    argv = ["--thresholds", str(SHIPPED_THRESHOLDS), "--grid", "0.95,0.8/0.95", "--spreads", "3,6", "--trials", "40"]
    assert ab_sensitivity.main(argv) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 0.")]
    assert [r.split("|")[1:3] for r in rows] == [[" 0.95 ", " 3 % "], [" 0.95 ", " 6 % "],
                                                  [" 0.8, fails at 0.95 ", " 3 % "], [" 0.8, fails at 0.95 ", " 6 % "]]


def test_cap_rules_table_compares_the_point_estimate_with_undecided(ab_sensitivity, capsys, tmp_path):
    from tests.conftest import SHIPPED_THRESHOLDS

    argv = ["--thresholds", str(SHIPPED_THRESHOLDS), "--cap-rules", "--spreads", "3,9", "--trials", "300", "--no-record",
            "--pool", str(tmp_path / "none.json"), "--slow-pool", str(tmp_path / "none-slow.json")]
    assert ab_sensitivity.main(argv) == 0
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| normal")]
    assert [r[:2] for r in rows] == [["normal, 3 % spread", "identical"], ["normal, 3 % spread", "+5 %"],
                                     ["normal, 9 % spread", "identical"], ["normal, 9 % spread", "+5 %"]]
    value = {(r[0], r[1]): [float(x.rstrip(" %")) for x in r[2:5]] for r in rows}
    shipped, alt_fail, alt_undecided = value[("normal, 9 % spread", "+5 %")]
    assert alt_fail <= shipped and alt_undecided > 20  # settling by the estimate is what catches the slowdown
    assert value[("normal, 3 % spread", "identical")][0] < 1


def test_a_run_level_lean_survives_any_number_of_pairs_in_the_simulation(ab_sensitivity, ab_profile):
    """A pool without per-pair noise never fails when pairs are all there is; a lean shared by
    each run's pairs (SD 3 %) leaves clean runs above a +2.5 % budget about P(N(0,3%) > 2.5%) ~ 20 %."""
    from guard.model.checks import Pair

    flat = [Pair(i, 6.0, 6.0) for i in range(40)]
    profile = dataclasses.replace(ab_profile, workload=dataclasses.replace(ab_profile.workload, requests=6))
    pairs_only, _ = ab_sensitivity.simulate_ab(flat, profile, {"p50": 2.5}, 400, random.Random(0))
    leaning, _ = ab_sensitivity.simulate_ab(flat, profile, {"p50": 2.5}, 400, random.Random(0), run_offset_pct=3.0)
    assert pairs_only["p50"] == 0.0
    assert 0.12 < leaning["p50"] < 0.29


@pytest.fixture(scope="module")
def ab_between_runs():
    with benchmark_script("ab_between_runs") as module:
        yield module


def _runs(rng, count, pairs, spread, lean_sd):
    out = []
    for _ in range(count):
        lean = rng.gauss(0, lean_sd)
        out.append([lean + rng.gauss(0, spread) for _ in range(pairs)])
    return out


def test_between_run_spread_is_found_when_runs_lean_and_not_when_they_do_not(ab_between_runs):
    rng = random.Random(7)
    leaning = ab_between_runs.heterogeneity(_runs(rng, 30, 16, 0.05, 0.02), 500, random.Random(1))
    assert leaning.p_value < 0.01 and 1.2 < leaning.tau_pct < 3.0
    exchangeable = ab_between_runs.heterogeneity(_runs(rng, 30, 16, 0.05, 0.0), 500, random.Random(1))
    assert exchangeable.p_value > 0.01 and exchangeable.tau_pct < 1.0
    with pytest.raises(ValueError, match="at least 2 runs"):
        ab_between_runs.heterogeneity([[0.01] * 10, [0.02] * 3], 10, random.Random(0))


def test_between_run_floor_is_the_normal_tail_at_the_budget(ab_between_runs):
    fa, miss = ab_between_runs.floor_rates(1.5, 2.5, 5.0)
    z_clean = math.log(1.025) / 0.015
    z_slow = (math.log(1.05) - math.log(1.025)) / 0.015
    assert fa == pytest.approx(0.5 * math.erfc(z_clean / math.sqrt(2)), rel=1e-12)
    assert miss == pytest.approx(0.5 * math.erfc(z_slow / math.sqrt(2)), rel=1e-12)
    assert 0.04 < fa < 0.06 and 0.04 < miss < 0.06
    assert ab_between_runs.floor_rates(0.0, 2.5, 5.0) == (0.0, 0.0)


def test_between_runs_splits_a_committed_pool_into_its_recorded_runs(ab_between_runs, capsys):
    pool = GUARD_ROOT / "benchmarks" / "ab-pool-identical-retained.json"
    runs = ab_between_runs.runs_in_pool(pool)
    assert len(runs) == 10 and sum(map(len, runs)) == 102  # the campaign of 1 December, as docs/ab.md says
    assert ab_between_runs.main([str(pool), "--shuffles", "50"]) == 0
    row = [c.strip() for c in capsys.readouterr().out.splitlines()[-1].split("|")[1:-1]]
    assert row[:3] == ["ab-pool-identical-retained.json", "10", "102"]


# ----------------------------------------------------------------------------- the A/B run stage's resampling
class _ScriptedPairs:
    """Stands in for ``ABRun.measure`` (the two workers): each measured pair gets the next ratio
    of a script. The loop under test, ``ABRun.time_until_decided``, is the real one."""

    def __init__(self, run, ratios, fail_at=None):
        self.run, self.ratios, self.fail_at, self.calls = run, iter(ratios), fail_at, []

    def __call__(self, count):
        self.calls.append(count)
        for _ in range(count):
            i = self.run._next_index
            self.run._next_index += 1
            r = next(self.ratios)
            ok = self.fail_at is None or i < self.fail_at
            self.run.record.baseline.outcomes.append(_o(i, 6.0))
            self.run.record.candidate.outcomes.append(_o(i, 6.0 * r, success=ok))


def _straddling(n=100):
    """Ratios centred on +3 % with a 30 % spread: every interval up to the cap straddles a +3 % budget."""
    rng = random.Random(1)
    return [1.03 * math.exp(rng.gauss(0, 0.3)) for _ in range(n)]


def _ab_run(tmp_path, ab_profile):
    from guard.measure.ab_run import ABRun
    from guard.measure.hardware import detect

    profile = dataclasses.replace(ab_profile, workload=dataclasses.replace(ab_profile.workload, requests=6))
    from tests.conftest import SHIPPED_THRESHOLDS

    run = ABRun(load_thresholds(SHIPPED_THRESHOLDS), profile, detect(quick=True), tmp_path, sys.executable,
                progress=lambda m: None, rule=ab_run_rule(profile))
    return run, profile


def test_ab_resampling_stops_as_soon_as_the_ratio_is_decided(tmp_path, ab_profile):
    run, profile = _ab_run(tmp_path, ab_profile)
    run.measure = _ScriptedPairs(run, [1.0 + 0.001 * (i % 3) for i in range(100)])
    run.time_until_decided()
    assert run.measure.calls == [6] and len(run.ratios()) == 6  # the signed-rank interval is already below +3 %


def test_ab_resampling_goes_on_in_batches_up_to_the_cap_while_undecided(tmp_path, ab_profile):
    run, profile = _ab_run(tmp_path, ab_profile)
    said = []
    run.progress = said.append
    run.measure = _ScriptedPairs(run, _straddling())  # straddles +3 % however many pairs
    run.time_until_decided()
    stats = profile.statistics
    assert sum(run.measure.calls) == stats.max_requests == len(run.ratios())
    # rounds of ab.batch pairs (the shipped cpu profile: 2), not statistics.batch (6)
    assert profile.ab.batch == 2 != stats.batch
    assert run.measure.calls == [6] + [2] * ((stats.max_requests - 6) // 2)
    assert any("inconclusive after 6 pairs" in m and "measuring 2 more pairs" in m for m in said)


def test_ab_resampling_decides_at_ab_confidence(tmp_path, ab_profile):
    from guard.judge.ab import decide_ratio

    first = [1.00, 1.01, 0.99, 1.005, 0.995, 1.045]  # one outlier: the 95 % interval reaches +4.5 %
    assert decide_ratio("p50", 3.0, first, 0.95).status == Status.INCONCLUSIVE
    assert decide_ratio("p50", 3.0, first, 0.8).status == Status.PASS
    calls = {}
    for conf in (0.95, 0.8):
        profile = dataclasses.replace(ab_profile, ab=dataclasses.replace(ab_profile.ab, confidence=conf))
        run, _ = _ab_run(tmp_path / str(conf), profile)
        run.measure = _ScriptedPairs(run, first + [1.0] * 40)
        run.time_until_decided()
        calls[conf] = run.measure.calls
    assert calls[0.8] == [6] and calls[0.95][0] == 6 and len(calls[0.95]) > 1


def test_ab_resampling_fails_a_look_only_at_ab_fail_confidence(tmp_path, ab_profile):
    """The same six pairs fail the first look with 80 % on both ends, and need more pairs when a
    look must fail on a 95 % lower end; the final note names both levels."""
    first = [1.045, 1.09, 1.05, 1.08, 1.025, 1.10]
    calls = {}
    for fail in (None, 0.95):
        profile = dataclasses.replace(ab_profile, ab=dataclasses.replace(ab_profile.ab, confidence=0.8, fail_confidence=fail))
        run, _ = _ab_run(tmp_path / str(fail), profile)
        run.measure = _ScriptedPairs(run, first + [1.0] * 40)
        run.time_until_decided()
        calls[fail] = run.measure.calls
    assert calls[None] == [6] and calls[0.95][0] == 6 and len(calls[0.95]) > 1
    from guard.judge.ab import judge_ratio
    from guard.model.checks import Pair

    paired = [Pair(i, 6.0 * r, 6.0) for i, r in enumerate(first)]
    check = judge_ratio("p50", 3.0, paired, 1, Statistics(confidence=0.8, max_requests=6, fail_confidence=0.95))
    assert check.status == Status.FAIL and check.fail_confidence == 0.95  # at the cap: the point estimate
    assert check.note.startswith("the 80 % (lower end 95 %) interval [+2.5, +9.0] % still straddles the budget")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_run_stage_records_what_the_machine_did_during_the_pairs(tmp_path, ab_profile):
    """The real sampler on the real /proc around the real loop: the scripted pairs burn this
    process's CPU (standing in for the workers, which are its children in a live run)."""
    run, _ = _ab_run(tmp_path, ab_profile)
    said = []
    run.progress = said.append
    scripted = _ScriptedPairs(run, [1.0] * 100)

    def busy_measure(count):
        end = time.process_time() + 0.15
        while time.process_time() < end:
            pass
        scripted(count)

    run.measure = busy_measure
    run.time_until_decided()
    reading = run.record.candidate.environment.cpu_contention
    assert reading.window_s >= 0.1 and reading.own_cores > 0.3, reading
    assert reading.tree_processes >= 1 and 0.0 <= reading.other_cores <= reading.cpus
    assert any(m.startswith("CPU during measurement: other processes used") and "guard's two engines" in m for m in said)


def test_ab_resampling_falls_back_to_statistics_batch(tmp_path, ab_profile):
    run, profile = _ab_run(tmp_path, dataclasses.replace(ab_profile, ab=dataclasses.replace(ab_profile.ab, batch=None)))
    run.measure = _ScriptedPairs(run, _straddling())
    run.time_until_decided()
    assert run.measure.calls == [6, 6, 6, 6]


def test_ab_resampling_stops_at_a_failed_request(tmp_path, ab_profile):
    run, profile = _ab_run(tmp_path, ab_profile)
    run.measure = _ScriptedPairs(run, _straddling(), fail_at=3)
    run.time_until_decided()
    assert run.measure.calls == [6]  # a failed request makes the run invalid: no more pairs


# ----------------------------------------------------------------------------- the census, side against side
def test_ab_census_of_identical_sides_holds_with_no_committed_baseline(ab_profile):
    res = evaluate_ab(ab_profile, ab_record(1.0))
    assert res.verdict == Verdict.PASS and res.census_checks == ()
    assert any("compared with the baseline side" in n for n in res.notices)
    assert "against the baseline side" in render_terminal(res)


def test_ab_census_names_the_function_and_ops_the_candidate_grew(ab_profile):
    res = evaluate_ab(ab_profile, ab_record(1.0, extra_copies=256))  # a per-token copy loop, same TTFT
    assert res.verdict == Verdict.REGRESSION
    failed = [c for c in res.census_checks if c.status == Status.FAIL]
    assert {c.function for c in failed} == {ENCODER} and {c.image_size for c in failed} == {(640, 480), (800, 400)}
    assert "+256 aten::copy_" in render_terminal(res) and "+512 aten::select" in render_terminal(res)
    assert "baseline side → candidate" in render_terminal(res)
    assert "against the baseline side (A/B)" in render_markdown(res)


def test_ab_census_missing_on_the_baseline_side_is_invalid(ab_profile):
    rec = ab_record(1.0)
    rec.baseline.census = {}
    res = evaluate_ab(ab_profile, rec)
    assert res.verdict == Verdict.INVALID
    assert any("baseline side measured no census for a 640x480 image" in r.text for r in res.invalid_reasons)


@pytest.fixture(scope="module")
def ab_sprt():
    with benchmark_script("ab_sprt") as module:
        yield module


def test_sprt_separates_no_change_from_twice_the_budget_at_its_error_rates(ab_sprt, ab_sensitivity, ab_profile):
    """On normal 3 % noise the SPRT between 0 and +5 % keeps near its 5 % error rates each way;
    at the cap a run is decided by the side of the midpoint its mean lies on."""
    profile = dataclasses.replace(ab_profile, ttft_vs_baseline_pct={"p50": 2.5})
    test = ab_sprt.Sprt(0.05, 0.05, "sd", 2.0)
    rng = random.Random(3)
    same, n_same = ab_sprt.simulate_sprt(ab_sensitivity.normal_pool(3, 0, rng), profile, 2.5, test, 400, rng)
    slow, n_slow = ab_sprt.simulate_sprt(ab_sensitivity.normal_pool(3, 5, rng), profile, 2.5, test, 400, rng)
    assert same < 0.08 and slow > 0.92 and 6 <= n_same < 12 and 6 <= n_slow < 12
    at_mid = [math.log1p(0.025)] * 2 + [math.log1p(0.025) + 0.01, math.log1p(0.025) - 0.01]
    assert ab_sprt.sprt_decides(at_mid, 2.5, test, at_cap=False) is None
    assert ab_sprt.sprt_decides([x + 0.001 for x in at_mid], 2.5, test, at_cap=True) is True
    assert ab_sprt.sprt_decides([x - 0.001 for x in at_mid], 2.5, test, at_cap=True) is False


# ----------------------------------------------------------------------------- two sides through the one run stage
class _ScriptedSide:
    """A scripted engine behind the ``EngineSide`` interface (a test double of the engine, not of
    the run stage): fixed TTFTs, a profile pass that counts only the twin of each budgeted op, and
    a shared log of what it was asked to do, and whether the other side was stopped meanwhile."""

    def __init__(self, name, log, paused, ttft_s):
        self.name, self.log, self.paused, self.ttft_s = name, log, paused, ttft_s
        self.environment = {}

    def launch(self):
        self.log.append(("launch", self.name))

    def start(self):
        from guard.measure.side import SideInfo

        self.log.append(("start", self.name))
        return SideInfo(init_s=0.0, cache_key=self.cache_key)

    cache_key = None  # the op-count cache key its environment would have (guard.measure.opcache)

    def environment_key(self):
        from guard.measure.side import SideInfo

        self.log.append(("key", self.name))
        return SideInfo(init_s=0.0, cache_key=self.cache_key, cache_key_covers="a scripted environment")

    def run(self, jobs, label, on_outcome):
        others_paused = all(v for k, v in self.paused.items() if k != self.name)
        self.log.append(("run", self.name, tuple(j.index for j in jobs), all(j.warmup for j in jobs), others_paused))
        out = [_o(j.index, self.ttft_s) for j in jobs]
        out = [dataclasses.replace(o, image_size=j.image_size, warmup=j.warmup) for o, j in zip(out, jobs)]
        for o in out:
            on_outcome(o)
        return out

    def failed_requests_context(self, label, failed):
        return None

    def op_count_side(self):
        return self

    def count_ops(self, job, on_outcome, files):
        from guard.measure.side import ProfiledRequest
        from guard.judge.opnames import PSEUDO_OPS

        self.log.append(("profile", self.name, job.index))
        counts = []
        for sb in self._profile.ops:
            op = next(o for o in sb.ops if o not in PSEUDO_OPS)
            twin = op[:-1] if op.endswith("_") else op + "_"
            counts.append(ScopeCounts(sb.name, job.image_size, 1, {twin: 3}, 3))
        return ProfiledRequest([], counts)

    def speed_reading(self):
        return None

    def process_ids(self):
        return frozenset()

    def pause(self):
        self.log.append(("pause", self.name))
        self.paused[self.name] = True

    def resume(self):
        self.paused[self.name] = False

    def kill(self):
        pass

    def close(self):
        self.log.append(("close", self.name))


def test_two_sides_run_through_the_one_stage_abba_with_the_idle_side_stopped(tmp_path, ab_profile):
    """The A/B shape of guard.measure.run.RunStage over two scripted sides: the same jobs on both,
    warm-ups untimed, measured blocks in ABBA order with the idle side stopped, each side profiled
    on the same image, and judging finds a vacuous op budget on
    both sides' records."""
    from guard.measure.hardware import detect
    from guard.measure.ab_run import ABRun
    from tests.conftest import SHIPPED_THRESHOLDS

    profile = dataclasses.replace(ab_profile, workload=dataclasses.replace(ab_profile.workload, requests=4, concurrency=1,
                                                                           warmup_requests=1))
    log, paused = [], {CANDIDATE: False, BASELINE: False}
    sides = {name: _ScriptedSide(name, log, paused, ttft) for name, ttft in ((CANDIDATE, 6.0), (BASELINE, 6.0))}
    run = ABRun(load_thresholds(SHIPPED_THRESHOLDS), profile, detect(quick=True), tmp_path, sys.executable,
                progress=lambda m: None, sides=sides)
    for side in sides.values():
        side._profile = run.profile
    run.start()
    run.warm_up()
    run.measure(4)
    run.profile_ops()
    rec = run.finish()

    assert [e for e in log if e[0] == "launch"] == [("launch", CANDIDATE), ("launch", BASELINE)]  # both spawned by the stage's own thread
    runs = [e for e in log if e[0] == "run"]
    warm, measured = [e for e in runs if e[3]], [e for e in runs if not e[3]]
    assert [(e[1], e[2]) for e in warm][:2] == [(CANDIDATE, (0,)), (BASELINE, (0,))]  # the same image on both
    assert not any(e[4] for e in warm)  # warm-ups are not timed: nothing stopped
    assert [(e[1], e[2]) for e in measured] == [(CANDIDATE, (1,)), (BASELINE, (1,)), (BASELINE, (2,)), (CANDIDATE, (2,)),
                                                (CANDIDATE, (3,)), (BASELINE, (3,)), (BASELINE, (4,)), (CANDIDATE, (4,))]
    assert all(e[4] for e in measured)  # every timed block ran with the other side stopped
    assert rec.order == [CANDIDATE, BASELINE, CANDIDATE, BASELINE]
    assert len(run.ratios()) == 4 and set(run.ratios()) == {1.0}
    profiled = [e for e in log if e[0] == "profile"]
    assert {e[1] for e in profiled} == {CANDIDATE, BASELINE} and len({e[2] for e in profiled[:2]}) == 1
    assert rec.candidate.op_counts and rec.baseline.op_counts
    assert ("close", CANDIDATE) in log and ("close", BASELINE) in log
    res = evaluate_ab(profile, rec)  # a vacuous budget is judging's finding, on both sides
    vacuous = [r.text for r in res.invalid_reasons if r.kind == ReasonKind.VACUOUS_BUDGET]
    assert vacuous and all("can never fail" in t for t in vacuous)
    assert any(t.startswith("baseline: op budget") for t in vacuous)
    assert res.verdict == Verdict.INVALID


def test_an_op_only_run_whose_baseline_pass_is_cached_never_starts_the_baseline_engine(tmp_path, ab_profile, monkeypatch):
    """Op counts only (no latency budgets) and the baseline environment's pass in guard's cache: the
    baseline is asked which environment it is while the candidate starts, and never started or
    profiled; its counts come from the cache. With the entry gone, the same run starts it."""
    from guard.measure import opcache
    from guard.measure.hardware import detect
    from guard.measure.ab_run import ABRun
    from guard.model.records import RunRecord
    from tests.conftest import SHIPPED_THRESHOLDS

    monkeypatch.setenv("GUARD_CACHE_DIR", str(tmp_path / "cache"))
    profile = dataclasses.replace(ab_profile, ttft_ms={}, token_ms={}, ttft_vs_baseline_pct={}, census=None,
                                  workload=dataclasses.replace(ab_profile.workload, profile_image_sizes=((640, 480),)))

    def op_only_run():
        log, paused = [], {CANDIDATE: False, BASELINE: False}
        sides = {name: _ScriptedSide(name, log, paused, 6.0) for name in (CANDIDATE, BASELINE)}
        sides[BASELINE].cache_key = "k1"
        run = ABRun(load_thresholds(SHIPPED_THRESHOLDS), profile, detect(quick=True), tmp_path / "out", sys.executable,
                    progress=lambda m: None, sides=sides)
        for side in sides.values():
            side._profile = run.profile
        run.start()
        run.profile_ops()
        return run.finish(), log

    (mask,) = profile.ops
    counted = ScopeCounts(mask.name, (640, 480), 1, {"aten::copy_": 7}, 7)
    opcache.store(tmp_path / "cache", "k1", RunRecord(profile="cpu", thresholds_path="t.yaml", model="m",
                                                     environment={}, op_counts=[counted]))
    reads, read = [], opcache.load
    monkeypatch.setattr(opcache, "load", lambda folder, key: reads.append(key) or read(folder, key))
    rec, log = op_only_run()
    assert reads == ["k1"]  # asked whether to start the baseline, then taken: one read
    assert ("key", BASELINE) in log and ("start", BASELINE) not in log and ("launch", BASELINE) not in log
    assert [e[1] for e in log if e[0] == "profile"] == [CANDIDATE]
    assert rec.baseline.op_counts == [counted] and rec.baseline.environment.worker.op_counts_cache.status == "hit"
    assert log.index(("launch", CANDIDATE)) < log.index(("key", BASELINE))  # the candidate starts meanwhile

    opcache.entry_path(tmp_path / "cache", "k1").unlink()
    rec, log = op_only_run()
    assert ("start", BASELINE) in log and {e[1] for e in log if e[0] == "profile"} == {CANDIDATE, BASELINE}
    assert rec.baseline.environment.worker.op_counts_cache.status == "stored"


# ----------------------------------------------------------------------------- one way to host a side
def test_a_spec_says_what_runs_and_the_harness_where_the_child_runs(tmp_path):
    """A command names its sides' interpreters; the child runs in a side's interpreter only where
    guard imports there and the run has one side (else guard's, which starts the workers)."""
    from guard.measure.harness import RunSpec, SidePython

    own = SidePython("/envs/head/bin/python", has_guard=False)
    overlay = SidePython("/cache/rev/python")
    one = RunSpec(profile="cpu", thresholds="/t.yaml", output=str(tmp_path), side=overlay, imports=("vllm.x",))
    worker = RunSpec(profile="cpu", thresholds="/t.yaml", output=str(tmp_path), side=own)
    ab = RunSpec(profile="cpu", thresholds="/t.yaml", output=str(tmp_path), side=overlay, baseline=own,
                 fresh_baseline=True)
    assert (one.child_python, worker.child_python, ab.child_python) == ("/cache/rev/python", None, None)
    assert (one.record_file, worker.record_file, ab.record_file) == ("run.json", "run.json", "ab-run.json")
    for spec in (one, worker, ab):
        spec.write(tmp_path / "spec.json")
        assert RunSpec.read(tmp_path / "spec.json") == spec


def test_an_ab_run_is_hosted_by_the_run_stages_child_and_leaves_ab_run_json(bare_python, tmp_path, capfd):
    """guard check --baseline's way in (guard.measure.harness.record_ab): the child starts both
    workers, the baseline's environment cannot start one (no yaml there), the candidate's is killed
    mid start, and the child still leaves ab-run.json with the baseline's own reason."""
    from guard.measure.harness import SidePython, record_ab
    from guard.model.jsonfiles import load_ab_run
    from tests.conftest import SHIPPED_THRESHOLDS

    thresholds = load_thresholds(SHIPPED_THRESHOLDS)
    rec = record_ab(thresholds, thresholds.profile("cpu"), tmp_path, baseline=SidePython(bare_python, has_guard=False))
    assert (tmp_path / "ab-run.json").exists() and not (tmp_path / "run.json").exists()
    assert load_ab_run(tmp_path / "ab-run.json").baseline_python == bare_python == rec.baseline_python
    (reason,) = rec.candidate.invalid_reasons
    assert reason.kind == ReasonKind.ENGINE and reason.text.startswith("baseline worker: ModuleNotFoundError")
    assert rec.candidate.thresholds_path == rec.baseline.thresholds_path == thresholds.recorded_path
    assert "engine ready" not in capfd.readouterr().out


def test_a_side_whose_interpreter_lacks_guard_runs_in_a_worker_under_the_child(bare_python, tmp_path):
    """A side in another environment (guard pr --base-python): the child runs in guard's
    interpreter and its engine in a worker of the side's, whose failure to start is the run's
    reason in run.json, not a crash of the child."""
    from guard.measure.harness import SidePython, record_suite
    from guard.model.records import Measures
    from tests.conftest import SHIPPED_THRESHOLDS

    thresholds = load_thresholds(SHIPPED_THRESHOLDS)
    rec = record_suite(thresholds, thresholds.profile("cpu"), tmp_path, measures=Measures.OPS,
                       side=SidePython(bare_python, has_guard=False))
    assert (tmp_path / "run.json").exists()
    assert [r.kind for r in rec.invalid_reasons] == [ReasonKind.ENGINE], rec.invalid_reasons
    assert "ModuleNotFoundError" in rec.invalid_reasons[0].text and "yaml" in rec.invalid_reasons[0].text
    assert rec.environment.vllm is None  # the worker's to say; it never said hello
    assert rec.op_counts == [] and rec.outcomes == []


def test_an_ab_child_that_left_no_record_is_an_invalid_run_with_how_it_ended(tmp_path):
    from guard.measure.harness import empty_record, read_ab_record
    from guard.model.records import ABRecord
    from tests.conftest import SHIPPED_THRESHOLDS

    thresholds = load_thresholds(SHIPPED_THRESHOLDS)
    cpu = thresholds.profile("cpu")
    fallback = ABRecord(candidate=empty_record(cpu, thresholds), baseline=empty_record(cpu, thresholds), baseline_python="b")
    rec = read_ab_record(tmp_path / "ab-run.json", -9, None, fallback)
    texts = [r.text for r in rec.candidate.invalid_reasons]
    assert [r.kind for r in rec.candidate.invalid_reasons] == [ReasonKind.CRASH, ReasonKind.CRASH]
    assert "killed by SIGKILL" in texts[0] and "without writing ab-run.json" in texts[1]
    assert rec.baseline.invalid_reasons == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_run_stages_child_dies_with_a_killed_guard(tmp_path):
    """guard killed outright (SIGKILL: no finally, no Ctrl-C grace) mid run: the child running its
    engine must not go on measuring for nobody."""
    from tests.conftest import SHIPPED_THRESHOLDS

    parent = subprocess.Popen([sys.executable, "-c", (
        "import sys; from pathlib import Path\n"
        "from guard.measure.harness import RunSpec, run_suite\n"
        f"run_suite(RunSpec(profile='cpu', thresholds={str(SHIPPED_THRESHOLDS.resolve())!r}, output={str(tmp_path)!r}))\n")],
        cwd=GUARD_ROOT, env=worker_env())
    child, deadline = None, time.monotonic() + 120  # seconds on a quiet machine; generous for a loaded one
    while child is None and time.monotonic() < deadline and parent.poll() is None:
        found = _children_of(parent.pid)
        child = found[0] if found else None
        time.sleep(0.05)
    assert child is not None, "the run stage's child never started"
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 60
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child), "the run stage's child outlived guard"


def _gone(pid: int) -> bool:
    try:
        return _state(pid) == "Z"
    except OSError:  # reaped: no /proc entry any more
        return True


def _children_of(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out
