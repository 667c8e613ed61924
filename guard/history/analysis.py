"""One profile's history read as a whole: per commit, whether the census changed, whether the
machine changed, and where a lasting TTFT shift starts (``guard.history.changepoints``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from guard.history.changepoints import DEFAULT, Method, Shift, change_points
from guard.history.store import HistoryRecord


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
    shifts = {s.index: s for s in change_points([r.ttft_p50_ms for r in records], method)}
    rows = []
    for i, r in enumerate(records):
        prev = records[i - 1] if i else None
        rows.append(Row(record=r, census_changed=prev is not None and r.census_changed_from(prev),
                        machine_changed=prev is not None and (r.machine, r.dtype) != (prev.machine, prev.dtype),
                        shift=shifts.get(i)))
    return Analysis(profile=profile, rows=tuple(rows), method=method)


def short(commit: str) -> str:
    return commit[:7]
