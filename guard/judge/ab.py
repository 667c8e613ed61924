"""A/B mode's pure core: the alternation schedule, paired samples, the ratio verdict, the op diff.

No I/O and no engine: evaluation judges the pairs (``guard.model.checks.pairs``) with
``decide_ratio``; ``guard.measure.ab_run`` measures until ``undecided_ratios`` is empty (by
guard.judge.sequential.ab_run_rule, which the run's caller passes in).

Schedule (``guard.measure.run.block_order``, the run stage's own)
    Requests go in blocks of ``workload.concurrency`` requests; the same block (the same job
    indices, so the same images) runs on both sides back to back, and the order alternates
    A B, B A, A B, B A, ... (ABBA). Drift (thermal, a neighbour starting up, caches) then falls
    on both sides of every pair, and on average on each side first equally often.

Statistic: the percentile of the paired ratio
    For measured request i, r_i = candidate TTFT_i / baseline TTFT_i, both measured seconds apart
    on the same image. ``ttft_vs_baseline_pct: {p50: 5}`` budgets the p50 of r, minus 1, in
    percent: "the typical request is at most 5 % slower than its baseline twin".

    p50: the centre of log r_i, with Wilcoxon's signed-rank interval (guard.judge.stats.centre_estimate;
    estimate: Hodges-Lehmann). That interval is exact when the log r_i are symmetric about their
    centre, and here symmetry is not an assumption about TTFT but a consequence of the design:
    with identical sides the two members of a pair are exchangeable (same code, same image, each
    side first in half the blocks), so log r_i is symmetric about 0; a candidate that is slower
    by a factor 1 + d shifts that distribution to log(1 + d). Those are the two cases the check
    must tell apart, and it tells them apart with fewer pairs: at the 6-24 pairs of a CPU run the
    sign-test interval (below) needs about 1.6x the pairs for the same width (asymptotic
    efficiency 0.64 against 0.955, normal noise); simulated on the recorded pairs:
    ``benchmarks/ab_sensitivity.py``. Its centre is the median of r whenever log r_i is symmetric.

    Other percentiles (p90 of r...): guard.judge.stats' distribution-free order-statistic interval on
    the r_i, the same interval as absolute TTFT budgets (no symmetry to lean on in a tail).

    Why not a bootstrap of p50(cand) / p50(base):
    - pairing is where A/B's power comes from: slow phases of the machine hit both members of a
      pair, so r_i varies much less than either side's TTFT; an interval on the r_i uses that
      directly;
    - both intervals are exact at any n whenever the pairs are independent (a bootstrap
      percentile interval under-covers at the 6-24 pairs a CPU run has, and cannot reach past
      the most extreme pair);
    - both have the same "a side may not exist yet" rule as absolute TTFT budgets (below 6 pairs
      at 95 % neither exists), so the same decide / resample / cap logic applies unchanged.
    Coverage and power are measured, not assumed: ``benchmarks/ab_sensitivity.py`` simulates runs
    from recorded pairs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from guard.config.budgets import Statistics, percentile_value
from guard.model import format as fmt
from guard.model.records import TOTAL_OPS, TTFT, ScopeCounts, Status, to_ms
from guard.model.checks import OpDelta, Pair, RatioCheck
from guard.judge.rules import interval_status
from guard.judge.stats import centre_estimate, percentile, percentile_interval



def to_pct(ratio: float) -> float:
    return ratio * 100.0 - 100.0 if math.isfinite(ratio) else ratio


@dataclass(frozen=True)
class RatioDecision:
    """One budgeted percentile of the paired ratio, judged by its interval alone."""

    key: str  # "p50"
    budget_pct: float  # allowed slowdown, percent
    estimate_pct: float  # percentile of (r_i - 1), percent
    interval_pct: tuple[float, float]  # -inf / inf where that side does not exist at this n
    pairs: int
    confidence: float
    status: Status  # PASS | FAIL | INCONCLUSIVE (the interval straddles the budget)
    fail_confidence: float | None = None  # the lower end's level, where stricter than ``confidence``

    def describe(self) -> str:
        return (f"{self.key} interval [{self.interval_pct[0]:+.1f}, {self.interval_pct[1]:+.1f}] % "
                f"vs budget +{self.budget_pct:g} %")


def ratio_estimate(key: str, ratios: Sequence[float], confidence: float,
                   lower_confidence: float | None = None) -> tuple[float, tuple[float, float]]:
    """The budgeted percentile of the paired ratios and its interval, as ratios (see the module
    docstring: p50 by the signed-rank interval on log r, other percentiles by order statistics).
    ``lower_confidence``: the interval's lower end at that level instead."""
    p = percentile_value(key)
    if p == 50:
        centre, (lo, hi) = centre_estimate([math.log(r) for r in ratios], confidence, lower_confidence)
        return math.exp(centre), (math.exp(lo) if lo > -math.inf else -math.inf, math.exp(hi))
    lo, hi = percentile_interval(ratios, p, confidence)
    if lower_confidence is not None:
        lo, _ = percentile_interval(ratios, p, lower_confidence)
    return percentile(ratios, p), (lo, hi)


def decide_ratio(key: str, budget_pct: float, ratios: Sequence[float], confidence: float,
                 fail_confidence: float | None = None) -> RatioDecision:
    """FAIL when the whole interval is above the budget, PASS when at or below it, else INCONCLUSIVE.
    With ``fail_confidence`` the interval's lower end comes from that stricter level: a look fails
    only on stronger evidence than it passes on (the upper end stays at ``confidence``)."""
    if not ratios:
        raise ValueError("a ratio verdict needs at least one pair")
    strict = fail_confidence if fail_confidence is not None and fail_confidence > confidence else None
    estimate, (lo, hi) = ratio_estimate(key, ratios, confidence, strict)
    interval = (to_pct(lo) if lo > -math.inf else -math.inf, to_pct(hi))
    status = interval_status(interval, budget_pct)
    return RatioDecision(key=key, budget_pct=budget_pct, estimate_pct=to_pct(estimate), interval_pct=interval,
                         pairs=len(ratios), confidence=confidence, status=status, fail_confidence=strict)


def pair_spread_pct(ratios: Sequence[float]) -> float | None:
    """The SD of the pairs' log ratio, in percent: the noise the A/B verdict is decided under
    (None below 2 pairs). On this project's 2-core VM: 3-5 % in quiet hours, 7-14 % in noisy ones."""
    if len(ratios) < 2:
        return None
    return statistics.stdev(math.log(r) for r in ratios) * 100.0


def pairs_to_settle(estimate_pct: float, budget_pct: float, spread_pct: float, confidence: float,
                    fail_confidence: float | None) -> int | None:
    """About how many pairs would move the interval's nearer end past the budget, if the centre
    stayed where it is: the Hodges-Lehmann centre's interval is about z * sqrt(pi / 3) * spread /
    sqrt(n) wide each side under normal noise. The lower end (a failure) is at the failing level.
    None: the centre sits on the budget (no number of pairs settles it)."""
    distance = abs(math.log1p(estimate_pct / 100.0) - math.log1p(budget_pct / 100.0)) * 100.0
    if distance < 1e-9 or spread_pct <= 0:
        return None
    level = (fail_confidence or confidence) if estimate_pct > budget_pct else confidence
    z = statistics.NormalDist().inv_cdf((1.0 + level) / 2.0)
    return math.ceil((z * math.sqrt(math.pi / 3.0) * spread_pct / distance) ** 2)


def undecided_ratios(budgets: dict[str, float], ratios: Sequence[float], stats: Statistics) -> list[RatioDecision]:
    """The budgeted percentiles whose interval (at A/B's levels: ``Profile.ab_statistics``) still
    straddles the budget."""
    if not ratios:
        return []
    decisions = (decide_ratio(k, b, ratios, stats.confidence, stats.fail_confidence) for k, b in budgets.items())
    return [d for d in decisions if d.status == Status.INCONCLUSIVE]


def op_diff(candidate: Sequence[ScopeCounts], baseline: Sequence[ScopeCounts]) -> list[OpDelta]:
    """What the candidate changed in the profiled code paths, per scope and image size: every op
    whose count differs, then the scope's total and entry count if they differ. A scope/size
    measured on one side only shows the other side as 0."""
    def index(counts):
        return {(c.scope, tuple(c.image_size)): c for c in counts}

    c_idx, b_idx = index(candidate), index(baseline)
    out: list[OpDelta] = []
    for key in sorted(c_idx.keys() | b_idx.keys(), key=lambda k: (k[0], k[1])):
        c, b = c_idx.get(key), b_idx.get(key)
        c_counts, b_counts = (c.calls_by_op if c else {}), (b.calls_by_op if b else {})
        ops = sorted(c_counts.keys() | b_counts.keys(),
                     key=lambda op: (-abs(c_counts.get(op, 0) - b_counts.get(op, 0)), op))
        for op in ops:
            if c_counts.get(op, 0) != b_counts.get(op, 0):
                out.append(OpDelta(key[0], key[1], op, b_counts.get(op, 0), c_counts.get(op, 0)))
        for label, cv, bv in ((TOTAL_OPS, c.total_calls if c else 0, b.total_calls if b else 0),
                              ("entries", c.entries if c else 0, b.entries if b else 0)):
            if cv != bv:
                out.append(OpDelta(key[0], key[1], label, bv, cv))
    return out


def judge_ratio(key: str, budget_pct: float, paired: Sequence[Pair], rounds: int, stats: Statistics,
                metric: str = TTFT) -> RatioCheck:
    """The final check of one ratio budget, after the run stage measured up to the cap
    (``stats``: ``Profile.ab_statistics``): the interval's decision, or else the point estimate
    (FAIL above the budget, INCONCLUSIVE at or below it) with a note saying so and how many pairs
    this machine's spread would have needed. The same rule as guard.judge.rules.judge_latency: calling such
    a run undecided instead (exit 3) would leave most real +5 % slowdowns uncaught on a noisy
    machine (``benchmarks/ab_sensitivity.py --cap-rules``, docs/ab.md)."""
    ratios = [p.ratio for p in paired]
    d = decide_ratio(key, budget_pct, ratios, stats.confidence, stats.fail_confidence)
    spread = pair_spread_pct(ratios)
    status, note = d.status, None
    if d.status == Status.INCONCLUSIVE:
        over = d.estimate_pct > budget_pct
        status = Status.FAIL if over else Status.INCONCLUSIVE
        cap = stats.max_requests
        when = (f"after {d.pairs} pairs (no resampling: statistics.max_requests is not set)" if cap is None
                else f"at the cap of {cap} pairs" if d.pairs >= cap
                else f"after {d.pairs} of up to {cap} pairs")
        note = (f"the {fmt.levels(d.confidence, d.fail_confidence)} interval {fmt.pct_interval(d.interval_pct)} still straddles the "
                f"budget {when}; judged on the point estimate: {fmt.pct(d.estimate_pct)} {'>' if over else '<='} "
                f"{fmt.pct(budget_pct)}")
        needed = (pairs_to_settle(d.estimate_pct, budget_pct, spread, d.confidence, d.fail_confidence)
                  if spread and percentile_value(key) == 50 else None)  # the approximation is the p50 interval's
        if needed is not None and needed > d.pairs:
            note += (f" (at this machine's per-pair spread of {spread:.1f} % about {needed} pairs would settle it: "
                     "a quieter machine decides sooner)")
    p = percentile_value(key)
    return RatioCheck(percentile=key, budget_pct=budget_pct, measured_pct=d.estimate_pct, interval_pct=d.interval_pct,
                          pairs=d.pairs, rounds=rounds, confidence=d.confidence, status=status,
                          fail_confidence=d.fail_confidence, candidate_ms=to_ms(percentile([x.candidate_s for x in paired], p)),
                          baseline_ms=to_ms(percentile([x.baseline_s for x in paired], p)), note=note,
                          pair_spread_pct=spread, metric=metric)
