"""What kind of change a path of a vLLM checkout is, for the verdict of ``guard pr``.

A CPU run of the locked engine stack measures vLLM's Python; a change to compiled code or to the
dependencies is the wheel's or the lock's, so it cannot show. The pull request's record keeps the
changed files (``PullRequestDiff.changed_files``); judging them, when a results file is re-judged
too, needs only this table.
"""

from __future__ import annotations

from pathlib import PurePosixPath

# Changes the locked engine stack cannot show: compiled code is the wheel's, dependencies the lock's.
# From vLLM's tree: C++/CUDA/HIP kernels under csrc/ and their CMake build, the Rust frontend
# (rust/, Cargo manifests, build_rust.sh; built into vllm/_rust_*.so and vllm/vllm-rs by
# docker/Dockerfile.* and setup.py), Cython, and the build and dependency declarations.
COMPILED_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".hip", ".s", ".rs", ".cmake",
                     ".pyx", ".pxd")
COMPILED_NAMES = ("CMakeLists.txt", "Cargo.toml", "Cargo.lock", "rust-toolchain.toml", "rust-toolchain")
COMPILED_PATHS = ("csrc/", "cmake/", "rust/", "CMakeLists.txt", "setup.py", "build_rust.sh", "tools/build_rust.py")
DEPENDENCY_PATHS = ("requirements/", "requirements.txt", "requirements-")
DEPENDENCY_SUFFIXES = (".txt", ".in")  # requirements/*.txt and the pip-compile inputs (requirements/test/cuda.in)
DEPENDENCY_FILES = ("pyproject.toml",)  # the top-level one: build requirements (torch) and the package's metadata


def unmeasurable(path: str) -> str | None:
    """Why a CPU run of the locked engine stack cannot measure a change to ``path``; None: it can
    (Python, Triton kernels included, and data files) or it is outside what runs (tests, docs)."""
    p = PurePosixPath(path)
    if path.startswith(COMPILED_PATHS) or p.name in COMPILED_NAMES or p.suffix.lower() in COMPILED_SUFFIXES:
        return "compiled code"
    if path in DEPENDENCY_FILES or (path.startswith(DEPENDENCY_PATHS) and p.suffix in DEPENDENCY_SUFFIXES):
        return "dependencies"
    return None
