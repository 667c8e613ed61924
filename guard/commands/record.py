"""Append a run of main to the history store (one JSON line per commit and profile).

Reads results.json (validated as every guard reader does) of `guard check` or `guard pr` (head's
side; the commit defaults to the head it measured), computes TTFT p50/p90/p99 from its measured
requests and the census totals, and appends one line to ``--history`` atomically. An ops-only run
(``--only ops``) is recorded with its census and no TTFT (history schema version 2). A
commit already recorded for the profile is refused unless ``--replace``; an invalid run is not
recorded (exit 3). Exit 0: recorded; 2: bad input.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from guard.model import format as fmt
from guard.errors import UsageError
from guard.files import writing
from guard.history.store import DATE_EXAMPLE, append, commit_flag, date_problem, record_from_results
from guard.model.results import load_results

DEFAULT_RESULTS = "guard-results/results.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="results", default=DEFAULT_RESULTS, metavar="RESULTS",
                        help="results.json of a `guard check` or `guard pr` run on main, with TTFT or ops-only "
                             "(default: %(default)s)")
    parser.add_argument("--history", required=True, metavar="PATH", help="the history file (JSON lines; created if missing)")
    parser.add_argument("--commit", default=None, metavar="SHA",
                        help="the commit that was measured (default: guard pr's head, else the run's environment.git_commit)")
    parser.add_argument("--date", default=None, metavar="ISO8601",
                        help="when the run started (default: the run's started_at)")
    parser.add_argument("--note", default="", help="free text kept with the record, e.g. the workflow run's URL")
    parser.add_argument("--replace", action="store_true", help="replace the record of the same commit and profile")
    parser.add_argument("--skip-unmeasured", action="store_true",
                        help="exit 0 without recording when `guard pr` measured nothing (the commit changed nothing "
                             "under vllm/: its census is its parent's)")


def run(args: argparse.Namespace) -> int:
    if args.commit is not None:
        commit_flag("--commit", args.commit)
    if args.date is not None and (problem := date_problem(args.date)):
        raise UsageError(f"--date {problem}", hint=f"e.g. --date {DATE_EXAMPLE}")
    results = load_results(Path(args.results))
    if args.skip_unmeasured and results.pr is not None and not results.pr.measured:
        print(f"guard record: {results.pr.head.sha[:12]} changed nothing under vllm/ against "
              f"{results.pr.base.sha[:12]}: nothing measured, nothing recorded ({args.history} unchanged)")
        return 0
    if contradiction := results.self_contradiction():
        raise UsageError(f"{args.results}: verdict: {contradiction}; not recorded",
                         hint="results files are written by `guard check`; re-run it rather than editing one")
    record = record_from_results(results, commit=args.commit, date=args.date, note=args.note)
    with writing(args.history, "--history"):
        records, replaced = append(args.history, record, replace=args.replace)
    census = ", ".join(f"{fmt.size(c.image_size)} {fmt.calls(c.calls)} in {c.functions} functions"
                       for c in record.census) or "no census"
    ttft = (f"TTFT p50 {fmt.ms_unit(record.ttft_p50_ms)}, p90 {fmt.ms_unit(record.ttft_p90_ms)} "
            f"({record.samples} requests)" if record.has_ttft else "no TTFT (an ops-only run)")
    print(f"guard record: {'replaced' if replaced else 'appended'} {record.commit[:12]} ({record.profile}) in "
          f"{args.history}: {ttft}; census {census}; {len(records)} record(s)")
    return 0
