"""guard.judge.rules: the TTFT decision rule, and guard.judge.sequential's resampling rule for one
side (through the run stage's loop, guard.measure.stopping), on synthetic samples."""

from __future__ import annotations

import math

import pytest

from guard.config.budgets import Statistics
from guard.judge.evaluate import evaluate
from guard.model.records import RequestOutcome, Status, Verdict
from guard.judge.rules import decide_latency, judge_latency, undecided
from guard.judge.sequential import next_batch, single_run_rule, ttft_rule
from guard.measure.stopping import sample_until_decided
from tests.ttft_scenarios import budgeted, record, spread


# ----------------------------------------------------------------------------- decision rule
def test_clear_pass_is_decided_by_the_interval():
    d = decide_latency("p50", 9000, spread(7.2, 10), 0.95)
    assert d.status == Status.PASS
    assert d.interval_ms[1] <= 9000 and d.samples == 10


def test_clear_fail_is_decided_by_the_interval_even_at_five_samples():
    d = decide_latency("p90", 7000, spread(7.2, 5), 0.95)
    assert d.status == Status.FAIL
    assert d.interval_ms[0] > 7000 and d.interval_ms[1] == math.inf


def test_borderline_is_inconclusive_and_asks_for_a_batch(cpu):
    samples = spread(9.0, 5, width=0.04)  # straddles the 9000 ms p50 budget
    pending = undecided(budgeted(cpu, p50=9000).ttft_ms, samples, cpu.statistics.confidence)
    assert [d.key for d in pending] == ["p50"]
    assert next_batch(cpu.statistics, 5, any_undecided=True) == cpu.statistics.batch


@pytest.mark.parametrize("measured, undecided, cap, expected", [
    (5, True, 15, 5),
    (12, True, 15, 3),  # cut so the total does not pass the cap
    (15, True, 15, 0),
    (5, False, 15, 0),  # everything decided: stop
    (5, True, None, 0),  # no cap configured: no resampling
])
def test_next_batch(measured, undecided, cap, expected):
    assert next_batch(Statistics(max_requests=cap, batch=5), measured, undecided) == expected


def test_at_the_cap_a_straddling_interval_passes_on_the_point_estimate_and_says_so():
    c = judge_latency("p99", 10000, spread(9.5, 15, width=0.03), rounds=3, confidence=0.95, max_requests=15)
    assert c.status == Status.INCONCLUSIVE  # held on the estimate, not proven: shown as such
    assert c.measured_ms <= 10000 and c.interval_ms[1] == math.inf
    assert "at the cap of 15 requests" in c.note and "point estimate" in c.note
    assert "needs >= 368 samples" in c.note
    assert (c.samples, c.rounds) == (15, 3)


def test_at_the_cap_a_straddling_interval_fails_on_the_point_estimate():
    samples = spread(9.0, 15, width=0.04)
    c = judge_latency("p50", 8990, samples, rounds=3, confidence=0.95, max_requests=15)
    assert c.status == Status.FAIL
    assert c.interval_ms[0] <= 8990 < c.interval_ms[1]  # straddles: the interval alone did not decide
    assert "point estimate" in c.note and ">" in c.note


def test_without_a_cap_the_note_says_no_resampling_was_configured():
    c = judge_latency("p50", 9000, spread(9.0, 5, width=0.04), rounds=1, confidence=0.95, max_requests=None)
    assert "statistics.max_requests is not set" in c.note


def test_checks_decided_by_the_interval_carry_no_note(cpu):
    res = evaluate(budgeted(cpu, p50=9000), record(spread(7.2, 15), rounds=3))
    (c,) = res.checks
    assert c.status == Status.PASS and c.note is None
    assert c.samples == 15 and c.rounds == 3 and math.isfinite(c.interval_ms[1])


def test_verdict_fails_on_a_point_estimate_failure(cpu):
    res = evaluate(budgeted(cpu, p50=8990), record(spread(9.0, 15, width=0.04), rounds=3))
    assert res.verdict == Verdict.REGRESSION and res.exit_code == 1
    assert res.ttft_checks[0].note


def test_verdict_passes_with_inconclusive_checks(cpu):
    res = evaluate(cpu, record(spread(7.2, 15), rounds=3))
    statuses = {c.percentile: c.status for c in res.ttft_checks}
    assert statuses == {"p50": Status.PASS, "p90": Status.INCONCLUSIVE, "p99": Status.INCONCLUSIVE}
    assert res.verdict == Verdict.PASS and res.exit_code == 0




# ----------------------------------------------------------------------------- the sequential rule
def scripted(samples):
    """measure(n): the next n scripted samples, and the batch sizes asked for."""
    script, asked = list(samples), []

    def measure(n):
        asked.append(n)
        return [script.pop(0) for _ in range(n)]

    return measure, asked


def test_sequential_rule_resamples_until_decided_or_capped():
    measure, asked = scripted([7.2] * 30)
    got = sample_until_decided(ttft_rule({"p99": 10000}, Statistics(max_requests=15, batch=5)), 5, measure)
    assert asked == [5, 5, 5] and len(got) == 15  # p99 has no upper bound below n = 368: capped


def test_sequential_rule_stops_once_every_budget_is_decided():
    measure, asked = scripted([7.2] * 30)
    sample_until_decided(ttft_rule({"p50": 9000}, Statistics(max_requests=15, batch=5)), 6, measure)
    assert asked == [6]


def test_sequential_rule_reports_each_undecided_round_and_honours_the_veto():
    measure, asked = scripted([7.2] * 30)
    said = []
    sample_until_decided(ttft_rule({"p99": 10000}, Statistics(max_requests=15, batch=5)), 5, measure,
                          on_undecided=lambda pending, n: said.append(([d.key for d in pending], n)),
                          keep_going=lambda: len(asked) < 2)
    assert asked == [5, 5] and said == [(["p99"], 5)]


def test_without_a_rule_the_loop_measures_the_first_batch_only():
    measure, asked = scripted([7.2] * 30)
    assert len(sample_until_decided(None, 5, measure)) == 5 and asked == [5]


def test_the_single_run_rule_is_the_profiles_budgets_at_its_statistics(cpu):
    """What GuardRun is given (guard.child, the pytest plugin): the verdict's own rule, which
    ``undecided`` and ``next_batch`` are, and the progress line's words are the decisions' own."""
    rule = single_run_rule(cpu)
    ttfts = [7.2] * cpu.workload.requests
    samples = [RequestOutcome(i, (640, 480), False, True, ttft_client_s=t) for i, t in enumerate(ttfts)]
    assert [d.key for d in rule.undecided(samples)] == [d.key for d in undecided(cpu.ttft_ms, ttfts, cpu.statistics.confidence)]
    assert rule.cap == cpu.statistics.max_requests
    assert rule.next_batch(len(samples), True) == next_batch(cpu.statistics, len(samples), True) > 0
    assert rule.next_batch(len(samples), False) == 0
    pending = rule.undecided(samples)
    assert rule.describe(pending) == "; ".join(d.describe() for d in pending)
