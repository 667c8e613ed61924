"""A/B mode: the baseline side's op-count pass, remembered per baseline environment.

The baseline side's op counts and census are a function of what that side runs, not of the
candidate: its installed packages (vLLM's own files included, so an edited source checkout is a
new environment), the model files, the profile's engine, profiled workload, op scopes and census
roots, the environment variables vLLM and torch read, the machine's CPU/GPU, and guard's own
attribution code. Counts are exact and deterministic (``benchmarks/census_stability.py``), so a
run against a baseline environment that has been profiled before reads them back instead of
profiling again: the baseline's half of the op-count pass (on the CPU default about 40 s of an A/B
check: an 800x400 warm-up and two profiled requests) is paid once per baseline environment, e.g.
once per merge-base in CI (``actions/cache``), once per baseline venv locally.

The key is computed in the baseline worker (``environment_key``): that is where the baseline's
packages are. A model named by a moving revision (``main``) cannot be keyed: no cache then.
``GUARD_CACHE_DIR=''`` turns every guard cache off; ``guard check --baseline ... --fresh-baseline``
profiles the baseline side again and replaces its entry.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import os
import platform
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from guard.files import write_text_atomic

SCHEMA = "guard/ab-baseline-ops"
SCHEMA_VERSION = 1
# what else vLLM and torch read from the environment that changes which ops run
ENV_PREFIXES = ("VLLM_", "TORCH_", "OMP_", "KMP_", "MKL_", "CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE", "LD_PRELOAD")
PINNED_REVISION = re.compile(r"^[0-9a-f]{40}$")
LIBRARY_SAMPLE = 1 << 16  # bytes read from each end of a large non-source file


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


def _hardware() -> dict[str, Any]:
    from guard.measure.hardware import cpu_isa, cpu_name, read_cpu_features

    gpu = None
    torch = sys.modules.get("torch")  # the worker's engine has imported it; never imported for this
    try:
        if torch is not None and torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - no usable CUDA: a CPU machine
        pass
    return {"machine": platform.machine(), "cpu": cpu_name(), "cpu_count": os.cpu_count(),
            "cpu_isa": cpu_isa(read_cpu_features()), "gpu": gpu}


def environment_key(profile, gpu_memory_utilization: float | None,
                    environ: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """(key, what it covers) for this process's environment running ``profile``'s op-count pass;
    key None (with the reason) when the environment cannot be pinned down. ``environ``: the
    environment variables as the worker was given them (vLLM adds per-run ones when it starts)."""
    import importlib.util
    from importlib import metadata

    from guard.config.budgets import resolve_model

    engine = profile.engine
    model = resolve_model(engine.model)
    if os.path.isdir(model):
        model_files = _tree(Path(model), None)
    elif engine.revision and PINNED_REVISION.match(engine.revision):
        model_files = [f"{engine.model}@{engine.revision}"]
    else:
        return None, f"model {engine.model} is named by revision {engine.revision!r}, not a pinned commit"
    dists = sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions() if d.metadata["Name"])
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
        # every source file (an edited checkout is another baseline) and compiled library
        packages[name] = {"where": str(where), "files": _tree(where, (".py", ".so"))}
    config = {
        "engine": dataclasses.asdict(engine), "gpu_memory_utilization": gpu_memory_utilization,
        "workload": {k: getattr(profile.workload, k) for k in ("prompt", "max_tokens", "seed", "profile_image_sizes")},
        # what is counted (scope, op names), not the limits or where they sit in the YAML
        "ops": [{"name": s.name, "scope": s.scope.as_dict(), "ops": sorted(s.ops)} for s in profile.ops],
        "census_roots": list(profile.census.roots) if profile.census is not None else None,
    }
    env = {k: v for k, v in sorted((os.environ if environ is None else environ).items()) if k.startswith(ENV_PREFIXES)}
    material = {"python": sys.version, "prefix": os.path.realpath(sys.prefix), "distributions": dists,
                "packages": packages, "model": model_files, "config": config, "env": env,
                "hardware": _hardware(),
                # guard's own code, as the worker imports it: it attributes and counts the ops
                "guard": _tree(Path(__file__).resolve().parents[1], None)}
    text = json.dumps(material, sort_keys=True, default=str)
    n_files = sum(len(p["files"]) for p in packages.values() if p)
    return (hashlib.sha256(text.encode()).hexdigest()[:24],
            f"{len(dists)} installed distributions, {n_files} vLLM/torch/transformers files, the model's files, "
            f"the profile's engine/workload/op scopes/census roots, {len(env)} environment variables, this machine's "
            "CPU/GPU and guard's own code")


@dataclass(frozen=True)
class CachedPass:
    """One baseline environment's op-count pass: per profiled image size ("640x480"), what the
    worker's ``counts`` message said: ``{"counts": [ScopeCounts as dicts], "census": {...} | None}``."""

    key: str
    path: Path
    recorded_at: str
    sizes: dict[str, dict[str, Any]]


def entry_path(root: Path, key: str) -> Path:
    return root / f"ab-baseline-ops-{key}.json"


def load(root: Path | None, key: str | None) -> CachedPass | None:
    """The entry for ``key``; None when there is none, or it is unreadable (it is then measured again
    and rewritten: a damaged cache costs a profile pass, never a wrong count)."""
    if root is None or key is None:
        return None
    path = entry_path(root, key)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("schema") != SCHEMA or data.get("schema_version") != SCHEMA_VERSION or data.get("key") != key:
            return None
        sizes = data["sizes"]
        if not isinstance(sizes, dict) or not all(isinstance(v, dict) and isinstance(v.get("counts"), list)
                                                  and isinstance(v.get("census"), (dict, type(None)))
                                                  for v in sizes.values()):
            return None
        return CachedPass(key=key, path=path, recorded_at=str(data["recorded_at"]), sizes=sizes)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def store(root: Path | None, key: str | None, sizes: dict[str, dict[str, Any]], covers: str = "") -> Path | None:
    """Remember a measured pass (best effort: a cache that cannot be written is not an error)."""
    if root is None or key is None:
        return None
    path = entry_path(root, key)
    data = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "key": key, "covers": covers,
            "recorded_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "sizes": sizes}
    try:
        write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
    except OSError:
        return None
    return path
