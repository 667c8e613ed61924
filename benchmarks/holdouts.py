"""Holdouts: historical slow patterns re-planted in seven vision models, judged by `guard pr`.

Builds a vLLM repository from the installed sources (tests/vllm_repo.py), commits each model's two
heads from tests/model_holdouts.py on top of its base (a slow pattern vLLM once had and fixed, and
a refactor of the same function), and runs, per head, in a fresh process:

    guard pr --vllm-repo R --base main --head SHA --only ops --model MODEL --cache-dir C

with one cache directory for the whole run, so each model's base is profiled once (its first head
profiles base and head, the second only head). Prints per model and head: the exit code against the
expected one, the census functions that failed with their op deltas (640x480; the other size in
the JSON), whether the expected functions were named, the refactor's moved calls, and wall seconds.

    uv run --extra cpu python benchmarks/holdouts.py [--model qwen3-vl ...] [--out holdouts.json]

First, without an engine, every head's edited function is called on the profile's grids and must
return exactly base's tensors (``--outputs-only`` stops there). Results: docs/model-findings.md, "Holdouts".

Exits 1 when any head's exit code differs from its expected one, or a slow head did not name its
functions. An engine run per side: minutes per model on a 2-core CPU; not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


@dataclass
class Row:
    model: str
    head: str  # "slow" | "refactor"
    sha: str
    expect: int
    exit: int
    wall_s: float
    named: bool  # slow: every expected function failed; refactor: nothing failed
    failed: list[dict] = field(default_factory=list)  # {function, image_size, growth, ops: {op: delta}, reason}
    moved: list[dict] = field(default_factory=list)  # {function, image_size, moved_calls, moved_from}
    notices: list[str] = field(default_factory=list)  # the census notices guard printed
    base_cached: bool = False  # base's op counts came from the cache (profiled by an earlier head)

    @property
    def ok(self) -> bool:
        return self.exit == self.expect and self.named


def short(function: str) -> str:
    """``file.py:Qual.name`` without the package folders, for the table."""
    path, _, qual = function.partition(":")
    return f"{path.rsplit('/', 1)[-1]}:{qual}"


def base_text(repo: Path, path: str) -> str:
    """A file as base (main) holds it, byte for byte."""
    return subprocess.run(["git", "-C", str(repo), "show", f"main:{path}"], capture_output=True, text=True,
                          check=True).stdout


def judge(repo: Path, sha: str, model: str, out: Path, cache: Path) -> tuple[int, float, str]:
    guard = str(Path(sys.executable).parent / "guard")
    cmd = [guard, "pr", "--vllm-repo", str(repo), "--base", "main", "--head", sha, "--only", "ops",
           "--model", model, "--output", str(out), "--cache-dir", str(cache)]
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - t
    (out / "guard-pr.log").write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
    return done.returncode, wall, done.stdout


def row_of(model: str, head: str, sha: str, expect: int, code: int, wall: float, stdout: str, out: Path,
           fails: tuple[str, ...]) -> Row:
    from guard.model.jsonfiles import load_results
    from guard.model.records import Status

    row = Row(model, head, sha, expect, code, round(wall, 1), named=False,
              base_cached="op counts from the cache" in stdout)
    results = out / "results.json"
    if not results.exists():
        return row
    res = load_results(results)
    for c in res.census_checks:
        size = "x".join(map(str, c.image_size))
        if c.status == Status.FAIL:
            row.failed.append({"function": c.function, "image_size": size, "growth": c.growth_calls,
                               "baseline": c.baseline_calls, "measured": c.measured_calls,
                               "ops": {d.op: d.delta_calls for d in c.op_deltas}, "reason": c.reason})
        elif c.moved_calls:
            row.moved.append({"function": c.function, "image_size": size, "moved_calls": c.moved_calls,
                              "moved_from": list(c.moved_from)})
    row.notices = [n for n in res.notices if n.startswith("census:")]
    failed = {f["function"] for f in row.failed}
    row.named = set(fails) <= failed if expect == 1 else not failed
    return row


def ops_text(ops: dict[str, int], top: int = 4) -> str:
    grown = sorted(ops.items(), key=lambda kv: (-abs(kv[1]), kv[0]))[:top]
    more = len(ops) - len(grown)
    return ", ".join(f"{d:+d} {op.removeprefix('aten::')}" for op, d in grown) + (f", +{more} more ops" if more > 0 else "")


def report(rows: list[Row]) -> None:
    print("\nmodel           head      exit (exp)  wall s  named  census (640x480: function, baseline -> measured, ops)")
    for r in rows:
        first = True
        lines = [f for f in r.failed if f["image_size"] == "640x480"] or r.failed
        if r.head == "refactor":
            lines = [{"function": m["function"], "moved": m["moved_calls"], "image_size": m["image_size"]}
                     for m in r.moved if m["image_size"] == "640x480"]
        for f in lines or [None]:
            lead = (f"{r.model:<15} {r.head:<9} {r.exit} ({r.expect})       {r.wall_s:>6.0f}  {'yes' if r.named else 'NO':<5}"
                    if first else " " * 50)
            first = False
            if f is None:
                print(f"{lead}  -")
            elif "moved" in f:
                print(f"{lead}  moved: {short(f['function'])} ({f['moved']} calls moved, not grown)")
            else:
                base = "new" if f["baseline"] is None else f["baseline"]
                print(f"{lead}  {short(f['function'])}  {base} -> {f['measured']}  {ops_text(f['ops'])}")


# ----------------------------------------------------------------------------- same outputs
# Before any engine run: each head's edited function, called on the tiny checkpoints' shapes (one
# image of 640x480, one of 800x400, both together; a two-frame grid where the model takes video),
# gives exactly base's tensors. The functions are called on a bare instance holding only what they
# read (no engine, no weights); the modules are the edited sources, compiled under their own path.
GRIDS = {  # what each holdout's function is given for the profile's images, as the tiny checkpoints'
    # processors make them: (t, h, w) patch grids for the Qwen and GLM models
    "qwen2-5-vl": [[[1, 34, 46]], [[1, 28, 58]], [[1, 34, 46], [1, 28, 58]], [[2, 34, 46]]],
    "glm-4-1v": [[[1, 34, 46]], [[1, 28, 58]], [[1, 34, 46], [1, 28, 58]]],
    "qwen3-vl": [[[1, 30, 40]], [[1, 26, 50]], [[1, 30, 40], [1, 26, 50]], [[2, 30, 40]]],
    # (height, width, tiles): each image's size and its anyres tiles, the base tile included
    "llava-onevision": [[[480, 640, 13]], [[400, 800, 9]], [[480, 640, 13], [400, 800, 9]]],
    # tiles of 224 px: 12 and 8 crops plus the thumbnail
    "internvl": [[13], [9], [13, 9]],
    # not grids: crops per image (num_patches). Gemma 3 resizes both sizes to one 224x224 crop
    # (pan-and-scan is off in the tiny checkpoint); the last case: an image with two pan-and-scan crops
    # besides the whole, then one without.
    "gemma3": [[1], [1], [1, 1], [3, 1]],
    # not grids: each slice's (h, w) in patches. MiniCPM-V 4.6 cuts each image into its overview and
    # two slices, all run through the vision tower as one batch (one request's image, or both).
    "minicpm-v": [[[28, 36], [40, 28], [40, 28]], [[24, 44], [32, 32], [32, 32]],
                  [[28, 36], [40, 28], [40, 28], [24, 44], [32, 32], [32, 32]]],
}


def load_edited(path: str, text: str, tag: str) -> ModuleType:
    """The module ``path`` compiled from ``text``: new class objects beside vLLM's own, in vLLM's
    package (its relative imports resolve), under the file's own name (tracebacks point there)."""
    from tests.vllm_repo import installed_vllm

    name = "guard_holdout_" + tag
    module = ModuleType(name)
    module.__file__ = str(installed_vllm().parent / path)
    module.__package__ = path.removesuffix(".py").replace("/", ".").rpartition(".")[0]
    sys.modules[name] = module  # dataclasses and typing look their module up by name
    exec(compile(text, module.__file__, "exec", dont_inherit=True), module.__dict__)
    return module


def bare(cls: type, **attrs: Any) -> Any:
    """An instance of ``cls`` holding just ``attrs``, no __init__ (properties overridden on a subclass)."""
    props = {k: v for k, v in attrs.items() if isinstance(getattr(cls, k, None), property)}
    obj = object.__new__(type("Bare" + cls.__name__, (cls,), props))
    for k, v in attrs.items():
        if k not in props:
            object.__setattr__(obj, k, v)
    return obj


class Tables:
    """Stands in for the vision RoPE: fixed cos/sin tables, one row per position."""

    def __init__(self, dim: int) -> None:
        import torch

        g = torch.Generator().manual_seed(0)
        self.cos, self.sin = torch.rand(256, dim, generator=g), torch.rand(256, dim, generator=g)

    def get_cos_sin(self, n: int) -> tuple[Any, Any]:
        return self.cos[:n], self.sin[:n]


def outputs(model: str, module: ModuleType) -> list[dict[str, Any]]:
    """What the holdout's function returns on each grid, in this variant of the module."""
    import torch

    cpu = torch.device("cpu")
    out = []
    for grid in GRIDS[model]:
        if model == "qwen2-5-vl":
            from vllm.v1.attention.backends.registry import AttentionBackendEnum

            vit = bare(module.Qwen2_5_VisionTransformer, device=cpu, spatial_merge_size=2, spatial_merge_unit=4,
                       window_size=112, patch_size=14, _rope_by_thw_cache={}, rotary_pos_emb=Tables(8),
                       attn_backend=AttentionBackendEnum.TORCH_SDPA, hidden_size=64, tp_size=1,
                       fp8_padded_hidden_size=None)
            got = vit.prepare_encoder_metadata(grid)
            out.append({k: v for k, v in got.items() if v is not None})
        elif model == "glm-4-1v":
            torch.manual_seed(0)
            emb = module.Glm4vVisionEmbeddings(SimpleNamespace(hidden_size=64, image_size=336, patch_size=14))
            lengths = [t * h * w for t, h, w in grid]
            h_coords = torch.cat([torch.arange(h).repeat_interleave(w).repeat(t) for t, h, w in grid])
            w_coords = torch.cat([torch.arange(w).repeat(h * t) for t, h, w in grid])
            x = torch.zeros(sum(lengths), 64)
            out.append({"embeddings": emb(x, lengths, grid, h_coords, w_coords)})
            if len(grid) > 1:  # data parallel: fewer shapes than lengths, cycled
                out.append({"cycled": emb(x, lengths, grid[:1], h_coords, w_coords)})
        elif model == "qwen3-vl":
            vit = bare(module.Qwen3_VisionTransformer, device=cpu, spatial_merge_size=2, _rot_pos_ids_cache={},
                       rotary_pos_emb=Tables(8))
            cos, sin = vit.rot_pos_emb(grid)
            out.append({"cos": cos, "sin": sin})
        elif model == "llava-onevision":
            config = json.loads((REPO / "guard" / "models" / "tiny-llava-onevision" / "config.json").read_text())
            vision = SimpleNamespace(**config["vision_config"])
            tokens = (vision.image_size // vision.patch_size) ** 2
            g = torch.Generator().manual_seed(0)
            newline = torch.rand(config["text_config"]["hidden_size"], generator=g).to(torch.bfloat16)
            llava = bare(module.LlavaOnevisionForConditionalGeneration, image_newline=newline,
                         config=SimpleNamespace(vision_config=vision,
                                                image_grid_pinpoints=config["image_grid_pinpoints"]))
            for h, w, tiles in grid:  # one call per image, as _process_image_input makes them
                patches = torch.rand(tiles, tokens, newline.shape[0], generator=g).to(torch.bfloat16)
                out.append({"merged": llava._merge_image_patch_embeddings(
                    torch.tensor([h, w]), patches, image_newline=newline, strategy="spatial_unpad")})
        elif model == "internvl":
            # a bare embeddings module in bf16, as the engine runs it; the patch convolution
            # (a vLLM custom op, which needs an engine config) stands in as fixed patch embeddings
            g = torch.Generator().manual_seed(0)
            tiles = sum(grid)
            patches = torch.rand(tiles, 16 * 16, 64, generator=g).to(torch.bfloat16)
            emb = bare(module.InternS1VisionEmbeddings, image_size=(224, 224), patch_size=(14, 14), mask_token=None,
                       patch_embeddings=lambda pixel_values: (patches, (16, 16)),
                       cls_token=torch.rand(1, 1, 64, generator=g).to(torch.bfloat16),
                       position_embeddings=torch.rand(1, 16 * 16 + 1, 64, generator=g).to(torch.bfloat16))
            embeddings, _ = emb.forward(torch.zeros(tiles, 3, 224, 224))
            out.append({"embeddings": embeddings})
        elif model == "gemma3":
            # vision tower and projector stand-ins pass through: the function's own work is the per-image split
            g = torch.Generator().manual_seed(0)
            embeds = torch.randn(sum(grid), 64, 128, generator=g).to(torch.bfloat16)  # 64 tokens per crop
            mm = bare(module.Gemma3ForConditionalGeneration, vision_tower=lambda x: x,
                      multi_modal_projector=lambda x: x)
            got = mm._process_image_input({"pixel_values": embeds, "num_patches": torch.tensor(grid)})
            out.append({f"image{i}": e for i, e in enumerate(got)})
        elif model == "minicpm-v":
            # the padded batch's patch mask, as MiniCPMV4_6's get_vision_hidden_states builds it
            tgt_sizes = torch.tensor(grid, dtype=torch.long)
            num_patches = tgt_sizes.prod(-1)
            mask = torch.arange(int(num_patches.max()))[None, :] < num_patches[:, None]
            emb = bare(module.Idefics2VisionEmbeddings, num_patches_per_side=448 // 14,
                       position_embedding=torch.nn.Embedding((448 // 14) ** 2, 8))
            out.append({"position_ids": emb.get_position_ids(mask.unsqueeze(1), tgt_sizes)})
    return out


def same_outputs(models: list[str]) -> list[str]:
    """Per model and head, "" when the head's function returns base's tensors exactly, else what differs."""
    import torch

    from tests.model_holdouts import HOLDOUTS, apply
    from tests.vllm_repo import installed_vllm

    problems = []
    for model in models:
        h = HOLDOUTS[model]
        (path,) = h.slow.edits
        original = (installed_vllm().parent / path).read_text(encoding="utf-8")
        base = outputs(model, load_edited(path, original, f"{model}_base".replace("-", "_")))
        for kind, head in (("slow", h.slow), ("refactor", h.refactor)):
            text = apply(original, head.edits[path], path)
            got = outputs(model, load_edited(path, text, f"{model}_{kind}".replace("-", "_")))
            before = len(problems)
            for i, (b, g) in enumerate(zip(base, got, strict=True)):
                for k in b:
                    if not (isinstance(b[k], torch.Tensor) and b[k].dtype == g[k].dtype and torch.equal(b[k], g[k])):
                        problems.append(f"{model} {kind}: case {i}: {k} differs from base")
            print(f"[holdouts] {model} {kind}: {len(base)} cases, "
                  f"{'the same tensors as base' if len(problems) == before else 'DIFFERENT'}", flush=True)
    return problems


def main() -> int:
    from tests.model_holdouts import HOLDOUTS, apply
    from tests.vllm_repo import build, commit

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", choices=sorted(HOLDOUTS), help="only these models (default: all)")
    ap.add_argument("--out", type=Path, help="write the rows as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (repository, outputs, cache)")
    ap.add_argument("--outputs-only", action="store_true",
                    help="only check that every head's function returns base's tensors (seconds, no engine)")
    args = ap.parse_args()
    problems = same_outputs(args.model or list(HOLDOUTS))
    if problems or args.outputs_only:
        print("\n".join(problems) or "every head returns base's tensors")
        return 1 if problems else 0
    tmp = Path(tempfile.mkdtemp(prefix="holdouts-"))
    print(f"[holdouts] working in {tmp}", flush=True)
    repo = build(tmp)
    cache = tmp / "cache"
    rows: list[Row] = []
    try:
        for model in args.model or list(HOLDOUTS):
            h = HOLDOUTS[model]
            for kind, head in (("slow", h.slow), ("refactor", h.refactor)):
                files = {path: apply(base_text(repo, path), pairs, path) for path, pairs in head.edits.items()}
                sha = commit(repo, head.message, files=files)
                out = tmp / "out" / model / kind
                out.mkdir(parents=True)
                print(f"[holdouts] {model} {kind}: guard pr --head {sha[:10]} ...", flush=True)
                code, wall, stdout = judge(repo, sha, model, out, cache)
                row = row_of(model, kind, sha, head.expect, code, wall, stdout, out, h.fails if kind == "slow" else ())
                print(f"[holdouts] {model} {kind}: exit {code} (expected {head.expect}) in {wall:.0f} s"
                      f"{'' if row.ok else '  <-- UNEXPECTED'}", flush=True)
                if not row.ok:
                    print(stdout[-4000:], flush=True)
                rows.append(row)
    finally:
        if args.out:
            args.out.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    report(rows)
    bad = [r for r in rows if not r.ok]
    print(f"\n{len(rows) - len(bad)} of {len(rows)} heads as expected")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
