"""`guard` command line: parse, dispatch, turn exceptions into exit codes. Nothing else.

Each command lives in ``guard/commands/<name>.py`` and owns its parser:
``add_arguments(parser)`` and ``run(args) -> int``.

Exit codes (``guard.errors.ExitCode``): a ``GuardError`` carries its own (2, 3, 4); Ctrl-C is an
invalid run (3); *any other* exception is a bug, never a verdict: exit 5 ("internal error") with a
one-line message, and the traceback written to a log file (and printed with ``--debug``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import os
import signal
import sys
import tempfile
import traceback
from pathlib import Path

from guard import __version__
from guard.errors import ExitCode, GuardError
from guard.sanitize import no_workflow_commands, one_line

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
    "weights": ("weights", "download a profile's model weights, resolving a moving revision to its commit"),
}
CRASH_LOG_ENV = "GUARD_CRASH_LOG"  # where the traceback of an internal error goes (default: a temp file)


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


def crash_log_path() -> Path:
    explicit = os.environ.get(CRASH_LOG_ENV)
    if explicit:
        return Path(explicit)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path(tempfile.gettempdir()) / f"guard-crash-{stamp}-{os.getpid()}.log"


def _write_crash_log(text: str) -> Path | None:
    """Best effort: the log is for the bug report; failing to write it must not hide the error."""
    path = crash_log_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
    except OSError:
        return None
    return path


def internal_error(command: str, exc: BaseException, argv: list[str], debug: bool) -> int:
    tb = "".join(traceback.format_exception(exc))
    log = _write_crash_log(f"guard {__version__} {command}: argv {argv!r}\n{tb}\n")
    first = one_line(str(exc), limit=300)
    print(f"guard {command}: internal error: {type(exc).__name__}: {first}", file=sys.stderr)
    print("guard: this is a bug in guard (or a library it drives), not a performance verdict; exit 5.",
          file=sys.stderr)
    if debug:
        print(no_workflow_commands(tb), file=sys.stderr, end="")
    where = f"the traceback is in {log}" if log else "the traceback could not be written to a log file"
    print(f"hint: {where}{'' if debug else '; re-run with `guard --debug ...` to print it'}", file=sys.stderr)
    return int(ExitCode.INTERNAL)


def _drop_stdout() -> None:
    """Point standard output at /dev/null, so the interpreter's last flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real file descriptor (captured output): nothing to flush there
        pass


def _interrupt(signum, frame):
    """SIGTERM as Ctrl-C: the same clean-up paths run (a half-made update is put back), and exit 3."""
    raise KeyboardInterrupt


def _say_error(text: str) -> None:
    """One line on stderr; a stderr that cannot be written (a full disk) must not turn the exit
    code into Python's own 1, which is guard's "regression"."""
    try:
        print(text, file=sys.stderr)
    except (OSError, ValueError):
        pass


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
    except KeyboardInterrupt:  # while the commands are imported
        _say_error(f"guard {command}: interrupted")
        return int(ExitCode.INVALID)
    try:
        return int(args._run(args))
    except GuardError as exc:
        # messages can quote input files (an artifact from a pull request): never a workflow command
        _say_error(no_workflow_commands(f"guard {args.command}: error: {exc}"))
        return int(exc.exit_code)
    except KeyboardInterrupt:
        _say_error(f"guard {args.command}: interrupted")
        return int(ExitCode.INVALID)
    except BrokenPipeError:  # `guard ... | head`: the reader left; cut short like Ctrl-C, and no bug
        _drop_stdout()
        _say_error(f"guard {args.command}: standard output was closed before the command finished")
        return int(ExitCode.INVALID)
    except (SystemExit, Exception) as exc:  # noqa: BLE001 - the last resort: a bug (or a library's sys.exit) is never 0 or 1
        try:
            return internal_error(args.command, exc, argv, args.debug)
        except (OSError, ValueError):  # stderr cannot be written either: the code still says it
            return int(ExitCode.INTERNAL)


if __name__ == "__main__":
    sys.exit(main())
