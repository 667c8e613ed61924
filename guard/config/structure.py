"""Each guarded tiny checkpoint against the real model it stands for (issue #58).

A tiny checkpoint (guard/models/tiny-*) runs the real model's vLLM code on a CPU in seconds: tiny in
width (hidden sizes, heads, vocabulary), real in structure (layer counts, layer-type patterns, experts,
the fields that decide which code runs and how often), so a per-layer op a vLLM change adds shows in
the census as many times as the real model would run it. This module compares each tiny config with
the real model's published one, field by field over those fields, and gives every difference its
explanation from one table (``EXPLAINED``), or none. ``make_real_structured`` writes a checkpoint's
config real in structure from the records (scripts/make_tiny_model(s).py call it).

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

# The kinds of explanation. NOT_YET_REAL is a gap to close: make_real_structured closes it, and the
# entry must then leave the table (the test insists the difference is gone). The shipped checkpoints
# have none; the other three kinds are differences the tiny keeps on purpose.
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


# Both guarded images (640x480 = 307,200 px, 800x400 = 320,000 px) lie inside every pixel limit below,
# the tiny's and the real one's, so a limit kept small changes how vLLM's dummy image is sized, not how
# a guarded request is tokenised.
_UNDER_BOTH_LIMITS = "both guarded images (307,200 and 320,000 px) lie inside the tiny's and the real limits"

EXPLAINED: dict[tuple[str, str], Explanation] = {
    # --- deepseek-ocr-2: the vision tower is vLLM's hard-coded full-size one in both (hardcoded_in_vllm)
    ("deepseek-ocr-2", "vision_config.image_size"): Explanation(NOT_FOUND, (
        "no copy found shows the real vision_config; the tiny's 1024 is the global view's size vLLM's processor "
        "hard-codes (BASE_SIZE)")),
    ("deepseek-ocr-2", "tile_tag"): Explanation(NOT_FOUND, (
        "no copy found shows it; the tiny's 2D is the only value vLLM's DeepseekOCR2ForCausalLM accepts")),
    # --- qwen2-5-vl
    ("qwen2-5-vl", "text_config.rope_parameters.mrope_section"): Explanation(SAME_CODE_PATH, (
        "width only: the sections split head_dim/2 (tiny 16, real 64) in the same 1 : 1.5 : 1.5 ratio")),
    ("qwen2-5-vl", "vision_config.tokens_per_second"): Explanation(SAME_CODE_PATH, (
        "spaces video frames' temporal positions only; guard sends images")),
    ("qwen2-5-vl", "processor:size.longest_edge"): Explanation(KEPT_FOR_COST, (
        f"caps an image at 1024 tokens so vLLM's largest dummy image fits max_model_len 2048; {_UNDER_BOTH_LIMITS}")),
    # --- qwen3-vl
    ("qwen3-vl", "text_config.rope_parameters.mrope_section"): Explanation(SAME_CODE_PATH, (
        "width only: the sections split head_dim/2 (tiny 16, real 64) in the same 6 : 5 : 5 ratio")),
    ("qwen3-vl", "processor:size.shortest_edge"): Explanation(SAME_CODE_PATH, (
        f"tiny lets an image shrink to 4 tokens, the real model to 64; {_UNDER_BOTH_LIMITS}")),
    ("qwen3-vl", "processor:size.longest_edge"): Explanation(KEPT_FOR_COST, (
        f"caps an image at 1024 tokens so vLLM's largest dummy image fits max_model_len 2048; {_UNDER_BOTH_LIMITS}")),
    # --- glm-4-1v
    ("glm-4-1v", "text_config.rope_parameters.mrope_section"): Explanation(SAME_CODE_PATH, (
        "width only: the sections split the rotated half of head_dim (tiny 8, real 32) in the same 2 : 3 : 3 ratio")),
    ("glm-4-1v", "processor:size.longest_edge"): Explanation(NOT_FOUND, (
        "no copy of the real preprocessor_config.json found; the tiny caps an image at 1024 tokens to fit max_model_len 2048")),
    # --- internvl
    ("internvl", "vision_config.image_size"): Explanation(KEPT_FOR_COST, (
        "224 px tiles give 64 tokens a tile instead of 256, so 13 tiles (640x480) fit max_model_len 2048")),
    ("internvl", "image_seq_length"): Explanation(KEPT_FOR_COST, "the tokens of one 224 px tile (the real 448 px tile: 256)"),
    # --- minicpm-v
    ("minicpm-v", "image_size"): Explanation(SAME_CODE_PATH, (
        "vLLM 0.32.0's minicpmv4_6.py does not read the top-level image_size; slicing follows the processor's scale_resolution")),
    ("minicpm-v", "text_config.attn_output_gate"): Explanation(SAME_CODE_PATH, (
        "absent in the tiny, and vLLM's qwen3_next.py then defaults it to True, the real value")),
    ("minicpm-v", "insert_layer_id"): Explanation(NOT_FOUND, (
        "past the indexed page's end; the tiny merges windows after vision layer 0 of 2")),
    ("minicpm-v", "downsample_mode"): Explanation(NOT_FOUND, "past the indexed page's end; the tiny says 16x"),
    # --- llava-onevision
    ("llava-onevision", "vision_config.image_size"): Explanation(KEPT_FOR_COST, (
        "192 px tiles: 144 tokens a tile instead of 729, so an anyres grid of tiles fits max_model_len 2048")),
    ("llava-onevision", "vision_config.patch_size"): Explanation(KEPT_FOR_COST, (
        "16 px patches cut the 192 px tile into a whole 12x12 grid (14 px would not divide 192)")),
    ("llava-onevision", "processor:image_grid_pinpoints"): Explanation(NOT_FOUND, (
        "the real grid was seen only in part (384 px steps); the tiny's is 192 px steps up to 4x4 tiles")),
    ("llava-onevision", "tie_word_embeddings"): Explanation(NOT_FOUND, "not in any excerpt found; the tiny unties it"),
    # --- gemma3
    ("gemma3", "text_config.sliding_window"): Explanation(SAME_CODE_PATH, (
        "both windows (512, 1024) are longer than the guarded prompt (92 tokens): no sliding layer masks anything in either")),
    ("gemma3", "vision_config.image_size"): Explanation(KEPT_FOR_COST, (
        "224 px: 256 patches pooled to 64 tokens, instead of 4096 pooled to 256")),
    ("gemma3", "mm_tokens_per_image"): Explanation(KEPT_FOR_COST, "follows from the 224 px image (the real 896 px: 256)"),
    ("gemma3", "processor:do_pan_and_scan"): Explanation(NOT_FOUND, (
        "no copy of the real processor config found; the tiny turns pan-and-scan off")),
    # --- llava-1-5
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


def read_checkpoint(folder: Path) -> tuple[dict, dict]:
    """A checkpoint folder's config.json and processor_config.json ({} where it has none)."""
    processor_file = folder / "processor_config.json"
    processor = json.loads(processor_file.read_text(encoding="utf-8")) if processor_file.exists() else {}
    return json.loads((folder / "config.json").read_text(encoding="utf-8")), processor


def differences(model: str) -> list[Difference]:
    config, processor = read_checkpoint(tiny_folder(model))
    return compare(model, config, processor, real_record(model))


def unused_explanations(found: list[Difference],
                        explained: dict[tuple[str, str], Explanation] = EXPLAINED) -> list[tuple[str, str]]:
    """Entries of the table no difference needs any more: a gap that was closed must leave the table."""
    needed = {(d.model, d.field) for d in found}
    return sorted(key for key in explained if key not in needed)


# Differences the tiny keeps on purpose: real_structured leaves them.
KEPT_ON_PURPOSE = (KEPT_FOR_COST, SAME_CODE_PATH, NOT_FOUND)


def _set(config: dict, path: str, value: object) -> None:
    node = config
    *parents, leaf = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


def _repeated(unit: list, n: int) -> list:
    return [unit[i % len(unit)] for i in range(n)]


def _fit_layer_types(node: object) -> None:
    """Every ``layer_types`` list beside a ``num_hidden_layers`` it no longer matches repeats its own
    repeating unit to the new depth (["full", "full"] -> 24 x "full")."""
    if not isinstance(node, dict):
        return
    types, layers = node.get("layer_types"), node.get("num_hidden_layers")
    if isinstance(types, list) and isinstance(layers, int) and len(types) != layers:
        node["layer_types"] = _repeated(repeating_unit(types), layers)
    for child in node.values():
        _fit_layer_types(child)


def real_structured(model: str, folder: Path | None = None,
                    explained: dict[tuple[str, str], Explanation] = EXPLAINED) -> dict:
    """A tiny checkpoint's config.json (in ``folder``; default: the shipped one) real in structure, tiny
    in width (issue #58): every recorded real value set, except the differences the table keeps on
    purpose (kept for cost, same code path, real value not found). A repeating unit (``path~unit``)
    is repeated to its sibling ``num_hidden_layers``, and a ``layer_types`` list the new depth
    outgrew repeats its own unit. Processor fields are the processor's files' business: a real
    processor value not kept on purpose is refused, not silently left."""
    config, processor = read_checkpoint(folder or tiny_folder(model))
    found = compare(model, config, processor, real_record(model), explained)
    pending = [d for d in found if d.real is not MISSING and not (d.explanation and d.explanation.kind in KEPT_ON_PURPOSE)]
    refused = [str(d) for d in pending if d.field.startswith(PROCESSOR)]
    if refused:
        raise ValueError("processor fields are not written by real_structured: " + "; ".join(refused))
    for d in pending:  # plain values first: a unit repeats to the depth they set
        if not d.field.endswith(UNIT):
            _set(config, d.field, d.real)
    for d in pending:
        if d.field.endswith(UNIT):
            path = d.field.removesuffix(UNIT)
            layers = value_at(config, processor, ".".join(path.split(".")[:-1] + ["num_hidden_layers"]))
            if not isinstance(layers, int):
                raise ValueError(f"{model}: {d.field}: no num_hidden_layers beside it to repeat the unit to")
            _set(config, path, _repeated(list(d.real), layers))
    _fit_layer_types(config)
    return config


def make_real_structured(model: str, folder: Path | None = None) -> Path:
    """Rewrite a checkpoint folder's config.json (default: the shipped one) real in structure, as
    scripts/make_tiny_model(s).py do after building it. Returns the file."""
    folder = folder or tiny_folder(model)
    config = real_structured(model, folder)
    path = folder / "config.json"
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path
