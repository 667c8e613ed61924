"""How guard writes a number, an interval, an image size, a rule and a failure, for every view.

The terminal, report.md (the PR comment), the commit status, the workflow annotations and the
progress lines all call these, so a check reads the same everywhere. Plain text: views that need
escaping (Markdown) escape what comes from the run, and only that.

``label`` and ``failure`` dispatch on the check's type (``functools.singledispatch``): a new kind
of check registers its own two functions here and every view shows it.
"""

from __future__ import annotations

import math
from functools import singledispatch

from guard.results import TOTAL_OPS, Check, ImageSize, OpCheck, Rule, Status, TtftCheck

STATUS_WORD = {Status.PASS: "ok", Status.FAIL: "FAIL", Status.INCONCLUSIVE: "~ok", Status.NOT_JUDGED: "not judged"}


def ms(value_ms: float) -> str:
    """A duration in milliseconds, to the millisecond; an unbounded side reads as the infinity it is."""
    if math.isinf(value_ms):
        return "∞" if value_ms > 0 else "-∞"
    return f"{value_ms:.0f}"


def ms_unit(value_ms: float) -> str:
    return f"{ms(value_ms)} ms"


def seconds_as_ms(value_s: float) -> str:
    return ms_unit(value_s * 1000.0)


def interval(bounds_ms: tuple[float, float]) -> str:
    """``[5938, 6572]``; an open side is written with a parenthesis and ∞."""
    lo, hi = bounds_ms
    return f"{'(' if math.isinf(lo) else '['}{ms(lo)}, {ms(hi)}{')' if math.isinf(hi) else ']'}"


def size(image_size: ImageSize) -> str:
    return f"{int(image_size[0])}x{int(image_size[1])}"


def confidence(level: float) -> str:
    return f"{level * 100:g} %"


def calls(n: int) -> str:
    return f"{n} call" if n == 1 else f"{n} calls"


def rule(r: Rule, budget: float, unit: str = "") -> str:
    """``<= 4`` / ``== 0`` (with a unit when given)."""
    op = "==" if r == Rule.EXACT else "<="
    return f"{op} {budget:.0f}{' ' + unit if unit else ''}"


def delta_pct(measured: float, budget: float) -> str | None:
    """Relative change, only where it means something: a budget of 0 has none."""
    if budget == 0:
        return None
    return f"{(measured - budget) / budget * 100:+.1f} %"


def op_excess(c: OpCheck) -> str:
    """Excess in calls, and a factor where the budget is not 0: a percentage of a tiny budget says nothing."""
    diff = c.excess_calls
    text = f"{diff:+d} call{'' if abs(diff) == 1 else 's'}"
    factor = c.measured_calls / c.budget_calls if c.budget_calls > 0 else 0.0
    if factor >= 2:
        text += f", {factor:.1f}x the budget" if factor < 10 else f", {factor:,.0f}x the budget"
    return text


def op_name(c: OpCheck) -> str:
    return "all ops (total_ops)" if c.op == TOTAL_OPS else c.op


@singledispatch
def label(check: Check) -> str:
    """A short name for a check, for tables and status lines (never parsed back)."""
    raise TypeError(f"no label for {type(check).__name__}")


@label.register
def _(c: TtftCheck) -> str:
    return f"ttft {c.percentile}"


@label.register
def _(c: OpCheck) -> str:
    return f"{c.scope} [{size(c.image_size)}] {c.op}"


@singledispatch
def failure(check: Check) -> str:
    """One sentence for a failed check: what, measured, budget, by how much."""
    raise TypeError(f"no failure sentence for {type(check).__name__}")


@failure.register
def _(c: TtftCheck) -> str:
    delta = delta_pct(c.measured_ms, c.budget_ms)
    return (f"TTFT {c.percentile} {ms_unit(c.measured_ms)} is over its budget {rule(Rule.MAX, c.budget_ms, 'ms')}"
            f" ({delta}; {confidence(c.confidence)} interval {interval(c.interval_ms)} ms, n={c.samples})")


@failure.register
def _(c: OpCheck) -> str:
    want = "exactly" if c.rule == Rule.EXACT else "at most"
    return (f"{op_name(c)} in {c.scope} [{size(c.image_size)}]: {calls(c.measured_calls)} per request, "
            f"budget {want} {c.budget_calls} ({op_excess(c)})")
