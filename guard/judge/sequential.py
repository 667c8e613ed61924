"""The stopping rule: when a run has measured enough, for either run shape, and how much more.

The run stage measures until the verdict's own rule has decided (guard.measure.stopping's loop,
over the ``StoppingRule`` interface it declares) and is given that rule rather than importing the
judge. This module builds it, one kind for both shapes, so what the run measures and what the
verdict then judges cannot disagree:
- ``single_run_rule``: one side's run (guard.measure.single_run), its timed requests' TTFT, TPOT
  and ITL against the profile's absolute budgets at ``statistics`` (``guard.judge.rules.undecided``;
  the verdict: ``judge_latency``);
- ``ab_run_rule``: two sides' run (guard.measure.ab_run), their paired ratios against the ratio
  budgets at A/B's levels and batches (``guard.judge.ab.undecided_ratios``; the verdict:
  ``judge_ratio``).

Both are a ``SequentialRule``: while a budgeted percentile's interval straddles its budget,
``statistics.batch`` more samples, up to ``statistics.max_requests``; at the cap (or with no cap)
the verdict settles on the point estimate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from guard.config.budgets import Profile, Statistics
from guard.judge.ab import undecided_ratios
from guard.judge.rules import undecided
from guard.model.records import RequestOutcome, latency_samples


def next_batch(statistics: Statistics, measured: int, any_undecided: bool) -> int:
    """Samples the next resampling round measures (a batch, cut at the cap); 0: stop."""
    if not any_undecided or statistics.max_requests is None:
        return 0
    return max(0, min(statistics.batch, statistics.max_requests - measured))


@dataclass(frozen=True)
class SequentialRule:
    """The sequential rule as the run stage takes it (guard.measure.stopping.StoppingRule): while
    ``undecided_in(samples)`` names a budget, ``statistics.batch`` more samples, up to
    ``statistics.max_requests``."""

    statistics: Statistics
    undecided_in: Callable[[Sequence[float]], list]  # the budgets the samples leave undecided

    @property
    def cap(self) -> int | None:
        return self.statistics.max_requests

    def undecided(self, samples: Sequence[float]) -> list:
        return self.undecided_in(samples)

    def next_batch(self, measured: int, any_undecided: bool) -> int:
        return next_batch(self.statistics, measured, any_undecided)

    def describe(self, pending: Sequence) -> str:
        return "; ".join(d.describe() for d in pending)


def ttft_rule(budgets_ms: Mapping[str, float], statistics: Statistics) -> SequentialRule:
    """Absolute TTFT budgets (ms) over one side's TTFT samples (seconds), at ``statistics``' level."""
    return SequentialRule(statistics, lambda samples: undecided(budgets_ms, samples, statistics.confidence))


def ratio_rule(budgets_pct: Mapping[str, float], statistics: Statistics) -> SequentialRule:
    """Ratio budgets (percent) over paired ratios, at ``statistics``' levels (``Profile.ab_statistics``)."""
    return SequentialRule(statistics, lambda ratios: undecided_ratios(budgets_pct, ratios, statistics))


def latency_rule(budgets_ms: Mapping[str, Mapping[str, float]], statistics: Statistics) -> SequentialRule:
    """Absolute latency budgets (metric -> percentile -> ms) over one side's timed requests
    (``RequestOutcome``): each metric's samples of them (``latency_samples``), at ``statistics``' level."""
    def undecided_in(outcomes: Sequence[RequestOutcome]) -> list:
        return [d for metric, budgets in budgets_ms.items()
                for d in undecided(budgets, latency_samples(outcomes, metric), statistics.confidence, metric)]
    return SequentialRule(statistics, undecided_in)


def single_run_rule(profile: Profile) -> SequentialRule:
    """One side's run (``GuardRun``): the profile's TTFT, TPOT and ITL budgets at its
    ``statistics``, over its timed requests; what ``judge_latency`` then judges."""
    return latency_rule(profile.latency_budgets, profile.statistics)


def ab_run_rule(profile: Profile) -> SequentialRule:
    """Two sides' run (``ABRun``): the paired ratio against the profile's ratio budgets, at A/B's
    levels and batches (``Profile.ab_statistics``); what ``judge_ratio`` then judges."""
    return ratio_rule(profile.ttft_vs_baseline_pct, profile.ab_statistics)
