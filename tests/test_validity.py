"""The validity gate: each condition that makes a run untrustworthy gives exit 3 (INVALID) with its
reason, never a regression. Hand-built RunRecords through guard.judge.evaluate.evaluate; GPU state as
recorded dicts and through a fake pynvml (no GPU needed)."""

from __future__ import annotations

import dataclasses
import sys
import types
from pathlib import Path

import pytest

from guard.errors import ExitCode
from guard.judge.evaluate import evaluate
from guard.judge.gates import gpu_state_problems, other_gpu_processes
from guard.judge.sequential import single_run_rule
from guard.measure.hardware import Hardware, fingerprint, read_gpu_state
from guard.model.environment import GpuProcess, GpuSnapshot, GpuState
from guard.model.records import InvalidReason, ReasonKind, RequestOutcome, RunRecord, Verdict
from guard.measure.contention import ContentionSampler
from guard.measure.single_run import GuardRun

THRESHOLDS = Path(__file__).parent / "fixtures" / "thresholds-statistics.yaml"  # pinned, see the file
CPU_HW = Hardware(cuda=False, gpu_name=None, cpu_name="Test CPU", cpu_count=2)
OWN_PID = 1000


def env_for(profile: str, gpu: str | None, gpu_state=None) -> dict:
    return {"hardware_profile": profile, "cuda": gpu is not None, "gpu": gpu, "cpu": "Test CPU", "cpu_count": 2,
            "hardware_match": {"ok": True, "reason": None, "rule": {}}, "gpu_state": gpu_state}


def snap(reasons=("gpu_idle",), processes=(), own=(OWN_PID,)) -> dict:
    """A gpu_state snapshot as results.json records it (read_gpu_state's GpuSnapshot, written)."""
    return {"name": "NVIDIA A10", "driver_version": "550.54.15", "cuda_driver_version": "12.4",
            "clocks_mhz": {"sm": 1695, "sm_max": 1695, "mem": 6251, "mem_max": 6251}, "temperature_c": 60,
            "throttle_mask": 1, "throttle_reasons": list(reasons),
            "processes": [{"pid": pid, "used_memory_mib": mib} for pid, mib in processes], "own_pids": list(own)}


@pytest.fixture
def a10(thresholds):
    return dataclasses.replace(thresholds.profile("a10"), ops=())


def outcomes(n: int, ttft_s: float) -> list[RequestOutcome]:
    return [RequestOutcome(index=i, image_size=(640, 480), warmup=False, success=True, ttft_client_s=ttft_s * (1 + i / 1000))
            for i in range(n)]


def cpu_run(**changes) -> RunRecord:
    base = RunRecord(profile="cpu", thresholds_path=str(THRESHOLDS), model="deepseek-ocr-2",
                     environment=env_for("cpu", None), outcomes=outcomes(15, 7.2), rounds=3)
    return dataclasses.replace(base, **changes)


def a10_run(gpu_state, gpu="NVIDIA A10") -> RunRecord:
    return RunRecord(profile="a10", thresholds_path=str(THRESHOLDS), model="deepseek-ocr-2",
                     environment=env_for("a10", gpu, gpu_state), outcomes=outcomes(100, 2.283), rounds=1)


def assert_invalid(res, fragment: str) -> None:
    assert res.verdict == Verdict.INVALID
    assert res.exit_code == ExitCode.INVALID == 3
    assert any(fragment in r.text for r in res.invalid_reasons), res.invalid_reasons


# ----------------------------------------------------------------------------- baselines
def test_a_clean_cpu_run_is_valid(cpu):
    res = evaluate(cpu, cpu_run())
    assert res.verdict == Verdict.PASS and res.invalid_reasons == [] and res.notices == ()


def test_a_clean_gpu_run_is_valid(a10):
    res = evaluate(a10, a10_run({"start": snap(), "end": snap(processes=[(OWN_PID, 20000)])}))
    assert res.verdict == Verdict.PASS and res.invalid_reasons == []


# ----------------------------------------------------------------------------- requests and engine
def test_errored_request(cpu):
    bad = RequestOutcome(index=15, image_size=(640, 480), warmup=False, success=False, error="RuntimeError: boom")
    assert_invalid(evaluate(cpu, cpu_run(outcomes=outcomes(15, 7.2) + [bad])), "request 15 (640x480) failed: RuntimeError: boom")


def test_timed_out_request(cpu):
    late = RequestOutcome(index=3, image_size=(640, 480), warmup=False, success=False, error="timed out after 600 s")
    assert_invalid(evaluate(cpu, cpu_run(outcomes=outcomes(15, 7.2) + [late])), "timed out after 600 s")


def test_engine_died(cpu):
    res = evaluate(cpu, cpu_run(invalid_reasons=[InvalidReason(ReasonKind.ENGINE, "engine died during round 2: RuntimeError: CUDA error")]))
    assert_invalid(res, "engine died during round 2")


def test_a_run_that_stopped_lists_its_own_reason_not_what_it_therefore_never_measured():
    """The engine never started: no TTFT samples, no op counts and no census follow from that
    one reason and would only bury it (a failed request would still be a reason of its own)."""
    from tests.conftest import SHIPPED_THRESHOLDS
    from guard.config.loading import load_thresholds

    shipped = load_thresholds(SHIPPED_THRESHOLDS).profile("cpu")  # op budgets and a census rule
    died = InvalidReason(ReasonKind.ENGINE, "engine failed to start: no space left on device")
    stopped = cpu_run(outcomes=[], rounds=0, invalid_reasons=[died])
    res = evaluate(shipped, stopped)
    assert res.verdict == Verdict.INVALID and res.invalid_reasons == [died]
    # the same empty run without a reason of its own says everything that is missing
    silent = evaluate(shipped, cpu_run(outcomes=[], rounds=0))
    assert any("no TTFT samples" in r.text for r in silent.invalid_reasons)
    assert any("budgeted but not measured" in r.text for r in silent.invalid_reasons)


def test_too_few_samples(cpu):
    assert_invalid(evaluate(cpu, cpu_run(outcomes=outcomes(3, 7.2), rounds=1)), "too few TTFT samples: 3 of 5")


def test_a_regression_in_an_invalid_run_is_not_reported_as_one(cpu):
    slow = cpu_run(outcomes=outcomes(15, 12.0), invalid_reasons=[InvalidReason(ReasonKind.ENGINE, "engine died during round 3: boom")])
    res = evaluate(cpu, slow)
    assert res.exit_code == 3 and res.verdict == Verdict.INVALID


# ----------------------------------------------------------------------------- hardware re-checked at evaluation
@pytest.mark.parametrize("env_change, fragment", [
    ({"cuda": True, "gpu": "NVIDIA A10"}, "is for machines without CUDA; this one has NVIDIA A10"),
    ({"hardware_profile": "a10"}, "measured under profile 'a10', judged against 'cpu'"),
    ({"hardware_match": {"ok": False, "reason": "profile 'cpu' is for machines without CUDA; this one has X"}},
     "did not match when the run started"),
])
def test_hardware_mismatch_in_the_fingerprint(cpu, env_change, fragment):
    run = cpu_run()
    run.environment.update(env_change)
    assert_invalid(evaluate(cpu, run), fragment)


def test_gpu_name_outside_the_profile_regex(a10):
    # "A10" alone would match an A100: the profile's regex must reject it at evaluation too
    assert_invalid(evaluate(a10, a10_run({"start": snap(), "end": None}, gpu="NVIDIA A100-SXM4-80GB")),
                   "wants a GPU matching")


def test_a_mismatch_is_reported_once(cpu):
    why = "profile 'cpu' is for machines without CUDA; this one has NVIDIA A10"
    run = cpu_run()
    run.environment.update({"cuda": True, "gpu": "NVIDIA A10", "hardware_match": {"ok": False, "reason": why}})
    assert sum(why in r.text for r in evaluate(cpu, run).invalid_reasons) == 1


def test_fingerprint_records_the_match_and_no_gpu_state_on_cpu(cpu, a10, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # no torch import in a unit test
    monkeypatch.setattr("guard.measure.hardware.git_commit", lambda cwd=None: None)
    fp = fingerprint(CPU_HW, cpu).as_dict()
    assert fp["hardware_profile"] == "cpu" and fp["cuda"] is False
    assert fp["hardware_match"]["ok"] is True and "gpu_state" not in fp  # None: not written
    wrong = fingerprint(CPU_HW, a10).as_dict()
    assert wrong["hardware_match"] == {"ok": False, "reason": "profile 'a10' needs a CUDA device; this machine has none",
                                       "rule": {"cuda": True, "gpu_name_regex": r"\bA10G?\b"}}


# ----------------------------------------------------------------------------- GPU state
def test_another_process_on_the_gpu(a10):
    state = {"start": snap(processes=[(4242, 2048)]), "end": snap(processes=[(OWN_PID, 20000)])}
    assert_invalid(evaluate(a10, a10_run(state)), "another process was using the GPU at the start of the run: pid 4242 (2048 MiB)")


def test_thermal_throttling(a10):
    state = {"start": snap(), "end": snap(reasons=["sw_thermal_slowdown", "hw_thermal_slowdown"])}
    assert_invalid(evaluate(a10, a10_run(state)),
                   "GPU clocks were throttled at the end of the run: sw_thermal_slowdown, hw_thermal_slowdown")


@pytest.mark.parametrize("reasons", [["gpu_idle"], ["applications_clocks_setting"], ["display_clock_setting", "sync_boost"], []])
def test_settings_are_not_throttling(reasons):
    assert gpu_state_problems(GpuState.from_dict({"start": snap(reasons=reasons), "end": snap(reasons=reasons)})) == []


def test_power_cap_is_throttling():
    assert gpu_state_problems(GpuState.from_dict({"start": None, "end": snap(reasons=["sw_power_cap"])})) == [
        "GPU clocks were throttled at the end of the run: sw_power_cap (SM clock 1695 of 1695 MHz)"]


def test_own_processes_are_not_others():
    assert gpu_state_problems(GpuState.from_dict({"start": snap(processes=[(OWN_PID, 10), (OWN_PID + 1, 10)], own=(OWN_PID, OWN_PID + 1)),
                               "end": None})) == []


def test_in_a_container_the_largest_unknown_pid_at_the_end_is_this_run():
    # NVML reports host PIDs inside a PID namespace: our own process shows up under a foreign pid
    end = GpuSnapshot.from_dict(snap(processes=[(87654, 20000)]))
    assert other_gpu_processes(end, holding_device=True) == []
    assert other_gpu_processes(end, holding_device=False) == [GpuProcess(87654, 20000)]
    two = GpuSnapshot.from_dict(snap(processes=[(87654, 20000), (99999, 512)]))
    assert other_gpu_processes(two, holding_device=True) == [GpuProcess(99999, 512)]


def test_no_gpu_state_on_a_gpu_profile_is_a_notice_not_invalid(a10):
    res = evaluate(a10, a10_run(None))
    assert res.verdict == Verdict.PASS
    assert any("nvidia-ml-py" in n for n in res.notices)


def test_read_gpu_state_without_pynvml_is_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert read_gpu_state() is None


class NVMLError(Exception):
    pass


def fake_pynvml(*, init_fails=False, mask=0x21):
    """The slice of pynvml that read_gpu_state uses, answering like an A10 with one stranger."""
    m = types.ModuleType("pynvml")
    m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM, m.NVML_TEMPERATURE_GPU = 1, 2, 0
    m.calls = []

    def init():
        if init_fails:
            raise NVMLError("Driver Not Loaded")

    def by_uuid(uuid):
        m.calls.append(("uuid", uuid))
        return "h"

    def by_index(i):
        m.calls.append(("index", i))
        return "h"

    def unsupported(*args):
        raise NVMLError("Not Supported")

    m.nvmlInit, m.nvmlShutdown = init, lambda: None
    m.nvmlDeviceGetHandleByUUID, m.nvmlDeviceGetHandleByIndex = by_uuid, by_index
    m.nvmlDeviceGetName = lambda h: b"NVIDIA A10"
    m.nvmlSystemGetDriverVersion = lambda: "550.54.15"
    m.nvmlSystemGetCudaDriverVersion = lambda: 12040
    m.nvmlDeviceGetClockInfo = lambda h, kind: {1: 1410, 2: 6251}[kind]
    m.nvmlDeviceGetMaxClockInfo = lambda h, kind: {1: 1695, 2: 6251}[kind]
    m.nvmlDeviceGetTemperature = unsupported  # one refused field must not lose the others
    m.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: mask  # older pynvml: no ...EventReasons
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: [types.SimpleNamespace(pid=OWN_PID, usedGpuMemory=20000 * 2**20),
                                                        types.SimpleNamespace(pid=777, usedGpuMemory=None)]
    return m


def test_read_gpu_state_through_nvml(monkeypatch):
    nvml = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1234abcd,GPU-5678")
    state = read_gpu_state(own_pids=frozenset({OWN_PID}))
    assert nvml.calls == [("uuid", "GPU-1234abcd")]  # torch's cuda:0 is the first visible device
    assert state.name == "NVIDIA A10" and state.driver_version == "550.54.15"
    assert state.cuda_driver_version == "12.4"
    assert state.clocks_mhz == {"sm": 1410, "sm_max": 1695, "mem": 6251, "mem_max": 6251}
    assert state.temperature_c is None
    assert state.throttle_reasons == ("gpu_idle", "sw_thermal_slowdown")
    assert state.processes == (GpuProcess(OWN_PID, 20000), GpuProcess(777, None))
    assert GpuSnapshot.from_dict(state.as_dict()) == state  # as results.json writes and reads it back
    assert gpu_state_problems(GpuState(start=state)) == [
        "another process was using the GPU at the start of the run: pid 777",
        "GPU clocks were throttled at the start of the run: sw_thermal_slowdown (SM clock 1410 of 1695 MHz)",
    ]


def test_read_gpu_state_never_maps_the_device_by_index(monkeypatch):
    """NVML's index order is PCI order; CUDA's is not (CUDA_DEVICE_ORDER=FASTEST_FIRST). Without a UUID
    or PCI bus id for torch's device there is no snapshot, rather than another GPU's state."""
    nvml = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert read_gpu_state(identity={"uuid": None, "pci_bus_id": None}) is None
    assert nvml.calls == []
    assert read_gpu_state(identity={"uuid": "abcd-ef", "pci_bus_id": None}).device == "uuid GPU-abcd-ef"
    assert nvml.calls == [("uuid", "GPU-abcd-ef")]


def test_read_gpu_state_when_nvml_cannot_start_is_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_fails=True))
    assert read_gpu_state() is None


def test_run_stage_samples_gpu_state_at_the_end_of_timing(thresholds, a10, monkeypatch, tmp_path):
    start = snap()
    monkeypatch.setattr("guard.measure.single_run.fingerprint", lambda hw, profile: env_for("a10", "NVIDIA A10", {"start": start, "end": None}))
    monkeypatch.setattr("guard.measure.hardware.read_gpu_state", lambda: GpuSnapshot.from_dict(snap(reasons=["hw_slowdown"])))

    from tests.test_runner import ScriptedSide

    side = ScriptedSide(a10, [o.ttft_client_s for o in outcomes(400, 2.283)])
    run = GuardRun(thresholds, a10, Hardware(cuda=True, gpu_name="NVIDIA A10", cpu_name="x", cpu_count=2), tmp_path,
                   progress=lambda m: None, side=side, contention=ContentionSampler(proc=tmp_path / "no-proc"),
                   rule=single_run_rule(a10))
    run.time_until_decided()
    state = run.record.environment.gpu_state
    assert state.start == GpuSnapshot.from_dict(start) and state.end.throttle_reasons == ("hw_slowdown",)
    assert_invalid(evaluate(a10, run.finish()), "throttled at the end of the run: hw_slowdown")


# ----------------------------------------------------------------------------- CPU contention, hardware-bound TTFT
from guard.config.budgets import TtftHardware, Validity  # noqa: E402
from guard.measure.contention import ContentionReading  # noqa: E402
from guard.report.markdown import render_markdown  # noqa: E402
from guard.model.records import Status  # noqa: E402
from guard.report.terminal import render_terminal  # noqa: E402

BOUND_HERE = TtftHardware(cpu_model_regex="^Test CPU$", cpu_count=(2, 2))
BOUND_ELSEWHERE = TtftHardware(cpu_model_regex="^AMD EPYC$", cpu_count=(2, 2))


def busy(other: float, steal: float = 0.0) -> dict:
    return ContentionReading(window_s=40.0, cpus=2, other_cores=other, steal_cores=steal, own_cores=1.9).as_dict()


def contended_run(other: float, **changes) -> RunRecord:
    return cpu_run(environment={**env_for("cpu", None), "cpu_contention": busy(other)}, **changes)


def test_a_busy_machine_makes_the_absolute_run_invalid_not_a_regression(cpu):
    profile = dataclasses.replace(cpu, ttft_ms={"p50": 6000}, ttft_hardware=BOUND_HERE)  # 7.2 s: would fail
    res = evaluate(profile, contended_run(1.7))
    assert_invalid(res, "other processes used 1.70 of 2 cores during measurement")
    assert any("validity.max_other_cpu_pct" in r.text for r in res.invalid_reasons)


def test_a_quiet_machine_passes_the_gate(cpu):
    res = evaluate(dataclasses.replace(cpu, ttft_hardware=BOUND_HERE), contended_run(0.1))
    assert res.verdict == Verdict.PASS and res.invalid_reasons == []


def test_the_limit_is_the_profiles(cpu):
    loose = dataclasses.replace(cpu, validity=Validity(max_other_cpu_pct=90))
    assert evaluate(loose, contended_run(1.7)).verdict == Verdict.PASS


def test_ttft_bound_to_another_cpu_is_shown_not_judged(cpu, tmp_path):
    profile = dataclasses.replace(cpu, ttft_ms={"p50": 6000}, ttft_hardware=BOUND_ELSEWHERE,
                                  provenance={"hardware": "AMD EPYC (2 cores)"})
    res = evaluate(profile, cpu_run(), output=tmp_path)
    assert res.verdict == Verdict.PASS and res.exit_code == 0  # 7.2 s > 6 s, but not judged here
    (c,) = res.ttft_checks
    assert c.status == Status.NOT_JUDGED and c.measured_ms == pytest.approx(7250.4)
    assert c.note == ("not judged: budget measured on a CPU matching /^AMD EPYC$/ with 2 cores; "
                      "this machine is Test CPU (2 cores)")
    (notice,) = res.notices
    assert "guard update-thresholds --from" in notice and "A/B" in notice
    term = render_terminal(res)
    assert "not judged: budget measured on a CPU matching /^AMD EPYC$/" in term
    assert term.splitlines()[-1].endswith("all 0 budgets held")  # the profile's ops were cut: nothing judged
    md = render_markdown(res)
    assert "not judged" in md and "AMD EPYC" in md


def test_reports_show_the_contention_reading(cpu):
    res = evaluate(cpu, contended_run(0.05))
    line = "other processes used 0.05 of 2 cores during measurement (40 s; guard's engine used 1.90)"
    assert f"machine: {line}" in render_terminal(res)
    assert f"Machine during measurement: {line}." in render_markdown(res)


def test_reports_show_the_speed_reference_against_the_budgets(cpu):
    reading = {"workload": "speedref-1", "spread_pct": 2.0, "repeats": 5, "threads": 2}
    speed = {"workload": "speedref-1", "ms": 98.4, "before": {**reading, "ms": 97.0}, "after": {**reading, "ms": 99.8}}
    profile = dataclasses.replace(cpu, ttft_ms={"p50": 6000},
                                  ttft_hardware=dataclasses.replace(BOUND_HERE, speed_reference_ms=80.0))
    res = evaluate(profile, cpu_run(environment={**env_for("cpu", None), "speed_reference": speed}))
    assert res.verdict == Verdict.INVALID  # 7.25 s over 6 s, explained by +23 % (lower end / 1.23 < 6 s)
    line = ("guard's speed reference 98 ms (before and after the measured requests: 97, 100); "
            "the budget's machine: 80 ms, this one +23.0 %")
    assert f"machine speed: {line}" in render_terminal(res)
    assert f"Machine speed: {line}." in render_markdown(res)
    assert res.profile_config["speed_reference_ms"] == 80.0 and res.profile_config["validity"]["max_slowdown_pct"] == 10.0
    elsewhere = dataclasses.replace(profile, ttft_hardware=dataclasses.replace(BOUND_ELSEWHERE, speed_reference_ms=80.0))
    res = evaluate(elsewhere, cpu_run(environment={**env_for("cpu", None), "speed_reference": speed}))
    assert res.verdict == Verdict.PASS and res.invalid_reasons == []  # not judged here: nothing to excuse


def test_contention_does_not_invalidate_ttft_that_is_not_judged(cpu):
    profile = dataclasses.replace(cpu, ttft_hardware=BOUND_ELSEWHERE)
    res = evaluate(profile, contended_run(1.7))
    assert res.verdict == Verdict.PASS and res.invalid_reasons == []


def test_an_unbound_budget_is_judged_on_any_cpu(cpu):
    res = evaluate(dataclasses.replace(cpu, ttft_ms={"p50": 6000}, ttft_hardware=None), cpu_run())
    assert res.verdict == Verdict.REGRESSION
