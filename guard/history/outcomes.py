"""How each recorded finding of a pull request ended, read from the findings store in its order,
and the shadow-mode summary a maintainer reads before making the status required.

A finding is one failed check (its key) of one pull request on one model and profile. It is
``open`` when first seen; then, line by line:

- a run line with ``accepted_by`` that has it: ``accepted`` by that login (head's budgets judged);
- a valid run line of the same pull request without it, on another head commit: ``fixed`` by that
  commit, unless a person judged it (a run never overrides a person); gone only on a re-run of the
  same commit it stays open, with a note: nothing changed, so a person should judge it;
- a run line that has it again after it was fixed: ``open`` again (the fix did not hold);
- a judgement line: what the person said; the latest one wins.

Invalid runs say nothing about findings and are only counted.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field

from guard.history.findings import Finding, Judgement, Line, Outcome, PullRequestRun
from guard.model.records import Verdict


@dataclass(frozen=True)
class Judged:
    outcome: Outcome
    by: str = ""  # a login, or "commit abc1234" for a finding a later run fixed; "" while open
    date: str = ""
    note: str = ""
    by_person: bool = False  # a judgement line or an acceptance: runs never override it

    @property
    def closed_by_run(self) -> bool:
        return not self.by_person and self.outcome == Outcome.FIXED


@dataclass
class _State:
    finding: Finding  # as the latest run that had it recorded it
    first_seen: str
    last_head: str  # the latest head commit that had it
    judged: Judged = field(default_factory=lambda: Judged(Outcome.OPEN))


@dataclass(frozen=True)
class FindingOutcome:
    pr: int
    model: str
    profile: str
    finding: Finding
    first_seen: str  # the date of the first run that had it
    judged: Judged


@dataclass(frozen=True)
class RunCounts:
    """The recorded runs of the pull requests shown."""

    runs: int  # distinct (PR, head, model, profile), the latest record of each
    invalid: int
    with_findings: int
    pull_requests: int


def _seen(state: _State, run: PullRequestRun, finding: Finding) -> None:
    state.finding, state.last_head = finding, run.head
    if run.accepted_by:
        state.judged = Judged(Outcome.ACCEPTED, run.accepted_by, run.recorded_at,
                              f"head's budgets judged {run.head[:7]}", by_person=True)
    elif state.judged.outcome == Outcome.FIXED:  # the fix did not hold (a person's "fixed" included)
        state.judged = Judged(Outcome.OPEN, note=f"seen again at {run.head[:7]} after it was fixed")
    elif not state.judged.by_person:
        state.judged = Judged(Outcome.OPEN)


def _absent(state: _State, run: PullRequestRun) -> None:
    if state.judged.outcome != Outcome.OPEN:  # a person's word (or an earlier fix) stands
        return
    if state.last_head != run.head:
        state.judged = Judged(Outcome.FIXED, f"commit {run.head[:7]}", run.date)
    else:
        state.judged = Judged(Outcome.OPEN, note=f"not seen when {run.head[:7]} was measured again: judge it")


def outcomes(lines: Sequence[Line]) -> list[FindingOutcome]:
    """Every finding of the store with how it was judged, in the order they were first seen."""
    states: dict[tuple[int, str, str], dict[str, _State]] = {}  # subject -> finding key -> state
    for line in lines:
        if isinstance(line, Judgement):  # the store's reader checked that an earlier run has the finding
            states[line.subject][line.finding].judged = Judged(line.outcome, line.by, line.date, line.note,
                                                               by_person=True)
            continue
        if line.verdict == Verdict.INVALID:
            continue
        mine = states.setdefault(line.subject, {})
        present = {f.key for f in line.findings}
        for f in line.findings:
            _seen(mine.setdefault(f.key, _State(f, line.date, line.head)), line, f)
        for key, state in mine.items():
            if key not in present:
                _absent(state, line)
    return [FindingOutcome(pr, model, profile, s.finding, s.first_seen, s.judged)
            for (pr, model, profile), found in states.items() for s in found.values()]


# ----------------------------------------------------------------------------- a window and its summary
def since_problem(text: str) -> str | None:
    """Why ``text`` is no ``--since`` (a date, or a date and time with its UTC offset)."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        return f"{text!r} is not a date (2026-12-01) or an ISO 8601 date and time"
    return None if when.tzinfo is not None or len(text) == 10 else f"{text!r} has no UTC offset"


def _instant(text: str) -> dt.datetime:
    when = dt.datetime.fromisoformat(text)
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.timezone.utc)  # a bare date: UTC midnight


@dataclass(frozen=True)
class Window:
    since: str | None = None  # findings first seen on or after; runs measured on or after
    last_prs: int | None = None  # the pull requests recorded last
    model: str | None = None
    profile: str | None = None

    def pull_requests(self, lines: Sequence[Line]) -> list[int]:
        """The pull requests in the window, in the order they were first recorded."""
        runs = [r for r in lines if isinstance(r, PullRequestRun) and self._shows(r.model, r.profile)
                and (self.since is None or _instant(r.date) >= _instant(self.since))]
        prs = list(dict.fromkeys(r.pr for r in runs))
        return prs if self.last_prs is None else prs[-self.last_prs:]

    def _shows(self, model: str, profile: str) -> bool:
        return self.model in (None, model) and self.profile in (None, profile)

    def findings(self, lines: Sequence[Line]) -> list[FindingOutcome]:
        prs = set(self.pull_requests(lines))
        return [o for o in outcomes(lines) if o.pr in prs and self._shows(o.model, o.profile)
                and (self.since is None or _instant(o.first_seen) >= _instant(self.since))]

    def runs(self, lines: Sequence[Line]) -> RunCounts:
        prs = set(self.pull_requests(lines))
        latest = {r.identity: r for r in lines if isinstance(r, PullRequestRun) and r.pr in prs
                  and self._shows(r.model, r.profile) and (self.since is None or _instant(r.date) >= _instant(self.since))}
        return RunCounts(runs=len(latest), invalid=sum(r.verdict == Verdict.INVALID for r in latest.values()),
                         with_findings=sum(bool(r.findings) for r in latest.values()), pull_requests=len(prs))


@dataclass(frozen=True)
class Summary:
    findings: int
    pull_requests: int  # with at least one finding
    counts: dict[Outcome, int]
    false_alarm_prs: int  # pull requests with at least one finding judged a false alarm

    @property
    def judged(self) -> int:
        """Findings that ended one way or another: everything not open."""
        return self.findings - self.counts[Outcome.OPEN]

    @property
    def false_alarm_rate(self) -> float | None:
        """False alarms among the judged findings; None before any was judged."""
        return self.counts[Outcome.FALSE_ALARM] / self.judged if self.judged else None


def summarise(found: Sequence[FindingOutcome]) -> Summary:
    return Summary(findings=len(found), pull_requests=len({o.pr for o in found}),
                   counts={o: sum(f.judged.outcome == o for f in found) for o in Outcome},
                   false_alarm_prs=len({f.pr for f in found if f.judged.outcome == Outcome.FALSE_ALARM}))
