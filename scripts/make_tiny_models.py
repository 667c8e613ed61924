"""Build guard's tiny random-weight checkpoints for vLLM vision architectures (issue #42).

Each folder holds text files only: config.json made by the architecture's own config class in the
installed ``transformers``, a small local tokenizer (byte-level BPE without merges, so every UTF-8 byte
is one token, plus the special tokens the model's processor needs), and the processor's own
preprocessor/processor/chat-template files written by ``save_pretrained`` of the real processor
classes. No weights: vLLM loads them with ``load_format="dummy"`` (random weights). Nothing comes
from the HuggingFace Hub.

Every model is shrunk to a couple of layers with small hidden sizes, vision towers included, and its
image processor's pixel limits are kept such that one image's tokens fit ``max_model_len`` 2048.

    uv run --extra cpu python scripts/make_tiny_models.py                 # all, into guard/models/
    uv run --extra cpu python scripts/make_tiny_models.py --only qwen2.5-vl --out /tmp/m
"""

from __future__ import annotations

import argparse
import json
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

ROOT = Path(__file__).resolve().parent.parent / "guard" / "models"

VOCAB = 512  # >= 256 bytes + every model's special tokens; the LM's embedding/lm_head rows
LM = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
          num_key_value_heads=2, head_dim=32, vocab_size=VOCAB, max_position_embeddings=4096,
          rms_norm_eps=1e-6)


# --------------------------------------------------------------------------------------------------
# shared pieces


def make_tokenizer(specials: list[str], *, bos: str | None, eos: str, pad: str, unk: str | None = None,
                   named: dict[str, str] | None = None, chat_template: str | None = None,
                   add_bos: bool = False, fast_cls=None, **init):
    """Byte-level BPE with no merges, specials first (ids 0..n-1), wrapped as a transformers fast
    tokenizer. ``named`` become ``extra_special_tokens`` (tokenizer.image_token etc., which several
    processors read)."""
    from transformers import PreTrainedTokenizerFast

    specials = list(dict.fromkeys(specials))
    vocab = {tok: i for i, tok in enumerate(specials)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    assert len(vocab) <= VOCAB, len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    kwargs = dict(tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad, unk_token=unk,
                  model_max_length=4096, clean_up_tokenization_spaces=False, **init)
    if named:
        kwargs["extra_special_tokens"] = named
    if chat_template:
        kwargs["chat_template"] = chat_template
    hf = (fast_cls or PreTrainedTokenizerFast)(**kwargs)
    hf.add_bos_token = add_bos
    hf.add_eos_token = False
    return hf


def tid(tok, token: str) -> int:
    i = tok.convert_tokens_to_ids(token)
    assert isinstance(i, int) and i != tok.unk_token_id, token
    return i


def save(out: Path, config, processor) -> None:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    config.save_pretrained(out)
    processor.save_pretrained(out)
    # transformers writes the dtype it was given; keep the file free of a version stamp so that a
    # rebuild with another transformers version does not churn every config
    for name in ("config.json", "processor_config.json", "preprocessor_config.json",
                 "video_preprocessor_config.json", "tokenizer_config.json"):
        p = out / name
        if p.exists():
            d = json.loads(p.read_text())
            d.pop("transformers_version", None)
            for sub in d.values():
                if isinstance(sub, dict):
                    sub.pop("transformers_version", None)
            p.write_text(json.dumps(d, indent=2, ensure_ascii=False, sort_keys=False) + "\n")


# ChatML, as Qwen2.5-VL/Qwen3-VL/InternVL/LLaVA-OneVision write it; `image` is the text an image part becomes
def chatml(image: str, system: str | None = None) -> str:
    sys = ("{% if messages[0]['role'] != 'system' %}<|im_start|>system\n" + system + "<|im_end|>\n{% endif %}"
           if system else "")
    return (sys + "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
            "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
            "{% for c in message['content'] %}{% if c['type'] in ('image', 'image_url') %}" + image +
            "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}"
            "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                 "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
QWEN_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


def qwen_tokenizer(extra: list[str] = (), **kw):
    return make_tokenizer(QWEN_SPECIALS + list(extra), bos=None, eos="<|im_end|>", pad="<|endoftext|>",
                          chat_template=chatml(QWEN_IMAGE), **kw)


def qwen_vision_ids(tok) -> dict[str, int]:
    return dict(image_token_id=tid(tok, "<|image_pad|>"), video_token_id=tid(tok, "<|video_pad|>"),
                vision_start_token_id=tid(tok, "<|vision_start|>"), vision_end_token_id=tid(tok, "<|vision_end|>"))


# --------------------------------------------------------------------------------------------------
# one builder per architecture; each returns the prompt guard should send (one image, then text)


def qwen2_5_vl(out: Path) -> str:
    from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLProcessor, Qwen2VLImageProcessor,
                              Qwen2VLVideoProcessor)

    tok = qwen_tokenizer()
    config = Qwen2_5_VLConfig(
        architectures=["Qwen2_5_VLForConditionalGeneration"],
        text_config=dict(**LM, hidden_act="silu", bos_token_id=tid(tok, "<|endoftext|>"),
                         eos_token_id=tid(tok, "<|im_end|>"), pad_token_id=tid(tok, "<|endoftext|>"),
                         rope_parameters=dict(rope_type="default", rope_theta=1e6,
                                              mrope_section=[4, 6, 6])),  # real [16, 24, 24], /4
        # window attention in block 0, full attention in block 1, as the real tower alternates
        vision_config=dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                           fullatt_block_indexes=[1], out_hidden_size=LM["hidden_size"]),
        tie_word_embeddings=False,
        dtype="bfloat16",
        **qwen_vision_ids(tok),
    )
    # The real model's limits: 4..16384 merged tokens. Capped at 1024 tokens (28x28 px each) so
    # that vLLM's largest dummy image fits max_model_len 2048; 640x480 and 800x400 stay unscaled.
    pixels = dict(min_pixels=4 * 28 * 28, max_pixels=1024 * 28 * 28)
    image = Qwen2VLImageProcessor(**pixels, patch_size=14, merge_size=2, temporal_patch_size=2)
    video = Qwen2VLVideoProcessor(**pixels, patch_size=14, merge_size=2, temporal_patch_size=2)
    save(out, config, Qwen2_5_VLProcessor(image_processor=image, tokenizer=tok, video_processor=video,
                                          chat_template=tok.chat_template))
    return f"<|im_start|>user\n{QWEN_IMAGE}Free OCR.<|im_end|>\n<|im_start|>assistant\n"


def qwen3_vl(out: Path) -> str:
    from transformers import Qwen2VLImageProcessor, Qwen3VLConfig, Qwen3VLProcessor, Qwen3VLVideoProcessor

    tok = qwen_tokenizer()
    config = Qwen3VLConfig(
        architectures=["Qwen3VLForConditionalGeneration"],
        text_config=dict(**LM, hidden_act="silu", bos_token_id=tid(tok, "<|endoftext|>"),
                         eos_token_id=tid(tok, "<|im_end|>"), pad_token_id=tid(tok, "<|endoftext|>"),
                         rope_parameters=dict(rope_type="default", rope_theta=5e6, mrope_interleaved=True,
                                              mrope_section=[6, 5, 5])),  # real [24, 20, 20], /4
        # deepstack: features of vision block 0 are added into the first LM layers
        vision_config=dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, patch_size=16,
                           spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
                           deepstack_visual_indexes=[0], out_hidden_size=LM["hidden_size"]),
        tie_word_embeddings=False,
        dtype="bfloat16",
        **qwen_vision_ids(tok),
    )
    pixels = dict(size={"shortest_edge": 4 * 32 * 32, "longest_edge": 1024 * 32 * 32})
    image = Qwen2VLImageProcessor(**pixels, patch_size=16, merge_size=2, temporal_patch_size=2,
                                  image_mean=[0.5] * 3, image_std=[0.5] * 3)
    video = Qwen3VLVideoProcessor(**pixels, patch_size=16, merge_size=2, temporal_patch_size=2)
    save(out, config, Qwen3VLProcessor(image_processor=image, tokenizer=tok, video_processor=video,
                                       chat_template=tok.chat_template))
    return f"<|im_start|>user\n{QWEN_IMAGE}Free OCR.<|im_end|>\n<|im_start|>assistant\n"


REGISTRY: dict[str, Callable[[Path], str]] = {
    "qwen2.5-vl": qwen2_5_vl,
    "qwen3-vl": qwen3_vl,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT, help="parent folder; each model goes to tiny-<name>/")
    ap.add_argument("--only", action="append", choices=sorted(REGISTRY), help="build only this one (repeatable)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    prompts = {}
    for name in args.only or REGISTRY:
        out = args.out / f"tiny-{name}"
        prompts[name] = REGISTRY[name](out)
        (out / "guard_prompt.txt").write_text(prompts[name])
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
