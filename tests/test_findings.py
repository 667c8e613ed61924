"""Shadow mode: pull requests' findings recorded (`guard record --findings`), judged (`guard
judge-finding`, an acceptance, a later run that fixed them) and read back (`guard history
--findings`), all through the real CLI on the recorded runs of tests/fixtures: the real `guard pr`
mask-loop regression (six failed checks), the real clean and busy `guard check` runs, and the
canary run that must not be recorded."""

from __future__ import annotations

import contextlib
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from guard import cli
from guard.history.findings import Outcome, finding_key, load_findings, parse_findings, run_from_results, to_line
from guard.model.jsonfiles import load_results
from tests.conftest import run_guard

FIXTURES = Path(__file__).parent / "fixtures"
MASK_LOOP = FIXTURES / "pr" / "mask-loop.results.json"  # guard pr --only ops: a regression, 6 failed checks
CLEAN = FIXTURES / "runs" / "cpu-float32-clean.json"  # guard check: pass
BUSY = FIXTURES / "runs" / "cpu-bf16-busy.json"  # guard check: invalid (busy machine)
CANARY = FIXTURES / "runs" / "cpu-float32-mutant-token-copies.json"  # guard check --inject: a regression on purpose
BUDGETS = "thresholds/deepseek-ocr-2.yaml"
HEAD = "addf99e4aab189a3f83b54671686b49bd2e2f982"  # the mask-loop run's head
FIX = "1111111111111111111111111111111111111111"  # a later head of the same pull request
MASK_KEYS = ["ops mask_path 640x480 aten::_index_put_impl_", "ops mask_path 640x480 total_ops",
             "ops mask_path 800x400 aten::_index_put_impl_", "ops mask_path 800x400 total_ops",
             "census vllm/model_executor/models/deepencoder2.py:CustomQwen2Decoder._create_custom_model.<locals>."
             "CustomQwen2ModelInner._create_custom_4d_mask 800x400",
             "census vllm/model_executor/models/deepencoder2.py:CustomQwen2Decoder._create_custom_model.<locals>."
             "CustomQwen2ModelInner._create_custom_4d_mask 640x480"]


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


def guard(*args: object) -> Ran:
    """guard's command line in this process (`guard` itself, a child process each time, costs half a
    second a call; test_a_real_pr_regression... runs the console entry point)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in args])
    return Ran(code, out.getvalue(), err.getvalue())


def record(store: Path, results: Path, pr: int, *extra: str):
    out = guard("record", "--from", results, "--findings", store, "--pr", pr, *extra)
    assert out.returncode == 0, out.stderr
    return out


def rows(shown: str) -> dict[tuple[str, str], list[str]]:
    """(pr, finding key) -> the table row's cells, split on the table's two-space gaps."""
    lines = shown.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("pr  "))
    out = {}
    for line in lines[header + 1:]:
        if not line.startswith("#"):
            break
        cells = re.split(r"\s{2,}", line)
        key = next(k for k in MASK_KEYS if k in line)
        out[(cells[0], key)] = cells
    return out


# ----------------------------------------------------------------------------- recording
def test_a_real_pr_regression_is_recorded_with_each_finding_and_recording_it_again_appends_nothing(tmp_path):
    store = tmp_path / "findings.jsonl"
    out = run_guard("record", "--from", str(MASK_LOOP), "--findings", str(store), "--pr", "101", "--note",
                    "https://ci/run/1", timeout=120)  # the console entry point, as CI runs it
    assert out.returncode == 0, out.stderr
    assert f"appended pull request #101 at {HEAD[:12]} (deepseek-ocr-2, cpu): regression, 6 finding(s) on line 1" \
        in out.stdout
    [run] = load_findings(store)
    results = load_results(MASK_LOOP)
    assert (run.pr, run.head, run.base, run.verdict, run.accepted_by) == (101, HEAD, results.pr.base.sha, "regression", None)
    assert [f.key for f in run.findings] == [finding_key(c) for c in results.failed] == MASK_KEYS
    ops, census = run.findings[0], run.findings[4]
    assert (ops.function, ops.measured, ops.budget, ops.baseline, ops.unit) == (
        "vllm/model_executor/models/deepencoder2.py:_update_causal_mask", 513, 0, None, "calls")
    assert census.function.endswith("._create_custom_4d_mask") and census.budget is None
    assert (census.measured, census.baseline) == (13200, 4)
    text = store.read_text()

    again = record(store, MASK_LOOP, 101)
    assert "already recorded on line 1" in again.stdout and "nothing appended" in again.stdout
    assert store.read_text() == text  # the same run, once


def test_the_poster_s_re_judgement_is_what_is_recorded(tmp_path):
    """--trusted-thresholds judges the run again as `guard comment` does: the shipped budgets give
    the same six findings; a clean run judged the same way has none."""
    store = tmp_path / "f.jsonl"
    record(store, MASK_LOOP, 7, "--trusted-thresholds", "thresholds/{model}.yaml")
    record(store, CLEAN, 8, "--trusted-thresholds", BUDGETS)
    mask, clean = load_findings(store)
    assert [f.key for f in mask.findings] == MASK_KEYS and mask.verdict == "regression"
    assert clean.findings == () and clean.verdict == "pass" and clean.head == load_results(CLEAN).run.environment.git_commit


def test_an_invalid_run_is_counted_without_findings_and_a_canary_run_is_refused(tmp_path):
    store = tmp_path / "f.jsonl"
    out = record(store, BUSY, 9)
    assert "invalid, 0 finding(s)" in out.stdout  # its failed TTFT check cannot be trusted: no finding
    canary = guard("record", "--from", CANARY, "--findings", store, "--pr", 10)
    assert canary.returncode == 2 and "injected on purpose" in canary.stderr
    assert len(load_findings(store)) == 1


# ----------------------------------------------------------------------------- judging
@pytest.fixture
def shadow(tmp_path) -> Path:
    """Three pull requests with the mask-loop regression: #101 later fixed, #102 judged by a
    person, #103 accepted; #104's run was invalid."""
    store = tmp_path / "findings.jsonl"
    record(store, MASK_LOOP, 101)
    record(store, CLEAN, 101, "--sha", FIX, "--date", "2026-12-04T10:00:00+00:00")  # a later push: passes
    record(store, MASK_LOOP, 102)
    record(store, MASK_LOOP, 103, "--accepted-by", "alice")
    record(store, BUSY, 104)
    return store


def test_the_table_and_the_false_alarm_rate_as_printed(shadow):
    judged = guard("judge-finding", "--findings", shadow, "--pr", 102, "--finding", MASK_KEYS[1],
                   "--finding", MASK_KEYS[3], "--as", "false-alarm", "--by", "bob", "--note", "total_ops budget too tight")
    assert judged.returncode == 0, judged.stderr
    assert f"pull request #102 (deepseek-ocr-2, cpu): {MASK_KEYS[1]}: false alarm by @bob (line 6 of {shadow})" \
        in judged.stdout
    lines = shadow.read_text().splitlines()
    assert len(lines) == 7 and json.loads(lines[-1])["outcome"] == "false_alarm"

    shown = guard("history", "--findings", shadow)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout.splitlines()
    assert out[0] == (f"guard history: {shadow}: findings of pull requests: 5 run(s) of 4 pull request(s) recorded "
                      "(3 with findings, 1 invalid)")
    assert out[1].split() == ["pr", "model", "profile", "judged", "by", "when", "measured", "finding", "note"]
    table = rows(shown.stdout)
    assert len(table) == 18
    for key in MASK_KEYS:  # fixed by the later push that no longer has them
        assert table[("#101", key)][3:6] == ["fixed", "commit 1111111", "2026-12-04 10:00"]
        assert table[("#103", key)][3:5] == ["accepted", "alice"]
    assert table[("#102", MASK_KEYS[1])][3:5] == ["false alarm", "bob"]
    assert table[("#102", MASK_KEYS[1])][-1] == "total_ops budget too tight"
    assert table[("#102", MASK_KEYS[0])][3:4] == ["open"]
    assert table[("#101", MASK_KEYS[0])][6] == "513 calls (budget 0 calls)"
    assert table[("#101", MASK_KEYS[4])][6] == "13200 calls (baseline 4 calls)"
    assert out[-2] == "18 findings on 3 pull requests: 6 accepted, 6 fixed, 2 false alarms, 4 open"
    assert out[-1] == ("false-alarm rate: 2 false alarm(s) / 14 judged (accepted + fixed + false alarm) = 14.3 %; "
                       "pull requests with a false alarm: 1 of the 3 with findings")


def test_the_latest_judgement_wins_and_a_person_s_word_outlasts_a_run(shadow):
    def judge(pr, key, how, by):
        done = guard("judge-finding", "--findings", shadow, "--pr", pr, "--finding", key, "--as", how, "--by", by)
        assert done.returncode == 0, done.stderr

    judge(102, MASK_KEYS[0], "false-alarm", "bob")
    judge(102, MASK_KEYS[0], "open", "carol")  # carol disagrees: open again
    judge(103, MASK_KEYS[0], "false-alarm", "bob")  # over alice's acceptance
    record(shadow, CLEAN, 102, "--sha", FIX)  # a push that fixes #102: the open findings are fixed
    judge(101, MASK_KEYS[2], "false-alarm", "bob")  # after the fix: a person says it never was real
    table = rows(guard("history", "--findings", shadow).stdout)
    assert table[("#102", MASK_KEYS[0])][3:5] == ["fixed", "commit 1111111"]
    assert table[("#103", MASK_KEYS[0])][3:5] == ["false alarm", "bob"]
    assert table[("#101", MASK_KEYS[2])][3:5] == ["false alarm", "bob"]
    assert table[("#101", MASK_KEYS[3])][3] == "fixed"


def test_a_finding_that_comes_back_is_open_again_and_one_gone_on_a_re_run_of_the_same_commit_stays_open(tmp_path):
    store = tmp_path / "f.jsonl"
    record(store, MASK_LOOP, 5)
    record(store, CLEAN, 5, "--sha", FIX)  # fixed ...
    record(store, MASK_LOOP, 5, "--sha", "2" * 40)  # ... and back
    table = rows(guard("history", "--findings", store).stdout)
    back = table[("#5", MASK_KEYS[0])]
    assert back[3] == "open" and "seen again at 2222222 after it was fixed" in back[-1]

    store = tmp_path / "rerun.jsonl"
    record(store, MASK_LOOP, 6)
    again = record(store, CLEAN, 6, "--sha", HEAD)  # the same commit measured again: another result of the same run
    assert "line 1 holds an earlier result of the same run (regression, 6 finding(s)): the later line counts" in again.stdout
    shown = guard("history", "--findings", store).stdout
    assert "not seen when addf99e was measured again: judge it" in rows(shown)[("#6", MASK_KEYS[0])][-1]
    assert "1 run(s) of 1 pull request(s) recorded (0 with findings, 0 invalid)" in shown  # the later result counts


def test_an_acceptance_that_came_later_is_appended_after_the_first_record(tmp_path):
    store = tmp_path / "f.jsonl"
    record(store, MASK_LOOP, 11)
    out = record(store, MASK_LOOP, 11, "--accepted-by", "@alice")
    assert "accepted by @alice on line 2" in out.stdout
    assert record(store, MASK_LOOP, 11, "--accepted-by", "alice").stdout.count("nothing appended") == 1
    shown = guard("history", "--findings", store).stdout
    assert "6 findings on 1 pull request: 6 accepted, 0 fixed, 0 false alarms, 0 open" in shown
    assert "false-alarm rate: 0 false alarm(s) / 6 judged" in shown and "= 0.0 %" in shown


def test_the_window_picks_pull_requests_and_findings(shadow):
    last = guard("history", "--findings", shadow, "--last-prs", "2").stdout  # #103 and #104 (invalid)
    assert "last 2 pull request(s): 2 run(s) of 2 pull request(s)" in last
    assert "6 findings on 1 pull request: 6 accepted" in last
    since = guard("history", "--findings", shadow, "--since", "2026-12-04").stdout  # only #101's passing push
    assert "no findings in this window" in since and "false-alarm rate: none judged yet" in since
    none = guard("history", "--findings", shadow, "--model", "qwen2-5-vl")
    assert none.returncode == 0 and "0 findings on 0 pull requests" in none.stdout


# ----------------------------------------------------------------------------- bad input: exit 2, named
def test_an_unknown_finding_a_bad_outcome_and_a_bad_login_are_exit_2_and_append_nothing(shadow):
    before = shadow.read_bytes()
    unknown = guard("judge-finding", "--findings", shadow, "--pr", 102, "--finding", MASK_KEYS[0],
                    "--finding", "ttft p50", "--as", "false-alarm", "--by", "bob")
    assert unknown.returncode == 2
    assert f"{shadow}: pull request #102 has no finding 'ttft p50'" in unknown.stderr
    assert "its findings: census vllm/" in unknown.stderr and MASK_KEYS[0] in unknown.stderr
    no_run = guard("judge-finding", "--findings", shadow, "--pr", 999, "--finding", "x", "--as", "fixed", "--by", "bob")
    assert no_run.returncode == 2 and "no run of it is recorded" in no_run.stderr
    verdict = guard("judge-finding", "--findings", shadow, "--pr", 102, "--finding", MASK_KEYS[0], "--as", "wontfix",
                    "--by", "bob")
    assert verdict.returncode == 2 and "argument --as: invalid choice: 'wontfix'" in verdict.stderr
    login = guard("judge-finding", "--findings", shadow, "--pr", 102, "--finding", MASK_KEYS[0], "--as", "fixed",
                  "--by", "bob smith")
    assert login.returncode == 2 and "--by 'bob smith' is not a GitHub login" in login.stderr
    pr = guard("record", "--from", MASK_LOOP, "--findings", shadow, "--pr", "#12")
    assert pr.returncode == 2 and "is not a pull request's number" in pr.stderr
    mixed = guard("record", "--from", MASK_LOOP, "--findings", shadow, "--pr", 12, "--replace")
    assert mixed.returncode == 2 and "--replace does not go with --findings" in mixed.stderr
    since = guard("history", "--findings", shadow, "--since", "yesterday")
    assert since.returncode == 2 and "--since 'yesterday' is not a date" in since.stderr
    png = guard("history", "--findings", shadow, "--png", "chart.png")
    assert png.returncode == 2 and "--png does not go with --findings" in png.stderr
    assert shadow.read_bytes() == before


@pytest.mark.parametrize(("damage", "where"), [
    (lambda d: {**d, "outcome": "wontfix"}, ":6: outcome: not a guard/findings line: 'wontfix' is not one of"),
    (lambda d: {**d, "finding": "ttft p99"}, ":6: finding: 'ttft p99': no earlier run line of pull request #102"),
    (lambda d: {**d, "by": "bob\n::error::x"}, ":6: by: not a guard/findings line"),
    (lambda d: {**d, "date": "next tuesday"}, ":6: date: 'next tuesday' is not an ISO 8601"),
    (lambda d: {**d, "schema_version": 2}, ":6: schema_version: schema version 2; this guard reads version 1"),
    (lambda d: "{\"kind\": ", ":6: (syntax): not valid JSON"),
])
def test_a_damaged_store_line_is_exit_2_naming_file_line_and_field(shadow, damage, where):
    judged = guard("judge-finding", "--findings", shadow, "--pr", 102, "--finding", MASK_KEYS[0], "--as", "fixed",
                   "--by", "bob")
    assert judged.returncode == 0, judged.stderr
    lines = shadow.read_text().splitlines()
    bad = damage(json.loads(lines[-1]))
    shadow.write_text("\n".join([*lines[:-1], bad if isinstance(bad, str) else json.dumps(bad)]) + "\n")
    for argv in (("history", "--findings", shadow),
                 ("record", "--from", MASK_LOOP, "--findings", shadow, "--pr", 1),
                 ("judge-finding", "--findings", shadow, "--pr", 101, "--finding", MASK_KEYS[0], "--as", "fixed",
                  "--by", "x")):
        out = guard(*argv)
        assert out.returncode == 2 and f"{shadow}{where}" in out.stderr, (argv, out.stderr)


def test_a_run_line_round_trips_and_an_outcome_reads_as_the_flag_says():
    [run] = parse_findings(to_line(run_from_results(load_results(MASK_LOOP), pr=1)), "f.jsonl")
    assert [f.key for f in run.findings] == MASK_KEYS
    assert {o.flag for o in Outcome} == {"open", "fixed", "accepted", "false-alarm"}
    assert Outcome.FALSE_ALARM.words == "false alarm"
