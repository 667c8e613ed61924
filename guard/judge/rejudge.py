"""The verdict is guard's, not the artifact's: re-judge a results.json from its run record.

A results.json that reaches ``guard comment`` in the privileged workflow was written by the pull
request's run, so its ``verdict`` and ``checks`` are claims. ``rejudge`` evaluates the recorded run
(samples, op counts, census; for A/B both sides) again with the default branch's guard against the
default branch's thresholds file and the census baseline beside it, through the same functions
``guard check`` judged it with (``guard.judge.evaluate.evaluate`` / ``evaluate_ab``), the profile taken
as the run ran it (engine mode, the float32 fallback). It refuses a file that contradicts itself or
the recomputation: a verdict that its own checks do not support, or a measurement in a check that
the run record does not hold. The commit status and the comment then come from the re-derived result.
"""

from __future__ import annotations

import dataclasses

import math
from typing import Any

from guard.model.records import ABRecord
from guard.config.budgets import Profile, Thresholds
from guard.config.census import read_baseline
from guard.errors import UsageError
from guard.judge.evaluate import evaluate, evaluate_ab, evaluate_pr
from guard.measure.fit import as_it_ran
from guard.model.verdict import self_contradiction, settled
from guard.model.records import RunRecord
from guard.model.results import Results
from guard.model.checks import CensusCheck, Check, OpCheck, LatencyCheck, RatioCheck
from guard.sanitize import one_line


def _same_number(a: float, b: float) -> bool:
    """Equal as results.json writes them (milliseconds rounded to 0.1)."""
    return a == b or (math.isfinite(a) and math.isfinite(b) and abs(a - b) <= 0.05 + 1e-9 * max(abs(a), abs(b)))


def _measurement_differs(c: Check, f: Check) -> str | None:
    """How the stored check's measurement differs from the one its run record gives (None: it does not)."""
    label = one_line(c.label, limit=120)
    if isinstance(c, LatencyCheck) and isinstance(f, LatencyCheck):
        if not (_same_number(c.measured_ms, f.measured_ms) and c.samples == f.samples):
            return (f"{label} says {c.measured_ms:g} ms over {c.samples} samples; "
                    f"its run record gives {f.measured_ms:g} ms over {f.samples}")
    elif isinstance(c, RatioCheck) and isinstance(f, RatioCheck):
        if not (_same_number(c.measured_pct, f.measured_pct) and c.pairs == f.pairs
                and _same_number(c.candidate_ms, f.candidate_ms) and _same_number(c.baseline_ms, f.baseline_ms)):
            return (f"{label} says {c.measured_pct:+g} % over {c.pairs} pairs; "
                    f"its run record gives {f.measured_pct:+g} % over {f.pairs}")
    elif isinstance(c, (OpCheck, CensusCheck)) and isinstance(f, (OpCheck, CensusCheck)):
        if c.measured_calls != f.measured_calls:
            return f"{label} says {c.measured_calls} calls; its run record gives {f.measured_calls}"
    return None


def _rule_of_census(results: Results) -> dict[str, Any] | None:
    """The census rule a result was judged by, without the baseline's file names (a checkout's paths)."""
    rule = results.profile_config.get("census")
    if not isinstance(rule, dict):
        return None
    return {k: v for k, v in rule.items() if k not in ("baseline", "baseline_without_native_bf16", "baseline_with_amx", "not_judged")}


def _same_budget(c: Check, f: Check, stored: Results, fresh: Results) -> bool:
    """Both checks were judged by the same budget, so the same measurement must give the same status."""
    if isinstance(c, LatencyCheck) and isinstance(f, LatencyCheck):
        return _same_number(c.budget_ms, f.budget_ms) and c.confidence == f.confidence
    if isinstance(c, RatioCheck) and isinstance(f, RatioCheck):
        return (_same_number(c.budget_pct, f.budget_pct) and c.confidence == f.confidence
                and c.fail_confidence == f.fail_confidence)
    if isinstance(c, OpCheck) and isinstance(f, OpCheck):
        return c.budget_calls == f.budget_calls and c.rule == f.rule
    if isinstance(c, CensusCheck) and isinstance(f, CensusCheck):  # the same baseline counts, by the same rule
        rule = _rule_of_census(stored)
        return (c.baseline_calls == f.baseline_calls and c.op_deltas == f.op_deltas
                and rule is not None and rule == _rule_of_census(fresh))
    return False


def contradictions(stored: Results, fresh: Results) -> list[str]:
    out = []
    if contradiction := self_contradiction(stored):
        out.append(contradiction)
    by_key = {f.key: f for f in fresh.checks}
    for c in stored.checks:
        f = by_key.get(c.key)
        if f is None:
            continue  # a budget the default branch does not have (or a census function it does not differ in)
        differs = _measurement_differs(c, f)
        if differs:
            out.append(differs)
        elif _same_budget(c, f, stored, fresh) and c.status != f.status:
            out.append(f"{one_line(c.label, limit=120)} says '{c.status}' where the same budget and measurement "
                       f"give '{f.status}'")
    if stored.ab is not None and fresh.ab is not None:
        if stored.ab.pairs != fresh.ab.pairs:
            out.append(f"its A/B pairs ({len(stored.ab.pairs)}) are not the ones its two sides' requests give "
                       f"({len(fresh.ab.pairs)})")
        if stored.ab.op_diff != fresh.ab.op_diff:
            out.append("its A/B op-count diff is not the one its two sides' op counts give")
    return out


def judged_profile(run: RunRecord, thresholds: Thresholds, *, source: str) -> Profile:
    """The default branch's profile for ``run``, as it ran: in its engine mode (server
    TTFT budgets for a server run) and, where the engine fell back from bfloat16, with that dtype and
    its census baseline (``Profile.on_cpu``) — the same profile ``guard check`` judged it with."""
    profile = thresholds.profiles.get(run.profile)
    if profile is None:
        raise UsageError(f"{source}: measured with profile '{one_line(run.profile, 60)}', which "
                         f"{thresholds.path} (the default branch's thresholds) does not have: cannot re-judge it; "
                         "refusing to post")
    if run.model != thresholds.model:
        raise UsageError(f"{source}: measured model '{one_line(run.model, 60)}', but {thresholds.path} is "
                         f"for '{thresholds.model}'; refusing to post")
    env = run.environment  # judged as it ran: float32 and its census, or AMX's census
    profile = as_it_ran(profile, env)
    return profile.with_engine_mode(run.environment.engine_mode)


def recompute(stored: Results, profile: Profile) -> Results:
    """``stored``'s run judged by ``profile`` exactly as ``guard check`` judges a run: A/B results
    through evaluate_ab from their two recorded sides, the rest through evaluate with the census
    baseline the profile names (resolved beside the thresholds file it was loaded from)."""
    if stored.pr is not None and stored.ab is None:  # guard pr measured nothing (same Python, or a side did not import)
        return settled(stored)  # no checks: its reasons and the pull request's unmeasurable files decide
    if stored.ab is not None:
        rec = ABRecord(candidate=stored.run, baseline=stored.ab.baseline, baseline_python=stored.ab.baseline_python,
                       order=list(stored.ab.order))
        if stored.pr is not None:  # guard pr: base is the baseline side, judged as guard pr judges it
            return evaluate_pr(profile, rec, stored.pr, guard_version=stored.guard_version,
                               census_baseline=read_baseline(profile.census))
        return evaluate_ab(profile, rec, guard_version=stored.guard_version)
    return evaluate(profile, stored.run, guard_version=stored.guard_version,
                    census_baseline=read_baseline(profile.census))


def rejudge(stored: Results, thresholds: Thresholds, *, source: str) -> Results:
    """Re-derive ``stored``'s verdict against ``thresholds`` (the default branch's); UsageError (exit 2,
    nothing posted) when the file contradicts itself or its own run record."""
    # the run as judged here: against the default branch's file, which its notices' commands then name
    named = dataclasses.replace(stored, run=dataclasses.replace(stored.run, thresholds_path=thresholds.recorded_path))
    fresh = recompute(named, judged_profile(stored.run, thresholds, source=source))
    found = contradictions(stored, fresh)
    if found:
        more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
        raise UsageError(f"{source} is inconsistent: " + "; ".join(found[:3]) + more + ". Refusing to post: the "
                         "artifact was edited after the run, or written by a different guard",
                         hint="re-run perf-guard on the pull request")
    return fresh
