"""`guard` command line: parse, dispatch, turn exceptions into exit codes. Nothing else.

Each command lives in ``guard/commands/<name>.py`` and owns its parser:
``add_arguments(parser)`` and ``run(args) -> int``.

Exit codes (``guard.errors.ExitCode``) come from the one edge, ``guard.edge.exit_code_for``: a
``GuardError`` carries its own (2, 3, 4); Ctrl-C is an invalid run (3); *any other* exception is a
bug, never a verdict: exit 5 ("internal error"), the traceback in a log file.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

from guard import __version__
from guard.edge import CRASH_LOG_ENV, crash_log_path, exit_code_for, internal_error  # noqa: F401 - the CLI's names
from guard.errors import ExitCode

# command name -> (module under guard.commands, one-line help)
COMMANDS = {
    "check": ("check", "run the perf suite on this machine and judge it against the budgets"),
    "pr": ("pr", "judge a vLLM pull request: base and head of a vLLM git repository, side against side"),
    "bisect": ("bisect", "find the commit that changed the census between a good and a bad vLLM revision"),
    "selftest": ("selftest", "prove the op-count probe still catches the pre-#49531 mask regression"),
    "update-thresholds": ("update_thresholds", "rewrite a profile's budgets from a results.json, as a minimal diff"),
    "comment": ("comment", "post the verdict on the pull request (sticky comment, status, summary)"),
    "record": ("record", "append a `guard check` run of main to the history store, or a pull request's findings "
                         "(--findings)"),
    "history": ("history", "print and chart main's history: TTFT per commit, census changes, lasting shifts; "
                           "--findings: pull requests' findings and how each was judged"),
    "judge-finding": ("judge_finding", "say how a pull request's finding ended: accepted, fixed, false alarm (shadow mode)"),
    "schema": ("schema", "print the budget file's JSON Schema (for editors), or --write the copy guard ships"),
    "weights": ("weights", "download a profile's model weights, resolving a moving revision to its commit"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="guard", description="Performance regression guard for vLLM models.")
    parser.add_argument("--version", action="version", version=f"guard {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="print the full traceback of an internal error (exit 5) on stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        cmd = importlib.import_module(f"guard.commands.{module}")
        p = sub.add_parser(name, help=help_text, description=(cmd.__doc__ or help_text).strip().splitlines()[0])
        cmd.add_arguments(p)
        p.set_defaults(_run=cmd.run)
    return parser


def _interrupt(signum, frame):
    """SIGTERM as Ctrl-C: the same clean-up paths run (a half-made update is put back), and exit 3."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    for name in ("stdout", "stderr"):  # closed by the caller (`>&-`): Python leaves None, prints would fail
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w"))
    try:
        previous = signal.signal(signal.SIGTERM, _interrupt)
    except ValueError:  # not the main thread (a test's): signals stay as they are
        previous = None
    try:
        return _main(argv)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str]) -> int:
    command = argv[0] if argv and not argv[0].startswith("-") else "guard"
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: 2 for usage errors, 0 for --help
        return int(exc.code or 0) if isinstance(exc.code, int) or exc.code is None else int(ExitCode.CONFIG)
    except KeyboardInterrupt as exc:  # while the commands are imported
        return exit_code_for(command, exc, argv, debug=False)
    try:
        return int(args._run(args))
    except (SystemExit, Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - the one edge: guard.edge
        return exit_code_for(args.command, exc, argv, debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
