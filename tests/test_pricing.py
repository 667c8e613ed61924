"""What a census change would cost on a GPU (guard.judge.pricing): each op's class, the arithmetic
against the shipped constants file, the file's own rules, and the estimate on a recorded run's
findings (tests/fixtures/pr/mask-loop.results.json, the pre-#49531 loop measured by `guard pr`)."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path

import pytest

from guard.config.budgets import CensusRule
from guard.errors import ConfigError
from guard.judge import pricing
from guard.judge.census import compare, judge
from guard.judge.pricing import (COMPOSITES, COSTS_FILE, H2D_COPIES, HOST_SYNCS, INDEX_WRITES, PRICED_CLASSES, VIEWS,
                                 class_calls, counted_on_gpu, op_class, parse_costs, price, shipped_costs)
from guard.model import format as fmt
from guard.model.checks import CostStatus, OpClass
from guard.model.jsonfiles import load_results
from guard.model.readings import CUDA_SYNC, INPUT_CALLS, MEMCPY_HTOD

REPO = Path(__file__).resolve().parent.parent
MASK_LOOP = REPO / "tests" / "fixtures" / "pr" / "mask-loop.results.json"
RULE = CensusRule(baseline=Path("unused"), max_growth_pct=10, min_growth_calls=16, new_function_max_calls=8)
K, S, H, I, V = (OpClass.KERNEL_LAUNCH, OpClass.HOST_SYNC, OpClass.H2D_COPY, OpClass.INDEX_WRITE, OpClass.VIEW)


def mask_loop_deltas(size: tuple[int, int]) -> dict[str, int]:
    """The pre-#49531 mask loop's change per request, as `guard pr` recorded it (no pricing in the file)."""
    (c,) = [c for c in load_results(MASK_LOOP).census_checks if tuple(c.image_size) == size]
    assert c.gpu_costs == ()  # written before guard priced a change, and still read
    return {d.op: d.delta_calls for d in c.op_deltas}


# ----------------------------------------------------------------------------- classes
@pytest.mark.parametrize("op, on_cpu, on_gpu", [
    ("aten::add", K, K), ("aten::copy_", K, K), ("aten::fill_", K, K), ("_C::rotary_embedding", K, K),
    ("aten::_local_scalar_dense", S, K), ("aten::nonzero", S, K), ("aten::masked_select", S, K),
    ("aten::_index_put_impl_", I, K), ("aten::lift_fresh", H, V),
    ("aten::view", V, V), ("aten::select", V, V), ("aten::as_strided", V, V), ("aten::empty", V, V),
    ("aten::item", OpClass.COMPOSITE, OpClass.COMPOSITE), ("aten::index_put_", OpClass.COMPOSITE, OpClass.COMPOSITE),
    ("aten::to", OpClass.COMPOSITE, OpClass.COMPOSITE), ("aten::linear", OpClass.COMPOSITE, OpClass.COMPOSITE),
    ("aten::zeros", OpClass.COMPOSITE, OpClass.COMPOSITE), ("aten::zero_", K, K),
    ("vllm::unified_attention_with_output", OpClass.COMPOSITE, OpClass.COMPOSITE),
    (CUDA_SYNC, S, S), (MEMCPY_HTOD, OpClass.COMPOSITE, OpClass.COMPOSITE), (INPUT_CALLS, None, None),
])
def test_each_op_has_the_class_it_costs_on_a_gpu(op, on_cpu, on_gpu):
    """On a census counted on a GPU the waits are measured (cuda::sync): the ops that asked for them
    are priced as the launches they also are, so no wait is priced twice."""
    assert op_class(op) == on_cpu and op_class(op, on_gpu=True) == on_gpu


def test_no_op_is_in_two_classes():
    sets = {"HOST_SYNCS": HOST_SYNCS, "INDEX_WRITES": INDEX_WRITES, "H2D_COPIES": H2D_COPIES, "VIEWS": VIEWS,
            "COMPOSITES": COMPOSITES}
    for a, sa in sets.items():
        for b, sb in sets.items():
            assert a == b or not sa & sb, f"{sorted(sa & sb)} in both {a} and {b}"


def _programs():
    import torch
    import torch.nn.functional as F

    x, w, idx = torch.randn(4, 8), torch.randn(5, 8), torch.tensor([0, 2])
    return {"item": lambda: x[0, 0].item(), "is_nonzero": lambda: bool(x[0, 0] > 0),
            "index write": lambda: x.__setitem__((1, idx), 0.0), "to": lambda: x.to(torch.float64),
            "linear": lambda: F.linear(x, w), "zeros": lambda: torch.zeros(3), "full": lambda: torch.full((3,), 2.0),
            "clone": lambda: x.t().contiguous(), "stack": lambda: torch.stack([x, x]), "pad": lambda: F.pad(x, (1, 1)),
            "embedding": lambda: F.embedding(idx, w), "rsub": lambda: 1 - x, "and": lambda: (x > 0) & (x < 1),
            "layer_norm": lambda: F.layer_norm(x, (8,)), "repeat": lambda: x.repeat(2, 1)}


@pytest.mark.parametrize("name", sorted(_programs()))
def test_every_composite_calls_an_op_the_census_counts_and_prices(name):
    """Composites are priced at nothing because the profiler records the ops they call (on a CPU,
    where the census is counted): checked on real torch, or a kernel would go unpriced."""
    from torch.profiler import ProfilerActivity, profile

    program = _programs()[name]  # its tensors made outside the profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        program()

    def priced_below(e) -> bool:
        return any(op_class(k.name) in (K, S, H, I) or priced_below(k) for k in e.cpu_children)

    composites = [e for e in prof.events() if op_class(e.name) == OpClass.COMPOSITE]
    assert composites, [e.name for e in prof.events()]
    assert all(priced_below(e) for e in composites), [(e.name, [k.name for k in e.cpu_children]) for e in composites]


def test_a_wrapper_and_the_op_it_calls_are_one_sync_not_two():
    # .item() is recorded as aten::item wrapping _local_scalar_dense; x[idx] = v as index_put_ wrapping the impl
    calls = class_calls({"aten::item": 3, "aten::_local_scalar_dense": 3, "aten::index_put_": 2,
                         "aten::_index_put_impl_": 2, "aten::lift_fresh": 2, "aten::select": 9, INPUT_CALLS: 5})
    assert calls == {S: 3, H: 2, I: 2, V: 9}


def test_only_a_census_with_cuda_activity_counts_as_counted_on_a_gpu():
    assert not counted_on_gpu({"640x480": {"vllm/a.py:f": {"aten::add": 3, INPUT_CALLS: 3}}})
    assert counted_on_gpu({"640x480": {"vllm/a.py:f": {"aten::add": 3}, "vllm/b.py:g": {MEMCPY_HTOD: 1}}})


# ----------------------------------------------------------------------------- arithmetic
def test_the_pre_49531_loop_is_priced_class_by_class_against_the_constants_file():
    table = shipped_costs()
    deltas = mask_loop_deltas((640, 480))
    # per request: 513 index writes, 512 .item() + 2 nonzero, 513 Python scalars sent to the device, a few launches
    assert class_calls(deltas) == {K: 9, S: 514, H: 513, I: 513, V: 3618}
    costs = {g.gpu: g for g in price(deltas, table)}
    assert set(costs) == {"A10", "H100"}
    for gpu, g in costs.items():
        us = {cls: table.row(gpu, cls).us_per_call for cls in PRICED_CLASSES}
        assert g.ms_per_request == pytest.approx((9 * us[K] + 514 * us[S] + 513 * us[H] + 513 * us[I] + 3618 * us[V]) / 1000,
                                                 abs=5e-5)  # stored to a tenth of a microsecond
        assert [c.op_class for c in g.classes][0] == I  # the index writes cost most
        assert all(c.status == CostStatus.ESTIMATE for c in g.classes) and not g.calibrated
    assert costs["A10"].ms_per_request == pytest.approx(21.09)  # 513 x 17 + 514 x 12 + 513 x 12 + 9 x 5 us


def test_fewer_calls_price_as_a_saving_and_views_alone_cost_nothing():
    (a10, _) = price({"aten::add": -40, "aten::view": 10}, shipped_costs())
    assert a10.ms_per_request == pytest.approx(-40 * shipped_costs().row("A10", K).us_per_call / 1000)
    (views, _) = price({"aten::view": 300, "aten::select": 12}, shipped_costs())
    assert views.ms_per_request == 0 and views.classes == ()  # priced, at nothing: no kernel, no copy
    assert price({"aten::item": 4, INPUT_CALLS: 4}, shipped_costs()) == ()  # nothing priced at all


def test_on_a_gpu_census_the_measured_waits_are_priced_once():
    deltas = {"aten::item": 100, "aten::_local_scalar_dense": 100, CUDA_SYNC: 100, "aten::copy_": 5, MEMCPY_HTOD: 5}
    assert class_calls(deltas, on_gpu=True) == {K: 105, S: 100}
    assert class_calls(deltas) == {K: 5, S: 200}  # the same names read as a CPU census: a CPU never has cuda::


def test_calls_that_only_moved_are_not_priced_and_host_tensors_never_are():
    base = {"vllm/a.py:Enc.forward": {"aten::mul": 100, "aten::_index_put_impl_": 4}}
    got = {"vllm/a.py:Enc.forward": {"aten::mul": 36}, "vllm/a.py:Enc._scale": {"aten::mul": 64, "aten::_index_put_impl_": 4,
                                                                                 "aten::add": 20}}
    helper = next(c for c in compare(RULE, (640, 480), base, got, costs=shipped_costs()) if c.function.endswith("_scale"))
    assert helper.moved_calls == 68
    (a10, _) = helper.gpu_costs  # only the 20 adds it gained on its own
    assert [(c.op_class, c.calls) for c in a10.classes] == [(K, 20)]
    proc = {"vllm/p.py:process": {"aten::_local_scalar_dense": 50, INPUT_CALLS: 50}}
    (c,) = compare(RULE, (640, 480), {}, proc, costs=shipped_costs())
    assert c.input_processing and c.gpu_costs == ()  # the processor's host tensors wait for no device
    assert compare(RULE, (640, 480), base, got)[0].gpu_costs == ()  # no table given: nothing priced


def test_judging_a_gpu_census_prices_its_measured_syncs():
    from guard.config.census import Baseline

    base = {"vllm/m.py:f": {"aten::add": 3, MEMCPY_HTOD: 1}}
    got = {"vllm/m.py:f": {"aten::add": 3, MEMCPY_HTOD: 1, "aten::item": 40, "aten::_local_scalar_dense": 40,
                           CUDA_SYNC: 40}}
    baseline = Baseline(path=Path("b.json"), model="m", profile="a10", roots=("vllm",), census={"640x480": base})
    (c,) = judge(RULE, baseline, {"640x480": got}, [(640, 480)], model="m", profile="a10", update_command="x").checks
    (a10, _) = c.gpu_costs
    assert {k.op_class: k.calls for k in a10.classes} == {S: 40, K: 40}


# ----------------------------------------------------------------------------- the constants file
def test_every_constant_says_where_it_comes_from_and_whether_it_was_measured():
    data = json.loads(COSTS_FILE.read_text(encoding="utf-8"))
    table = parse_costs(data, str(COSTS_FILE))
    assert table.gpus == ("A10", "H100")
    for row in data["costs"]:
        assert row["status"] in ("estimate", "calibrated") and row["source"].strip()
        derived = row["class"] == "index_write"  # a launch and a copy, as its source says
        if row["status"] == "estimate" and not derived and row["us_per_call"] > 0:
            assert re.search(r"https://\S+|benchmarks/\S+\.json", row["source"]), row
    for gpu in table.gpus:  # the index write is priced as what it is made of; a changed part changes it
        assert table.row(gpu, I).us_per_call == pytest.approx(table.row(gpu, K).us_per_call + table.row(gpu, H).us_per_call)


def _mutated(change) -> dict:
    data = json.loads(COSTS_FILE.read_text(encoding="utf-8"))
    change(data)
    return data


@pytest.mark.parametrize("change, field, words", [
    (lambda d: d["costs"].pop(0), "costs", "A10 has no constant for kernel_launch"),
    (lambda d: d["costs"].append(copy.deepcopy(d["costs"][0])), "costs", "A10 prices kernel_launch twice"),
    (lambda d: d["costs"][1].update(status="measured"), "costs[1].status", "neither 'estimate' nor 'calibrated'"),
    (lambda d: d["costs"][2].update(source=" "), "costs[2].source", "names where it comes from"),
    (lambda d: d["costs"][3].update(us_per_call=-1), "costs[3].us_per_call", ">= 0"),
    (lambda d: d["costs"][3].update({"class": "launch"}), "costs[3].class", "not one of"),
    (lambda d: d.update(schema="guard/results"), "schema", "not a guard/gpu-costs file"),
    (lambda d: d.update(extra=1), "extra", "not a field"),
])
def test_a_damaged_constants_file_is_refused_naming_the_field(change, field, words):
    with pytest.raises(ConfigError) as err:
        parse_costs(_mutated(change), "gpu_costs.json")
    assert err.value.key == field and words in str(err.value)


def test_a_calibrated_gpu_replaces_its_estimates_and_says_so():
    data = _mutated(lambda d: [r.update(status="calibrated", source="benchmarks/gpu_cost.py on NVIDIA A10, 2026-12-09")
                               for r in d["costs"] if r["gpu"] == "A10"])
    (a10, h100) = price(mask_loop_deltas((800, 400)), parse_costs(data))
    assert a10.calibrated and not h100.calibrated


def test_the_docs_quote_what_the_shipped_constants_give():
    """docs/gpu-cost.md prices the recorded pre-#49531 loop; a constant changed without the docs fails here."""
    doc = (REPO / "docs" / "gpu-cost.md").read_text(encoding="utf-8")
    for size, key in (((640, 480), "640×480"), ((800, 400), "800×400")):
        a10, h100 = price(mask_loop_deltas(size), shipped_costs())
        assert f"| {key} | {a10.ms_per_request:.1f} ms | {h100.ms_per_request:.1f} ms |" in doc
    for row in shipped_costs().rows:
        assert f"| {row.gpu} | `{row.op_class}` | {row.us_per_call:g} |" in doc, row
    # docs/census.md's example: the token-copies mutant's recorded finding
    (c,) = [c for c in load_results(REPO / "tests" / "fixtures" / "runs" / "cpu-float32-mutant-token-copies.json").census_checks
            if tuple(c.image_size) == (640, 480)]
    said = fmt.gpu_cost(dataclasses.replace(c, gpu_costs=price({d.op: d.delta_calls for d in c.op_deltas}, shipped_costs())))
    assert said.startswith("≈ +1.3 ms per request on an A10, +2.4 ms on an H100 (A10: 256 kernel launches × 5 µs;")
    census_md = " ".join((REPO / "docs" / "census.md").read_text(encoding="utf-8").split())
    assert said.split(";")[0] in census_md


def test_the_module_reads_its_constants_once():
    assert pricing.shipped_costs() is pricing.shipped_costs()
