"""Results -> Markdown: report.md, and the body of the pull-request comment."""

from __future__ import annotations

from guard.results import Results, Status


def render_markdown(results: Results, *, run_url: str | None = None) -> str:
    icon = {"pass": "✅", "regression": "❌", "invalid": "⚠️"}[results.verdict]
    lines = [f"## {icon} guard: {results.verdict} — {results.run.model} on `{results.run.profile}`", ""]
    for reason in results.invalid_reasons:
        lines.append(f"- invalid run: {reason}")
    ttft = [c for c in results.checks if c.kind == "ttft"]
    if ttft:
        lines += ["", "| metric | budget | measured | delta | status |", "|---|---:|---:|---:|---|"]
        for c in ttft:
            delta = "" if c.delta_pct is None else f"{c.delta_pct:+.1f} %"
            lines.append(f"| {c.name} | {c.budget:.0f} ms | {c.measured:.0f} ms | {delta} | {c.status} |")
    ops = [c for c in results.checks if c.kind == "ops"]
    if ops:
        lines += ["", "| scope / op | budget | measured | status |", "|---|---:|---:|---|"]
        for c in ops:
            mark = "==" if c.rule == "exact" else "<="
            lines.append(f"| {c.name} | {mark} {c.budget:.0f} | {c.measured:.0f} | {c.status} |")
    if run_url:
        lines += ["", f"[run]({run_url})"]
    return "\n".join(lines) + "\n"


__all__ = ["render_markdown", "Status"]
