"""Each tiny checkpoint against the real model it stands for (guard.config.structure, issue #58).

Every difference in a code-path-deciding field must have an explanation in structure.EXPLAINED, and
every explanation must still have its difference: when a checkpoint is made real, its "not yet real"
entries have to leave the table.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import shutil
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
        assert script.main(["qwen2.5-vl", "--kind", structure.KEPT_FOR_COST]) == 0
    out = capsys.readouterr().out
    assert "processor:size.longest_edge: tiny 802816, real 12845056" in out
    assert "mrope_section" not in out  # same code path: filtered out by --kind
    assert out.rstrip().endswith("1 kept for cost across 1 model(s)")


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
def test_every_shipped_checkpoint_is_real_in_structure(model):
    """Nothing is left for make_real_structured to set: every recorded real value is in the shipped
    config.json, except the differences the table keeps on purpose (and none is "not yet real")."""
    shipped = json.loads((structure.tiny_folder(model) / "config.json").read_text(encoding="utf-8"))
    assert structure.real_structured(model) == shipped
    open_gaps = [str(d) for d in structure.differences(model)
                 if d.explanation is None or d.explanation.kind not in structure.KEPT_ON_PURPOSE]
    assert open_gaps == []


def _shrunk_copy(model: str, tmp_path: Path, edit) -> Path:
    """The shipped checkpoint folder copied, its config.json edited back towards the old 2-layer tiny."""
    folder = tmp_path / structure.tiny_folder(model).name
    shutil.copytree(structure.tiny_folder(model), folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    edit(config)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def test_real_structured_repeats_a_recorded_unit_to_the_real_depth(tmp_path):
    """gemma3 back at 2 layers, 1 : 1 sliding : global, plain RoPE: the real 34 layers come back in
    the recorded 5 : 1 pattern with linear-scaled RoPE (factor 8), the 224 px image (kept for cost) stays."""
    def two_layers(c):
        c["text_config"].update(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
        c["text_config"]["rope_parameters"]["full_attention"] = {"rope_type": "default", "rope_theta": 1e6}
        c["vision_config"]["num_hidden_layers"] = 2

    config = structure.real_structured("gemma3", _shrunk_copy("gemma3", tmp_path, two_layers))
    text = config["text_config"]
    assert text["num_hidden_layers"] == 34 and len(text["layer_types"]) == 34
    assert text["layer_types"][:12] == (["sliding_attention"] * 5 + ["full_attention"]) * 2
    assert text["layer_types"].count("full_attention") == 5  # layers 6, 12, ... 30; 31-34 sliding
    assert text["rope_parameters"]["full_attention"] == {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}
    assert config["vision_config"]["num_hidden_layers"] == 27 and config["vision_config"]["image_size"] == 224


def test_real_structured_grows_layer_types_without_a_recorded_unit_by_their_own(tmp_path):
    def two_layers(c):
        c["text_config"].update(num_hidden_layers=2, layer_types=["full_attention", "full_attention"])

    config = structure.real_structured("internvl", _shrunk_copy("internvl", tmp_path, two_layers))
    assert config["text_config"]["layer_types"] == ["full_attention"] * 24


def test_real_structured_refuses_a_processor_field_it_cannot_write():
    kept = {k: v for k, v in EXPLAINED.items() if k != ("qwen2-5-vl", "processor:size.longest_edge")}
    with pytest.raises(ValueError, match=r"qwen2-5-vl: processor:size\.longest_edge: tiny 802816, real 12845056"):
        structure.real_structured("qwen2-5-vl", explained=kept)


def test_the_tiny_deepseek_ocr2_has_the_real_moe_language_model():
    config = json.loads((structure.tiny_folder("deepseek-ocr-2") / "config.json").read_text(encoding="utf-8"))
    lm = config["language_config"]
    assert lm["num_hidden_layers"] == 12 and lm["first_k_dense_replace"] == 1  # 1 dense layer, then 11 MoE
    assert (lm["n_routed_experts"], lm["num_experts_per_tok"], lm["n_shared_experts"]) == (64, 6, 2)
    assert lm["hidden_size"] == 128  # tiny in width
