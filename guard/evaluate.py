"""Budgets + run record -> checks -> verdict. Pure: no I/O, no engine.

Each rule is a small function ``(budget, measurement) -> CheckResult``; adding a kind of budget
means adding one function here and one table in the report.
"""

from __future__ import annotations

from guard.budgets import OpBudget, Profile, percentile_value
from guard.errors import ExitCode
from guard.results import CheckResult, Results, RunRecord, ScopeCounts, Status, Verdict
from guard.stats import percentile


def _delta_pct(measured: float, budget: float) -> float | None:
    return None if budget == 0 else (measured - budget) / budget * 100.0


def ttft_check(key: str, budget_ms: float, samples_s: list[float], rounds: int) -> CheckResult:
    measured_ms = percentile(samples_s, percentile_value(key)) * 1000.0
    return CheckResult(
        kind="ttft", name=f"ttft_ms.{key}", budget=budget_ms, measured=measured_ms,
        status=Status.FAIL if measured_ms > budget_ms else Status.PASS, rule="max", unit="ms",
        delta_pct=_delta_pct(measured_ms, budget_ms), samples=len(samples_s), rounds=rounds,
    )


def op_check(counts: ScopeCounts, label: str, budget: OpBudget, measured: int) -> CheckResult:
    size = f"{counts.image_size[0]}x{counts.image_size[1]}"
    return CheckResult(
        kind="ops", name=f"{counts.scope}[{size}].{label}", budget=budget.count, measured=measured,
        status=Status.FAIL if budget.fails(measured) else Status.PASS, rule=budget.rule, unit="calls",
        delta_pct=_delta_pct(measured, budget.count), scope=counts.scope, image_size=counts.image_size,
    )


def op_checks(profile: Profile, op_counts: list[ScopeCounts]) -> list[CheckResult]:
    budgets = {sb.name: sb for sb in profile.ops}
    checks = []
    for counts in op_counts:
        sb = budgets.get(counts.scope)
        if sb is None or counts.entered == 0:
            continue  # never entered: an invalid run, not a pass (see invalid_reasons)
        checks += [op_check(counts, op, b, counts.counts.get(op, 0)) for op, b in sb.ops.items()]
        if sb.total_ops is not None:
            checks.append(op_check(counts, "total_ops", sb.total_ops, counts.total))
    return checks


def invalid_reasons(profile: Profile, run: RunRecord) -> list[str]:
    """Why the run cannot be judged at all. Empty list: the run is valid."""
    reasons = list(run.invalid_reasons)
    failed = [o for o in run.outcomes if not o.success]
    for o in failed[:5]:
        kind = "warm-up request" if o.warmup else "request"
        reasons.append(f"{kind} {o.index} ({o.image_size[0]}x{o.image_size[1]}) failed: {o.error}")
    if len(failed) > 5:
        reasons.append(f"... and {len(failed) - 5} more failed requests")
    if profile.ttft_ms:
        got = len(run.ttft_client_s())
        if got == 0:
            reasons.append("no TTFT samples were measured")
        elif got < profile.workload.requests:
            reasons.append(f"too few TTFT samples: {got} of {profile.workload.requests} requested")
    for c in run.op_counts:
        if c.entered == 0:
            reasons.append(
                f"op-count scope '{c.scope}' was never entered for a {c.image_size[0]}x{c.image_size[1]} image: "
                "its function did not run (renamed in vLLM? image never reached the encoder?), "
                "so its counts prove nothing"
            )
    if profile.ops:
        measured_scopes = {c.scope for c in run.op_counts}
        for sb in profile.ops:
            if sb.name not in measured_scopes:
                reasons.append(f"op-count scope '{sb.name}' was budgeted but not measured")
    return reasons


def evaluate(profile: Profile, run: RunRecord, guard_version: str = "") -> Results:
    reasons = invalid_reasons(profile, run)
    checks: list[CheckResult] = []
    samples = run.ttft_client_s()
    if samples:
        checks += [ttft_check(k, b, samples, run.rounds) for k, b in profile.ttft_ms.items()]
    checks += op_checks(profile, run.op_counts)
    if reasons:
        verdict, code = Verdict.INVALID, ExitCode.INVALID
    elif any(c.status == Status.FAIL for c in checks):
        verdict, code = Verdict.REGRESSION, ExitCode.REGRESSION
    else:
        verdict, code = Verdict.PASS, ExitCode.PASS
    return Results(
        verdict=verdict, exit_code=int(code), run=run, checks=checks, guard_version=guard_version,
        invalid_reasons=reasons,
        profile_config={"engine": profile.engine.as_dict(), "workload": profile.workload.as_dict(),
                        "statistics": profile.statistics.as_dict(), "headroom_pct": profile.headroom_pct},
    )
