"""How far each guarded tiny checkpoint is from the real model it stands for (issue #58).

A tiny checkpoint (guard/models/tiny-*) runs the real model's vLLM code on a CPU in seconds, but with 2
language and 2 vision layers where the real model has 12-40 and 12-32, no MoE layer where the real one
has them, another attention pattern, ... so a per-layer op a vLLM change adds shows as +2 in the census
instead of +N. This module compares each tiny config with the real model's published one, field by
field over the fields that decide which code runs and how often, and gives every difference its
explanation from one table (``EXPLAINED``), or none.

The real configs are data, read from public copies with their sources: guard/models/real-configs/
<model>.json. Their ``config`` keys are paths in the tiny's own layout (``text_config.num_hidden_layers``;
``processor:size.longest_edge`` in processor_config.json's image_processor; ``path~unit`` the repeating
unit of the list at path). Width-only fields (hidden sizes, heads, vocabulary) are not recorded there,
so they are never compared. A field whose real value was not found (``not_found``) is a difference too:
unknown is not "the same".

tests/test_real_structure.py fails on a difference without an explanation and on an explanation
without a difference; benchmarks/structure_gap.py prints the table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from guard.config.budgets import resolve_model

REAL_CONFIGS = Path(__file__).resolve().parents[1] / "models" / "real-configs"
PROCESSOR = "processor:"  # a path into processor_config.json's image_processor
UNIT = "~unit"  # a list's repeating unit: ["sliding", "full"] * 17 -> ["sliding", "full"]

# The kinds of explanation. NOT_YET_REAL is the gap itself: the next step of issue #58 makes the
# checkpoints real and deletes those entries (the test then insists the difference is gone).
NOT_YET_REAL = "not yet real"
KEPT_FOR_COST = "kept for cost"
SAME_CODE_PATH = "same code path"
NOT_FOUND = "real value not found"


class _Missing:
    def __repr__(self) -> str:
        return "(not found)"


MISSING = _Missing()  # the real value of a field listed under not_found


@dataclass(frozen=True)
class Explanation:
    kind: str
    why: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.why}"


@dataclass(frozen=True)
class Difference:
    model: str
    field: str
    tiny: object
    real: object  # MISSING where the real value was not found
    explanation: Explanation | None

    def __str__(self) -> str:
        said = str(self.explanation) if self.explanation else "UNEXPLAINED"
        return f"{self.model}: {self.field}: tiny {self.tiny!r}, real {self.real!r} -- {said}"


def _layers(tiny: int, real: int, what: str = "language") -> Explanation:
    return Explanation(NOT_YET_REAL, f"tiny has {tiny} {what} layers where the real model has {real} (issue #58)")


def _gap(why: str) -> Explanation:
    return Explanation(NOT_YET_REAL, f"{why} (issue #58)")


# Both guarded images (640x480 = 307,200 px, 800x400 = 320,000 px) lie inside every pixel limit below,
# the tiny's and the real one's, so a limit kept small changes how vLLM's dummy image is sized, not how
# a guarded request is tokenised.
_UNDER_BOTH_LIMITS = "both guarded images (307,200 and 320,000 px) lie inside the tiny's and the real limits"

EXPLAINED: dict[tuple[str, str], Explanation] = {
    # --- deepseek-ocr-2: the vision tower is vLLM's hard-coded full-size one in both (hardcoded_in_vllm)
    ("deepseek-ocr-2", "language_config.num_hidden_layers"): _layers(2, 12),
    ("deepseek-ocr-2", "language_config.first_k_dense_replace"): _gap(
        "tiny's 2 layers are both dense, so no MoE layer runs; the real model has 1 dense layer, then 11 MoE layers"),
    ("deepseek-ocr-2", "language_config.n_routed_experts"): _gap("tiny declares 2 routed experts, the real model 64"),
    ("deepseek-ocr-2", "language_config.num_experts_per_tok"): _gap("tiny routes a token to 1 expert, the real model to 6"),
    ("deepseek-ocr-2", "language_config.n_shared_experts"): _gap("tiny declares 1 shared expert, the real model 2"),
    ("deepseek-ocr-2", "language_config.topk_method"): _gap(
        "tiny leaves the router's top-k method unset, the real model says greedy; no MoE layer runs in the tiny"),
    ("deepseek-ocr-2", "vision_config.image_size"): Explanation(NOT_FOUND, (
        "no copy found shows the real vision_config; the tiny's 1024 is the global view's size vLLM's processor "
        "hard-codes (BASE_SIZE)")),
    ("deepseek-ocr-2", "tile_tag"): Explanation(NOT_FOUND, (
        "no copy found shows it; the tiny's 2D is the only value vLLM's DeepseekOCR2ForCausalLM accepts")),
    # --- qwen2-5-vl
    ("qwen2-5-vl", "text_config.num_hidden_layers"): _layers(2, 36),
    ("qwen2-5-vl", "text_config.rope_parameters.mrope_section"): Explanation(SAME_CODE_PATH, (
        "width only: the sections split head_dim/2 (tiny 16, real 64) in the same 1 : 1.5 : 1.5 ratio")),
    ("qwen2-5-vl", "tie_word_embeddings"): _gap("tiny unties the output embedding; the real model ties it to the input one"),
    ("qwen2-5-vl", "vision_config.depth"): _layers(2, 32, "vision"),
    ("qwen2-5-vl", "vision_config.fullatt_block_indexes"): _gap(
        "tiny: window attention in block 0, full attention in block 1; real: full attention in every 8th of 32 blocks"),
    ("qwen2-5-vl", "vision_config.tokens_per_second"): Explanation(SAME_CODE_PATH, (
        "spaces video frames' temporal positions only; guard sends images")),
    ("qwen2-5-vl", "processor:size.longest_edge"): Explanation(KEPT_FOR_COST, (
        f"caps an image at 1024 tokens so vLLM's largest dummy image fits max_model_len 2048; {_UNDER_BOTH_LIMITS}")),
    # --- qwen3-vl
    ("qwen3-vl", "text_config.num_hidden_layers"): _layers(2, 36),
    ("qwen3-vl", "text_config.rope_parameters.mrope_section"): Explanation(SAME_CODE_PATH, (
        "width only: the sections split head_dim/2 (tiny 16, real 64) in the same 6 : 5 : 5 ratio")),
    ("qwen3-vl", "tie_word_embeddings"): _gap("tiny unties the output embedding; the real model ties it to the input one"),
    ("qwen3-vl", "vision_config.depth"): _layers(2, 24, "vision"),
    ("qwen3-vl", "vision_config.deepstack_visual_indexes"): _gap(
        "tiny adds 1 vision block's features (block 0) into the language model, the real model 3 (blocks 5, 11, 17)"),
    ("qwen3-vl", "processor:size.shortest_edge"): Explanation(SAME_CODE_PATH, (
        f"tiny lets an image shrink to 4 tokens, the real model to 64; {_UNDER_BOTH_LIMITS}")),
    ("qwen3-vl", "processor:size.longest_edge"): Explanation(KEPT_FOR_COST, (
        f"caps an image at 1024 tokens so vLLM's largest dummy image fits max_model_len 2048; {_UNDER_BOTH_LIMITS}")),
    # --- glm-4-1v
    ("glm-4-1v", "text_config.num_hidden_layers"): _layers(2, 40),
    ("glm-4-1v", "text_config.rope_parameters.mrope_section"): Explanation(SAME_CODE_PATH, (
        "width only: the sections split the rotated half of head_dim (tiny 8, real 32) in the same 2 : 3 : 3 ratio")),
    ("glm-4-1v", "vision_config.depth"): _layers(2, 24, "vision"),
    ("glm-4-1v", "processor:size.longest_edge"): Explanation(NOT_FOUND, (
        "no copy of the real preprocessor_config.json found; the tiny caps an image at 1024 tokens to fit max_model_len 2048")),
    # --- internvl
    ("internvl", "text_config.num_hidden_layers"): _layers(2, 24),
    ("internvl", "text_config.rope_parameters.rope_type"): _gap(
        "tiny's language model uses plain RoPE, the real one dynamic NTK scaling (factor 2): another rotary class in vLLM"),
    ("internvl", "vision_config.num_hidden_layers"): _layers(2, 24, "vision"),
    ("internvl", "vision_config.image_size"): Explanation(KEPT_FOR_COST, (
        "224 px tiles give 64 tokens a tile instead of 256, so 13 tiles (640x480) fit max_model_len 2048")),
    ("internvl", "image_seq_length"): Explanation(KEPT_FOR_COST, "the tokens of one 224 px tile (the real 448 px tile: 256)"),
    # --- minicpm-v
    ("minicpm-v", "tie_word_embeddings"): _gap("tiny unties the output embedding; the real model ties it to the input one"),
    ("minicpm-v", "image_size"): Explanation(SAME_CODE_PATH, (
        "vLLM 0.32.0's minicpmv4_6.py does not read the top-level image_size; slicing follows the processor's scale_resolution")),
    ("minicpm-v", "text_config.full_attention_interval"): _gap(
        "tiny's 2 layers are 1 linear-attention (Gated DeltaNet) and 1 full-attention layer; the real model has a "
        "full-attention layer every 4th"),
    ("minicpm-v", "text_config.attn_output_gate"): Explanation(SAME_CODE_PATH, (
        "absent in the tiny, and vLLM's qwen3_next.py then defaults it to True, the real value")),
    ("minicpm-v", "vision_config.num_hidden_layers"): _layers(2, 27, "vision"),
    ("minicpm-v", "vision_config.image_size"): _gap(
        "tiny's SigLIP position table covers 448 px (32x32 patches), the real one 980 px (70x70)"),
    ("minicpm-v", "text_config.num_hidden_layers"): Explanation(NOT_FOUND, (
        "the indexed Hub page ends inside layer_types; the tiny has 2 layers")),
    ("minicpm-v", "insert_layer_id"): Explanation(NOT_FOUND, (
        "past the indexed page's end; the tiny merges windows after vision layer 0 of 2")),
    ("minicpm-v", "downsample_mode"): Explanation(NOT_FOUND, "past the indexed page's end; the tiny says 16x"),
    # --- llava-onevision
    ("llava-onevision", "text_config.num_hidden_layers"): _layers(2, 24),
    ("llava-onevision", "vision_config.image_size"): Explanation(KEPT_FOR_COST, (
        "192 px tiles: 144 tokens a tile instead of 729, so an anyres grid of tiles fits max_model_len 2048")),
    ("llava-onevision", "vision_config.patch_size"): Explanation(KEPT_FOR_COST, (
        "16 px patches cut the 192 px tile into a whole 12x12 grid (14 px would not divide 192)")),
    ("llava-onevision", "vision_config.num_hidden_layers"): _layers(2, 26, "vision"),
    ("llava-onevision", "processor:image_grid_pinpoints"): Explanation(NOT_FOUND, (
        "the real grid was seen only in part (384 px steps); the tiny's is 192 px steps up to 4x4 tiles")),
    ("llava-onevision", "tie_word_embeddings"): Explanation(NOT_FOUND, "not in any excerpt found; the tiny unties it"),
    # --- gemma3
    ("gemma3", "text_config.num_hidden_layers"): _layers(2, 34),
    ("gemma3", "text_config.sliding_window"): Explanation(SAME_CODE_PATH, (
        "both windows (512, 1024) are longer than the guarded prompt (92 tokens): no sliding layer masks anything in either")),
    ("gemma3", "text_config.layer_types~unit"): _gap(
        "tiny alternates sliding-window and global attention 1 : 1, the real model 5 : 1"),
    ("gemma3", "text_config.rope_parameters.full_attention.rope_type"): _gap(
        "tiny's global layers use plain RoPE, the real ones linear scaling (factor 8): another rotary class in vLLM"),
    ("gemma3", "vision_config.num_hidden_layers"): _layers(2, 27, "vision"),
    ("gemma3", "vision_config.image_size"): Explanation(KEPT_FOR_COST, (
        "224 px: 256 patches pooled to 64 tokens, instead of 4096 pooled to 256")),
    ("gemma3", "mm_tokens_per_image"): Explanation(KEPT_FOR_COST, "follows from the 224 px image (the real 896 px: 256)"),
    ("gemma3", "processor:do_pan_and_scan"): Explanation(NOT_FOUND, (
        "no copy of the real processor config found; the tiny turns pan-and-scan off")),
    # --- llava-1-5
    ("llava-1-5", "text_config.num_hidden_layers"): _layers(2, 32),
    ("llava-1-5", "vision_config.num_hidden_layers"): _layers(2, 24, "vision"),
    ("llava-1-5", "vision_config.image_size"): Explanation(KEPT_FOR_COST, "224 px: 256 tokens an image instead of 576"),
}


def real_record(model: str, folder: Path = REAL_CONFIGS) -> dict:
    """guard/models/real-configs/<model>.json: source, read_on, config, not_found, ..."""
    return json.loads((folder / f"{model}.json").read_text(encoding="utf-8"))


def tiny_folder(model: str) -> Path:
    """The embedded checkpoint the model's cpu profile runs (its engine.model, `guard:tiny-...`)."""
    from guard.config.loading import load_thresholds
    from guard.config.models import resolve

    (_, path), = resolve(model)
    return Path(resolve_model(load_thresholds(path).profiles["cpu"].engine.model))


def repeating_unit(items: list) -> list:
    """The shortest prefix the list repeats: [a, b, a, b] -> [a, b]; [a, b, c] -> [a, b, c]."""
    for n in range(1, len(items) + 1):
        if all(items[i] == items[i % n] for i in range(len(items))):
            return items[:n]
    return items


def value_at(config: dict, processor: dict, field: str) -> object:
    """A field's value in a tiny checkpoint (None where it is not set), by the paths real-configs use."""
    unit = field.endswith(UNIT)
    path = field.removesuffix(UNIT)
    node: object = processor.get("image_processor", {}) if path.startswith(PROCESSOR) else config
    for key in path.removeprefix(PROCESSOR).split("."):
        node = node.get(key) if isinstance(node, dict) else None
    return repeating_unit(node) if unit and isinstance(node, list) else node


def compare(model: str, config: dict, processor: dict, real: dict,
            explained: dict[tuple[str, str], Explanation] = EXPLAINED) -> list[Difference]:
    """Every recorded field where the tiny differs from the real model, and every field whose real
    value was not found, each with its explanation or None."""
    out = []
    for field, want in real.get("config", {}).items():
        have = value_at(config, processor, field)
        if have != want:
            out.append(Difference(model, field, have, want, explained.get((model, field))))
    for field in real.get("not_found", {}):
        out.append(Difference(model, field, value_at(config, processor, field), MISSING, explained.get((model, field))))
    return out


def differences(model: str) -> list[Difference]:
    folder = tiny_folder(model)
    processor_file = folder / "processor_config.json"
    processor = json.loads(processor_file.read_text(encoding="utf-8")) if processor_file.exists() else {}
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    return compare(model, config, processor, real_record(model))


def unused_explanations(found: list[Difference],
                        explained: dict[tuple[str, str], Explanation] = EXPLAINED) -> list[tuple[str, str]]:
    """Entries of the table no difference needs any more: a gap that was closed must leave the table."""
    needed = {(d.model, d.field) for d in found}
    return sorted(key for key in explained if key not in needed)


def real_structured(model: str, explained: dict[tuple[str, str], Explanation] = EXPLAINED) -> dict:
    """The tiny checkpoint's config.json with every "not yet real" field of its config set to the real
    model's recorded value: real in structure, tiny in width (issue #58). Processor fields and fields
    whose real value was not found stay as they are. A checkpoint folder is this config beside the
    tiny's tokenizer files."""
    folder = tiny_folder(model)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    for d in differences(model):
        why = explained.get((model, d.field))
        if why is None or why.kind != NOT_YET_REAL or d.real is MISSING or d.field.startswith(PROCESSOR) or UNIT in d.field:
            continue
        node = config
        *parents, leaf = d.field.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = d.real
    return config

