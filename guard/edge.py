"""The one edge where exceptions become exit codes: the CLI's, and each model of ``--model all|auto``.

A ``GuardError`` carries its own code (2, 3, 4) and one line on stderr; Ctrl-C and a closed standard
output are an invalid run (3); *any other* exception is a bug, never a verdict: exit 5 ("internal
error") with a one-line message and the traceback in a log file (printed too with ``--debug``).
guard.cli calls it for the command; guard.commands.matrix for each model, whose crash log goes into
that model's output folder, so one model's crash is its line of the matrix, not the end of it.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import tempfile
import traceback
from pathlib import Path

from guard import __version__
from guard.errors import ExitCode, GuardError
from guard.sanitize import no_workflow_commands, one_line

CRASH_LOG_ENV = "GUARD_CRASH_LOG"  # where the traceback of an internal error goes (default: a temp file)


def crash_log_path() -> Path:
    explicit = os.environ.get(CRASH_LOG_ENV)
    if explicit:
        return Path(explicit)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path(tempfile.gettempdir()) / f"guard-crash-{stamp}-{os.getpid()}.log"


def _write_crash_log(text: str, path: Path | None = None) -> Path | None:
    """Best effort: the log is for the bug report; failing to write it must not hide the error."""
    path = path or crash_log_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
    except OSError:
        return None
    return path


def internal_error(command: str, exc: BaseException, argv: list[str], debug: bool,
                   crash_log: Path | None = None) -> int:
    tb = "".join(traceback.format_exception(exc))
    log = _write_crash_log(f"guard {__version__} {command}: argv {argv!r}\n{tb}\n", crash_log)
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


def _say_error(text: str) -> None:
    """One line on stderr; a stderr that cannot be written (a full disk) must not turn the exit
    code into Python's own 1, which is guard's "regression"."""
    try:
        print(text, file=sys.stderr)
    except (OSError, ValueError):
        pass


def exit_code_for(command: str, exc: BaseException, argv: list[str], *, debug: bool,
                  crash_log: Path | None = None) -> int:
    """What ``command`` exits with for ``exc``, said on stderr (see the module's docstring)."""
    if isinstance(exc, GuardError):
        # messages can quote input files (an artifact from a pull request): never a workflow command
        _say_error(no_workflow_commands(f"guard {command}: error: {exc}"))
        return int(exc.exit_code)
    if isinstance(exc, KeyboardInterrupt):
        _say_error(f"guard {command}: interrupted")
        return int(ExitCode.INVALID)
    if isinstance(exc, BrokenPipeError):  # `guard ... | head`: the reader left; cut short like Ctrl-C, and no bug
        _drop_stdout()
        _say_error(f"guard {command}: standard output was closed before the command finished")
        return int(ExitCode.INVALID)
    try:  # the last resort: a bug (or a library's sys.exit) is never 0 or 1
        return internal_error(command, exc, argv, debug, crash_log=crash_log)
    except (OSError, ValueError):  # stderr cannot be written either: the code still says it
        return int(ExitCode.INTERNAL)
