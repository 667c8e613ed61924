"""The one roll-up from checks and invalid reasons to a verdict, and the places it is applied:
judging settles a Results' verdict here, and a stored file's verdict is held to its own checks."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from guard.model.records import InvalidReason, Status, Verdict
from guard.model.results import Results
from guard.model.checks import Check


def verdict_of(checks: Iterable[Check], invalid_reasons: Iterable[InvalidReason], *, unmeasurable: bool = False) -> Verdict:
    """The one roll-up from checks to a verdict: invalid when there is any reason to distrust the
    run, else a regression when any check failed, else not measurable when ``guard pr`` saw changes
    this engine stack cannot measure (``unmeasurable``), else a pass. ``guard check``'s, ``guard
    pr``'s and ``guard comment``'s re-judged verdict (guard.judge.rejudge) are all this function's."""
    if any(True for _ in invalid_reasons):
        return Verdict.INVALID
    if any(c.status == Status.FAIL for c in checks):
        return Verdict.REGRESSION
    return Verdict.NOT_MEASURABLE if unmeasurable else Verdict.PASS


def implied_verdict(results: Results) -> Verdict:
    """The verdict these checks and invalid reasons give (verdict_of): a pull request's changes
    this engine stack cannot measure make a pass not measurable."""
    return verdict_of(results.checks, results.invalid_reasons,
                      unmeasurable=results.pr is not None and bool(results.pr.unmeasured_files))


def self_contradiction(results: Results) -> str | None:
    """Why the stored verdict is not the one its own checks and reasons give; None when it is."""
    implied = implied_verdict(results)
    if results.verdict == implied:
        return None
    return f"its verdict is '{results.verdict}' but its own checks and reasons make it '{implied}'"


def settled(results: Results) -> Results:
    """These results with their implied verdict: the one place judging sets a verdict."""
    return replace(results, verdict=implied_verdict(results))
