"""Lasting TTFT shifts in main's history: change points from ``ruptures``, kept only when they last.

The library (``ruptures``' PELT, the exact penalised segmentation) lives behind ``change_points``
alone, so another one can take its place. What guard asks of a change point on top of it:

1. **Segmentation.** The series is ``log(p50)`` (a shift is relative, and a slowdown of x % is the
   same step at 4 s and at 16 s), divided by its short-term noise: the robust SD of successive
   differences (MAD / 0.6745 / sqrt 2), which a level shift barely moves. PELT with the ``l2``
   cost then finds the segmentation that minimises the squared deviations from each segment's
   mean plus ``penalty_per_log_n x ln(n)`` per change (a BIC-like penalty in units of that noise),
   every segment at least ``min_segment`` runs long: **a single outlier cannot make a segment**.
2. **Big enough.** A change whose segment medians differ by less than ``min_shift_pct`` is dropped
   (the smallest first, the segments merged, until every change is big enough): medians, so an
   outlier inside a segment does not carry it.
3. **Lasting.** The median of *everything after* the change (to the newest run) must still differ
   from the segment before by ``min_shift_pct`` in the same direction: a slow hour that came back
   is not flagged, and a flag disappears once the shift is undone.
4. **A slowdown.** Only increases of TTFT are flagged; a lasting speed-up is not a regression.

The defaults are measured on the recorded histories of identical runs (``benchmarks/
history_changepoints.py``; docs/history.md quotes the numbers): they flag nothing on any of them,
whose runs drift by 5-9 % for hours on one machine, and catch a +10 % step within 2 commits in
about half of the positions (95 % on runs with normal 4 % noise and no drift). A smaller
``min_shift_pct`` flags those drifts; a flag is a reason to look (the census column, the machine
column, an A/B run of the two commits), never a verdict.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

NOISE_FLOOR = 0.005  # 0.5 %: the least short-term noise assumed (a series of equal values has none)


@dataclass(frozen=True)
class Method:
    min_segment: int = 5  # runs on each side of a change, at least
    min_shift_pct: float = 6.0  # segment medians, and the level after the change, differ by this much
    penalty_per_log_n: float = 2.0  # PELT penalty per change: this x ln(n) in noise units (Schwarz: 2 ln n)
    slowdowns_only: bool = True


DEFAULT = Method()


@dataclass(frozen=True)
class Shift:
    """A lasting shift: the run at ``index`` is the first of the new level."""

    index: int
    before: float  # median of the segment before (the input's unit)
    after: float  # median of the segment after
    lasting: float  # median of everything from ``index`` to the end

    @property
    def shift_pct(self) -> float:
        return (self.after / self.before - 1) * 100

    @property
    def lasting_pct(self) -> float:
        return (self.lasting / self.before - 1) * 100


def noise(logs: Sequence[float]) -> float:
    """Short-term noise of a log series: the robust SD of its successive differences."""
    diffs = [b - a for a, b in zip(logs, logs[1:])]
    if len(diffs) < 2:
        return NOISE_FLOOR
    centre = statistics.median(diffs)
    mad = statistics.median(abs(d - centre) for d in diffs)
    return max(mad / 0.6745 / math.sqrt(2), NOISE_FLOOR)


def _segmentation(logs: Sequence[float], method: Method) -> list[int]:
    """Start indices of the segments after the first, from ruptures' PELT."""
    import numpy as np
    import ruptures

    scale = noise(logs)
    signal = (np.asarray(logs, dtype=float) / scale).reshape(-1, 1)
    algo = ruptures.Pelt(model="l2", min_size=method.min_segment, jump=1).fit(signal)
    return [int(b) for b in algo.predict(pen=method.penalty_per_log_n * math.log(len(logs)))[:-1]]


def _pct(new: float, old: float) -> float:
    return math.expm1(new - old) * 100


def change_points(values: Sequence[float], method: Method = DEFAULT) -> list[Shift]:
    """Lasting shifts of a positive series (TTFT p50 per commit, oldest first)."""
    if any(not (v > 0 and math.isfinite(v)) for v in values):
        raise ValueError("change points need positive, finite values")
    n = len(values)
    if n < 2 * method.min_segment:
        return []
    logs = [math.log(v) for v in values]
    starts = _segmentation(logs, method)

    def medians(bounds: list[int]) -> list[float]:
        edges = [0, *bounds, n]
        return [statistics.median(logs[a:b]) for a, b in zip(edges, edges[1:])]

    while starts:  # drop the smallest change below the threshold, merge, look again
        meds = medians(starts)
        shifts = [abs(_pct(meds[i + 1], meds[i])) for i in range(len(starts))]
        weakest = min(range(len(starts)), key=shifts.__getitem__)
        if shifts[weakest] >= method.min_shift_pct:
            break
        starts.pop(weakest)

    edges = [0, *starts, n]
    out = []
    for i, start in enumerate(starts):
        before = statistics.median(logs[edges[i]:start])
        after = statistics.median(logs[start:edges[i + 2]])
        lasting = statistics.median(logs[start:])
        step, kept = _pct(after, before), _pct(lasting, before)
        if abs(kept) < method.min_shift_pct or (kept > 0) != (step > 0):
            continue
        if method.slowdowns_only and step < 0:
            continue
        out.append(Shift(start, math.exp(before), math.exp(after), math.exp(lasting)))
    return out
