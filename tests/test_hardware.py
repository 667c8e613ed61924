"""guard.measure.hardware's TTFT binding: which CPU a budget belongs to, written and read back."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from guard.config.budgets import TtftHardware
from guard.measure.fit import ttft_hardware_problem
from guard.config.loading import load_thresholds
from guard.model.environment import Environment
from guard.measure.hardware import Hardware, cpu_features, cpu_isa, fingerprint, ttft_hardware_for
from guard.measure.fit import select_profile
from tests.conftest import SHIPPED_THRESHOLDS

FIXTURES = Path(__file__).parent / "fixtures" / "cpuinfo"
# Recorded on this project's machines: the EPYC the cpu budget was measured on, and the AVX2-only
# EPYC that the VM names the same ("AMD EPYC", 2 cores) but whose bf16 engine is 13x slower.
GENOA = FIXTURES / "amd-epyc-family25-model17-avx512-bf16"
MILAN = FIXTURES / "amd-epyc-family25-model1-avx2"
BUDGET_ISA = ("avx2", "avx512f", "avx512_bf16")

NAMES = ["AMD EPYC", "Intel(R) Xeon(R) CPU @ 2.20GHz", "12th Gen Intel(R) Core(TM) i7-1260P",
         "AMD Ryzen 9 7950X 16-Core Processor", r"odd [name] {x} a|b \ c + d * e ? f ^ g $ h"]


@pytest.mark.parametrize("name", NAMES)
def test_binding_matches_exactly_the_recorded_cpu(name):
    b = ttft_hardware_for(Environment.from_dict({"cpu": name, "cpu_count": 4, "gpu": None, "cuda": False}))
    assert b["cpu_count"] == 4 and b["cpu_model_regex"].startswith("^") and b["cpu_model_regex"].endswith("$")
    assert re.search(b["cpu_model_regex"], name)
    assert not re.search(b["cpu_model_regex"], name + " v2") and not re.search(b["cpu_model_regex"], "x" + name)
    if "\\" not in name:
        assert "\\ " not in b["cpu_model_regex"]  # spaces are not escaped: the YAML stays readable


def test_no_binding_on_a_gpu_or_without_a_recorded_cpu():
    assert ttft_hardware_for(Environment.from_dict({"cpu": "AMD EPYC", "cpu_count": 2, "gpu": "NVIDIA A10", "cuda": True})) is None
    assert ttft_hardware_for(Environment.from_dict({"cpu_count": 2})) is None


def test_shipped_cpu_profile_judges_ttft_only_on_its_cpu():
    cpu = load_thresholds(SHIPPED_THRESHOLDS).profile("cpu")
    assert ttft_hardware_problem(cpu, "AMD EPYC", 2, BUDGET_ISA) is None
    why = ttft_hardware_problem(cpu, "Intel(R) Core(TM) i7-1165G7 @ 2.80GHz", 8, ("avx2",))
    assert why == ("budget measured on a CPU matching /^AMD EPYC$/ with 2 cores and ISA avx2+avx512f+avx512_bf16; "
                   "this machine is Intel(R) Core(TM) i7-1165G7 @ 2.80GHz (8 cores, ISA avx2)")
    assert ttft_hardware_problem(cpu, "AMD EPYC", 4, BUDGET_ISA) is not None  # core count is part of the binding
    # the same name and core count with other CPU extensions: another machine (13x slower, measured)
    assert "this machine is AMD EPYC (2 cores, ISA avx2)" in ttft_hardware_problem(cpu, "AMD EPYC", 2, ("avx2",))
    assert ttft_hardware_problem(cpu, "AMD EPYC", 2, (*BUDGET_ISA, "amx_bf16")) is not None  # a faster one too
    assert "CPU extensions not recorded" in ttft_hardware_problem(cpu, "AMD EPYC", 2, None)
    unbound = dataclasses.replace(cpu, ttft_hardware=None)
    assert ttft_hardware_problem(unbound, "anything", 64, None) is None
    no_ttft = dataclasses.replace(cpu, ttft_ms={}, ttft_hardware=TtftHardware(cpu_model_regex="^nothing$"))
    assert ttft_hardware_problem(no_ttft, "AMD EPYC", 2, BUDGET_ISA) is None
    any_isa = dataclasses.replace(cpu, ttft_hardware=TtftHardware(cpu_model_regex="^AMD EPYC$", cpu_count=(2, 2)))
    assert ttft_hardware_problem(any_isa, "AMD EPYC", 2, None) is None  # a binding without cpu_isa ignores it


def test_cpu_extensions_read_from_recorded_cpuinfo():
    genoa, milan = cpu_features(GENOA.read_text()), cpu_features(MILAN.read_text())
    assert cpu_isa(genoa) == BUDGET_ISA and cpu_isa(milan) == ("avx2",)
    assert "avx512_vnni" in genoa and "avx512_vnni" not in cpu_isa(genoa)  # only extensions that move float speed
    assert cpu_features("processor\t: 0\nFeatures\t: fp asimd bf16 sve\n") == {"fp", "asimd", "bf16", "sve"}  # Arm
    assert cpu_features("processor : 0\n") is None and cpu_isa(None) is None


def test_binding_records_the_cpu_extensions():
    b = ttft_hardware_for(Environment.from_dict({"cpu": "AMD EPYC", "cpu_count": 2, "cpu_isa": ["avx2"], "gpu": None, "cuda": False}))
    assert b["cpu_isa"] == ["avx2"]
    assert "cpu_isa" not in ttft_hardware_for(Environment.from_dict({"cpu": "AMD EPYC", "cpu_count": 2}))  # an older results file


def test_engine_dtype_follows_native_bf16():
    """Where bf16 would be emulated the cpu profile's engine runs float32; elsewhere what the YAML says."""
    thresholds = load_thresholds(SHIPPED_THRESHOLDS)
    milan = Hardware(cuda=False, gpu_name=None, cpu_name="AMD EPYC", cpu_count=2, cpu_isa=("avx2",), native_bf16=False)
    genoa = dataclasses.replace(milan, cpu_isa=BUDGET_ISA, native_bf16=True)
    on_milan, on_genoa = select_profile(thresholds, "auto", milan), select_profile(thresholds, "cpu", genoa)
    assert on_milan.engine.dtype == "float32" and on_milan.engine.bf16_replaced
    assert on_genoa.engine.dtype == "bfloat16" and not on_genoa.engine.bf16_replaced
    assert on_milan.ttft_ms == on_genoa.ttft_ms and on_milan.ops == on_genoa.ops  # only the engine differs
    assert "ISA avx2," in milan.describe()


def test_fingerprint_records_whether_ttft_is_judged_here(monkeypatch):
    monkeypatch.setattr("guard.measure.hardware.git_commit", lambda cwd=None: None)
    cpu = load_thresholds(SHIPPED_THRESHOLDS).profile("cpu")
    here = fingerprint(Hardware(cuda=False, gpu_name=None, cpu_name="AMD EPYC", cpu_count=2, cpu_isa=BUDGET_ISA), cpu).as_dict()
    assert here["ttft_hardware_match"] == {"ok": True, "reason": None} and here["cpu_isa"] == list(BUDGET_ISA)
    there = fingerprint(Hardware(cuda=False, gpu_name=None, cpu_name="Apple M2", cpu_count=8), cpu).as_dict()
    assert there["ttft_hardware_match"]["ok"] is False and "Apple M2 (8 cores, CPU extensions not recorded)" in there["ttft_hardware_match"]["reason"]
