"""`guard` command line: parse, dispatch, turn exceptions into exit codes. Nothing else.

Each command lives in ``guard/commands/<name>.py`` and owns its parser:
``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from guard import __version__
from guard.errors import ExitCode, GuardError

# command name -> (module under guard.commands, one-line help)
COMMANDS = {
    "check": ("check", "run the perf suite on this machine and judge it against the budgets"),
    "selftest": ("selftest", "prove the op-count probe still catches the pre-#49531 mask regression"),
    "update-thresholds": ("update_thresholds", "rewrite a profile's budgets from a results.json, as a minimal diff"),
    "comment": ("comment", "post the verdict on the pull request (sticky comment, status, summary)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="guard", description="Performance regression guard for vLLM models.")
    parser.add_argument("--version", action="version", version=f"guard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        cmd = importlib.import_module(f"guard.commands.{module}")
        p = sub.add_parser(name, help=help_text, description=(cmd.__doc__ or help_text).strip().splitlines()[0])
        cmd.add_arguments(p)
        p.set_defaults(_run=cmd.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: 2 for usage errors, 0 for --help
        return int(exc.code or 0)
    try:
        return int(args._run(args))
    except GuardError as exc:
        print(f"guard {args.command}: error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        print(f"guard {args.command}: interrupted", file=sys.stderr)
        return int(ExitCode.INVALID)


if __name__ == "__main__":
    sys.exit(main())
