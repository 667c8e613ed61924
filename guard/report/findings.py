"""What a reviewer must see: the run's findings, one per function, and its one-line summary.

A pull request gets a comment only when it has a finding (guard comment, docs/github.md); this
module decides what counts, so the comment, report.md and the job summary agree. A finding is:

- a failed check. Checks of one vLLM function are one finding, whatever the image size: its census
  checks, and the op budgets whose calls came mostly from it (the top call site of the failed op,
  matched by file and function name). An op budget no census function explains is one finding per
  code path (scope); TTFT and A/B ratio failures are one finding each;
- an invalid run: the status says ``error`` and the why does not fit in its 140 characters;
- in ``guard pr`` only, a census change within the rule that added op calls (beyond calls that
  merely moved there) to a function the pull request added lines to: the reviewer is looking at
  that code, and its cost is not zero. Shrinkage, calls that only moved, growth elsewhere and every
  other notice (TTFT not judged on this CPU, stale budgets, ...) are not findings: they are in
  report.md and, when a comment is posted anyway, under its notices.

Pure: results in, plain data out; markdown.py renders it.
"""

from __future__ import annotations

from dataclasses import dataclass

from guard.config import models
from guard.model.records import TOTAL_OPS, ScopeCounts, Status, Verdict
from guard.model.results import Results
from guard.model.checks import CensusCheck, OpCheck, LatencyCheck, RatioCheck


@dataclass(frozen=True)
class Finding:
    kind: str  # "function" | "ops" (a code path no function explains) | "ttft" | "ab" | "invalid" | "census_notice"
    name: str  # the function ("file:qualname"), the scope, or "" for ttft / ab / invalid
    census: tuple[CensusCheck, ...] = ()  # every image size of this function
    ops: tuple[OpCheck, ...] = ()  # failed op budgets attributed here
    ttft: tuple[LatencyCheck | RatioCheck, ...] = ()

    @property
    def metrics(self) -> str:
        """The latency metrics a "ttft" or "ab" finding's checks judged: ``TTFT``, ``TTFT/ITL``."""
        return "/".join(dict.fromkeys(c.metric.upper() for c in self.ttft))


def _split(function: str) -> tuple[str, str]:
    """"file.py:Outer.<locals>.inner" -> ("file.py", "inner")."""
    path, _, qualname = function.rpartition(":")
    return path, qualname.rsplit(".", 1)[-1]


def _top_site(results: Results, c: OpCheck) -> tuple[str, str] | None:
    """(file, function) of the site that issued most of a failed op budget's calls."""
    counts: ScopeCounts | None = next((s for s in results.run.op_counts
                                       if s.scope == c.scope and tuple(s.image_size) == tuple(c.image_size)), None)
    if counts is None:
        return None
    sites = [s for s in counts.sites if c.op == TOTAL_OPS or s.op == c.op]
    if not sites:
        return None
    top = max(sites, key=lambda s: s.calls)
    return top.location.rpartition(":")[0], top.function


def code_owner(function: str) -> str:
    """"shared" when the function's file runs for every model (guard.config.models), else "model"."""
    return "shared" if models.is_shared(function) else "model"


def owner_text(function: str, model: str) -> str:
    """Who a census finding is attributed to, in a sentence."""
    if code_owner(function) == "shared":
        return "shared code: every guarded model runs it, so the finding is every model's"
    return f"{model}'s own code (its model files)"


def _pr_functions(results: Results) -> set[str]:
    return {f.function for f in results.pr.function_changes} if results.pr is not None else set()


def added_calls(c: CensusCheck) -> int:
    """Op calls a function gained beyond those that only moved into it from elsewhere."""
    return (c.measured_calls or 0) - (c.baseline_calls or 0) - c.moved_calls


def findings(results: Results) -> list[Finding]:
    """The run's findings in reading order: invalid, TTFT, A/B, then functions and code paths."""
    if results.verdict == Verdict.INVALID:
        return [Finding("invalid", "")]
    out: list[Finding] = []
    failed = results.failed
    ttft = tuple(c for c in failed if isinstance(c, LatencyCheck))
    if ttft:
        out.append(Finding("ttft", "", ttft=ttft))
    ratio = tuple(c for c in failed if isinstance(c, RatioCheck))
    if ratio:
        out.append(Finding("ab", "", ttft=ratio))

    census: dict[str, list[CensusCheck]] = {}
    for c in failed:
        if isinstance(c, CensusCheck):
            census.setdefault(c.function, []).append(c)
    by_site = {_split(fn): fn for fn in census}
    ops: dict[str, list[OpCheck]] = {}  # function or "scope:<name>" -> failed op budgets
    for c in failed:
        if isinstance(c, OpCheck):
            site = _top_site(results, c)
            ops.setdefault((by_site.get(site) if site else None) or f"scope:{c.scope}", []).append(c)
    for fn, checks in census.items():
        out.append(Finding("function", fn, census=tuple(sorted(checks, key=lambda c: tuple(c.image_size))),
                           ops=tuple(ops.pop(fn, ()))))
    for key, checks in ops.items():
        out.append(Finding("ops", key.removeprefix("scope:"), ops=tuple(checks)))

    edited = _pr_functions(results)
    within: dict[str, list[CensusCheck]] = {}
    for c in results.census_checks:
        if c.status != Status.FAIL and c.function in edited and c.function not in census and added_calls(c) > 0:
            within.setdefault(c.function, []).append(c)
    out += [Finding("census_notice", fn, census=tuple(sorted(cs, key=lambda c: tuple(c.image_size))))
            for fn, cs in within.items()]
    return out


def has_finding(results: Results) -> bool:
    return bool(findings(results))


def summary_line(results: Results) -> str:
    """One line for the job summary, posted or not: verdict, model x profile, and what it rests on."""
    where = f"{results.run.model} on {results.run.profile}"
    found = findings(results)
    n = len(results.judged)
    if results.verdict == Verdict.INVALID:
        first = results.invalid_reasons[0].text.partition("\n")[0] if results.invalid_reasons else "no reason recorded"
        return f"guard {where}: invalid run: {first}"
    if results.pr is not None and not results.pr.measured:
        return f"guard {where}: not measured: the pull request changes nothing under vllm/"
    if results.verdict == Verdict.REGRESSION:
        return (f"guard {where}: regression: {len(results.failed)} of {n} budgets exceeded, "
                f"{len(found)} finding(s): " + ", ".join(_finding_name(f) for f in found))
    head = ("not measurable here: compiled code or dependencies changed; " if results.verdict == Verdict.NOT_MEASURABLE
            else "pass: ")
    line = f"guard {where}: {head}all {n} measured budgets held"
    if found:
        line += f"; {len(found)} edited function(s) grew within the census rule"
    return line


def _finding_name(f: Finding) -> str:
    if f.kind in ("ttft", "ab"):  # TTFT's, or with TPOT / ITL beside it
        return f.metrics + " vs baseline" * (f.kind == "ab")
    return {"invalid": "invalid run"}.get(f.kind) or _split(f.name)[1] or f.name


__all__ = ["Finding", "findings", "has_finding", "summary_line", "added_calls", "code_owner", "owner_text"]
