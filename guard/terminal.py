"""Results -> the tables and verdict line people read in their terminal."""

from __future__ import annotations

from guard import format as fmt
from guard.results import Results, Status, Verdict
from guard.stats import percentile

MAX_SITES = 6


def _row(cells: list[str], widths: list[int], left: int) -> str:
    """The first ``left`` columns (names) align left, the rest (numbers) right."""
    return "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()


def _table(header: list[str], rows: list[list[str]], left: int = 1) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [_row(header, widths, left), _row(["-" * w for w in widths], widths, left),
            *(_row(r, widths, left) for r in rows)]


def percentile_summary(results: Results) -> str | None:
    """p50/p90/p99 of every measured request, budgeted or not: the numbers people look for."""
    samples = results.run.ttft_client_s()
    if not samples:
        return None
    cells = " · ".join(f"p{p} {fmt.seconds_as_ms(percentile(samples, p))}" for p in (50, 90, 99))
    return f"TTFT over {len(samples)} requests in {results.run.rounds} round(s): {cells}"


def sites_lines(results: Results) -> list[str]:
    """Where the calls of each failing scope came from, most calls first."""
    lines: list[str] = []
    for counts in results.run.op_counts:
        failing = [c for c in results.op_checks
                   if c.status == Status.FAIL and c.scope == counts.scope and c.image_size == counts.image_size]
        if failing and counts.sites:
            where = f" ({counts.where})" if counts.where else ""
            lines.append(f"  calls in {counts.scope}{where} [{fmt.size(counts.image_size)}] came from:")
            lines += [f"    {s.calls:>6}  {s.op:<28} {s.function} ({s.location})" for s in counts.sites[:MAX_SITES]]
    return lines


def render_terminal(results: Results) -> str:
    lines: list[str] = []
    summary = percentile_summary(results)
    if summary:
        lines += [summary, ""]
    if results.ttft_checks:
        rows = [[fmt.label(c), fmt.ms_unit(c.budget_ms), fmt.ms_unit(c.measured_ms),
                 fmt.delta_pct(c.measured_ms, c.budget_ms) or "", fmt.interval(c.interval_ms), str(c.samples),
                 fmt.STATUS_WORD[c.status]] for c in results.ttft_checks]
        lines += _table(["TTFT", "budget", "measured", "delta", "interval (ms)", "n", "status"], rows)
        lines += [f"  {fmt.label(c)}: {c.note}" for c in results.ttft_checks if c.note]
        lines.append("")
    if results.op_checks:
        rows = [[c.scope, fmt.size(c.image_size), c.op, fmt.rule(c.rule, c.budget_calls), str(c.measured_calls),
                 fmt.STATUS_WORD[c.status]] for c in results.op_checks]
        lines += _table(["op count (per request)", "image", "op", "budget", "measured", "status"], rows, left=3)
        lines += sites_lines(results)
        lines.append("")
    lines += [f"invalid: {reason}" for reason in results.invalid_reasons]
    lines += [f"notice: {notice}" for notice in results.notices]
    lines.append(verdict_line(results))
    return "\n".join(lines)


def verdict_line(results: Results) -> str:
    where = f"{results.run.model} on profile '{results.run.profile}'"
    if results.verdict == Verdict.PASS:
        return f"PASS: {where}: all {len(results.judged)} budgets held"
    if results.verdict == Verdict.REGRESSION:
        return (f"REGRESSION: {where}: {len(results.failed)} budget(s) exceeded:\n"
                + "\n".join(f"  - {fmt.failure(c)}" for c in results.failed))
    return f"INVALID RUN: {where}: the measurement cannot be trusted ({len(results.invalid_reasons)} reason(s) above)"
