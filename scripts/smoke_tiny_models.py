"""Smoke-test guard's tiny vision checkpoints on the real vLLM engine (issue #42).

For each model (scripts/make_tiny_models.py), in its own child process: start vLLM in-process
(VLLM_ENABLE_V1_MULTIPROCESSING=0) on guard/models/tiny-<name>/ with guard's CPU engine arguments
(load_format dummy, max_model_len 2048, enforce_eager, one image per prompt, no processor cache, no
prefix caching), then send one request per synthetic image size through ``LLM.generate`` with the
model's own prompt format (guard_prompt.txt in its folder); --repeat N sends N per size. Prints per
model: engine start seconds, seconds per request, and OK or the error.

    uv run --extra cpu python scripts/smoke_tiny_models.py                # every model
    uv run --extra cpu python scripts/smoke_tiny_models.py --only qwen3-vl --dtype float32
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from make_tiny_models import REGISTRY, ROOT  # noqa: E402

SIZES = [(640, 480), (800, 400)]


def child(folder: Path, dtype: str, max_tokens: int, repeat: int) -> dict:
    """Runs in the child process; returns the result record."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from guard.measure.inprocess import synthetic_image

    rec: dict = {"model": folder.name, "dtype": dtype}
    prompt = (folder / "guard_prompt.txt").read_text()
    t0 = time.perf_counter()
    try:
        from vllm import LLM, SamplingParams

        llm = LLM(model=str(folder), load_format="dummy", dtype=dtype, max_model_len=2048,
                  enforce_eager=True, enable_prefix_caching=False, mm_processor_cache_gb=0,
                  limit_mm_per_prompt={"image": 1}, seed=0)
    except Exception as exc:  # noqa: BLE001
        rec.update(ok=False, stage="start", start_s=time.perf_counter() - t0,
                   error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-4000:])
        return rec
    rec["start_s"] = time.perf_counter() - t0
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    rec["requests"] = []
    # sizes alternate, so each size's first request is not simply the engine's first; every image is
    # distinct (no cache could skip the vision encoder)
    for n in range(repeat):
        for i, size in enumerate(SIZES):
            image = synthetic_image(0, n * len(SIZES) + i, size)
            t = time.perf_counter()
            try:
                out = llm.generate({"prompt": prompt, "multi_modal_data": {"image": image}},
                                   params, use_tqdm=False)[0]
            except Exception as exc:  # noqa: BLE001
                rec.update(ok=False, stage=f"request {size[0]}x{size[1]}",
                           error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-4000:])
                return rec
            rec["requests"].append({"size": list(size), "s": time.perf_counter() - t,
                                    "prompt_tokens": len(out.prompt_token_ids),
                                    "output_tokens": len(out.outputs[0].token_ids)})
    rec["ok"] = True
    return rec


def summary(requests: list[dict], size: tuple[int, int]) -> str:
    """'640x480: 0.41 s (421 tokens)'; with repeats, the first request, then the median and the fastest
    of the others (on a shared machine the fastest is the least disturbed)."""
    mine = [r for r in requests if tuple(r["size"]) == size]
    text = f"{size[0]}x{size[1]}: {mine[0]['s']:.2f} s"
    if len(mine) > 1:
        rest = sorted(r["s"] for r in mine[1:])
        text += f" first, then median {rest[len(rest) // 2]:.2f} s, min {rest[0]:.2f} s of {len(rest)}"
    return text + f" ({mine[0]['prompt_tokens']} tokens)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=ROOT, help="folder holding the tiny-<name>/ checkpoints")
    ap.add_argument("--only", action="append", choices=sorted(REGISTRY))
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-tokens", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1, help="requests per image size (default 1)")
    ap.add_argument("--json", type=Path, help="also write the records here")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        args.result.write_text(json.dumps(child(args.child, args.dtype, args.max_tokens, args.repeat)))
        return 0

    records = []
    for name in args.only or REGISTRY:
        folder = args.models / f"tiny-{name}"
        result = Path(f"/tmp/smoke-{os.getpid()}-{name}.json")
        log = Path(f"/tmp/smoke-{name}.log")
        t = time.perf_counter()
        with log.open("w") as fh:
            rc = subprocess.call([sys.executable, __file__, "--child", str(folder), "--result", str(result),
                                  "--dtype", args.dtype, "--max-tokens", str(args.max_tokens),
                                  "--repeat", str(args.repeat)],
                                 stdout=fh, stderr=subprocess.STDOUT)
        if result.exists():
            rec = json.loads(result.read_text())
            result.unlink()
        else:
            tail = log.read_text()[-1500:]
            rec = {"model": folder.name, "ok": False, "stage": "process",
                   "error": f"child exited {rc} without a result; log tail:\n{tail}"}
        rec["name"], rec["wall_s"], rec["log"] = name, time.perf_counter() - t, str(log)
        records.append(rec)
        if rec["ok"]:
            reqs = ", ".join(summary(rec["requests"], size) for size in SIZES)
            print(f"{name:14s} OK    start {rec['start_s']:6.1f} s   {reqs}", flush=True)
        else:
            print(f"{name:14s} FAIL  ({rec['stage']}) {rec['error'][:600]}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(records, indent=2) + "\n")
    return 0 if all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
