"""Results -> Markdown: report.md, the job summary, and the body of the pull-request comment.

Everything that comes from the run (error messages, op names, code sites, environment values) passes
through ``text()`` or ``code()`` first: the PR that produced the run also controls those strings, so
they must not be able to close a table, a ``<details>`` block or a code fence, add HTML, or mention
people. Numbers are formatted by us and need no escaping.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from guard.model import format as fmt
from guard.report.findings import Finding, added_calls, code_owner, findings, owner_text
from guard.report.latency import token_summary
from guard.model.environment import Environment
from guard.model.readings import ImageSize
from guard.model.records import TOTAL_OPS, TPOT_DEFINITION, TTFT, ReasonKind, Rule, ScopeCounts, Status, Verdict, to_ms
from guard.model.results import ENVIRONMENTS_DIFFER, HistoryStanding, Results
from guard.model.checks import CensusCheck, OpCheck, LatencyCheck
from guard.config import recipes
from guard.config.budgets import percentile_value
from guard.files import person_path, recorded_as_person_path
from guard.judge.stats import percentile

MAX_SITES = 10  # offending code sites listed per failed op check

_ICON = {"pass": "✅", "regression": "❌", "invalid": "⚠️", "not_measurable": "➖"}
_STATUS = {Status.PASS: "✅ pass", Status.FAIL: "❌ fail", Status.INCONCLUSIVE: "⚠️ inconclusive",
           Status.NOT_JUDGED: "➖ not judged", Status.NOT_MEASURED: "➖ not measured in this mode"}
_SAFE_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SAFE_PATH = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9._/-]*")  # a relative or absolute path, no spaces or quotes
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


def _path_token(value: Any, placeholder: str) -> str:
    """A file path that goes inside a shell code block: used only if plain (no spaces, quotes, $)."""
    s = str(value)
    return s if _SAFE_PATH.fullmatch(s.lstrip("/")) and "//" not in s else placeholder


# ----------------------------------------------------------------------------- pieces
def _size(size: ImageSize) -> str:
    return f"{int(size[0])}×{int(size[1])}"


def _where(c: CensusCheck) -> str:
    """A census check's request: its image size, or a mix's decode steps (``decode seeded, per step``)."""
    return c.where if c.mix else _size(c.image_size)


def _rule(rule: Rule, budget: float) -> str:
    return f"= {budget:.0f}" if rule == Rule.EXACT else f"≤ {budget:.0f}"


def _status(status: Status) -> str:
    return _STATUS.get(status, text(status))


def _summary(results: Results) -> list[str]:
    n = len(results.judged)
    if results.verdict == Verdict.INVALID:
        lines = ["**The run cannot be trusted, so no budget was judged.** Why:", ""]
        for r in results.invalid_reasons:
            head, _, rest = r.text.partition("\n")
            lines.append(f"- {text(head)}")
            if rest.strip():  # a server log's tail: kept line by line, inert, under its item
                lines += _indented_block(rest)
        return lines if results.invalid_reasons else lines + ["- (no reason recorded)"]
    failed = results.failed
    not_judged = [c for c in results.checks if c.status == Status.NOT_JUDGED]
    pr = results.pr
    if pr is not None and not failed and (pr.unmeasured_files or not pr.measured):
        what = (f"**Not measurable here:** the pull request changed {len(pr.unmeasured_files)} file(s) of compiled "
                "code or dependencies, which this engine stack cannot measure" if pr.unmeasured_files
                else "**Not measured:** the pull request changed nothing under `vllm/`")
        return [what + (f"; all {n} measured budgets held." if pr.measured else ".")]
    if not failed:
        inconclusive = [c for c in results.checks if c.status == Status.INCONCLUSIVE]
        line = f"**All {n} budgets held.**"
        if results.unmeasured_op_checks:
            line = (f"**All {n} measured budgets held; {len(results.unmeasured_op_checks)} op-count budget(s) "
                    "were not measured in this mode.**")
        if not_judged:
            line += f" {len(not_judged)} measured but not judged: see the notes."
        if inconclusive:
            line += (f" {len(inconclusive)} inconclusive: the confidence interval straddles the budget, "
                     "so it was judged on the point estimate.")
        notes = [f for f in findings(results) if f.kind == "census_notice"]
        if notes:
            line += f" {len(notes)} function(s) this pull request edited grew within the census rule:"
        return [line] + _findings(results, notes)
    found = findings(results)
    return [f"**{len(failed)} of {n} budgets exceeded, {len(found)} finding(s):**"] + _findings(results, found)


def _findings(results: Results, found: list[Finding]) -> list[str]:
    """Each finding once: a function with all its image sizes, census and op budgets together."""
    lines: list[str] = []
    for i, f in enumerate(found, 1):
        lines += [""] + _FINDING[f.kind](results, f, i)
    return lines


def _sizes(pairs: list[tuple[ImageSize, str]]) -> str:
    return ", ".join(f"{value} at {_size(size)}" for size, value in pairs)


def _op_budgets(ops: Sequence[OpCheck]) -> str:
    """``aten::x`` ≤ 0: 513 at 640×480, 1091 at 800×400; ... (one entry per op, sizes folded)."""
    by_op: dict[tuple[str, str], list[OpCheck]] = {}
    for c in ops:
        by_op.setdefault((c.op, _rule(c.rule, c.budget_calls)), []).append(c)
    return "; ".join(f"{code(op)} {rule}: " + _sizes([(c.image_size, str(c.measured_calls)) for c in cs])
                     for (op, rule), cs in by_op.items())


def _function_finding(results: Results, f: Finding, i: int) -> list[str]:
    lines = [f"**{i}. {code(f.name)}**", ""]
    if f.census:
        worst = max(f.census, key=lambda c: c.growth_calls)
        verb = "grew beyond the census rule" if f.kind == "function" else "grew within the census rule"
        lines.append(f"- {verb}, op calls{'' if any(c.mix for c in f.census) else ' per request'}: "
                     + ", ".join(f"{text(fmt.census_calls(c))} at {_where(c)}" for c in f.census)
                     + (f"; {text(worst.reason)}" if worst.reason else "")
                     + (f" ({added_calls(worst)} added at {_where(worst)})" if f.kind == "census_notice" else ""))
        lines.append(f"- ops that grew most at {_where(worst)}: {code(fmt.census_ops(worst))}")
        cost = fmt.gpu_cost(worst)
        if cost:  # beside the counts, never the verdict: an estimate of what they would cost on a GPU
            lines.append(f"- on a GPU, at {_where(worst)}: {text(cost)}")
        lines.append(f"- attributed to: {text(owner_text(f.name, results.run.model))}")
    differ = next((n for n in results.notices if n.startswith(ENVIRONMENTS_DIFFER)), None)
    if f.census and differ:  # said where the finding is read, so a dependency's change is not taken for a loop
        lines.append(f"- context: {text(differ.partition(' (')[0])}; this growth may be theirs")
    for scope in dict.fromkeys(c.scope for c in f.ops):
        lines.append(f"- op budgets exceeded in code path {code(scope)}: "
                     + _op_budgets([c for c in f.ops if c.scope == scope]))
    change = next((ch for ch in (results.pr.function_changes if results.pr else ()) if ch.function == f.name), None)
    if change is not None:
        body = "\n".join(fmt.added_snippet(change.lines))
        lines += ["", "Lines this pull request added inside it:"] + _indented_block(body)
    return lines


def _ops_finding(results: Results, f: Finding, i: int) -> list[str]:
    return [f"**{i}. code path {code(f.name)}**: {len(f.ops)} op budget(s) exceeded; where the calls came from:"] \
        + _sites(results, list(f.ops))


def _ttft_finding(results: Results, f: Finding, i: int) -> list[str]:
    what = f.metrics + (" vs the baseline" if f.kind == "ab" else "")
    return [f"**{i}. {what}**", ""] + [f"- {text(fmt.failure(c))}" for c in f.ttft]


_FINDING = {"function": _function_finding, "census_notice": _function_finding, "ops": _ops_finding,
            "ttft": _ttft_finding, "ab": _ttft_finding}


def _pull_request(results: Results) -> list[str]:
    """guard pr: what was compared, what could not be measured, and the added lines per function."""
    pr = results.pr
    if pr is None:
        return []
    lines = ["", "### Pull request", "",
             f"Base {code(pr.base.sha[:12])} {text(pr.base.subject)} → head {code(pr.head.sha[:12])} "
             f"{text(pr.head.subject)}: {len(pr.changed_files)} file(s) changed."]
    ran = [f"- {name}: {text(fmt.revision(side))}" for name, side in (("base", pr.base), ("head", pr.head))
           if side.version or side.environment]
    lines += ["", *ran] if ran else []
    if pr.unmeasured_files:
        lines += ["", "Not measurable on this engine stack (compiled code, dependencies): "
                  + ", ".join(code(f) for f in pr.unmeasured_files[:20])
                  + (f" and {len(pr.unmeasured_files) - 20} more" if len(pr.unmeasured_files) > 20 else "") + "."]
    shown = {f.name for f in findings(results)}
    for change in (ch for ch in pr.function_changes if ch.function not in shown):
        body = "\n".join(fmt.added_snippet(change.lines))
        lines += ["", f"Lines this pull request added inside {code(change.function)}:"] + _indented_block(body)
    return lines


def _indented_block(body: str) -> list[str]:
    """Verbatim lines as a fenced block inside a list item; the fence outgrows any backtick run."""
    fence = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", body)), default=0))
    return ["", f"  {fence}text", *(f"  {ln}" for ln in body.strip("\n").splitlines()), f"  {fence}", ""]


def _ttft_table(ttft: tuple[LatencyCheck, ...]) -> list[str]:
    conf = {c.confidence for c in ttft}
    ci = f"{fmt.confidence(conf.pop())} CI" if len(conf) == 1 else "CI"
    lines = [f"| percentile | budget | measured | delta | {ci} (ms) | samples | rounds | status |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for c in ttft:
        lines.append(f"| {code(c.percentile if c.metric == TTFT else c.label, in_table=True)} | {fmt.ms_unit(c.budget_ms)} | {fmt.ms_unit(c.measured_ms)} "
                     f"| {fmt.delta_pct(c.measured_ms, c.budget_ms) or '—'} | {fmt.interval(c.interval_ms)} "
                     f"| {c.samples} | {c.rounds} | {_status(c.status)} |")
    notes = [f"- {code(c.percentile)}: {text(c.note)}" for c in ttft if c.note]
    return lines + ([""] + notes if notes else [])


CHART_DECILES = (10, 20, 30, 40, 50, 60, 70, 80, 90)
# xychart-beta has no legend of its own: each series gets a colour that the caption names
_BAR = "#4C78A8"
_BUDGET_COLOURS = (("red", "#D62728"), ("purple", "#9467BD"), ("brown", "#8C564B"), ("pink", "#E377C2"))
_INTERVAL = ("orange", "#FF9F1C")


def _chart(results: Results, ttft: tuple[LatencyCheck, ...]) -> list[str]:
    """The TTFT distribution (bars: the measured requests at each decile and each budgeted
    percentile) against each budget (a flat line in its own colour) and the first budgeted
    percentile's confidence interval (two orange lines): how far from the budget, and how sure, at a
    glance. Mermaid gets numbers and fixed labels only, never run strings."""
    samples = results.run.ttft_client_s()
    if not samples or not ttft:
        return []
    points = sorted({*CHART_DECILES, *(percentile_value(c.percentile) for c in ttft)})
    bars = [to_ms(percentile(samples, p)) for p in points]
    shown = ttft[0]
    band = [x for x in shown.interval_ms if math.isfinite(x)]
    values = [*bars, *(c.budget_ms for c in ttft), *band]
    lo, hi = min(values), max(values)
    pad = max((hi - lo) * 0.15, hi * 0.01)
    y_lo, y_hi = max(0.0, lo - pad), hi + pad
    budget_colours = [_BUDGET_COLOURS[i % len(_BUDGET_COLOURS)] for i in range(len(ttft))]
    palette = [_BAR, *(hex_ for _, hex_ in budget_colours), *([_INTERVAL[1]] * len(band))]
    init = {"themeVariables": {"xyChart": {"plotColorPalette": ", ".join(palette)}}}
    flat = lambda v: f"    line [{', '.join(f'{v:.0f}' for _ in points)}]"  # noqa: E731
    lines = [
        "```mermaid",
        f"%%{{init: {json.dumps(init)}}}%%",
        "xychart-beta",
        f'    title "TTFT of {len(samples)} requests by percentile vs the budget (ms)"',
        f"    x-axis [{', '.join(f'p{p:g}' for p in points)}]",
        f'    y-axis "TTFT (ms)" {y_lo:.0f} --> {y_hi:.0f}',
        f"    bar [{', '.join(f'{v:.0f}' for v in bars)}]",
        *(flat(c.budget_ms) for c in ttft),
        *(flat(x) for x in band),
        "```",
    ]
    budgets = ", ".join(f"{text(c.percentile)} budget {fmt.ms_unit(c.budget_ms)} ({name})"
                        for c, (name, _) in zip(ttft, budget_colours))
    legend = [f"Blue bars: TTFT of the {len(samples)} measured requests at each percentile.",
              f"Line{'s' if len(ttft) > 1 else ''}: {budgets}."]
    if band:
        legend.append(f"Orange lines: the {fmt.confidence(shown.confidence)} interval of {text(shown.percentile)} "
                      f"{fmt.interval(shown.interval_ms)} ms" + (" (one side is unbounded at this sample count)"
                                                                  if len(band) == 1 else "") + ".")
    legend.append(f"The y-axis starts at {y_lo:.0f} ms.")
    return lines + [" ".join(legend)]


_BASELINE = "#9E9E9E"


def _ab_section(results: Results) -> list[str]:
    """A/B mode: both sides side by side, the ratio checks, both distributions, the op-count diff."""
    ab = results.ab
    if ab is None or not (ab.pairs or results.ab_checks):  # ops only: the census and op budgets say it
        return []
    lines = ["", "### A/B: candidate vs baseline, same machine, same images", "",
             f"{len(ab.pairs)} pairs; each block of requests ran on both sides back to back, alternating which side "
             "went first (ABBA), so drift and contention fall on both.", "",
             "| | candidate | baseline | candidate / baseline |", "|---|---|---|---:|"]
    envs = (results.run.environment, ab.baseline.environment)
    lines.append("| vLLM | " + " | ".join(code(f"{e.vllm or '?'} {(e.worker and e.worker.vllm_file) or ''}",
                                                   in_table=True) for e in envs) + " | |")
    cand, base = [p.candidate_s for p in ab.pairs], [p.baseline_s for p in ab.pairs]
    if ab.pairs:
        for q in (50, 90, 99):
            c, b = percentile(cand, q), percentile(base, q)
            lines.append(f"| TTFT p{q} | {fmt.seconds_as_ms(c)} | {fmt.seconds_as_ms(b)} | {fmt.pct((c / b - 1) * 100)} |")
    if results.ab_checks:
        conf = {(c.confidence, c.fail_confidence) for c in results.ab_checks}
        ci = f"{fmt.levels(*conf.pop())} CI" if len(conf) == 1 else "CI"
        lines += ["", f"| {'TTFT' if all(c.metric == TTFT for c in results.ab_checks) else 'latency'} vs baseline (paired ratio) | budget | measured | {ci} | pairs | rounds | per-pair spread | status |",
                  "|---|---:|---:|---:|---:|---:|---:|---|"]
        lines += [f"| {code(c.percentile if c.metric == TTFT else c.label, in_table=True)} | {fmt.pct(c.budget_pct)} | {fmt.pct(c.measured_pct)} "
                  f"| {fmt.pct_interval(c.interval_pct)} | {c.pairs} | {c.rounds} | {fmt.spread(c.pair_spread_pct)} "
                  f"| {_status(c.status)} |"
                  for c in results.ab_checks]
        notes = [f"- {code(c.percentile)}: {text(c.note)}" for c in results.ab_checks if c.note]
        lines += [""] + notes if notes else []
    reading = results.run.environment.cpu_contention
    if reading:
        lines += ["", f"Machine during the pairs: {text(fmt.contention(reading, ab=True))}. Both sides of every pair "
                  "ran under it: A/B mode records contention and judges the ratio anyway."]
    if ab.pairs:
        lines += [""] + _ab_chart(results, cand, base)
    if ab.op_diff:
        lines += ["", "#### Operator counts that differ (per request)", "",
                  "| scope | image size | op | baseline | candidate | delta |", "|---|---|---|---:|---:|---:|"]
        lines += [f"| {code(d.scope, in_table=True)} | {_size(d.image_size)} | {code(d.op, in_table=True)} "
                  f"| {d.baseline_calls} | {d.candidate_calls} | {d.delta_calls:+d} |" for d in ab.op_diff]
    elif results.run.op_counts or ab.baseline.op_counts:
        lines += ["", "Operator counts: identical on both sides in every budgeted code path (the census is judged "
                  "on its own)."]
    return lines


def _ab_chart(results: Results, cand: list[float], base: list[float]) -> list[str]:
    """Both TTFT distributions by decile: candidate as bars, baseline as a grey line, and the
    baseline shifted by the first ratio budget as a red line (where the candidate's median may go)."""
    c_dec = [to_ms(percentile(cand, p)) for p in CHART_DECILES]
    b_dec = [to_ms(percentile(base, p)) for p in CHART_DECILES]
    budget = next((c for c in results.ab_checks if c.metric == TTFT), None)  # the chart is TTFT's
    allowed = [b * (1 + budget.budget_pct / 100) for b in b_dec] if budget else []
    values = [*c_dec, *b_dec, *allowed]
    lo, hi = min(values), max(values)
    pad = max((hi - lo) * 0.15, hi * 0.01)
    y_lo, y_hi = max(0.0, lo - pad), hi + pad
    palette = [_BAR, _BASELINE] + ([_BUDGET_COLOURS[0][1]] if allowed else [])
    init = {"themeVariables": {"xyChart": {"plotColorPalette": ", ".join(palette)}}}
    lines = ["```mermaid", f"%%{{init: {json.dumps(init)}}}%%", "xychart-beta",
             f'    title "TTFT by percentile, candidate vs baseline, {len(cand)} pairs (ms)"',
             f"    x-axis [{', '.join(f'p{p:g}' for p in CHART_DECILES)}]",
             f'    y-axis "TTFT (ms)" {y_lo:.0f} --> {y_hi:.0f}',
             f"    bar [{', '.join(f'{v:.0f}' for v in c_dec)}]",
             f"    line [{', '.join(f'{v:.0f}' for v in b_dec)}]"]
    if allowed:
        lines.append(f"    line [{', '.join(f'{v:.0f}' for v in allowed)}]")
    lines.append("```")
    legend = "Blue bars: the candidate's TTFT at each decile. Grey line: the baseline's."
    if budget:
        legend += f" Red line: the baseline {fmt.pct(budget.budget_pct)} (the {text(budget.percentile)} budget)."
    return lines + [f"{legend} The y-axis starts at {y_lo:.0f} ms."]


def _ops_table(ops: tuple[OpCheck, ...]) -> list[str]:
    lines = ["| scope | image size | op | budget (calls) | measured (calls) | excess | status |",
             "|---|---|---|---:|---:|---|---|"]
    for c in ops:
        excess = fmt.op_excess(c) if c.status == Status.FAIL else "—"
        lines.append(f"| {code(c.scope, in_table=True)} | {_size(c.image_size)} | {code(c.op, in_table=True)} "
                     f"| {_rule(c.rule, c.budget_calls)} | {c.measured_calls} | {text(excess)} | {_status(c.status)} |")
    return lines


def _sites(results: Results, failed_ops: list[OpCheck]) -> list[str]:
    """Where the offending calls came from, per failed op check (most calls first)."""
    lines: list[str] = []
    for c in failed_ops:
        counts: ScopeCounts | None = next(
            (s for s in results.run.op_counts if s.scope == c.scope and tuple(s.image_size) == tuple(c.image_size)), None)
        sites = [] if counts is None else [s for s in counts.sites if c.op == TOTAL_OPS or s.op == c.op]
        sites = sorted(sites, key=lambda s: -s.calls)
        inside = f" in {code(counts.where)}" if counts is not None and counts.where else ""
        lines += ["", f"**{code(c.scope)} [{_size(c.image_size)}] {code(c.op)}** — {fmt.calls(c.measured_calls)}"
                  f"{inside}, budget {_rule(c.rule, c.budget_calls)}:", ""]
        if not sites:
            lines.append("_No call sites were recorded for this op._")
            continue
        lines += ["| calls | op | function | location |", "|---:|---|---|---|"]
        for s in sites[:MAX_SITES]:
            lines.append(f"| {int(s.calls)} | {code(s.op, in_table=True)} | {code(s.function, in_table=True)} "
                         f"| {code(s.location, in_table=True)} |")
        if len(sites) > MAX_SITES:
            lines.append(f"\n_…and {len(sites) - MAX_SITES} more sites (see results.json)._")
    return lines


def _census(results: Results) -> list[str]:
    """Functions whose operator calls grew beyond the rule (and, folded, those that changed within it)."""
    if not results.run.census:
        return []
    functions = sum(len(fns) for fns in results.run.census.values())
    failed = [c for c in results.census_checks if c.status == Status.FAIL]
    within = [c for c in results.census_checks if c.status != Status.FAIL]
    against = "the baseline side (A/B)" if results.ab is not None else "the committed baseline"
    lines = [f"{functions} functions × image sizes counted against {against}: "
             f"{len(failed)} grew beyond the rule, {len(within)} changed within it."]

    def table(checks) -> list[str]:
        out = ["| function | code | image size | op calls (baseline → measured) | change per op | status |",
               "|---|---|---|---|---|---|"]
        for c in checks:
            out.append(f"| {code(c.function, in_table=True)} | {code_owner(c.function)} | {_where(c)} "
                       f"| {text(fmt.census_calls(c))} "
                       f"| {code(fmt.census_ops(c), in_table=True)} | {_status(c.status)} |")
        return out

    judged = not any(r.kind == ReasonKind.CENSUS_BASELINE for r in results.invalid_reasons)
    lines[-1] += (" Host-sync ops per request (each one a sync on a GPU): "
                  + "; ".join(text(t) for t in fmt.host_syncs(results.run.census, results.census_checks, judged=judged)) + ".")
    if failed:
        lines[-1] += " The growth is in the findings above."
    if within:
        lines += [""] + _folded(f"{len(within)} function(s) changed within the rule", table(within))
    return lines


def _environment(environment: Environment) -> list[str]:
    env = environment.as_dict()
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
def _history(results: Results, st: HistoryStanding | None) -> list[str]:
    """Where this run sits in main's recent history (guard.history.analysis.pr_standing), when its base is in it."""
    if st is None:
        return []
    short = st.base_commit[:7]
    calls = st.census_calls
    census_cell = "—"
    if calls is not None and st.base_census_calls is not None:
        delta = calls - st.base_census_calls
        census_cell = f"{calls} ({'+' if delta >= 0 else '−'}{abs(delta)} vs base)"
    elif calls is not None:
        census_cell = str(calls)
    lines = ["", "### Against main's recent history", "",
             f"The base of this pull request, {code(short)}, is in main's history (profile {code(st.base_profile)}).",
             "", "| | TTFT p50 | census (op calls per request) |", "|---|---:|---:|",
             f"| this run | {fmt.ms_unit(st.p50_ms) if st.p50_ms is not None else '—'} | {census_cell} |",
             f"| base {code(short, in_table=True)} | "
             f"{fmt.ms_unit(st.base_ttft_p50_ms) if st.base_ttft_p50_ms is not None else '—'} | "
             f"{st.base_census_calls if st.base_census_calls is not None else '—'} |"]
    if st.p50_range_ms is not None:
        lo, mid, hi = st.p50_range_ms
        n = st.window
        timed = f"{n} commit(s)" if st.timed == n else f"{st.timed} of {n} commit(s) (with TTFT)"
        lines.append(f"| main, {timed} up to the base: min / median / max | {fmt.ms(lo)} / {fmt.ms(mid)} / "
                     f"{fmt.ms_unit(hi)} | |")
    if st.rank_pct is not None:
        lines += ["", f"This run's p50 is above {st.above} of those {st.timed} (percentile rank {st.rank_pct:.0f} %)."]
        run_machine = results.run.environment.machine_summary()
        if run_machine != st.base_machine:
            lines[-1] += (f" main's history was measured on {text(st.base_machine)}, this run on {text(run_machine)}: "
                          "absolute TTFT compares machines as much as code.")
    return lines


def _recipes(results: Results, thresholds: str | None) -> list[str]:
    """Reproduce, and accept the numbers: commands that work as pasted at the repository's root
    (guard.config.recipes), with values from the artifact used only where plain."""
    run = results.run
    profile = _token(run.profile, "PROFILE")
    # a file named from here is renamed from its repository's root; a recorded one already is, unless older
    named = person_path(thresholds) if thresholds else recorded_as_person_path(run.thresholds_path)
    budgets = _path_token(named, "THRESHOLDS")
    only = None if results.ttft_checks or results.ab_checks else "ops"
    if results.pr is not None:
        pr = results.pr
        reproduce = [""] + _folded("Reproduce locally", [
            "In a clone of vLLM that has both commits, from guard's repository root:", "",
            "```sh", recipes.pr(_token(pr.base.sha, "BASE"), _token(pr.head.sha, "HEAD"), budgets, profile, only=only),
            "```"])
        if results.verdict != Verdict.REGRESSION or results.ttft_checks or results.ab_checks:
            return reproduce  # TTFT side against side has no budget to move; nothing grew, nothing to accept
        return reproduce + [""] + _folded("Accept this growth (if the pull request intends it)", [
            "Head's op counts become the budgets and the census baseline: unpack this run's `guard-results` artifact "
            "into `guard-results/` at the root of the checkout that holds the budget file, then commit the diff in "
            "this pull request. Budgets in vLLM's tree are judged by base's copy until someone with write "
            "permission accepts the change (docs/github.md, \"Accepting intended growth\").", "",
            "```sh", *(recipes.update_thresholds(recipes.ARTIFACT_RESULTS, budgets, profile, only=part,
                                                 allow_increase=True) for part in ("ops", "census")), "```"])
    reproduce = [""] + _folded("Reproduce locally", [
        "On a machine that matches the profile (the profile pins the hardware), from the repository's root:", "",
        "```sh", recipes.check(budgets, profile, only=only, baseline=results.ab is not None), "```"])
    if results.verdict == Verdict.INVALID or run.injected:  # update-thresholds refuses both: offer nothing it refuses
        return reproduce
    return (reproduce
        + [""] + _folded("Accept these numbers as the new budgets", [
            "If the change in performance is intended, re-baseline from this run's results "
            "(the `guard-results` artifact, unpacked into `guard-results/` at the repository's root) and commit "
            "the diff:", "",
            "```sh", recipes.update_thresholds(recipes.ARTIFACT_RESULTS, budgets, profile, only=only), "```"]))


def render_markdown(results: Results, *, run_url: str | None = None, thresholds: str | None = None,
                    history: HistoryStanding | None = None) -> str:
    """The PR comment's body. ``thresholds``: the budget file the recipes name, as a path from the
    working directory (the poster's trusted copy); default: the one the run recorded, from its
    repository's root. ``history``: where this run sits in main's history (``guard comment
    --history``: guard.history.analysis.pr_standing), shown in a section of its own."""
    run = results.run
    icon = _ICON.get(results.verdict, "❔")
    lines = [f"## {icon} guard: {text(results.verdict.replace('_', ' '))} — {text(run.model)} on {code(run.profile)}", ""]
    lines += _summary(results)
    lines += _ab_section(results)

    ttft = results.ttft_checks
    if ttft:
        lines += ["", "### Time to first token", ""] + _ttft_table(ttft)
        chart = _chart(results, ttft)
        if chart:
            lines += [""] + chart
        reading = run.environment.cpu_contention
        if reading and results.ab is None:  # A/B mode says it in its own section
            lines += ["", f"Machine during measurement: {text(fmt.contention(reading))}."]
        speed = run.environment.speed_reference
        if speed:
            reference = results.profile_config.get("speed_reference_ms")
            lines += ["", f"Machine speed: guard's speed reference {text(fmt.speed_reference(speed, reference))}."]

    tokens, measured = results.token_checks, token_summary(run)
    if tokens or measured:
        lines += ["", "### Time per output token, inter-token latency", ""]
        lines += (_ttft_table(tokens) + [""]) if tokens else []
        lines += [f"{text(m)}  " for m in measured]  # two spaces: a line break in markdown

    ops = results.op_checks
    if ops:
        failed_ops = [c for c in ops if c.status == Status.FAIL]
        lines += ["", "### Operator counts per request", ""]
        where = ": the findings above" if results.verdict == Verdict.REGRESSION else ""
        lines += (_folded(f"All {len(ops)} op budgets ({len(failed_ops)} exceeded{where})", _ops_table(ops))
                  if failed_ops else _ops_table(ops))

    if results.unmeasured_op_checks:
        lines += ["", "### Operator counts: not measured in this mode", "",
                  text(results.unmeasured_op_checks[0].reason) + ".", "",
                  "| scope | op | budget (calls) | status |", "|---|---|---:|---|"]
        lines += [f"| {code(c.scope, in_table=True)} | {code(c.op, in_table=True)} | {_rule(c.rule, c.budget_calls)} "
                  f"| {_status(c.status)} |" for c in results.unmeasured_op_checks]
    census = _census(results)
    if census:
        lines += ["", "### Operator census per function", ""] + census
    lines += _history(results, history)
    lines += _pull_request(results)

    if results.verdict == Verdict.INVALID and results.checks:
        lines += ["", "_The tables above are for information only: an invalid run has no verdict._"]
    if results.notices:
        lines += ["", "### Notices", ""] + [f"- {text(n)}" for n in results.notices]

    lines += _recipes(results, thresholds)
    lines += [""] + _folded("What TTFT means here", [text(results.ttft_definition), *(["", text(TPOT_DEFINITION)] * bool(measured))])
    env = _environment(run.environment)
    if env:
        lines += [""] + env

    footer = [f"guard {text(results.guard_version)}" if results.guard_version else "guard"]
    if run_url:
        footer.append(f"[workflow run]({run_url})" if _SAFE_URL.fullmatch(run_url) else text(run_url))
    lines += ["", "<sub>" + " · ".join(footer) + "</sub>"]
    return "\n".join(lines) + "\n"


__all__ = ["render_markdown", "text", "code", "Status"]
