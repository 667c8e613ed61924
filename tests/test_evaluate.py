"""guard.judge.evaluate: budgets + run record -> checks, verdict and notices (no engine)."""

from __future__ import annotations

from guard.model.environment import SpeedReading, SpeedReference
from guard.judge.evaluate import evaluate
from guard.model.records import InvalidReason, ReasonKind, Verdict
from tests.ttft_scenarios import budgeted, record, spread


# ----------------------------------------------------------------------------- stale budgets
def test_stale_budget_notice_names_the_update_command(cpu):
    profile = budgeted(cpu, p50=20000)  # 7.2 s measured, 15 % headroom: 20 s is far too loose
    res = evaluate(profile, record(spread(7.2, 15), rounds=3), output="out/dir")
    assert res.verdict == Verdict.PASS  # a notice, never a failure
    (notice,) = res.notices
    assert "ttft p50" in notice and "stale" in notice
    assert ("`guard update-thresholds --from out/dir/results.json --profile cpu "
            "--thresholds tests/fixtures/thresholds-statistics.yaml --only ttft`") in notice


def test_no_stale_notice_within_twice_the_headroom(cpu):
    # upper bound ~7.24 s; 8.9 s / 1.3 = 6.85 s is below it
    res = evaluate(budgeted(cpu, p50=8900), record(spread(7.2, 15), rounds=3))
    assert res.notices == ()


def test_no_stale_notice_from_an_invalid_run(cpu):
    rec = record(spread(7.2, 15), rounds=3)
    rec.invalid_reasons.append(InvalidReason(ReasonKind.ENGINE, "engine died during round 3: boom"))
    res = evaluate(budgeted(cpu, p50=20000), rec)
    assert res.verdict == Verdict.INVALID and res.notices == ()


def test_a_run_whose_machine_changed_speed_proposes_no_new_budget(cpu):
    """Its verdict stands, but instead of the update command the notice says why its numbers make no budget."""
    rec = record(spread(7.2, 15), rounds=3)
    rec.environment.speed_reference = SpeedReference.of(SpeedReading("speedref-1", 194.0, 5.0, 5, 2),
                                                        SpeedReading("speedref-1", 311.0, 5.0, 5, 2))
    res = evaluate(budgeted(cpu, p50=20000), rec, output="out/dir")
    assert res.verdict == Verdict.PASS
    (notice,) = res.notices
    assert notice.startswith("the machine changed speed while it measured") and "update-thresholds refuses it" in notice
    assert "--from out/dir/results.json" not in notice


def test_unbounded_intervals_are_never_called_stale(cpu):
    res = evaluate(budgeted(cpu, p99=50000), record(spread(7.2, 15), rounds=3))
    assert res.notices == ()




def test_a_stopped_in_process_run_is_not_said_to_be_a_remote_server():
    """A run the run stage stopped has no census to judge; that is its stated reason, not the
    `--server-url` notice ("not measured in this mode"), which belongs to remote servers only."""
    import copy
    from pathlib import Path

    from guard.config.loading import load_thresholds
    from guard.judge.rejudge import judged_profile
    from guard.model.jsonfiles import load_results
    from tests.conftest import SHIPPED_THRESHOLDS

    run = copy.deepcopy(load_results(Path(__file__).parent / "fixtures" / "runs" / "cpu-float32-clean.json").run)
    run.invalid_reasons.append(InvalidReason(ReasonKind.ENGINE, "engine failed to start: ModuleNotFoundError: No module named 'vllm.x'"))
    res = evaluate(judged_profile(run, load_thresholds(SHIPPED_THRESHOLDS), source="x"), run)
    assert res.verdict == Verdict.INVALID
    assert not [n for n in res.notices if "not measured in this mode" in n]


def test_a_run_that_measured_no_ttft_is_judged_on_what_it_measured():
    """`--only ops` (the record's ``measures``): the TTFT budgets are not judged and missing samples
    are no reason; the same record claiming TTFT too is invalid for want of them. Decided in the
    judge from the record, once, for guard check, selftest, pr and the re-judging poster alike."""
    import copy
    import dataclasses
    from pathlib import Path

    from guard.config.loading import load_thresholds
    from guard.config.census import read_baseline
    from guard.judge.rejudge import judged_profile
    from guard.model.jsonfiles import load_results
    from guard.model.records import Measures
    from tests.conftest import SHIPPED_THRESHOLDS

    run = copy.deepcopy(load_results(Path(__file__).parent / "fixtures" / "runs" / "cpu-float32-clean.json").run)
    profile = judged_profile(run, load_thresholds(SHIPPED_THRESHOLDS), source="x")
    assert profile.ttft_ms and run.op_counts  # a real run: TTFT budgets, op counts
    run.outcomes = [o for o in run.outcomes if o.warmup]  # what an ops-only run records: no timed request
    baseline = read_baseline(profile.census)
    ops_only = evaluate(profile, dataclasses.replace(run, measures=Measures.OPS), census_baseline=baseline)
    assert ops_only.ttft_checks == () and ops_only.op_checks and ops_only.verdict == Verdict.PASS, ops_only.invalid_reasons
    claimed = evaluate(profile, dataclasses.replace(run, measures=Measures.BOTH), census_baseline=baseline)
    assert claimed.verdict == Verdict.INVALID
