"""guard.compat's lean reader of profiler results against torch's own ``prof.events()``.

Both read the same real torch.profiler session (Python stacks on) of a small workload shaped
like the code guard watches: a per-row loop of index writes, ``.item()`` calls, a nested
same-name op (``Tensor.mean`` runs ``aten::div_`` inside ``aten::div_``, which torch folds), a
comprehension. The lean reader must give the very same events, in
the same order; where it does not model the results (a backward pass) it hands over to torch.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from guard import compat


def _row_writes(mask: torch.Tensor) -> None:
    for i in range(mask.shape[0]):
        mask[i, torch.arange(i + 1)] = 1.0  # advanced indexing: aten::index_put_


def _host_syncs(x: torch.Tensor) -> float:
    return sum(float(v.item()) for v in x[0, :8])


def _workload() -> None:
    x = torch.randn(16, 16)
    _row_writes(torch.zeros(16, 16))
    _host_syncs(x)
    x.mean(dim=1).sum()
    [torch.nn.functional.relu(r) for r in x[:4]]


def _profiled(fn):
    with compat.profiler_with_python_stacks(cuda=False) as prof:
        fn()
    return prof


def test_lean_reader_gives_exactly_what_prof_events_gives():
    prof = _profiled(_workload)
    lean_events = compat.lean_events(prof.profiler.kineto_results)  # the lean path is taken here
    assert lean_events, "the lean reader saw no events"
    lean = list(compat.profiler_events(prof))
    reference = list(compat.function_events(prof))
    assert lean == reference
    ops = Counter(name for name, _, _, _ in lean)
    assert ops["aten::_index_put_impl_"] == 16  # one per row of the loop
    assert ops["aten::_local_scalar_dense"] == 8  # one per .item()
    # torch folds an op nested alone in an op of its own name; so does the lean reader
    recorded = sum(1 for k in prof.profiler.kineto_results.events() if k.name() == "aten::div_")
    assert 1 <= ops["aten::div_"] < recorded
    row_writes = [stack for name, stack, _, _ in lean if name == "aten::_index_put_impl_"]
    assert all(any(f.endswith(": _row_writes") for f in stack) for stack in row_writes)
    relus = [stack for name, stack, _, _ in lean if name == "aten::relu"]
    assert len(relus) == 4 and all(any(f.endswith(": <listcomp>") for f in stack) for stack in relus)


def test_lean_reader_hands_a_backward_pass_to_torch():
    w = torch.randn(8, 8, requires_grad=True)
    prof = _profiled(lambda: (w * 2).sum().backward())
    with pytest.raises(compat._NotLean):
        compat.lean_events(prof.profiler.kineto_results)
    assert list(compat.profiler_events(prof)) == list(compat.function_events(prof))


def test_a_moved_raw_results_attribute_is_library_drift():
    class Moved:  # a profiler whose raw results are no longer where torch 2.13 keeps them
        profiler = object()

    with pytest.raises(compat.LibraryDrift, match="raw results"):
        list(compat.profiler_events(Moved()))


# ----------------------------------------------------------------------------- the op registry, remembered
def test_op_registry_is_remembered_per_torch_build_and_then_read_without_torch(tmp_path, monkeypatch):
    import json
    import subprocess
    import sys

    monkeypatch.setenv("GUARD_CACHE_DIR", str(tmp_path))
    first = compat.registered_op_names()
    cache = compat.op_registry_cache(load_vllm_ops=False)
    assert cache is not None and cache.parent == tmp_path and cache.is_file()
    assert frozenset(json.loads(cache.read_text())) == first and "aten::_index_put_impl_" in first
    assert compat.op_registry_cache(load_vllm_ops=True) != cache  # vLLM's ops make another registry
    # a fresh process answers from the cache, without importing torch
    probe = ("import sys; from guard.compat import registered_op_names as r; n = r(); "
             "print(len(n), 'aten::_index_put_impl_' in n, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "GUARD_CACHE_DIR": str(tmp_path)}).stdout.split()
    assert out == [str(len(first)), "True", "False"]


def test_a_damaged_op_registry_cache_is_read_afresh(tmp_path, monkeypatch):
    monkeypatch.setenv("GUARD_CACHE_DIR", str(tmp_path))
    cache = compat.op_registry_cache(load_vllm_ops=False)
    cache.parent.mkdir(parents=True, exist_ok=True)
    for damaged in ('["aten::add", 3]', "{not json", "[]"):
        cache.write_text(damaged)
        names = compat.registered_op_names()
        assert "aten::_index_put_impl_" in names and len(names) > 1000
        assert "aten::_index_put_impl_" in cache.read_text()  # rewritten from the registry


def test_an_empty_cache_dir_setting_turns_the_cache_off(tmp_path, monkeypatch):
    monkeypatch.setenv("GUARD_CACHE_DIR", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compat.op_registry_cache(load_vllm_ops=False) is None
    assert "aten::_index_put_impl_" in compat.registered_op_names()
    assert list(tmp_path.iterdir()) == []


def test_dummy_weight_construction_skips_the_random_fill_and_restores_it():
    with compat.weights_left_uninitialised():
        layer = torch.nn.Linear(64, 64)  # reset_parameters -> init.kaiming_uniform_: skipped
        filled = torch.zeros(8)
        torch.nn.init.uniform_(filled, 1.0, 2.0)  # what a transformers-built sub-model calls
        assert torch.equal(filled, torch.zeros(8))
    torch.nn.init.uniform_(filled, 1.0, 2.0)  # restored on the way out
    assert bool((filled >= 1.0).all())
    assert layer.weight.shape == (64, 64)


def test_dummy_weights_from_one_stream_are_vllms_own_bits_and_vllm_is_restored():
    from vllm.model_executor.model_loader import dummy_loader, weight_utils

    def tensors():  # sizes out of order, two dtypes, 0-d, a non-contiguous view, an int buffer
        return [torch.empty(3000, 7), torch.empty(5), torch.empty(2 * (1 << 20) + 11, dtype=torch.bfloat16),
                torch.empty(()), torch.empty(64, 64).t(), torch.empty(17, dtype=torch.bfloat16),
                torch.zeros(9, dtype=torch.int64)]

    vllms = tensors()
    for t in vllms:
        weight_utils.initialize_single_dummy_weight(t)
    ours = tensors()
    with compat.dummy_weights_from_one_stream():
        assert dummy_loader.initialize_single_dummy_weight is not weight_utils.initialize_single_dummy_weight
        for t in ours:
            dummy_loader.initialize_single_dummy_weight(t)
    assert dummy_loader.initialize_single_dummy_weight is weight_utils.initialize_single_dummy_weight
    assert all(torch.equal(a, b) for a, b in zip(vllms, ours))
    assert float(ours[0].abs().max()) > 0  # filled, not left as allocated


def test_what_the_stream_cannot_vouch_for_goes_to_vllms_own_fill(monkeypatch):
    from vllm.model_executor.model_loader import dummy_loader

    seen = []
    vllms = dummy_loader.initialize_single_dummy_weight
    monkeypatch.setattr(dummy_loader, "initialize_single_dummy_weight",
                        lambda param, *a, **k: (seen.append(param.dtype), vllms(param, *a, **k)))
    monkeypatch.setitem(compat._prefix_fill_holds, torch.bfloat16, False)  # a torch that fills out of order
    with compat.dummy_weights_from_one_stream():
        for t in (torch.empty(64, dtype=torch.bfloat16), torch.empty(8, 8).t(), torch.empty(64)):
            dummy_loader.initialize_single_dummy_weight(t)
    assert seen == [torch.bfloat16, torch.float32]  # the bf16 tensor and the transposed view; not the last
