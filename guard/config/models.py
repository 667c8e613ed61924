"""The guarded models: one budget file each, ``thresholds/<name>.yaml``, and the code they share.

``--model NAME`` picks ``thresholds/<NAME>.yaml`` (``all``: every one, in the order of ``names``).
A name is matrix-safe: letters, digits and dashes only, since it becomes an output folder
(``OUTPUT/<name>/``), a CI matrix entry and a commit status context (``guard/<name>/<profile>``). The
dotted spellings people type (``qwen2.5-vl``) are accepted and mean the dashed file.

Shared code: every vLLM file a request of any model runs through, i.e. everything under vllm/ but
the model files in ``vllm/model_executor/models/`` (less the helpers there every model uses). A census
finding in shared code is attributed to every model; anywhere else it is the model's own code.
``guard pr`` without ``--model`` judges a pull request that touches shared code on every model, and one
that touches only model files on the models whose census ran those files (docs/model-matrix.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from guard.config.budgets import DEFAULT_THRESHOLDS
from guard.config.loading import packaged_default
from guard.errors import UsageError

ALL = "all"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")

# Model code: the one folder where each architecture has its own files. Everything else under vllm/
# (multimodal processors, the v1 model runner, scheduler, sampler, layers, ...) runs for every model.
MODEL_CODE = "vllm/model_executor/models/"
# The files in that folder that are not one model's but every model's (one list: the report's
# shared/own mark and guard pr's choice of models both read it).
SHARED_IN_MODEL_CODE = (
    "vllm/model_executor/models/utils.py",  # merge_multimodal_embeddings, flatten_bn, ...
    "vllm/model_executor/models/vision.py",  # vision encoder helpers every tower uses
    "vllm/model_executor/models/interfaces.py",
    "vllm/model_executor/models/interfaces_base.py",
    "vllm/model_executor/models/module_mapping.py",
    "vllm/model_executor/models/registry.py",
    "vllm/model_executor/models/__init__.py",
)


def is_shared(path: str) -> bool:
    """``path`` (a file or a census function ``file:qualname``, relative to site-packages or the
    vLLM repository) is shared code: under vllm/ and not one model's file."""
    file = path.split(":", 1)[0]
    return not file.startswith(MODEL_CODE) or file in SHARED_IN_MODEL_CODE


def thresholds_dir() -> Path:
    """``./thresholds`` where guard runs in its checkout; else the copy the wheel carries, or the
    checkout guard is installed from (a workflow runs it from another folder with ``--project``)."""
    here = packaged_default(Path(DEFAULT_THRESHOLDS)).parent
    source = Path(__file__).resolve().parents[2] / "thresholds"
    return here if here.is_dir() or not source.is_dir() else source


def names(folder: Path | None = None) -> list[str]:
    """Every guarded model: the budget files' stems, the default model (deepseek-ocr-2) first."""
    folder = thresholds_dir() if folder is None else folder
    found = sorted(p.stem for p in folder.glob("*.yaml") if NAME_RE.match(p.stem))
    default = Path(DEFAULT_THRESHOLDS).stem
    return [default] * (default in found) + [n for n in found if n != default]


def canonical(name: str) -> str:
    """The matrix-safe spelling of a name a person typed: ``qwen2.5-vl`` -> ``qwen2-5-vl``."""
    return name.strip().lower().replace(".", "-").replace("_", "-")


def resolve(name: str, folder: Path | None = None) -> list[tuple[str, Path]]:
    """``--model NAME|all`` -> [(name, budget file)], or a usage error (exit 2) naming every known model."""
    folder = thresholds_dir() if folder is None else folder
    known = names(folder)
    if canonical(name) == ALL:
        return [(n, folder / f"{n}.yaml") for n in known]
    wanted = canonical(name)
    if wanted not in known:
        raise UsageError(f"--model {name}: no such model (no {folder / (wanted + '.yaml')})",
                         hint=f"known models: {', '.join(known)}, or `all`")
    return [(wanted, folder / f"{wanted}.yaml")]


def model_files(census_baseline: Path) -> set[str]:
    """The files of this model's own code its census ran (not shared code), from a committed baseline.
    A missing or damaged baseline is a ConfigError naming it: read as "no files", the model would
    never be picked and its pull requests would pass unmeasured."""
    from guard.config.census import load_baseline

    files = {fn.split(":", 1)[0] for per_size in load_baseline(census_baseline).census.values() for fn in per_size}
    return {f for f in files if not is_shared(f)}


def models_touched(changed: Iterable[str], own_files: dict[str, set[str]]) -> tuple[list[str], str]:
    """Which models a pull request changing ``changed`` (repository paths) is judged on, and why.

    Shared code changed: every model. Otherwise the models whose own code (``own_files``: per model,
    the files its census ran) a change touches. Nothing under vllm/ that any model runs: none.
    """
    runtime = [f for f in changed if f.startswith("vllm/") and f.endswith(".py")]
    shared = [f for f in runtime if is_shared(f)]
    if shared:
        return list(own_files), f"shared code changed ({', '.join(shared[:3])}{', ...' if len(shared) > 3 else ''})"
    hit = [m for m, files in own_files.items() if any(f in files for f in runtime)]
    if hit:
        touched = sorted({f for f in runtime if any(f in own_files[m] for m in hit)})
        return hit, f"only model code changed ({', '.join(touched[:3])}{', ...' if len(touched) > 3 else ''})"
    return [], "no Python file any guarded model runs changed"


def chosen_for(changed: Iterable[str], folder: Path | None = None) -> tuple[list[str], str]:
    """``--model auto``'s choice for a pull request changing ``changed``: models_touched over every
    guarded model's own files (from its budget file's census baselines), and why."""
    from guard.config.loading import load_thresholds

    own: dict[str, set[str]] = {}
    for name, path in resolve(ALL, folder):
        thresholds = load_thresholds(path)
        own[name] = set().union(*(model_files(p.census.baseline) for p in thresholds.profiles.values()
                                  if p.census is not None))
    return models_touched(changed, own)
