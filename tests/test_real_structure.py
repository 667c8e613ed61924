"""Each tiny checkpoint against the real model it stands for (guard.config.structure, issue #58).

Every difference in a code-path-deciding field must have an explanation in structure.EXPLAINED, and
every explanation must still have its difference: when a checkpoint is made real, its "not yet real"
entries have to leave the table.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import re
from pathlib import Path

import pytest

from guard.config import structure
from guard.config.models import names
from guard.config.structure import EXPLAINED, MISSING, NOT_YET_REAL, Explanation, compare, value_at
from tests.conftest import benchmark_script

MODELS = names()


def all_differences() -> list[structure.Difference]:
    return [d for model in MODELS for d in structure.differences(model)]


def test_every_guarded_model_has_a_real_config_with_its_source():
    recorded = {p.stem for p in structure.REAL_CONFIGS.glob("*.json")}
    assert recorded == set(MODELS), f"real-configs {sorted(recorded)}, guarded models {sorted(MODELS)}"
    for model in MODELS:
        real = structure.real_record(model)
        assert real["guard_model"] == model
        assert real["source"].strip() and real["checkpoint"].strip() and real["why_this_checkpoint"].strip(), model
        datetime.date.fromisoformat(real["read_on"])
        assert real["config"], f"{model}: no field recorded"
        assert not set(real["config"]) & set(real.get("not_found", {})), f"{model}: a field both found and not found"
        others = real.get("other_sources", {})
        for field, source in real.get("field_sources", {}).items():
            assert field in real["config"], f"{model}: field_sources names {field}, which config does not record"
            assert source in others, f"{model}: {field} comes from {source!r}, not one of other_sources {sorted(others)}"


def test_every_difference_from_the_real_model_is_explained():
    unexplained = [str(d) for d in all_differences() if d.explanation is None]
    assert unexplained == [], "tiny and real differ without an explanation in structure.EXPLAINED:\n" + "\n".join(unexplained)


def test_every_explanation_still_has_its_difference():
    unused = structure.unused_explanations(all_differences())
    assert unused == [], f"structure.EXPLAINED explains differences that are gone (delete them): {unused}"


def test_a_layer_count_gap_states_the_counts_it_explains():
    for d in all_differences():
        if d.explanation and d.explanation.kind == NOT_YET_REAL and re.search(r"(num_hidden_layers|depth)$", d.field):
            assert f"tiny has {d.tiny} " in d.explanation.why and f"has {d.real} " in d.explanation.why, str(d)


def test_a_difference_names_model_field_and_both_values():
    config = {"text_config": {"num_hidden_layers": 2, "hidden_size": 128}}
    real = {"config": {"text_config.num_hidden_layers": 36}, "not_found": {"vision_config.depth": "cut off"}}
    found = compare("some-model", config, {}, real, explained={})
    assert [(d.field, d.tiny, d.real) for d in found] == [("text_config.num_hidden_layers", 2, 36),
                                                          ("vision_config.depth", None, MISSING)]
    line = str(found[0])
    assert all(s in line for s in ("some-model", "text_config.num_hidden_layers", "tiny 2", "real 36", "UNEXPLAINED"))
    # explained: the same difference, now carrying its reason; an equal field is no difference
    why = {("some-model", "text_config.num_hidden_layers"): Explanation(NOT_YET_REAL, "2 vs 36")}
    assert compare("some-model", config, {}, real, explained=why)[0].explanation == why[("some-model", "text_config.num_hidden_layers")]
    assert compare("m", config, {}, {"config": {"text_config.num_hidden_layers": 2}}) == []


def test_an_explanation_for_a_closed_gap_is_reported_unused():
    found = compare("m", {"layers": 2}, {}, {"config": {"layers": 2}}, explained={})
    assert structure.unused_explanations(found, {("m", "layers"): Explanation(NOT_YET_REAL, "x")}) == [("m", "layers")]


def test_field_paths_reach_processor_files_and_repeating_units():
    config = {"text_config": {"layer_types": ["s", "s", "f"] * 4}}
    processor = {"image_processor": {"size": {"longest_edge": 802816}}}
    assert value_at(config, processor, "processor:size.longest_edge") == 802816
    assert value_at(config, processor, "text_config.layer_types~unit") == ["s", "s", "f"]
    assert value_at(config, processor, "text_config.missing.deeper") is None
    assert structure.repeating_unit(["a", "b", "c"]) == ["a", "b", "c"]


def test_the_tiny_checkpoint_is_the_one_the_cpu_profile_runs():
    assert structure.tiny_folder("qwen2-5-vl").name == "tiny-qwen2.5-vl"
    assert structure.tiny_folder("deepseek-ocr-2").name == "tiny-deepseek-ocr2"


def test_every_explanation_says_why_in_a_known_kind():
    kinds = {structure.NOT_YET_REAL, structure.KEPT_FOR_COST, structure.SAME_CODE_PATH, structure.NOT_FOUND}
    for key, e in EXPLAINED.items():
        assert e.kind in kinds and len(e.why) > 20, key
        assert (e.kind == NOT_YET_REAL) == ("issue #58" in e.why), key


def test_the_gap_script_prints_each_difference_with_its_reason(capsys):
    with benchmark_script("structure_gap") as script:
        assert script.main(["qwen2.5-vl", "--kind", NOT_YET_REAL]) == 0
    out = capsys.readouterr().out
    assert "vision_config.fullatt_block_indexes: tiny [1], real [7, 15, 23, 31]" in out
    assert "processor:size.longest_edge" not in out  # kept for cost: filtered out by --kind
    assert out.rstrip().endswith("4 not yet real across 1 model(s)")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")
def test_vllm_still_builds_deepseek_ocr2s_vision_tower_full_size():
    """The record's hardcoded_in_vllm holds only while vLLM ignores the checkpoint for the tower: if it
    starts reading the config, the tiny's tower shrinks with it and the record must change."""
    models = Path(importlib.util.find_spec("vllm").origin).parent / "model_executor" / "models"
    hard = structure.real_record("deepseek-ocr-2")["hardcoded_in_vllm"]
    ocr2 = (models / "deepseek_ocr2.py").read_text(encoding="utf-8")
    sam = hard["sam_vit_b"]
    assert f"depth={sam['depth']}," in ocr2 and f"window_size={sam['window_size']}," in ocr2
    assert f"global_attn_indexes={tuple(sam['global_attn_indexes'])}," in ocr2
    encoder = (models / "deepencoder2.py").read_text(encoding="utf-8")
    assert f"decoder_layer={hard['qwen2_encoder']['decoder_layer']}," in encoder


@pytest.mark.parametrize("model", MODELS)
def test_the_real_structured_config_closes_every_not_yet_real_gap_of_its_config(model):
    """real_structured sets each "not yet real" config field to the recorded real value; what stays
    different is only what it leaves by design (processor fields, repeating units, values not found)."""
    folder = structure.tiny_folder(model)
    processor_file = folder / "processor_config.json"
    processor = json.loads(processor_file.read_text()) if processor_file.exists() else {}
    left = compare(model, structure.real_structured(model), processor, structure.real_record(model))
    gaps = [d for d in left if d.explanation and d.explanation.kind == NOT_YET_REAL]
    assert all(d.field.startswith(structure.PROCESSOR) or structure.UNIT in d.field or d.real is MISSING for d in gaps), gaps
    assert len(left) <= len(structure.differences(model))


def test_deepseek_ocr2_real_structured_runs_moe_layers_in_config():
    config = structure.real_structured("deepseek-ocr-2")["language_config"]
    assert config["num_hidden_layers"] == 12 and config["first_k_dense_replace"] == 1  # 11 MoE layers
    assert (config["n_routed_experts"], config["num_experts_per_tok"], config["n_shared_experts"]) == (64, 6, 2)
    assert config["hidden_size"] == 128  # widths stay tiny
