"""The records that flow run -> verdict -> report -> publish.

Their file form is results.json (``guard.model.jsonfiles`` writes and reads it; schema
``guard/results``, ``guard.model.schema``), what every later stage reads: ``guard comment`` and
``guard update-thresholds`` never look at the engine, only at this file. Each fact is written once;
seconds inside, and every number carries its unit in its name (``_s``, ``_ms``, ``_calls``).

This module holds what the run stage records (the requests, op counts, census, invalid reasons:
``RunRecord``, ``ABRecord``) and the words every stage shares (``Status``, ``Verdict``, ``Rule``,
``ReasonKind``, ``Measures``); what the judge found is ``guard.model.checks``, the whole of
results.json ``guard.model.results``, and the one roll-up from checks and invalid reasons to a
verdict ``guard.model.verdict``'s. An invalid reason is typed
the same way (``InvalidReason``: a ``ReasonKind`` for code to filter on, the text for people), never
matched by substring.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from guard.errors import ExitCode
from guard.model.environment import Environment
from guard.model.readings import DecodeCensus, ImageSize

TTFT_DEFINITION = (
    "Client-side TTFT: from just before the request is handed to the in-process vLLM engine "
    "(so image preprocessing, tokenisation and queueing are included) until the engine returns "
    "the request's first output token. The engine's own first_token_latency (from its arrival "
    "timestamp, after input processing) is recorded beside it. Warm-up requests are excluded."
)

TTFT_DEFINITION_SERVER = (
    "Client-side TTFT through `vllm serve`, as `vllm bench serve` (openai-chat backend) measures it: "
    "from just before the streaming POST to /v1/chat/completions until the first streamed message "
    "that carries `choices`. The image travels as a PNG data URL, so decoding, preprocessing, "
    "tokenisation, queueing and the API server are included; time spent waiting for a concurrency "
    "slot is not. Warm-up requests are excluded."
)
ENGINE_MODE_SERVER = "server"

# What the latency budgets measure, in `vllm bench serve`'s names (its ttft_ms, tpot_ms, itl_ms):
TTFT, TPOT, ITL = "ttft", "tpot", "itl"
LATENCY_METRICS = (TTFT, TPOT, ITL)
TOKEN_METRICS = (TPOT, ITL)  # need a request's second token: workload.max_tokens >= 2
TPOT_DEFINITION = (
    "TPOT (time per output token), as `vllm bench serve` defines it: per request, (its end-to-end "
    "latency - its TTFT) / (output tokens - 1), so the decode steps after the first token; one "
    "sample per request. ITL (inter-token latency): every gap between two successive token "
    "arrivals of one request after its first, all requests' gaps pooled. Both by the same clock as TTFT."
)


def to_ms(seconds: float) -> float:
    """Seconds, guard's unit inside, as the milliseconds a ``_ms`` field or a reader sees: the one
    place that multiplies by 1000 (``guard.model.format`` words it, ``seconds_as_ms``)."""
    return seconds * 1000.0


def ttft_definition(engine_mode: str) -> str:
    return TTFT_DEFINITION_SERVER if engine_mode == ENGINE_MODE_SERVER else TTFT_DEFINITION


TOTAL_OPS = "total_ops"  # OpCheck.op for the cap on all operator calls in a scope


class Status(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"  # TTFT interval straddles the budget; passes on the point estimate
    NOT_JUDGED = "not_judged"  # measured and shown, but this run cannot judge it (never fails, never proves)
    NOT_MEASURED = "not_measured"  # budgeted, but this engine mode cannot measure it (never fails, never passes)


class Verdict(StrEnum):
    PASS = "pass"
    REGRESSION = "regression"
    INVALID = "invalid"
    NOT_MEASURABLE = "not_measurable"  # guard pr: what changed cannot be measured here, and nothing else failed

    @property
    def exit_code(self) -> ExitCode:
        return {Verdict.PASS: ExitCode.PASS, Verdict.REGRESSION: ExitCode.REGRESSION,
                Verdict.INVALID: ExitCode.INVALID, Verdict.NOT_MEASURABLE: ExitCode.NOT_MEASURABLE}[self]


class Rule(StrEnum):
    """How an op budget bounds its count (the budgets file's ``rule``): at most, or exactly."""

    MAX = "max"
    EXACT = "exact"


# ----------------------------------------------------------------------------- the run
@dataclass(frozen=True)
class RequestOutcome:
    """One request of the timing pass; failures are data, not exceptions."""

    index: int
    image_size: ImageSize
    warmup: bool
    success: bool
    ttft_client_s: float | None = None
    ttft_engine_s: float | None = None
    prompt_tokens: int | None = None
    error: str | None = None
    output_tokens: int | None = None  # tokens the request returned (None: not counted)
    latency_s: float | None = None  # from the same start as TTFT until the request finished
    itl_s: tuple[float, ...] = ()  # gaps between successive token arrivals after the first

    def __post_init__(self) -> None:
        if not isinstance(self.itl_s, tuple):
            object.__setattr__(self, "itl_s", tuple(self.itl_s))

    @property
    def tpot_s(self) -> float | None:
        """(latency - TTFT) / (output tokens - 1), `vllm bench serve`'s TPOT; None below two tokens."""
        if not self.success or self.latency_s is None or self.ttft_client_s is None or (self.output_tokens or 0) < 2:
            return None
        return (self.latency_s - self.ttft_client_s) / (self.output_tokens - 1)

    def per_request_s(self, metric: str) -> float | None:
        """The request's one sample of a per-request metric: its TTFT or its TPOT (ITL has many)."""
        if metric == TTFT:
            return self.ttft_client_s
        if metric == TPOT:
            return self.tpot_s
        raise ValueError(f"{metric!r} has no single value per request")


@dataclass(frozen=True)
class OpSite:
    """A code location that issued operator calls inside a scope."""

    location: str  # "path/to/file.py:123" (the line where the function starts)
    function: str
    op: str
    calls: int


@dataclass(frozen=True)
class ScopeCounts:
    """Operator calls attributed to one budgeted scope during one profiled request."""

    scope: str  # the budget's name, e.g. "mask_path"
    image_size: ImageSize
    entries: int  # how many times the scope's function ran; 0 makes the run invalid
    calls_by_op: dict[str, int]  # op name -> calls
    total_calls: int  # all operator calls in the scope
    sites: tuple[OpSite, ...] = ()  # where the calls came from, most frequent first
    where: str = ""  # the scope's code path, "file:function" (or "whole request")


class ReasonKind(StrEnum):
    """Why a run cannot be judged, as a closed set: what code filters invalid reasons by."""

    ENGINE = "engine"  # the engine, vllm serve or an A/B worker failed to start or died
    CRASH = "crash"  # the perf suite process was killed, errored, or ended without run.json
    INTERRUPTED = "interrupted"  # stopped on purpose (Ctrl-C, a CI cancel) before it finished
    UNFINISHED = "unfinished"  # run.json is a checkpoint: the run never wrote its final record
    TEST_FAILED = "test_failed"  # a perf test failed or errored
    REQUEST_FAILED = "request_failed"
    TOO_FEW_SAMPLES = "too_few_samples"  # TTFT samples, or A/B pairs
    HARDWARE_MISMATCH = "hardware_mismatch"  # not the profile's machine
    GPU_STATE = "gpu_state"  # another process on the GPU, or throttled clocks
    BUSY_MACHINE = "busy_machine"  # other processes took the CPU (guard.judge.gates.busy)
    SLOW_MACHINE = "slow_machine"  # a slowdown /proc cannot see explains the TTFT failure (guard.judge.gates.speed_problems)
    SCOPE_NEVER_ENTERED = "scope_never_entered"
    SCOPE_NOT_MEASURED = "scope_not_measured"  # budgeted, but no counts recorded
    SCOPE_GONE = "scope_gone"  # guard pr: a budgeted scope's function no longer exists in head (renamed?)
    VACUOUS_BUDGET = "vacuous_budget"  # an op budget naming the variant that is never called
    CENSUS_MISSING = "census_missing"  # no census (or no Python frames) measured for an image size
    CENSUS_BASELINE = "census_baseline"  # no committed census baseline yet: update-thresholds may write one past it
    CENSUS_BASELINE_MISMATCH = "census_baseline_mismatch"  # the baseline is for another model, roots or sizes
    REVISION = "revision"  # guard pr: a side's environment could not be built or did not import
    UNKNOWN = "unknown"  # a version 2 file's reason that matches none of the known texts


class Measures(StrEnum):
    """What a run measures, decided once by the command that starts it: TTFT, op counts (and the
    census), or both. Recorded so that judging (and re-judging) reads it instead of guessing."""

    TTFT = "ttft"  # e.g. --server-url: a server guard did not start cannot be profiled
    OPS = "ops"  # --only ops, guard selftest, guard pr --only ops, guard bisect
    BOTH = "both"

    @property
    def ttft(self) -> bool:
        return self != Measures.OPS

    @property
    def ops(self) -> bool:
        return self != Measures.TTFT


@dataclass(frozen=True)
class InvalidReason:
    """One reason the run cannot be judged. Printed as its text, unchanged."""

    kind: ReasonKind
    text: str

    def __str__(self) -> str:
        return self.text

    def prefixed(self, prefix: str) -> InvalidReason:
        """The same reason said of one side ("baseline: ...")."""
        return InvalidReason(self.kind, prefix + self.text)

    def as_dict(self) -> dict[str, str]:
        return {"kind": str(self.kind), "text": self.text}

    @classmethod
    def from_dict(cls, d: dict[str, str]) -> InvalidReason:
        return cls(ReasonKind(d["kind"]), d["text"])


def reasons_text(reasons: Iterable[InvalidReason]) -> str:
    """Several reasons on one line, as error messages say them."""
    return "; ".join(r.text for r in reasons)


@dataclass
class RunRecord:
    """What the run stage (the pytest suite) hands to evaluation, as run.json."""

    profile: str
    thresholds_path: str
    model: str
    environment: Environment  # a mapping given here (a recorded run.json, a test's literal) is typed on the way in
    outcomes: list[RequestOutcome] = field(default_factory=list)
    rounds: int = 0  # timing rounds (1 + resampling rounds)
    op_counts: list[ScopeCounts] = field(default_factory=list)
    # the operator census per profiled image size: "WxH" -> "file:qualname" -> op -> calls
    census: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    census_s: float = 0.0  # time spent counting the census (its cost in the profile pass)
    # the decode steps' census per request mix (workload.profile_mixes): mix name -> its reading
    decode_census: dict[str, DecodeCensus] = field(default_factory=dict)
    invalid_reasons: list[InvalidReason] = field(default_factory=list)  # what went wrong while running
    benchmark_json: str | None = None
    traces: list[str] = field(default_factory=list)  # compressed Chrome traces, relative to the output dir
    started_at: str | None = None
    duration_s: float | None = None
    injected: str | None = None  # canary injected into the engine (selftest / --inject), if any
    measures: Measures = Measures.BOTH

    def __post_init__(self) -> None:
        if not isinstance(self.environment, Environment):
            self.environment = Environment.from_dict(self.environment)
        if not isinstance(self.measures, Measures):
            self.measures = Measures(self.measures)
        self.decode_census = {mix: d if isinstance(d, DecodeCensus) else DecodeCensus.from_dict(d)
                              for mix, d in self.decode_census.items()}

    @property
    def measured(self) -> list[RequestOutcome]:
        return [o for o in self.outcomes if not o.warmup]

    def ttft_client_s(self) -> list[float]:
        return self.latency_s(TTFT)

    def ttft_engine_s(self) -> list[float]:
        return [o.ttft_engine_s for o in self.measured if o.success and o.ttft_engine_s is not None]

    @property
    def timed_tokens(self) -> bool:
        """Whether the run recorded its requests' token times (a guard from before TPOT and ITL wrote none)."""
        return any(o.output_tokens is not None for o in self.measured if o.success)

    def latency_s(self, metric: str) -> list[float]:
        """One metric's samples (``LATENCY_METRICS``), seconds: what its budgets are judged on."""
        return latency_samples(self.measured, metric)


def latency_samples(outcomes: Iterable[RequestOutcome], metric: str) -> list[float]:
    """A metric's samples over successful requests: a TTFT or a TPOT per request, or every
    request's inter-token gaps pooled (ITL, as `vllm bench serve` pools them)."""
    ok = [o for o in outcomes if o.success]
    if metric == ITL:
        return [gap for o in ok for gap in o.itl_s]
    return [s for s in (o.per_request_s(metric) for o in ok) if s is not None]


CANDIDATE, BASELINE = "candidate", "baseline"  # the two sides of an A/B run (and of guard pr: head, base)
SIDES = (CANDIDATE, BASELINE)


@dataclass
class ABRecord:
    """What the A/B run stage hands to evaluation: one run record per side."""

    candidate: RunRecord
    baseline: RunRecord
    baseline_python: str
    order: list[str] = field(default_factory=list)  # per measured block: the side that ran first
    duration_s: float | None = None

    def side(self, name: str) -> RunRecord:
        return self.candidate if name == CANDIDATE else self.baseline
