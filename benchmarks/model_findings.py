"""Which vLLM functions' op counts grow with the image: sizes, image counts, tokens (docs/model-findings.md).

For each guarded tiny model (thresholds/<name>.yaml, cpu profile), in a child process of its own: the
installed vLLM in-process with the profile's engine arguments (and ``limit_mm_per_prompt`` of 2 images),
one warm-up request per shape, then one request per shape under torch.profiler, counted per function by
guard's census (guard.measure.census.count_functions, roots: vllm). Shapes: each profile image size with
one image, and the first size with two images (the prompt's image placeholder written twice;
``max_model_len`` raised to 4096 so that two images fit).

A function whose own op calls differ between shapes does per-image, per-token or per-row host work: the
signature of a Python loop over the input. Op counts are exact (deterministic per request, docs/census.md),
so one request per shape suffices; wall times are not measured.

    uv run --extra cpu python benchmarks/model_findings.py --out /tmp/findings.json   # all models
    uv run --extra cpu python benchmarks/model_findings.py --only qwen2-5-vl gemma3 --out f.json
    uv run --extra cpu python benchmarks/model_findings.py --report f.json             # the tables again

Starts a vLLM engine per model: run it under the engine lock on shared machines.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# the image placeholder of each checkpoint's guard_prompt.txt, written once per image
PLACEHOLDER = {
    "qwen2-5-vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen3-vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "glm-4-1v": "<|begin_of_image|><|image|><|end_of_image|>",
    "internvl": "<IMG_CONTEXT>\n",
    "minicpm-v": "<|image_pad|>\n",
    "llava-onevision": "<image>\n",
    "gemma3": "<start_of_image>",
    "llava-1-5": "<image>\n",
    "deepseek-ocr-2": "<image>\n",
}
MIN_DELTA = 1  # any difference is reported; the table says by how much
# two LLaVA-OneVision images (13-tile anyres grids) take 2922 tokens: more than the profiles' 2048
MAX_MODEL_LEN = 4096


def shapes(profile) -> list[tuple[tuple[int, int], int]]:
    sizes = [tuple(s) for s in profile.workload.profile_image_sizes]
    return [(s, 1) for s in sizes] + [(sizes[0], 2)]


def measure(name: str) -> dict:
    """In this process: one engine, one profiled request per shape; the census per shape."""
    from guard.config.budgets import resolve_model
    from guard.config.loading import load_thresholds
    from guard.measure.census import QualnameResolver, count_functions, total_calls
    from guard.measure.hardware import detect
    from guard.measure.fit import select_profile
    from guard.measure.inprocess import prepare_environment, synthetic_image
    from guard.measure.probes import profile_request

    thresholds = load_thresholds(REPO / "thresholds" / f"{name}.yaml")
    profile = select_profile(thresholds, "auto", detect())
    engine = profile.engine
    prepare_environment(engine)
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model=resolve_model(engine.model), load_format=engine.load_format, dtype=engine.dtype,
              max_model_len=max(engine.max_model_len, MAX_MODEL_LEN), enforce_eager=engine.enforce_eager,
              enable_prefix_caching=engine.enable_prefix_caching, mm_processor_cache_gb=engine.mm_processor_cache_gb,
              limit_mm_per_prompt={"image": 2}, seed=0)
    start_s = time.perf_counter() - t0
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    one = profile.workload.prompt
    marker = PLACEHOLDER[name]
    if marker not in one:
        raise SystemExit(f"{name}: placeholder {marker!r} not in its prompt {one!r}")
    resolver = QualnameResolver()
    out: dict = {"model": name, "dtype": engine.dtype, "engine_start_s": round(start_s, 1), "shapes": {}}
    index = 0
    for size, count in shapes(profile):
        prompt = one.replace(marker, marker * count, 1)

        def request(i: int):
            images = [synthetic_image(0, i + k, size) for k in range(count)]
            data = images[0] if count == 1 else images
            return llm.generate({"prompt": prompt, "multi_modal_data": {"image": data}}, params, use_tqdm=False)

        request(index)  # warm-up of this shape
        index += count
        got: list = []
        events, prof = profile_request(lambda: got.extend(request(index)))
        index += count
        del prof
        census = count_functions(events, ("vllm",), resolver)
        key = f"{size[0]}x{size[1]}x{count}"
        out["shapes"][key] = {"prompt_tokens": len(got[0].prompt_token_ids), "images": count,
                              "total_calls": sum(total_calls(ops) for ops in census.values()), "census": census}
        print(f"[{name}] {key}: {out['shapes'][key]['prompt_tokens']} prompt tokens, "
              f"{out['shapes'][key]['total_calls']} op calls in {len(census)} functions", flush=True)
    return out


def growing(result: dict) -> list[dict]:
    """Functions whose op calls differ between shapes, with their calls per shape and the ops that moved."""
    shapes_ = result["shapes"]
    keys = list(shapes_)
    functions = sorted({fn for s in shapes_.values() for fn in s["census"]})
    rows = []
    for fn in functions:
        calls = {k: sum(shapes_[k]["census"].get(fn, {}).values()) for k in keys}
        if max(calls.values()) - min(calls.values()) < MIN_DELTA:
            continue
        ops = {}
        for op in sorted({op for k in keys for op in shapes_[k]["census"].get(fn, {})}):
            per = {k: shapes_[k]["census"].get(fn, {}).get(op, 0) for k in keys}
            if max(per.values()) != min(per.values()):
                ops[op] = per
        rows.append({"function": fn, "calls": calls, "ops": ops})
    rows.sort(key=lambda r: -(max(r["calls"].values()) - min(r["calls"].values())))
    return rows


def report(results: list[dict], top: int) -> str:
    lines = []
    for r in results:
        if "error" in r:
            lines += [f"## {r['model']}", "", f"not measured: {r['error']}", ""]
            continue
        keys = list(r["shapes"])
        head = " | ".join(f"{k} ({r['shapes'][k]['prompt_tokens']} tok)" for k in keys)
        lines += [f"## {r['model']} ({r['dtype']})", "",
                  "shape = width x height x images; op calls per request: "
                  + ", ".join(f"{k}: {r['shapes'][k]['total_calls']}" for k in keys), "",
                  f"| function | {head} | ops that differ |", "|---|" + "---:|" * len(keys) + "---|"]
        for row in growing(r)[:top]:
            ops = "; ".join(f"{op} " + "/".join(str(v) for v in per.values()) for op, per in list(row["ops"].items())[:4])
            lines.append(f"| `{row['function']}` | " + " | ".join(str(row["calls"][k]) for k in keys) + f" | {ops} |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=None, metavar="NAME")
    ap.add_argument("--out", type=Path, default=None, help="write every model's censuses per shape here (JSON)")
    ap.add_argument("--report", type=Path, default=None, help="print the tables of an earlier --out file, measure nothing")
    ap.add_argument("--top", type=int, default=12, help="functions per model in the table (default: %(default)s)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(measure(args.child)), flush=True)
        return 0
    if args.report:
        print(report(json.loads(args.report.read_text())["models"], args.top))
        return 0
    from guard.config import models

    names = args.only or [n for n in models.names(REPO / "thresholds") if n != "deepseek-ocr-2"]
    results = []
    for name in names:
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, "--child", name], capture_output=True, text=True,
                              env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"})
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            results.append({"model": name, "error": f"exit {proc.returncode}: {tail[0][:300]}"})
        else:
            results.append(json.loads(line[len("RESULT "):]))
        print(f"{name}: {time.perf_counter() - t:.0f} s (wall, shared machine)", flush=True)
        if args.out:
            args.out.write_text(json.dumps({"models": results}, indent=1, sort_keys=True))
    print(report(results, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
