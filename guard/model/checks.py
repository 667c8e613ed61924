"""What the judge found: one typed record per check, and A/B's pairs and op diff.

A check (``LatencyCheck``, ``OpCheck``, ``RatioCheck``, ``CensusCheck``) is identified by its
``key``, built from its fields (percentile; scope, image size and op; function and image size),
never a string to parse back; its ``label`` is the one short name every view shows. How the rest
of a check reads to people is ``guard.model.format``'s business.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from guard.model.readings import ImageSize, size
from guard.model.records import TTFT, RequestOutcome, Rule, RunRecord, Status


@dataclass(frozen=True)
class LatencyCheck:
    """A latency percentile budget (TTFT, TPOT or ITL: ``metric``) judged by its confidence
    interval (guard.judge.rules)."""

    percentile: str  # "p50"
    budget_ms: float
    measured_ms: float  # the point estimate
    interval_ms: tuple[float, float]  # -inf / inf where that side does not exist at this sample count
    samples: int
    rounds: int
    confidence: float
    status: Status
    note: str | None = None  # how an undecided interval was settled
    metric: str = TTFT  # records.LATENCY_METRICS

    @property
    def key(self) -> tuple:
        """The check's identity: the same budget in another run (or re-judged) has the same key."""
        return (self.metric, self.percentile)

    @property
    def label(self) -> str:
        """A short name for tables, status lines and messages (never parsed back)."""
        return f"{self.metric} {self.percentile}"


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
class RatioCheck:
    """A/B mode: a percentile of the paired ratio candidate / baseline of a request's TTFT (or TPOT:
    ``metric``), as a slowdown in percent, judged by its confidence interval against
    ``ttft_vs_baseline_pct`` (``tpot_vs_baseline_pct``) (guard.judge.ab)."""

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
    metric: str = TTFT  # what was paired: TTFT, or TPOT

    @property
    def key(self) -> tuple:
        return (f"{self.metric}_vs_baseline", self.percentile)

    @property
    def label(self) -> str:
        return f"{self.metric} {self.percentile} vs baseline"


@dataclass(frozen=True)
class Pair:
    """One measured request of an A/B run: the same image on both sides, seconds apart."""

    index: int  # the job index (it names the image)
    candidate_s: float
    baseline_s: float

    @property
    def ratio(self) -> float:
        return self.candidate_s / self.baseline_s


def pairs(candidate: Sequence[RequestOutcome], baseline: Sequence[RequestOutcome], metric: str = TTFT) -> list[Pair]:
    """Measured requests that succeeded on both sides, matched by job index, in index order: their
    TTFTs, or (``metric`` TPOT) their times per output token."""
    def ok(outcomes):
        seconds = {o.index: o.per_request_s(metric) for o in outcomes if not o.warmup and o.success}
        return {i: s for i, s in seconds.items() if s and s > 0}

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


class OpClass(StrEnum):
    """What an operator call costs on a GPU, by kind (guard.judge.pricing classes each op)."""

    KERNEL_LAUNCH = "kernel_launch"  # runs a kernel: the host's launch is the cost of a small one
    HOST_SYNC = "host_sync"  # the host waits for the device (.item(), nonzero, a boolean-mask read)
    H2D_COPY = "h2d_copy"  # a small host-to-device copy, which PyTorch waits for
    INDEX_WRITE = "index_write"  # an advanced-index write: a launch, and its indices and value sent to the device
    VIEW = "view"  # a view or metadata: no kernel, no copy
    COMPOSITE = "composite"  # only calls other ops, which the census counts themselves: never priced


class CostStatus(StrEnum):
    """Where a per-call constant comes from: published figures (docs/gpu-cost.md), or a GPU that ran
    benchmarks/gpu_cost.py."""

    ESTIMATE = "estimate"
    CALIBRATED = "calibrated"


@dataclass(frozen=True)
class PricedClass:
    """One op class of a census change, priced: its calls per request times the GPU's constant."""

    op_class: OpClass
    calls: int  # per request; negative: fewer than the baseline
    us_per_call: float
    status: CostStatus


@dataclass(frozen=True)
class GpuCost:
    """What a census change would add to each request on one GPU, as host time: an estimate beside
    the op counts, never a verdict (guard.judge.pricing)."""

    gpu: str  # "A10", as the constants name it
    ms_per_request: float
    classes: tuple[PricedClass, ...] = ()  # the classes with a cost, largest share first

    @property
    def calibrated(self) -> bool:
        return bool(self.classes) and all(c.status == CostStatus.CALIBRATED for c in self.classes)


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
    # the request mix whose decode steps these counts are (None: an image size's prefill request);
    # ``unit``: "per step", or "over N steps" where the steps differed (guard.model.readings.DecodeCensus)
    mix: str | None = None
    unit: str = ""
    # the change as it would cost on each GPU the constants name (guard.judge.pricing); none for a
    # function on host tensors only (input processing) or one whose calls only moved. An estimate
    # beside the counts, not part of what was judged: two checks that judged the same counts are
    # equal whatever constants priced them (a file from before pricing re-judges to the same checks)
    gpu_costs: tuple[GpuCost, ...] = field(default=(), compare=False)

    @property
    def key(self) -> tuple:
        return ("census", self.function, tuple(self.image_size)) + ((self.mix,) if self.mix else ())

    @property
    def where(self) -> str:
        """Which request the counts are of: ``640x480`` (its prefill) or ``decode seeded`` (a mix's decode steps)."""
        return f"decode {self.mix}, {self.unit}" if self.mix else size(self.image_size)

    @property
    def label(self) -> str:
        return f"census {self.function} [{self.where}]"

    @property
    def growth_calls(self) -> int:
        return (self.measured_calls or 0) - (self.baseline_calls or 0)


Check = LatencyCheck | OpCheck | RatioCheck | CensusCheck


