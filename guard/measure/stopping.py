"""When the run stage has measured enough: the sequential loop, over a stopping rule it is given.

The rule is the verdict's own (guard.judge.sequential: ``single_run_rule`` for one side's TTFT,
``ab_run_rule`` for two sides' paired ratio), built by whoever starts the run (a command, the
child process's entry ``guard.child``, the pytest plugin, a benchmark) and passed in.
So the stage that measures never imports the stage that judges, and the two cannot disagree: the
intervals, which budgets are undecided and how many more samples to take are judge code; when to
ask, and the caller's veto (a failed request, a busy machine), are the run stage's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol


class StoppingRule(Protocol):
    """Which budgets a run's samples leave undecided, and how many more samples to take."""

    @property
    def cap(self) -> int | None:
        """The most samples the rule takes (``statistics.max_requests``; None: no resampling)."""
        ...

    def undecided(self, samples: Sequence[float]) -> Sequence[Any]:
        """The budgets ``samples`` (TTFT seconds, or paired ratios) leave undecided; empty: decided."""
        ...

    def next_batch(self, measured: int, any_undecided: bool) -> int:
        """How many samples the next round measures after ``measured``; 0: stop."""
        ...

    def describe(self, pending: Sequence[Any]) -> str:
        """``undecided``'s answer, for the progress line."""
        ...


def sample_until_decided(rule: StoppingRule | None, first: int, measure: Callable[[int], Sequence[float]],
                         on_undecided: Callable[[Sequence[Any], int], None] = lambda pending, n: None,
                         keep_going: Callable[[], bool] = lambda: True) -> list[float]:
    """``measure(n)`` returns the next n samples: measure ``first``, then batches while ``rule``
    leaves a budget undecided, as many as it says. Returns every sample.
    ``rule`` None: the first batch only (budgets shown, not judged: more samples decide nothing).
    ``on_undecided(pending, n)``: before each further batch. ``keep_going``: the caller's veto (a
    failed request makes the run invalid: stop measuring)."""
    samples = list(measure(first))
    while rule is not None and keep_going():
        pending = rule.undecided(samples)
        extra = rule.next_batch(len(samples), bool(pending))
        if not extra:
            break
        on_undecided(pending, extra)
        samples += measure(extra)
    return samples
