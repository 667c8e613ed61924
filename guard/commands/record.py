"""Append a run of main to the history store, or a pull request's run to the findings store.

A run of main (``--history``): one JSON line per commit and profile. Reads results.json (validated
as every guard reader does) of `guard check` or `guard pr` (head's side; the commit defaults to the
head it measured), computes TTFT p50/p90/p99 from its measured requests and the census totals, and
appends one line to ``--history`` atomically. An ops-only run (``--only ops``) is recorded with its
census and no TTFT (history schema version 2). A commit already recorded for the profile is refused
unless ``--replace``; an invalid run is not recorded (exit 3). Exit 0: recorded; 2: bad input.

Shadow mode (``--findings PATH --pr N``): the run is a pull request's, as the poster judged it
(``--trusted-thresholds``: judged again against those budgets, as ``guard comment`` does), and it
is appended to the findings store (guard.history.findings) with each failed check as a finding;
``--accepted-by LOGIN`` says the poster judged with head's budgets because LOGIN accepted them.
Recording the same run again appends nothing. An invalid run is recorded without findings.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from guard.model import format as fmt
from guard.config.loading import load_thresholds
from guard.errors import UsageError
from guard.files import writing
from guard.history.findings import (PullRequestRun, load_findings, login_flag, pr_number_flag, record_run,
                                    run_from_results)
from guard.history.store import DATE_EXAMPLE, append, commit_flag, date_problem, record_from_results
from guard.judge.rejudge import rejudge
from guard.model.jsonfiles import load_results
from guard.model.results import Results
from guard.model.verdict import self_contradiction

DEFAULT_RESULTS = "guard-results/results.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="results", default=DEFAULT_RESULTS, metavar="RESULTS",
                        help="results.json of a `guard check` or `guard pr` run, with TTFT or ops-only "
                             "(default: %(default)s)")
    store = parser.add_mutually_exclusive_group(required=True)
    store.add_argument("--history", default=None, metavar="PATH",
                       help="main's history: record a run of main (JSON lines; created if missing)")
    store.add_argument("--findings", default=None, metavar="PATH",
                       help="shadow mode: the findings store of pull requests (JSON lines; created if missing): "
                            "record the run as pull request --pr's")
    parser.add_argument("--date", default=None, metavar="ISO8601",
                        help="when the run started (default: the run's started_at)")
    parser.add_argument("--note", default="", help="free text kept with the record, e.g. the workflow run's URL")
    main = parser.add_argument_group("a run of main (--history)")
    main.add_argument("--commit", default=None, metavar="SHA",
                      help="the commit that was measured (default: guard pr's head, else the run's environment.git_commit)")
    main.add_argument("--replace", action="store_true", help="replace the record of the same commit and profile")
    main.add_argument("--skip-unmeasured", action="store_true",
                      help="exit 0 without recording when `guard pr` measured nothing (the commit changed nothing "
                           "under vllm/: its census is its parent's)")
    pull = parser.add_argument_group("a pull request's run (--findings)")
    pull.add_argument("--pr", type=pr_number_flag, default=None, metavar="N", help="the pull request's number")
    pull.add_argument("--sha", default=None, metavar="SHA",
                      help="the head commit measured (default: guard pr's head, else the run's environment.git_commit)")
    pull.add_argument("--trusted-thresholds", default=None, metavar="PATH",
                      help="judge the run again against these budgets before recording, as `guard comment "
                           "--trusted-thresholds` does ({model}: the run's model; default: the verdict results.json "
                           "holds)")
    pull.add_argument("--from-findings", default=None, metavar="PATH",
                      help="merge the run lines of another findings store (what `guard comment --findings` wrote "
                           "on the poster) into --findings, each once; in place of --from")
    pull.add_argument("--accepted-by", default=None, metavar="LOGIN",
                      help="the poster judged with head's budgets because LOGIN accepted the change: every "
                           "finding of this run is recorded as accepted by LOGIN")


MAIN_ONLY = (("--commit", "commit"), ("--replace", "replace"), ("--skip-unmeasured", "skip_unmeasured"))
PULL_REQUEST_ONLY = (("--pr", "pr"), ("--sha", "sha"), ("--trusted-thresholds", "trusted_thresholds"),
                     ("--accepted-by", "accepted_by"), ("--from-findings", "from_findings"))


def run(args: argparse.Namespace) -> int:
    wrong, store = (MAIN_ONLY, "--findings") if args.findings is not None else (PULL_REQUEST_ONLY, "--history")
    for flag, name in wrong:
        if getattr(args, name) not in (None, False):
            raise UsageError(f"{flag} does not go with {store}",
                             hint="--commit, --replace and --skip-unmeasured record a run of main (--history); "
                                  "--pr, --sha, --trusted-thresholds and --accepted-by a pull request's (--findings)")
    if args.date is not None and (problem := date_problem(args.date)):
        raise UsageError(f"--date {problem}", hint=f"e.g. --date {DATE_EXAMPLE}")
    if args.findings is not None:
        return record_findings(args)
    if args.commit is not None:
        commit_flag("--commit", args.commit)
    results = load_results(Path(args.results))
    if args.skip_unmeasured and results.pr is not None and not results.pr.measured:
        print(f"guard record: {results.pr.head.sha[:12]} changed nothing under vllm/ against "
              f"{results.pr.base.sha[:12]}: nothing measured, nothing recorded ({args.history} unchanged)")
        return 0
    _as_the_poster_judged(results, args.results, None)
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


def _as_the_poster_judged(results: Results, source: str, trusted_thresholds: str | None) -> Results:
    """The run judged again against the trusted budgets, as ``guard comment`` does; without them,
    the file's own verdict, which its checks must support."""
    if trusted_thresholds is not None:  # {model}: the run's, as guard comment reads the flag
        return rejudge(results, load_thresholds(trusted_thresholds.replace("{model}", results.run.model)), source=source)
    if contradiction := self_contradiction(results):
        raise UsageError(f"{source}: verdict: {contradiction}; not recorded",
                         hint="results files are written by `guard check`; re-run it rather than editing one")
    return results


def merge_findings(args: argparse.Namespace) -> int:
    """--from-findings: the poster's run lines into the store, each once (a re-run merges nothing twice)."""
    if args.pr is not None or args.sha is not None or args.accepted_by is not None or args.trusted_thresholds:
        raise UsageError("--from-findings takes the runs as the poster recorded them: give no --pr, --sha, "
                         "--accepted-by or --trusted-thresholds")
    runs = [line for line in load_findings(args.from_findings) if isinstance(line, PullRequestRun)]
    appended = 0
    with writing(args.findings, "--findings"):
        have = [r for r in (load_findings(args.findings) if Path(args.findings).exists() else [])
                if isinstance(r, PullRequestRun)]
        for run in runs:  # one post (its note: the posting run's URL) is merged once, however often
            if any(r.identity == run.identity and r.same_result(run) and r.note == run.note for r in have):
                continue
            appended += record_run(args.findings, run).appended
            have.append(run)
    print(f"guard record: {appended} of {len(runs)} run(s) from {args.from_findings} appended to {args.findings}")
    return 0


def record_findings(args: argparse.Namespace) -> int:
    """--findings: a pull request's run, as the poster judged it, into the findings store."""
    if args.from_findings is not None:
        return merge_findings(args)
    if args.pr is None:
        raise UsageError("--findings records a pull request's run: pass --pr N")
    sha = commit_flag("--sha", args.sha) if args.sha is not None else None
    accepted_by = login_flag("--accepted-by", args.accepted_by) if args.accepted_by is not None else None
    results = _as_the_poster_judged(load_results(Path(args.results)), args.results, args.trusted_thresholds)
    run = run_from_results(results, pr=args.pr, head=sha, date=args.date, accepted_by=accepted_by, note=args.note)
    with writing(args.findings, "--findings"):
        done = record_run(args.findings, run)
    what = (f"pull request #{run.pr} at {run.head[:12]} ({run.model}, {run.profile}): {run.verdict}, "
            f"{len(run.findings)} finding(s)" + (f", accepted by @{run.accepted_by}" if run.accepted_by else ""))
    if not done.appended:
        print(f"guard record: {what}: already recorded on line {done.line} of {args.findings}; nothing appended")
    elif done.earlier is not None:
        print(f"guard record: appended {what} on line {done.line} of {args.findings}; line {done.earlier_line} "
              f"holds an earlier result of the same run ({done.earlier.verdict}, {len(done.earlier.findings)} "
              "finding(s)): the later line counts")
    else:
        print(f"guard record: appended {what} on line {done.line} of {args.findings}")
    return 0
