"""Writing guard's files: atomically, checked before they replace anything, through symlinks.

Every file guard writes (results.json, run.json, a rewritten thresholds YAML, a census baseline)
goes to a temp file in the target's folder, is optionally re-read by the loader that will read it
later, and only then replaces the target with ``os.replace``: an interrupted write leaves the old
file, never half a new one, and no temp file behind. A symlink is written *through*: the real file
gets the new text and the link stays a link.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from guard.errors import UsageError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: Path | str, text: str, *, check: Callable[[Path], Any] | None = None) -> None:
    """``check(temp_path)`` raises when the new text must not be put in place. A new file gets the
    usual permissions (0666 less the umask), an existing one keeps its own."""
    def fill(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    write_atomic(path, fill, check=check)


def write_atomic(path: Path | str, fill: Callable[[Path], Any], *, suffix: str = ".tmp",
                 check: Callable[[Path], Any] | None = None) -> None:
    """``fill(temp_path)`` writes the new file beside the target; ``check(temp_path)`` raises when
    it must not be put in place; then it replaces the target. Refuses a target that is not a
    regular file (a device or a pipe would become a file) or that is read-only."""
    path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    st = os.stat(path) if path.exists() else None
    if st is not None:
        _regular(st, path)
    mode = stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask()
    if st is not None and not mode & 0o222:  # os.replace needs only the folder's permission, and root ignores both
        raise PermissionError(errno.EACCES, "the file is read-only (no write permission bit set)", str(path))
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    try:
        fill(Path(tmp))
        os.chmod(tmp, mode)  # mkstemp makes 0600
        if check is not None:
            check(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _regular(st: os.stat_result, path: Path | str) -> None:
    """OSError unless ``st`` is a regular file's: guard reads and replaces files, never pipes or devices."""
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EISDIR if stat.S_ISDIR(st.st_mode) else errno.EINVAL,
                      "a folder, not a file" if stat.S_ISDIR(st.st_mode) else "not a regular file", str(path))


def read_input(path: Path | str, limit: int | None = None) -> bytes:
    """The bytes of a file guard reads (budgets, results, a history, an artifact): regular files only,
    since a pipe or a device would block or never end; with ``limit``, at most ``limit + 1`` bytes
    (enough to tell that it is too long). Raises OSError as ``open`` does."""
    _regular(os.stat(path), path)  # before open: opening a FIFO blocks until something writes to it
    with open(path, "rb") as f:
        return f.read() if limit is None else f.read(limit + 1)


@contextlib.contextmanager
def writing(path: Path | str, what: str = "") -> Iterator[None]:
    """Around a write to a file the user named: an OSError there (a read-only folder, a full disk,
    a folder where a file should be) is bad input naming the file (exit 2), never a crash.
    ``what``: the flag or role that named it (e.g. ``--png``)."""
    try:
        yield
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise UsageError(f"{what + ' ' if what else ''}{path}: cannot write: {reason}"
                         + (" (the file is unchanged)" if Path(path).is_file() else ""),
                         hint="name a file in a folder you can write to") from None


def cache_root() -> Path | None:
    """Where guard remembers what is costly to measure and cannot change unseen (the op registry of
    a torch build, a baseline environment's op counts): ``$GUARD_CACHE_DIR`` (empty: remember
    nothing), else ``$XDG_CACHE_HOME/guard`` or ``~/.cache/guard``."""
    root = os.environ.get("GUARD_CACHE_DIR")
    if root == "":
        return None
    if root is None:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "guard")
    return Path(os.path.abspath(root))  # the same folder from an A/B worker, which runs in the output folder


# ----------------------------------------------------------------------------- paths a person types
# A path guard records or prints must mean the same file in another checkout of the repository
# (the artifact of a CI run read on a laptop): so it is written relative to the root of the git
# work tree that holds it, and read back against the root of the work tree the reader stands in.

def repository_root(path: Path | str) -> Path | None:
    """The root of the git work tree holding ``path`` (a folder with a ``.git`` folder or file), or None."""
    here = Path(os.path.abspath(path))
    for folder in (here, *here.parents):
        if (folder / ".git").exists():
            return folder
    return None


def person_path(path: Path | str) -> str:
    """``path`` as a person at the repository's root types it: relative to the root of the git work
    tree holding it; else relative to the working directory when beneath it; else absolute."""
    full = Path(os.path.abspath(path))
    for base in (repository_root(full), Path.cwd()):
        if base is not None and full.is_relative_to(base) and full != base:
            return full.relative_to(base).as_posix()
    return str(full)


def recorded_as_person_path(recorded: str) -> str:
    """A recorded path as printed commands name it: already from the repository's root, or (a record
    from before paths were recorded so) made so here."""
    return person_path(recorded) if Path(recorded).is_absolute() else recorded


def find_recorded(recorded: str, *, start: Path | str | None = None) -> Path | None:
    """The file a recorded path names, found from ``start`` (default: the working directory):
    a relative path at the root of the repository ``start`` is in, then beneath ``start``; an
    absolute one as it is, else (recorded on another machine) its longest tail that exists at that
    root. None when nothing fits."""
    start = Path(os.path.abspath(start or Path.cwd()))
    bases = [b for b in dict.fromkeys((repository_root(start), start)) if b is not None]
    path = Path(recorded)
    if not path.is_absolute():
        return next((b / path for b in bases if (b / path).is_file()), None)
    if path.is_file():
        return path
    parts = path.parts[1:]
    for i in range(len(parts)):  # the longest tail first: thresholds/x.yaml before x.yaml
        tail = Path(*parts[i:])
        found = next((b / tail for b in bases if (b / tail).is_file()), None)
        if found is not None:
            return found
    return None


RUN_FILES = ("run.json", "ab-run.json", "results.json", "report.md", "benchmark.json", "server.log")  # what a run writes


def clear_run_files(output: Path) -> None:
    """What an earlier run left in ``output`` goes before a new one, so that a run that stops early is
    never read as the old one's. Only guard's own files: the folder may hold anything else."""
    output.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
        (output / name).unlink(missing_ok=True)


def prepare_output(output: Path) -> None:
    """The output folder exists and is writable with some room, or a clear error naming it (exit 2)
    before a minute is spent measuring; what an earlier run wrote there is gone (clear_run_files),
    so that this run stopping at a configuration error is never read as that one's verdict. Only
    guard's own files in it are touched."""
    if output.exists() and not output.is_dir():
        raise UsageError(f"--output {output}: exists and is not a folder",
                         hint="pass a folder (it is created if missing), e.g. --output guard-results")
    probe = output / f".guard-write-test-{os.getpid()}"
    try:
        output.mkdir(parents=True, exist_ok=True)
        try:
            probe.write_bytes(b"x" * 4096)  # a full disk fails here, not after minutes of measuring
        finally:
            probe.unlink(missing_ok=True)
        clear_run_files(output)
    except OSError as exc:
        raise UsageError(f"--output {output}: cannot write there: {exc.strerror or exc}",
                         hint="pass a writable folder with free space, e.g. --output guard-results") from None
