"""Find the first commit whose census differs from a good one: a binary search that needs no repeats.

The census is exact (the same vLLM Python gives the same counts on every run), so each revision is
measured once and its answer is final: no noise to outvote, unlike a timing bisection. Commits
are the first-parent line from good (exclusive) to bad (inclusive), as ``git bisect
--first-parent`` walks them; bad is taken as bad, as git bisect does, and measured only when the
search ends on it.

A commit that cannot be measured here is skipped, as ``git bisect skip`` does: one that changes
compiled code or dependencies (the engine stack is the installed wheel's), or whose vLLM does not
import. The search then probes the nearest measurable commit instead. A commit whose change is
*only* compiled code has its parent's Python, so it cannot be the culprit of a census change: it
never widens the answer. Any other skipped commit next to the boundary does, and the answer is a
range, as git bisect says "one of these".

Pure over a ``measure`` callback, so the search itself is tested without an engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum


class State(StrEnum):
    GOOD = "good"  # the census does not differ from good's (by the chosen test)
    BAD = "bad"  # it does
    SKIP = "skip"  # cannot be measured here


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str
    author_date: str
    unmeasurable: tuple[str, ...] = ()  # files of compiled code or dependencies this commit changed
    python_changed: bool = True  # its vllm/ tree differs from its parent's


@dataclass(frozen=True)
class Step:
    """One probed commit: its answer, why, how long it took."""

    index: int
    commit: Commit
    state: State
    why: str
    seconds: float = 0.0
    measured: bool = True  # False: classified without a profile pass (skipped, or its tree was measured before)


@dataclass(frozen=True)
class Outcome:
    steps: tuple[Step, ...]
    culprits: tuple[Commit, ...]  # one: found; more: the skipped commits beside it leave a range
    first_bad: int | None  # index of the first commit known to differ
    last_good: int  # index of the last commit known not to differ (-1: good itself)
    measured: int = 0  # profile passes, good's included
    skipped: tuple[Step, ...] = field(default_factory=tuple)  # the commits skipped, with why


def next_probe(states: dict[int, State], lo: int, hi: int) -> int | None:
    """The unknown commit nearest the middle of (lo, hi), exclusive; None when there is none."""
    open_ = [i for i in range(lo + 1, hi) if i not in states]
    if not open_:
        return None
    mid = (lo + hi) / 2
    return min(open_, key=lambda i: (abs(i - mid), -i))


def search(commits: Sequence[Commit], probe: Callable[[int], Step]) -> tuple[list[Step], int, int]:
    """Binary search for the first BAD over ``commits`` (the last one assumed BAD). ``probe(i)``
    classifies commit i. Returns (steps, last known good index, first known bad index)."""
    states: dict[int, State] = {}
    steps: list[Step] = []
    lo, hi = -1, len(commits) - 1
    while True:
        i = next_probe(states, lo, hi)
        if i is None:
            break
        step = probe(i)
        steps.append(step)
        states[i] = step.state
        if step.state == State.BAD:
            hi = i
        elif step.state == State.GOOD:
            lo = i
    if hi == len(commits) - 1 and hi not in states:  # bad was only named bad: confirm it
        step = probe(hi)
        steps.append(step)
        states[hi] = step.state
        if step.state != State.BAD:
            return steps, lo, -1  # bad does not differ from good: no culprit
    return steps, lo, hi


def culprits(commits: Sequence[Commit], steps: Sequence[Step], lo: int, hi: int) -> tuple[Commit, ...]:
    """The first bad commit, with the skipped commits between the last good and it that could be
    the culprit too (a compiled-only commit cannot: its Python is its parent's)."""
    if hi < 0:
        return ()
    skipped = {s.index for s in steps if s.state == State.SKIP}
    maybe = [commits[i] for i in range(lo + 1, hi) if i in skipped and commits[i].python_changed]
    return (*maybe, commits[hi])
