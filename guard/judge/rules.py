"""The decision rules: when a latency percentile (TTFT, TPOT, ITL) passes, fails or needs more data,
and how much more.

One module for the run stage (``GuardRun`` resamples while ``undecided`` names a budget, by
guard.judge.sequential.single_run_rule, which whoever starts the run passes in), evaluation
(``judge_latency`` makes the final ``LatencyCheck``), the self-test and the benchmarks, so what is
measured for sensitivity is what ships.

- The whole confidence interval above the budget: FAIL; at or below it: PASS.
- Straddling it: measure another ``statistics.batch`` requests, up to ``statistics.max_requests``
  (guard.judge.sequential).
- Still straddling at the cap (or with no cap set): judged on the point estimate, with a note
  saying so. Above the budget: FAIL, a regression like any other. At or below: INCONCLUSIVE, which
  passes but is shown as such, because the data did not prove the budget held (on the CPU
  profile that is every passing p90/p99: see guard.judge.stats, no upper bound exists at small n).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from guard.model import format as fmt
from guard.config.budgets import Statistics, min_samples_for_upper_bound, percentile_value
from guard.model.records import ITL, TTFT, Status, to_ms
from guard.model.checks import LatencyCheck
from guard.judge.stats import percentile, percentile_interval


@dataclass(frozen=True)
class LatencyDecision:
    """One budgeted percentile judged by its confidence interval alone."""

    key: str  # "p50"
    budget_ms: float
    estimate_ms: float  # the point estimate (type 7 percentile)
    interval_ms: tuple[float, float]  # +-inf where that side does not exist at this n
    samples: int
    confidence: float
    status: Status  # PASS | FAIL | INCONCLUSIVE (the interval straddles the budget)
    metric: str = TTFT

    def describe(self) -> str:
        name = self.key if self.metric == TTFT else f"{self.metric} {self.key}"
        return (f"{name}: {fmt.confidence(self.confidence)} interval {fmt.interval(self.interval_ms)} ms "
                f"vs budget {fmt.ms_unit(self.budget_ms)} (estimate {fmt.ms_unit(self.estimate_ms)}, n={self.samples})")


def interval_status(interval: tuple[float, float], budget: float) -> Status:
    """The rule for any budgeted percentile: FAIL when the whole interval is above the budget, PASS
    when it is at or below, else INCONCLUSIVE (measure more, or settle on the point estimate)."""
    if interval[0] > budget:
        return Status.FAIL
    if interval[1] <= budget:
        return Status.PASS
    return Status.INCONCLUSIVE


def decide_latency(key: str, budget_ms: float, samples_s: Sequence[float], confidence: float,
                   metric: str = TTFT) -> LatencyDecision:
    """A latency percentile's interval (ms) against its budget (``interval_status``)."""
    p = percentile_value(key)
    lo, hi = percentile_interval(samples_s, p, confidence)
    interval = (to_ms(lo), to_ms(hi))
    status = interval_status(interval, budget_ms)
    return LatencyDecision(key=key, budget_ms=budget_ms, estimate_ms=to_ms(percentile(samples_s, p)),
                        interval_ms=interval, samples=len(samples_s), confidence=confidence, status=status, metric=metric)


def undecided(budgets_ms: Mapping[str, float], samples_s: Sequence[float], confidence: float,
              metric: str = TTFT) -> list[LatencyDecision]:
    """The budgeted percentiles whose interval still straddles the budget."""
    if not samples_s:
        return []
    decisions = (decide_latency(k, b, samples_s, confidence, metric) for k, b in budgets_ms.items())
    return [d for d in decisions if d.status == Status.INCONCLUSIVE]


def _point_estimate_note(d: LatencyDecision, max_requests: int | None, over: bool) -> str:
    if d.metric == ITL:  # its samples are gaps, not requests: the cap counts requests
        when = f"over {d.samples} inter-token gaps"
    elif max_requests is None:
        when = f"after {d.samples} requests (no resampling: statistics.max_requests is not set)"
    elif d.samples >= max_requests:
        when = f"at the cap of {max_requests} requests"
    else:
        when = f"after {d.samples} of up to {max_requests} requests"
    note = (f"the {fmt.confidence(d.confidence)} interval {fmt.interval(d.interval_ms)} ms still straddles the budget "
            f"{when}; judged on the point estimate: {fmt.ms_unit(d.estimate_ms)} {'>' if over else '<='} "
            f"{fmt.ms_unit(d.budget_ms)}")
    if math.isinf(d.interval_ms[1]) and not over and d.metric != ITL:
        note += (f" (an upper bound for {d.key} needs >= {min_samples_for_upper_bound(d.key, d.confidence)} samples, "
                 "so no smaller run can prove it holds)")
    return note


def judge_latency(key: str, budget_ms: float, samples_s: Sequence[float], rounds: int, *,
                  confidence: float = Statistics.confidence, max_requests: int | None = None,
                  metric: str = TTFT) -> LatencyCheck:
    """The final check of one percentile, after the run stage measured up to the cap."""
    d = decide_latency(key, budget_ms, samples_s, confidence, metric)
    status, note = d.status, None
    if d.status == Status.INCONCLUSIVE:
        over = d.estimate_ms > budget_ms
        status = Status.FAIL if over else Status.INCONCLUSIVE
        note = _point_estimate_note(d, max_requests, over)
    return LatencyCheck(percentile=key, budget_ms=budget_ms, measured_ms=d.estimate_ms, interval_ms=d.interval_ms,
                        samples=d.samples, rounds=rounds, confidence=confidence, status=status, note=note, metric=metric)
