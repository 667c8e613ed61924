"""Parity: guard's server-mode TTFT against `vllm bench serve`'s median_ttft_ms, same server.

One `vllm serve` with the profile's engine arguments (guard.measure.server.VllmServer). Against it, in
turn: guard's client (guard.measure.server.run_jobs_http, the code `guard check --engine-mode server`
runs) and `vllm bench serve --backend openai-chat --dataset-name custom_image` fed a JSONL of the
very same requests (the prompt and the same PNG data URLs, in the same order), both at the
profile's concurrency with `--request-rate inf`. Each side is preceded by one warm-up request
(bench serve's own "initial single prompt test run"; guard's warm-up request), and the order
alternates (guard, bench, guard, bench) so drift of a shared machine falls on both sides.

Prints each side's samples and medians, and the difference in %.

    flock /tmp/guard-engine.lock uv run --extra cpu python benchmarks/server_parity.py [--requests 6]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from guard.config.budgets import DEFAULT_THRESHOLDS, resolve_model
from guard.config.loading import load_thresholds
from guard.compat import vllm_cli
from guard.measure.side import plan_jobs
from guard.measure.hardware import detect
from guard.measure.fit import select_profile
from guard.measure.server import SERVED_MODEL_NAME, VllmServer, prepare, request_function, run_jobs_http


def bench_serve(url: str, model_path: str, jsonl: Path, n: int, concurrency: int, out_dir: Path, name: str) -> dict:
    cmd = [*vllm_cli(), "bench", "serve", "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
           "--base-url", url, "--model", model_path, "--served-model-name", SERVED_MODEL_NAME,
           "--tokenizer", model_path, "--dataset-name", "custom_image", "--dataset-path", str(jsonl),
           "--disable-shuffle", "--num-prompts", str(n), "--custom-output-len", "1", "--ignore-eos",
           "--max-concurrency", str(concurrency), "--request-rate", "inf", "--num-warmups", "0",
           "--percentile-metrics", "ttft", "--disable-tqdm", "--save-detailed",
           "--save-result", "--result-dir", str(out_dir), "--result-filename", name]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"vllm bench serve failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    print(f"  vllm bench serve: {time.perf_counter() - t:.0f} s")
    return json.loads((out_dir / name).read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--thresholds", default=DEFAULT_THRESHOLDS)
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--requests", type=int, default=6, help="measured requests per side per pass")
    ap.add_argument("--passes", type=int, default=2, help="guard/bench alternations")
    args = ap.parse_args()

    # as `guard check` would run it here: float32 on a CPU without native bf16
    profile = select_profile(load_thresholds(args.thresholds), args.profile, detect())
    w = profile.workload
    model_path = resolve_model(profile.engine.model)
    work = Path(tempfile.mkdtemp(prefix="guard-parity-"))
    func_name, func = request_function()
    print(f"profile {profile.name}: concurrency {w.concurrency}, {args.requests} requests per side per pass, "
          f"images {w.image_sizes}; guard's request function: {func_name}")
    guard_s: list[float] = []
    bench_s: list[float] = []
    server = VllmServer(profile.engine, w.seed, work / "server.log")
    with server:
        t = time.perf_counter()
        server.start(print)
        print(f"server healthy in {time.perf_counter() - t:.1f} s")
        index = 0
        for p in range(args.passes):
            # guard: one warm-up request, then the measured ones, like `guard check`
            warm = plan_jobs(w, index, 1, True)
            jobs = plan_jobs(w, index + 1, args.requests, False)
            run_jobs_http(server.url, SERVED_MODEL_NAME, w, warm, func=func)
            out = run_jobs_http(server.url, SERVED_MODEL_NAME, w, jobs, func=func)
            bad = [o for o in out if not o.success]
            if bad:
                raise SystemExit(f"guard request failed: {bad[0].error}")
            g = [o.ttft_client_s for o in out]
            guard_s += g
            print(f"pass {p + 1} guard: median {statistics.median(g) * 1000:.0f} ms  {[round(x * 1000) for x in g]}")
            # bench serve: the same requests (same images, same order); its initial test run is the
            # first of them once more, i.e. its warm-up
            jsonl = work / f"requests-{p}.jsonl"
            with open(jsonl, "w") as f:
                for r in prepare(w, jobs):
                    f.write(json.dumps({"prompt": r.prompt, "image_files": [r.image_url]}) + "\n")
            res = bench_serve(server.url, model_path, jsonl, args.requests, w.concurrency, work, f"bench-{p}.json")
            b = res["ttfts"]
            bench_s += b
            print(f"pass {p + 1} bench: median_ttft_ms {res['median_ttft_ms']:.0f}  {[round(x * 1000) for x in b]}")
            index += 1 + args.requests
        print(f"server log: {server.log_path}")

    g_ms, b_ms = statistics.median(guard_s) * 1000, statistics.median(bench_s) * 1000
    print()
    print(f"guard   p50 TTFT: {g_ms:.0f} ms over {len(guard_s)} requests (mean {statistics.mean(guard_s) * 1000:.0f} ms)")
    print(f"bench   median_ttft_ms: {b_ms:.0f} ms over {len(bench_s)} requests (mean {statistics.mean(bench_s) * 1000:.0f} ms)")
    print(f"difference: {(g_ms - b_ms) / b_ms * 100:+.1f} % (target: within 2 %)")
    print(json.dumps({"guard_p50_ms": round(g_ms, 1), "bench_median_ttft_ms": round(b_ms, 1),
                      "guard_s": guard_s, "bench_s": bench_s, "request_function": func_name,
                      "concurrency": w.concurrency}))


if __name__ == "__main__":
    main()
