"""Budgets + run record -> typed checks -> verdict. Pure: no I/O, no engine.

Each kind of budget has one function here that turns a budget and a measurement into its check
record (``guard.results``); the decision rules themselves live in ``guard.rules``, shared with the
run stage so the two cannot disagree. Adding a kind of budget: a record in results.py, a function
here, a label and failure sentence in guard.format, a table in each view.
"""

from __future__ import annotations

from pathlib import Path

from guard import format as fmt
from guard.budgets import OpBudget, Profile
from guard.hardware import gpu_state_problems, recorded_hardware_problems
from guard.results import TOTAL_OPS, OpCheck, Results, RunRecord, ScopeCounts, Status, TtftCheck, Verdict
from guard.rules import judge_ttft

DEFAULT_OUTPUT = "guard-results"  # where `guard check` writes results.json unless told otherwise


def ttft_checks(profile: Profile, run: RunRecord) -> list[TtftCheck]:
    samples = run.ttft_client_s()
    if not samples:
        return []  # no samples: an invalid run (see invalid_reasons), never a pass
    stats = profile.statistics
    return [judge_ttft(k, b, samples, run.rounds, confidence=stats.confidence, max_requests=stats.max_requests)
            for k, b in profile.ttft_ms.items()]


def stale_budget_notices(profile: Profile, checks: list[TtftCheck], output: str | Path) -> list[str]:
    """Budgets so loose that even the interval's upper end sits below budget / (1 + 2 x headroom):
    they would miss a regression of twice the headroom. A notice only; never a failure."""
    factor = 1.0 + 2.0 * profile.headroom_pct / 100.0
    stale = [c for c in checks if c.interval_ms[1] < c.budget_ms / factor]
    if not stale:
        return []
    command = f"guard update-thresholds --from {Path(output) / 'results.json'} --profile {profile.name}"
    return [f"{fmt.label(c)}: budget {fmt.ms_unit(c.budget_ms)} looks stale: the whole {fmt.confidence(c.confidence)} "
            f"interval {fmt.interval(c.interval_ms)} ms lies below budget / (1 + 2 x {profile.headroom_pct:g} % headroom) "
            f"= {fmt.ms_unit(c.budget_ms / factor)}; to tighten it: `{command}`" for c in stale]


def op_check(counts: ScopeCounts, op: str, budget: OpBudget, measured_calls: int) -> OpCheck:
    return OpCheck(scope=counts.scope, image_size=counts.image_size, op=op, rule=budget.rule,
                   budget_calls=budget.count, measured_calls=measured_calls,
                   status=Status.FAIL if budget.fails(measured_calls) else Status.PASS)


def op_checks(profile: Profile, op_counts: list[ScopeCounts]) -> list[OpCheck]:
    budgets = {sb.name: sb for sb in profile.ops}
    checks = []
    for counts in op_counts:
        sb = budgets.get(counts.scope)
        if sb is None or counts.entries == 0:
            continue  # never entered: an invalid run, not a pass (see invalid_reasons)
        checks += [op_check(counts, op, b, counts.calls_by_op.get(op, 0)) for op, b in sb.ops.items()]
        if sb.total_ops is not None:
            checks.append(op_check(counts, TOTAL_OPS, sb.total_ops, counts.total_calls))
    return checks


def invalid_reasons(profile: Profile, run: RunRecord) -> list[str]:
    """Why evaluation finds the run untrustworthy, beside the run's own ``invalid_reasons``.
    The run is valid when both are empty."""
    reasons: list[str] = []
    failed = [o for o in run.outcomes if not o.success]
    for o in failed[:5]:
        kind = "warm-up request" if o.warmup else "request"
        reasons.append(f"{kind} {o.index} ({fmt.size(o.image_size)}) failed: {o.error}")
    if len(failed) > 5:
        reasons.append(f"... and {len(failed) - 5} more failed requests")
    reasons += recorded_hardware_problems(profile, run.environment)
    reasons += gpu_state_problems(run.environment.get("gpu_state"))
    if profile.ttft_ms:
        got = len(run.ttft_client_s())
        if got == 0:
            reasons.append("no TTFT samples were measured")
        elif got < profile.workload.requests:
            reasons.append(f"too few TTFT samples: {got} of {profile.workload.requests} requested")
    for c in run.op_counts:
        if c.entries == 0:
            reasons.append(
                f"op-count scope '{c.scope}' was never entered for a {fmt.size(c.image_size)} image: "
                "its function did not run (renamed in vLLM? image never reached the encoder?), "
                "so its counts prove nothing"
            )
    if profile.ops:
        measured_scopes = {c.scope for c in run.op_counts}
        for sb in profile.ops:
            if sb.name not in measured_scopes:
                reasons.append(f"op-count scope '{sb.name}' was budgeted but not measured")
    return reasons


def evaluate(profile: Profile, run: RunRecord, guard_version: str = "", output: str | Path = DEFAULT_OUTPUT) -> Results:
    """``output``: the folder results.json is written to, for the commands notices print."""
    reasons = invalid_reasons(profile, run)
    ttft = ttft_checks(profile, run)
    ops = op_checks(profile, run.op_counts)
    notices: list[str] = []
    valid = not reasons and not run.invalid_reasons
    if valid:  # an invalid run is no basis for new budgets
        notices += stale_budget_notices(profile, ttft, output)
    if profile.match.cuda and not run.environment.get("gpu_state"):
        notices.append("GPU state (other processes, throttling) was not checked: NVML could not be read; "
                       "install it with `uv sync --extra gpu` (package nvidia-ml-py)")
    if not valid:
        verdict = Verdict.INVALID
    elif any(c.status == Status.FAIL for c in (*ttft, *ops)):
        verdict = Verdict.REGRESSION
    else:
        verdict = Verdict.PASS
    return Results(
        verdict=verdict, run=run, ttft_checks=tuple(ttft), op_checks=tuple(ops), guard_version=guard_version,
        judged_invalid_reasons=tuple(reasons), notices=tuple(notices),
        profile_config={"engine": profile.engine.as_dict(), "workload": profile.workload.as_dict(),
                        "statistics": profile.statistics.as_dict(), "headroom_pct": profile.headroom_pct},
    )
