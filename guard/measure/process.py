"""Child processes guard owns (the run stage's child, a worker, a ``vllm serve``): they die with guard, and their logs'
tails explain a failure."""

from __future__ import annotations

import signal
import sys
from pathlib import Path


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Linux: deliver ``sig`` to this process when its parent exits. SIGKILL for a worker (it also
    ends a stopped one, which never reads the EOF on its stdin); SIGTERM for ``vllm serve``
    (called before exec), so that its engine core follows its API server. Elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        pass


def log_tail(path: Path, lines: int) -> str | None:
    """The last ``lines`` non-blank lines of a log; "" when it is empty, None when it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return "\n".join([ln for ln in text.splitlines() if ln.strip()][-lines:])
