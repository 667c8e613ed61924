"""Rewrite a profile's budgets from a results.json, as a minimal, reviewable diff.

TTFT: new budget = measured percentile x (1 + headroom), rounded *up* to 3 significant figures
(8130 ms x 1.15 = 9349.5 -> 9350; 12.34 ms x 1.1 = 13.574 -> 13.6). A budget moves only when the
new value differs from the old one by more than a third of the headroom, so re-running on similar
numbers leaves the file alone. Op counts ratchet: lowered to the measured count (the maximum over
the profiled image sizes) automatically; raised only with --allow-increase, and loudly.

Only the changed scalars are rewritten (``guard.config.yamledit``); a ``provenance:`` mapping in the
profile records where the numbers came from. The write is atomic; --dry-run only prints the diff.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import difflib
import math
import os
import sys
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import Any, TextIO

from guard import files
from guard.files import find_recorded, person_path, repository_root
from guard.judge import gates
from guard.config import yamledit
from guard.config.budgets import CensusRule, Profile, Thresholds
from guard.config.loading import load_thresholds
from guard.config.census import CensusPlan, plan_census, write_census_atomic
from guard.errors import ConfigError, UsageError
from guard.measure.fit import as_it_ran, census_of_other_kernels, engine_on_cpu, engine_ran_bf16_fallback, ttft_binding_fits
from guard.measure.hardware import git_commit, ttft_hardware_for
from guard.model.environment import Environment
from guard.model.records import LATENCY_METRICS, TOTAL_OPS, TTFT, ReasonKind, Verdict, reasons_text
from guard.model.results import Results
from guard.model.jsonfiles import load_results

SIGNIFICANT_FIGURES = 3
HYSTERESIS_FRACTION = 1 / 3  # of the headroom: smaller moves are noise, not a new baseline
PROVENANCE_KEY = "provenance"


@dataclass(frozen=True)
class Change:
    """One budget looked at: moved (``applied``) or kept."""

    path: tuple[str, ...]  # key path of the scalar in the YAML
    label: str  # "ttft_ms.p50", "mask_path.ops.aten::_index_put_impl_ (max)"
    old: float
    new: float
    measured: float
    unit: str  # "ms" | "calls"
    applied: bool
    increase: bool = False  # an op-count budget raised: needs --allow-increase
    rebound: bool = False  # TTFT: the budget was bound to another CPU (or to none); rewritten for this one


@dataclass(frozen=True)
class Plan:
    profile: str
    headroom_pct: float
    changes: tuple[Change, ...]
    provenance: dict[str, Any] = field(default_factory=dict)
    ttft_hardware: dict[str, Any] | None = None  # budgets.ttft_hardware to write (with the TTFT budgets)
    speed_reference_ms: float | None = None  # the run's guard.measure.speedref reading, written with the TTFT budgets
    bound_to: str = ""  # the hardware the old TTFT budgets were bound to, for the summary

    @property
    def applied(self) -> list[Change]:
        return [c for c in self.changes if c.applied]

    @property
    def increases(self) -> list[Change]:
        return [c for c in self.applied if c.increase]


# ----------------------------------------------------------------------------- rules
def ttft_budget(measured_ms: float, headroom_pct: float) -> int | float:
    """measured x (1 + headroom), rounded up to 3 significant figures (never below the headroom).
    Decimal, so 8000 x 1.1 is 8800 and not 8800.000000000002 rounded up to 8810."""
    raw = Decimal(repr(measured_ms)) * (1 + Decimal(repr(headroom_pct)) / 100)
    quantum = Decimal(1).scaleb(raw.adjusted() - (SIGNIFICANT_FIGURES - 1))
    value = (raw / quantum).to_integral_value(rounding=ROUND_CEILING) * quantum
    return int(value) if value == value.to_integral_value() else float(value)


def moves(old: float, new: float, headroom_pct: float) -> bool:
    """Hysteresis: move only when the change exceeds a third of the headroom (relative to old)."""
    return abs(new - old) > old * headroom_pct / 100 * HYSTERESIS_FRACTION


# ----------------------------------------------------------------------------- refusals
def _refuse(results_path: Path, key: str, problem: str, hint: str | None = None) -> ConfigError:
    return ConfigError(str(results_path), None, key, problem, hint=hint)


def check_usable(results: Results, results_path: Path, profile: Profile, only: str | None,
                 thresholds_model: str) -> None:
    """Raise unless ``results`` is a valid, complete run of ``profile``. Never update from a failed run."""
    if results.run.profile != profile.name:
        raise UsageError(
            f"{results_path} was measured with hardware profile '{results.run.profile}', not '{profile.name}': "
            "budgets are only updated from a run on their own hardware",
            hint=f"run `guard check --profile {profile.name}` on that hardware, or pass --profile {results.run.profile}",
        )
    if results.run.model and results.run.model != thresholds_model:
        raise UsageError(f"{results_path} measured model '{results.run.model}'; this thresholds file is for "
                         f"'{thresholds_model}'", hint="pass the --thresholds file the run used")
    # a run whose only flaw is a missing census baseline is valid: it just had nothing to compare with yet
    reasons = [r for r in results.invalid_reasons if r.kind != ReasonKind.CENSUS_BASELINE]
    if reasons or (results.verdict == Verdict.INVALID and not results.invalid_reasons):
        detail = reasons_text(reasons) or f"verdict is '{results.verdict}'"
        raise _refuse(results_path, "verdict", f"the run was invalid ({detail}); an update is never made from a failed run",
                      hint="fix the run and re-run `guard check`")
    if results.run.injected:
        raise _refuse(results_path, "run.injected",
                      f"the run had a regression injected on purpose ({results.run.injected}); it is no baseline")
    _check_same_config(results, results_path, profile, only)
    if only in (None, "ttft") and profile.ttft_ms:
        if not results.run.ttft_client_s():
            raise _refuse(results_path, "samples.ttft_client_s", "no TTFT samples in this run",
                          hint="use --only ops to update the op-count budgets alone")
        changed_speed = gates.unsteady(results.run.environment.speed_reference,
                                          profile.validity.max_slowdown_pct)
        if changed_speed:
            raise _refuse(results_path, "run.environment.speed_reference", changed_speed,
                          hint="re-run `guard check` and update from a run whose `machine speed` line shows two "
                               "close readings; --only ops updates the op-count budgets alone")
        ttft = {c.percentile: c.measured_ms for c in results.ttft_checks}
        for key in profile.ttft_ms:
            got = ttft.get(key)
            if got is None:
                raise _refuse(results_path, f"checks.ttft[{key}]", f"no TTFT {key} measurement in this run")
            if not (math.isfinite(got) and got > 0):
                raise _refuse(results_path, f"checks.ttft[{key}].measured_ms", f"not a usable TTFT measurement: {got!r}")
    if only in (None, "ttft") and results.run.timed_tokens:  # TPOT and ITL move with TTFT (same requests)
        measured_ms = {c.key: c.measured_ms for c in results.token_checks}
        for metric, key in ((m, k) for m, budgets in profile.token_ms.items() for k in budgets):
            got = measured_ms.get((metric, key))
            if got is None or not (math.isfinite(got) and got > 0):
                raise _refuse(results_path, f"checks.{metric}[{key}]", f"no usable {metric.upper()} {key} measurement "
                              f"in this run ({got!r})", hint="re-run `guard check` with the current thresholds file")
    if only in (None, "ops"):
        measured = _op_measurements(results)
        for sb in profile.ops:
            labels = [*sb.ops, *([TOTAL_OPS] if sb.total_ops is not None else [])]
            for label in labels:
                if (sb.name, label) not in measured:
                    raise _refuse(results_path, f"checks.ops[{sb.name}, {label}]",
                                  f"op-count scope '{sb.name}' has no measurement of {label} in this run",
                                  hint="use --only ttft to update the TTFT budgets alone")


# What the op counts and the census per profiled request depend on: how many requests the timing
# pass sent, at what concurrency and for how many tokens, does not change them (the profiled prefill
# stops at its first token; benchmarks/census_stability.py: identical after any number of requests).
CENSUS_WORKLOAD_KEYS = ("profile_image_sizes", "prompt", "seed", "profile_mixes")


def _check_same_config(results: Results, results_path: Path, profile: Profile, only: str | None = None) -> None:
    """The run must have used the engine and workload the YAML holds now, or its numbers mean
    something else. Absolute model paths differ between checkouts, so those are not compared.
    An op-count or census update compares only what the counts depend on, plus the census roots."""
    recorded = results.profile_config or {}
    workload = profile.workload.as_dict()
    if only in ("ops", "census"):
        workload = {k: v for k, v in workload.items() if k in CENSUS_WORKLOAD_KEYS}
    if only == "census":
        then_roots = (recorded.get("census") or {}).get("roots")
        if profile.census is not None and then_roots is not None and list(then_roots) != list(profile.census.roots):
            raise _refuse(results_path, "profile_config.census.roots",
                          f"the run counted under roots {then_roots}, the thresholds file now says "
                          f"{list(profile.census.roots)}", hint=f"re-run `guard check --profile {profile.name}`")
    engine = profile.engine
    if engine_ran_bf16_fallback(recorded.get("engine")):  # the YAML's own fallback, not another config
        engine = engine_on_cpu(engine, native_bf16=False)
    current = {"engine": engine.as_dict(), "workload": workload}
    for section, now in current.items():
        then = recorded.get(section)
        if not isinstance(then, dict):
            continue  # older results without the section: nothing to compare
        for key, value in now.items():
            if key == "model" and str(value).startswith("/"):
                continue
            if key in then and then[key] != value:
                raise _refuse(results_path, f"profile_config.{section}.{key}",
                              f"the run used {section}.{key} = {then[key]!r}, the thresholds file now says {value!r}",
                              hint=f"re-run `guard check --profile {profile.name}` with the current thresholds file")


def _op_measurements(results: Results) -> dict[tuple[str, str], int]:
    """(scope, op or total_ops) -> the largest count over the profiled image sizes: budgets are per request."""
    out: dict[tuple[str, str], int] = {}
    for c in results.op_checks:
        key = (c.scope, c.op)
        out[key] = max(out.get(key, 0), c.measured_calls)
    return out


# ----------------------------------------------------------------------------- plan
def plan_update(profile: Profile, results: Results, *, headroom_pct: float, only: str | None,
                allow_increase: bool, provenance: dict[str, Any]) -> Plan:
    base = ("profiles", profile.name, "budgets")
    changes: list[Change] = []
    binding = None
    if only in (None, "ttft"):
        measured = {c.key: c.measured_ms for c in (*results.ttft_checks, *results.token_checks)}
        binding = _rebinding(profile, results.run.environment)
        # Bound to another CPU: that budget says nothing about this one, so rewrite it even within
        # hysteresis. Bound to none yet: the binding is written only when a TTFT budget moves.
        elsewhere = binding is not None and profile.ttft_hardware is not None
        # TPOT and ITL move with TTFT (the same requests); a run from before guard timed tokens leaves
        # them as they are (its notice says so)
        metrics = LATENCY_METRICS if results.run.timed_tokens else (TTFT,)
        for metric, key, old in ((m, k, b) for m in metrics for k, b in profile.latency_ms(m).items()):
            got = measured[(metric, key)]  # present and positive: check_usable ran first
            new = ttft_budget(got, headroom_pct)
            where = profile.budget_key(metric) + (key,)
            changes.append(Change(base + where, ".".join(where), old, new, got, "ms",
                                  applied=elsewhere or moves(old, new, headroom_pct), rebound=elsewhere))
    if only in (None, "ops"):
        counts = _op_measurements(results)
        for sb in profile.ops:
            budgets = [(("ops", op), op, b) for op, b in sb.ops.items()]
            if sb.total_ops is not None:
                budgets.append(((TOTAL_OPS,), TOTAL_OPS, sb.total_ops))
            for sub, label, budget in budgets:
                got = counts[(sb.name, label)]
                if got == budget.count:
                    continue
                changes.append(Change(base + ("ops", sb.name) + sub + (budget.rule,),
                                      f"{sb.name}.{'.'.join(sub)} ({budget.rule})", budget.count, got, got, "calls",
                                      applied=True, increase=got > budget.count))
    bound_to = profile.ttft_hardware.describe() if profile.ttft_hardware else ""
    plan = Plan(profile.name, headroom_pct, tuple(changes), provenance, ttft_hardware=binding, bound_to=str(bound_to),
                speed_reference_ms=_speed_reference(profile, results.run.environment) if only in (None, "ttft") else None)
    if plan.increases and not allow_increase:
        rises = ", ".join(f"{c.label} {_num(c.old)} -> {_num(c.new)}" for c in plan.increases)
        raise UsageError(
            f"refusing to raise op-count budgets: {rises}. More calls on a budgeted path is the regression "
            "this guard exists to catch",
            hint="if the new ops are intended, re-run with --allow-increase and say why in the pull request",
        )
    return plan


def _rebinding(profile: Profile, env: Environment) -> dict[str, Any] | None:
    """The ``budgets.ttft_hardware`` to write with the TTFT budgets: the run's CPU, when the profile
    is a CPU profile whose TTFT budgets are bound to no CPU or to another one. None: keep it."""
    binding = ttft_hardware_for(env)
    if binding is None or not profile.ttft_ms or profile.match.cuda:
        return None
    bound = profile.ttft_hardware
    if bound is not None and ttft_binding_fits(bound, env.cpu, env.cpu_count, env.cpu_isa):
        return None  # the run's machine is the budget's (a hand-written range or pattern stays)
    return binding


def _speed_reference(profile: Profile, env: Environment) -> float | None:
    """The run's speed reference (guard.measure.speedref), to bind the new TTFT budgets to this machine's
    speed as well as its CPU; None on a GPU profile or for a run that recorded none."""
    speed = env.speed_reference
    if profile.match.cuda or speed is None or not speed.comparable:
        return None
    return round(speed.ms, 1)


def _hardware_edit(plan: Plan) -> dict[str, Any] | None:
    """What goes into budgets.ttft_hardware with moved TTFT budgets: the CPU binding when it changes,
    the speed reference whenever the run measured one. None: nothing."""
    if not any(c.unit == "ms" for c in plan.applied):
        return None
    values = dict(plan.ttft_hardware or {})
    if plan.speed_reference_ms is not None:
        values["speed_reference_ms"] = plan.speed_reference_ms
    return values or None


def render(text: str, plan: Plan) -> str:
    """The YAML text with the plan applied; unchanged text when nothing moves (no provenance churn)."""
    if not plan.applied:
        return text
    root = yamledit.compose(text)
    edits = [e for c in plan.applied if (e := yamledit.set_scalar(text, root, c.path, c.new))]
    prov_path = ("profiles", plan.profile, PROVENANCE_KEY)
    edits += yamledit.set_mapping(text, root, prov_path, plan.provenance)
    expected: dict[tuple[str, ...], Any] = {**{c.path: c.new for c in plan.applied}, prov_path: plan.provenance}
    hardware = _hardware_edit(plan)
    if hardware is not None:
        hw_path = ("profiles", plan.profile, "budgets", "ttft_hardware")
        edits += yamledit.set_mapping(text, root, hw_path, hardware)
        expected[hw_path] = hardware
    new_text = yamledit.apply(text, edits)
    yamledit.verify(text, new_text, expected)
    return new_text


# ----------------------------------------------------------------------------- provenance
def _utcnow() -> dt.datetime:  # one place for tests to pin the clock
    return dt.datetime.now(dt.timezone.utc)


def _hardware(env: Environment) -> str:
    """From guard.measure.hardware.fingerprint: the GPU when there is one, else the CPU and its core
    count (CPU TTFT scales with cores)."""
    if env.gpu:
        return env.gpu
    if env.cpu:
        return f"{env.cpu} ({env.cpu_count} cores)" if env.cpu_count else env.cpu
    return "unknown"


def provenance_for(results: Results, headroom_pct: float, cwd: Path) -> dict[str, Any]:
    env = results.run.environment
    return {
        "date": _utcnow().astimezone(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z"),
        "commit": str(env.git_commit or git_commit(cwd) or "unknown"),
        "hardware": _hardware(env),
        "vllm": env.vllm or "unknown",
        "samples": len(results.run.ttft_client_s()),
        "headroom_pct": _num(headroom_pct),
        # the Hub commit the weights were loaded at (guard.config.weights resolves a moving `main`)
        **({"model_revision": env.model_revision} if env.model_revision else {}),
    }


# ----------------------------------------------------------------------------- file
def write_text_atomic(path: Path, text: str) -> None:
    """The thresholds file, atomically and through a symlink (guard.files), never in a form that
    guard itself would reject."""
    files.write_text_atomic(path, text, check=load_thresholds)


def unified_diff(old: str, new: str, path: Path) -> str:
    a, b = (f"a/{path}", f"b/{path}") if not path.is_absolute() else (str(path), str(path))  # git's look
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True), fromfile=a, tofile=b)
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


# ----------------------------------------------------------------------------- command
def recorded_thresholds(results: Results, results_path: Path, out: TextIO) -> Path:
    """The thresholds file the run recorded, found in this checkout: recorded from the repository's
    root, it is looked up at the root of the repository the working directory is in; an older
    record's absolute path from another machine by its tail (guard.files.find_recorded)."""
    recorded = results.run.thresholds_path
    if not recorded:
        raise UsageError(f"{results_path} does not name its thresholds file", hint="pass --thresholds PATH")
    found = find_recorded(recorded)
    if found is None:
        root = repository_root(Path.cwd()) or Path.cwd()
        raise ConfigError(recorded, None, "(file)", f"no such thresholds file (recorded in {results_path}, "
                          f"looked for from {root})",
                          hint="run this at the root of the repository the budgets live in, or pass --thresholds PATH")
    if Path(recorded).is_absolute() and found != Path(recorded):
        print(f"thresholds: {results_path} recorded {recorded} (another machine's path); using {person_path(found)}",
              file=out)
    return found


def update_thresholds(*, results_path: Path, thresholds_path: Path | None, profile: str | None,
                      headroom_pct: float | None, only: str | None, allow_increase: bool, dry_run: bool,
                      out: TextIO | None = None) -> int:
    out = out or sys.stdout  # looked up per call, so a redirected stdout is honoured
    results = load_results(results_path)
    if thresholds_path is None:
        thresholds_path = recorded_thresholds(results, results_path, out)
    thresholds: Thresholds = load_thresholds(thresholds_path)
    prof = _profile_to_update(thresholds, results, results_path, profile, only)
    if headroom_pct is None:
        headroom_pct = prof.headroom_pct
    elif not (math.isfinite(headroom_pct) and 0 <= headroom_pct <= 1000):
        raise UsageError(f"--headroom must be a percentage between 0 and 1000, got {headroom_pct}")
    check_usable(results, results_path, prof, only, thresholds.model)

    plan = plan_update(prof, results, headroom_pct=headroom_pct, only=only, allow_increase=allow_increase,
                       provenance=provenance_for(results, headroom_pct, thresholds_path.resolve().parent))
    prof = dataclasses.replace(prof, census=_census_to_update(prof, results, results_path, only, out))
    census: CensusPlan | None = None
    if prof.census is not None and only is None and not results.run.census:
        print(f"census: {results_path} has no census; {prof.census.baseline} is left as it is", file=out)
    elif prof.census is not None and only in (None, "census"):
        census = plan_census(prof, thresholds.model, results.run.census, provenance=plan.provenance,
                             allow_increase=allow_increase, results_path=results_path,
                             run_decode=results.run.decode_census)
    old = thresholds_path.read_bytes().decode("utf-8")  # not read_text: keep \r\n line endings as they are
    new = _rendered(thresholds_path, old, plan)
    census_written = census is not None and _write_census(census, dry_run, out)
    if only == "census":
        return 0
    _print_summary(plan, out)
    if new == old:
        print(f"no changes: {thresholds_path} already holds these budgets", file=out)
        return 0
    if plan.increases:
        print(_warning(plan), file=out)
    out.write(unified_diff(old, new, thresholds_path))
    if dry_run:
        print(f"dry run: {thresholds_path} not written", file=out)
        return 0
    _write_budgets(thresholds_path, new, census if census_written else None, out)
    if plan.increases:
        print(f"WARNING: {len(plan.increases)} op-count budget(s) raised; see above", file=out)
    return 0


def _profile_to_update(thresholds: Thresholds, results: Results, results_path: Path, name: str | None,
                       only: str | None) -> Profile:
    """The profile the run measured, with the budgets of the engine mode it measured in
    (budgets.modes.<mode>.ttft_ms for the other mode), holding the budgets ``--only`` asks for."""
    server = results.run.environment.server
    if server is not None and server.remote:
        raise _refuse(results_path, "run.environment.server", "the run measured a server guard did not start "
                      f"({server.url}); its engine arguments are unknown, so it is no baseline",
                      hint="re-run `guard check --engine-mode server` so guard starts the server itself")
    prof = thresholds.profile(name or results.run.profile).with_engine_mode(results.run.environment.engine_mode)
    if only == "ttft" and not prof.ttft_ms:
        raise UsageError(f"profile '{prof.name}' has no TTFT budgets to update")
    if only == "ops" and not prof.ops:
        raise UsageError(f"profile '{prof.name}' has no op-count budgets to update")
    if only == "census" and prof.census is None:
        raise UsageError(f"profile '{prof.name}' has no census rule", hint="add `census: {baseline: FILE}` to its budgets")
    return prof


def _census_to_update(prof: Profile, results: Results, results_path: Path, only: str | None,
                      out: TextIO) -> CensusRule | None:
    """The census rule whose baseline the run's census goes to: the baseline of the kernels it ran
    on (guard.measure.fit), never one counted with other kernels (None then, said on ``out``;
    ``--only census`` refuses)."""
    if prof.census is None:
        return None
    fallback = engine_ran_bf16_fallback((results.profile_config or {}).get("engine"))
    env = results.run.environment
    ran_as = as_it_ran(prof, env, bf16_fallback=fallback)
    other = census_of_other_kernels(prof, ran_as, bf16_fallback=fallback)
    if other is None:
        return ran_as.census
    dtype = prof.engine.dtype_without_native_bf16
    refusal, hint, said = {
        "amx": (f"{results_path}: counted on a CPU with AMX; {prof.census.baseline} was counted "
                "without it, where vLLM runs other GEMM kernels",
                "give the profile `census.baseline_with_amx: FILE` for this machine's census, then run this command again",
                "was counted with AMX;"),
        "float32": (f"{results_path}: the engine ran {dtype} in place of bfloat16 (this CPU has no native bf16); "
                    f"{prof.census.baseline} is a bfloat16 census, which counts casts that {dtype} does not make",
                    "update it from a run on a CPU with native bf16 (avx512_bf16 or amx_bf16), or give the "
                    "profile `census.baseline_without_native_bf16: FILE` for this dtype's census",
                    f"ran {dtype}, not bfloat16;"),
    }[other]
    if only == "census":
        raise UsageError(refusal, hint=hint)
    print(f"census: {results_path} {said} {prof.census.baseline} is left as it is", file=out)
    return None


def _rendered(thresholds_path: Path, old: str, plan: Plan) -> str:
    """The file with the plan's budgets, checked to load before anything is written: the census
    must not change beside budgets that cannot."""
    try:
        new = render(old, plan)
    except yamledit.YamlEditError as exc:
        raise ConfigError(str(thresholds_path), exc.line, exc.key or "(file)",
                          f"could not edit in place: {exc}; the file is unchanged") from None
    if new != old:
        try:
            load_thresholds(thresholds_path, text=new)
        except ConfigError as exc:
            raise ConfigError(str(thresholds_path), exc.line, exc.key,
                              f"the updated budgets would not load ({exc.problem}); nothing was written") from None
    return new


def _write_budgets(thresholds_path: Path, new: str, census: CensusPlan | None, out: TextIO) -> None:
    """Write the budgets; where that fails, the census written beside them (``census``) goes back."""
    try:
        write_text_atomic(thresholds_path, new)
    except OSError as exc:
        undone = _undo_census(census) if census is not None else ""
        raise ConfigError(str(thresholds_path), None, "(file)",
                          f"cannot write: {exc}; the file is unchanged{undone}") from None
    except BaseException:  # Ctrl-C, or anything else: the census goes back all the same
        if census is not None:
            _undo_census(census)
        raise
    via = f" (through the symlink, to {os.path.realpath(thresholds_path)})" if thresholds_path.is_symlink() else ""
    print(f"wrote {thresholds_path}{via}", file=out)


def _undo_census(census: CensusPlan) -> str:
    """Put the census baseline back as it was (the budgets it goes with could not be written): both
    files change, or neither. Returns what to add to the error."""
    try:
        if census.old_text is None:
            census.path.unlink(missing_ok=True)
        else:
            write_census_atomic(census.path, census.old_text)
    except OSError as exc:
        return f"; {census.path} was written and could not be put back ({exc.strerror or exc}): restore it from git"
    return f", and {census.path} is back as it was"


def _write_census(census: CensusPlan, dry_run: bool, out: TextIO) -> bool:
    """The census baseline: summary, loud warning on increases, diff, atomic write (or dry run).
    Returns whether it wrote the file."""
    path = census.path
    for line in census.summary():
        print(line, file=out)
    if census.new_text == census.old_text:
        print(f"no changes: {path} already holds this census", file=out)
        return False
    if census.increases:
        rule = "!" * 78
        print(rule, file=out)
        print(f"WARNING: this update RAISES the census of {len(census.increases)} function(s) (--allow-increase):", file=out)
        for line in census.increases[:20]:
            print(f"WARNING:   {line}", file=out)
        if len(census.increases) > 20:
            print(f"WARNING:   ... and {len(census.increases) - 20} more (see the diff)", file=out)
        print("WARNING: more operator calls per request is what the census catches; make sure the pull", file=out)
        print("WARNING: request says why the new calls are needed.", file=out)
        print(rule, file=out)
    out.write(unified_diff(census.old_text or "", census.new_text, path))
    if dry_run:
        print(f"dry run: {path} not written", file=out)
        return False
    try:
        write_census_atomic(path, census.new_text)
    except OSError as exc:
        raise ConfigError(str(path), None, "(file)", f"cannot write: {exc}; the file is unchanged") from None
    print(f"wrote {path}", file=out)
    return True


def _num(x: float) -> int | float:
    return int(x) if float(x).is_integer() else x


def _print_summary(plan: Plan, out: TextIO) -> None:
    band = plan.headroom_pct * HYSTERESIS_FRACTION
    print(f"profile {plan.profile}: headroom {_num(plan.headroom_pct)} %, budgets move beyond ±{band:.3g} %", file=out)
    for c in plan.changes:
        old, new = _num(c.old), _num(c.new)
        if c.unit == "ms":
            why = f"measured {c.measured:.1f} ms + {_num(plan.headroom_pct)} %"
            what = f"{old} -> {new} ms" if c.applied else f"{old} ms kept (would be {new}: within ±{band:.3g} %)"
            if c.rebound:
                what += f" (the budget was measured on {plan.bound_to}: rewritten for this CPU)"
        else:
            why = f"measured {int(c.measured)}"
            what = f"{old} -> {new} calls" + (" RAISED" if c.increase else " (ratchet down)")
        print(f"  {c.label}: {what}; {why}", file=out)
    if plan.ttft_hardware is not None and any(c.unit == "ms" for c in plan.applied):
        hw = plan.ttft_hardware
        isa = f" and ISA {'+'.join(hw['cpu_isa'])}" if hw.get("cpu_isa") is not None else ""
        print(f"  ttft_hardware: TTFT budgets bound to /{hw['cpu_model_regex']}/ with {hw['cpu_count']} cores{isa}; "
              "elsewhere TTFT is shown, not judged", file=out)
    if plan.speed_reference_ms is not None and any(c.unit == "ms" for c in plan.applied):
        print(f"  ttft_hardware.speed_reference_ms: {_num(plan.speed_reference_ms)} (guard's speed reference on this "
              "machine; a run that takes much longer on it measured a slow machine: validity.max_slowdown_pct)", file=out)


def _warning(plan: Plan) -> str:
    rule = "!" * 78
    lines = [rule, f"WARNING: this update RAISES {len(plan.increases)} op-count budget(s) (--allow-increase):"]
    lines += [f"WARNING:   {c.label}: {_num(c.old)} -> {_num(c.new)} calls" for c in plan.increases]
    lines += ["WARNING: more operator calls on a budgeted path is what this guard catches; make sure",
              "WARNING: the pull request says why the new calls are needed.", rule]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="results", type=Path, required=True, metavar="RESULTS_JSON",
                        help="results.json written by `guard check` on the profile's hardware")
    parser.add_argument("--thresholds", type=Path, default=None, metavar="PATH",
                        help="budget YAML to rewrite (default: the file the run used)")
    parser.add_argument("--profile", default=None, metavar="NAME",
                        help="hardware profile to update (default: the run's); must match the run's")
    parser.add_argument("--headroom", type=float, default=None, metavar="PCT",
                        help="TTFT headroom in percent (default: the profile's headroom_pct, else 10)")
    parser.add_argument("--only", choices=("ttft", "ops", "census"), default=None,
                        help="update only these budgets (ttft: the time budgets, TTFT with TPOT and ITL, which the "
                             "same requests measured; census: only the census baseline file)")
    parser.add_argument("--allow-increase", action="store_true",
                        help="allow raising op-count budgets (new ops on a budgeted path) and census counts")
    parser.add_argument("--dry-run", action="store_true", help="print the diff, write nothing")


def run(args: argparse.Namespace) -> int:
    return update_thresholds(results_path=args.results, thresholds_path=args.thresholds, profile=args.profile,
                             headroom_pct=args.headroom, only=args.only, allow_increase=args.allow_increase,
                             dry_run=args.dry_run)
