"""Print and chart main's history: TTFT per commit, census changes, lasting TTFT shifts.

Reads the history store ``guard record`` appends to, picks one profile, finds the lasting TTFT
shifts over all of its records (guard.history.changepoints) and shows the last ``--last``: a table
on the terminal, and on request a PNG (``--png``) and a Mermaid block for comments
(``--mermaid``, ``-`` for standard output). Exit 0 whatever the history shows (a flag is a reason
to look, not a verdict); 2: bad input.

``--findings PATH`` reads shadow mode's store instead (``guard record --findings``, ``guard
judge-finding``; guard.history.outcomes): a table of pull requests' findings over a window
(``--since``, ``--last-prs``), each with how it was judged, by whom and when, and the summary a
maintainer reads before making the status required: the counts and the false-alarm rate.
"""

from __future__ import annotations

import argparse
import sys

from guard.model import format as fmt
from guard.errors import UsageError
from guard.files import write_text_atomic, writing
from guard.history import chart
from guard.history.analysis import Analysis, Row, analyse, short
from guard.history.findings import Finding, Outcome, load_findings
from guard.history.outcomes import FindingOutcome, Summary, Window, since_problem, summarise
from guard.history.store import for_profile, load_history
from guard.sanitize import no_workflow_commands, one_line

DEFAULT_LAST = 50


def add_arguments(parser: argparse.ArgumentParser) -> None:
    store = parser.add_mutually_exclusive_group(required=True)
    store.add_argument("--history", default=None, metavar="PATH",
                       help="main's history, as `guard record --history` writes it")
    store.add_argument("--findings", default=None, metavar="PATH",
                       help="shadow mode: the findings store `guard record --findings` writes: pull requests' "
                            "findings, how each was judged, and the false-alarm rate")
    parser.add_argument("--profile", default=None,
                        help="the profile to show (default: the only one in the history; with --findings, all)")
    main = parser.add_argument_group("main's history (--history)")
    main.add_argument("--last", type=int, default=None, metavar="N",
                      help=f"show the last N commits (default: {DEFAULT_LAST}; change points use every record)")
    main.add_argument("--png", default=None, metavar="FILE", help="write the chart as a PNG")
    main.add_argument("--mermaid", default=None, metavar="FILE",
                      help=f"write a Mermaid chart of the last {chart.MERMAID_LAST} shown commits for a "
                           "comment ('-': standard output)")
    pull = parser.add_argument_group("pull requests' findings (--findings)")
    pull.add_argument("--since", default=None, metavar="DATE",
                      help="findings first seen on or after DATE (2026-12-01, or a time with its UTC offset)")
    pull.add_argument("--last-prs", type=int, default=None, metavar="N", help="the N pull requests recorded last")
    pull.add_argument("--model", default=None, help="one model's findings (default: all)")


def _note(row: Row) -> str:
    notes = []
    if row.shift is not None:
        s = row.shift
        notes.append(f"lasting shift {fmt.pct(s.shift_pct)} ({fmt.ms_unit(s.before)} -> {fmt.ms_unit(s.after)})")
    if row.census_changed:
        notes.append("census changed")
    if row.machine_changed:
        notes.append(f"machine: {one_line(row.record.machine, 120)}")
    return "; ".join(notes)


def table(analysis: Analysis, rows: tuple[Row, ...]) -> list[str]:
    header = ("commit", "date", "p50", "p90", "n", "census calls", "")
    body = []
    for r in rows:
        rec = r.record
        census = str(rec.census_calls) if rec.census else "-"
        p50, p90 = (fmt.ms(rec.ttft_p50_ms), fmt.ms(rec.ttft_p90_ms)) if rec.has_ttft else ("-", "-")
        body.append((short(rec.commit), rec.date[:16].replace("T", " "), p50, p90,
                     str(rec.samples) if rec.has_ttft else "ops", census, _note(r)))
    widths = [max(len(x[i]) for x in (header, *body)) for i in range(len(header))]
    right = {2, 3, 4, 5}

    def line(cells) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(header), *(line(b) for b in body)]


def say(text: str) -> None:
    """A line that may carry the store's text (a machine name, a note from a workflow): never a
    workflow command, one line per line."""
    print(no_workflow_commands(text))


MAIN_ONLY, FINDINGS_ONLY = ("--last", "--png", "--mermaid"), ("--since", "--last-prs", "--model")


def run(args: argparse.Namespace) -> int:
    given = {"--last": args.last, "--png": args.png, "--mermaid": args.mermaid, "--since": args.since,
             "--last-prs": args.last_prs, "--model": args.model}
    store, other = ("--findings", MAIN_ONLY) if args.findings is not None else ("--history", FINDINGS_ONLY)
    for flag in other:
        if given[flag] is not None:
            raise UsageError(f"{flag} does not go with {store}",
                             hint="--last, --png and --mermaid show main's history (--history); --since, --last-prs "
                                  "and --model pull requests' findings (--findings)")
    if args.findings is not None:
        if args.since is not None and (problem := since_problem(args.since)):
            raise UsageError(f"--since {problem}")
        if args.last_prs is not None and args.last_prs < 1:
            raise UsageError("--last-prs must be at least 1")
        return show_findings(args.findings, Window(since=args.since, last_prs=args.last_prs, model=args.model,
                                                   profile=args.profile))
    last = DEFAULT_LAST if args.last is None else args.last
    if last < 1:
        raise UsageError("--last must be at least 1")
    for flag, value in (("--png", args.png), ("--mermaid", args.mermaid)):
        if value == "":
            raise UsageError(f"{flag} needs a file name" + (" (or '-' for standard output)" if flag == "--mermaid" else ""))
    profile, records = for_profile(load_history(args.history), args.profile)
    analysis = analyse(profile, records)
    rows = analysis.last(last)
    machines = sorted({one_line(r.record.machine, 120) for r in rows})
    say(f"guard history: {args.history}, profile {profile}: {len(rows)} of {len(records)} commit(s) shown; "
          f"machine{'s' if len(machines) > 1 else ''}: {'; '.join(machines)}")
    for text in table(analysis, rows):
        say(text)
    m = analysis.method
    shifts = [r for r in rows if r.shift is not None]
    say(f"lasting TTFT shifts (p50, >= {m.min_shift_pct:g} %, >= {m.min_segment} commits on each side, "
          f"{'slowdowns' if m.slowdowns_only else 'both directions'}): "
          + (", ".join(f"{short(r.record.commit)} {fmt.pct(r.shift.shift_pct)}" for r in shifts) or "none"))
    census = [short(r.record.commit) for r in rows if r.census_changed]
    say(f"census changed at: {', '.join(census) or 'none'}")
    if args.png:
        with writing(args.png, "--png"):
            chart.write_png(rows, args.png, title=f"guard history of main: {records[-1].model} on {profile}")
        say(f"guard history: chart written to {args.png}")
    if args.mermaid:
        text = "\n".join(chart.mermaid(rows)) + "\n"
        if args.mermaid == "-":
            sys.stdout.write(no_workflow_commands(text))
        else:
            with writing(args.mermaid, "--mermaid"):
                write_text_atomic(args.mermaid, text)
            say(f"guard history: Mermaid chart written to {args.mermaid}")
    return 0


# ----------------------------------------------------------------------------- pull requests' findings
def _amount(value: float | None, unit: str) -> str:
    if value is None:
        return "none"
    if unit == "ms":
        return fmt.ms_unit(value)
    if unit == "%":
        return fmt.pct(value)
    return fmt.calls(int(value))


def measured_against(f: Finding) -> str:
    """``513 calls (budget 0 calls)``: what the check measured against what it was held to."""
    against = (f"budget {_amount(f.budget, f.unit)}" if f.budget is not None
               else f"baseline {_amount(f.baseline, f.unit)}" if f.baseline is not None
               else "not in the baseline" if f.unit == "calls" else "")
    return f"{_amount(f.measured, f.unit)}" + (f" ({against})" if against else "")


def findings_table(found: list[FindingOutcome]) -> list[str]:
    # the finding's key is long (a census function's qualified name) and what `guard judge-finding
    # --finding` takes: whole, near the end, so the short columns line up before it
    header = ("pr", "model", "profile", "judged", "by", "when", "measured", "finding", "note")
    body = [(f"#{o.pr}", one_line(o.model, 60), one_line(o.profile, 60), o.judged.outcome.words,
             one_line(o.judged.by, 60), o.judged.date[:16].replace("T", " "), measured_against(o.finding),
             one_line(o.finding.key, None), one_line(o.judged.note, 200)) for o in found]
    widths = [max(len(x[i]) for x in (header, *body)) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip() for cells in (header, *body)]


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"


def summary_lines(summary: Summary) -> list[str]:
    counts = summary.counts
    line = (f"{_count(summary.findings, 'finding')} on {_count(summary.pull_requests, 'pull request')}: "
            f"{counts[Outcome.ACCEPTED]} accepted, {counts[Outcome.FIXED]} fixed, "
            f"{_count(counts[Outcome.FALSE_ALARM], 'false alarm')}, {counts[Outcome.OPEN]} open")
    rate = summary.false_alarm_rate
    if rate is None:
        return [line, "false-alarm rate: none judged yet (fixed, accepted or false alarm)"]
    return [line, f"false-alarm rate: {counts[Outcome.FALSE_ALARM]} false alarm(s) / {summary.judged} judged "
                  f"(accepted + fixed + false alarm) = {rate * 100:.1f} %; pull requests with a false alarm: "
                  f"{summary.false_alarm_prs} of the {summary.pull_requests} with findings"]


def show_findings(path: str, window: Window) -> int:
    """--findings: the table and the summary over the window; exit 0 whatever they show."""
    lines = load_findings(path)
    found, runs = window.findings(lines), window.runs(lines)
    scope = [f"since {window.since}" if window.since else "",
             f"last {window.last_prs} pull request(s)" if window.last_prs else "",
             f"model {window.model}" if window.model else "", f"profile {window.profile}" if window.profile else ""]
    say(f"guard history: {path}: findings of pull requests" + "".join(f", {s}" for s in scope if s)
        + f": {runs.runs} run(s) of {runs.pull_requests} pull request(s) recorded ({runs.with_findings} with findings, "
          f"{runs.invalid} invalid)")
    if found:
        for text in findings_table(found):
            say(text)
    else:
        say("no findings in this window")
    for text in summary_lines(summarise(found)):
        say(text)
    return 0
