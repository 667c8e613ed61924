"""The GPU side without a GPU (issue #11, section 6): recorded driver files and torch messages for
"an NVIDIA GPU is there but CUDA cannot use it", recorded NVML replies (one NVML per version
quirk) for the per-field snapshot, the device mapping by UUID / PCI bus id, sampling under load,
and which thread a CUDA sync came from."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from guard import compat
from guard.judge import gates
from guard.measure import fit, hardware
from guard.config.loading import load_thresholds
from guard.errors import InvalidRunError
from guard.model.environment import GpuProcess, GpuState
from tests.conftest import SHIPPED_THRESHOLDS

NV = Path(__file__).parent / "fixtures" / "nvidia"
TOO_OLD = ("CUDA initialization: The NVIDIA driver on your system is too old (found version 12040). Please update "
           "your GPU driver by downloading and installing a new version from the URL: "
           "http://www.nvidia.com/Download/index.aspx")


@pytest.mark.parametrize("fixture, version", [
    ("proc-driver-version-550.txt", "550.54.15"),
    ("proc-driver-version-535.txt", "535.183.01"),
    ("proc-driver-version-580-open.txt", "580.65.06"),
])
def test_driver_version_from_the_kernel_module_file(fixture, version):
    assert hardware.driver_version_from_proc((NV / fixture).read_text()) == version


@pytest.mark.parametrize("kw, expected", [
    # torch 2.13 from PyPI is built for CUDA 13.0: an R550 driver is too old, and guard says so
    (dict(device_nodes=True, torch_cuda="13.0", driver_version="550.54.15", torch_message=TOO_OLD,
          torch_version="2.13.0"),
     "the NVIDIA driver is 550.54.15, but torch 2.13.0 is built for CUDA 13.0, which needs driver 580.65 or newer (R580+)"),
    (dict(device_nodes=True, torch_cuda="12.8", driver_version="535.183.01"), "needs driver 570.26 or newer"),
    (dict(device_nodes=True, torch_cuda="12.7", driver_version="550.54.15"), "needs driver 560.28"),  # nearest older
    (dict(device_nodes=True, torch_cuda=None, driver_version="580.65.06", torch_version="2.13.0+cpu"),
     "torch 2.13.0+cpu is a CPU-only build"),
    (dict(device_nodes=True, torch_cuda="13.0", driver_version=None), "no NVIDIA kernel driver is loaded"),
    (dict(device_nodes=True, torch_cuda="13.0", driver_version="580.65.06", torch_message="CUDA error: busy"),
     "CUDA failed to initialise with driver 580.65.06 and this torch built for CUDA 13.0: CUDA error: busy"),
    (dict(device_nodes=False, torch_cuda="13.0", driver_version=None), None),  # no GPU at all: nothing to explain
])
def test_cuda_unusable_reason(kw, expected):
    got = hardware.cuda_unusable_reason(**kw)
    assert got == expected if expected is None else expected in got


def test_a_gpu_profile_names_the_cause_and_auto_refuses_to_fall_back_to_cpu():
    t = load_thresholds(SHIPPED_THRESHOLDS)
    why = hardware.cuda_unusable_reason(device_nodes=True, torch_cuda="13.0", driver_version="550.54.15",
                                        torch_version="2.13.0")
    hw = hardware.Hardware(cuda=False, gpu_name=None, cpu_name="EPYC", cpu_count=16, cuda_problem=why)
    assert "550.54.15" in fit.mismatch(t.profile("a10"), hw)
    with pytest.raises(InvalidRunError) as exc:
        fit.select_profile(t, "a10", hw)
    assert "needs driver 580.65" in str(exc.value)
    with pytest.raises(InvalidRunError) as exc:
        fit.select_profile(t, "auto", hw)  # never silently the cpu profile on a GPU machine
    assert "--profile cpu" in str(exc.value)
    assert fit.select_profile(t, "cpu", hw).name == "cpu"  # on purpose: allowed
    assert "CUDA cannot use" in hw.describe()


# ----------------------------------------------------------------------------- NVML
class RecordedNvml(types.SimpleNamespace):
    """An NVML module replaying recorded replies; ``missing`` names functions this version lacks."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self, *, missing=(), refuse=(), devices=None):
        super().__init__()
        self.devices = devices or {"GPU-1111": "h-a10", "GPU-2222": "h-other"}
        self.buses = {"00000000:65:00.0": "h-a10", "00000000:17:00.0": "h-other"}
        funcs = {
            "nvmlInit": lambda: None, "nvmlShutdown": lambda: None,
            "nvmlDeviceGetHandleByUUID": lambda u: self.devices[u],
            "nvmlDeviceGetHandleByPciBusId": lambda b: self.buses[b],
            "nvmlDeviceGetHandleByIndex": lambda i: list(self.devices.values())[i],
            "nvmlSystemGetCudaDriverVersion_v2": lambda: 13000,
            "nvmlDeviceGetCurrentClocksEventReasons": lambda h: 0x4 if h == "h-a10" else 0,
            "nvmlDeviceGetCurrentClocksThrottleReasons": lambda h: 0x4 if h == "h-a10" else 0,
            "nvmlDeviceGetComputeRunningProcesses": lambda h: [types.SimpleNamespace(pid=4242, usedGpuMemory=2**31)],
            "nvmlDeviceGetName": lambda h: b"NVIDIA A10G" if h == "h-a10" else b"other",
            "nvmlSystemGetDriverVersion": lambda: "580.65.06",
            "nvmlDeviceGetClockInfo": lambda h, c: 1200, "nvmlDeviceGetMaxClockInfo": lambda h, c: 1710,
            "nvmlDeviceGetTemperature": lambda h, s: 61,
        }
        for name, fn in funcs.items():
            if name in missing:
                continue
            if name in refuse:
                def fn(*a, _n=name):
                    raise RuntimeError(f"NVMLError_NotSupported: {_n}")
            setattr(self, name, fn)


def test_a_snapshot_of_the_device_found_by_uuid():
    snap = hardware.read_gpu_state(frozenset({1}), nvml=RecordedNvml(), identity={"uuid": "1111", "pci_bus_id": None})
    assert snap.device == "uuid GPU-1111" and snap.name == "NVIDIA A10G"
    assert snap.throttle_reasons == ("sw_power_cap",) and snap.cuda_driver_version == "13.0"
    assert snap.processes == (GpuProcess(4242, 2048),) and snap.unavailable == ()


def test_the_device_is_found_by_pci_bus_id_when_there_is_no_uuid():
    snap = hardware.read_gpu_state(nvml=RecordedNvml(), identity={"uuid": None, "pci_bus_id": "0000:65:00.0"})
    assert snap.device == "pci 00000000:65:00.0" and snap.name == "NVIDIA A10G"


def test_never_by_index():
    """NVML's index 0 is "h-a10" here, but torch's device cannot be identified: no snapshot rather
    than the state of a device that may be another GPU."""
    assert hardware.read_gpu_state(nvml=RecordedNvml(), identity={"uuid": None, "pci_bus_id": None}) is None


@pytest.mark.parametrize("missing, refuse, field, value", [
    (("nvmlDeviceGetCurrentClocksEventReasons",), (), "throttle_reasons", ("sw_power_cap",)),  # older NVML: old name
    (("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"), (), "throttle_reasons", None),
    (("nvmlSystemGetCudaDriverVersion_v2",), (), "cuda_driver_version", None),
    ((), ("nvmlDeviceGetComputeRunningProcesses",), "processes", ()),
    ((), ("nvmlDeviceGetTemperature",), "temperature_c", None),
    (("nvmlDeviceGetName",), (), "name", None),
])
def test_a_missing_or_refused_nvml_field_loses_only_that_field(missing, refuse, field, value):
    snap = hardware.read_gpu_state(nvml=RecordedNvml(missing=missing, refuse=refuse),
                                   identity={"uuid": "GPU-1111", "pci_bus_id": None})
    assert snap is not None and getattr(snap, field) == value
    assert snap.clocks_mhz["sm"] == 1200  # the rest of the snapshot is still there
    assert set(snap.unavailable) <= set(missing)


def test_sampling_during_the_requests_catches_throttling_only_under_load():
    idle = {"throttle_reasons": ["gpu_idle"], "processes": [], "own_pids": [1]}
    loaded = {"throttle_reasons": ["sw_thermal_slowdown"], "processes": [], "own_pids": [1],
              "clocks_mhz": {"sm": 900, "sm_max": 1710}}
    problems = gates.gpu_state_problems(GpuState.from_dict({"start": idle, "during": [idle, loaded, loaded], "end": idle}))
    assert problems == ["GPU clocks were throttled during the measured requests (sample 2 of 3): "
                        "sw_thermal_slowdown (SM clock 900 of 1710 MHz)"]  # once, not once per sample
    assert gates.gpu_state_problems(GpuState.from_dict({"start": idle, "end": idle})) == []


def test_the_sampler_thread_collects_snapshots_and_stops():
    import itertools
    import time

    counter = itertools.count()
    with hardware.GpuStateSampler(interval_s=0.01, read=lambda: {"n": next(counter)}) as sampler:
        time.sleep(0.2)
    n = len(sampler.snapshots)
    time.sleep(0.05)
    assert n >= 3 and len(sampler.snapshots) == n  # stopped with the block


# ----------------------------------------------------------------------------- CUDA syncs from other threads
class Ev(types.SimpleNamespace):
    pass


def test_a_cuda_sync_inherits_a_stack_only_from_its_own_thread():
    scope_frame = "vllm/model_executor/models/deepencoder2.py(100): _update_causal_mask"
    op = Ev(name="aten::nonzero", stack=[scope_frame], cpu_parent=None, thread=1, device_type="CPU", kernels=[])
    same = Ev(name="cudaStreamSynchronize", stack=[], cpu_parent=op, thread=1, device_type="CPU", kernels=[])
    other = Ev(name="cudaDeviceSynchronize", stack=[], cpu_parent=op, thread=7, device_type="CPU", kernels=[])
    prof = types.SimpleNamespace(events=lambda: [op, same, other])
    got = {name: stack for name, stack, _, _ in compat.function_events(prof)}
    assert got["cudaStreamSynchronize"] == (scope_frame,)
    assert got["cudaDeviceSynchronize"] == ()  # never attributed to the scope running on thread 1


def test_cuda_device_identity_without_cuda():
    assert compat.cuda_device_identity(0) == {"uuid": None, "pci_bus_id": None}


def test_a_recorded_gpu_state_reads_back_typed_and_writes_back_as_it_was():
    from guard.model.environment import Environment

    snapshot = hardware.read_gpu_state(frozenset({1}), nvml=RecordedNvml(), identity={"uuid": "1111", "pci_bus_id": None})
    written = {"start": {**snapshot.as_dict(), "fan_pct": 40},  # a key a newer guard wrote: kept
               "end": None, "during": [snapshot.as_dict()]}
    env = Environment.from_dict({"gpu_state": written})
    assert env.gpu_state.start.processes == (GpuProcess(4242, 2048),) and env.gpu_state.start.other == {"fan_pct": 40}
    assert env.gpu_state.during == (snapshot,) and env.gpu_state.end is None
    assert env.as_dict()["gpu_state"] == written
    older = {"start": snapshot.as_dict(), "end": snapshot.as_dict()}  # written before sampling during the requests
    assert Environment.from_dict({"gpu_state": older}).as_dict()["gpu_state"] == older
