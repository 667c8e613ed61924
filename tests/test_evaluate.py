"""guard.evaluate's TTFT decision rule, the run stage's resampling (GuardRun.measure_until_decided
with a scripted measure(), no engine), stale-budget notices and the results.json round trip."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from guard.budgets import Statistics, load_thresholds
from guard.evaluate import decide_ttft, evaluate, fmt_interval, more_requests, ttft_check, undecided_ttft
from guard.hardware import Hardware
from guard.results import RequestOutcome, RunRecord, Status, Verdict, load_results, results_to_dict, write_json_atomic
from guard.contention import ContentionSampler
from guard.runner import GuardRun

THRESHOLDS = Path(__file__).parent / "fixtures" / "thresholds-statistics.yaml"  # pinned, see the file
CPU_ENV = {"hardware_profile": "cpu", "cuda": False, "gpu": None, "cpu": "Test CPU", "cpu_count": 2,
           "hardware_match": {"ok": True, "reason": None, "rule": {"cuda": False, "gpu_name_regex": None}},
           "gpu_state": None}


@pytest.fixture(scope="module")
def thresholds():
    return load_thresholds(THRESHOLDS)


@pytest.fixture(autouse=True)
def fixed_fingerprint(monkeypatch):
    """GuardRun fingerprints the machine (git, torch import); these tests need a fixed CPU one."""
    monkeypatch.setattr("guard.runner.fingerprint", lambda hw, profile: dict(CPU_ENV))


@pytest.fixture
def cpu(thresholds):
    """The real cpu profile (5 requests, batches of 5 up to 15, p50/p90/p99), TTFT budgets only."""
    return dataclasses.replace(thresholds.profile("cpu"), ops=())


def budgeted(profile, **ttft_ms):
    return dataclasses.replace(profile, ttft_ms=ttft_ms)


def record(samples_s, rounds=1, env=None, profile="cpu"):
    outcomes = [RequestOutcome(index=i, image_size=(640, 480), warmup=False, success=True, ttft_client_s=s)
                for i, s in enumerate(samples_s)]
    return RunRecord(profile=profile, thresholds_path=str(THRESHOLDS), model="deepseek-ocr-2",
                     environment=dict(CPU_ENV if env is None else env), outcomes=outcomes, rounds=rounds)


def spread(center_s, n, width=0.01):
    """n samples evenly across center +- width/2 (relative)."""
    return [center_s * (1 - width / 2 + width * i / (n - 1)) for i in range(n)]


# ----------------------------------------------------------------------------- decision rule
def test_clear_pass_is_decided_by_the_interval():
    d = decide_ttft("p50", 9000, spread(7.2, 10), 0.95)
    assert d.status == Status.PASS
    assert d.interval_ms[1] <= 9000 and d.samples == 10


def test_clear_fail_is_decided_by_the_interval_even_at_five_samples():
    d = decide_ttft("p90", 7000, spread(7.2, 5), 0.95)
    assert d.status == Status.FAIL
    assert d.interval_ms[0] > 7000 and d.interval_ms[1] == math.inf


def test_borderline_is_inconclusive_and_asks_for_a_batch(cpu):
    samples = spread(9.0, 5, width=0.04)  # straddles the 9000 ms p50 budget
    undecided = undecided_ttft(budgeted(cpu, p50=9000), samples)
    assert [d.key for d in undecided] == ["p50"]
    assert more_requests(cpu.statistics, 5, undecided=True) == cpu.statistics.batch


@pytest.mark.parametrize("measured, undecided, cap, expected", [
    (5, True, 15, 5),
    (12, True, 15, 3),  # cut so the total does not pass the cap
    (15, True, 15, 0),
    (5, False, 15, 0),  # everything decided: stop
    (5, True, None, 0),  # no cap configured: no resampling
])
def test_more_requests(measured, undecided, cap, expected):
    assert more_requests(Statistics(max_requests=cap, batch=5), measured, undecided) == expected


def test_at_the_cap_a_straddling_interval_passes_on_the_point_estimate_and_says_so():
    c = ttft_check("p99", 10000, spread(9.5, 15, width=0.03), rounds=3, confidence=0.95, max_requests=15)
    assert c.status == Status.INCONCLUSIVE  # held on the estimate, not proven: shown as such
    assert c.measured <= 10000 and c.interval[1] == math.inf
    assert "at the cap of 15 requests" in c.note and "point estimate" in c.note
    assert "needs >= 368 samples" in c.note
    assert (c.samples, c.rounds) == (15, 3)


def test_at_the_cap_a_straddling_interval_fails_on_the_point_estimate():
    samples = spread(9.0, 15, width=0.04)
    c = ttft_check("p50", 8990, samples, rounds=3, confidence=0.95, max_requests=15)
    assert c.status == Status.FAIL
    assert c.interval[0] <= 8990 < c.interval[1]  # straddles: the interval alone did not decide
    assert "point estimate" in c.note and ">" in c.note


def test_without_a_cap_the_note_says_no_resampling_was_configured():
    c = ttft_check("p50", 9000, spread(9.0, 5, width=0.04), rounds=1, confidence=0.95, max_requests=None)
    assert "statistics.max_requests is not set" in c.note


def test_checks_decided_by_the_interval_carry_no_note(cpu):
    res = evaluate(budgeted(cpu, p50=9000), record(spread(7.2, 15), rounds=3))
    (c,) = res.checks
    assert c.status == Status.PASS and c.note is None
    assert c.samples == 15 and c.rounds == 3 and c.interval is not None


def test_verdict_fails_on_a_point_estimate_failure(cpu):
    res = evaluate(budgeted(cpu, p50=8990), record(spread(9.0, 15, width=0.04), rounds=3))
    assert res.verdict == Verdict.REGRESSION and res.exit_code == 1
    assert res.checks[0].note


def test_verdict_passes_with_inconclusive_checks(cpu):
    res = evaluate(cpu, record(spread(7.2, 15), rounds=3))
    statuses = {c.name: c.status for c in res.checks}
    assert statuses == {"ttft_ms.p50": Status.PASS, "ttft_ms.p90": Status.INCONCLUSIVE, "ttft_ms.p99": Status.INCONCLUSIVE}
    assert res.verdict == Verdict.PASS and res.exit_code == 0


def test_interval_formatting_shows_unbounded_sides():
    assert fmt_interval((7012.4, math.inf)) == "[7012, ∞)"
    assert fmt_interval((-math.inf, math.inf)) == "(-∞, ∞)"


# ----------------------------------------------------------------------------- run stage
class ScriptedRun(GuardRun):
    """GuardRun whose measure() returns scripted TTFTs instead of running the engine."""

    def __init__(self, thresholds, profile, script, tmp_path, contention=None):
        self.lines: list[str] = []
        super().__init__(thresholds, profile, Hardware(cuda=False, gpu_name=None, cpu_name="Test CPU", cpu_count=2),
                         tmp_path, progress=self.lines.append, contention=contention or ContentionSampler(proc=tmp_path / "no-proc"))
        self.script = list(script)
        self.counts: list[int] = []

    def measure(self, count):
        self.record.rounds += 1
        self.counts.append(count)
        new = []
        for _ in range(count):
            t = self.script.pop(0)
            ok = t is not None
            new.append(RequestOutcome(index=len(self.record.outcomes) + len(new), image_size=(640, 480), warmup=False,
                                      success=ok, ttft_client_s=t, error=None if ok else "timed out after 600 s"))
        self.record.outcomes.extend(new)
        return new


def test_run_stage_resamples_to_the_cap_and_the_verdict_agrees(thresholds, cpu, tmp_path):
    run = ScriptedRun(thresholds, cpu, [7.2] * 20, tmp_path)
    run.measure_until_decided()
    assert run.counts == [5, 5, 5]  # p90/p99 cannot be passed by their interval below n = 36
    assert run.record.rounds == 3
    assert any("p99" in line and "inconclusive" in line and "measuring 5 more" in line for line in run.lines)
    res = evaluate(cpu, run.finish())
    assert {(c.samples, c.rounds) for c in res.checks} == {(15, 3)}
    assert res.verdict == Verdict.PASS


def test_run_stage_stops_as_soon_as_every_percentile_is_decided(thresholds, cpu, tmp_path):
    profile = budgeted(cpu, p90=7000)  # a clear regression: the lower bound is above at n = 5
    run = ScriptedRun(thresholds, profile, [7.2] * 20, tmp_path)
    run.measure_until_decided()
    assert run.counts == [5]
    assert evaluate(profile, run.finish()).checks[0].note is None


def test_run_stage_cuts_the_last_batch_at_the_cap(thresholds, cpu, tmp_path):
    profile = dataclasses.replace(cpu, statistics=Statistics(confidence=0.95, max_requests=12, batch=5))
    run = ScriptedRun(thresholds, profile, [7.2] * 20, tmp_path)
    run.measure_until_decided()
    assert run.counts == [5, 5, 2]


def test_run_stage_does_not_resample_without_a_cap(thresholds, cpu, tmp_path):
    profile = dataclasses.replace(cpu, statistics=Statistics(confidence=0.95, max_requests=None, batch=5))
    run = ScriptedRun(thresholds, profile, [7.2] * 20, tmp_path)
    run.measure_until_decided()
    assert run.counts == [5] and run.lines == []


def test_run_stage_stops_resampling_after_a_failed_request(thresholds, cpu, tmp_path):
    run = ScriptedRun(thresholds, cpu, [7.2, None, 7.2, 7.2, 7.2] + [7.2] * 10, tmp_path)
    run.measure_until_decided()
    assert run.counts == [5]  # the run is invalid whatever more samples say


# ----------------------------------------------------------------------------- stale budgets
def test_stale_budget_notice_names_the_update_command(cpu):
    profile = budgeted(cpu, p50=20000)  # 7.2 s measured, 15 % headroom: 20 s is far too loose
    res = evaluate(profile, record(spread(7.2, 15), rounds=3), output="out/dir")
    assert res.verdict == Verdict.PASS  # a notice, never a failure
    (notice,) = res.notices
    assert "ttft_ms.p50" in notice and "stale" in notice
    assert "`guard update-thresholds --from out/dir/results.json --profile cpu`" in notice


def test_no_stale_notice_within_twice_the_headroom(cpu):
    # upper bound ~7.24 s; 8.9 s / 1.3 = 6.85 s is below it
    res = evaluate(budgeted(cpu, p50=8900), record(spread(7.2, 15), rounds=3))
    assert res.notices == []


def test_no_stale_notice_from_an_invalid_run(cpu):
    rec = record(spread(7.2, 15), rounds=3)
    rec.invalid_reasons.append("engine died during round 3: boom")
    res = evaluate(budgeted(cpu, p50=20000), rec)
    assert res.verdict == Verdict.INVALID and res.notices == []


def test_unbounded_intervals_are_never_called_stale(cpu):
    res = evaluate(budgeted(cpu, p99=50000), record(spread(7.2, 15), rounds=3))
    assert res.notices == []


# ----------------------------------------------------------------------------- results.json
def test_results_json_round_trip_keeps_interval_samples_rounds(cpu, tmp_path):
    res = evaluate(cpu, record(spread(7.2, 15), rounds=3), guard_version="test")
    path = tmp_path / "results.json"
    write_json_atomic(path, results_to_dict(res))
    back = load_results(path)
    assert back.checks == res.checks
    by_name = {c.name: c for c in back.checks}
    assert by_name["ttft_ms.p99"].interval[1] == math.inf  # the unbounded side survives
    assert isinstance(by_name["ttft_ms.p50"].interval, tuple)
    assert {(c.samples, c.rounds) for c in back.checks} == {(15, 3)}
    assert by_name["ttft_ms.p90"].note == res.checks[1].note
