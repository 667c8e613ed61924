"""Results -> Markdown: report.md, the job summary, and the body of the pull-request comment.

Everything that comes from the run (error messages, op names, code sites, environment values) passes
through ``text()`` or ``code()`` first: the PR that produced the run also controls those strings, so
they must not be able to close a table, a ``<details>`` block or a code fence, add HTML, or mention
people. Numbers are formatted by us and need no escaping.
"""

from __future__ import annotations

import json
import re
from typing import Any

from guard.evaluate import fmt_interval
from guard.results import CheckResult, Results, ScopeCounts, Status

MAX_CHART_POINTS = 100  # xychart-beta gets unreadable (and the comment long) past this
MAX_SITES = 10  # offending code sites listed per failed op check

_ICON = {"pass": "✅", "regression": "❌", "invalid": "⚠️"}
_STATUS = {Status.PASS: "✅ pass", Status.FAIL: "❌ fail", Status.INCONCLUSIVE: "⚠️ inconclusive",
           Status.NOT_JUDGED: "➖ not judged"}
_SAFE_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SAFE_URL = re.compile(r"https?://[^\s()<>\[\]`\"'\\]+")
_BACKSLASHED = set("\\*_[]|~")  # Markdown punctuation that can start emphasis, links, cells
_LINE_START = re.compile(r"([-+#]|\d{1,9}[.)])(?=\s|$)")  # would open a list or a heading


# ----------------------------------------------------------------------------- escaping
def text(value: Any) -> str:
    """Run data as inert Markdown text, safe in a table cell, a list item or a paragraph."""
    s = " ".join(str(value).split())  # newlines (and runs of blanks) would end a cell or a list item
    out = []
    for ch in s:
        if ch in _BACKSLASHED:
            out.append("\\" + ch)
        elif ch == "&":
            out.append("&amp;")
        elif ch == "<":
            out.append("&lt;")
        elif ch == ">":
            out.append("&gt;")
        elif ch == "`":
            out.append("&#96;")
        else:
            out.append(ch)
    s = "".join(out)
    # "@user" in a bot comment would notify that user; a zero-width space keeps it readable but inert
    s = re.sub(r"@(?=\w)", "@\u200b", s)
    m = _LINE_START.match(s)
    if m:  # "- x", "# x", "1. x" at the start of a list item would nest a list or a heading
        s = s[: m.end() - 1] + "\\" + s[m.end() - 1:]
    return s


def code(value: Any, *, in_table: bool = False) -> str:
    """Run data as an inline code span; falls back to ``text()`` when a span could not hold it."""
    s = " ".join(str(value).split())
    if not s or "`" in s or (in_table and "\\" in s):
        return text(s) if s else ""
    if in_table:
        s = s.replace("|", "\\|")  # GFM splits cells before it parses code spans
    return f"`{s}`"


def _token(value: Any, placeholder: str) -> str:
    """A value that goes inside a shell code block: used only if it is a plain identifier."""
    s = str(value)
    return s if _SAFE_TOKEN.fullmatch(s) else placeholder


# ----------------------------------------------------------------------------- pieces
def _delta(c: CheckResult) -> str:
    return "—" if c.delta_pct is None else f"{c.delta_pct:+.1f} %"


def _size(size: tuple[int, int] | None) -> str:
    return "—" if not size else f"{int(size[0])}×{int(size[1])}"


def _op_label(c: CheckResult) -> str:
    """``mask_path[640x480].aten::add`` -> ``aten::add``: the scope and size have their own columns."""
    if c.scope is not None and c.image_size:
        prefix = f"{c.scope}[{int(c.image_size[0])}x{int(c.image_size[1])}]."
        if c.name.startswith(prefix):
            return c.name[len(prefix):]
    return c.name


def _rule(c: CheckResult) -> str:
    return f"= {c.budget:.0f}" if c.rule == "exact" else f"≤ {c.budget:.0f}"


def _confidence(results: Results) -> str:
    conf = (results.profile_config.get("statistics") or {}).get("confidence")
    return f"{float(conf) * 100:.0f} % CI" if isinstance(conf, (int, float)) else "CI"


def _summary(results: Results) -> list[str]:
    n = len(results.checks)
    if results.verdict == "invalid":
        lines = ["**The run cannot be trusted, so no budget was judged.** Why:", ""]
        lines += [f"- {text(r)}" for r in results.invalid_reasons] or ["- (no reason recorded)"]
        return lines
    failed = results.failed
    not_judged = [c for c in results.checks if c.status == Status.NOT_JUDGED]
    n -= len(not_judged)
    if not failed:
        inconclusive = [c for c in results.checks if c.status == Status.INCONCLUSIVE]
        line = f"**All {n} budgets held.**"
        if not_judged:
            line += f" TTFT was measured but not judged on this machine ({len(not_judged)} budget(s)): see the notes."
        if inconclusive:
            line += (f" {len(inconclusive)} inconclusive: the confidence interval straddles the budget, "
                     "so it was judged on the point estimate.")
        return [line]
    lines = [f"**{len(failed)} of {n} budgets exceeded:**", ""]
    for c in failed:
        unit = " ms" if c.unit == "ms" else " calls"
        delta = "" if c.delta_pct is None else f" ({c.delta_pct:+.1f} %)"
        lines.append(f"- {code(c.name)}: measured {c.measured:.0f}{unit}, budget {_rule(c)}{unit}{delta}")
    return lines


def _ttft_table(results: Results, ttft: list[CheckResult]) -> list[str]:
    # (header, alignment, cell): the interval / samples / rounds columns appear only when recorded
    cols = [
        ("metric", "---", lambda c: code(c.name, in_table=True)),
        ("budget", "---:", lambda c: f"{c.budget:.0f} ms"),
        ("measured", "---:", lambda c: f"{c.measured:.0f} ms"),
        ("delta", "---:", _delta),
    ]
    if any(c.interval for c in ttft):
        cols.append((_confidence(results), "---:",
                     lambda c: fmt_interval(c.interval) if c.interval else "—"))
    if any(c.samples is not None for c in ttft):
        cols.append(("samples", "---:", lambda c: "—" if c.samples is None else str(int(c.samples))))
    if any(c.rounds is not None for c in ttft):
        cols.append(("rounds", "---:", lambda c: "—" if c.rounds is None else str(int(c.rounds))))
    cols.append(("status", "---", lambda c: _STATUS.get(c.status, text(c.status))))
    lines = ["| " + " | ".join(h for h, _, _ in cols) + " |", "|" + "|".join(a for _, a, _ in cols) + "|"]
    lines += ["| " + " | ".join(cell(c) for _, _, cell in cols) + " |" for c in ttft]
    notes = [f"- {code(c.name)}: {text(c.note)}" for c in ttft if c.note]
    return lines + ([""] + notes if notes else [])


def _chart(results: Results, ttft: list[CheckResult]) -> list[str]:
    """Sorted per-request TTFT as bars, each budget as a flat line: the bar p % of the way along
    must stay under the p-th percentile's line. Mermaid gets numbers only, never run strings."""
    samples = sorted(s * 1000.0 for s in results.run.ttft_client_s())
    if not samples:
        return []
    n = len(samples)
    if n > MAX_CHART_POINTS:  # keep the shape: evenly spaced order statistics
        samples = [samples[round(i * (n - 1) / (MAX_CHART_POINTS - 1))] for i in range(MAX_CHART_POINTS)]
    budgets = [(c.name.rsplit(".", 1)[-1], c.budget) for c in ttft]
    # zoom the y-axis onto the data: from 0, a 4 % regression is a difference nobody can see
    values = [*samples, *(b for _, b in budgets)]
    lo, hi = min(values) * 0.9, max(values) * 1.05
    series = ", ".join(f"{v:.0f}" for v in samples)
    lines = [
        "```mermaid",
        "xychart-beta",
        '    title "TTFT per request, fastest to slowest (ms)"',
        f'    x-axis "request" 1 --> {len(samples)}',
        f'    y-axis "TTFT (ms)" {lo:.0f} --> {hi:.0f}',
        f"    bar [{series}]",
    ]
    lines += [f"    line [{', '.join(f'{b:.0f}' for _ in samples)}]" for _, b in budgets]
    lines.append("```")
    shown = f"{len(samples)} of {n} (evenly spaced)" if n > len(samples) else str(n)
    legend = ", ".join(f"{text(k)} = {b:.0f} ms" for k, b in budgets)
    caption = f"Bars: {shown} measured requests, sorted. Lines: the budgets ({legend})." if budgets \
        else f"Bars: {shown} measured requests, sorted."
    lines.append(f"{caption} The y-axis starts at {lo:.0f} ms.")
    return lines


def _ops_table(ops: list[CheckResult]) -> list[str]:
    lines = ["| scope | image size | op | budget | measured | status |", "|---|---|---|---:|---:|---|"]
    for c in ops:
        scope = code(c.scope, in_table=True) if c.scope else "—"
        lines.append(f"| {scope} | {_size(c.image_size)} | {code(_op_label(c), in_table=True)} | {_rule(c)} "
                     f"| {c.measured:.0f} | {_STATUS.get(c.status, text(c.status))} |")
    return lines


def _sites(results: Results, failed_ops: list[CheckResult]) -> list[str]:
    """Where the offending calls came from, per failed op check (most calls first)."""
    lines: list[str] = []
    for c in failed_ops:
        counts: ScopeCounts | None = next(
            (s for s in results.run.op_counts
             if s.scope == c.scope and c.image_size and tuple(s.image_size) == tuple(c.image_size)), None)
        op = _op_label(c)
        sites = [] if counts is None else [s for s in counts.sites if op == "total_ops" or s.op == op]
        sites = sorted(sites, key=lambda s: -s.count)
        inside = f" in {code(counts.where)}" if counts is not None and counts.where else ""
        lines += ["", f"**{code(c.name)}** — {c.measured:.0f} calls{inside}, budget {_rule(c)}:", ""]
        if not sites:
            lines.append("_No call sites were recorded for this op._")
            continue
        lines += ["| calls | op | function | location |", "|---:|---|---|---|"]
        for s in sites[:MAX_SITES]:
            lines.append(f"| {int(s.count)} | {code(s.op, in_table=True)} | {code(s.function, in_table=True)} "
                         f"| {code(s.location, in_table=True)} |")
        if len(sites) > MAX_SITES:
            lines.append(f"\n_…and {len(sites) - MAX_SITES} more sites (see results.json)._")
    return lines


def _environment(env: dict[str, Any]) -> list[str]:
    if not env:
        return []
    lines = ["<details><summary>Environment</summary>", "", "| key | value |", "|---|---|"]
    for key in sorted(env, key=str):
        value = env[key]
        shown = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        lines.append(f"| {code(key, in_table=True)} | {code(shown, in_table=True)} |")
    return lines + ["", "</details>"]


def _folded(summary: str, body: list[str]) -> list[str]:
    return [f"<details><summary>{summary}</summary>", "", *body, "", "</details>"]


# ----------------------------------------------------------------------------- the report
def render_markdown(results: Results, *, run_url: str | None = None) -> str:
    run = results.run
    icon = _ICON.get(results.verdict, "❔")
    lines = [f"## {icon} guard: {text(results.verdict)} — {text(run.model)} on {code(run.profile)}", ""]
    lines += _summary(results)

    ttft = [c for c in results.checks if c.kind == "ttft"]
    if ttft:
        lines += ["", "### Time to first token", ""] + _ttft_table(results, ttft)
        chart = _chart(results, ttft)
        if chart:
            lines += [""] + chart

    ops = [c for c in results.checks if c.kind == "ops"]
    if ops:
        lines += ["", "### Operator counts per request", ""] + _ops_table(ops)
        failed_ops = [c for c in ops if c.status == Status.FAIL]
        if failed_ops:
            lines += ["", "#### Where the offending calls came from"] + _sites(results, failed_ops)

    if results.verdict == "invalid" and results.checks:
        lines += ["", "_The tables above are for information only: an invalid run has no verdict._"]
    if results.notices:
        lines += ["", "### Notices", ""] + [f"- {text(n)}" for n in results.notices]

    profile = _token(run.profile, "PROFILE")
    lines += [""] + _folded("Reproduce locally", [
        "On a machine that matches the profile (the profile pins the hardware):", "",
        "```sh", f"guard check --profile {profile}", "```"])
    lines += [""] + _folded("Accept these numbers as the new budgets", [
        "If the change in performance is intended, re-baseline from this run's results "
        "(the `guard-results` artifact) and commit the diff:", "",
        "```sh", f"guard update-thresholds --from guard-results/results.json --profile {profile}", "```"])
    lines += [""] + _folded("What TTFT means here", [text(results.ttft_definition)])
    env = _environment(run.environment)
    if env:
        lines += [""] + env

    footer = [f"guard {text(results.guard_version)}" if results.guard_version else "guard"]
    if run_url:
        footer.append(f"[workflow run]({run_url})" if _SAFE_URL.fullmatch(run_url) else text(run_url))
    lines += ["", "<sub>" + " · ".join(footer) + "</sub>"]
    return "\n".join(lines) + "\n"


__all__ = ["render_markdown", "text", "code", "Status"]
