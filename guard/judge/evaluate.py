"""Budgets + run record -> typed checks -> verdict. Pure: no I/O, no engine.

Each kind of budget has one function here that turns a budget and a measurement into its check
record (``guard.model.records``); the decision rules themselves live in ``guard.judge.rules``, shared with the
run stage so the two cannot disagree. Adding a kind of budget: a record in records.py and its JSON
form in jsonfiles.py, a function here, a label and failure sentence in guard.model.format, a table
in each view.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from guard.model import format as fmt
from guard.config import recipes
from guard.config.budgets import NATIVE_BF16_EXTENSIONS, OpBudget, Profile, Statistics
from guard.measure.fit import census_against_bf16, ran_bf16_fallback, ttft_not_judged
from guard.config.census import Baseline
from guard.files import person_path, recorded_as_person_path
from guard.judge.census import CensusJudgement, judge
from guard.judge.gates import gpu_state_problems, recorded_hardware_problems, speed_notice, speed_problems, unsteady
from guard.model.changes import unmeasurable
from guard.model.environment import ContentionReading, Environment, busy
from guard.model.readings import comparable
from guard.model.records import TOKEN_METRICS, TOTAL_OPS, TPOT, TTFT, ABRecord, InvalidReason, ReasonKind as K, RunRecord, ScopeCounts, Status, Verdict, ttft_definition
from guard.model.results import ENVIRONMENTS_DIFFER, BudgetSource, PullRequestDiff, Results
from guard.model.checks import ABComparison, CensusCheck, OpCheck, LatencyCheck, Pair, RatioCheck, UnmeasuredOpCheck
from guard.model.verdict import settled
from guard.judge.opnames import vacuous_budgets
from guard.judge.rules import judge_latency

DEFAULT_OUTPUT = "guard-results"  # where `guard check` writes results.json unless told otherwise


def latency_checks(profile: Profile, run: RunRecord, metric: str = TTFT) -> list[LatencyCheck]:
    """One latency metric's budgets (TTFT, TPOT, ITL) judged on the run's samples of it."""
    samples = run.latency_s(metric)
    if not samples:
        return []  # no samples: an invalid run (see invalid_reasons), never a pass
    stats = profile.statistics
    checks = [judge_latency(k, b, samples, run.rounds, confidence=stats.confidence, max_requests=stats.max_requests,
                            metric=metric) for k, b in profile.latency_ms(metric).items()]
    why = ttft_not_judged(profile, run.environment)
    if why:  # measured and shown, never counted: the budget belongs to another CPU
        checks = [dataclasses.replace(c, status=Status.NOT_JUDGED, note=f"not judged: {why}") for c in checks]
    return checks


def ttft_checks(profile: Profile, run: RunRecord) -> list[LatencyCheck]:
    return latency_checks(profile, run, TTFT)


def token_checks(profile: Profile, run: RunRecord) -> list[LatencyCheck]:
    """TPOT and ITL budgets, judged like TTFT's, by the same statistics and not-judged rules."""
    if not run.timed_tokens:
        return []  # a results file from before guard timed tokens: said in a notice, never judged
    return [c for m in TOKEN_METRICS for c in latency_checks(profile, run, m)]


def token_times_notice(profile: Profile, run: RunRecord) -> list[str]:
    if not profile.token_ms or not run.ttft_client_s() or run.timed_tokens:
        return []
    return [f"{'/'.join(m.upper() for m in profile.token_ms)} budgets not judged: this run recorded no token "
            "times (written by a guard from before TPOT and ITL were measured); re-run `guard check`"]


def dtype_notices(profile: Profile, env: Environment) -> list[str]:
    """Say so when the engine ran the profile's ``dtype_without_native_bf16`` instead of bfloat16."""
    if not ran_bf16_fallback(env):
        return []
    ran = env.dtype
    census = ("" if profile.census is None else
              f"; the census is judged against its {ran} baseline" if not census_against_bf16(profile, env) else
              "; the census baseline is bfloat16's, so functions that cast come in below it")
    return [f"engine dtype: {ran}, not the profile's bfloat16: this CPU has none of "
            f"{', '.join(NATIVE_BF16_EXTENSIONS[:2])}, so bf16 would be emulated (5x slower on an AVX2-only EPYC; "
            f"engine.dtype_without_native_bf16). The op-count budgets hold in either dtype{census}"]


def printed_paths(run: RunRecord, output: str | Path) -> tuple[str, str]:
    """The results file and the thresholds file as the commands in notices name them: from the
    repository's root (guard.config.recipes), so a notice works in another checkout too."""
    return person_path(Path(output) / "results.json"), recorded_as_person_path(run.thresholds_path)


def not_judged_notice(why: str, run: RunRecord, profile: Profile, output: str | Path, *, usable: bool) -> str:
    """How to get a TTFT verdict on this machine (each step a command that works as printed);
    ``usable``: this run can be a budget (valid, nothing injected), else it offers no recipe that
    update-thresholds would refuse."""
    said = f"TTFT not judged: {why}; the verdict rests on the op counts."
    if not usable:
        return (f"{said} For a TTFT verdict on this machine, make a local budget from a valid run without "
                "--inject, or compare against a baseline vLLM on this machine (A/B)")
    copy, update, check = (f"`{c}`" for c in recipes.local_budget(*printed_paths(run, output), profile.name))
    return (f"{said} For a TTFT verdict on this machine, "
            f"make a local budget from this run: {copy}, then {update} and {check}; "
            "or compare against a baseline vLLM on this machine (A/B)")


def stale_budget_notices(profile: Profile, checks: list[LatencyCheck], run: RunRecord, output: str | Path) -> list[str]:
    """Budgets so loose that even the interval's upper end sits below budget / (1 + 2 x headroom):
    they would miss a regression of twice the headroom. A notice only; never a failure."""
    factor = 1.0 + 2.0 * profile.headroom_pct / 100.0
    stale = [c for c in checks if c.interval_ms[1] < c.budget_ms / factor]
    if not stale:
        return []
    command = recipes.update_thresholds(*printed_paths(run, output), profile.name, only="ttft")
    return [f"{fmt.label(c)}: budget {fmt.ms_unit(c.budget_ms)} looks stale: the whole {fmt.confidence(c.confidence)} "
            f"interval {fmt.interval(c.interval_ms)} ms lies below budget / (1 + 2 x {profile.headroom_pct:g} % headroom) "
            f"= {fmt.ms_unit(c.budget_ms / factor)}; to tighten it: `{command}`" for c in stale]


def op_check(counts: ScopeCounts, op: str, budget: OpBudget, measured_calls: int, judged: bool = True) -> OpCheck:
    status = Status.NOT_JUDGED if not judged else Status.FAIL if budget.fails(measured_calls) else Status.PASS
    return OpCheck(scope=counts.scope, image_size=counts.image_size, op=op, rule=budget.rule,
                   budget_calls=budget.count, measured_calls=measured_calls, status=status)


def op_checks(profile: Profile, op_counts: list[ScopeCounts]) -> list[OpCheck]:
    """``profile``: as the run ran it (guard.measure.fit.as_it_ran). Where its census was counted on
    other kernels (an AMX CPU, no AMX baseline: ``census.not_judged``), a scope's total_ops cap was
    counted there too, so it is shown, not judged; its named ops (host syncs, index writes) still are."""
    budgets = {sb.name: sb for sb in profile.ops}
    totals_judged = profile.census is None or profile.census.not_judged is None
    checks = []
    for counts in op_counts:
        sb = budgets.get(counts.scope)
        if sb is None or counts.entries == 0:
            continue  # never entered: an invalid run, not a pass (see invalid_reasons)
        checks += [op_check(counts, op, b, counts.calls_by_op.get(op, 0)) for op, b in sb.ops.items()]
        if sb.total_ops is not None:
            checks.append(op_check(counts, TOTAL_OPS, sb.total_ops, counts.total_calls, judged=totals_judged))
    return checks


def ops_measurable(run: RunRecord) -> bool:
    """False for ``--server-url``: guard profiles only engines it runs (docs/server-mode.md)."""
    server = run.environment.server
    return server is None or not server.remote


NOT_MEASURED_REMOTE = ("not measured in this mode: op counts need the model's Python frames, and a server "
                       "guard did not start (--server-url) cannot be profiled")


def unmeasured_op_checks(profile: Profile, run: RunRecord) -> list[UnmeasuredOpCheck]:
    if ops_measurable(run):
        return []
    out = []
    for sb in profile.ops:
        out += [UnmeasuredOpCheck(sb.name, op, b.rule, b.count, NOT_MEASURED_REMOTE) for op, b in sb.ops.items()]
        if sb.total_ops is not None:
            out.append(UnmeasuredOpCheck(sb.name, TOTAL_OPS, sb.total_ops.rule, sb.total_ops.count, NOT_MEASURED_REMOTE))
    return out


def hardware_reasons(profile: Profile, env: Environment) -> list[InvalidReason]:
    return [InvalidReason(K.HARDWARE_MISMATCH, t) for t in recorded_hardware_problems(profile, env)]


def invalid_reasons(profile: Profile, run: RunRecord, stopped: bool | None = None) -> list[InvalidReason]:
    """Why evaluation finds the run untrustworthy, beside the run's own ``invalid_reasons``.
    The run is valid when both are empty. ``stopped`` (default: the run recorded reasons of its
    own): the run stage gave up and said why, so measurements it never took are its consequence,
    not more reasons; a failed request or a wrong machine still is one."""
    stopped = bool(run.invalid_reasons) if stopped is None else stopped
    reasons: list[InvalidReason] = []
    failed = [o for o in run.outcomes if not o.success]
    for o in failed[:5]:
        kind = "warm-up request" if o.warmup else "request"
        reasons.append(InvalidReason(K.REQUEST_FAILED, f"{kind} {o.index} ({fmt.size(o.image_size)}) failed: {o.error}"))
    if len(failed) > 5:
        reasons.append(InvalidReason(K.REQUEST_FAILED, f"... and {len(failed) - 5} more failed requests"))
    reasons += hardware_reasons(profile, run.environment)
    reasons += [InvalidReason(K.GPU_STATE, t) for t in gpu_state_problems(run.environment.gpu_state)]
    if profile.latency_budgets and ttft_not_judged(profile, run.environment) is None:
        # A busy machine invalidates judged latency (guard.measure.contention); op counts do not depend on it,
        # and TTFT bound to another CPU is only shown, so contention cannot change that verdict.
        over = busy(run.environment.cpu_contention, profile.validity.max_other_cpu_pct)
        if over is not None:
            reasons.append(InvalidReason(K.BUSY_MACHINE, fmt.busy_machine(over, profile.validity.max_other_cpu_pct)))
    if profile.ttft_ms and not stopped:
        got = len(run.ttft_client_s())
        if got == 0:
            reasons.append(InvalidReason(K.TOO_FEW_SAMPLES, "no TTFT samples were measured"))
        elif got < profile.workload.requests:
            reasons.append(InvalidReason(K.TOO_FEW_SAMPLES, f"too few TTFT samples: {got} of {profile.workload.requests} requested"))
    if run.ttft_client_s() and run.timed_tokens and not stopped:  # TTFT's own shortfall said above
        reasons += [InvalidReason(K.TOO_FEW_SAMPLES, f"no {m.upper()} samples were measured: no request returned "
                                  "a second token") for m in profile.token_ms if not run.latency_s(m)]
    for c in run.op_counts:
        if c.entries == 0:
            reasons.append(InvalidReason(
                K.SCOPE_NEVER_ENTERED, f"op-count scope '{c.scope}' was never entered for a {fmt.size(c.image_size)} image: "
                "its function did not run (renamed in vLLM? image never reached the encoder?), "
                "so its counts prove nothing"
            ))
    # a budget no op name can meet (guard.judge.opnames): its zero proves nothing
    reasons += [InvalidReason(K.VACUOUS_BUDGET, t) for t in vacuous_budgets(profile, run.op_counts)]
    if profile.ops and ops_measurable(run) and not stopped:
        measured_scopes = {c.scope for c in run.op_counts}
        for sb in profile.ops:
            if sb.name not in measured_scopes:
                reasons.append(InvalidReason(K.SCOPE_NOT_MEASURED, f"op-count scope '{sb.name}' was budgeted but not measured"))
    return reasons


def census_update_command(profile: Profile, run: RunRecord, output: str | Path) -> str:
    return recipes.update_thresholds(*printed_paths(run, output), profile.name, only="census")


def census_judgement(profile: Profile, run: RunRecord, baseline: Baseline | None,
                     output: str | Path) -> CensusJudgement | None:
    """The census against its committed baseline (None: the profile has no census rule)."""
    if profile.census is None:
        return None
    return judge(profile.census, baseline, run.census, profile.workload.profile_image_sizes,
                 model=run.model, profile=profile.name, update_command=census_update_command(profile, run, output),
                 decode=run.decode_census, mixes=profile.workload.profile_mixes)


def census_notices(profile: Profile, census: CensusJudgement, run: RunRecord, output: str | Path,
                   against_bf16_baseline: bool = False) -> list[str]:
    """Changes within the rule: shrinkage to ratchet the baseline down, growth within the slack.
    ``against_bf16_baseline``: the engine ran float32 against a bfloat16 baseline, which counts dtype casts
    that float32 does not make: that shrinkage is the dtype's, never a reason to ratchet down."""
    moved = [c for c in census.checks if c.status != Status.FAIL]
    if not moved:
        return list(census.not_judged)
    down = sum(1 for c in moved if c.growth_calls < 0 or c.measured_calls is None)
    if against_bf16_baseline:
        grew = len(moved) - down
        return ([f"census: {down} function(s) counted fewer calls than the bfloat16 baseline: the engine ran "
                 f"{profile.engine.dtype} here, without bf16 casts (the baseline stays as measured in bfloat16)"]
                + ([f"census: {grew} function(s) grew within the rule (results.json)"] if grew else []))
    lines = _changes_within_the_rule(census)
    if down:
        lines.append(f"census: {down} function(s) shrank or vanished; ratchet the baseline down: "
                     f"`{census_update_command(profile, run, output)}`")
    return lines + list(census.not_judged)


def evaluate(profile: Profile, run: RunRecord, guard_version: str = "", output: str | Path = DEFAULT_OUTPUT,
             census_baseline: Baseline | None = None) -> Results:
    """``output``: the folder results.json is written to, for the commands notices print.
    ``census_baseline``: the profile's committed census (guard.config.census.read_baseline); None when
    the file does not exist yet, which makes a profile with a census rule an invalid run. A run that
    measured no TTFT (``run.measures``: ``--only ops``) is not judged on TTFT budgets."""
    if not run.measures.ttft:
        profile = dataclasses.replace(profile, ttft_ms={}, token_ms={})
    reasons = invalid_reasons(profile, run)
    ttft, tokens = ttft_checks(profile, run), token_checks(profile, run)
    # A latency failure that a slowdown /proc cannot see explains is the machine's (guard.judge.gates).
    reasons += [InvalidReason(K.SLOW_MACHINE, t) for t in speed_problems(
        run.environment.speed_reference, profile.speed_reference_ms, profile.validity.max_slowdown_pct, ttft + tokens)]
    ops = op_checks(profile, run.op_counts)
    notices: list[str] = []
    census = None
    if profile.census is not None and profile.census.not_judged and ops_measurable(run):
        notices.append(f"census: counted, not judged: {profile.census.not_judged} "
                       f"(`{census_update_command(profile, run, output)}`)")
    elif ops_measurable(run) and not run.invalid_reasons:  # a stopped run's missing census is no more news
        census = census_judgement(profile, run, census_baseline, output)
    elif profile.census is not None and not ops_measurable(run):  # a remote server's frames cannot be profiled
        notices.append(f"census: not measured in this mode ({NOT_MEASURED_REMOTE})")
    if census is not None:
        reasons += census.invalid
        notices += census_notices(profile, census, run, output, against_bf16_baseline=census_against_bf16(profile, run.environment))
    census_checks = census.checks if census is not None else ()
    valid = not reasons and not run.invalid_reasons
    not_judged = ttft_not_judged(profile, run.environment) if ttft else None
    changed_speed = unsteady(run.environment.speed_reference, profile.validity.max_slowdown_pct) if ttft else None
    if not_judged:
        notices.append(not_judged_notice(not_judged, run, profile, output, usable=valid and not run.injected))
    elif changed_speed:  # its verdict stands (the speed gate judges failures); its numbers make no budget
        notices.append(f"{changed_speed}: update-thresholds refuses it; re-run when two close readings show")
    elif valid and not run.injected:  # an invalid or injected run (or another CPU's budget) makes no budget
        notices += stale_budget_notices(profile, ttft, run, output)
    if ttft and not not_judged:
        fast = speed_notice(run.environment.speed_reference, profile.speed_reference_ms,
                            profile.validity.max_slowdown_pct)
        notices += [fast] if fast else []
    notices += dtype_notices(profile, run.environment)
    notices += token_times_notice(profile, run)
    if profile.match.cuda and not run.environment.gpu_state:
        notices.append("GPU state (other processes, throttling) was not checked: NVML could not be read; "
                       "install it with `uv sync --extra gpu` (package nvidia-ml-py)")
    return settled(Results(
        verdict=Verdict.INVALID, run=run,  # settled() sets it from these checks and reasons
        ttft_checks=tuple(ttft), token_checks=tuple(tokens), op_checks=tuple(ops), census_checks=tuple(census_checks),
        guard_version=guard_version,
        unmeasured_op_checks=tuple(unmeasured_op_checks(profile, run)),
        ttft_definition=ttft_definition(run.environment.engine_mode or profile.engine.mode),
        judged_invalid_reasons=tuple(reasons), notices=tuple(notices),
        profile_config={"engine": profile.engine.as_dict(), "workload": profile.workload.as_dict(),
                        "statistics": profile.statistics.as_dict(), "headroom_pct": profile.headroom_pct,
                        "validity": profile.validity.as_dict(), "speed_reference_ms": profile.speed_reference_ms,
                        **({"census": profile.census.as_dict()} if profile.census is not None else {})},
    ))


AB_NOT_JUDGED = ("A/B mode: TTFT is judged as the ratio to the baseline measured beside it; this absolute "
                 "budget belongs to the machine it was measured on and is shown for information only")
AB_TOKENS_NOT_JUDGED = ("A/B mode: an absolute TPOT or ITL budget belongs to the machine it was measured on and is "
                        "shown for information only")


def evaluate_ab(profile: Profile, rec: ABRecord, guard_version: str = "", output: str | Path = DEFAULT_OUTPUT) -> Results:
    """An A/B run: the candidate's op budgets as usual, its TTFT as the paired ratio to the baseline
    (``budgets.ttft_vs_baseline_pct``, guard.judge.ab), the baseline's op counts diffed against the
    candidate's. Absolute TTFT budgets are measured and shown, never judged here: they are a
    statement about a machine, which A/B mode exists to take out of the verdict."""
    from guard.judge.ab import judge_ratio, op_diff
    from guard.model.checks import pairs

    # The census is judged below against the baseline side, not the committed baseline file.
    no_abs = dataclasses.replace(profile, ttft_ms={}, token_ms={}, census=None)
    cand = evaluate(no_abs, rec.candidate, guard_version=guard_version, output=output)
    reasons = list(cand.judged_invalid_reasons)
    # The run stage's own reasons: an A/B run keeps both sides' on the candidate; a side profiled by
    # itself (guard pr --only ops) keeps its own, and a base that never ran is why nothing compares.
    reasons += [r.prefixed("baseline: ") for r in rec.baseline.invalid_reasons]
    stopped = bool(rec.candidate.invalid_reasons or rec.baseline.invalid_reasons)
    reasons += [r.prefixed("baseline: ") for r in invalid_reasons(no_abs, rec.baseline, stopped)
                if r not in hardware_reasons(profile, rec.baseline.environment)]  # same machine: said once
    paired = pairs(rec.candidate.outcomes, rec.baseline.outcomes)
    want = profile.workload.requests
    if (profile.ttft_vs_baseline_pct or profile.tpot_vs_baseline_pct) and len(paired) < want and not stopped:
        reasons.append(InvalidReason(K.TOO_FEW_SAMPLES, f"too few A/B pairs: {len(paired)} of {want} requested" if paired
                                     else "no A/B pairs were measured (a request succeeded on both sides for none of the images)"))
    stats = profile.ab_statistics
    ratio = [judge_ratio(k, b, paired, rec.candidate.rounds, stats)
             for k, b in profile.ttft_vs_baseline_pct.items()] if paired else []
    tpot_paired = pairs(rec.candidate.outcomes, rec.baseline.outcomes, TPOT)
    ratio += tpot_ratio_checks(profile, tpot_paired, rec.candidate.rounds, stats)
    if profile.tpot_vs_baseline_pct and paired and not tpot_paired and not stopped and rec.candidate.timed_tokens:
        reasons.append(InvalidReason(K.TOO_FEW_SAMPLES, "no A/B pairs of TPOT were measured: no request returned "
                                     "a second token on both sides"))
    absolute = [dataclasses.replace(c, status=Status.NOT_JUDGED, note=AB_NOT_JUDGED) for c in ttft_checks(profile, rec.candidate)]
    absolute_tokens = [dataclasses.replace(c, status=Status.NOT_JUDGED, note=AB_TOKENS_NOT_JUDGED)
                       for c in token_checks(profile, rec.candidate)]
    census = ab_census_judgement(profile, rec) if not stopped else None
    notices = cand.notices
    cache = rec.baseline.environment.op_counts_cache
    if cache is not None and cache.status == "hit":
        notices += (f"op counts: the baseline side's come from guard's cache, profiled {cache.recorded_at} in this "
                    f"same baseline environment (key {cache.key}); `--fresh-baseline` profiles them again",)
    if census is not None:
        reasons += census.invalid
        notices += tuple(ab_census_notices(census))
    notices += tuple(ab_contention_notices(profile, rec.candidate.environment.cpu_contention))
    census_checks = census.checks if census is not None else ()
    ab = ABComparison(baseline_python=rec.baseline_python, baseline=rec.baseline, order=tuple(rec.order),
                      pairs=tuple(paired), op_diff=tuple(op_diff(rec.candidate.op_counts, rec.baseline.op_counts)))
    # the census rule it was judged by (against the baseline side), as evaluate records it for its committed baseline
    census_rule = {"census": profile.census.as_dict()} if profile.census is not None else {}
    config = {**cand.profile_config, **census_rule, "ab": {"ttft_vs_baseline_pct": dict(profile.ttft_vs_baseline_pct),
                                            "tpot_vs_baseline_pct": dict(profile.tpot_vs_baseline_pct),
                                            "gpu_memory_utilization": {"candidate": profile.ab.candidate_gpu_memory_utilization,
                                                                       "baseline": profile.ab.baseline_gpu_memory_utilization},
                                            "batch": stats.batch, "confidence": stats.confidence,
                                            "fail_confidence": stats.fail_confidence,
                                            "idle_side": "paused"}}
    return settled(dataclasses.replace(cand, ttft_checks=tuple(absolute), token_checks=tuple(absolute_tokens),
                                       ab_checks=tuple(ratio), ab=ab,
                                       census_checks=tuple(census_checks), judged_invalid_reasons=tuple(reasons),
                                       profile_config=config, notices=notices))


def tpot_ratio_checks(profile: Profile, paired: Sequence[Pair], rounds: int, stats: Statistics) -> list[RatioCheck]:
    """``tpot_vs_baseline_pct``: each request's TPOT against its baseline twin's (``paired``), by the
    ratio rule of TTFT's pairs (guard.judge.ab), on the pairs TTFT's rule measured (its stopping rule
    does not wait for these)."""
    from guard.judge.ab import judge_ratio

    return [judge_ratio(k, b, paired, rounds, stats, metric=TPOT)
            for k, b in profile.tpot_vs_baseline_pct.items()] if paired else []


def ab_contention_notices(profile: Profile, reading: ContentionReading | None) -> list[str]:
    """A machine busy enough to invalidate an absolute check: said, never a reason here. Both
    members of every pair were measured under it, seconds apart, so it cancels in the ratio
    (measured: docs/campaigns/2026-11-30-ab-live-busy-core.md)."""
    if busy(reading, profile.validity.max_other_cpu_pct) is None:
        return []
    limit = profile.validity.max_other_cpu_pct
    return [f"busy machine: {fmt.contention(reading, ab=True)}. An absolute check would not judge TTFT above "
            f"{limit:g} % of the cores (validity.max_other_cpu_pct); A/B judges the ratio, because both sides of "
            "every pair ran under the same load"]


def ab_census_judgement(profile: Profile, rec: ABRecord) -> CensusJudgement | None:
    """The candidate's census against the baseline side's, by the profile's census rule: what the
    candidate changed in every function under the roots, with no committed baseline involved."""
    if profile.census is None:
        return None
    sizes = profile.workload.profile_image_sizes
    missing = [InvalidReason(K.CENSUS_MISSING, f"census: the baseline side measured no census for a {fmt.size(s)} image")
               for s in sizes if fmt.size(s) not in rec.baseline.census]
    if missing:
        return CensusJudgement(invalid=tuple(missing))
    side = Baseline(path=Path(f"the baseline side ({rec.baseline_python})"), model=rec.candidate.model,
                    profile=profile.name, roots=tuple(profile.census.roots), census=rec.baseline.census,
                    decode=rec.baseline.decode_census)
    return judge(profile.census, side, rec.candidate.census, sizes, model=rec.candidate.model, profile=profile.name,
                 update_command="guard check --baseline PYTHON", decode=rec.candidate.decode_census,
                 mixes=profile.workload.profile_mixes)


def ab_census_notices(census: CensusJudgement) -> list[str]:
    return [f"census: compared with the baseline side ({census.functions} function x image size or request mix "
            "entries), not with the committed baseline file", *_changes_within_the_rule(census), *census.not_judged]


def _changes_within_the_rule(census: CensusJudgement) -> list[str]:
    """One notice per function that moved without failing (the first ten), then how many more."""
    moved = [c for c in census.checks if c.status != Status.FAIL]
    donors = {d for c in census.checks for d in c.moved_from}  # their calls went elsewhere: no improvement
    lines = [f"census: {fmt.census_change(c, donor=c.function in donors)}" for c in moved[:10]]
    if len(moved) > 10:
        lines.append(f"census: ... and {len(moved) - 10} more changed function(s) within the rule (results.json)")
    return lines


def pr_notices(pr: PullRequestDiff) -> list[str]:
    """What a pull request changed that this run did not measure or apply, first among the notices."""
    out = []
    if pr.budgets is not None and pr.budgets.head_changed_files:
        out.append(budget_notices(pr.budgets)[0])
    if pr.unmeasured_files:
        shown = ", ".join(pr.unmeasured_files[:5]) + (", ..." if len(pr.unmeasured_files) > 5 else "")
        out.append(f"not measurable on this engine stack: {len(pr.unmeasured_files)} changed file(s) of compiled "
                   f"code or dependencies ({shown}); the census covers the Python part only. A GPU job that builds "
                   "them decides the rest")
    if not pr.measured:
        out.append("not measured: base and head have the same vllm/ Python sources")
    for name, side in (("base", pr.base), ("head", pr.head)):
        if side.differs:
            out.append(f"{name} ran {side.environment}, whose vllm/ is not {side.sha[:12]}'s in {side.differs} Python "
                       "file(s): its census is of the code installed there")
    if pr.budgets is not None:
        out.append(budget_notices(pr.budgets)[-1])
    return out


# What a side's environment is named by when the two differ; vLLM's own version is the revision's.
ENVIRONMENT_FACTS = (("torch", "torch"), ("transformers", "transformers"), ("python", "Python"),
                     ("cuda_runtime", "CUDA runtime"), ("vllm_dist", "vLLM distribution"))


def environment_differences(rec: ABRecord) -> list[tuple[str, str | None, str | None]]:
    """(what, base's, head's) for each fact of the two sides' environments that differs."""
    base, head = rec.baseline.environment, rec.candidate.environment
    return [(label, getattr(base, key), getattr(head, key)) for key, label in ENVIRONMENT_FACTS
            if getattr(base, key) != getattr(head, key) and getattr(base, key) and getattr(head, key)]


def environment_notice(rec: ABRecord, pr: PullRequestDiff) -> list[str]:
    """Named, not blamed: the verdict stands (docs/pr.md, environments per side), and a reviewer can
    tell a dependency's change from vLLM's own in the census findings."""
    diffs = environment_differences(rec)
    if not diffs:
        return []
    said = ", ".join(f"{what} {a} → {b}" for what, a, b in diffs)
    own = any(unmeasurable(f) == "dependencies" for f in pr.changed_files)
    why = ("the pull request changes dependency files, so they are its own change" if own else
           "the pull request changes no dependency file: the environments were built apart, from other "
           "requirements, on another day or from another index")
    return [f"{ENVIRONMENTS_DIFFER} {said} ({why}); census changes in functions that call into them may be the "
            "dependency's, not vLLM's Python"]


def budget_notices(source: BudgetSource) -> list[str]:
    """``guard pr --thresholds-in-repo``: where the budgets came from, and a budget change head made
    (reported for a maintainer's approval, never applied: guard.revisions.inrepo)."""
    out = []
    if source.head_changed_files:
        out.append(f"budget change in this pull request, needs a maintainer's approval: it changes "
                   f"{', '.join(source.head_changed_files)}; not applied: base's copy judged both sides. "
                   + "; ".join(source.head_changes))
    out.append(f"budgets: {source.path} as base {source.revision[:12]} has it"
               + (f", with {', '.join(source.files[1:])}" if len(source.files) > 1 else ""))
    return out


def evaluate_pr(profile: Profile, rec: ABRecord, pr: PullRequestDiff, *, guard_version: str = "",
                output: str | Path = DEFAULT_OUTPUT, census_baseline: Baseline | None = None) -> Results:
    """``guard pr``: head is the candidate, base the baseline side (evaluate_ab), so the census and
    the op budgets are judged side against side and no committed file is needed. An op budget
    that base already exceeded by as much fails nobody's pull request: a notice. What the pull
    request changed that this engine stack cannot measure (compiled code, dependencies) turns a
    pass into ``not_measurable``; a regression it could measure stays one.

    ``census_baseline``: the committed census of the budgets that judge (read_baseline). A function
    that grew against base but holds within it was accepted there: the budgets that judge carry head's
    counts (guard.github.budget_files: head's copy, accepted), so it passes with a notice."""
    ops_only = not rec.candidate.measures.ttft  # `--only ops`: the sides were profiled, no pairs timed
    judged = (dataclasses.replace(profile, ttft_ms={}, token_ms={}, ttft_vs_baseline_pct={}, tpot_vs_baseline_pct={})
              if ops_only else profile)
    res = evaluate_ab(judged, rec, guard_version=guard_version, output=output)
    base_calls = {(c.scope, tuple(c.image_size)): c for c in rec.baseline.op_counts}
    ops, notices = [], list(res.notices)
    for c in res.op_checks:
        base = base_calls.get((c.scope, tuple(c.image_size)))
        before = None if base is None else (base.total_calls if c.op == TOTAL_OPS else base.calls_by_op.get(c.op, 0))
        if c.status == Status.FAIL and before is not None and before >= c.measured_calls:
            notices.append(f"{fmt.label(c)}: {c.measured_calls} calls, over its budget of {c.budget_calls} on base "
                           f"({before}) already; this pull request did not add to it")
            c = dataclasses.replace(c, status=Status.PASS)
        ops.append(c)
    census = res.census_checks
    if census_baseline is not None and any(c.status == Status.FAIL for c in census) \
            and not census_against_bf16(profile, rec.candidate.environment):
        census, accepted = _accepted_census(profile, rec, census_baseline, census, output)
        notices += accepted
    notices[:0] = pr_notices(pr) + environment_notice(rec, pr)
    return settled(dataclasses.replace(res, op_checks=tuple(ops), census_checks=tuple(census), notices=tuple(notices),
                                       pr=pr))


def _accepted_census(profile: Profile, rec: ABRecord, baseline: Baseline, checks: Sequence[CensusCheck],
                     output: str | Path) -> tuple[list[CensusCheck], list[str]]:
    """Side-against-side census failures that the committed baseline holds: passed, each with a notice."""
    committed = census_judgement(profile, rec.candidate, baseline, output)
    if committed is None or committed.invalid:
        return list(checks), []
    failing_there = {c.key for c in committed.checks if c.status == Status.FAIL}
    # a mix's decode census that the committed file cannot judge (no baseline yet, another output length)
    unjudged = {m.name for m in profile.workload.profile_mixes if m.name not in baseline.decode
                or m.name in rec.candidate.decode_census
                and comparable(baseline.decode[m.name], rec.candidate.decode_census[m.name]) is None}
    out, notices = [], []
    for c in checks:
        # a function with no record against the committed baseline counts exactly what it holds
        if c.status == Status.FAIL and c.key not in failing_there and c.mix not in unjudged:
            notices.append(f"{c.label}: grew against base, within the committed census baseline "
                           f"{Path(profile.census.baseline).name} (the budgets that judged this accept it)")
            c = dataclasses.replace(c, status=Status.PASS)
        out.append(c)
    return out, notices
