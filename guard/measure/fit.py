"""Whether a profile fits a machine, decided in this module only.

Four questions, each answered here and nowhere else (tests/test_fit.py keeps it so):
- does the profile **match** the machine (CUDA or not, the GPU's name);
- can it **run** there (``engine.requires_native_bf16`` on a CPU without native bf16);
- **as what** does it run there: the engine's dtype (``engine.dtype_without_native_bf16`` where
  bf16 would be emulated) and the census baseline counted with the same kernels
  (``census.baseline_without_native_bf16``, ``census.baseline_with_amx``);
- are its absolute **TTFT budgets judged** there (``budgets.ttft_hardware``).

A command asks once, at its edge, with the machine it detected (``select_profile``); the judge and
``update-thresholds`` ask the same questions of the machine a run recorded (``as_it_ran``,
``ttft_not_judged``), so a run is judged by the rules it ran under.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Protocol

from guard.config.budgets import (
    AMX_DTYPES, NATIVE_BF16_EXTENSIONS, EngineArgs, Profile, Thresholds, TtftHardware, describe_isa,
)
from guard.errors import InvalidRunError
from guard.model.environment import Environment, bf16_replaced, has_amx


class Machine(Protocol):
    """What fit reads of a machine (guard.measure.hardware.Hardware is one)."""

    cuda: bool
    gpu_name: str | None
    cpu_name: str
    cpu_count: int
    cuda_problem: str | None
    cpu_isa: tuple[str, ...] | None
    native_bf16: bool

    def describe(self) -> str: ...


# ----------------------------------------------------------------------------- match and run
def mismatch(profile: Profile, machine: Machine) -> str | None:
    """Why this machine is not the profile's hardware, or cannot run it; None when it fits."""
    if profile.match.cuda and not machine.cuda:
        if machine.cuda_problem:
            return f"profile '{profile.name}' needs a CUDA device; this machine has an NVIDIA GPU, but {machine.cuda_problem}"
        return f"profile '{profile.name}' needs a CUDA device; this machine has none"
    if not profile.match.cuda and machine.cuda:
        return f"profile '{profile.name}' is for machines without CUDA; this one has {machine.gpu_name}"
    if profile.match.gpu_name_regex and not re.search(profile.match.gpu_name_regex, machine.gpu_name or ""):
        return f"profile '{profile.name}' wants a GPU matching /{profile.match.gpu_name_regex}/; this one is {machine.gpu_name}"
    return native_bf16_missing(profile, machine)


def native_bf16_missing(profile: Profile, machine: Machine) -> str | None:
    """Why a profile with ``engine.requires_native_bf16`` cannot run on this CPU; None when it can."""
    if machine.cuda or machine.native_bf16 or not profile.engine.requires_native_bf16:
        return None
    return (f"profile '{profile.name}' needs a CPU with native bf16 (engine.requires_native_bf16; one of "
            f"{', '.join(NATIVE_BF16_EXTENSIONS)}); this CPU has {describe_isa(machine.cpu_isa)}")


def select_profile(thresholds: Thresholds, requested: str, machine: Machine) -> Profile:
    """`auto`: the first profile whose hardware fits. A named profile must fit too: numbers
    measured on other hardware would be judged against the wrong budget (invalid, exit 3).
    The profile comes back as it runs on this machine (``on_cpu``)."""
    profile = _matching_profile(thresholds, requested, machine)
    return profile if machine.cuda else on_cpu(profile, machine.native_bf16, amx=has_amx(machine.cpu_isa))


def _matching_profile(thresholds: Thresholds, requested: str, machine: Machine) -> Profile:
    if requested != "auto":
        profile = thresholds.profile(requested)
        why = mismatch(profile, machine)
        if why:
            raise InvalidRunError(f"hardware does not match: {why}")
        return profile
    if machine.cuda_problem:  # never measure a GPU machine on a CPU profile without saying so: ask for it by name
        raise InvalidRunError(f"this machine has an NVIDIA GPU that CUDA cannot use: {machine.cuda_problem}",
                              hint="fix CUDA, or pass --profile cpu to measure on the CPU on purpose")
    for profile in thresholds.profiles.values():
        if mismatch(profile, machine) is None:
            return profile
    raise InvalidRunError(f"no hardware profile in {thresholds.path} matches this machine ({machine.describe()})",
                          hint=f"profiles: {', '.join(thresholds.profiles)}")


def not_runnable_here(thresholds: Thresholds, requested: str, machine: Machine) -> str | None:
    """Why no profile of ``thresholds`` can run here although one would fit this machine but for a
    hardware need (native bf16); None when a profile runs here, or none would fit anyway."""
    try:
        select_profile(thresholds, requested, machine)
        return None
    except InvalidRunError:
        pass
    candidates = [thresholds.profiles[requested]] if requested in thresholds.profiles else list(thresholds.profiles.values())
    for profile in candidates:
        why = native_bf16_missing(profile, machine)
        relaxed = dataclasses.replace(profile, engine=dataclasses.replace(profile.engine, requires_native_bf16=False))
        if why and mismatch(relaxed, machine) is None:
            return why
    return None


# ----------------------------------------------------------------------------- as what it runs
def engine_on_cpu(engine: EngineArgs, native_bf16: bool) -> EngineArgs:
    """The engine as it runs on a CPU with or without native bf16."""
    if engine.dtype == "bfloat16" and not native_bf16 and engine.dtype_without_native_bf16:
        return dataclasses.replace(engine, dtype=engine.dtype_without_native_bf16)
    return engine


def on_cpu(profile: Profile, native_bf16: bool, amx: bool = False) -> Profile:
    """The profile as it runs on a CPU with or without native bf16 and AMX: the engine's dtype
    (``engine.dtype_without_native_bf16``) and the census baseline counted with the same kernels
    (``census.baseline_without_native_bf16``, ``census.baseline_with_amx``)."""
    engine = engine_on_cpu(profile.engine, native_bf16)
    census = profile.census
    if census is not None and engine is not profile.engine and census.baseline_without_native_bf16 is not None:
        census = dataclasses.replace(census, baseline=census.baseline_without_native_bf16)
    elif census is not None and amx and engine.dtype in AMX_DTYPES:
        if census.baseline_with_amx is not None:
            census = dataclasses.replace(census, baseline=census.baseline_with_amx)
        else:
            census = dataclasses.replace(census, not_judged=(
                f"this CPU has AMX, where vLLM runs small {engine.dtype} GEMMs on AMX kernels, and "
                f"{census.baseline.name} was counted on a CPU without it (other functions, other calls), and so "
                "were the op scopes' total_ops caps (shown, not judged); give the profile "
                "`census.baseline_with_amx: FILE` and write it from this run"))
    if engine is profile.engine and census is profile.census:
        return profile
    return dataclasses.replace(profile, engine=engine, census=census)


def ran_bf16_fallback(env: Environment) -> bool:
    """The recorded engine ran its ``dtype_without_native_bf16`` in place of bfloat16."""
    return env.engine_args is not None and env.engine_args.bf16_replaced


def engine_ran_bf16_fallback(engine: object) -> bool:
    """The same, of a results file's recorded engine arguments (``profile_config.engine``)."""
    return isinstance(engine, dict) and bf16_replaced(engine)


def as_it_ran(profile: Profile, env: Environment, *, bf16_fallback: bool | None = None) -> Profile:
    """The profile as it ran on the machine a run recorded (its dtype, its census baseline).
    ``bf16_fallback``: whether the engine ran the fallback dtype, where the caller read it from
    elsewhere than ``env`` (a results file's profile_config)."""
    ran_fallback = ran_bf16_fallback(env) if bf16_fallback is None else bf16_fallback
    return on_cpu(profile, native_bf16=not ran_fallback, amx=env.ran_on_amx)


def census_against_bf16(profile: Profile, env: Environment) -> bool:
    """A float32 run's census judged against a bfloat16 baseline (no ``census.baseline_without_native_bf16``)."""
    return ran_bf16_fallback(env) and profile.census is not None and profile.census.baseline_without_native_bf16 is None


def census_of_other_kernels(profile: Profile, ran_as: Profile, *, bf16_fallback: bool) -> str | None:
    """Why the census a run counted cannot go into the profile's baseline for those kernels (AMX
    without ``baseline_with_amx``, float32 without ``baseline_without_native_bf16``): "amx",
    "float32"; None: the run's census has a baseline of its own kernels. ``ran_as``: the profile
    as the run ran it (``as_it_ran``)."""
    if profile.census is None:
        return None
    if ran_as.census.not_judged:
        return "amx"
    if bf16_fallback and ran_as.census.baseline == profile.census.baseline:
        return "float32"
    return None


# ----------------------------------------------------------------------------- TTFT judged here
def ttft_binding_fits(bound: TtftHardware, cpu_name: str, cpu_count: int, cpu_isa: tuple[str, ...] | None) -> bool:
    """``cpu_isa``: the machine's CPU_ISA_EXTENSIONS; None (not recorded) never fits a binding that names them."""
    if bound.cpu_model_regex is not None and not re.search(bound.cpu_model_regex, cpu_name or ""):
        return False
    if bound.cpu_isa is not None and (cpu_isa is None or set(cpu_isa) != set(bound.cpu_isa)):
        return False
    return bound.cpu_count is None or bound.cpu_count[0] <= cpu_count <= bound.cpu_count[1]


def ttft_hardware_problem(profile: Profile, cpu: str, cpu_count: int, isa: tuple[str, ...] | None) -> str | None:
    """Why this CPU is not the one the profile's TTFT budgets were measured on; None: it is (or
    the budgets are not bound to a CPU). Not a reason to reject the run: op counts are judged on
    any machine the profile matches, only the absolute TTFT budgets are not."""
    bound = profile.ttft_hardware
    if bound is None or not profile.ttft_ms or ttft_binding_fits(bound, cpu, cpu_count, isa):
        return None
    # the binding, not provenance.hardware: a hand-edited binding must not be described by stale provenance
    machine = f"{cpu} ({cpu_count} cores, {describe_isa(isa)})" if bound.cpu_isa is not None else f"{cpu} ({cpu_count} cores)"
    return f"budget measured on {bound.describe()}; this machine is {machine}"


def ttft_not_judged(profile: Profile, env: Environment) -> str | None:
    """Why the profile's absolute TTFT budgets are not judged on the recorded machine (their
    ``budgets.ttft_hardware`` is another CPU); None: they are judged."""
    if not profile.ttft_ms or env.cpu is None:
        return None
    return ttft_hardware_problem(profile, env.cpu, env.cpu_count or 0, env.cpu_isa)
