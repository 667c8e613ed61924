"""One profile's history read as a whole: per commit, whether the census changed, whether the
machine changed, and where a lasting TTFT shift starts (``guard.history.changepoints``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from guard.history.changepoints import DEFAULT, Method, Shift, change_points
from guard.history.store import HistoryRecord, census_totals
from guard.judge.stats import percentile
from guard.model.records import to_ms
from guard.model.results import HistoryStanding, Results


@dataclass(frozen=True)
class Row:
    record: HistoryRecord
    census_changed: bool  # against the previous record (the first record: False)
    machine_changed: bool
    shift: Shift | None  # a lasting TTFT shift that starts at this commit


@dataclass(frozen=True)
class Analysis:
    profile: str
    rows: tuple[Row, ...]
    method: Method

    @property
    def shifts(self) -> list[Shift]:
        return [r.shift for r in self.rows if r.shift is not None]

    def last(self, n: int | None) -> tuple[Row, ...]:
        return self.rows if n is None or n >= len(self.rows) else self.rows[-n:]


def analyse(profile: str, records: Sequence[HistoryRecord], method: Method = DEFAULT) -> Analysis:
    """Change points over every record of the profile (more history, surer segments)."""
    # change points over the records that measured TTFT (an ops-only record has none), placed back at
    # their own commits
    timed = [i for i, r in enumerate(records) if r.has_ttft]
    shifts = {timed[s.index]: s for s in change_points([records[i].ttft_p50_ms for i in timed], method)}
    rows = []
    for i, r in enumerate(records):
        prev = records[i - 1] if i else None
        rows.append(Row(record=r, census_changed=prev is not None and r.census_changed_from(prev),
                        machine_changed=prev is not None and (r.machine, r.dtype) != (prev.machine, prev.dtype),
                        shift=shifts.get(i)))
    return Analysis(profile=profile, rows=tuple(rows), method=method)


def short(commit: str) -> str:
    return commit[:7]


# ----------------------------------------------------------------------------- a pull request against main
STANDING_WINDOW = 20  # main's commits up to the base that a pull request's run is set against


@dataclass(frozen=True)
class Standing:
    """Where a pull request's run sits in main's recent history, up to and including its base."""

    base: HistoryRecord
    window: tuple[HistoryRecord, ...]  # oldest first, ending at the base
    p50_ms: float | None  # the run's TTFT p50 (None: the run measured no TTFT)
    census_calls: int | None  # the run's census total over the profiled sizes (None: no census)

    @property
    def timed(self) -> tuple[HistoryRecord, ...]:
        """The window's records that measured TTFT (ops-only records have none)."""
        return tuple(r for r in self.window if r.has_ttft)

    @property
    def p50_range_ms(self) -> tuple[float, float, float] | None:
        """None: no record of the window measured TTFT."""
        import statistics

        values = [r.ttft_p50_ms for r in self.timed]
        return (min(values), statistics.median(values), max(values)) if values else None

    @property
    def rank_pct(self) -> float | None:
        """Share of the window's p50s below the run's (ties count half), in percent."""
        if self.p50_ms is None or not self.timed:
            return None
        below = sum(r.ttft_p50_ms < self.p50_ms for r in self.timed)
        ties = sum(r.ttft_p50_ms == self.p50_ms for r in self.timed)
        return (below + ties / 2) / len(self.timed) * 100


def find_commit(records: Sequence[HistoryRecord], commit: str) -> int | None:
    """Index of the record of ``commit`` (full or abbreviated, 7+ hex digits), the newest if several."""
    commit = commit.strip().lower()
    if len(commit) < 7:
        return None
    hits = [i for i, r in enumerate(records) if r.commit.startswith(commit) or commit.startswith(r.commit)]
    return hits[-1] if hits else None


def standing(records: Sequence[HistoryRecord], *, profile: str, base: str, p50_ms: float | None,
             census_calls: int | None, window: int = STANDING_WINDOW) -> Standing | None:
    """None when the base is not in the profile's history."""
    mine = [r for r in records if r.profile == profile]
    at = find_commit(mine, base)
    if at is None:
        return None
    return Standing(base=mine[at], window=tuple(mine[max(0, at + 1 - window):at + 1]), p50_ms=p50_ms,
                    census_calls=census_calls)


def pr_standing(results: Results, records: Sequence[HistoryRecord] | None, base: str | None = None) -> HistoryStanding | None:
    """The run against main's history, for the comment: None without a history or with a base
    (``base``, else the one ``guard pr`` measured) that is not in it."""
    if not records:
        return None
    base = base or (results.pr.base.sha if results.pr is not None else None)
    if not base:
        return None
    run = results.run
    samples = run.ttft_client_s()
    p50 = round(to_ms(percentile(samples, 50)), 3) if samples else None  # as guard record keeps it
    calls = sum(c.calls for c in census_totals(run.census)) if run.census else None
    st = standing(records, profile=run.profile, base=base, p50_ms=p50, census_calls=calls)
    if st is None:
        return None
    b = st.base
    return HistoryStanding(
        base_commit=b.commit, base_profile=b.profile, base_ttft_p50_ms=b.ttft_p50_ms if b.has_ttft else None,
        base_census_calls=b.census_calls if b.census else None, base_machine=b.machine, p50_ms=p50,
        census_calls=calls, window=len(st.window), timed=len(st.timed), p50_range_ms=st.p50_range_ms,
        above=sum(r.ttft_p50_ms < p50 for r in st.timed) if st.rank_pct is not None else None, rank_pct=st.rank_pct)
