"""The records that flow run -> verdict -> report -> publish.

Their file form is results.json (``guard.model.jsonfiles`` writes and reads it; schema
``guard/results``, ``guard.model.schema``), what every later stage reads: ``guard comment`` and
``guard update-thresholds`` never look at the engine, only at this file. Each fact is written once;
seconds inside, and every number carries its unit in its name (``_s``, ``_ms``, ``_calls``).

A check is a typed record (``TtftCheck``, ``OpCheck``, ``TtftRatioCheck``, ``CensusCheck``): its
identity is its ``key`` (built from its fields: percentile; scope, image size and op; function and
image size), never a string to parse back, and its ``label`` is the one short name every view shows.
How the rest of a check reads to people is ``guard.model.format``'s business, and the one roll-up
from checks and invalid reasons to a verdict is ``guard.model.verdict``'s. An invalid reason is typed
the same way (``InvalidReason``: a ``ReasonKind`` for code to filter on, the text for people), never
matched by substring.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from guard.errors import ExitCode
from guard.model.environment import Environment
from guard.model.readings import ImageSize, size

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

    @property
    def measured(self) -> list[RequestOutcome]:
        return [o for o in self.outcomes if not o.warmup]

    def ttft_client_s(self) -> list[float]:
        return [o.ttft_client_s for o in self.measured if o.success and o.ttft_client_s is not None]

    def ttft_engine_s(self) -> list[float]:
        return [o.ttft_engine_s for o in self.measured if o.success and o.ttft_engine_s is not None]


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


# ----------------------------------------------------------------------------- checks
@dataclass(frozen=True)
class TtftCheck:
    """A TTFT percentile budget judged by its confidence interval (guard.judge.rules)."""

    percentile: str  # "p50"
    budget_ms: float
    measured_ms: float  # the point estimate
    interval_ms: tuple[float, float]  # -inf / inf where that side does not exist at this sample count
    samples: int
    rounds: int
    confidence: float
    status: Status
    note: str | None = None  # how an undecided interval was settled

    @property
    def key(self) -> tuple:
        """The check's identity: the same budget in another run (or re-judged) has the same key."""
        return ("ttft", self.percentile)

    @property
    def label(self) -> str:
        """A short name for tables, status lines and messages (never parsed back)."""
        return f"ttft {self.percentile}"


@dataclass(frozen=True)
class OpCheck:
    """An operator-count budget of one scope, for one profiled image size."""

    scope: str
    image_size: ImageSize
    op: str  # an operator name, a guard pseudo-op, or TOTAL_OPS
    rule: Rule
    budget_calls: int
    measured_calls: int
    status: Status

    @property
    def key(self) -> tuple:
        return ("ops", self.scope, tuple(self.image_size), self.op)

    @property
    def label(self) -> str:
        return f"{self.scope} [{size(self.image_size)}] {self.op}"

    @property
    def excess_calls(self) -> int:
        return self.measured_calls - self.budget_calls


@dataclass(frozen=True)
class UnmeasuredOpCheck:
    """An operator-count budget this run could not measure (``--server-url``: a remote server's
    Python frames cannot be profiled). Shown as "not measured in this mode", never as pass."""

    scope: str
    op: str  # an operator name, a guard pseudo-op, or TOTAL_OPS
    rule: Rule
    budget_calls: int
    reason: str
    status: Status = Status.NOT_MEASURED


@dataclass(frozen=True)
class TtftRatioCheck:
    """A/B mode: a percentile of the paired ratio candidate TTFT / baseline TTFT, as a slowdown in
    percent, judged by its confidence interval against ``ttft_vs_baseline_pct`` (guard.judge.ab)."""

    percentile: str  # "p50"
    budget_pct: float  # allowed slowdown of the candidate, percent
    measured_pct: float  # the percentile of (candidate_i / baseline_i - 1) x 100 over the pairs
    interval_pct: tuple[float, float]  # -inf / inf where that side does not exist at this pair count
    pairs: int
    rounds: int
    confidence: float
    status: Status
    candidate_ms: float  # the same percentile of each side's own TTFT, for the side-by-side view
    baseline_ms: float
    note: str | None = None  # how an undecided interval was settled
    fail_confidence: float | None = None  # the interval's lower end is at this stricter level (ab.fail_confidence)
    pair_spread_pct: float | None = None  # SD of the pairs' log ratio x 100: the machine's noise as A/B sees it

    @property
    def key(self) -> tuple:
        return ("ttft_vs_baseline", self.percentile)

    @property
    def label(self) -> str:
        return f"ttft {self.percentile} vs baseline"


@dataclass(frozen=True)
class Pair:
    """One measured request of an A/B run: the same image on both sides, seconds apart."""

    index: int  # the job index (it names the image)
    candidate_s: float
    baseline_s: float

    @property
    def ratio(self) -> float:
        return self.candidate_s / self.baseline_s


def pairs(candidate: Sequence[RequestOutcome], baseline: Sequence[RequestOutcome]) -> list[Pair]:
    """Measured requests that succeeded on both sides, matched by job index, in index order."""
    def ok(outcomes):
        return {o.index: o.ttft_client_s for o in outcomes
                if not o.warmup and o.success and o.ttft_client_s and o.ttft_client_s > 0}

    c, b = ok(candidate), ok(baseline)
    return [Pair(i, c[i], b[i]) for i in sorted(c.keys() & b.keys())]


@dataclass(frozen=True)
class OpDelta:
    """An op whose count per request differs between the A/B sides (or a scope entered differently)."""

    scope: str
    image_size: ImageSize
    op: str  # an operator name, TOTAL_OPS, or "entries" (times the scope's function ran)
    baseline_calls: int
    candidate_calls: int

    @property
    def delta_calls(self) -> int:
        return self.candidate_calls - self.baseline_calls


@dataclass(frozen=True)
class ABComparison:
    """What an A/B run adds to the candidate's run: the baseline side and how the two compare."""

    baseline_python: str  # --baseline PYTHON
    baseline: RunRecord
    order: tuple[str, ...] = ()  # per measured block, the side that ran first (ABBA...)
    pairs: tuple[Pair, ...] = ()
    op_diff: tuple[OpDelta, ...] = ()


@dataclass(frozen=True)
class CensusOpDelta:
    """An op whose census count moved against the committed baseline."""

    op: str
    delta_calls: int  # measured - baseline, per request


@dataclass(frozen=True)
class CensusCheck:
    """One function whose operator census differs from the committed baseline, for one profiled
    image size (guard.judge.census). Functions whose counts equal the baseline have no record."""

    function: str  # "file:qualname", the file relative to its package's folder; no line numbers
    image_size: ImageSize
    baseline_calls: int | None  # None: a function the baseline does not have (new)
    measured_calls: int | None  # None: a function that no longer issues any op (vanished)
    op_deltas: tuple[CensusOpDelta, ...]  # the ops that moved, largest growth first
    status: Status  # FAIL: beyond the rule; PASS: a change within it (shrinkage, small growth)
    reason: str = ""  # why it failed
    watched_ops: tuple[str, ...] = ()  # watched ops that grew (any growth fails)
    # every call ran in vLLM's input processing, on host tensors: held to the growth rules only
    input_processing: bool = False
    # calls this function gained that the rest of the request gave up (a refactor moved them here):
    # a notice, never growth; ``moved_from`` names the functions that gave them up, most first
    moved_calls: int = 0
    moved_from: tuple[str, ...] = ()

    @property
    def key(self) -> tuple:
        return ("census", self.function, tuple(self.image_size))

    @property
    def label(self) -> str:
        return f"census {self.function} [{size(self.image_size)}]"

    @property
    def growth_calls(self) -> int:
        return (self.measured_calls or 0) - (self.baseline_calls or 0)


Check = TtftCheck | OpCheck | TtftRatioCheck | CensusCheck


ENVIRONMENTS_DIFFER = "environments differ:"  # how the notice naming two sides' differing environments begins


@dataclass(frozen=True)
class RevisionInfo:
    """One side of a pull request (``guard pr``)."""

    rev: str  # as named on the command line
    sha: str
    subject: str
    version: str | None = None  # its vLLM version as the repository's tags say (git describe); None: untagged
    environment: str | None = None  # what it ran in: its own interpreter, or its vllm/ over guard's wheel
    differs: int = 0  # its own environment's vllm/ Python files that are not the revision's


@dataclass(frozen=True)
class FunctionChange:
    """The lines a pull request added inside a census function that moved: the code to look at."""

    function: str  # "file:qualname", as the census names it
    lines: tuple[tuple[int, str], ...]  # (line in head, text)


@dataclass(frozen=True)
class BudgetSource:
    """``guard pr --thresholds-in-repo``: the budget file read from the vLLM tree, from base (the
    trusted side), and what head did to it (reported, never applied). Paths are repository-relative."""

    revision: str  # the commit the budgets were read from (base)
    path: str  # the budget file
    files: tuple[str, ...] = ()  # the budget file and the files it names (census baselines, ...) that base holds
    head_changed_files: tuple[str, ...] = ()  # of those (or of the files head's copy names): what head changed
    head_changes: tuple[str, ...] = ()  # one line per budget head's copy changes, e.g. "profile cpu: op budget ..."


@dataclass(frozen=True)
class PullRequestDiff:
    """What ``guard pr`` compared: two revisions of a vLLM repository, base measured as the baseline."""

    repository: str
    base: RevisionInfo
    head: RevisionInfo
    changed_files: tuple[str, ...] = ()  # git diff --name-only base head
    unmeasured_files: tuple[str, ...] = ()  # compiled code or dependencies: not measurable on this engine stack
    measured: bool = True  # False: base and head have the same vllm/ Python, so there was nothing to measure
    function_changes: tuple[FunctionChange, ...] = ()
    budgets: BudgetSource | None = None  # --thresholds-in-repo: where the budgets came from


@dataclass(frozen=True)
class HistoryStanding:
    """Where a pull request's run sits in main's recent history (guard.history.analysis.pr_standing
    computes it, the comment shows it): the base's record, the run's own figures, and the window of
    main's commits up to and including the base."""

    base_commit: str
    base_profile: str
    base_ttft_p50_ms: float | None  # None: an ops-only record
    base_census_calls: int | None  # None: the base recorded no census
    base_machine: str
    p50_ms: float | None  # the run's TTFT p50 (None: the run measured no TTFT)
    census_calls: int | None  # the run's census total over the profiled sizes (None: no census)
    window: int  # main's commits up to the base
    timed: int  # of them, those that measured TTFT
    p50_range_ms: tuple[float, float, float] | None  # min, median, max of their p50s
    above: int | None  # how many of their p50s the run's is above
    rank_pct: float | None


@dataclass(frozen=True)
class Results:
    """The verdict with everything needed to explain it: the content of results.json. Judging sets
    the verdict from these checks and reasons (``guard.model.verdict.settled``)."""

    verdict: Verdict
    run: RunRecord
    ttft_checks: tuple[TtftCheck, ...] = ()
    op_checks: tuple[OpCheck, ...] = ()
    unmeasured_op_checks: tuple[UnmeasuredOpCheck, ...] = ()  # budgets this engine mode cannot measure
    ab_checks: tuple[TtftRatioCheck, ...] = ()  # A/B mode only
    ab: ABComparison | None = None  # A/B mode only: the baseline side, the pairs, the op diff
    census_checks: tuple[CensusCheck, ...] = ()  # only the functions that differ from the baseline
    judged_invalid_reasons: tuple[InvalidReason, ...] = ()  # found by evaluation, beside the run's own
    notices: tuple[str, ...] = ()  # advice (stale budgets, ...); never changes the verdict
    guard_version: str = ""
    ttft_definition: str = TTFT_DEFINITION
    profile_config: dict[str, Any] = field(default_factory=dict)  # engine, workload, statistics used
    pr: PullRequestDiff | None = None  # guard pr only: the two revisions and what changed

    @property
    def checks(self) -> tuple[Check, ...]:
        return (*self.ttft_checks, *self.ab_checks, *self.op_checks, *self.census_checks)

    @property
    def judged(self) -> list[Check]:
        """The checks this run could judge (not_judged ones are shown, never counted)."""
        return [c for c in self.checks if c.status != Status.NOT_JUDGED]

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == Status.FAIL]

    @property
    def invalid_reasons(self) -> list[InvalidReason]:
        return [*self.run.invalid_reasons, *self.judged_invalid_reasons]

    @property
    def exit_code(self) -> int:
        return int(self.verdict.exit_code)
