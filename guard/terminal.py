"""Results -> the table and verdict line people read in their terminal."""

from __future__ import annotations

from guard.evaluate import fmt_interval
from guard.results import CheckResult, Results, Status
from guard.stats import percentile

_MARK = {Status.PASS: "ok", Status.FAIL: "FAIL", Status.INCONCLUSIVE: "~ok", Status.NOT_JUDGED: "not judged"}


def _row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [_row(header, widths), _row(["-" * w for w in widths], widths), *(_row(r, widths) for r in rows)]


def _ttft_row(c: CheckResult) -> list[str]:
    delta = "" if c.delta_pct is None else f"{c.delta_pct:+.1f}%"
    ci = fmt_interval(c.interval) if c.interval else ""
    return [c.name, f"{c.budget:.0f} ms", f"{c.measured:.0f} ms", delta, ci, str(c.samples or ""), _MARK[c.status]]


def _op_row(c: CheckResult) -> list[str]:
    return [c.name, f"{'==' if c.rule == 'exact' else '<='} {c.budget:.0f}", f"{c.measured:.0f}", _MARK[c.status]]


def percentile_summary(results: Results) -> str | None:
    """p50/p90/p99 of every measured request, budgeted or not: the numbers people look for."""
    samples = results.run.ttft_client_s()
    if not samples:
        return None
    cells = " · ".join(f"p{p} {percentile(samples, p) * 1000:.0f} ms" for p in (50, 90, 99))
    return f"TTFT over {len(samples)} requests in {results.run.rounds} round(s): {cells}"


def render_terminal(results: Results) -> str:
    lines: list[str] = []
    summary = percentile_summary(results)
    if summary:
        lines += [summary, ""]
    ttft = [c for c in results.checks if c.kind == "ttft"]
    if ttft:
        lines += _table(["metric", "budget", "measured", "delta", "interval", "n", "status"], [_ttft_row(c) for c in ttft])
        lines.append("")
    ops = [c for c in results.checks if c.kind == "ops"]
    if ops:
        lines += _table(["op count (per request)", "budget", "measured", "status"], [_op_row(c) for c in ops])
        for counts in results.run.op_counts:
            failed = [c for c in ops if c.status == Status.FAIL and c.scope == counts.scope and c.image_size == counts.image_size]
            if failed and counts.sites:
                where = f" ({counts.where})" if counts.where else ""
                lines.append(f"  calls in {counts.scope}{where} [{counts.image_size[0]}x{counts.image_size[1]}] came from:")
                lines += [f"    {s.count:>6}  {s.op:<28} {s.function} ({s.location})" for s in counts.sites[:6]]
        lines.append("")
    for reason in results.invalid_reasons:
        lines.append(f"invalid: {reason}")
    for notice in results.notices:
        lines.append(f"notice: {notice}")
    lines.append(verdict_line(results))
    return "\n".join(lines)


def verdict_line(results: Results) -> str:
    where = f"{results.run.model} on profile '{results.run.profile}'"
    if results.verdict == "pass":
        judged = [c for c in results.checks if c.status != Status.NOT_JUDGED]
        line = f"PASS: {where}: all {len(judged)} budgets held"
        if len(judged) < len(results.checks):
            line += f" (TTFT measured, not judged on this machine: {len(results.checks) - len(judged)} budget(s))"
        return line
    if results.verdict == "regression":
        names = ", ".join(c.name for c in results.failed)
        return f"REGRESSION: {where}: {len(results.failed)} budget(s) exceeded: {names}"
    return f"INVALID RUN: {where}: the measurement cannot be trusted ({len(results.invalid_reasons)} reason(s) above)"
