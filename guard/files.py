"""Writing guard's files: atomically, checked before they replace anything, through symlinks.

Every file guard writes (results.json, run.json, a rewritten thresholds YAML, a census baseline)
goes to a temp file in the target's folder, is optionally re-read by the loader that will read it
later, and only then replaces the target with ``os.replace``: an interrupted write leaves the old
file, never half a new one, and no temp file behind. A symlink is written *through*: the real file
gets the new text and the link stays a link.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: Path | str, text: str, *, check: Callable[[Path], Any] | None = None) -> None:
    """``check(temp_path)`` raises when the new text must not be put in place. A new file gets the
    usual permissions (0666 less the umask), an existing one keeps its own."""
    path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = stat.S_IMODE(os.stat(path).st_mode) if path.exists() else 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # mkstemp makes 0600
        if check is not None:
            check(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
