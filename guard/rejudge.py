"""The verdict is guard's, not the artifact's: re-judge a results.json from its run record.

A results.json that reaches ``guard comment`` in the privileged workflow was written by the pull
request's run, so its ``verdict`` and ``checks`` are claims. ``rejudge`` evaluates the recorded run
(samples and op counts) again with the default branch's guard against the default branch's
thresholds file, and refuses a file that contradicts itself or the recomputation: a verdict that
its own checks do not support, or a measurement in a check that the run record does not hold.
The commit status and the comment then come from the re-derived result.
"""

from __future__ import annotations

import math

from guard.budgets import Thresholds
from guard.errors import UsageError
from guard.evaluate import evaluate, ran_bf16_fallback
from guard.results import Check, OpCheck, Results, Status, TtftCheck, Verdict
from guard.sanitize import one_line


def implied_verdict(results: Results) -> Verdict:
    if results.invalid_reasons:
        return Verdict.INVALID
    if any(c.status == Status.FAIL for c in results.checks):
        return Verdict.REGRESSION
    return Verdict.PASS


def _key(c: Check) -> tuple:
    if isinstance(c, TtftCheck):
        return ("ttft", c.percentile)
    return ("ops", c.scope, tuple(c.image_size), c.op)


def _label(c: Check) -> str:
    if isinstance(c, TtftCheck):
        return f"ttft_ms.{c.percentile}"
    return f"{c.scope}[{c.image_size[0]}x{c.image_size[1]}].{c.op}"


def _same_number(a: float, b: float) -> bool:
    """Equal as results.json writes them (milliseconds rounded to 0.1)."""
    return a == b or (math.isfinite(a) and math.isfinite(b) and abs(a - b) <= 0.05 + 1e-9 * max(abs(a), abs(b)))


def _same_budget(a: Check, b: Check) -> bool:
    if isinstance(a, TtftCheck) and isinstance(b, TtftCheck):
        return _same_number(a.budget_ms, b.budget_ms) and a.confidence == b.confidence
    if isinstance(a, OpCheck) and isinstance(b, OpCheck):
        return a.budget_calls == b.budget_calls and a.rule == b.rule
    return False


def contradictions(stored: Results, fresh: Results) -> list[str]:
    out = []
    implied = implied_verdict(stored)
    if stored.verdict != implied:
        out.append(f"its verdict is '{stored.verdict}' but its own checks and reasons make it '{implied}'")
    by_key = {_key(c): c for c in fresh.checks}
    for c in stored.checks:
        f = by_key.get(_key(c))
        if f is None:
            continue  # a budget the default branch does not have: not judged by it
        label = one_line(_label(c), limit=120)
        if isinstance(c, TtftCheck):
            if not (_same_number(c.measured_ms, f.measured_ms) and c.samples == f.samples):
                out.append(f"{label} says {c.measured_ms:g} ms over {c.samples} samples; "
                           f"its run record gives {f.measured_ms:g} ms over {f.samples}")
                continue
        elif c.measured_calls != f.measured_calls:
            out.append(f"{label} says {c.measured_calls} calls; its run record gives {f.measured_calls}")
            continue
        if _same_budget(c, f) and c.status != f.status:
            out.append(f"{label} says '{c.status}' where the same budget and measurement give '{f.status}'")
    return out


def rejudge(stored: Results, thresholds: Thresholds, *, source: str) -> Results:
    """Re-derive ``stored``'s verdict against ``thresholds`` (the default branch's); UsageError (exit 2,
    nothing posted) when the file contradicts itself or its own run record."""
    profile = thresholds.profiles.get(stored.run.profile)
    if profile is None:
        raise UsageError(f"{source}: measured with profile '{one_line(stored.run.profile, 60)}', which "
                         f"{thresholds.path} (the default branch's thresholds) does not have: cannot re-judge it; "
                         "refusing to post")
    if stored.run.model != thresholds.model:
        raise UsageError(f"{source}: measured model '{one_line(stored.run.model, 60)}', but {thresholds.path} is "
                         f"for '{thresholds.model}'; refusing to post")
    if ran_bf16_fallback(stored.run.environment):  # judged as it ran: float32 and its census
        profile = profile.on_cpu(native_bf16=False)
    fresh = evaluate(profile, stored.run, guard_version=stored.guard_version)
    found = contradictions(stored, fresh)
    if found:
        more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
        raise UsageError(f"{source} is inconsistent: " + "; ".join(found[:3]) + more + ". Refusing to post: the "
                         "artifact was edited after the run, or written by a different guard",
                         hint="re-run perf-guard on the pull request")
    return fresh
