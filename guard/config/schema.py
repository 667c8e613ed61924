"""The budget file's format, declared once: per section, each key's value type, whether it is
required, its default and what it means.

The loader (guard.config.loading) reads a file by these tables; ``json_schema()`` turns the same
tables into the JSON Schema shipped as guard/config/budgets.schema.json (``guard schema --write``),
so an editor checks a budget file as it is typed and can never disagree with guard about a key's
type or whether it exists. A value type pairs the reader of one kind of value with that value's
JSON Schema. What ties one key to another (a fallback dtype only beside bfloat16, the two GPU shares
below 1) is the section's ``build``, which only the loader runs.
"""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path
from typing import Any

import yaml

from guard.config.budgets import (
    CPU_ISA_EXTENSIONS, DEFAULT_HEADROOM_PCT, DEFAULT_MIXES, DEFAULT_ROOTS, DEFAULT_WATCH, EMBEDDED_PREFIX,
    ENGINE_MODES, MAX_IMAGE_SIDE, MAX_OUTPUT_TOKENS, PERCENTILE_RE, SCHEMA_VERSION, ABSettings, CensusRule, EngineArgs,
    Match, OpBudget, RequestMix, Scope, ScopeBudget, ScopeKind, Statistics, TtftHardware, Validity, Workload,
)
from guard.config.declarations import Section, ValueType, integer, later, map_of, number, optional, required
from guard.config.yamlread import MAX_INT, Fields, YamlReader
from guard.model.records import Rule

SCHEMA_FILE = Path(__file__).with_name("budgets.schema.json")


# ----------------------------------------------------------------------------- value types
def _fraction(r: YamlReader, node: yaml.Node, key: str) -> float:
    v = r.number(node, key)
    if not 0 < v <= 1:
        raise r.error(node, key, f"must be a fraction in (0, 1], got {v}", "a fraction of the GPU's memory, e.g. 0.85")
    return v


def _confidence(r: YamlReader, node: yaml.Node, key: str) -> float:
    conf = r.number(node, key)
    if not 0.5 <= conf < 1.0:
        raise r.error(node, key, f"must be in [0.5, 1), got {conf}")
    return conf


def _machine_share_pct(r: YamlReader, node: yaml.Node, key: str) -> float:
    pct = r.number(node, key, minimum=0.0)
    if pct > 100:
        raise r.error(node, key, f"a share of the machine's CPU time, 0-100, got {pct:g}", hint="100 turns the gate off")
    return pct


BOOLEAN = ValueType(YamlReader.boolean, {"type": "boolean"})
STRING = ValueType(YamlReader.string, {"type": "string", "minLength": 1})
# The text as written or null: a revision of digits stays a string in guard (the reader), and
# editors read YAML 1.2, where `revision: 0755` is a number, so the schema admits one too.
RAW = ValueType(YamlReader.raw, {"type": ["string", "integer", "number", "null"]})
REGEX = ValueType(YamlReader.regex, {"type": "string", "minLength": 1, "format": "regex"})
STRINGS_OR_NONE = ValueType(lambda r, n, k: r.strings(n, k, allow_empty=True),
                            {"type": "array", "items": {"type": "string", "minLength": 1}})
FRACTION = ValueType(_fraction, {"type": "number", "exclusiveMinimum": 0, "maximum": 1})
CONFIDENCE = ValueType(_confidence, {"type": "number", "minimum": 0.5, "exclusiveMaximum": 1})
MACHINE_SHARE_PCT = ValueType(_machine_share_pct, {"type": "number", "minimum": 0, "maximum": 100})
ENGINE_MODE = ValueType(lambda r, n, k: r.choice(n, k, ENGINE_MODES, "engine mode"),
                        {"type": "string", "enum": list(ENGINE_MODES)})
PATH_BESIDE = ValueType(lambda r, n, k: _beside(r, Path(r.string(n, k))), {"type": "string", "minLength": 1})


def _beside(r: YamlReader, path: Path) -> Path:
    """A file named relative to the budget file's folder (or absolute)."""
    return path if path.is_absolute() else r.path.parent / path


def _sizes(r: YamlReader, node: yaml.Node, key: str) -> tuple[tuple[int, int], ...]:
    if not isinstance(node, yaml.SequenceNode) or not node.value:
        raise r.error(node, key, "expected a non-empty list of [width, height]")
    sizes = []
    for i, item in enumerate(node.value):
        k = f"{key}[{i}]"
        if not isinstance(item, yaml.SequenceNode) or len(item.value) != 2:
            raise r.error(item, k, "expected [width, height]")
        size = (r.integer(item.value[0], k, minimum=16), r.integer(item.value[1], k, minimum=16))
        if max(size) > MAX_IMAGE_SIDE:
            raise r.error(item, k, f"{size[0]}x{size[1]}: a side over {MAX_IMAGE_SIDE} pixels",
                          "guard draws each image in memory before the request (100000x100000 is 30 GB); "
                          "vision towers resize to far less")
        sizes.append(size)
    return tuple(sizes)


_SIDE = {"type": "integer", "minimum": 16, "maximum": MAX_IMAGE_SIDE}
SIZES = ValueType(_sizes, {"type": "array", "minItems": 1, "items": {
    "type": "array", "prefixItems": [_SIDE, _SIDE], "minItems": 2, "maxItems": 2, "description": "[width, height] in pixels"}})


def _core_count(r: YamlReader, node: yaml.Node, key: str) -> tuple[int, int]:
    """``2`` or an inclusive range ``[2, 4]``."""
    if not isinstance(node, yaml.SequenceNode):
        n = r.integer(node, key, minimum=1)
        return (n, n)
    if len(node.value) != 2:
        raise r.error(node, key, "expected a core count or a range [min, max]")
    lo, hi = (r.integer(n, key, minimum=1) for n in node.value)
    if lo > hi:
        raise r.error(node, key, f"empty range [{lo}, {hi}]: min is above max")
    return (lo, hi)


_COUNT = {"type": "integer", "minimum": 1, "maximum": MAX_INT}
CORE_COUNT = ValueType(_core_count, {"oneOf": [_COUNT, {"type": "array", "prefixItems": [_COUNT, _COUNT],
                                                        "minItems": 2, "maxItems": 2}]})


def _cpu_extensions(r: YamlReader, node: yaml.Node, key: str) -> tuple[str, ...]:
    """Some of CPU_ISA_EXTENSIONS, in that order."""
    isa = r.strings(node, key, allow_empty=True)
    for i, ext in enumerate(isa):
        if ext not in CPU_ISA_EXTENSIONS:
            raise r.error(node.value[i], f"{key}[{i}]", f"unknown CPU extension {ext!r}",
                          hint=f"list those of {', '.join(CPU_ISA_EXTENSIONS)} the CPU has, as /proc/cpuinfo names them")
    return tuple(e for e in CPU_ISA_EXTENSIONS if e in isa)


CPU_EXTENSIONS = ValueType(_cpu_extensions, {"type": "array", "items": {"enum": list(CPU_ISA_EXTENSIONS)}})


def percentiles(allow_zero: bool = False) -> ValueType:
    """``{p50: 1200, p90: ...}``: each percentile once, a budget above 0 (at least 0 for a slowdown)."""
    def read(r: YamlReader, node: yaml.Node, key: str) -> dict[str, float]:
        out = {}
        seen: dict[float, str] = {}
        for name, (knode, vnode) in r.mapping(node, key, None).items():
            m = PERCENTILE_RE.match(name)
            if not m or not 0 < float(m.group(1)) < 100:
                raise r.error(knode, f"{key}.{name}", "unknown percentile",
                              "use p<N> with 0 < N < 100, e.g. p50, p90, p99, p99.9")
            q = float(m.group(1))
            if q in seen:
                raise r.error(knode, f"{key}.{name}", f"the same percentile as `{seen[q]}`", "budget each percentile once")
            seen[q] = name
            out[name] = r.number(vnode, f"{key}.{name}", minimum=0.0) if allow_zero \
                else r.number(vnode, f"{key}.{name}", positive=True)
        if not out:
            raise r.error(node, key, "empty: give at least one percentile, e.g. p50")
        return out
    value = {"type": "number", "minimum": 0} if allow_zero else {"type": "number", "exclusiveMinimum": 0}
    # p<N> with 0 < N < 100: one or two digits, a fraction, not all zeros (PERCENTILE_RE and the range)
    return ValueType(read, {"type": "object", "minProperties": 1,
                            "propertyNames": {"pattern": r"^p(?!0*(\.0+)?$)[0-9]{1,2}(\.[0-9]+)?$"},
                            "additionalProperties": value})


def _package_roots(r: YamlReader, node: yaml.Node, key: str) -> tuple[str, ...]:
    roots = r.strings(node, key)
    for i, root in enumerate(roots):
        if root.startswith("/") or ".." in root.split("/"):
            raise r.error(node.value[i], f"{key}[{i}]",
                          f"expected a package path relative to site-packages (e.g. vllm), got {root!r}")
    return roots


PACKAGE_ROOTS = ValueType(_package_roots, {"type": "array", "minItems": 1, "items": {
    "type": "string", "minLength": 1, "pattern": r"^(?!/)(?!(.*/)?\.\.(/|$))"}})


def _exclusions(r: YamlReader, node: yaml.Node, key: str) -> dict[str, str]:
    """``{"file:function": reason}``, the reason required."""
    out = {}
    for fn, (knode, vnode) in r.mapping(node, key, None).items():
        if ":" not in fn:
            raise r.error(knode, f"{key}.{fn}", "expected a function as file:qualname",
                          hint="copy the name from the census diff, e.g. vllm/v1/worker/x.py:Runner.step")
        out[fn] = r.string(vnode, f"{key}.{fn}")
    return out


EXCLUSIONS = ValueType(_exclusions, {"type": "object", "propertyNames": {"pattern": ":"},
                                     "additionalProperties": {"type": "string", "minLength": 1,
                                                              "description": "why this function is not judged"}})


def _provenance(r: YamlReader, node: yaml.Node, key: str) -> dict[str, Any]:
    """A flat mapping of single values; free-form keys (update-thresholds writes its own set)."""
    out = {}
    for name, (_, vnode) in r.mapping(node, key, None).items():
        value = r.scalar(vnode, f"{key}.{name}")
        # An unquoted `date: 2025-01-01` loads as a date; keep every value a plain JSON-able scalar.
        if isinstance(value, (datetime.date, datetime.datetime)):
            value = value.isoformat()
        if not isinstance(value, (str, int, float, bool, type(None))):
            raise r.error(vnode, f"{key}.{name}", f"expected a string, number, true/false or null, got {value!r}")
        out[name] = value
    return out


PROVENANCE = ValueType(_provenance, {"type": "object", "additionalProperties": {
    "type": ["string", "number", "boolean", "null"]}})


# ----------------------------------------------------------------------------- builds
def _match(r: YamlReader, key: str, f: Fields) -> Match:
    if "gpu_name_regex" in f and not f["cuda"]:
        raise r.error(f.nodes["gpu_name_regex"][1], f"{key}.gpu_name_regex", "only meaningful with cuda: true")
    return Match(**f.values)


def _engine(r: YamlReader, key: str, f: Fields) -> EngineArgs:
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
    revision = f["revision"]
    return EngineArgs(**{**f.values, "model": model, "revision": None if revision in (None, "") else str(revision)})


def _workload(r: YamlReader, key: str, f: Fields) -> Workload:
    return Workload(**{**f.values, "profile_image_sizes": f["profile_image_sizes"] or f["image_sizes"]})


MIX_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,39}$")  # a census baseline key and a report cell


def _mix(r: YamlReader, key: str, f: Fields) -> dict[str, Any]:
    """One mix's settings, checked against each other the way vLLM's SamplingParams would refuse them."""
    random_only = [k for k in ("top_k", "top_p", "seed") if f[k] is not None]
    if random_only and f["temperature"] == 0:
        name = random_only[0]
        raise r.error(f.nodes[name][0], f"{key}.{name}", "only meaningful with temperature > 0 (greedy sampling "
                      "ignores it)", hint="set temperature, e.g. 1.0")
    if f["min_tokens"] > f["output_tokens"]:
        raise r.error(f.nodes["min_tokens"][1], f"{key}.min_tokens",
                      f"{f['min_tokens']} is more than output_tokens ({f['output_tokens']})")
    return f.values


def _mixes(r: YamlReader, node: yaml.Node, key: str) -> tuple[RequestMix, ...]:
    """``{name: {settings}}``; ``{}``: no decode census."""
    out = []
    for name, (knode, vnode) in r.mapping(node, key, None).items():
        if not MIX_NAME_RE.match(name):
            raise r.error(knode, f"{key}.{name}", "expected a name of lower-case letters, digits, '.', '_' or '-' "
                          "(at most 40)", hint="e.g. seeded, random-topk-topp")
        values = PROFILE_MIX.read(r, vnode, f"{key}.{name}")
        out.append(RequestMix(name=name, **{**values, "stop": tuple(values["stop"])}))
    return tuple(out)


def _ttft_hardware(r: YamlReader, key: str, f: Fields) -> TtftHardware:
    if not f.nodes:
        raise r.error(f.node, key, "empty: give cpu_model_regex, cpu_count, cpu_isa and/or speed_reference_ms")
    return TtftHardware(**f.values, line=f.line())


def _gpu_shares(r: YamlReader, key: str, f: Fields) -> dict[str, float]:
    shares = {side: share for side, share in f.values.items() if share is not None}
    if sum(shares.values()) > 1.0:
        raise r.error(f.node, key, f"the two engines share one GPU: candidate + baseline = {sum(shares.values()):g} > 1")
    return shares


def _ab(r: YamlReader, key: str, f: Fields) -> ABSettings:
    conf, fail = f["confidence"], f["fail_confidence"]
    if conf is not None and fail is not None and fail < conf:
        raise r.error(f.nodes["fail_confidence"][1], f"{key}.fail_confidence",
                      f"must be at least ab.confidence ({conf:g}), got {fail:g}",
                      hint="it is the stricter level a failing look needs")
    shares = f["gpu_memory_utilization"]
    return ABSettings(candidate_gpu_memory_utilization=shares.get("candidate"),
                      baseline_gpu_memory_utilization=shares.get("baseline"), batch=f["batch"], confidence=conf,
                      fail_confidence=fail)


def _census(r: YamlReader, key: str, f: Fields) -> CensusRule:
    return CensusRule(**f.values, line=f.line())


def _scope(r: YamlReader, node: yaml.Node, key: str) -> Scope:
    if isinstance(node, yaml.ScalarNode):
        if r.scalar(node, key) != "request":
            raise r.error(node, key, "unknown scope form",
                          "use `scope: request` or `scope: {file: path/to/file.py, function: name}`")
        return Scope(kind=ScopeKind.REQUEST)
    return Scope(kind=ScopeKind.FUNCTION, **r.fields(node, key, SCOPE.keys).values)


def _op_budget(r: YamlReader, node: yaml.Node, key: str) -> OpBudget:
    m = r.mapping(node, key, OP_BUDGET.keys)
    if len(m) != 1:
        raise r.error(node, key, "give exactly one of `exact: N` or `max: N`")
    (rule, (_, vnode)), = m.items()
    return OpBudget(rule=Rule(rule), count=r.integer(vnode, f"{key}.{rule}", minimum=0), line=vnode.start_mark.line + 1)


def _scope_budget(r: YamlReader, key: str, f: Fields) -> dict[str, Any]:
    if not f["ops"] and f["total_ops"] is None:
        raise r.error(f.node, key, "a scope needs `ops` and/or `total_ops`")
    return f.values


def _scope_budgets(r: YamlReader, node: yaml.Node, key: str) -> tuple[ScopeBudget, ...]:
    return tuple(ScopeBudget(name=name, **values) for name, values in SCOPE_BUDGETS.read(r, node, key).items())


# ----------------------------------------------------------------------------- tables
MATCH = Section({
    "cuda": required(BOOLEAN, "true: the machine needs a CUDA GPU; false: only a machine without one"),
    "gpu_name_regex": optional(REGEX, doc="searched in the GPU's name (torch.cuda.get_device_name); only with cuda: true"),
}, build=_match, json_extra={"dependentSchemas": {"gpu_name_regex": {"properties": {"cuda": {"const": True}}}}})
ENGINE = Section({
    "model": required(STRING, "a Hugging Face id, a path (relative to this file), or guard:NAME for a checkpoint "
                              "shipped with guard"),
    "revision": optional(RAW, doc="the model's commit (or a branch guard pins to a commit for each run)"),
    "load_format": optional(STRING, "auto", "vLLM's load_format (dummy: random weights)"),
    "dtype": optional(STRING, "auto", "vLLM's dtype"),
    "max_model_len": required(integer(1), "vLLM's max_model_len"),
    "enforce_eager": optional(BOOLEAN, False, "vLLM's enforce_eager"),
    "enable_prefix_caching": optional(BOOLEAN, False, "vLLM's enable_prefix_caching"),
    "mm_processor_cache_gb": optional(number(minimum=0.0), 0.0, "vLLM's mm_processor_cache_gb"),
    "cpu_kvcache_space_gb": optional(integer(1), doc="the CPU engine's KV cache, GiB (VLLM_CPU_KVCACHE_SPACE)"),
    "max_num_batched_tokens": optional(integer(1), doc="vLLM's max_num_batched_tokens (default: vLLM's)"),
    "gpu_memory_utilization": optional(FRACTION, doc="the share of GPU memory vLLM may take"),
    "mode": optional(ENGINE_MODE, "in-process", "how TTFT is measured: the in-process engine or a `vllm serve`"),
    "retain_freed_memory": optional(BOOLEAN, False, "keep memory the engine frees in its process (docs/ab.md)"),
    "skip_mm_profiling": optional(BOOLEAN, False, "skip vLLM's start-up pass over the largest multimodal batch"),
    "dtype_without_native_bf16": optional(ValueType(YamlReader.string, {"const": "float32"}), doc="float32: the dtype a bfloat16 engine runs on a CPU "
                                                      "without native bf16"),
    "requires_native_bf16": optional(BOOLEAN, False, "the model cannot run without native bf16: such a CPU "
                                                     "does not fit the profile"),
}, build=_engine, json_extra={"allOf": [
    {"dependentSchemas": {"dtype_without_native_bf16": {"required": ["dtype"], "properties": {"dtype": {"const": "bfloat16"}}}}},
    {"if": {"properties": {"requires_native_bf16": {"const": True}}, "required": ["requires_native_bf16"]},
     "then": {"required": ["dtype"], "properties": {"dtype": {"const": "bfloat16"}},
              "not": {"required": ["dtype_without_native_bf16"]}}},
]})
def integer_between(lo: int, hi: int, hint: str) -> ValueType:
    def read(r: YamlReader, node: yaml.Node, key: str) -> int:
        n = r.integer(node, key, minimum=lo)
        if n > hi:
            raise r.error(node, key, f"{n} is more than {hi}", hint=hint)
        return n
    return ValueType(read, {"type": "integer", "minimum": lo, "maximum": hi})


PROFILE_MIX = Section({
    "output_tokens": optional(integer_between(2, MAX_OUTPUT_TOKENS, "every decode step is profiled: a few show the "
                                              "calls a step makes"), RequestMix.output_tokens,
                              "tokens generated (end of sequence ignored): one prefill step, the rest decode steps"),
    "images": optional(integer_between(0, 1, "a mix sends no image or one"), RequestMix.images, "0: a short text prompt; 1: the workload's prompt and first profile image size"),
    "temperature": optional(number(minimum=0.0), RequestMix.temperature, "0: greedy"),
    "top_k": optional(integer(1), doc="sample among the k most likely tokens"),
    "top_p": optional(FRACTION, doc="sample within this probability mass"),
    "seed": optional(integer(0), doc="a per-request seed: vLLM's seeded sampling path"),
    "repetition_penalty": optional(number(positive=True), doc="vLLM's repetition_penalty"),
    "frequency_penalty": optional(number(minimum=-2.0), doc="vLLM's frequency_penalty"),
    "presence_penalty": optional(number(minimum=-2.0), doc="vLLM's presence_penalty"),
    "logprobs": optional(integer(0), doc="log probabilities returned per output token"),
    "min_tokens": optional(integer(0), RequestMix.min_tokens, "tokens before a stop may end the request"),
    "stop": optional(STRINGS_OR_NONE, (), "stop strings (checked on the detokenised text)"),
}, build=_mix, json_extra={  # top_k, top_p and seed only with temperature > 0 (_mix)
    "if": {"not": {"required": ["temperature"], "properties": {"temperature": {"exclusiveMinimum": 0}}}},
    "then": {"not": {"anyOf": [{"required": [k]} for k in ("top_k", "top_p", "seed")]}}})
MIXES = ValueType(_mixes, map_of(PROFILE_MIX.type).json
                  | {"propertyNames": {"pattern": MIX_NAME_RE.pattern}})
WORKLOAD = Section({
    "requests": required(integer(1), "measured requests"),
    "warmup_requests": optional(integer(0), 1, "requests before the measured ones, not timed"),
    "concurrency": optional(integer(1), 1, "requests in flight at once"),
    "image_sizes": required(SIZES, "the images of the timed requests, [width, height] each, in turn"),
    "profile_image_sizes": optional(SIZES, doc="one profiled request per size for the op counts (default: image_sizes)"),
    "prompt": required(STRING, "the text beside the image"),
    "max_tokens": optional(integer(1), 1, "tokens generated per request"),
    "seed": optional(integer(0), 0, "seed of the images and the engine"),
    "profile_mixes": optional(MIXES, DEFAULT_MIXES, "request mixes profiled for the decode census, name -> sampling "
                              "parameters and output length; {}: none (default: "
                              + ", ".join(m.name for m in DEFAULT_MIXES) + ")"),
}, build=_workload)
STATISTICS = Section({
    "confidence": optional(CONFIDENCE, Statistics.confidence, "the confidence a TTFT percentile is judged at"),
    "max_requests": optional(integer(1), doc="the cap when an inconclusive check resamples (none: no resampling)"),
    "batch": optional(integer(1), Statistics.batch, "extra requests per resampling round"),
}, record=Statistics)
VALIDITY = Section({
    "max_other_cpu_pct": optional(MACHINE_SHARE_PCT, Validity.max_other_cpu_pct,
                                  "the share of CPU time other processes may take while TTFT is measured"),
    "max_slowdown_pct": optional(number(minimum=0.0), Validity.max_slowdown_pct,
                                 "how much slower than the budget's machine a run may be before a TTFT failure "
                                 "is the machine's"),
}, record=Validity)
TTFT_HARDWARE = Section({
    "cpu_model_regex": optional(REGEX, doc="searched in /proc/cpuinfo's model name"),
    "cpu_count": optional(CORE_COUNT, doc="cores, or an inclusive range [min, max]"),
    "cpu_isa": optional(CPU_EXTENSIONS, doc=f"exactly which of {', '.join(CPU_ISA_EXTENSIONS)} the CPU has"),
    "speed_reference_ms": optional(number(positive=True), doc="guard's speed reference on that machine, ms"),
}, build=_ttft_hardware, json_extra={"minProperties": 1})
GPU_SHARES = Section({
    "candidate": optional(FRACTION, doc="the candidate engine's gpu_memory_utilization"),
    "baseline": optional(FRACTION, doc="the baseline engine's gpu_memory_utilization"),
}, build=_gpu_shares)
AB = Section({
    "gpu_memory_utilization": optional(GPU_SHARES.type, {}, "both engines share one GPU: each side's share"),
    "batch": optional(integer(1), doc="pairs per resampling round (default: statistics.batch)"),
    "confidence": optional(CONFIDENCE, doc="the ratio interval's confidence at each look (default: statistics.confidence)"),
    "fail_confidence": optional(CONFIDENCE, doc="the stricter level a failing look needs (default: ab.confidence)"),
}, build=_ab)
CENSUS = Section({
    "baseline": required(PATH_BESIDE, "the committed census, relative to this file"),
    "baseline_without_native_bf16": optional(PATH_BESIDE, doc="the census where the engine runs "
                                                              "dtype_without_native_bf16"),
    "baseline_with_amx": optional(PATH_BESIDE, doc="the census on a CPU with AMX"),
    "max_growth_pct": optional(number(minimum=0.0), CensusRule.max_growth_pct, "allowed growth of a function's calls, %"),
    "min_growth_calls": optional(integer(0), CensusRule.min_growth_calls, "growth below this many calls always passes"),
    "new_function_max_calls": optional(integer(0), CensusRule.new_function_max_calls,
                                       "a new function with more calls than this fails"),
    "watch": optional(STRINGS_OR_NONE, DEFAULT_WATCH, "ops whose growth fails a function whatever the floors (host syncs, index writes, copies to the GPU)"),
    "roots": optional(PACKAGE_ROOTS, DEFAULT_ROOTS, "packages whose functions are counted, relative to site-packages"),
    "exclude": optional(EXCLUSIONS, {}, "file:function -> why it is not judged"),
}, build=_census)
SCOPE = Section({"file": required(STRING, "a path ending, matched in each op's Python stack"),
                 "function": required(STRING, "the function's name in that file")})
SCOPE_TYPE = ValueType(_scope, {"oneOf": [{"const": "request"}, SCOPE.json()],
                                "description": "`request` (every op of the request) or {file, function}"})
OP_BUDGET = Section({"exact": optional(integer(0), doc="the count must be exactly this"),
                     "max": optional(integer(0), doc="the count may be at most this")},
                    json_extra={"minProperties": 1, "maxProperties": 1})
OP_BUDGET_TYPE = ValueType(_op_budget, OP_BUDGET.json())
SCOPE_BUDGET = Section({
    "scope": required(SCOPE_TYPE),
    "ops": optional(map_of(OP_BUDGET_TYPE), {}, "op name (aten::..., cuda::...) -> its budget"),
    "total_ops": optional(OP_BUDGET_TYPE, doc="every op call in the scope together"),
}, build=_scope_budget, json_extra={"anyOf": [{"required": ["ops"]}, {"required": ["total_ops"]}]})
SCOPE_BUDGETS = map_of(SCOPE_BUDGET.type)  # name -> scope budget, read as ScopeBudget records by _scope_budgets
TOKEN_BUDGET_KEYS = ("tpot_ms", "itl_ms", "tpot_vs_baseline_pct")
TPOT_DOC = "percentile -> time per output token budget, ms (needs workload.max_tokens >= 2)"
ITL_DOC = "percentile -> inter-token latency budget, ms (needs workload.max_tokens >= 2)"
MODE_BUDGETS = Section({"ttft_ms": required(percentiles(), "percentile -> TTFT budget, ms"),
                        "tpot_ms": optional(percentiles(), {}, TPOT_DOC),
                        "itl_ms": optional(percentiles(), {}, ITL_DOC)})


def _engine_modes(r: YamlReader, node: yaml.Node, key: str) -> dict[str, dict[str, dict[str, float]]]:
    """``modes: {server: {ttft_ms: {...}, tpot_ms: {...}}}``: latency budgets per other engine mode,
    mode -> ``"ttft_ms"``/``"tpot_ms"``/``"itl_ms"`` -> percentile -> ms."""
    out = {}
    for mode, (knode, vnode) in r.mapping(node, key, None).items():
        if mode not in ENGINE_MODES:
            raise r.error(knode, f"{key}.{mode}", "unknown engine mode", f"use one of: {', '.join(ENGINE_MODES)}")
        f = r.fields(vnode, f"{key}.{mode}", MODE_BUDGETS.keys)
        out[mode] = {k: f[k] for k in MODE_BUDGETS.keys}
    return out


BUDGETS = Section({
    "ttft_ms": optional(percentiles(), {}, "percentile (p50, p90, ...) -> TTFT budget, ms"),
    "tpot_ms": optional(percentiles(), {}, TPOT_DOC),
    "itl_ms": optional(percentiles(), {}, ITL_DOC),
    "ttft_hardware": optional(TTFT_HARDWARE.type, doc="the machine the TTFT (and TPOT, ITL) budgets were measured "
                                                      "on; elsewhere they are shown, not judged"),
    "ops": optional(ValueType(_scope_budgets, SCOPE_BUDGETS.json), (), "named code paths and their op budgets"),
    "modes": optional(ValueType(_engine_modes, {**map_of(MODE_BUDGETS.type).json, "propertyNames": {"enum": list(ENGINE_MODES)}}),
                      {}, "latency budgets for the other engine mode"),
    "ttft_vs_baseline_pct": optional(percentiles(allow_zero=True), {}, "A/B: allowed slowdown against the baseline, %"),
    "tpot_vs_baseline_pct": optional(percentiles(allow_zero=True), {}, "A/B: allowed slowdown of a request's time per "
                                     "output token against the baseline's, % (needs workload.max_tokens >= 2)"),
    "census": optional(CENSUS.type, doc="every function's op calls judged against a committed census"),
}, json_extra={"anyOf": [{"required": [k]} for k in ("ttft_ms", "tpot_ms", "itl_ms", "ops", "ttft_vs_baseline_pct",
                                                     "tpot_vs_baseline_pct", "census")],
                "dependentRequired": {"ttft_hardware": ["ttft_ms"]}})
PROFILE = Section({
    "match": required(MATCH.type, "how the profile recognises its machine"),
    "engine": required(ENGINE.type, "the vLLM engine as it is started"),
    "workload": required(WORKLOAD.type, "the requests sent"),
    "statistics": optional(STATISTICS.type, Statistics(), "how TTFT percentiles are judged under noise"),
    "validity": optional(VALIDITY.type, Validity(), "when a run is too disturbed to judge TTFT on"),
    "headroom_pct": optional(number(minimum=0.0), DEFAULT_HEADROOM_PCT, "update-thresholds' headroom over a "
                                                                         "measured TTFT, %"),
    "budgets": required(later(BUDGETS), "the budgets; at least one of ttft_ms, tpot_ms, itl_ms, ttft_vs_baseline_pct, tpot_vs_baseline_pct, ops, census"),
    "provenance": optional(PROVENANCE, {}, "where the budgets came from (written by update-thresholds)"),
    "ab": optional(AB.type, ABSettings(), "A/B mode: how the two engines share the machine"),
}, json_extra={"allOf": [
    # request mixes feed the decode census, which the census rule judges (config.loading)
    {"if": {"required": ["workload"], "properties": {"workload": {"required": ["profile_mixes"]}}},
     "then": {"properties": {"budgets": {"required": ["census"]}}}},
    # TPOT and ITL need a second token (config.loading): their budgets, here or in any mode, need max_tokens >= 2
    {"if": {"required": ["budgets"], "properties": {"budgets": {"anyOf": [
        *({"required": [k]} for k in TOKEN_BUDGET_KEYS),
        {"required": ["modes"], "properties": {"modes": {"not": {"additionalProperties": {
            "not": {"anyOf": [{"required": [k]} for k in TOKEN_BUDGET_KEYS]}}}}}}]}}},
     "then": {"required": ["workload"], "properties": {"workload": {
         "required": ["max_tokens"], "properties": {"max_tokens": {"minimum": 2}}}}}}]})
TOP = Section({
    "schema_version": required(ValueType(YamlReader.integer, {"const": SCHEMA_VERSION}), "the budget file's format"),
    "model": required(STRING, "the model the budgets are for"),
    "profiles": required(ValueType(YamlReader.node, map_of(PROFILE.type, minimum=1).json),
                         "hardware profile name (cpu, a10, ...) -> its engine, workload and budgets"),
})


def json_schema() -> dict[str, Any]:
    """The budget file's JSON Schema (draft 2020-12), from the tables above."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "guard budget file",
            "description": "Performance budgets for one vLLM model, per hardware profile (docs/budgets.md).",
            **TOP.json()}


def render() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=False) + "\n"
