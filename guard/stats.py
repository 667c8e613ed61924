"""Percentiles of TTFT samples. Pure functions; seconds in, seconds out."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(samples: Sequence[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default, Hyndman-Fan type 7).

    An empty sample is an error, never 0: a run that measured nothing must not pass a budget.
    """
    if not samples:
        raise ValueError("percentile of an empty sample")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} outside [0, 100]")
    xs = sorted(samples)
    pos = (len(xs) - 1) * p / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
