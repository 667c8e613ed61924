"""The op-count cache: one engine stack's op-count pass, remembered under a key of what it depends on.

Op counts and the census are exact and deterministic (``benchmarks/census_stability.py``): the same
engine stack running the same profiled workload on the same kind of machine counts the same calls.
So a pass measured once is read back instead of profiled again. Two callers, one cache:
- ``guard check --baseline`` (guard.measure.ab_run.ABRun): the baseline side's half of the op-count
  pass (on the CPU default ~40 s of an A/B check), once per baseline environment. Its entries live
  in ``GUARD_CACHE_DIR``; the engine stack is identified by its files, read in the baseline worker
  (``stack_material``), since that is where the baseline's packages are.
- ``guard pr`` and ``guard bisect`` (guard.revisions.sides): each revision's pass, inside that
  revision's environment folder, so that it is restored, kept and evicted with it; the engine stack
  is identified by that environment's own key (its vLLM tree and engine stack).

Either way the key also covers what is counted (engine arguments, profiled workload, op scopes,
census roots, not the limits), the model's files, the environment variables vLLM and torch read,
this machine's CPU/GPU and guard's own code (it attributes and counts the ops). A model named by a
moving revision (``main``) cannot be keyed: no cache then. An entry is the pass's run record in
run.json's format, read back through the same schema; an entry that does not read back is a miss
(measured again and rewritten: a damaged cache costs a profile pass, never a wrong count).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import hashlib
import json
import os
import platform
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from guard.errors import GuardError
from guard.model.jsonfiles import load_run, run_file_dict, write_json_atomic
from guard.model.records import RunRecord

# what else vLLM and torch read from the environment that changes which ops run
ENV_PREFIXES = ("VLLM_", "TORCH_", "OMP_", "KMP_", "MKL_", "CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE", "LD_PRELOAD")
PINNED_REVISION = re.compile(r"^[0-9a-f]{40}$")
LIBRARY_SAMPLE = 1 << 16  # bytes read from each end of a large non-source file
GUARD_PACKAGE = Path(__file__).resolve().parents[1]
DRIVER_GPU_INFO = "/proc/driver/nvidia/gpus/*/information"  # one file per GPU, "Model: <name>" among its lines
MAX_ENTRIES = 64  # per folder, the most recently used kept (an entry is ~25 KB on the CPU default)


def _tree(path: Path, suffixes: tuple[str, ...] | None) -> list[str]:
    """Every file under ``path`` (with one of ``suffixes``, or a versioned ``.so.N``) by content,
    so that the same files checked out or installed again (new mtimes) are the same environment:
    a source file's whole content; a large other file (a compiled library, model weights) by its
    size, head and tail: a full hash of torch's ~1.4 GB of libraries would take seconds on every
    check, and a library's head holds its ELF build-id and its tail the section headers, which a
    rebuild changes (docs/ab.md, "The baseline's op counts")."""
    out = []
    for folder, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if suffixes is not None and not name.endswith(suffixes) and ".so." not in name:
                continue
            full = os.path.join(folder, name)
            h = hashlib.sha256()
            with open(full, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size <= 2 * LIBRARY_SAMPLE or name.endswith(".py"):
                    h.update(f.read())
                else:
                    h.update(f.read(LIBRARY_SAMPLE))
                    f.seek(-LIBRARY_SAMPLE, os.SEEK_END)
                    h.update(f.read())
            out.append(f"{os.path.relpath(full, path)}:{size}:{h.hexdigest()[:16]}")
    return out


def _gpu_names(driver_info: str = DRIVER_GPU_INFO) -> list[str]:
    """The NVIDIA driver's names for this machine's GPUs, read without torch (guard pr's own process
    has none imported); else torch's, when the worker's engine has imported it."""
    names = []
    for info in sorted(glob.glob(driver_info)):
        try:
            for line in Path(info).read_text(errors="replace").splitlines():
                if line.startswith("Model:"):
                    names.append(line.split(":", 1)[1].strip())
        except OSError:
            pass
    torch = sys.modules.get("torch")  # never imported for this
    if not names and torch is not None:
        try:
            if torch.cuda.is_available():
                names.append(torch.cuda.get_device_name(0))
        except Exception:  # noqa: BLE001 - no usable CUDA: a CPU machine
            pass
    return names


def _hardware() -> dict[str, Any]:
    """What of the machine decides which ops run: the architecture, the instruction sets vLLM and
    torch branch on (AMX, native bf16, AVX-512: the census differs across them), the CPUs it may use
    (the census differs between one and two) and the GPUs. Not the CPU's model name: within one kernel set the census was the same
    on a Zen 5 and an AVX2-only Zen 3 EPYC (docs/census.md, "Determinism"), and CI restores a cache
    onto runners of other models."""
    from guard.measure.hardware import cpu_isa, read_cpu_features

    return {"machine": platform.machine(), "cpu_count": usable_cpus(), "cpu_isa": cpu_isa(read_cpu_features()),
            "gpus": _gpu_names()}


def usable_cpus() -> int:
    """The CPUs this process may run on: the census depends on it (docs/census.md, "And per number of
    usable cores"), and os.cpu_count() ignores a taskset or a container's cpuset."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def distributions() -> list[str]:
    """This interpreter's installed distributions, name==version (torch upgraded in place is another
    stack). Read from its site-packages, not sys.path: importing setuptools (vLLM's engine start
    does) puts its vendored copies on sys.path, and the same stack would key differently before and
    after an engine start."""
    import sysconfig
    from importlib import metadata

    paths = sysconfig.get_paths()
    found = metadata.distributions(path=list(dict.fromkeys([paths["purelib"], paths["platlib"]])))
    return sorted({f"{d.metadata['Name']}=={d.version}" for d in found if d.metadata["Name"]})


def stack_material() -> tuple[dict[str, Any], str]:
    """(what identifies this interpreter's engine stack, in words): its Python, its installed
    distributions, and vLLM's, torch's and transformers' files by content (an edited checkout is
    another stack, a fresh install of the same files is not). For a stack guard did not build."""
    import importlib.util

    dists = distributions()
    packages = {}
    for name in ("vllm", "torch", "transformers"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            packages[name] = None
            continue
        where = Path(list(spec.submodule_search_locations)[0])
        # every source file and compiled library
        packages[name] = {"where": str(where), "files": _tree(where, (".py", ".so"))}
    n_files = sum(len(p["files"]) for p in packages.values() if p)
    material = {"python": sys.version, "prefix": os.path.realpath(sys.prefix), "distributions": dists,
                "packages": packages}
    return material, f"{len(dists)} installed distributions, {n_files} vLLM/torch/transformers files"


def pass_key(stack: Mapping[str, Any], stack_covers: str, profile, gpu_memory_utilization: float | None = None,
             environ: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """(key, what it covers) for ``profile``'s op-count pass on the engine stack ``stack`` names;
    key None (with the reason) when the pass cannot be pinned down. ``environ``: the environment
    variables the engine runs with (default this process's; an A/B worker passes them as it was
    given them, before vLLM adds per-run ones)."""
    from guard.config.budgets import resolve_model

    engine = profile.engine
    model = resolve_model(engine.model)
    if os.path.isdir(model):
        model_files = _tree(Path(model), None)
    elif engine.revision and PINNED_REVISION.match(engine.revision):
        model_files = [f"{engine.model}@{engine.revision}"]
    else:
        return None, f"model {engine.model} is named by revision {engine.revision!r}, not a pinned commit"
    counted = {
        "engine": dataclasses.asdict(engine), "gpu_memory_utilization": gpu_memory_utilization,
        # not max_tokens: the profiled prefill request stops at its first token whatever it says
        "workload": {k: getattr(profile.workload, k) for k in ("prompt", "seed", "profile_image_sizes")}
        # the request mixes profiled for the decode census: their names, sampling and output length
        | {"profile_mixes": {m.name: m.as_dict() for m in profile.workload.profile_mixes}
           if profile.census is not None else None},
        # what is counted (scope, op names), not the limits or where they sit in the YAML
        "ops": [{"name": s.name, "scope": s.scope.as_dict(), "ops": sorted(s.ops)} for s in profile.ops],
        "census_roots": list(profile.census.roots) if profile.census is not None else None,
    }
    env = {k: v for k, v in sorted((os.environ if environ is None else environ).items()) if k.startswith(ENV_PREFIXES)}
    material = {"stack": dict(stack), "model": model_files, "counted": counted, "env": env, "hardware": _hardware(),
                "guard": _tree(GUARD_PACKAGE, None)}
    text = json.dumps(material, sort_keys=True, default=str)
    return (hashlib.sha256(text.encode()).hexdigest()[:24],
            f"{stack_covers}, the model's files, the profile's engine/workload/op scopes/census roots, "
            f"{len(env)} environment variables, this machine's CPU/GPU and guard's own code")


def entry_path(folder: Path, key: str) -> Path:
    return folder / f"op-counts-{key}.json"


def load(folder: Path | None, key: str | None) -> RunRecord | None:
    """The pass remembered under ``key``; None when there is none or it does not read back."""
    if folder is None or key is None:
        return None
    path = entry_path(folder, key)
    if not path.is_file():
        return None
    try:
        record = load_run(path)
    except (GuardError, OSError, ValueError, KeyError, TypeError):
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # used now: the last to be pruned
    return record


def store(folder: Path | None, key: str | None, record: RunRecord) -> Path | None:
    """Remember a measured pass (best effort: a cache that cannot be written is not an error)."""
    if folder is None or key is None:
        return None
    path = entry_path(folder, key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, run_file_dict(record))
    except OSError:
        return None
    prune(folder, keep=MAX_ENTRIES)
    return path


def prune(folder: Path, keep: int) -> list[Path]:
    """Drop all but the ``keep`` most recently used entries (each key change, a new guard or vLLM
    included, adds one; a cache CI saves and restores would otherwise only grow). Returns those dropped."""
    entries = []
    for path in folder.glob(entry_path(Path(), "*").name):
        with contextlib.suppress(OSError):
            entries.append((path.stat().st_mtime, path))
    dropped = [path for _, path in sorted(entries, reverse=True)[keep:]]
    for path in dropped:
        with contextlib.suppress(OSError):
            path.unlink()
    return dropped
