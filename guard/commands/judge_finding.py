"""Say how a finding of a pull request ended: accepted, fixed, false alarm, or open again (shadow mode).

Appends one ``judgement`` line per ``--finding`` to the findings store ``guard record --findings``
writes (guard.history.findings); earlier lines are never rewritten, and the latest judgement of a
finding is the one ``guard history --findings`` shows. The finding must be one a recorded run of
that pull request has (its key, as ``guard history --findings`` prints it). Exit 0: appended; 2:
bad input (an unknown finding, a bad login, a damaged store).
"""

from __future__ import annotations

import argparse

from guard.errors import UsageError
from guard.files import writing
from guard.history.findings import Outcome, login_flag, pr_number_flag, record_judgements
from guard.sanitize import no_workflow_commands, one_line

OUTCOMES = {o.flag: o for o in Outcome}  # --as false-alarm -> Outcome.FALSE_ALARM


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--findings", required=True, metavar="PATH",
                        help="the findings store `guard record --findings` writes")
    parser.add_argument("--pr", type=pr_number_flag, required=True, metavar="N", help="the pull request's number")
    parser.add_argument("--finding", action="append", required=True, metavar="KEY",
                        help="the finding's key, as `guard history --findings` shows it; repeat for more")
    parser.add_argument("--as", dest="outcome", required=True, choices=list(OUTCOMES),
                        help="how it ended: accepted (the budget change was accepted), fixed, false-alarm, or open "
                             "(undo an earlier judgement)")
    parser.add_argument("--by", required=True, metavar="LOGIN", help="who judged it (a GitHub login)")
    parser.add_argument("--note", default="", help="why, in a line (e.g. 'TTFT noise: re-run passed')")
    parser.add_argument("--model", default=None, help="the model, when the pull request has the finding on several")
    parser.add_argument("--profile", default=None, help="the profile, when the pull request has the finding on several")


def run(args: argparse.Namespace) -> int:
    by = login_flag("--by", args.by)
    if "\n" in args.note or "\r" in args.note:
        raise UsageError("--note is one line")
    outcome = OUTCOMES[args.outcome]
    with writing(args.findings, "--findings"):
        appended = record_judgements(args.findings, pr=args.pr, findings=args.finding, model=args.model,
                                     profile=args.profile, outcome=outcome, by=by, note=args.note)
    for judgement, line in appended:
        print(no_workflow_commands(
            f"guard judge-finding: pull request #{judgement.pr} ({one_line(judgement.model)}, "
            f"{one_line(judgement.profile)}): {one_line(judgement.finding, 300)}: {outcome.words} by @{by} "
            f"(line {line} of {args.findings})"))
    return 0
