"""Build guard's tiny random-weight checkpoints for vLLM vision architectures (issue #42).

Each folder holds text files only: config.json made by the architecture's own config class in the
installed ``transformers``, a small local tokenizer (byte-level BPE without merges, so every UTF-8 byte
is one token, plus the special tokens the model's processor needs), and the processor's own
preprocessor/processor/chat-template files written by ``save_pretrained`` of the real processor
classes. No weights: vLLM loads them with ``load_format="dummy"`` (random weights). Nothing comes
from the HuggingFace Hub.

Every model is tiny in width (small hidden sizes, heads, vocabulary), vision towers included, and its
image processor's pixel limits are kept such that one image's tokens fit ``max_model_len`` 2048. In
structure it is the real model (issue #58): each builder below writes a 2-layer config, then
``guard.config.structure.make_real_structured`` sets the depth, layer pattern, experts and the other
code-path-deciding fields to the real model's recorded values (guard/models/real-configs/).

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

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from guard.config.models import canonical
from guard.config.structure import make_real_structured

ROOT = Path(__file__).resolve().parent.parent / "guard" / "models"

VOCAB = 512  # >= 256 bytes + every model's special tokens; the LM's embedding/lm_head rows
LM = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
          num_key_value_heads=2, head_dim=32, vocab_size=VOCAB, max_position_embeddings=4096,
          rms_norm_eps=1e-6)


# --------------------------------------------------------------------------------------------------
# shared pieces


def make_tokenizer(specials: list[str], *, bos: str | None, eos: str, pad: str, unk: str | None = None,
                   named: dict[str, str] | None = None, chat_template: str | None = None,
                   spm: bool = False, **init):
    """A small local tokenizer, specials first (ids 0..n-1), wrapped as a transformers fast tokenizer.

    Default: byte-level BPE with no merges (GPT-2/Qwen style): every UTF-8 byte is one token.
    ``spm=True``: SentencePiece-style BPE as Gemma's (spaces as "▁", printable ASCII characters,
    <0xNN> byte fallback, and "\\n" runs of up to four as single tokens, which vLLM's Gemma 3
    processor looks up by their text).
    ``named`` become ``extra_special_tokens`` (tokenizer.image_token etc., which several processors
    read). It adds no BOS by itself: prompts and chat templates that need one write it."""
    from transformers import PreTrainedTokenizerFast

    specials = list(dict.fromkeys(specials))
    vocab = {tok: i for i, tok in enumerate(specials)}
    if spm:
        for piece in [f"<0x{b:02X}>" for b in range(256)] + ["▁"] + [chr(c) for c in range(33, 127)] + \
                     ["\n", "\n\n", "\n\n\n", "\n\n\n\n"]:
            vocab.setdefault(piece, len(vocab))
        merges = [("\n", "\n"), ("\n\n", "\n"), ("\n\n", "\n\n")]
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, byte_fallback=True))
        tok.normalizer = normalizers.Replace(" ", "▁")
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    else:
        for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
            vocab[ch] = len(vocab)
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
    assert len(vocab) <= VOCAB, len(vocab)
    tok.add_special_tokens(specials)
    kwargs = dict(tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad, unk_token=unk,
                  model_max_length=4096, clean_up_tokenization_spaces=False, **init)
    if named:
        kwargs["extra_special_tokens"] = named
    if chat_template:
        kwargs["chat_template"] = chat_template
    return PreTrainedTokenizerFast(**kwargs)


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
def chatml(image: str) -> str:
    return ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
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


def glm4_1v(out: Path) -> str:
    from transformers import Glm4vConfig, Glm4vImageProcessor, Glm4vProcessor, Glm4vVideoProcessor

    specials = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
                "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>",
                "<|begin_of_video|>", "<|end_of_video|>", "<|image|>", "<|video|>", "<think>", "</think>"]
    image = "<|begin_of_image|><|image|><|end_of_image|>"
    template = ("[gMASK]<sop>{% for message in messages %}<|{{ message['role'] }}|>\n"
                "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
                "{% for c in message['content'] %}{% if c['type'] in ('image', 'image_url') %}" + image +
                "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}"
                "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
    tok = make_tokenizer(specials, bos=None, eos="<|endoftext|>", pad="<|endoftext|>", chat_template=template)
    lm = {k: v for k, v in LM.items() if k != "head_dim"}  # GLM-4's head_dim is hidden/heads (32)
    config = Glm4vConfig(
        architectures=["Glm4vForConditionalGeneration"],
        # half the head is rotated (partial_rotary_factor 0.5): 16 dims, 8 frequencies, split t/h/w
        text_config=dict(**lm, hidden_act="silu", attention_bias=True, pad_token_id=tid(tok, "<|endoftext|>"),
                         eos_token_id=[tid(tok, t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")],
                         rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5,
                                              mrope_section=[2, 3, 3])),  # real [8, 12, 12], /4
        vision_config=dict(depth=2, hidden_size=64, intermediate_size=LM["intermediate_size"], num_heads=2,
                           image_size=336, patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                           out_hidden_size=LM["hidden_size"]),
        image_token_id=tid(tok, "<|image|>"), video_token_id=tid(tok, "<|video|>"),
        image_start_token_id=tid(tok, "<|begin_of_image|>"), image_end_token_id=tid(tok, "<|end_of_image|>"),
        video_start_token_id=tid(tok, "<|begin_of_video|>"), video_end_token_id=tid(tok, "<|end_of_video|>"),
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    size = {"shortest_edge": 112 * 112, "longest_edge": 1024 * 28 * 28}  # real longest 15000 tokens' pixels
    improc = Glm4vImageProcessor(size=size, patch_size=14, merge_size=2, temporal_patch_size=2)
    video = Glm4vVideoProcessor(size=size, patch_size=14, merge_size=2, temporal_patch_size=2)
    save(out, config, Glm4vProcessor(image_processor=improc, tokenizer=tok, video_processor=video,
                                     chat_template=template))
    return f"[gMASK]<sop><|user|>\n{image}Free OCR.<|assistant|>\n"


def internvl(out: Path) -> str:
    """InternVL3 in transformers' own format (InternVLForConditionalGeneration; vLLM runs it as InternS1)."""
    from transformers import GotOcr2ImageProcessor, InternVLConfig, InternVLProcessor, InternVLVideoProcessor

    named = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
             "video_token": "<video>"}
    tok = make_tokenizer(QWEN_SPECIALS + list(named.values()), bos=None, eos="<|im_end|>", pad="<|endoftext|>",
                         named=named, chat_template=chatml("<IMG_CONTEXT>\n"))
    # 224 px tiles of 16x16 patches, pixel-shuffled by 0.5: 64 tokens a tile (real: 448 px, 256 tokens)
    tile, patch = 224, 14
    seq = (tile // patch) ** 2 // 4
    config = InternVLConfig(
        architectures=["InternVLForConditionalGeneration"],
        text_config=dict(**LM, model_type="qwen2", hidden_act="silu", bos_token_id=tid(tok, "<|endoftext|>"),
                         eos_token_id=tid(tok, "<|im_end|>"), pad_token_id=tid(tok, "<|endoftext|>"),
                         rope_parameters=dict(rope_type="default", rope_theta=1e6), tie_word_embeddings=False),
        vision_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                           image_size=[tile, tile], patch_size=[patch, patch]),
        image_token_id=tid(tok, "<IMG_CONTEXT>"), image_seq_length=seq, downsample_ratio=0.5,
        vision_feature_layer=-1, vision_feature_select_strategy="default", projector_hidden_act="gelu",
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    improc = GotOcr2ImageProcessor(size={"height": tile, "width": tile}, crop_to_patches=True, min_patches=1,
                                   max_patches=12, image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
    video = InternVLVideoProcessor(size={"height": tile, "width": tile})
    save(out, config, InternVLProcessor(image_processor=improc, tokenizer=tok, video_processor=video,
                                        image_seq_length=seq, chat_template=tok.chat_template))
    return "<|im_start|>user\n<IMG_CONTEXT>\nFree OCR.<|im_end|>\n<|im_start|>assistant\n"


def minicpm_v(out: Path) -> str:
    """MiniCPM-V 4.6 (transformers-native; Qwen3.5 hybrid language model: Gated-DeltaNet + full attention)."""
    from transformers import (MiniCPMV4_6Config, MiniCPMV4_6ImageProcessor, MiniCPMV4_6Processor,
                              MiniCPMV4_6VideoProcessor)

    named = {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "image_start_token": "<image>",
             "image_end_token": "</image>", "slice_start_token": "<slice>", "slice_end_token": "</slice>",
             "image_id_start_token": "<image_id>", "image_id_end_token": "</image_id>"}
    tok = make_tokenizer(QWEN_SPECIALS + list(named.values()), bos=None, eos="<|im_end|>", pad="<|endoftext|>",
                         named=named, chat_template=chatml("<|image_pad|>\n"))
    lm = dict(LM, num_key_value_heads=2)
    config = MiniCPMV4_6Config(
        architectures=["MiniCPMV4_6ForConditionalGeneration"],
        text_config=dict(**lm, model_type="qwen3_5_text", hidden_act="silu",
                         layer_types=["linear_attention", "full_attention"],
                         # vLLM's CPU Gated-DeltaNet kernel (chunk_gated_delta_rule_cpu) refuses other
                         # head dims: "RuntimeError: Unexpected head dim size, 32"; 128 is the real one
                         linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
                         linear_num_key_heads=2, linear_num_value_heads=4,
                         bos_token_id=tid(tok, "<|endoftext|>"), eos_token_id=tid(tok, "<|im_end|>"),
                         pad_token_id=tid(tok, "<|endoftext|>"),
                         # a quarter of the head rotated: 8 dims, 4 frequencies (real [11, 11, 10] of 32)
                         rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25,
                                              mrope_interleaved=True, mrope_section=[2, 1, 1])),
        # SigLIP-style tower (Idefics2 in vLLM); the window-attention merger sits after layer 0 of 2
        vision_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                           image_size=448, patch_size=14),
        insert_layer_id=0, image_size=448, downsample_mode="16x",
        image_token_id=tid(tok, "<|image_pad|>"), video_token_id=tid(tok, "<|video_pad|>"),
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    # real defaults: 448 px slices of 14 px patches, up to 9 slices, 64 tokens a slice after 16x merging
    improc = MiniCPMV4_6ImageProcessor(scale_resolution=448, patch_size=14, max_slice_nums=9)
    video = MiniCPMV4_6VideoProcessor(scale_resolution=448, patch_size=14)
    save(out, config, MiniCPMV4_6Processor(image_processor=improc, video_processor=video, tokenizer=tok,
                                           chat_template=tok.chat_template))
    return "<|im_start|>user\n<|image_pad|>\nFree OCR.<|im_end|>\n<|im_start|>assistant\n"


def llava_onevision(out: Path) -> str:
    """LLaVA-OneVision: SigLIP tower, anyres tiling (anyres_max_9), Qwen2 language model."""
    from transformers import (LlavaOnevisionConfig, LlavaOnevisionImageProcessor, LlavaOnevisionProcessor,
                              LlavaOnevisionVideoProcessor)

    named = {"image_token": "<image>", "video_token": "<video>"}
    tok = make_tokenizer(QWEN_SPECIALS + list(named.values()), bos=None, eos="<|im_end|>", pad="<|endoftext|>",
                         named=named, chat_template=chatml("<image>\n"))
    # 192 px tiles of 16 px patches: 144 tokens a tile (real: 384 px / 14 px, 729); grid up to 4x4 tiles,
    # which anyres_max_9 scales down to at most 9 tiles' worth: <= ~1500 tokens an image
    tile, patch = 192, 16
    pinpoints = [[tile * i, tile * j] for i in range(1, 5) for j in range(1, 5)]
    config = LlavaOnevisionConfig(
        architectures=["LlavaOnevisionForConditionalGeneration"],
        text_config=dict(**LM, model_type="qwen2", hidden_act="silu", bos_token_id=tid(tok, "<|endoftext|>"),
                         eos_token_id=tid(tok, "<|im_end|>"), pad_token_id=tid(tok, "<|endoftext|>"),
                         rope_parameters=dict(rope_type="default", rope_theta=1e6), tie_word_embeddings=False),
        vision_config=dict(model_type="siglip_vision_model", hidden_size=64, intermediate_size=128,
                           num_hidden_layers=2, num_attention_heads=2, image_size=tile, patch_size=patch,
                           vision_use_head=False),
        image_token_index=tid(tok, "<image>"), video_token_index=tid(tok, "<video>"),
        image_grid_pinpoints=pinpoints, vision_aspect_ratio="anyres_max_9",
        vision_feature_select_strategy="full", vision_feature_layer=-1,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    improc = LlavaOnevisionImageProcessor(size={"height": tile, "width": tile}, image_grid_pinpoints=pinpoints,
                                          image_mean=[0.5] * 3, image_std=[0.5] * 3)
    video = LlavaOnevisionVideoProcessor(size={"height": tile, "width": tile}, image_mean=[0.5] * 3,
                                         image_std=[0.5] * 3)
    save(out, config, LlavaOnevisionProcessor(image_processor=improc, tokenizer=tok, video_processor=video,
                                              num_image_tokens=(tile // patch) ** 2,
                                              vision_feature_select_strategy="full",
                                              vision_aspect_ratio="anyres_max_9", chat_template=tok.chat_template))
    return "<|im_start|>user\n<image>\nFree OCR.<|im_end|>\n<|im_start|>assistant\n"


def gemma3(out: Path) -> str:
    """Gemma 3: SigLIP tower average-pooled to a fixed token count, Gemma 3 language model
    (sliding-window and global layers)."""
    from transformers import Gemma3Config, Gemma3ImageProcessor, Gemma3Processor

    named = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", *named.values()]
    template = ("{{ bos_token }}{% for message in messages %}<start_of_turn>"
                "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
                "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
                "{% for c in message['content'] %}{% if c['type'] in ('image', 'image_url') %}<start_of_image>"
                "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}"
                "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
    tok = make_tokenizer(specials, bos="<bos>", eos="<eos>", pad="<pad>", unk="<unk>", named=named,
                         chat_template=template, spm=True)
    # 224 px of 14 px patches = 16x16, average-pooled 2x2 to 64 tokens an image (real: 896 px, 256 tokens)
    tile, patch, tokens = 224, 14, 64
    config = Gemma3Config(
        architectures=["Gemma3ForConditionalGeneration"],
        text_config=dict(**LM, model_type="gemma3_text", hidden_activation="gelu_pytorch_tanh",
                         query_pre_attn_scalar=LM["head_dim"], sliding_window=512,
                         layer_types=["sliding_attention", "full_attention"],
                         rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                          "full_attention": {"rope_type": "default", "rope_theta": 1e6}},
                         bos_token_id=tid(tok, "<bos>"), eos_token_id=[tid(tok, "<eos>"), tid(tok, "<end_of_turn>")],
                         pad_token_id=tid(tok, "<pad>"), tie_word_embeddings=True),
        vision_config=dict(model_type="siglip_vision_model", hidden_size=64, intermediate_size=128,
                           num_hidden_layers=2, num_attention_heads=2, image_size=tile, patch_size=patch,
                           vision_use_head=False),
        mm_tokens_per_image=tokens, boi_token_index=tid(tok, "<start_of_image>"),
        eoi_token_index=tid(tok, "<end_of_image>"), image_token_index=tid(tok, "<image_soft_token>"),
        tie_word_embeddings=True,
        dtype="bfloat16",
    )
    improc = Gemma3ImageProcessor(size={"height": tile, "width": tile}, image_mean=[0.5] * 3, image_std=[0.5] * 3,
                                  do_pan_and_scan=False)
    save(out, config, Gemma3Processor(image_processor=improc, tokenizer=tok, image_seq_length=tokens,
                                      chat_template=template))
    return "<bos><start_of_turn>user\n<start_of_image>Free OCR.<end_of_turn>\n<start_of_turn>model\n"


def llava_1_5(out: Path) -> str:
    """LLaVA-1.5: CLIP tower (penultimate layer, CLS dropped), MLP projector, Llama language model."""
    from transformers import CLIPImageProcessor, LlavaConfig, LlavaProcessor

    specials = ["<unk>", "<s>", "</s>", "<image>", "<pad>"]
    template = ("{{ bos_token }}{% for message in messages %}{{ message['role'].upper() }}: "
                "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
                "{% for c in message['content'] %}{% if c['type'] in ('image', 'image_url') %}<image>\n"
                "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %} "
                "{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}")
    tok = make_tokenizer(specials, bos="<s>", eos="</s>", pad="<pad>", unk="<unk>",
                         named={"image_token": "<image>"}, chat_template=template)
    # 224 px of 14 px patches: 256 tokens an image (real: 336 px, 576)
    tile, patch = 224, 14
    config = LlavaConfig(
        architectures=["LlavaForConditionalGeneration"],
        text_config=dict(**LM, model_type="llama", hidden_act="silu", bos_token_id=tid(tok, "<s>"),
                         eos_token_id=tid(tok, "</s>"), pad_token_id=tid(tok, "<pad>"),
                         rope_parameters=dict(rope_type="default", rope_theta=10000.0), tie_word_embeddings=False),
        vision_config=dict(model_type="clip_vision_model", hidden_size=64, intermediate_size=128,
                           projection_dim=64, num_hidden_layers=2, num_attention_heads=2, image_size=tile,
                           patch_size=patch, hidden_act="quick_gelu"),
        image_token_index=tid(tok, "<image>"), image_seq_length=(tile // patch) ** 2,
        vision_feature_layer=-2, vision_feature_select_strategy="default", projector_hidden_act="gelu",
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    improc = CLIPImageProcessor(size={"shortest_edge": tile}, crop_size={"height": tile, "width": tile})
    save(out, config, LlavaProcessor(image_processor=improc, tokenizer=tok, patch_size=patch,
                                     vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                     chat_template=template))
    return "<s>USER: <image>\nFree OCR. ASSISTANT:"


REGISTRY: dict[str, Callable[[Path], str]] = {
    "qwen2.5-vl": qwen2_5_vl,
    "qwen3-vl": qwen3_vl,
    "glm-4.1v": glm4_1v,
    "internvl": internvl,
    "minicpm-v": minicpm_v,
    "llava-onevision": llava_onevision,
    "gemma3": gemma3,
    "llava-1.5": llava_1_5,
}


def check(out: Path, prompt: str) -> None:
    """The saved folder loads through AutoProcessor, and its chat template, given one image and the
    text, renders exactly the prompt guard sends (guard_prompt.txt)."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(out)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Free OCR."}]}]
    rendered = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    if rendered != prompt:
        raise SystemExit(f"{out.name}: chat template renders {rendered!r}, guard_prompt.txt has {prompt!r}")


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
        make_real_structured(canonical(name), out)  # the real model's depth and layer pattern
        (out / "guard_prompt.txt").write_text(prompts[name])
        check(out, prompts[name])
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
