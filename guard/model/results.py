"""A run's results: the verdict with everything needed to explain it, the content of results.json.

``Results`` holds the run record (guard.model.records), the checks judged on it
(guard.model.checks), the invalid reasons evaluation found, and for ``guard pr`` the two revisions
and what changed between them. ``guard.model.verdict`` sets its verdict; ``guard.model.jsonfiles``
writes and reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from guard.model.checks import ABComparison, CensusCheck, Check, OpCheck, LatencyCheck, RatioCheck, UnmeasuredOpCheck
from guard.model.records import TTFT_DEFINITION, InvalidReason, RunRecord, Status, Verdict


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
    ttft_checks: tuple[LatencyCheck, ...] = ()
    token_checks: tuple[LatencyCheck, ...] = ()  # TPOT and ITL budgets (metric "tpot", "itl")
    op_checks: tuple[OpCheck, ...] = ()
    unmeasured_op_checks: tuple[UnmeasuredOpCheck, ...] = ()  # budgets this engine mode cannot measure
    ab_checks: tuple[RatioCheck, ...] = ()  # A/B mode only
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
        return (*self.ttft_checks, *self.token_checks, *self.ab_checks, *self.op_checks, *self.census_checks)

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
