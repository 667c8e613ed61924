"""guard.hardware's TTFT binding: which CPU a budget belongs to, written and read back."""

from __future__ import annotations

import dataclasses
import re

import pytest

from guard.budgets import TtftHardware, load_thresholds
from guard.hardware import Hardware, fingerprint, ttft_hardware_for, ttft_hardware_problem
from tests.conftest import SHIPPED_THRESHOLDS

NAMES = ["AMD EPYC", "Intel(R) Xeon(R) CPU @ 2.20GHz", "12th Gen Intel(R) Core(TM) i7-1260P",
         "AMD Ryzen 9 7950X 16-Core Processor", r"odd [name] {x} a|b \ c + d * e ? f ^ g $ h"]


@pytest.mark.parametrize("name", NAMES)
def test_binding_matches_exactly_the_recorded_cpu(name):
    b = ttft_hardware_for({"cpu": name, "cpu_count": 4, "gpu": None, "cuda": False})
    assert b["cpu_count"] == 4 and b["cpu_model_regex"].startswith("^") and b["cpu_model_regex"].endswith("$")
    assert re.search(b["cpu_model_regex"], name)
    assert not re.search(b["cpu_model_regex"], name + " v2") and not re.search(b["cpu_model_regex"], "x" + name)
    if "\\" not in name:
        assert "\\ " not in b["cpu_model_regex"]  # spaces are not escaped: the YAML stays readable


def test_no_binding_on_a_gpu_or_without_a_recorded_cpu():
    assert ttft_hardware_for({"cpu": "AMD EPYC", "cpu_count": 2, "gpu": "NVIDIA A10", "cuda": True}) is None
    assert ttft_hardware_for({"cpu_count": 2}) is None


def test_shipped_cpu_profile_judges_ttft_only_on_its_cpu():
    cpu = load_thresholds(SHIPPED_THRESHOLDS).profile("cpu")
    assert ttft_hardware_problem(cpu, "AMD EPYC", 2) is None
    why = ttft_hardware_problem(cpu, "Intel(R) Core(TM) i7-1165G7 @ 2.80GHz", 8)
    assert why == ("budget measured on a CPU matching /^AMD EPYC$/ with 2 cores; "
                   "this machine is Intel(R) Core(TM) i7-1165G7 @ 2.80GHz (8 cores)")
    assert ttft_hardware_problem(cpu, "AMD EPYC", 4) is not None  # core count is part of the binding
    unbound = dataclasses.replace(cpu, ttft_hardware=None)
    assert ttft_hardware_problem(unbound, "anything", 64) is None
    no_ttft = dataclasses.replace(cpu, ttft_ms={}, ttft_hardware=TtftHardware(cpu_model_regex="^nothing$"))
    assert ttft_hardware_problem(no_ttft, "AMD EPYC", 2) is None


def test_fingerprint_records_whether_ttft_is_judged_here(monkeypatch):
    monkeypatch.setattr("guard.hardware.git_commit", lambda cwd=None: None)
    cpu = load_thresholds(SHIPPED_THRESHOLDS).profile("cpu")
    here = fingerprint(Hardware(cuda=False, gpu_name=None, cpu_name="AMD EPYC", cpu_count=2), cpu)
    assert here["ttft_hardware_match"] == {"ok": True, "reason": None}
    there = fingerprint(Hardware(cuda=False, gpu_name=None, cpu_name="Apple M2", cpu_count=8), cpu)
    assert there["ttft_hardware_match"]["ok"] is False and "Apple M2 (8 cores)" in there["ttft_hardware_match"]["reason"]
