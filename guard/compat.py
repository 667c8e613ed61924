"""Other libraries' private corners, in one place.

Each function here touches an API its library does not promise to keep. When one moves, the
error says which library and version moved what (``LibraryDrift``), so a drift is an invalid run
or a clear message, never a crash and never a verdict.
"""

from __future__ import annotations

import importlib
from importlib import metadata

from guard.errors import InvalidRunError


class LibraryDrift(InvalidRunError):
    """A private API guard relies on is gone or changed shape."""


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "(not installed)"


def registered_op_names(load_vllm_ops: bool = False) -> frozenset[str]:
    """Every operator the torch dispatcher knows, as the profiler names its events: ``ns::name``
    without the overload (``aten::index_put.out`` -> ``aten::index_put``).

    ``load_vllm_ops``: first load vLLM's compiled op libraries (``_C::``, ``_moe_C::`` ...), which
    register their ops only when imported. Private: ``torch._C._dispatch_get_all_op_names``.
    """
    if load_vllm_ops:
        for module in ("vllm._C", "vllm._moe_C"):
            try:
                importlib.import_module(module)
            except Exception:  # noqa: BLE001 - absent in this build (e.g. no MoE kernels on CPU)
                pass
    import torch

    get_all = getattr(torch._C, "_dispatch_get_all_op_names", None)
    if get_all is None:
        raise LibraryDrift(f"torch {_version('torch')} moved torch._C._dispatch_get_all_op_names: "
                           "guard cannot check op-budget names against the operator registry")
    try:
        names = list(get_all())
    except Exception as exc:  # noqa: BLE001
        raise LibraryDrift(f"torch {_version('torch')}: torch._C._dispatch_get_all_op_names() failed: {exc}") from exc
    if not names or not all(isinstance(n, str) for n in names):
        raise LibraryDrift(f"torch {_version('torch')}: torch._C._dispatch_get_all_op_names() returned "
                           f"{type(names).__name__} of unexpected shape")
    return frozenset(n.split(".", 1)[0] for n in names)
