"""Print and chart main's history: TTFT per commit, census changes, lasting TTFT shifts.

Reads the history store ``guard record`` appends to, picks one profile, finds the lasting TTFT
shifts over all of its records (guard.history.changepoints) and shows the last ``--last``: a table
on the terminal, and on request a PNG (``--png``) and a Mermaid block for comments
(``--mermaid``, ``-`` for standard output). Exit 0 whatever the history shows (a flag is a reason
to look, not a verdict); 2: bad input.
"""

from __future__ import annotations

import argparse
import sys

from guard.model import format as fmt
from guard.errors import UsageError
from guard.files import write_text_atomic, writing
from guard.history import chart
from guard.history.analysis import Analysis, Row, analyse, short
from guard.history.store import for_profile, load_history
from guard.sanitize import no_workflow_commands, one_line

DEFAULT_LAST = 50


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--history", required=True, metavar="PATH", help="the history file `guard record` writes")
    parser.add_argument("--profile", default=None,
                        help="the profile to show (default: the only one in the history)")
    parser.add_argument("--last", type=int, default=DEFAULT_LAST, metavar="N",
                        help="show the last N commits (default: %(default)s; change points use every record)")
    parser.add_argument("--png", default=None, metavar="FILE", help="write the chart as a PNG")
    parser.add_argument("--mermaid", default=None, metavar="FILE",
                        help=f"write a Mermaid chart of the last {chart.MERMAID_LAST} shown commits for a "
                             "comment ('-': standard output)")


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


def run(args: argparse.Namespace) -> int:
    if args.last < 1:
        raise UsageError("--last must be at least 1")
    for flag, value in (("--png", args.png), ("--mermaid", args.mermaid)):
        if value == "":
            raise UsageError(f"{flag} needs a file name" + (" (or '-' for standard output)" if flag == "--mermaid" else ""))
    profile, records = for_profile(load_history(args.history), args.profile)
    analysis = analyse(profile, records)
    rows = analysis.last(args.last)
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
