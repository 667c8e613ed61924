"""Budgets + run record -> checks -> verdict. Pure: no I/O, no engine.

Each rule is a small function ``(budget, measurement) -> CheckResult``; adding a kind of budget
means adding one function here and one table in the report.

TTFT percentiles are judged by their confidence interval (``guard.stats``), by ``decide_ttft``,
which the run stage also uses to decide whether to measure more (``GuardRun.measure_until_decided``),
so the run stage and the verdict cannot disagree:

- the whole interval above the budget: FAIL; at or below it: PASS;
- straddling it: measure another ``statistics.batch`` requests, up to ``statistics.max_requests``;
- still straddling at the cap (or with no cap set): judged on the point estimate, with a note
  saying so. Above the budget: FAIL, a regression like any other. At or below: status
  ``inconclusive``, which passes but is shown as such ("~ok", "inconclusive"), because the data
  did not prove the budget held; on the CPU profile that is every passing p90/p99 (see the
  guard.stats docstring: no upper bound exists at n <= 15).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from guard.budgets import OpBudget, Profile, Statistics, percentile_value
from guard.errors import ExitCode
from guard.contention import contention_problems
from guard.hardware import gpu_state_problems, recorded_hardware_problems
from guard.results import CheckResult, Results, RunRecord, ScopeCounts, Status, Verdict
from guard.stats import percentile, percentile_interval

DEFAULT_OUTPUT = "guard-results"  # where `guard check` writes results.json unless told otherwise


def _delta_pct(measured: float, budget: float) -> float | None:
    return None if budget == 0 else (measured - budget) / budget * 100.0


def fmt_ms(value: float) -> str:
    """An interval bound for people: an unbounded side reads as the infinity it is."""
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    return f"{value:.0f}"


def fmt_interval(interval: tuple[float, float]) -> str:
    lo, hi = interval
    return f"{'(' if math.isinf(lo) else '['}{fmt_ms(lo)}, {fmt_ms(hi)}{')' if math.isinf(hi) else ']'}"


def _pct(confidence: float) -> str:
    return f"{confidence * 100:g} %"


@dataclass(frozen=True)
class TtftDecision:
    """One budgeted percentile judged by its confidence interval alone."""

    key: str  # "p50"
    budget_ms: float
    estimate_ms: float  # the point estimate (type 7 percentile)
    interval_ms: tuple[float, float]  # +-inf where that side does not exist at this n
    samples: int
    confidence: float
    status: str  # Status.PASS | Status.FAIL | Status.INCONCLUSIVE (the interval straddles the budget)

    def describe(self) -> str:
        return (f"{self.key}: {_pct(self.confidence)} interval {fmt_interval(self.interval_ms)} ms "
                f"vs budget {self.budget_ms:.0f} ms (estimate {self.estimate_ms:.0f} ms, n={self.samples})")


def decide_ttft(key: str, budget_ms: float, samples_s: list[float], confidence: float) -> TtftDecision:
    """FAIL when the whole interval is above the budget, PASS when it is at or below, else INCONCLUSIVE."""
    p = percentile_value(key)
    lo, hi = percentile_interval(samples_s, p, confidence)
    interval = (lo * 1000.0, hi * 1000.0)
    if interval[0] > budget_ms:
        status = Status.FAIL
    elif interval[1] <= budget_ms:
        status = Status.PASS
    else:
        status = Status.INCONCLUSIVE
    return TtftDecision(key=key, budget_ms=budget_ms, estimate_ms=percentile(samples_s, p) * 1000.0,
                        interval_ms=interval, samples=len(samples_s), confidence=confidence, status=status)


def undecided_ttft(profile: Profile, samples_s: list[float]) -> list[TtftDecision]:
    """The budgeted percentiles whose interval still straddles the budget."""
    if not samples_s:
        return []
    decisions = (decide_ttft(k, b, samples_s, profile.statistics.confidence) for k, b in profile.ttft_ms.items())
    return [d for d in decisions if d.status == Status.INCONCLUSIVE]


def more_requests(statistics: Statistics, measured: int, undecided: bool) -> int:
    """Requests the next resampling round measures (a batch, cut at the cap); 0: stop."""
    if not undecided or statistics.max_requests is None:
        return 0
    return max(0, min(statistics.batch, statistics.max_requests - measured))


def _min_n_for_upper(key: str, confidence: float) -> int:
    """Fewest samples for which the percentile's interval has an upper bound: q ** n <= alpha."""
    q = percentile_value(key) / 100.0
    return math.ceil(math.log((1.0 - confidence) / 2.0) / math.log(q) - 1e-9)


def _point_estimate_note(d: TtftDecision, max_requests: int | None, over: bool) -> str:
    if max_requests is None:
        when = f"after {d.samples} requests (no resampling: statistics.max_requests is not set)"
    elif d.samples >= max_requests:
        when = f"at the cap of {max_requests} requests"
    else:
        when = f"after {d.samples} of up to {max_requests} requests"
    note = (f"the {_pct(d.confidence)} interval {fmt_interval(d.interval_ms)} ms still straddles the budget {when}; "
            f"judged on the point estimate: {d.estimate_ms:.0f} ms {'>' if over else '<='} {d.budget_ms:.0f} ms")
    if math.isinf(d.interval_ms[1]) and not over:
        note += (f" (an upper bound for {d.key} needs >= {_min_n_for_upper(d.key, d.confidence)} samples, "
                 "so no smaller run can prove it holds)")
    return note


def ttft_check(key: str, budget_ms: float, samples_s: list[float], rounds: int, *,
               confidence: float = Statistics.confidence, max_requests: int | None = None) -> CheckResult:
    d = decide_ttft(key, budget_ms, samples_s, confidence)
    status, note = d.status, None
    if d.status == Status.INCONCLUSIVE:  # the run stage already measured up to the cap
        over = d.estimate_ms > budget_ms
        status = Status.FAIL if over else Status.INCONCLUSIVE
        note = _point_estimate_note(d, max_requests, over)
    return CheckResult(
        kind="ttft", name=f"ttft_ms.{key}", budget=budget_ms, measured=d.estimate_ms,
        status=status, rule="max", unit="ms", delta_pct=_delta_pct(d.estimate_ms, budget_ms),
        interval=d.interval_ms, samples=d.samples, rounds=rounds, note=note,
    )


def stale_budget_notices(profile: Profile, checks: list[CheckResult], output: str | Path) -> list[str]:
    """Budgets so loose that even the interval's upper end sits below budget / (1 + 2 x headroom):
    they would miss a regression of twice the headroom. A notice only; never a failure."""
    factor = 1.0 + 2.0 * profile.headroom_pct / 100.0
    stale = [c for c in checks if c.kind == "ttft" and c.interval is not None and c.interval[1] < c.budget / factor]
    if not stale:
        return []
    confidence = _pct(profile.statistics.confidence)
    command = f"guard update-thresholds --from {Path(output) / 'results.json'} --profile {profile.name}"
    return [f"{c.name}: budget {c.budget:.0f} ms looks stale: the whole {confidence} interval "
            f"{fmt_interval(c.interval)} ms lies below budget / (1 + 2 x {profile.headroom_pct:g} % headroom) "
            f"= {c.budget / factor:.0f} ms; to tighten it: `{command}`" for c in stale]


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
    reasons += recorded_hardware_problems(profile, run.environment)
    reasons += gpu_state_problems(run.environment.get("gpu_state"))
    if profile.ttft_ms and ttft_judged_problem(profile, run.environment) is None:
        # a busy machine invalidates the absolute TTFT; op counts do not depend on it, and TTFT that
        # is not judged here (budget bound to another CPU) is only shown
        reasons += contention_problems(run.environment.get("cpu_contention"), profile.validity.max_other_cpu_pct)
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


def ttft_judged_problem(profile: Profile, env: dict) -> str | None:
    """Why the profile's absolute TTFT budgets are not judged on the recorded machine; None: they are."""
    from guard.hardware import ttft_hardware_problem

    if not env or "cpu" not in env:
        return None
    return ttft_hardware_problem(profile, str(env.get("cpu") or ""), int(env.get("cpu_count") or 0))


def not_judged_notice(profile: Profile, why: str, thresholds: str, output: str | Path) -> str:
    """What to do to get a TTFT verdict on this machine."""
    results = Path(output) / "results.json"
    return (f"TTFT not judged: {why}; the verdict rests on the op counts. For a TTFT verdict on this machine, "
            f"make a local budget from this run: copy {thresholds} to local.yaml, then "
            f"`guard update-thresholds --from {results} --thresholds local.yaml --only ttft` and "
            f"`guard check --thresholds local.yaml`; or compare against a baseline vLLM on this machine (A/B)")


def evaluate(profile: Profile, run: RunRecord, guard_version: str = "", output: str | Path = DEFAULT_OUTPUT) -> Results:
    """``output``: the folder results.json is written to, for the commands notices print."""
    reasons = invalid_reasons(profile, run)
    checks: list[CheckResult] = []
    samples = run.ttft_client_s()
    stats = profile.statistics
    not_judged = ttft_judged_problem(profile, run.environment) if profile.ttft_ms else None
    if samples:
        ttft = [ttft_check(k, b, samples, run.rounds, confidence=stats.confidence, max_requests=stats.max_requests)
                for k, b in profile.ttft_ms.items()]
        if not_judged:
            ttft = [dataclasses.replace(c, status=Status.NOT_JUDGED, note=f"not judged: {not_judged}") for c in ttft]
        checks += ttft
    checks += op_checks(profile, run.op_counts)
    notices: list[str] = []
    if not_judged:
        notices.append(not_judged_notice(profile, not_judged, run.thresholds_path, output))
    if not reasons and not not_judged:  # an invalid run (or another CPU's budget) is no basis for new budgets
        notices += stale_budget_notices(profile, checks, output)
    if profile.match.cuda and not run.environment.get("gpu_state"):
        notices.append("GPU state (other processes, throttling) was not checked: NVML could not be read; "
                       "install it with `uv sync --extra gpu` (package nvidia-ml-py)")
    if reasons:
        verdict, code = Verdict.INVALID, ExitCode.INVALID
    elif any(c.status == Status.FAIL for c in checks):
        verdict, code = Verdict.REGRESSION, ExitCode.REGRESSION
    else:
        verdict, code = Verdict.PASS, ExitCode.PASS
    return Results(
        verdict=verdict, exit_code=int(code), run=run, checks=checks, guard_version=guard_version,
        invalid_reasons=reasons, notices=notices,
        profile_config={"engine": profile.engine.as_dict(), "workload": profile.workload.as_dict(),
                        "statistics": profile.statistics.as_dict(), "headroom_pct": profile.headroom_pct},
    )
