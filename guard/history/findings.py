"""Shadow mode's store: pull requests' findings and how each was judged (``findings.jsonl``).

Two kinds of line, each a compact JSON object under the schema header ``guard/findings`` (version
1, described by ``findings.schema.json`` beside this module) and validated wherever it is read:

- ``run`` (``guard record --findings``): one pull request's run as the poster judged it: the PR
  number, the head commit measured, model and profile, the verdict, every failed check as a
  ``Finding`` (its key, the function, measured against its budget or census baseline), and
  ``accepted_by`` when the poster judged with head's budgets because that login accepted the change.
- ``judgement`` (``guard judge-finding``): a person's word on one finding: accepted, fixed, false
  alarm, or open again; by whom, when and why.

The file only grows: a judgement never rewrites a run line, and a later line wins
(``guard.history.outcomes`` reads them in order). A run is identified by (PR, head, model,
profile): recording the same result again appends nothing; another result for the same run (a
re-run, an acceptance that came later) is appended after it. Errors name ``file:line`` and the field.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from guard.errors import ConfigError, UsageError
from guard.files import write_text_atomic
from guard.history import jsonlines
from guard.history.store import DATE_EXAMPLE, date_problem, locked_folder
from guard.model.readings import size
from guard.model.records import RunRecord, Verdict
from guard.model.results import Results
from guard.model.checks import CensusCheck, Check, OpCheck, LatencyCheck, RatioCheck

FINDINGS_SCHEMA = "guard/findings"
FINDINGS_SCHEMA_VERSION = 1
SCHEMA_FILE = Path(__file__).with_name("findings.schema.json")
RUN, JUDGEMENT = "run", "judgement"  # the two kinds of line
LOGIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,38}(\[bot\])?")  # a GitHub login, as the schema has it


class Outcome(StrEnum):
    """How a finding ended. ``fixed`` also comes by itself: a later run of the pull request without it."""

    OPEN = "open"
    FIXED = "fixed"
    ACCEPTED = "accepted"  # head's budget change was accepted: the finding is what the PR meant to do
    FALSE_ALARM = "false_alarm"

    @property
    def words(self) -> str:
        return self.value.replace("_", " ")

    @property
    def flag(self) -> str:
        """As ``guard judge-finding --as`` takes it."""
        return self.value.replace("_", "-")


@dataclass(frozen=True)
class Finding:
    """One failed check of a run: what the poster's verdict rested on."""

    key: str  # the check's identity as text ("ops mask_path 640x480 aten::_index_put_impl_"): the same in every run
    label: str
    function: str | None  # "file:function" of the code it measured; None for TTFT
    measured: float | None  # in ``unit``; None: a census function that no longer issues any op
    budget: float | None  # TTFT and op budgets
    baseline: float | None  # the census baseline's calls (None: a function the baseline does not have)
    unit: str  # "ms", "%" (TTFT against the baseline side) or "calls"


@dataclass(frozen=True)
class PullRequestRun:
    """One run of a pull request as the poster judged it (a ``run`` line)."""

    pr: int
    head: str  # the head commit measured
    base: str | None  # the base ``guard pr`` measured; None for a ``guard check`` run
    model: str
    profile: str
    date: str  # when the run started
    recorded_at: str  # when the line was appended
    verdict: Verdict
    findings: tuple[Finding, ...]
    accepted_by: str | None  # the login whose acceptance made head's budgets judge
    guard_version: str
    note: str = ""

    @property
    def identity(self) -> tuple[int, str, str, str]:
        return self.pr, self.head, self.model, self.profile

    @property
    def subject(self) -> tuple[int, str, str]:
        """What a finding belongs to: the pull request, on one model and profile."""
        return self.pr, self.model, self.profile

    def same_result(self, other: PullRequestRun) -> bool:
        """The same run recorded again (when it was recorded and its note aside)."""
        mine = (self.identity, self.base, self.date, self.verdict, self.findings, self.accepted_by)
        return mine == (other.identity, other.base, other.date, other.verdict, other.findings, other.accepted_by)


@dataclass(frozen=True)
class Judgement:
    """A person's word on one finding (a ``judgement`` line)."""

    pr: int
    model: str
    profile: str
    finding: str  # the finding's key
    outcome: Outcome
    by: str  # a GitHub login
    date: str
    note: str = ""

    @property
    def subject(self) -> tuple[int, str, str]:
        return self.pr, self.model, self.profile


Line = PullRequestRun | Judgement


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def login_flag(flag: str, value: str) -> str:
    """``value`` of ``flag`` (``--by``, ``--accepted-by``) when it is a GitHub login, else exit 2."""
    value = value.removeprefix("@")
    if not LOGIN.fullmatch(value):
        raise UsageError(f"{flag} {value!r} is not a GitHub login (letters, digits and hyphens, at most 39)")
    return value


# ----------------------------------------------------------------------------- from a run
def finding_key(check: Check) -> str:
    """The check's key (``Check.key``) as one line of text: what ``guard judge-finding --finding`` names."""
    return " ".join(size(part) if isinstance(part, tuple) else str(part) for part in check.key)


def _function_of_scope(run: RunRecord, check: OpCheck) -> str | None:
    return next((c.where for c in run.op_counts
                 if c.scope == check.scope and tuple(c.image_size) == tuple(check.image_size) and c.where), None)


def finding_of(check: Check, run: RunRecord) -> Finding:
    key, label = finding_key(check), check.label
    if isinstance(check, LatencyCheck):
        return Finding(key, label, None, check.measured_ms, check.budget_ms, None, "ms")
    if isinstance(check, RatioCheck):
        return Finding(key, label, None, check.measured_pct, check.budget_pct, None, "%")
    if isinstance(check, OpCheck):
        return Finding(key, label, _function_of_scope(run, check), check.measured_calls, check.budget_calls, None, "calls")
    if isinstance(check, CensusCheck):
        return Finding(key, label, check.function, check.measured_calls, None, check.baseline_calls, "calls")
    raise TypeError(f"no finding for a {type(check).__name__}")


def run_from_results(results: Results, *, pr: int, head: str | None = None, date: str | None = None,
                     accepted_by: str | None = None, note: str = "") -> PullRequestRun:
    """A ``run`` line from results as the poster judged them. An invalid run is recorded without
    findings (its checks cannot be trusted); a canary run (``--inject``) tested guard, not the pull
    request, and is refused."""
    run = results.run
    if run.injected:
        raise UsageError(f"the run had a regression injected on purpose ({run.injected}): it tested guard, not the "
                         "pull request, so its findings are not recorded", hint="record a run without --inject")
    head = head or (results.pr.head.sha if results.pr is not None else None) or run.environment.git_commit
    if not head:
        raise UsageError("the results do not say which commit was measured (environment.git_commit is empty)",
                         hint="pass --sha SHA, the pull request's head commit")
    failed = () if results.verdict == Verdict.INVALID else tuple(finding_of(c, run) for c in results.failed)
    record = PullRequestRun(
        pr=pr, head=head.lower(), base=results.pr.base.sha.lower() if results.pr is not None else None,
        model=run.model, profile=run.profile, date=date or run.started_at or now(), recorded_at=now(),
        verdict=results.verdict, findings=failed, accepted_by=accepted_by, guard_version=results.guard_version,
        note=note)
    _check_line(line_to_dict(record), "the new record", None)
    return record


# ----------------------------------------------------------------------------- JSON lines
def _header(kind: str) -> dict[str, Any]:
    return {"schema": FINDINGS_SCHEMA, "schema_version": FINDINGS_SCHEMA_VERSION, "kind": kind}


def line_to_dict(line: Line) -> dict[str, Any]:
    if isinstance(line, Judgement):
        d = {**_header(JUDGEMENT), "pr": line.pr, "model": line.model, "profile": line.profile,
             "finding": line.finding, "outcome": str(line.outcome), "by": line.by, "date": line.date}
    else:
        d = {**_header(RUN), "pr": line.pr, "head": line.head, "base": line.base, "model": line.model,
             "profile": line.profile, "date": line.date, "recorded_at": line.recorded_at, "verdict": str(line.verdict),
             "accepted_by": line.accepted_by,
             "findings": [{"key": f.key, "label": f.label, "function": f.function, "measured": f.measured,
                           "budget": f.budget, "baseline": f.baseline, "unit": f.unit} for f in line.findings],
             "guard_version": line.guard_version}
    if line.note:
        d["note"] = line.note
    return d


def line_from_dict(d: dict[str, Any]) -> Line:
    if d["kind"] == JUDGEMENT:
        return Judgement(pr=d["pr"], model=d["model"], profile=d["profile"], finding=d["finding"],
                         outcome=Outcome(d["outcome"]), by=d["by"], date=d["date"], note=d.get("note", ""))
    return PullRequestRun(
        pr=d["pr"], head=d["head"], base=d["base"], model=d["model"], profile=d["profile"], date=d["date"],
        recorded_at=d["recorded_at"], verdict=Verdict(d["verdict"]),
        findings=tuple(Finding(**f) for f in d["findings"]), accepted_by=d["accepted_by"],
        guard_version=d["guard_version"], note=d.get("note", ""))


def to_line(line: Line) -> str:
    return json.dumps(line_to_dict(line), separators=(",", ":"), allow_nan=False) + "\n"


def _check_line(d: Any, path: str, line: int | None) -> None:
    """Schema, then what a schema cannot say: dates with their UTC offset."""

    if isinstance(d, dict) and d.get("schema") == FINDINGS_SCHEMA and isinstance(d.get("schema_version"), int) \
            and d["schema_version"] != FINDINGS_SCHEMA_VERSION:
        raise ConfigError(path, line, "schema_version", f"schema version {d['schema_version']}; this guard reads "
                          f"version {FINDINGS_SCHEMA_VERSION}",
                          hint="a newer guard wrote this store: read it with that guard")
    jsonlines.schema_problem(SCHEMA_FILE, d, path, line, f"{FINDINGS_SCHEMA} line", "(line)",
                             "lines are written by `guard record --findings` and `guard judge-finding`; "
                             "fix or remove this one")
    for name in ("date", "recorded_at"):
        if name in d and (problem := date_problem(d[name])):
            raise ConfigError(path, line, name, problem, hint=f"write it as {DATE_EXAMPLE}")


def parse_findings(text: str, path: str) -> list[Line]:
    """Every line validated, in the file's order; a judgement must name a finding an earlier run
    line of the same pull request, model and profile holds."""
    lines: list[Line] = []
    seen: set[tuple[tuple[int, str, str], str]] = set()
    for n, d in jsonlines.objects(text, path, noun="line", store="a findings store"):
        _check_line(d, path, n)
        line = line_from_dict(d)
        if isinstance(line, PullRequestRun):
            seen |= {(line.subject, f.key) for f in line.findings}
        elif (line.subject, line.finding) not in seen:
            raise ConfigError(path, n, "finding", f"{line.finding!r}: no earlier run line of pull request #{line.pr} "
                              f"({line.model}, {line.profile}) has this finding",
                              hint="`guard judge-finding` judges findings `guard record --findings` recorded")
        lines.append(line)
    return lines


def load_findings(path: Path | str) -> list[Line]:
    path = Path(path)
    return parse_findings(jsonlines.read_text(path, "`guard record --findings PATH --pr N` creates it"), str(path))


# ----------------------------------------------------------------------------- appending
def _append(path: Path, line: Line) -> int:
    """Add ``line`` at the end, the earlier lines byte for byte; the new file is re-read before it
    replaces the old one. Returns its line number. The caller holds the folder's lock."""
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    if old and not old.endswith("\n"):
        old += "\n"
    write_text_atomic(path, old + to_line(line), check=lambda tmp: parse_findings(tmp.read_text(encoding="utf-8"),
                                                                                    str(path)))
    return old.count("\n") + 1


@dataclass(frozen=True)
class Recorded:
    """What ``record_run`` did: the line the run is on, and the line of an earlier record of it."""

    line: int
    appended: bool  # False: the same result was already on ``line``
    earlier: PullRequestRun | None = None  # another result of the same run, recorded before
    earlier_line: int | None = None


def record_run(path: Path | str, run: PullRequestRun) -> Recorded:
    """Append ``run`` unless its last record holds the same result (idempotent for a re-run of the
    recording step); another result of the same run is appended after the earlier one."""
    path = Path(path)
    with locked_folder(Path(os.path.realpath(path)).parent):  # read, append, replace: one writer at a time
        lines = load_findings(path) if path.exists() else []
        earlier = [(n, r) for n, r in enumerate(lines, start=1)
                   if isinstance(r, PullRequestRun) and r.identity == run.identity]
        if earlier and earlier[-1][1].same_result(run):
            return Recorded(line=earlier[-1][0], appended=False)
        at = _append(path, run)
    return Recorded(line=at, appended=True, earlier=earlier[-1][1] if earlier else None,
                    earlier_line=earlier[-1][0] if earlier else None)


def record_judgements(path: Path | str, *, pr: int, findings: Sequence[str], model: str | None, profile: str | None,
                      outcome: Outcome, by: str, note: str = "") -> list[tuple[Judgement, int]]:
    """Append a person's judgement of each of ``findings`` (keys) of pull request ``pr``, each line
    with its number; the model and profile may be left out where the pull request has the finding on
    one only. Every key is checked before anything is appended: UsageError (exit 2) naming the store
    when one is not there."""
    path = Path(path)
    with locked_folder(Path(os.path.realpath(path)).parent):
        lines = load_findings(path)
        known: dict[tuple[str, str], set[str]] = {}  # (model, profile) -> the keys of its findings
        for r in lines:
            if isinstance(r, PullRequestRun) and r.pr == pr and model in (None, r.model) and profile in (None, r.profile):
                known.setdefault((r.model, r.profile), set()).update(f.key for f in r.findings)
        judgements = [Judgement(pr, *_where(path, pr, key, known, narrowed=bool(model or profile)), finding=key,
                                outcome=outcome, by=by, date=now(), note=note) for key in dict.fromkeys(findings)]
        for judgement in judgements:
            _check_line(line_to_dict(judgement), "the new judgement", None)
        return [(j, _append(path, j)) for j in judgements]


def _where(path: Path, pr: int, key: str, known: dict[tuple[str, str], set[str]], narrowed: bool) -> tuple[str, str]:
    """The one (model, profile) of pull request ``pr`` that has finding ``key``."""
    where = [subject for subject, keys in known.items() if key in keys]
    if not where:
        keys = sorted(set().union(*known.values()))
        why = "" if known else " (no run of it is recorded" + (" on that model and profile)" if narrowed else ")")
        raise UsageError(f"{path}: pull request #{pr} has no finding {key!r}{why}",
                         hint=("its findings: " + "; ".join(keys)) if keys else "`guard history --findings PATH` lists them")
    if len(where) > 1:
        raise UsageError(f"{path}: pull request #{pr} has {key!r} on " + ", ".join(f"{m} ({p})" for m, p in where),
                         hint="pass --model and --profile")
    return where[0]


def pr_number_flag(text: str) -> int:
    """``--pr``: a pull request's number (argparse type: a bad one is exit 2 naming the flag)."""
    import argparse

    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a pull request's number")
    return int(text)
