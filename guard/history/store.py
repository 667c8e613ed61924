"""The history store: one JSON line per `guard check` run on main (``history.jsonl``).

Each line is a ``HistoryRecord`` under a schema header (``guard/history``, described by
``record.schema.json`` beside this module): the commit, when and where it ran, TTFT p50/p90/p99 in
milliseconds (the percentiles of ``guard.judge.stats``, the same estimate the budgets use), and the
census totals per profiled image size with a digest of the whole census, so a change that moves
calls between functions without changing a total is still seen.

Versions: 1, every record with TTFT; 2 (this guard), TTFT may be absent (null percentiles, 0
samples): an ops-only run (``guard check --only ops``, ``guard pr --only ops``) records the census
per commit. A record with TTFT is still written as version 1, byte for byte as before, so a guard
that reads version 1 only keeps reading every line it can understand; version 1 lines are read as
they always were. The file's order is the order main
was measured in; ``append`` writes atomically (``guard.files``) and re-reads the new file before it
replaces the old one. Errors name ``file:line`` and the field.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import math
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from guard.errors import ConfigError, InvalidRunError, UsageError
from guard.files import write_text_atomic
from guard.history import jsonlines
from guard.model.readings import ImageSize, counts_only, parse_size, total_calls
from guard.model.records import Verdict, reasons_text, to_ms
from guard.model.results import Results
from guard.judge.stats import percentile

HISTORY_SCHEMA = "guard/history"
HISTORY_SCHEMA_VERSION = 2  # the newest this guard reads and writes
READABLE_VERSIONS = (1, 2)
SCHEMA_FILE = Path(__file__).with_name("record.schema.json")
PERCENTILES = (50, 90, 99)  # ttft_p50_ms, ttft_p90_ms, ttft_p99_ms
DIGEST_HEX = 16


@dataclass(frozen=True)
class CensusTotal:
    """All operator calls of one request at one image size, and how many functions issued them."""

    image_size: ImageSize
    calls: int
    functions: int


@dataclass(frozen=True)
class HistoryRecord:
    commit: str  # hex, 7..40 digits
    date: str  # ISO 8601 with a UTC offset: when the run started
    profile: str
    model: str
    machine: str  # "AMD EPYC (2 cores, avx512_bf16)"
    dtype: str | None
    ttft_p50_ms: float | None  # None: an ops-only run (census, no TTFT; schema version 2)
    ttft_p90_ms: float | None
    ttft_p99_ms: float | None
    samples: int  # 0 for an ops-only run
    census: tuple[CensusTotal, ...]
    census_digest: str | None  # None: the run had no census
    verdict: Verdict | None  # None: not known (a record made from a recorded pool)
    guard_version: str
    note: str = ""

    @property
    def census_calls(self) -> int:
        """All operator calls over the profiled image sizes: the census total the chart shows."""
        return sum(c.calls for c in self.census)

    @property
    def has_ttft(self) -> bool:
        return self.ttft_p50_ms is not None

    @property
    def schema_version(self) -> int:
        """The oldest version that holds this record: 1 with TTFT, 2 without."""
        return 1 if self.has_ttft else 2

    @property
    def key(self) -> tuple[str, str]:
        return self.commit, self.profile

    def census_changed_from(self, previous: HistoryRecord) -> bool:
        """The census of this commit differs from the previous record's (both measured one)."""
        if self.census_digest is None or previous.census_digest is None:
            return False
        return self.census_digest != previous.census_digest or self.census != previous.census


# ----------------------------------------------------------------------------- from a run
def census_totals(census: dict[str, dict[str, dict[str, int]]]) -> tuple[CensusTotal, ...]:
    """``RunRecord.census`` ("WxH" -> function -> op -> calls) as totals per size, smallest first."""
    out = []
    for size, functions in census.items():
        w, h = parse_size(size)
        out.append(CensusTotal((w, h), sum(total_calls(ops) for ops in functions.values()), len(functions)))
    return tuple(sorted(out, key=lambda c: (c.image_size[0] * c.image_size[1], c.image_size)))


COMMIT_HASH = re.compile(r"[0-9a-fA-F]{7,40}")  # how a flag may name a commit of main: abbreviated or whole


DATE_EXAMPLE = "2026-12-02T14:11:04+00:00"


def date_problem(text: str) -> str | None:
    """Why ``text`` is no date the history keeps (ISO 8601 with a UTC offset); None when it is one."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        return f"{text!r} is not an ISO 8601 date and time"
    return None if when.tzinfo is not None else f"{text!r} has no UTC offset"


def commit_flag(flag: str, value: str) -> str:
    """``value`` of ``flag`` (``--commit``, ``--history-base``) when it is a commit hash, else exit 2."""
    if not COMMIT_HASH.fullmatch(value):
        raise UsageError(f"{flag} {value!r} is not a commit hash (7 to 40 hex digits)")
    return value

def census_digest(census: dict[str, dict[str, dict[str, int]]]) -> str | None:
    if not census:
        return None
    text = json.dumps({k: counts_only(v) for k, v in census.items()}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:DIGEST_HEX]


def record_from_results(results: Results, *, commit: str | None = None, date: str | None = None,
                        note: str = "") -> HistoryRecord:
    """One history line from a results file: `guard check`'s, or `guard pr`'s (head's side: the run
    record of its candidate, the commit its head). A run without TTFT samples (``--only ops``) is
    recorded with its census and no TTFT; one with neither is refused. An invalid run is not history
    (exit 3)."""
    run = results.run
    if results.verdict == Verdict.INVALID:
        reasons = reasons_text(results.invalid_reasons) or "no reason recorded"
        raise InvalidRunError(f"the run is invalid ({reasons}): an invalid run is not recorded in the history")
    if run.injected:
        raise UsageError(f"the run had a regression injected on purpose ({run.injected}): it tested guard, not the "
                         "commit, so it is not recorded in the history", hint="record a run without --inject")
    samples = run.ttft_client_s()
    if not samples and not run.census:
        why = ("guard pr measured nothing: the pull request changed nothing under vllm/"
               if results.pr is not None and not results.pr.measured else "the results have neither TTFT samples nor a census")
        raise UsageError(f"{why}: the history keeps runs that measured TTFT or the operator census",
                         hint="record a `guard check` (or `guard pr`) run that profiled the engine")
    pr_head = results.pr.head.sha if results.pr is not None else None
    commit = commit or pr_head or run.environment.git_commit
    if not commit:
        raise UsageError("the results do not say which commit was measured (environment.git_commit is empty)",
                         hint="pass --commit SHA")
    if samples:
        ttft = {f"ttft_p{p}_ms": round(to_ms(percentile(samples, p)), 3) for p in PERCENTILES}
    else:
        ttft = dict.fromkeys((f"ttft_p{p}_ms" for p in PERCENTILES), None)
    record = HistoryRecord(
        commit=str(commit).lower(),
        date=date or run.started_at or dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        profile=run.profile, model=run.model, machine=run.environment.machine_summary(),
        dtype=run.environment.dtype, **ttft,
        samples=len(samples), census=census_totals(run.census), census_digest=census_digest(run.census),
        verdict=results.verdict, guard_version=results.guard_version, note=note)
    _check_record(record_to_dict(record), "the new record", None)
    return record


# ----------------------------------------------------------------------------- JSON lines
def record_to_dict(r: HistoryRecord) -> dict[str, Any]:
    d: dict[str, Any] = {
        "schema": HISTORY_SCHEMA, "schema_version": r.schema_version, "commit": r.commit, "date": r.date,
        "profile": r.profile, "model": r.model, "machine": r.machine, "dtype": r.dtype,
        "ttft_p50_ms": r.ttft_p50_ms, "ttft_p90_ms": r.ttft_p90_ms, "ttft_p99_ms": r.ttft_p99_ms,
        "samples": r.samples,
        "census": [{"image_size": list(c.image_size), "calls": c.calls, "functions": c.functions} for c in r.census],
        "census_digest": r.census_digest, "verdict": None if r.verdict is None else str(r.verdict),
        "guard_version": r.guard_version,
    }
    if r.note:
        d["note"] = r.note
    return d


def record_from_dict(d: dict[str, Any]) -> HistoryRecord:
    return HistoryRecord(
        commit=d["commit"], date=d["date"], profile=d["profile"], model=d["model"], machine=d["machine"],
        dtype=d["dtype"], ttft_p50_ms=_ms(d["ttft_p50_ms"]), ttft_p90_ms=_ms(d["ttft_p90_ms"]),
        ttft_p99_ms=_ms(d["ttft_p99_ms"]), samples=d["samples"],
        census=tuple(CensusTotal(tuple(c["image_size"]), c["calls"], c["functions"]) for c in d["census"]),
        census_digest=d["census_digest"], verdict=None if d["verdict"] is None else Verdict(d["verdict"]),
        guard_version=d["guard_version"], note=d.get("note", ""))


def _ms(value: Any) -> float | None:
    return None if value is None else float(value)


def to_line(r: HistoryRecord) -> str:
    return json.dumps(record_to_dict(r), separators=(",", ":"), allow_nan=False) + "\n"


def _check_record(d: Any, path: str, line: int | None) -> None:
    """Schema, then what a schema cannot say: a date with its UTC offset, finite numbers."""

    version = d.get("schema_version") if isinstance(d, dict) else None
    if isinstance(d, dict) and d.get("schema") == HISTORY_SCHEMA and isinstance(version, int) \
            and version not in READABLE_VERSIONS:
        raise ConfigError(path, line, "schema_version",
                          f"schema version {version}; this guard reads versions "
                          f"{', '.join(map(str, READABLE_VERSIONS))}",
                          hint="a newer guard wrote this history: run `guard history` with that guard")
    jsonlines.schema_problem(SCHEMA_FILE, d, path, line, f"{HISTORY_SCHEMA} record", "(record)",
                             "history lines are written by `guard record`; fix or remove this line")
    problem = date_problem(d["date"])
    if problem:
        raise ConfigError(path, line, "date", problem, hint=f"write it as {DATE_EXAMPLE}")
    absent = [p for p in PERCENTILES if d[f"ttft_p{p}_ms"] is None]
    if absent and len(absent) != len(PERCENTILES):
        raise ConfigError(path, line, f"ttft_p{absent[0]}_ms",
                          "null while other percentiles are not: a record has all three TTFT percentiles or none")
    if absent and d["samples"] != 0:
        raise ConfigError(path, line, "samples", f"{d['samples']} samples but no TTFT percentiles")
    if absent and not d["census"]:
        raise ConfigError(path, line, "census", "no TTFT and no census: the record holds nothing measured")
    for p in PERCENTILES:
        if not absent and not math.isfinite(d[f"ttft_p{p}_ms"]):
            raise ConfigError(path, line, f"ttft_p{p}_ms", "not a finite number")


def parse_history(text: str, path: str) -> list[HistoryRecord]:
    """Every line validated; a commit measured twice for one profile is an error at the second line."""
    records: list[HistoryRecord] = []
    seen: dict[tuple[str, str], int] = {}
    for n, d in jsonlines.objects(text, path, noun="record", store="a history file"):
        _check_record(d, path, n)
        record = record_from_dict(d)
        if record.key in seen:
            raise ConfigError(path, n, "commit", f"{record.commit} ({record.profile}) is already on line {seen[record.key]}",
                              hint="`guard record --replace` replaces a commit's record in place")
        seen[record.key] = n
        records.append(record)
    return records


def load_history(path: Path | str) -> list[HistoryRecord]:
    path = Path(path)
    text = jsonlines.read_text(path, "`guard record --history PATH` creates it; in CI it lives on the guard-history branch")
    return parse_history(text, str(path))


def append(path: Path | str, record: HistoryRecord, *, replace: bool = False) -> tuple[list[HistoryRecord], bool]:
    """Add ``record`` at the end (or, with ``replace``, in place of the same commit and profile).
    Returns the new history and whether a record was replaced. Atomic: the new file is re-read
    before it takes the old one's place."""
    path = Path(path)
    with locked_folder(Path(os.path.realpath(path)).parent):  # read, change, replace: one writer at a time
        records = load_history(path) if path.exists() else []
        at = next((i for i, r in enumerate(records) if r.key == record.key), None)
        if at is not None and not replace:
            raise UsageError(f"{path}: commit {record.commit} ({record.profile}) is already recorded (line {at + 1})",
                             hint="pass --replace to replace that record with this run's")
        records = [*records[:at], record, *records[at + 1:]] if at is not None else [*records, record]
        write_text_atomic(path, "".join(to_line(r) for r in records), check=lambda tmp: parse_history(
            tmp.read_text(encoding="utf-8"), str(path)))
    return records, at is not None


@contextlib.contextmanager
def locked_folder(folder: Path) -> Iterator[None]:
    """An exclusive lock on the store's folder (flock on its descriptor: no lock file to commit by
    mistake): two `guard record` runs at once would each read the old file and one record be lost."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def for_profile(records: Sequence[HistoryRecord], profile: str | None) -> tuple[str, list[HistoryRecord]]:
    """The records of one profile, in the file's order; with ``profile`` None the file must hold one."""
    profiles = list(dict.fromkeys(r.profile for r in records))
    if profile is None:
        if len(profiles) > 1:
            raise UsageError(f"the history holds several profiles ({', '.join(profiles)})", hint="pass --profile NAME")
        if not profiles:
            raise UsageError("the history is empty", hint="`guard record` adds a run to it")
        profile = profiles[0]
    chosen = [r for r in records if r.profile == profile]
    if not chosen:
        raise UsageError(f"no record of profile {profile!r} in the history",
                         hint=f"profiles in it: {', '.join(profiles) or 'none'}")
    return profile, chosen
