"""Every private or version-sensitive corner of another library that guard uses, in one place.

(The census's part: CPython's frame walk and torch's Python dispatch mode, both used by the
census counter measured in benchmarks/census_cost.py.) When a corner moves, the function here
raises ``LibraryDrift`` ("library X version Y moved Z"), an invalid run: never a crash.
"""

from __future__ import annotations

import sys
from importlib import metadata
from typing import Any

from guard.errors import InvalidRunError


def library_version(*dists: str) -> str:
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


class LibraryDrift(InvalidRunError):
    """A library guard relies on no longer looks the way guard expects."""

    def __init__(self, library: str, moved: str, *, dists: tuple[str, ...] = ()) -> None:
        version = library_version(*(dists or (library,)))
        super().__init__(f"{library} {version} moved {moved}",
                         hint=f"guard was built against other {library} versions; update guard's compat module "
                              "(guard/compat.py) for this one")
        self.library, self.version, self.moved = library, version, moved


# ----------------------------------------------------------------------------- census counter
def frame_getter():
    """``sys._getframe`` (CPython's frame access; ``inspect.currentframe`` is the same call, slower)."""
    getter = getattr(sys, "_getframe", None)
    if getter is None:
        raise LibraryDrift("python", "sys._getframe (not CPython?)")
    return getter


def torch_dispatch_mode() -> Any:
    """torch's ``TorchDispatchMode`` base class: sees every operator that reaches the Python key."""
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError as exc:
        raise LibraryDrift("torch", f"torch.utils._python_dispatch.TorchDispatchMode ({exc})") from exc
    return TorchDispatchMode
