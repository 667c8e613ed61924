"""Whether a profile fits a machine is decided in guard/measure/fit.py alone.

"Can this profile run, or be judged, on this machine?" once had six answers in six modules; two of
them could disagree about a run. These tests read guard's source: the deciding functions are
defined only in fit.py, and the budget-file keys that decide fit are read nowhere else but in the
records that hold them and in the few places listed here, each with why.
"""

from __future__ import annotations

import ast
from pathlib import Path

GUARD = Path(__file__).resolve().parent.parent / "guard"
FIT = GUARD / "measure" / "fit.py"

DECIDING_FUNCTIONS = {"mismatch", "native_bf16_missing", "select_profile", "not_runnable_here", "on_cpu",
                      "engine_on_cpu", "as_it_ran", "ran_bf16_fallback", "engine_ran_bf16_fallback",
                      "census_against_bf16", "census_of_other_kernels", "ttft_binding_fits",
                      "ttft_hardware_problem", "ttft_not_judged"}
# The keys a fit reads: what the machine must have, what the profile runs as there, where TTFT is judged.
DECIDING_KEYS = {"requires_native_bf16", "dtype_without_native_bf16", "baseline_without_native_bf16",
                 "baseline_with_amx", "gpu_name_regex", "native_bf16", "ran_on_amx", "ttft_hardware"}
# The budget file's records, its format and its loader declare and read those keys as data.
DECLARE = {"config/budgets.py", "config/schema.py", "config/loading.py", "measure/fit.py"}
# Reads elsewhere that decide nothing, each with why.
OTHER_READS = {
    ("commands/update_thresholds.py", "ttft_hardware"): "writes budgets.ttft_hardware beside moved TTFT budgets; "
                                                         "whether the old binding holds is fit.ttft_binding_fits",
    ("commands/update_thresholds.py", "dtype_without_native_bf16"): "names the dtype in a refusal fit decided",
    ("measure/hardware.py", "gpu_name_regex"): "records the match rule in results.json as it was",
}


def _sources() -> dict[str, ast.Module]:
    return {str(p.relative_to(GUARD)): ast.parse(p.read_text(), str(p)) for p in sorted(GUARD.rglob("*.py"))}


def test_the_fit_is_decided_in_one_module() -> None:
    defined = {(path, node.name) for path, tree in _sources().items() for node in ast.walk(tree)
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in DECIDING_FUNCTIONS}
    assert {path for path, _ in defined} == {"measure/fit.py"}, sorted(defined)
    assert {name for _, name in defined} == DECIDING_FUNCTIONS


def test_the_keys_that_decide_fit_are_read_in_fit_alone() -> None:
    reads = {(path, node.attr) for path, tree in _sources().items() if path not in DECLARE for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and node.attr in DECIDING_KEYS and isinstance(node.ctx, ast.Load)}
    assert reads - set(OTHER_READS) == set(), "decide fit in guard/measure/fit.py, or say here why this read decides nothing"
    assert set(OTHER_READS) - reads == set(), "no longer read there: drop it from OTHER_READS"
