"""Holdouts for the model matrix: historical slow patterns of vLLM's vision models, re-planted.

For seven models guard guards besides DeepSeek-OCR-2, a pull request that brings back a slow pattern
vLLM once had (and fixed) in that model's code, and one that refactors the same function without
changing its work. Each edits the installed vLLM 0.32 source as a pull request would (committed by
tests/vllm_repo.py). ``guard pr --only ops --model MODEL`` must exit 1 on the slow head, naming
``functions`` among the census failures, and 0 on the refactor (a "moved" notice at most).

None of these is a guard mutant (guard/measure/mutants.py) or a DeepSeek-OCR-2 head (tests/pr_heads.py):
the census was not tuned on them. benchmarks/holdouts.py runs them on the real engine;
tests/test_model_holdouts.py checks, without an engine, that every edit still applies to the
installed vLLM, so they cannot rot silently when vLLM changes.

Where each pattern comes from:

- qwen2-5-vl: before vLLM PR #17973 ("[PERF] Speed up Qwen2.5-VL model by speed up rotary position
  embedding construction"), Qwen2.5-VL's vision tower rebuilt every image's rotary position table
  and window index on every forward (``rot_pos_emb`` / ``get_window_index``, a loop over
  ``grid_thw``); #17973 cached them per (t, h, w) (``get_rope_by_thw``, today an ``LRUCache``).
  The slow head does that work per image again in ``prepare_encoder_metadata``, bypassing the cache.
- glm-4-1v: vLLM's ``glm4_1v.py`` ``Glm4vVisionEmbeddings.forward`` (e.g. at vLLM commit 002d181a)
  turned ``lengths`` and ``image_shapes`` into tensors and built the per-patch target sizes with one
  ``repeat`` per image and a ``cat`` (``image_shapes[i, 1].repeat(lengths[i])``: a 0-d tensor as a
  size, so an ``.item()`` per image); 0.32 expands them with numpy and moves them across once.
  The slow head is that code, as it was.
- qwen3-vl: before vLLM PR #28475 ("[Model][Qwen3VL] Cache positional embedding indices"),
  ``Qwen3_VisionTransformer.rot_pos_emb`` built each image's (h, w) position ids with torch ops
  (``arange``, ``expand``, ``reshape``, ``permute``, ``stack``) on every forward; #28475 moved them
  to numpy and cached them per (h, w) (``rot_pos_ids``). The slow head is the torch loop, written
  after the same loop that Qwen2-VL's form still has in 0.32's ``glm4_1v.py`` ``rot_pos_emb``.
- llava-onevision: LLaVA-OneVision's ``_merge_image_patch_embeddings`` is a copy of LLaVA-NeXT's. An
  older vLLM ``llava_next.py`` passed ``image_size`` (a device tensor) to the anyres grid-shape and
  unpadding helpers, so the shape arithmetic ran on tensors, an ``int()`` of a device tensor per step;
  vLLM PR #6982 ("no longer depend on the floating-point error in CUDA",
  ``int(183 * torch.tensor(24).cuda() / 488)``) is, by its description (its diff was not seen), where
  ``image_size.tolist()`` ("Move to CPU to avoid floating-point errors") came in. The slow head keeps
  the size as two 0-d tensors for ``get_anyres_image_grid_shape`` (the pair reaches
  ``select_best_resolution``, which loops over all grid pinpoints); the unpadding gets the tensor
  itself, which today's transformers converts (its ``round()`` fails on a tensor).
- internvl (run as InternS1, whose vision tower is ``interns1_vit.py``): InternViT's embeddings in
  OpenGVLab's ``modeling_intern_vit.py``, the file vLLM PR #6514 adapted into ``intern_vit.py``,
  resample the position table (``float``, ``reshape``, ``permute``, bicubic ``interpolate``, ``cat``)
  on every forward, also to the grid it was trained on; vLLM's ``intern_vit.py`` now returns the table
  as it is when the grid matches (``_get_position_embedding``; the PR that added that check was not
  found), as ``interns1_vit.py``'s ``interpolate_pos_encoding`` does. The slow head is the
  always-resample form, written into ``InternS1VisionEmbeddings.forward``.
- gemma3: vLLM's ``scatter_patch_features`` (``models/vision.py``) scattered each image's patch
  features into a NaN-filled tensor of its placeholder's rows (``new_full(..., nan)``, then
  ``embed_one[e_is_patch] = patches_one``), and ``select_patch_features`` took them back out
  (``x[~x.isnan()].view(-1, *x.shape[1:])``): two boolean-mask indexings (``nonzero``) per image.
  Gemma 3 ran both in the model (``get_multimodal_embeddings`` / ``get_input_embeddings``, e.g. at
  vLLM commit 0004c540) until PR #16076 ("[V1] Scatter and gather placeholders in the model
  runner") moved them out; 0.32's runner merges with an ``is_embed`` mask instead. The slow head
  does the round trip per image in ``_process_image_input``; the placeholder mask, then a processor
  output built from the prompt's tokens, is built from the embeddings' shape (<start_of_image>,
  the image tokens, <end_of_image> per crop).
- minicpm-v: MiniCPM-V's vision tower is ``idefics2_vision_model.py``. Its
  ``Idefics2VisionEmbeddings.forward`` (e.g. at vLLM commit 68137261) built the position ids per
  slice: ``arange(0, 1 - 1e-6, 1 / nb_patches_h)`` with a 0-d tensor as the step (an ``.item()``
  per size), two ``bucketize`` and ``position_ids[batch_idx][p_attn_mask.view(-1).cpu()] =
  pos_ids`` (a host copy of the mask and a ``nonzero`` per slice); 0.32's ``get_position_ids``
  computes them for the whole batch at once. The slow head is that loop, as it was, inside 0.32's
  ``get_position_ids``. The PR that vectorised it was not found; the two agree on the tiny
  checkpoint's slice sizes, not on every size (at a 58-patch side, 29 * (1/58) in float32 falls
  just below 0.5, the exact 29/58 on it: one bucket apart).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

MODELS = "vllm/model_executor/models"
QWEN25 = f"{MODELS}/qwen2_5_vl.py"
GLM = f"{MODELS}/glm4_1v.py"
QWEN3 = f"{MODELS}/qwen3_vl.py"
ONEVISION = f"{MODELS}/llava_onevision.py"
INTERNVIT = f"{MODELS}/interns1_vit.py"
GEMMA3 = f"{MODELS}/gemma3_mm.py"
IDEFICS2 = f"{MODELS}/idefics2_vision_model.py"  # MiniCPM-V's vision tower (``vpm``)

Edits = Mapping[str, tuple[tuple[str, str], ...]]  # path -> (old, new) pairs, applied in order; each old once


@dataclass(frozen=True)
class HoldoutHead:
    message: str
    expect: int  # guard pr's exit code: 1 regression, 0 pass
    edits: Edits = field(default_factory=dict)


@dataclass(frozen=True)
class Holdout:
    model: str  # thresholds/<model>.yaml
    pattern: str  # the historical pattern the slow head re-plants
    source: str  # where in vLLM's history it comes from
    function: str  # the census function ("file:qualname") both heads edit
    fails: tuple[str, ...]  # census functions the slow head must fail naming (each FAIL in results.json)
    slow: HoldoutHead
    refactor: HoldoutHead
    helper: str  # the census function the refactor extracts (its calls moved there, not grown)


# ----------------------------------------------------------------------------- qwen2-5-vl
_QWEN25_CACHED = """            (
                cos_thw,
                sin_thw,
                window_index_thw,
                cu_seqlens_window_thw,
                cu_seqlens_thw,
            ) = self.get_rope_by_thw(t, h, w)
"""
_QWEN25_PER_IMAGE = """            # this image's rotary table and window index, built for it (no per-(t, h, w) cache)
            window_index_thw, cu_seqlens_window_thw = self.get_window_index_thw(t, h, w)
            cos_thw, sin_thw = self.rotary_pos_emb_thw(t, h, w)
            window_index_thw_dev = async_tensor_h2d(window_index_thw, cos_thw.device)
            cos_thw = cos_thw[window_index_thw_dev, :, :].flatten(start_dim=0, end_dim=1)
            sin_thw = sin_thw[window_index_thw_dev, :, :].flatten(start_dim=0, end_dim=1)
            cu_seqlens_thw = torch.repeat_interleave(
                torch.tensor([h * w], dtype=torch.int32), t
            )
"""
_QWEN25_CONCAT = """        rotary_pos_emb_cos = torch.cat(rotary_pos_emb_cos)
        rotary_pos_emb_sin = torch.cat(rotary_pos_emb_sin)
        window_index = torch.cat(window_indices)
        # compute reverse indices
        reverse_indices = self.invert_permutation(window_index)
        cu_window_seqlens = torch.cat(cu_window_seqlens_parts)
        cu_window_seqlens = torch.unique_consecutive(cu_window_seqlens)
        cu_seqlens = torch.cat(cu_seqlens_parts)
        cu_seqlens = torch.cumsum(cu_seqlens, dim=0, dtype=torch.int32)
        cu_seqlens = F.pad(cu_seqlens, (1, 0), "constant", 0)
"""
_QWEN25_CONCAT_CALL = """        (
            rotary_pos_emb_cos,
            rotary_pos_emb_sin,
            window_index,
            reverse_indices,
            cu_window_seqlens,
            cu_seqlens,
        ) = self._join_image_parts(
            rotary_pos_emb_cos,
            rotary_pos_emb_sin,
            window_indices,
            cu_window_seqlens_parts,
            cu_seqlens_parts,
        )
"""
_QWEN25_PREPARE = """    def prepare_encoder_metadata(
        self,
"""
_QWEN25_HELPER = """    def _join_image_parts(
        self,
        cos_parts: list[torch.Tensor],
        sin_parts: list[torch.Tensor],
        window_parts: list[torch.Tensor],
        cu_window_seqlens_parts: list[torch.Tensor],
        cu_seqlens_parts: list[torch.Tensor],
    ) -> tuple[torch.Tensor, ...]:
        \"\"\"The per-image parts of the encoder metadata, joined into batch tensors.\"\"\"
        window_index = torch.cat(window_parts)
        cu_window_seqlens = torch.unique_consecutive(torch.cat(cu_window_seqlens_parts))
        cu_seqlens = torch.cumsum(torch.cat(cu_seqlens_parts), dim=0, dtype=torch.int32)
        return (
            torch.cat(cos_parts),
            torch.cat(sin_parts),
            window_index,
            self.invert_permutation(window_index),
            cu_window_seqlens,
            F.pad(cu_seqlens, (1, 0), "constant", 0),
        )

    def prepare_encoder_metadata(
        self,
"""

_QWEN25_VIT = "vllm/model_executor/models/qwen2_5_vl.py:Qwen2_5_VisionTransformer"

# ----------------------------------------------------------------------------- glm-4-1v
_GLM_NUMPY_TARGETS = """            # Calculate target dimensions for each patch. `lengths` and
            # `image_shapes` are host data, so expand them with numpy and move
            # the result across once rather than per-image.
            # Shapes are cycled: in data parallel mode some GPUs might not
            # have all image shapes.
            shapes_np = np.asarray(image_shapes)
            shape_idx = np.arange(len(lengths)) % shapes_np.shape[0]
            target_h = async_tensor_h2d(
                np.repeat(shapes_np[shape_idx, 1], lengths),
                device=device,
                dtype=torch.float32,
            )
            target_w = async_tensor_h2d(
                np.repeat(shapes_np[shape_idx, 2], lengths),
                device=device,
                dtype=torch.float32,
            )
"""
_GLM_PER_IMAGE_TARGETS = """            # Convert inputs to tensors if needed
            if isinstance(lengths, list):
                lengths = torch.tensor(lengths, device=device, dtype=torch.long)
            if not isinstance(image_shapes, torch.Tensor):
                image_shapes = torch.tensor(
                    image_shapes, device=device, dtype=torch.long
                )

            # Calculate target dimensions for each patch
            # Add bounds checking for data parallel mode
            if len(lengths) > image_shapes.shape[0]:
                # In data parallel mode, some GPUs might not have all
                # image shapes
                # Use available image shapes, cycling if necessary
                target_h_list = []
                target_w_list = []
                for i in range(len(lengths)):
                    # Cycle through available shapes
                    shape_idx = i % image_shapes.shape[0]
                    target_h_list.append(image_shapes[shape_idx, 1].repeat(lengths[i]))
                    target_w_list.append(image_shapes[shape_idx, 2].repeat(lengths[i]))
                target_h = torch.cat(target_h_list).to(
                    device=device, dtype=torch.float32
                )
                target_w = torch.cat(target_w_list).to(
                    device=device, dtype=torch.float32
                )
            else:
                target_h = torch.cat(
                    [image_shapes[i, 1].repeat(lengths[i]) for i in range(len(lengths))]
                ).to(device=device, dtype=torch.float32)
                target_w = torch.cat(
                    [image_shapes[i, 2].repeat(lengths[i]) for i in range(len(lengths))]
                ).to(device=device, dtype=torch.float32)
"""
_GLM_GRID = """            # Normalize coordinates to [-1, 1] range for grid_sample
            h_coords = h_coords.to(device=device, dtype=torch.float32)
            w_coords = w_coords.to(device=device, dtype=torch.float32)
            norm_w = ((w_coords + 0.5) / target_w) * 2 - 1
            norm_h = ((h_coords + 0.5) / target_h) * 2 - 1

            # Create sampling grid
            grid = torch.stack((norm_w, norm_h), dim=-1).unsqueeze(0).unsqueeze(2)
"""
_GLM_GRID_CALL = """            grid = self._sampling_grid(h_coords, w_coords, target_h, target_w, device)
"""
_GLM_FORWARD = """    def forward(
        self, embeddings, lengths, image_shapes, h_coords, w_coords
    ) -> torch.Tensor:
"""
_GLM_HELPER = """    @staticmethod
    def _sampling_grid(
        h_coords: torch.Tensor,
        w_coords: torch.Tensor,
        target_h: torch.Tensor,
        target_w: torch.Tensor,
        device: torch.device,
    ) -> torch.Tensor:
        \"\"\"grid_sample's grid: patch centres normalised to [-1, 1] per image size.\"\"\"
        h = h_coords.to(device=device, dtype=torch.float32)
        w = w_coords.to(device=device, dtype=torch.float32)
        norm_w = ((w + 0.5) / target_w) * 2 - 1
        norm_h = ((h + 0.5) / target_h) * 2 - 1
        return torch.stack((norm_w, norm_h), dim=-1).unsqueeze(0).unsqueeze(2)

""" + _GLM_FORWARD

_GLM_EMB = "vllm/model_executor/models/glm4_1v.py:Glm4vVisionEmbeddings"

# ----------------------------------------------------------------------------- qwen3-vl
_QWEN3_CACHED_IDS = """        pos_ids = [
            self.rot_pos_ids(h, w, self.spatial_merge_size)
            if t == 1
            else self.rot_pos_ids(h, w, self.spatial_merge_size).repeat(t, 1)
            for t, h, w in grid_thw
        ]
        num_pos = sum(p.shape[0] for p in pos_ids)
        pinned = torch.empty(
            (num_pos, pos_ids[0].shape[1]),
            dtype=pos_ids[0].dtype,
            pin_memory=PIN_MEMORY,
        )
        pos_ids = torch.cat(pos_ids, dim=0, out=pinned).to(
            self.device, non_blocking=True
        )
"""
_QWEN3_PER_IMAGE_IDS = """        pos_ids = []
        for t, h, w in grid_thw:
            hpos_ids = torch.arange(h).unsqueeze(1).expand(-1, w)
            wpos_ids = torch.arange(w).unsqueeze(0).expand(h, -1)
            hpos_ids = (
                hpos_ids.reshape(
                    h // self.spatial_merge_size,
                    self.spatial_merge_size,
                    w // self.spatial_merge_size,
                    self.spatial_merge_size,
                )
                .permute(0, 2, 1, 3)
                .flatten()
            )
            wpos_ids = (
                wpos_ids.reshape(
                    h // self.spatial_merge_size,
                    self.spatial_merge_size,
                    w // self.spatial_merge_size,
                    self.spatial_merge_size,
                )
                .permute(0, 2, 1, 3)
                .flatten()
            )
            pos_ids.append(torch.stack([hpos_ids, wpos_ids], dim=-1).repeat(t, 1))
        pos_ids = torch.cat(pos_ids, dim=0).to(self.device, non_blocking=True)
"""
_QWEN3_GATHER = """        # Use pre-computed cos_sin_cache from RotaryEmbedding
        cos, sin = self.rotary_pos_emb.get_cos_sin(max_grid_size)

        cos_combined = cos[pos_ids].flatten(1)
        sin_combined = sin[pos_ids].flatten(1)

        return cos_combined, sin_combined

    def fast_pos_embed_interpolate(
"""
_QWEN3_GATHER_HELPER = """        return self._gather_cos_sin(pos_ids, max_grid_size)

    def _gather_cos_sin(
        self, pos_ids: torch.Tensor, max_grid_size: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        \"\"\"Each patch's (h, w) rows of the RoPE cos/sin tables, side by side.\"\"\"
        # Use pre-computed cos_sin_cache from RotaryEmbedding
        cos_table, sin_table = self.rotary_pos_emb.get_cos_sin(max_grid_size)
        return cos_table[pos_ids].flatten(1), sin_table[pos_ids].flatten(1)

    def fast_pos_embed_interpolate(
"""

_QWEN3_VIT = "vllm/model_executor/models/qwen3_vl.py:Qwen3_VisionTransformer"

# ----------------------------------------------------------------------------- llava-onevision
_OV_HOST_SIZE = """                # Move to CPU to avoid floating-point errors
                orig_height, orig_width = image_size.tolist()
"""
_OV_TENSOR_SIZE = """                # The image's size as two 0-d tensors: the anyres grid shape is
                # computed on them
                orig_height, orig_width = image_size
"""
# transformers' unpad_image now rounds (round() of a tensor fails) and converts a tensor itself
_OV_UNPAD_HOST = """                    other_patch_embeds = unpad_image(
                        other_patch_embeds, (orig_height, orig_width)
                    )
"""
_OV_UNPAD_TENSOR = """                    other_patch_embeds = unpad_image(other_patch_embeds, image_size)
"""
_OV_NEWLINE = """                    if image_newline is not None:
                        other_patch_embeds = torch.cat(
                            (
                                other_patch_embeds,
                                image_newline[:, None, None]
                                .expand(*other_patch_embeds.shape[:-1], 1)
                                .to(other_patch_embeds.device),
                            ),
                            dim=-1,
                        )
"""
_OV_NEWLINE_CALL = """                    other_patch_embeds = self._append_image_newline(
                        other_patch_embeds, image_newline
                    )
"""
_OV_MERGE = """    # Based on: https://github.com/haotian-liu/LLaVA/blob/main/llava/model/llava_arch.py
    def _merge_image_patch_embeddings(
"""
_OV_HELPER = """    @staticmethod
    def _append_image_newline(
        embeds: torch.Tensor, image_newline: torch.Tensor | None
    ) -> torch.Tensor:
        \"\"\"The newline embedding after each row of a (channels, rows, cols) feature map.\"\"\"
        if image_newline is None:
            return embeds
        newline = image_newline[:, None, None].expand(*embeds.shape[:-1], 1)
        return torch.cat((embeds, newline.to(embeds.device)), dim=-1)

""" + _OV_MERGE

_OV_MODEL = "vllm/model_executor/models/llava_onevision.py:LlavaOnevisionForConditionalGeneration"

# ----------------------------------------------------------------------------- internvl
_INTERN_POS = """        cls_tokens = self.cls_token.expand(batch_size, -1, -1)
        embeddings = torch.cat((cls_tokens, embeddings), dim=1)

        if self.position_embeddings is not None:
            embeddings = embeddings + self.interpolate_pos_encoding(
                embeddings, height, width
            )
"""
_INTERN_POS_ALWAYS = """        cls_tokens = self.cls_token.expand(batch_size, -1, -1)
        embeddings = torch.cat((cls_tokens, embeddings), dim=1)

        if self.position_embeddings is not None:
            # The patch position table resampled to this patch grid on every
            # forward, also when the grid is the one it was trained on
            target_dtype = self.position_embeddings.dtype
            pos_h = self.image_size[0] // self.patch_size[0]
            pos_w = self.image_size[1] // self.patch_size[1]
            patch_pos = (
                self.position_embeddings[:, 1:, :]
                .float()
                .reshape(1, pos_h, pos_w, -1)
                .permute(0, 3, 1, 2)
            )
            patch_pos = nn.functional.interpolate(
                patch_pos,
                size=(patch_height, patch_width),
                mode="bicubic",
                align_corners=False,
            )
            patch_pos = (
                patch_pos.reshape(1, -1, patch_height * patch_width)
                .permute(0, 2, 1)
                .to(target_dtype)
            )
            embeddings = embeddings + torch.cat(
                [self.position_embeddings[:, :1, :], patch_pos], dim=1
            )
"""
_INTERN_POS_CALL = """        embeddings = self._with_cls_and_positions(embeddings, height, width)
"""
_INTERN_FORWARD = """    def forward(
        self,
        pixel_values: torch.Tensor,
        bool_masked_pos: torch.BoolTensor | None = None,
    ) -> torch.Tensor:
"""
_INTERN_HELPER = """    def _with_cls_and_positions(
        self, embeddings: torch.Tensor, height: int, width: int
    ) -> torch.Tensor:
        \"\"\"The class token prepended to the patch embeddings, the position table added.\"\"\"
        cls_tokens = self.cls_token.expand(embeddings.shape[0], -1, -1)
        embeddings = torch.cat((cls_tokens, embeddings), dim=1)
        if self.position_embeddings is None:
            return embeddings
        return embeddings + self.interpolate_pos_encoding(embeddings, height, width)

""" + _INTERN_FORWARD

_INTERN_EMB = "vllm/model_executor/models/interns1_vit.py:InternS1VisionEmbeddings"
# ----------------------------------------------------------------------------- gemma3
_GEMMA3_SPLIT = """        image_embeds = self.multi_modal_projector(image_features)

        return [e.flatten(0, 1) for e in image_embeds.split(num_patches.tolist())]
"""
_GEMMA3_SCATTER_SELECT = """        image_embeds = self.multi_modal_projector(image_features)

        # Scatter each image's patch features into its placeholder's rows (NaN in
        # the others), then select the patch features back by the NaN mask.
        embeds = []
        for patches in image_embeds.split(num_patches.tolist()):
            # each crop's placeholder: <start_of_image>, its image tokens, <end_of_image>
            embed_is_patch = torch.ones(
                patches.shape[0],
                patches.shape[1] + 2,
                dtype=torch.bool,
                device=patches.device,
            )
            embed_is_patch[:, 0] = False
            embed_is_patch[:, -1] = False
            embed_is_patch = embed_is_patch.flatten()
            embed_one = patches.new_full(
                (embed_is_patch.shape[0], patches.shape[-1]),
                fill_value=torch.nan,
            )
            embed_one[embed_is_patch] = patches.flatten(0, 1)
            embeds.append(embed_one[~embed_one.isnan()].view(-1, *embed_one.shape[1:]))
        return embeds
"""
_GEMMA3_SPLIT_CALL = """        image_embeds = self.multi_modal_projector(image_features)

        return self._per_image_embeds(image_embeds, num_patches)
"""
_GEMMA3_EMBED = """    def embed_multimodal(self, **kwargs: object) -> MultiModalEmbeddings:
"""
_GEMMA3_HELPER = """    @staticmethod
    def _per_image_embeds(
        image_embeds: torch.Tensor, num_patches: torch.Tensor
    ) -> list[torch.Tensor]:
        \"\"\"The projector's output split per image, its crops' tokens in one run.\"\"\"
        return [e.flatten(0, 1) for e in image_embeds.split(num_patches.tolist())]

""" + _GEMMA3_EMBED

_GEMMA3_MM = "vllm/model_executor/models/gemma3_mm.py:Gemma3ForConditionalGeneration"

# ----------------------------------------------------------------------------- minicpm-v
_IDEFICS2_VECTORISED = """        boundaries = torch.arange(
            1 / self.num_patches_per_side,
            1.0,
            1 / self.num_patches_per_side,
            device=device,
        )

        flat_patch_attention_mask = patch_attention_mask.view(batch_size, -1)
        max_patches = flat_patch_attention_mask.shape[-1]

        if tgt_sizes is not None:
            # tgt_sizes may come from CPU-side mm_kwargs; use a pinned async
            # copy to stay clean under VLLM_GPU_SYNC_CHECK.
            if tgt_sizes.device != device:
                tgt_sizes = async_tensor_h2d(tgt_sizes, device)
            nb_patches_h = tgt_sizes[:, 0]
            nb_patches_w = tgt_sizes[:, 1]
        else:
            if patch_attention_mask.dim() == 3:
                nb_patches_h = patch_attention_mask[:, :, 0].sum(dim=1)
                nb_patches_w = patch_attention_mask[:, 0, :].sum(dim=1)
            else:
                # Fallback for unexpected 2D masks without tgt_sizes
                nb_patches_h = torch.ones(batch_size, device=device)
                nb_patches_w = patch_attention_mask.sum(dim=1)

        nb_h = nb_patches_h.clamp(min=1).unsqueeze(1)
        nb_w = nb_patches_w.clamp(min=1).unsqueeze(1)

        i = torch.arange(max_patches, device=device)

        if patch_attention_mask.dim() == 3 and patch_attention_mask.shape[1] > 1:
            stride_w = patch_attention_mask.shape[2]  # padded 2D grid width
        else:
            stride_w = nb_w  # (batch, 1) \u2014 per-item actual patch width

        h_idx = i.unsqueeze(0) // stride_w
        w_idx = i.unsqueeze(0) % stride_w

        fractional_h = h_idx / nb_h
        fractional_w = w_idx / nb_w

        bucket_h = torch.bucketize(fractional_h, boundaries, right=True)
        bucket_w = torch.bucketize(fractional_w, boundaries, right=True)

        pos_ids = bucket_h * self.num_patches_per_side + bucket_w

        position_ids = torch.where(flat_patch_attention_mask, pos_ids.to(torch.long), 0)
"""
_IDEFICS2_PER_ITEM = """        boundaries = torch.arange(
            1 / self.num_patches_per_side, 1.0, 1 / self.num_patches_per_side
        )
        max_patches = patch_attention_mask.view(batch_size, -1).shape[-1]
        position_ids = torch.full(size=(batch_size, max_patches), fill_value=0)

        for batch_idx, p_attn_mask in enumerate(patch_attention_mask):
            if tgt_sizes is not None:
                nb_patches_h = tgt_sizes[batch_idx][0]
                nb_patches_w = tgt_sizes[batch_idx][1]
            else:
                nb_patches_h = p_attn_mask[:, 0].sum()
                nb_patches_w = p_attn_mask[0].sum()
            fractional_coords_h = torch.arange(0, 1 - 1e-6, 1 / nb_patches_h)
            fractional_coords_w = torch.arange(0, 1 - 1e-6, 1 / nb_patches_w)
            bucket_coords_h = torch.bucketize(
                fractional_coords_h, boundaries, right=True
            )
            bucket_coords_w = torch.bucketize(
                fractional_coords_w, boundaries, right=True
            )
            pos_ids = (
                bucket_coords_h[:, None] * self.num_patches_per_side + bucket_coords_w
            ).flatten()
            position_ids[batch_idx][p_attn_mask.view(-1).cpu()] = pos_ids
"""
_IDEFICS2_BUCKETS = """        fractional_h = h_idx / nb_h
        fractional_w = w_idx / nb_w

        bucket_h = torch.bucketize(fractional_h, boundaries, right=True)
        bucket_w = torch.bucketize(fractional_w, boundaries, right=True)

        pos_ids = bucket_h * self.num_patches_per_side + bucket_w
"""
_IDEFICS2_BUCKETS_CALL = """        pos_ids = self._bucket_pos_ids(h_idx, w_idx, nb_h, nb_w, boundaries)
"""
_IDEFICS2_GET_IDS = """    def get_position_ids(
"""
_IDEFICS2_HELPER = """    def _bucket_pos_ids(
        self,
        h_idx: torch.Tensor,
        w_idx: torch.Tensor,
        nb_h: torch.Tensor,
        nb_w: torch.Tensor,
        boundaries: torch.Tensor,
    ) -> torch.Tensor:
        \"\"\"Each patch's fractional (h, w) in its image, bucketed onto the square position grid.\"\"\"
        bucket_h = torch.bucketize(h_idx / nb_h, boundaries, right=True)
        bucket_w = torch.bucketize(w_idx / nb_w, boundaries, right=True)
        return bucket_h * self.num_patches_per_side + bucket_w

""" + _IDEFICS2_GET_IDS

_IDEFICS2_EMB = "vllm/model_executor/models/idefics2_vision_model.py:Idefics2VisionEmbeddings"

HOLDOUTS: dict[str, Holdout] = {h.model: h for h in (
    Holdout(
        model="qwen2-5-vl",
        pattern="rotary table and window index rebuilt per image on every request (no per-(t, h, w) cache)",
        source="vLLM PR #17973 (before it: rot_pos_emb / get_window_index looped over grid_thw on every forward)",
        function=f"{_QWEN25_VIT}.prepare_encoder_metadata",
        fails=(f"{_QWEN25_VIT}.prepare_encoder_metadata", f"{_QWEN25_VIT}.rotary_pos_emb_thw",
               f"{_QWEN25_VIT}.get_window_index_thw"),
        slow=HoldoutHead("qwen2.5-vl: build each image's rotary table and window index in prepare_encoder_metadata",
                         1, edits={QWEN25: ((_QWEN25_CACHED, _QWEN25_PER_IMAGE),)}),
        refactor=HoldoutHead("qwen2.5-vl: factor the joining of per-image parts out of prepare_encoder_metadata", 0,
                             edits={QWEN25: ((_QWEN25_CONCAT, _QWEN25_CONCAT_CALL), (_QWEN25_PREPARE, _QWEN25_HELPER))}),
        helper=f"{_QWEN25_VIT}._join_image_parts",
    ),
    Holdout(
        model="glm-4-1v",
        pattern="per-image repeat + cat of the patch target sizes, a 0-d tensor as each repeat's size (.item() per image)",
        source="vLLM glm4_1v.py Glm4vVisionEmbeddings.forward before the numpy expansion (e.g. vLLM commit 002d181a)",
        function=f"{_GLM_EMB}.forward",
        fails=(f"{_GLM_EMB}.forward",),
        slow=HoldoutHead("glm-4.1v: target sizes per image with torch (repeat + cat)", 1,
                         edits={GLM: ((_GLM_NUMPY_TARGETS, _GLM_PER_IMAGE_TARGETS),)}),
        refactor=HoldoutHead("glm-4.1v: factor the sampling grid out of Glm4vVisionEmbeddings.forward", 0,
                             edits={GLM: ((_GLM_GRID, _GLM_GRID_CALL), (_GLM_FORWARD, _GLM_HELPER))}),
        helper=f"{_GLM_EMB}._sampling_grid",
    ),
    Holdout(
        model="qwen3-vl",
        pattern="vision rotary position ids built per image with torch ops on every request (no per-(h, w) cache)",
        source="vLLM PR #28475 (before it: rot_pos_emb's arange/expand/reshape/permute loop over grid_thw)",
        function=f"{_QWEN3_VIT}.rot_pos_emb",
        fails=(f"{_QWEN3_VIT}.rot_pos_emb",),
        slow=HoldoutHead("qwen3-vl: rotary position ids per image with torch ops", 1,
                         edits={QWEN3: ((_QWEN3_CACHED_IDS, _QWEN3_PER_IMAGE_IDS),)}),
        refactor=HoldoutHead("qwen3-vl: factor the cos/sin gather out of rot_pos_emb", 0,
                             edits={QWEN3: ((_QWEN3_GATHER, _QWEN3_GATHER_HELPER),)}),
        helper=f"{_QWEN3_VIT}._gather_cos_sin",
    ),
    Holdout(
        model="llava-onevision",
        pattern="the anyres grid shape computed on the image size as 0-d tensors (an .item() per int() and comparison)",
        source="vLLM llava_next.py _merge_image_patch_embeddings before PR #6982 (image_size passed on as a tensor; "
               "#6982 took it to the host: image_size.tolist(), 'Move to CPU to avoid floating-point errors')",
        function=f"{_OV_MODEL}._merge_image_patch_embeddings",
        fails=(f"{_OV_MODEL}._merge_image_patch_embeddings",),
        slow=HoldoutHead("llava-onevision: the image size stays a tensor in _merge_image_patch_embeddings", 1,
                         edits={ONEVISION: ((_OV_HOST_SIZE, _OV_TENSOR_SIZE), (_OV_UNPAD_HOST, _OV_UNPAD_TENSOR))}),
        refactor=HoldoutHead("llava-onevision: factor the image newline out of _merge_image_patch_embeddings", 0,
                             edits={ONEVISION: ((_OV_NEWLINE, _OV_NEWLINE_CALL), (_OV_MERGE, _OV_HELPER))}),
        helper=f"{_OV_MODEL}._append_image_newline",
    ),
    Holdout(
        model="internvl",
        pattern="the vision position table bicubic-resampled on every forward, also to the grid it was trained on",
        source="OpenGVLab's modeling_intern_vit.py InternVisionEmbeddings.forward, adapted by vLLM PR #6514 "
               "(torch.cat([pos[:, :1], self._get_pos_embed(pos[:, 1:], H, W)]) every forward); vLLM's "
               "intern_vit.py now skips it when the grid matches (_get_position_embedding)",
        function=f"{_INTERN_EMB}.forward",
        fails=(f"{_INTERN_EMB}.forward",),
        slow=HoldoutHead("internvl: resample the vision position table on every forward", 1,
                         edits={INTERNVIT: ((_INTERN_POS, _INTERN_POS_ALWAYS),)}),
        refactor=HoldoutHead("internvl: factor the class token and position table out of the embeddings' forward", 0,
                             edits={INTERNVIT: ((_INTERN_POS, _INTERN_POS_CALL), (_INTERN_FORWARD, _INTERN_HELPER))}),
        helper=f"{_INTERN_EMB}._with_cls_and_positions",
    ),
    Holdout(
        model="gemma3",
        pattern="each image's embeddings scattered into a NaN-filled placeholder and selected back by an isnan mask",
        source="vLLM's scatter_patch_features / select_patch_features (models/vision.py), run for Gemma 3 in the "
               "model until PR #16076 moved them to the model runner",
        function=f"{_GEMMA3_MM}._process_image_input",
        fails=(f"{_GEMMA3_MM}._process_image_input",),
        slow=HoldoutHead("gemma3: scatter each image's features into its placeholder and select them back by NaN", 1,
                         edits={GEMMA3: ((_GEMMA3_SPLIT, _GEMMA3_SCATTER_SELECT),)}),
        refactor=HoldoutHead("gemma3: factor the per-image split out of _process_image_input", 0,
                             edits={GEMMA3: ((_GEMMA3_SPLIT, _GEMMA3_SPLIT_CALL), (_GEMMA3_EMBED, _GEMMA3_HELPER))}),
        helper=f"{_GEMMA3_MM}._per_image_embeds",
    ),
    Holdout(
        model="minicpm-v",
        pattern="vision position ids built per slice in a Python loop (a host copy of each mask, .item() per size)",
        source="vLLM idefics2_vision_model.py Idefics2VisionEmbeddings.forward before the vectorised "
               "get_position_ids (e.g. vLLM commit 68137261)",
        function=f"{_IDEFICS2_EMB}.get_position_ids",
        fails=(f"{_IDEFICS2_EMB}.get_position_ids",),
        slow=HoldoutHead("minicpm-v: vision position ids per slice in a loop, as Idefics2VisionEmbeddings had them",
                         1, edits={IDEFICS2: ((_IDEFICS2_VECTORISED, _IDEFICS2_PER_ITEM),)}),
        refactor=HoldoutHead("minicpm-v: factor the bucketing out of Idefics2VisionEmbeddings.get_position_ids", 0,
                             edits={IDEFICS2: ((_IDEFICS2_BUCKETS, _IDEFICS2_BUCKETS_CALL),
                                               (_IDEFICS2_GET_IDS, _IDEFICS2_HELPER))}),
        helper=f"{_IDEFICS2_EMB}._bucket_pos_ids",
    ),
)}


def apply(text: str, pairs: tuple[tuple[str, str], ...], path: str = "") -> str:
    """``text`` with each (old, new) applied in order; each old must occur exactly once when applied."""
    for i, (old, new) in enumerate(pairs):
        found = text.count(old)
        assert found == 1, f"{path}: edit {i + 1}'s old text occurs {found} times"
        text = text.replace(old, new)
    return text
