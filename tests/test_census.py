"""The operator census on recorded profiler events, its rule, its baseline file, and the mutants'
source edits against the installed vLLM (no engine here; tests/test_e2e.py runs them live)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from guard.model import format as fmt
from guard.config.budgets import DEFAULT_WATCH, CensusRule
from guard.config.loading import load_thresholds
from guard.config.census import load_baseline, render_baseline
from guard.judge.census import compare
from guard.measure.census import QualnameResolver, count_functions, function_of, unstable_functions
from guard.model.readings import INPUT_CALLS, counts_only, fold, folded, input_processing_only, op_deltas, total_calls
from guard.errors import ConfigError, InvalidRunError
from guard.measure.mutants import MUTANTS, Edit, Mutant, mutate
from guard.measure.probes import ProfEvent, load_events
from guard.model.records import Status

FIXTURES = Path(__file__).parent / "fixtures" / "profiles"
MASK_FN = ("vllm/model_executor/models/deepencoder2.py:CustomQwen2Decoder._create_custom_model."
           "<locals>.CustomQwen2ModelInner._update_causal_mask")
RULE = CensusRule(baseline=Path("unused"), max_growth_pct=10, min_growth_calls=16, new_function_max_calls=8)


def census_events(size: str) -> list[ProfEvent]:
    return load_events(FIXTURES / f"census-{size}.events.json.gz")


# ----------------------------------------------------------------------------- counting
def test_legacy_mask_ops_are_charged_to_the_innermost_vllm_function_by_qualified_name() -> None:
    ev = load_events(FIXTURES / "legacy-mask-640x480.events.json.gz")
    census = count_functions(ev, ("vllm",), QualnameResolver())
    assert census[MASK_FN]["aten::_index_put_impl_"] == 513
    assert census[MASK_FN]["aten::_local_scalar_dense"] == 512
    # guard/measure/canary.py is not under the root: its ops belong to the vLLM function that called it
    assert not any(fn.startswith("guard/") for fn in census)


def test_roots_choose_which_frames_count() -> None:
    ev = load_events(FIXTURES / "legacy-mask-640x480.events.json.gz")
    census = count_functions(ev, ("guard",), QualnameResolver())
    assert census["guard/canary.py:legacy_create_custom_4d_mask"]["aten::_index_put_impl_"] == 513
    assert all(fn.startswith("guard/") for fn in census)


def test_innermost_frame_under_the_root_wins() -> None:
    stack = ("<built-in method add of Tensor object at 0x1>", "torch/nn/functional.py(10): relu",
             "vllm/a.py(5): inner", "vllm/b.py(9): outer")
    assert function_of(stack, ("vllm",), lambda f, line, n: n) == "vllm/a.py:inner"
    assert function_of(stack, ("vllmx",), lambda f, line, n: n) is None
    assert function_of(stack[:2], ("vllm",), lambda f, line, n: n) is None


def test_cuda_runtime_calls_are_not_ops_but_syncs_and_htod_copies_are_counted() -> None:
    ev = [ProfEvent("aten::copy_", ("vllm/a.py(1): f",), True, ("Memcpy HtoD (Pageable -> Device)",)),
          ProfEvent("cudaLaunchKernel", ("vllm/a.py(1): f",), True),
          ProfEvent("cudaStreamSynchronize", ("vllm/a.py(1): f",), True),
          ProfEvent("vllm/a.py(1): f", ("vllm/a.py(1): f",), False),
          ProfEvent("nn.Module: Linear_3", ("vllm/a.py(1): f",), True)]  # a Python call the profiler names oddly
    census = count_functions(ev, ("vllm",))
    assert census == {"vllm/a.py:f": {"aten::copy_": 1, "cuda::memcpy_htod": 1, "cuda::sync": 1}}
    assert total_calls(census["vllm/a.py:f"]) == 1


def test_calls_made_in_vllms_input_processing_are_marked_where_they_ran() -> None:
    """The recorded DeepSeek-OCR-2 request: its processor's .item()s and index writes ran under
    LLMEngine.add_request -> InputProcessor.process_inputs, the model's under the engine step."""
    census = count_functions(census_events("640x480"), ("vllm",), QualnameResolver())
    processor = census["vllm/transformers_utils/processors/deepseek_ocr.py:DeepseekOCRProcessor.tokenize_with_images"]
    assert processor["aten::_local_scalar_dense"] > 0 and processor["aten::_index_put_impl_"] > 0
    assert processor[INPUT_CALLS] == total_calls(processor) and input_processing_only(processor)
    merge = census["vllm/model_executor/models/utils.py:_merge_multimodal_embeddings"]
    assert merge["aten::_index_put_impl_"] == 1 and INPUT_CALLS not in merge and not input_processing_only(merge)
    marked = [fn for fn, ops in census.items() if INPUT_CALLS in ops]
    assert marked and all(input_processing_only(census[fn]) for fn in marked)
    assert not any("model_executor/models/deepencoder" in fn for fn in marked)


def test_only_host_work_in_input_processing_is_marked() -> None:
    processing = ("vllm/multimodal/processing/context.py(9): call_hf_processor",
                  "vllm/v1/engine/input_processor.py(373): process_inputs", "vllm/v1/engine/llm_engine.py(229): add_request")
    ev = [ProfEvent("aten::item", ("vllm/p.py(1): f", *processing), True),
          ProfEvent("aten::copy_", ("vllm/p.py(1): f", *processing), True, ("Memcpy HtoD (Pageable -> Device)",)),
          ProfEvent("aten::item", ("vllm/m.py(1): g", "vllm/v1/engine/core.py(5): step"), True)]
    census = count_functions(ev, ("vllm",))
    # the copy launched device work: it counts, and keeps f from being input processing only
    assert census["vllm/p.py:f"] == {"aten::copy_": 1, "aten::item": 1, "cuda::memcpy_htod": 1, INPUT_CALLS: 1}
    assert total_calls(census["vllm/p.py:f"]) == 2 and not input_processing_only(census["vllm/p.py:f"])
    assert census["vllm/m.py:g"] == {"aten::item": 1}
    assert count_functions(ev[:1], ("vllm",)) == {"vllm/p.py:f": {"aten::item": 1, INPUT_CALLS: 1}}


@pytest.mark.parametrize("size", ["640x480", "800x400"])
def test_recorded_request_census_covers_the_vision_path(size: str) -> None:
    census = count_functions(census_events(size), ("vllm",), QualnameResolver())
    assert len(census) > 20
    assert "vllm/model_executor/models/deepencoder.py:ImageEncoderViT.forward" in census
    assert any(fn.endswith(":Qwen2Decoder2Encoder.forward") for fn in census)
    # line numbers never appear in a function's name
    assert all(not fn.rsplit(":", 1)[1][:1].isdigit() for fn in census)
    assert not any(op.startswith("nn.Module") for ops in census.values() for op in ops)
    # the current mask path issues no index writes at all
    assert census.get(MASK_FN, {}).get("aten::_index_put_impl_", 0) == 0


def test_census_of_the_same_events_is_identical() -> None:
    ev = census_events("640x480")
    assert count_functions(ev, ("vllm",), QualnameResolver()) == count_functions(list(ev), ("vllm",), QualnameResolver())


def test_unstable_functions_names_the_movers() -> None:
    runs = [{"a": {"x": 1}, "b": {"y": 2}}, {"a": {"x": 1}, "b": {"y": 3}}, {"a": {"x": 1}}]
    assert unstable_functions(runs) == {"b": [2, 3, 0]}


# ----------------------------------------------------------------------------- the rule
BASE = {"vllm/m.py:loop": {"aten::copy_": 100, "aten::select": 100},
        "vllm/m.py:small": {"aten::view": 2},
        "vllm/m.py:gone": {"aten::add": 5},
        "vllm/m.py:noisy": {"aten::add": 50}}


@pytest.mark.parametrize(("fn", "measured", "fails", "why"), [
    ("vllm/m.py:loop", {"aten::copy_": 108, "aten::select": 108}, False, "16 calls: within 10 % of 200"),
    ("vllm/m.py:loop", {"aten::copy_": 356, "aten::select": 356}, True, "+512: beyond both"),
    ("vllm/m.py:small", {"aten::view": 2, "aten::reshape": 1}, False, "+1 of 2: 50 % but not 16 calls"),
    ("vllm/m.py:small", {"aten::view": 2, "aten::_local_scalar_dense": 1}, True, "watched op grew"),
    ("vllm/m.py:new", {"aten::add": 8}, False, "new, at the cap"),
    ("vllm/m.py:new", {"aten::add": 9}, True, "new, above the cap"),
    ("vllm/m.py:new", {"aten::nonzero": 1}, True, "new, with a watched op"),
    ("vllm/m.py:loop", {"aten::copy_": 10, "aten::select": 10}, False, "shrinkage is a notice"),
])
def test_growth_rule(fn: str, measured: dict, fails: bool, why: str) -> None:
    got = {**BASE, fn: measured}
    (d,) = [d for d in compare(RULE, (640, 480), BASE, got) if d.function == fn]
    assert (d.status == Status.FAIL) is fails, why


def test_diff_names_the_ops_that_grew_largest_first_and_failures_first() -> None:
    got = {**BASE, "vllm/m.py:loop": {"aten::copy_": 356, "aten::select": 612, "aten::empty_like": 1},
           "vllm/m.py:small": {"aten::view": 1}}
    got.pop("vllm/m.py:gone")
    diffs = compare(RULE, (640, 480), BASE, got)
    first = diffs[0]
    assert first.status == Status.FAIL and first.function == "vllm/m.py:loop"
    assert first.baseline_calls == 200 and first.measured_calls == 969
    assert fmt.census_ops(first) == "+512 aten::select, +256 aten::copy_, +1 aten::empty_like"
    assert fmt.census_calls(first) == "200 → 969"
    vanished = next(d for d in diffs if d.function == "vllm/m.py:gone")
    assert vanished.status == Status.PASS and vanished.measured_calls is None
    assert fmt.census_calls(vanished) == "5 → gone"
    assert [d.status for d in diffs] == [Status.FAIL, Status.PASS, Status.PASS]


def _moved(base: dict, got: dict, rule: CensusRule = RULE) -> dict:
    return {d.function: d for d in compare(rule, (640, 480), base, got)}


def test_calls_moved_into_a_new_helper_are_a_notice_not_growth() -> None:
    # a refactor: 64 muls and their index writes leave forward() for a new helper
    base = {"vllm/a.py:Enc.forward": {"aten::mul": 100, "aten::_index_put_impl_": 4, "aten::add": 3}}
    got = {"vllm/a.py:Enc.forward": {"aten::mul": 36, "aten::add": 3},
           "vllm/a.py:Enc._scale": {"aten::mul": 64, "aten::_index_put_impl_": 4}}
    d = _moved(base, got)
    helper = d["vllm/a.py:Enc._scale"]
    assert helper.status == Status.PASS and helper.moved_calls == 68 and helper.watched_ops == ()
    assert helper.moved_from == ("vllm/a.py:Enc.forward",)
    assert fmt.census_change(helper).startswith("moved: 68 op calls from vllm/a.py:Enc.forward to vllm/a.py:Enc._scale")
    assert d["vllm/a.py:Enc.forward"].status == Status.PASS
    # forward gave its calls to the helper: that is no improvement, only a move
    assert not fmt.census_change(d["vllm/a.py:Enc.forward"], donor=True).startswith("improvement")


def test_fewer_calls_are_said_as_an_improvement_naming_the_host_syncs_gone() -> None:
    """0.31 -> 0.32: _parse_and_validate_image_input lost 11 op calls, one .item() among them."""
    base = {"vllm/m.py:parse": {"aten::_local_scalar_dense": 1, "aten::select": 10, "aten::view": 2}}
    got = {"vllm/m.py:parse": {"aten::view": 2}}
    parse = _moved(base, got)["vllm/m.py:parse"]
    assert parse.status == Status.PASS
    said = fmt.census_change(parse)
    assert said.startswith("improvement: vllm/m.py:parse [640x480]: 13 → 2 op calls")
    assert said.endswith("host syncs gone: 1 .item() (aten::_local_scalar_dense)")
    # 0.26 -> 0.27 (#49531): each .item() is recorded as aten::item wrapping _local_scalar_dense; one sync each
    mask = _moved({"vllm/m.py:mask": {"aten::item": 512, "aten::_local_scalar_dense": 512, "aten::nonzero": 2}},
                  {"vllm/m.py:mask": {"aten::expand": 1}})["vllm/m.py:mask"]
    assert fmt.census_change(mask).endswith("host syncs gone: 2 nonzero (aten::nonzero), 512 .item() (aten::_local_scalar_dense)")
    grew = _moved({"vllm/m.py:f": {"aten::view": 2}}, {"vllm/m.py:f": {"aten::view": 3}})["vllm/m.py:f"]
    assert not fmt.census_change(grew).startswith("improvement")


def test_a_renamed_function_is_a_move() -> None:
    base = {"vllm/a.py:old_name": {"aten::mul": 300, "aten::nonzero": 2}}
    got = {"vllm/b.py:new_name": {"aten::mul": 300, "aten::nonzero": 2}}
    d = _moved(base, got)
    assert d["vllm/b.py:new_name"].status == Status.PASS and d["vllm/b.py:new_name"].moved_calls == 302
    assert d["vllm/a.py:old_name"].measured_calls is None


def test_a_loop_in_a_new_function_still_fails_beside_a_move() -> None:
    base = {"vllm/a.py:f": {"aten::mul": 100}}
    # 100 muls moved into g, plus a new loop of 200 copies: only the loop is growth
    got = {"vllm/a.py:g": {"aten::mul": 100, "aten::copy_": 200}}
    g = _moved(base, got)["vllm/a.py:g"]
    assert g.status == Status.FAIL and g.moved_calls == 100
    assert "new function with 300 op calls" in g.reason and "100 of them moved" in g.reason


def test_growth_beyond_what_moved_is_judged_by_the_rule() -> None:
    base = {"vllm/a.py:f": {"aten::mul": 200}, "vllm/a.py:g": {"aten::mul": 200}}
    # g takes f's 200 muls and adds a per-token loop of 150 more: the request grew by 150
    got = {"vllm/a.py:g": {"aten::mul": 550}}
    g = _moved(base, got)["vllm/a.py:g"]
    assert g.status == Status.FAIL and g.moved_calls == 200 and g.reason.startswith("+150 op calls")


def test_a_watched_op_that_grew_in_the_request_fails_even_where_others_moved() -> None:
    base = {"vllm/a.py:f": {"aten::_local_scalar_dense": 2}}
    got = {"vllm/a.py:f": {}, "vllm/a.py:g": {"aten::_local_scalar_dense": 4}}
    g = _moved(base, got)["vllm/a.py:g"]
    assert g.status == Status.FAIL and g.watched_ops == ("aten::_local_scalar_dense",) and g.moved_calls == 2


def test_an_unrelated_shrink_elsewhere_does_not_hide_a_watched_op() -> None:
    # the request lost 500 adds elsewhere; the new function's nonzero is still new to the request
    base = {"vllm/a.py:f": {"aten::add": 500}}
    got = {"vllm/a.py:g": {"aten::nonzero": 1}}
    assert _moved(base, got)["vllm/a.py:g"].status == Status.FAIL


def _in_processing(ops: dict) -> dict:
    return {**ops, INPUT_CALLS: total_calls(ops)}


def test_a_host_sync_op_in_input_processing_is_held_to_the_growth_rules_only() -> None:
    """vLLM 0.31's GLM-4.1V processor began writing `input_ids[input_ids == video] = image` on every
    request: an index write and an .item() on the processor's CPU token ids, which wait for no device."""
    new = {"aten::_index_put_impl_": 1, "aten::_local_scalar_dense": 1, "aten::eq": 1, "aten::index_put_": 1,
           "aten::item": 1, "aten::lift_fresh": 1, "aten::masked_fill_": 1}
    fn = "vllm/model_executor/models/glm4_1v.py:Glm4vMultiModalProcessor._apply_hf_processor_main"
    unmarked = _moved({}, {fn: new})[fn]
    assert unmarked.status == Status.FAIL and not unmarked.input_processing
    c = _moved({}, {fn: _in_processing(new)})[fn]
    assert c.status == Status.PASS and c.watched_ops == () and c.input_processing
    assert "not a host sync" in fmt.census_change(c)
    # the growth rules still apply there: a per-item loop in the processor is CPU time in TTFT
    loop = _moved({}, {fn: _in_processing({"aten::_local_scalar_dense": 40, "aten::select": 40})})[fn]
    assert loop.status == Status.FAIL and loop.reason.startswith("new function with 80 op calls")


def test_a_sync_that_moves_from_the_processor_into_the_model_fails() -> None:
    proc, model = "vllm/p.py:process", "vllm/m.py:forward"
    base = {proc: _in_processing({"aten::_local_scalar_dense": 1, "aten::view": 4}), model: {"aten::mm": 3}}
    got = {proc: _in_processing({"aten::view": 4}), model: {"aten::mm": 3, "aten::_local_scalar_dense": 1}}
    c = _moved(base, got)[model]
    assert c.status == Status.FAIL and c.watched_ops == ("aten::_local_scalar_dense",)


def test_where_calls_ran_is_never_an_op_delta() -> None:
    ops = {"aten::view": 3}
    assert op_deltas(ops, _in_processing(ops)) == ()
    assert compare(RULE, (1, 1), {"vllm/p.py:f": ops}, {"vllm/p.py:f": _in_processing(ops)}) == []
    lines = fmt.host_syncs({"640x480": {"vllm/p.py:f": _in_processing({"aten::nonzero": 2}),
                                        "vllm/m.py:g": {"aten::nonzero": 1}}})
    assert lines == ["640x480: 1 (nonzero 1); baseline 1"]


def test_excluded_functions_are_not_judged() -> None:
    rule = CensusRule(baseline=Path("x"), exclude={"vllm/m.py:noisy": "scheduler bookkeeping varies per step"})
    got = {**BASE, "vllm/m.py:noisy": {"aten::add": 5000}}
    assert compare(rule, (1, 1), BASE, got) == []


def test_default_watch_list() -> None:
    assert set(DEFAULT_WATCH) == {"aten::_local_scalar_dense", "aten::nonzero", "aten::_index_put_impl_",
                                  "cuda::memcpy_htod"}


# ----------------------------------------------------------------------------- baseline file
def test_baseline_round_trip_is_sorted_one_line_per_function(tmp_path: Path) -> None:
    census = {"800x400": {"vllm/b.py:g": {"aten::mm": 2, "aten::add": 1}}, "640x480": dict(BASE)}
    text = render_baseline("m", "cpu", ("vllm",), census, {"date": "2026-11-30"}, {"vllm/x.py:f": "varies"})
    path = tmp_path / "m.cpu.census.json"
    path.write_text(text)
    b = load_baseline(path)
    assert b.census == census and b.roots == ("vllm",) and b.excluded == {"vllm/x.py:f": "varies"}
    assert text.index('"640x480"') < text.index('"800x400"')
    line = next(t for t in text.splitlines() if "vllm/b.py:g" in t)
    assert line.strip() == '"vllm/b.py:g": {"aten::add": 1, "aten::mm": 2}'
    assert json.loads(text)["schema"] == "guard/census"


@pytest.mark.parametrize(("patch", "key"), [
    (lambda d: d.update(schema="x"), "schema"),
    (lambda d: d.update(schema_version=9), "schema_version"),
    (lambda d: d["census"].update({"640by480": {}}), "census.640by480"),
    (lambda d: d["census"]["640x480"].update({"vllm/f.py:f": {"aten::add": -1}}), "census.640x480.vllm/f.py:f"),
])
def test_bad_baseline_names_the_key(tmp_path: Path, patch, key: str) -> None:
    data = json.loads(render_baseline("m", "cpu", ("vllm",), {"640x480": dict(BASE)}, {}, {}))
    patch(data)
    assert_refused_naming(tmp_path / "b.json", data, key)


def assert_refused_naming(path: Path, data: dict, key: str) -> None:
    """``data`` written as a census baseline file at ``path`` is refused, naming the file and ``key``."""
    path.write_text(json.dumps(data, indent=1))
    with pytest.raises(ConfigError) as e:
        load_baseline(path)
    assert e.value.key == key and str(path) in str(e.value)


def test_missing_baseline_says_how_to_write_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="update-thresholds"):
        load_baseline(tmp_path / "none.json")


# ----------------------------------------------------------------------------- YAML
def _yaml_with_census(tmp_path: Path, census: dict) -> Path:
    from tests.conftest import SHIPPED_THRESHOLDS

    data = yaml.safe_load(SHIPPED_THRESHOLDS.read_text())
    data["profiles"]["cpu"]["budgets"]["census"] = census
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_census_rule_parses_with_defaults_and_resolves_the_baseline(tmp_path: Path) -> None:
    rule = load_thresholds(_yaml_with_census(tmp_path, {"baseline": "t.cpu.census.json"})).profile("cpu").census
    assert rule.baseline == tmp_path / "t.cpu.census.json"
    assert rule.watch == DEFAULT_WATCH and rule.roots == ("vllm",) and rule.exclude == {}


@pytest.mark.parametrize(("census", "key", "text"), [
    ({"baseline": "b.json", "max_groth_pct": 5}, "census.max_groth_pct", "did you mean `max_growth_pct`"),
    ({"max_growth_pct": 5}, "census.baseline", "missing required key"),
    ({"baseline": "b.json", "min_growth_calls": -1}, "census.min_growth_calls", "must be >= 0"),
    ({"baseline": "b.json", "exclude": {"vllm/a.py:f": None}}, "census.exclude.vllm/a.py:f", "non-empty string"),
    ({"baseline": "b.json", "exclude": {"f": "why"}}, "census.exclude.f", "file:qualname"),
    ({"baseline": "b.json", "roots": ["/abs"]}, "census.roots[0]", "relative"),
    ({"baseline": "b.json", "watch": "aten::nonzero"}, "census.watch", "list"),
])
def test_census_rule_errors_name_file_line_and_key(tmp_path: Path, census: dict, key: str, text: str) -> None:
    path = _yaml_with_census(tmp_path, census)
    with pytest.raises(ConfigError) as e:
        load_thresholds(path)
    assert e.value.key.endswith(key) and e.value.line and text in str(e.value)


# ----------------------------------------------------------------------------- mutants
def _installed_source(module: str) -> tuple[str, str]:
    origin = importlib.util.find_spec(module).origin
    return Path(origin).read_text(encoding="utf-8"), origin


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_every_mutant_applies_to_the_installed_vllm_and_keeps_its_function(name: str) -> None:
    m = MUTANTS[name]
    source, origin = _installed_source(m.module)
    edited = mutate(source, m, origin)
    assert edited != source
    code = compile(edited, origin, "exec", dont_inherit=True)
    qualnames = set()
    stack = [code]
    while stack:
        c = stack.pop()
        qualnames.add(c.co_qualname)
        stack += [k for k in c.co_consts if hasattr(k, "co_qualname")]
    assert m.function.rsplit(":", 1)[1] in qualnames
    assert m.function.split(":")[0] == m.module.replace(".", "/") + ".py"


def test_mutants_cover_different_functions_a_clean_rewrite_and_refactors_in_three_files() -> None:
    failing = [m for m in MUTANTS.values() if m.expect == "fail"]
    assert len(failing) >= 4 and len({m.function for m in failing}) == len(failing)
    passing = [m for m in MUTANTS.values() if m.expect == "pass"]
    assert "rewrite-clean" in {m.name for m in passing}
    moves = [m for m in passing if m.name.startswith("move-")]
    assert len(moves) >= 3 and len({m.module for m in moves}) >= 3  # each in its own file


def test_a_mutant_that_no_longer_applies_is_an_invalid_run() -> None:
    m = Mutant("x", "vllm.x", "vllm/x.py:f", "fail", "", (Edit("not in the file", "y"),))
    with pytest.raises(InvalidRunError, match="no longer applies"):
        mutate("def f(): pass\n", m, "x.py")


@pytest.mark.parametrize("size", ["640x480", "800x400"])
def test_recorded_request_matches_the_committed_baseline(size: str) -> None:
    """The fixture (recorded by benchmarks/census_stability.py in one engine) and the committed
    baseline (written by update-thresholds from a guard check in another) agree exactly: the census
    is the same across engine processes. After re-baselining for a new vLLM, re-record with
    `benchmarks/census_stability.py --runs 1 --save-events tests/fixtures/profiles`."""
    from tests.conftest import SHIPPED_THRESHOLDS

    rule = load_thresholds(SHIPPED_THRESHOLDS).profile("cpu").census
    baseline = load_baseline(rule.baseline)
    census = count_functions(census_events(size), rule.roots, QualnameResolver())
    assert compare(rule, tuple(int(x) for x in size.split("x")), baseline.census[size], census) == []
    assert counts_only(census) == baseline.census[size]


def test_comprehensions_fold_into_the_function_that_wrote_them() -> None:
    stack = ("vllm/m.py(9): <listcomp>", "vllm/m.py(5): forward")
    resolve = {(9, "<listcomp>"): "Enc.forward.<locals>.<listcomp>", (5, "forward"): "Enc.forward"}
    assert function_of(stack, ("vllm",), lambda f, line, n: resolve[(line, n)]) == "vllm/m.py:Enc.forward"
    assert fold("A.f.<locals>.g.<locals>.<genexpr>") == "A.f.<locals>.g"
    assert folded({"vllm/m.py:A.f": {"aten::add": 1}, "vllm/m.py:A.f.<locals>.<listcomp>": {"aten::add": 2}}) == \
        {"vllm/m.py:A.f": {"aten::add": 3}}


def test_a_baseline_file_holds_counts_not_where_they_ran(tmp_path: Path) -> None:
    import dataclasses

    from guard.config.census import plan_census
    from guard.model.readings import size
    from tests.conftest import SHIPPED_THRESHOLDS

    cpu = load_thresholds(SHIPPED_THRESHOLDS).profile("cpu")
    profile = dataclasses.replace(cpu, census=dataclasses.replace(cpu.census, baseline=tmp_path / "m.census.json"))
    census = {size(s): {"vllm/p.py:f": _in_processing({"aten::view": 2})} for s in profile.workload.profile_image_sizes}
    plan = plan_census(profile, "m", census, provenance={"date": "2026-12-06"}, allow_increase=True,
                       results_path=tmp_path / "results.json")
    assert "aten::view" in plan.new_text and INPUT_CALLS not in plan.new_text
