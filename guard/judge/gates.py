"""The validity gates: whether a run's recorded readings let its TTFT be judged at all. Pure.

Each reads a typed reading the run stage stored on the record (``RunRecord.environment``: the
CPU contention, the speed reference, the GPU state, the machine) against the profile's
``validity`` limits, and says why not in words; guard.judge.evaluate turns those into invalid
reasons and notices. The readings are taken by guard.measure.contention, guard.measure.speedref
and guard.measure.hardware; what the numbers behind each limit are is documented there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from guard.config.budgets import Profile
from guard.measure.hardware import Hardware
from guard.measure.fit import mismatch
from guard.model.environment import Environment, GpuProcess, GpuSnapshot, GpuState, SpeedReference
from guard.model.records import Status
from guard.model.checks import LatencyCheck


# ----------------------------------------------------------------------------- the machine's speed
def explained_by(check: LatencyCheck, slowdown: float) -> float:
    """The failed check's lowest plausible value (its interval's lower end, else its estimate) with
    the machine's slowdown taken out, ms: at or below the budget, the slowdown explains the failure."""
    low = check.interval_ms[0]
    low = low if math.isfinite(low) else check.measured_ms
    return low / (1.0 + slowdown / 100.0)


def unsteady(speed: SpeedReference | None, max_slowdown_pct: float) -> str | None:
    """Why the run is no basis for a TTFT budget: the machine changed speed while it measured. Its
    readings before and after the requests differ by more than twice ``max_slowdown_pct``, so their
    mean, the reference a budget written from the run would carry, is off from the machine's speed at
    one end or the other by more than the drift the gate forgives, and the TTFT samples mix two
    speeds. A budget written from such a run carries the change and fails a clean checkout on the
    same machine (exit 1; the run that showed it: docs/reliability.md, "The machine's speed")."""
    pct = speed.change_pct() if speed is not None else None
    if pct is None or abs(pct) <= 2 * max_slowdown_pct:
        return None
    before_ms, after_ms = speed.readings_ms()
    return (f"the machine changed speed while it measured: guard's speed reference took "
            f"{before_ms:.0f} ms before the measured requests and {after_ms:.0f} ms "
            f"after ({'slower' if pct > 0 else 'faster'} by {abs(pct):.0f} %, more than twice validity.max_slowdown_pct "
            f"{max_slowdown_pct:g}); its TTFT mixes two speeds, so it is no basis for a TTFT budget")


def speed_problems(speed: SpeedReference | None, reference_ms: float | None, max_slowdown_pct: float,
                   checks: Sequence[LatencyCheck]) -> list[str]:
    """Why the run's TTFT failures say nothing about the code: the machine ran the reference more
    than ``max_slowdown_pct`` slower than the budget's, and that slowdown explains every failure
    (each failed percentile's interval, slowdown taken out, reaches its budget). A failure beyond
    what the slowdown explains stands; passes stand; within the limit is the machine's own drift
    (the reading moves with TTFT's phases, ~4-6 % here) and changes nothing."""
    failed = [c for c in checks if c.status == Status.FAIL]
    pct = speed.slowdown_pct(reference_ms) if speed is not None else None
    took = f"{speed.ms:.0f} ms" if speed is not None else ""
    if pct is not None and unsteady(speed, max_slowdown_pct):
        # The machine changed speed during the requests: those after the change ran at the slower
        # reading's speed, which the mean dilutes: a quota set mid-run reads as a few % slow on the
        # mean while TTFT is far over budget, which would be exit 1 for the machine's fault
        # (measured: docs/reliability.md, "The machine's speed").
        before_ms, after_ms = speed.readings_ms()
        slowest = max(before_ms, after_ms)
        pct = (slowest / reference_ms - 1.0) * 100.0
        took = (f"{slowest:.0f} ms at the slower of its readings ({before_ms:.0f} before the measured "
                f"requests, {after_ms:.0f} after)")
    if not failed or pct is None or pct <= max_slowdown_pct:
        return []
    if any(explained_by(c, pct) > c.budget_ms for c in failed):
        return []
    worst = max(failed, key=lambda c: c.measured_ms / c.budget_ms)
    return [f"slow machine: guard's speed reference took {took}, {pct:+.1f} % against the "
            f"{reference_ms:.0f} ms measured with the TTFT budget (validity.max_slowdown_pct {max_slowdown_pct:g}), "
            f"and that explains the latency over budget ({worst.label} {worst.measured_ms:.0f} ms against "
            f"{worst.budget_ms:.0f} ms; {explained_by(worst, pct):.0f} ms with the slowdown taken out). Something "
            "/proc does not show (a VM's host, a CPU quota, power saving) slows this machine, so its latency is not "
            "judged: re-run when it is back to speed, or compare against a baseline (A/B)"]


def speed_notice(speed: SpeedReference | None, reference_ms: float | None, max_slowdown_pct: float) -> str | None:
    """A machine clearly faster than the budget's (twice the limit): the budget's headroom grows by that much."""
    pct = speed.slowdown_pct(reference_ms) if speed is not None else None
    if pct is None or pct >= -2 * max_slowdown_pct:
        return None
    return (f"fast machine: guard's speed reference took {speed.ms:.0f} ms, {pct:+.1f} % against the "
            f"{reference_ms:.0f} ms measured with the TTFT budget: a TTFT regression up to that much more "
            "fits in the budget here; re-baseline on this machine with update-thresholds for a tighter one")


# ----------------------------------------------------------------------------- the machine
def recorded_hardware_problems(profile: Profile, env: Environment) -> list[str]:
    """Re-check, at evaluation, that the recorded machine is the profile's: a run.json carried to
    another profile, or a profile edited since the run, must not be judged against its budgets."""
    out = []
    measured_as = env.hardware_profile
    if measured_as is not None and measured_as != profile.name:
        out.append(f"hardware does not match: measured under profile '{measured_as}', judged against '{profile.name}'")
    match = env.hardware_match
    if match is not None and not match.ok:
        out.append(f"hardware did not match when the run started: {match.reason}")
    if env.gpu is not None or env.cuda is not None:
        hw = Hardware(cuda=bool(env.gpu) if env.cuda is None else env.cuda, gpu_name=env.gpu,
                      cpu_name=env.cpu or "unknown CPU", cpu_count=env.cpu_count or 0)
        why = mismatch(profile, hw)
        if why and not (match is not None and match.reason == why):  # said once is enough
            out.append(f"hardware does not match: recorded {hw.describe()}: {why}")
    return out


# ----------------------------------------------------------------------------- the GPU's state
BENIGN_THROTTLE_REASONS = frozenset({"gpu_idle", "applications_clocks_setting", "display_clock_setting", "sync_boost"})


def other_gpu_processes(snapshot: GpuSnapshot, holding_device: bool) -> list[GpuProcess]:
    """Processes on the device that are not this run. ``holding_device``: the engine had the device
    when the snapshot was taken, so this process must be listed; if none of the listed pids is
    ours, NVML is reporting another PID namespace (a container) and one entry, the largest, is us."""
    others = [p for p in snapshot.processes if p.pid not in snapshot.own_pids]
    if holding_device and others and len(others) == len(snapshot.processes):
        others.sort(key=lambda p: p.used_memory_mib or 0)
        others = others[:-1]
    return others


def gpu_state_problems(gpu_state: GpuState | None) -> list[str]:
    """Why the recorded GPU state makes the timing untrustworthy; empty: nothing seen (or nothing recorded)."""
    if gpu_state is None:
        return []
    out: list[str] = []
    during = gpu_state.during or ()
    seen_during: set[str] = set()  # one line per kind of problem for the samples under load
    samples = [("at the start of the run", gpu_state.start, False, None)]
    samples += [(f"during the measured requests (sample {i + 1} of {len(during)})", snap, True, "during")
                for i, snap in enumerate(during)]
    samples.append(("at the end of the run", gpu_state.end, True, None))
    for when, snap, holding, group in samples:
        if snap is None:
            continue
        others = other_gpu_processes(snap, holding_device=holding)
        if others and not (group and "procs" in seen_during):
            who = ", ".join(f"pid {p.pid}" + (f" ({p.used_memory_mib} MiB)" if p.used_memory_mib else "")
                            for p in others)
            out.append(f"another process was using the GPU {when}: {who}")
            if group:
                seen_during.add("procs")
        slow = [r for r in (snap.throttle_reasons or ()) if r not in BENIGN_THROTTLE_REASONS]
        if slow and not (group and "slow" in seen_during):
            clocks = snap.clocks_mhz
            at = f" (SM clock {clocks['sm']} of {clocks['sm_max']} MHz)" if clocks.get("sm") and clocks.get("sm_max") else ""
            out.append(f"GPU clocks were throttled {when}: {', '.join(slow)}{at}")
            if group:
                seen_during.add("slow")
    return out
