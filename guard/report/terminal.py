"""Results -> the tables and verdict line people read in their terminal."""

from __future__ import annotations

from collections.abc import Iterable

from guard.config.budgets import Profile
from guard.model import format as fmt
from guard.model.environment import Environment
from guard.model.records import TOKEN_METRICS, ReasonKind, Status, Verdict
from guard.model.results import FunctionChange, Results
from guard.report.findings import code_owner
from guard.report.latency import token_summary
from guard.judge.stats import percentile

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
    who = "candidate TTFT" if results.ab is not None else "TTFT"
    line = f"{who} over {len(samples)} requests in {results.run.rounds} round(s): {cells}"
    return "\n".join([line, *token_summary(results.run)])


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


def _vllm(env: Environment) -> str:
    return f"{env.vllm or '?'} ({(env.worker and env.worker.vllm_file) or '?'})"


def ab_lines(results: Results) -> list[str]:
    """A/B mode: both sides side by side, the ratio verdicts, and the op counts that differ."""
    ab = results.ab
    if ab is None:
        return []
    lines = ([f"A/B: candidate vs baseline on this machine, {len(ab.pairs)} pairs, each block on both sides "
              f"back to back, alternating which goes first (ABBA)", ""] if ab.pairs or results.ab_checks else
             ["op counts: the two sides profiled one after the other (no TTFT pairs)", ""])
    worker = results.run.environment.worker
    # a candidate with no worker ran in guard's own process (A/B), or in head's environment (guard pr),
    # which the pull request's record describes; never an empty cell
    own = "guard's own" if results.pr is None else (results.pr.head.environment or "head's (not recorded)")
    rows = [["python", (worker and worker.executable) or own, ab.baseline_python, ""],
            ["vllm", _vllm(results.run.environment), _vllm(ab.baseline.environment), ""]]
    if ab.pairs:
        cand, base = [p.candidate_s for p in ab.pairs], [p.baseline_s for p in ab.pairs]
        for q in (50, 90, 99):
            c, b = percentile(cand, q), percentile(base, q)
            rows.append([f"ttft p{q}", fmt.seconds_as_ms(c), fmt.seconds_as_ms(b), fmt.pct((c / b - 1) * 100)])
        for metric in TOKEN_METRICS:  # shown side by side; A/B judges the TTFT ratio only
            cand_s, base_s = results.run.latency_s(metric), ab.baseline.latency_s(metric)
            if cand_s and base_s:
                c, b = percentile(cand_s, 50), percentile(base_s, 50)
                rows.append([f"{metric} p50", fmt.seconds_as_ms(c), fmt.seconds_as_ms(b), fmt.pct((c / b - 1) * 100)])
    lines += _table(["", "candidate", "baseline", "cand/base"], rows, left=1)
    lines.append("")
    if results.ab_checks:
        rows = [[fmt.label(c), fmt.pct(c.budget_pct), fmt.pct(c.measured_pct), fmt.pct_interval(c.interval_pct),
                 str(c.pairs), fmt.spread(c.pair_spread_pct), fmt.STATUS_WORD[c.status]] for c in results.ab_checks]
        tpot = any(c.metric != "ttft" for c in results.ab_checks)
        lines += _table(["paired ratio" if tpot else "TTFT (paired ratio)", "budget", "measured", "interval", "pairs", "per-pair spread", "status"], rows)
        lines += [f"  {fmt.label(c)}: {c.note}" for c in results.ab_checks if c.note]
        lines.append("")
    if ab.op_diff:
        rows = [[d.scope, fmt.size(d.image_size), d.op, str(d.baseline_calls), str(d.candidate_calls), f"{d.delta_calls:+d}"]
                for d in ab.op_diff]
        lines += _table(["op counts that differ", "image", "op", "baseline", "candidate", "delta"], rows, left=3)
        lines.append("")
    elif results.run.op_counts or ab.baseline.op_counts:
        lines += ["op counts: identical on both sides in every budgeted code path (the census is judged below)", ""]
    return lines


def census_lines(results: Results) -> list[str]:
    """The census diff: each function beyond the rule, baseline → measured, the ops that grew."""
    if not results.run.census:
        return []
    functions = sum(len(fns) for fns in results.run.census.values())
    failed = [c for c in results.census_checks if c.status == Status.FAIL]
    against = " against the baseline side" if results.ab is not None else ""
    decode = results.run.decode_census
    steps = f", {sum(len(d.census) for d in decode.values())} x {len(decode)} request mixes' decode steps" if decode else ""
    lines = [f"census: {functions} functions x image sizes{steps} counted{against}; {len(failed)} grew beyond the rule, "
             f"{len(results.census_checks) - len(failed)} changed within it"]
    if failed:
        rows = [[c.function, code_owner(c.function), c.where, fmt.census_calls(c), fmt.census_ops(c),
                 fmt.STATUS_WORD[c.status]] for c in failed]
        columns = "baseline side → candidate" if results.ab is not None else "baseline → measured"
        lines += _table(["census (op calls per request)", "code", "image", columns, "change per op", "status"],
                        rows, left=5)
        # beside the counts, never instead of them: what the growth would cost on a GPU
        lines += [f"  on a GPU, {c.function} [{fmt.size(c.image_size)}]: {fmt.gpu_cost(c)}" for c in failed if c.gpu_costs]
    judged = not any(r.kind == ReasonKind.CENSUS_BASELINE for r in results.invalid_reasons)
    lines.append("host syncs on a GPU, ops per request: "
                 + " · ".join(fmt.host_syncs(results.run.census, results.census_checks, judged=judged)))
    lines.append("")
    return lines


def render_terminal(results: Results) -> str:
    lines: list[str] = []
    summary = percentile_summary(results)
    if summary:
        lines += [summary, ""]
    lines += ab_lines(results)
    latency = (*results.ttft_checks, *results.token_checks)
    if latency:
        rows = [[fmt.label(c), fmt.ms_unit(c.budget_ms), fmt.ms_unit(c.measured_ms),
                 fmt.delta_pct(c.measured_ms, c.budget_ms) or "", fmt.interval(c.interval_ms), str(c.samples),
                 fmt.STATUS_WORD[c.status]] for c in latency]
        lines += _table(["TTFT" if not results.token_checks else "latency", "budget", "measured", "delta",
                         "interval (ms)", "n", "status"], rows)
        lines += [f"  {fmt.label(c)}: {c.note}" for c in latency if c.note]
        lines.append("")
    if results.op_checks:
        rows = [[c.scope, fmt.size(c.image_size), c.op, fmt.rule(c.rule, c.budget_calls), str(c.measured_calls),
                 fmt.STATUS_WORD[c.status]] for c in results.op_checks]
        lines += _table(["op count (per request)", "image", "op", "budget", "measured", "status"], rows, left=3)
        lines += sites_lines(results)
        lines.append("")
    if results.unmeasured_op_checks:
        rows = [[c.scope, c.op, fmt.rule(c.rule, c.budget_calls), fmt.STATUS_WORD[c.status]]
                for c in results.unmeasured_op_checks]
        lines += _table(["op count (per request)", "op", "budget", "status"], rows, left=2)
        lines += [f"  {results.unmeasured_op_checks[0].reason}", ""]
    reading = results.run.environment.cpu_contention
    if reading:
        lines.append(f"machine: {fmt.contention(reading, ab=results.ab is not None)}")
    speed = results.run.environment.speed_reference
    if speed:
        lines.append(f"machine speed: guard's speed reference {fmt.speed_reference(speed, results.profile_config.get('speed_reference_ms'))}")
    lines += census_lines(results)
    lines += pr_lines(results)
    lines += [f"invalid: {reason}" for reason in results.invalid_reasons]
    lines += [f"notice: {notice}" for notice in results.notices]
    lines.append(verdict_line(results))
    return "\n".join(lines)


def pr_lines(results: Results) -> list[str]:
    """guard pr: the two revisions, and the lines head added inside each function that moved."""
    pr = results.pr
    if pr is None:
        return []
    lines = [f"pull request: base {pr.base.sha[:12]} ({pr.base.subject[:60]}) -> head {pr.head.sha[:12]} "
             f"({pr.head.subject[:60]}); {len(pr.changed_files)} file(s) changed"]
    lines += [f"  {name}: {fmt.revision(side)}" for name, side in (("base", pr.base), ("head", pr.head))
              if side.version or side.environment]
    lines += added_lines(pr.function_changes)
    lines.append("")
    return lines


def added_lines(changes: Iterable[FunctionChange]) -> list[str]:
    """The lines a revision added inside each function that moved (guard pr, and guard bisect's culprit)."""
    lines = []
    for change in changes:
        lines.append(f"  added inside {change.function}:")
        lines += [f"    {line}" for line in fmt.added_snippet(change.lines)]
    return lines


def verdict_line(results: Results) -> str:
    where = f"{results.run.model} on profile '{results.run.profile}'"
    if results.verdict == Verdict.NOT_MEASURABLE:
        files = len(results.pr.unmeasured_files) if results.pr else 0
        held = (f"all {len(results.judged)} measured budgets held" if results.pr is None or results.pr.measured
                else "its vLLM Python is the same on both sides")
        return (f"NOT MEASURABLE: {where}: the pull request changed {files} file(s) of compiled code or dependencies, "
                f"which this engine stack cannot measure; {held}")
    if results.verdict == Verdict.PASS:
        if results.pr is not None and not results.pr.measured:
            return f"PASS: {where}: not measured: the pull request changed nothing under vllm/"
        if results.unmeasured_op_checks:
            return (f"PASS: {where}: all {len(results.judged)} measured budgets held; "
                    f"{len(results.unmeasured_op_checks)} op-count budget(s) not measured in this mode")
        return f"PASS: {where}: all {len(results.judged)} budgets held"
    if results.verdict == Verdict.REGRESSION:
        return (f"REGRESSION: {where}: {len(results.failed)} budget(s) exceeded:\n"
                + "\n".join(f"  - {fmt.failure(c)}" for c in results.failed))
    return f"INVALID RUN: {where}: the measurement cannot be trusted ({len(results.invalid_reasons)} reason(s) above)"


def say_dtype(profile: Profile, prefix: str) -> None:
    """A command's line saying the engine runs another dtype than the profile's bfloat16 on this CPU."""
    if profile.engine.bf16_replaced:
        print(f"{prefix}: engine dtype {profile.engine.dtype} instead of bfloat16: this CPU has no native bf16 "
              "(engine.dtype_without_native_bf16)", flush=True)
