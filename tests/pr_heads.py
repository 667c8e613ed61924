"""Pull requests to judge: edits of vLLM's sources, committed on top of the test repository's base.

Each head is what a real pull request could do. ``expect`` is ``guard pr``'s exit code:
1 a regression, 0 a refactor that changes no work, 3 a head that does not import (or renames the
function an op budget names), 6 a change only to compiled code. The loops are written for these tests from the descriptions in guard/measure/canary.py
and guard/measure/mutants.py (the pre-#49531 mask, a per-token ``.item()``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from guard.measure.mutants import MUTANTS

ENC2 = "vllm/model_executor/models/deepencoder2.py"
SAM = "vllm/model_executor/models/deepencoder.py"
PROCESSOR = "vllm/transformers_utils/processors/deepseek_ocr.py"
PROCESSOR_FN = f"{PROCESSOR}:DeepseekOCRProcessor.tokenize_with_images"

MASK_FN = ("vllm/model_executor/models/deepencoder2.py:CustomQwen2Decoder._create_custom_model.<locals>."
           "CustomQwen2ModelInner._create_custom_4d_mask")
ITEM_FN = "vllm/model_executor/models/deepencoder2.py:Qwen2Decoder2Encoder.forward"
(_MOVE,) = MUTANTS["move-rel-coords"].edits


@dataclass(frozen=True)
class Head:
    message: str
    expect: int
    edits: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    renames: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # path -> (old, new), every occurrence


HEADS: dict[str, Head] = {
    # vLLM before PR #49531: per sample, a full mask written by advanced-index writes in a Python loop
    "mask-loop": Head("deepencoder2: build the attention mask per sample (the pre-#49531 loop)", 1, edits={ENC2: (
        """                base = self.compute_mask_base(sequence_length, dtype, device)
                return base.expand(batch_size, -1, -1, -1)
""",
        """                min_dtype = torch.finfo(dtype).min
                n_query = sequence_length // 2
                token_type_ids = torch.cat(
                    [
                        torch.zeros(batch_size, n_query, dtype=torch.long),
                        torch.ones(batch_size, sequence_length - n_query, dtype=torch.long),
                    ],
                    dim=1,
                )
                masks = []
                for b in range(batch_size):
                    mask = torch.full(
                        (sequence_length, sequence_length), min_dtype, dtype=dtype, device=device
                    )
                    types = token_type_ids[b]
                    image_pos = (types == 0).nonzero(as_tuple=True)[0]
                    text_pos = (types == 1).nonzero(as_tuple=True)[0]
                    mask[image_pos[:, None], image_pos] = 0
                    for i, t in enumerate(text_pos):
                        mask[t, image_pos] = 0
                        mask[t, text_pos[: i + 1]] = 0
                    masks.append(mask)
                return torch.stack(masks, dim=0).unsqueeze(1)
""")}),
    # a host sync per causal-flow query token, in a function no op budget names
    "item-loop": Head("deepencoder2: keep a per-token scale for debugging", 1, edits={ENC2: (
        """        y = y[:, n_query:, :]  # causal flow query
""",
        """        y = y[:, n_query:, :]  # causal flow query
        self.token_scale = [y[0, i, 0].item() for i in range(n_query)]
""")}),
    # the same work, reorganised: coordinates moved into a new helper (the move-rel-coords mutant's
    # edit, committed), and a function renamed; and in the processor one index write and .item() per
    # request on its CPU token ids, as vLLM 0.31's GLM-4.1V processor remaps video to image tokens:
    # input processing, which waits for no device
    "refactor": Head("deepencoder: factor out the relative coordinates, rename window_partition; "
                     "processor: write the image placeholder back as itself", 0,
                     edits={SAM: (_MOVE.old, _MOVE.new), PROCESSOR: (
                         """        input_ids[input_ids < 0] = self.pad_id
""",
                         """        input_ids[input_ids < 0] = self.pad_id
        input_ids[input_ids == self.image_token_id] = self.image_token_id
""")}, renames={SAM: ("window_partition(", "partition_windows(")}),
    # a pure rename of the function the mask_path op budget names: behaviour-preserving, but the budget
    # now counts nothing in head (guard pr says so by name: exit 3, reason scope_gone)
    "rename-mask-scope": Head("deepencoder2: rename _update_causal_mask to _build_causal_mask", 3,
                              renames={ENC2: ("_update_causal_mask", "_build_causal_mask")}),
    "csrc-only": Head("csrc: tune a kernel", 6, files={"csrc/cache_kernels.cu": "// a faster kernel\n"}),
    "broken-import": Head("deepencoder2: import a helper that does not exist", 3, edits={ENC2: (
        "\nimport torch\n", "\nimport torch\nfrom vllm.no_such_module import helper  # noqa: F401\n")}),
}
