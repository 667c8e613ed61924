"""Build guard's embedded DeepSeek-OCR-2 checkpoint: config and tokenizer, no weights.

vLLM loads it with ``load_format="dummy"`` (random weights), so it is a few KB in git
yet exercises the real DeepSeek-OCR-2 code path: the vision tower (SAM ViT-B plus the
24-layer Qwen2 "DeepEncoder-V2", whose attention mask PR #49531 fixed) is hard-coded
full size in vLLM whatever the config says; only the language model is shrunk, in width: its depth,
MoE layers and experts are the real model's (``make_real_structured``, issue #58).

    uv run --extra cpu python scripts/make_tiny_model.py   # rewrites guard/models/tiny-deepseek-ocr2
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from guard.config.structure import make_real_structured

OUT = Path(__file__).resolve().parent.parent / "guard" / "models" / "tiny-deepseek-ocr2"

BOS, EOS, PAD, IMAGE = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<image>"
LM_HIDDEN = 128

CONFIG = {
    "architectures": ["DeepseekOCR2ForCausalLM"],
    "model_type": "deepseek_vl_v2",
    "tile_tag": "2D",  # vLLM's default string is rejected by the model ("Only 2D ...")
    "global_view_pos": "head",
    "candidate_resolutions": [[1024, 1024]],
    "vision_config": {"image_size": 1024, "model_type": "vision"},
    "projector_config": {
        "model_type": "mlp_projector",
        "projector_type": "linear",
        "input_dim": 896,  # width of the Qwen2 encoder's output
        "n_embed": LM_HIDDEN,
    },
    # DeepSeek-V2 without MLA and without MoE: the smallest language model vLLM accepts here.
    "language_config": {
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "vocab_size": 512,
        "hidden_size": LM_HIDDEN,
        "intermediate_size": 256,
        "moe_intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "kv_lora_rank": None,
        "q_lora_rank": None,
        "qk_nope_head_dim": 0,
        "qk_rope_head_dim": 0,
        "v_head_dim": 0,
        "use_mla": False,
        "first_k_dense_replace": 2,  # >= num_hidden_layers: every layer dense, no MoE
        "n_routed_experts": 2,
        "n_shared_experts": 1,
        "num_experts_per_tok": 1,
        "n_group": 1,
        "topk_group": 1,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
        "torch_dtype": "bfloat16",
    },
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
    "torch_dtype": "bfloat16",
}


def build_tokenizer() -> Tokenizer:
    """Byte-level BPE with no merges: every UTF-8 byte is one token, specials first."""
    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate([BOS, EOS, PAD, IMAGE])}
    for ch in sorted(byte_chars):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([BOS, EOS, PAD, IMAGE])
    return tok


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "config.json").write_text(json.dumps(CONFIG, indent=2, ensure_ascii=False) + "\n")
    make_real_structured("deepseek-ocr-2", OUT)  # 12 layers, 11 of them MoE: the real language model's structure
    build_tokenizer().save(str(OUT / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
    }
    (OUT / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n")
    specials = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "additional_special_tokens": [IMAGE]}
    (OUT / "special_tokens_map.json").write_text(json.dumps(specials, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
