"""The records that flow run -> verdict -> report -> publish, and results.json, their file form.

results.json (schema ``guard/results``, version 1) is what every later stage reads: ``guard
comment`` and ``guard update-thresholds`` never look at the engine, only at this file.
Seconds inside; milliseconds only in keys that say ``_ms``.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from guard.errors import ConfigError

RESULTS_SCHEMA = "guard/results"
RESULTS_SCHEMA_VERSION = 1
RUN_SCHEMA = "guard/run"  # the run stage's hand-off file (run.json), same versioning

TTFT_DEFINITION = (
    "Client-side TTFT: from just before the request is handed to the in-process vLLM engine "
    "(so image preprocessing, tokenisation and queueing are included) until the engine returns "
    "the request's first output token. The engine's own first_token_latency (from its arrival "
    "timestamp, after input processing) is recorded beside it. Warm-up requests are excluded."
)


class Status:
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"  # TTFT interval straddles the budget (decided on the point estimate)


class Verdict:
    PASS = "pass"
    REGRESSION = "regression"
    INVALID = "invalid"


@dataclass(frozen=True)
class RequestOutcome:
    """One request of the timing pass; failures are data, not exceptions."""

    index: int
    image_size: tuple[int, int]
    warmup: bool
    success: bool
    ttft_client_s: float | None = None
    ttft_engine_s: float | None = None
    prompt_tokens: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class OpSite:
    """A code location that issued operator calls inside a scope."""

    location: str  # "path/to/file.py:123"
    function: str
    op: str
    count: int


@dataclass(frozen=True)
class ScopeCounts:
    """Operator calls attributed to one budgeted scope during one profiled request."""

    scope: str  # the budget's name, e.g. "mask_path"
    image_size: tuple[int, int]
    entered: int  # how many times the scope's function ran; 0 makes the run invalid
    counts: dict[str, int]  # op name -> calls
    total: int  # all operator calls in the scope
    sites: tuple[OpSite, ...] = ()  # where the calls came from, most frequent first
    where: str = ""  # the scope's code path, "file:function" (or "whole request")


@dataclass(frozen=True)
class CheckResult:
    """One budget judged against one measurement."""

    kind: str  # "ttft" | "ops"
    name: str  # "ttft_ms.p50" | "mask_path[640x480].aten::_index_put_impl_"
    budget: float
    measured: float
    status: str  # Status.*
    rule: str = "max"  # ops: "exact" | "max"; ttft: "max"
    unit: str = "ms"  # "ms" | "calls"
    delta_pct: float | None = None  # (measured - budget) / budget; None when budget is 0
    interval: tuple[float, float] | None = None  # ttft: confidence interval of the percentile, ms
    samples: int | None = None
    rounds: int | None = None
    note: str | None = None
    scope: str | None = None
    image_size: tuple[int, int] | None = None


@dataclass
class RunRecord:
    """What the run stage (the pytest suite) hands to evaluation, as run.json."""

    profile: str
    thresholds_path: str
    model: str
    environment: dict[str, Any]
    outcomes: list[RequestOutcome] = field(default_factory=list)
    rounds: int = 0  # timing rounds (1 + resampling rounds)
    op_counts: list[ScopeCounts] = field(default_factory=list)
    invalid_reasons: list[str] = field(default_factory=list)
    benchmark_json: str | None = None
    traces: list[str] = field(default_factory=list)  # compressed Chrome traces, relative to the output dir
    started_at: str | None = None
    duration_s: float | None = None
    injected: str | None = None  # canary injected into the engine (selftest / --inject), if any

    @property
    def measured(self) -> list[RequestOutcome]:
        return [o for o in self.outcomes if not o.warmup]

    def ttft_client_s(self) -> list[float]:
        return [o.ttft_client_s for o in self.measured if o.success and o.ttft_client_s is not None]


@dataclass
class Results:
    """The verdict with everything needed to explain it: the content of results.json."""

    verdict: str
    exit_code: int
    run: RunRecord
    checks: list[CheckResult]
    invalid_reasons: list[str] = field(default_factory=list)  # non-empty <=> verdict is invalid
    notices: list[str] = field(default_factory=list)  # e.g. stale budgets; never change the verdict
    guard_version: str = ""
    ttft_definition: str = TTFT_DEFINITION
    profile_config: dict[str, Any] = field(default_factory=dict)  # engine, workload, statistics used

    @property
    def failed(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status == Status.FAIL]


# ----------------------------------------------------------------------------- JSON
def _tupled(d: dict[str, Any], *keys: str) -> dict[str, Any]:
    for k in keys:
        if d.get(k) is not None:
            d[k] = tuple(d[k])
    return d


def _json_interval(check: dict[str, Any]) -> dict[str, Any]:
    """Strict JSON has no Infinity: an interval side that does not exist at this sample count
    is written as null (read back as -inf / inf)."""
    if check.get("interval") is not None:
        check["interval"] = [None if math.isinf(x) else x for x in check["interval"]]
    return check


def _interval_from_json(check: dict[str, Any]) -> dict[str, Any]:
    if check.get("interval") is not None:
        lo, hi = check["interval"]
        check["interval"] = (-math.inf if lo is None else lo, math.inf if hi is None else hi)
    return check


def run_to_dict(run: RunRecord) -> dict[str, Any]:
    return {"schema": RUN_SCHEMA, "schema_version": RESULTS_SCHEMA_VERSION, **asdict(run)}


def run_from_dict(d: dict[str, Any]) -> RunRecord:
    d = {k: v for k, v in d.items() if k not in ("schema", "schema_version")}
    d["outcomes"] = [RequestOutcome(**_tupled(o, "image_size")) for o in d.get("outcomes", [])]
    d["op_counts"] = [
        ScopeCounts(**{**_tupled(c, "image_size"), "sites": tuple(OpSite(**s) for s in c.get("sites", ()))})
        for c in d.get("op_counts", [])
    ]
    return RunRecord(**d)


def results_to_dict(res: Results) -> dict[str, Any]:
    client = res.run.ttft_client_s()
    engine = [o.ttft_engine_s for o in res.run.measured if o.success and o.ttft_engine_s is not None]
    return {
        "schema": RESULTS_SCHEMA,
        "schema_version": RESULTS_SCHEMA_VERSION,
        "guard_version": res.guard_version,
        "verdict": res.verdict,
        "exit_code": res.exit_code,
        "model": res.run.model,
        "profile": res.run.profile,
        "profile_config": res.profile_config,
        "thresholds_file": res.run.thresholds_path,
        "ttft_definition": res.ttft_definition,
        "checks": [_json_interval(asdict(c)) for c in res.checks],
        "notices": res.notices,
        "invalid_reasons": res.invalid_reasons,
        "samples": {"ttft_client_s": client, "ttft_engine_s": engine},
        "run": asdict(res.run),
        "environment": res.run.environment,
        "artifacts": {"benchmark_json": res.run.benchmark_json, "traces": res.run.traces},
    }


def results_from_dict(d: dict[str, Any]) -> Results:
    return Results(
        verdict=d["verdict"],
        exit_code=d["exit_code"],
        run=run_from_dict(d["run"]),
        checks=[CheckResult(**_tupled(_interval_from_json(dict(c)), "image_size")) for c in d["checks"]],
        invalid_reasons=list(d.get("invalid_reasons", [])),
        notices=list(d.get("notices", [])),
        guard_version=d.get("guard_version", ""),
        ttft_definition=d.get("ttft_definition", TTFT_DEFINITION),
        profile_config=d.get("profile_config", {}),
    )


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Temp file in the same folder, then rename: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=False, allow_nan=False)
            f.write("\n")
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def read_json(path: Path, schema: str) -> dict[str, Any]:
    """Read a guard JSON file, checking its schema name and version (ConfigError, exit 2)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(str(path), None, "(file)", "no such file", hint="run `guard check` first") from None
    except IsADirectoryError:
        raise ConfigError(str(path), None, "(file)", "is a directory, not a JSON file") from None
    except OSError as exc:
        raise ConfigError(str(path), None, "(file)", f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), None, "(file)", f"not UTF-8 text (byte {exc.start}): a binary file?") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(str(path), exc.lineno, "(syntax)", f"not valid JSON: {exc.msg}") from None
    except RecursionError:
        raise ConfigError(str(path), None, "(syntax)", "nested too deeply to be a guard file") from None
    except ValueError as exc:  # e.g. an integer literal with more digits than Python converts
        raise ConfigError(str(path), None, "(syntax)", f"not usable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(str(path), None, "(content)", f"expected a JSON object, got {type(data).__name__}")
    if data.get("schema") != schema:
        raise ConfigError(str(path), None, "schema", f"not a {schema} file")
    if data.get("schema_version") != RESULTS_SCHEMA_VERSION:
        raise ConfigError(str(path), None, "schema_version",
                          f"unknown schema version {data.get('schema_version')!r}; this guard reads {RESULTS_SCHEMA_VERSION}")
    return data


def load_results(path: Path) -> Results:
    data = read_json(path, RESULTS_SCHEMA)
    try:
        return results_from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(str(path), None, "(content)", f"malformed results: {type(exc).__name__}: {exc}") from None
