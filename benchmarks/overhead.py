"""guard's overhead: `guard check` on the CPU profile vs a bare vLLM script sending the same requests.

Both run as fresh processes, alternately (guard, bare, guard, bare, ...), so drifts of the machine
hit both alike; the figure is the ratio of median wall times. The bare script sends exactly the
requests guard sends (warm-up, measured, and the profile pass's warm-up and profiled requests,
same sizes, same images) with the same engine arguments, without pytest, the profiler, or reports.

    uv run --extra cpu python benchmarks/overhead.py --pairs 2                  # the whole check
    uv run --extra cpu python benchmarks/overhead.py --pairs 2 --timing-only    # harness only, no profile pass
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def bare(thresholds: str, profile_name: str, measured: int | None = None) -> None:
    """The baseline: plain vLLM, the same requests, nothing else. ``measured``: as many measured
    requests as guard actually sent in the paired run (its resampling rounds included)."""
    from guard.config.budgets import resolve_model
    from guard.config.loading import load_thresholds
    from guard.measure.fit import on_cpu
    from guard.measure.inprocess import model_construction, synthetic_image

    from guard.measure.hardware import detect

    profile = on_cpu(load_thresholds(thresholds).profile(profile_name), detect(quick=True).native_bf16)  # as guard check runs it
    e, w = profile.engine, profile.workload
    import os

    # The same engine mode as guard (engine core in this process), so the difference measured is
    # guard's harness, not vLLM's process layout (the default multiprocess layout ran slower here).
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if e.cpu_kvcache_space_gb:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(e.cpu_kvcache_space_gb))
    from vllm import LLM, SamplingParams

    with model_construction(e.load_format):  # built as guard builds it, so the start is the same
        llm = LLM(model=resolve_model(e.model), load_format=e.load_format, dtype=e.dtype, max_model_len=e.max_model_len,
                  enforce_eager=e.enforce_eager, enable_prefix_caching=e.enable_prefix_caching,
                  mm_processor_cache_gb=e.mm_processor_cache_gb, limit_mm_per_prompt={"image": 1}, seed=w.seed)
    params = SamplingParams(max_tokens=w.max_tokens, temperature=0.0, ignore_eos=True)
    count = w.requests if measured is None else measured
    sizes = [w.image_sizes[i % len(w.image_sizes)] for i in range(w.warmup_requests + count)]
    seen = set(sizes)
    for s in (w.profile_image_sizes if profile.ops else ()):
        sizes += ([s] if s in seen else [s, s])  # guard warms a new size once, then profiles it
        seen.add(s)
    for i, size in enumerate(sizes):
        llm.generate([{"prompt": w.prompt, "multi_modal_data": {"image": synthetic_image(w.seed, i, size)}}],
                     params, use_tqdm=False)


def timing_only_copy(thresholds: str, profile: str) -> str:
    """The thresholds with the profile's op budgets and census removed: no profile pass at all."""
    import yaml

    data = yaml.safe_load(Path(thresholds).read_text())
    data["profiles"][profile]["budgets"].pop("ops", None)
    data["profiles"][profile]["budgets"].pop("census", None)
    path = Path(tempfile.mkdtemp(prefix="guard-overhead-")) / "timing-only.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}")
    return time.perf_counter() - t


def requests_sent(results_json: Path) -> tuple[int, int]:
    """(all requests guard sent, measured ones) from the run it recorded: resampling rounds show here."""
    from guard.model.jsonfiles import load_results

    run = load_results(results_json).run
    return len(run.outcomes), len(run.measured)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--thresholds", default=str(REPO / "thresholds" / "deepseek-ocr-2.yaml"))
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--timing-only", action="store_true",
                    help="drop the op budgets (and so the profile pass): guard's harness alone vs bare vLLM")
    ap.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--measured", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.timing_only and not args.bare:
        args.thresholds = timing_only_copy(args.thresholds, args.profile)
    if args.bare:
        bare(args.thresholds, args.profile, args.measured)
        return
    out = tempfile.mkdtemp(prefix="guard-overhead-")
    guard_cmd = [sys.executable, "-m", "guard.cli", "check", "--profile", args.profile,
                 "--thresholds", args.thresholds, "--output", out]
    g, b = [], []
    for i in range(args.pairs):
        g.append(timed(guard_cmd))
        sent, measured = requests_sent(Path(out) / "results.json")
        # like with like: the bare script sends as many measured requests as guard did, rounds included
        bare_cmd = [sys.executable, __file__, "--bare", "--thresholds", args.thresholds, "--profile", args.profile,
                    "--measured", str(measured)]
        b.append(timed(bare_cmd))
        print(f"pair {i + 1}/{args.pairs}: guard check {g[-1]:.1f} s ({sent} requests, {measured} measured), "
              f"bare vLLM {b[-1]:.1f} s (the same {measured} measured requests)", flush=True)
    ratio = statistics.median(g) / statistics.median(b)
    print("\n| run | median wall time (s) | all runs (s) |\n|---|---:|---|")
    what = "guard check (timing pass only)" if args.timing_only else "guard check"
    print(f"| {what} --profile {args.profile} | {statistics.median(g):.1f} | {', '.join(f'{x:.1f}' for x in g)} |")
    print(f"| bare vLLM, same requests | {statistics.median(b):.1f} | {', '.join(f'{x:.1f}' for x in b)} |")
    target = 1.05 if args.timing_only else 1.10
    print(f"\noverhead ratio guard / bare = {ratio:.3f} ({(ratio - 1) * 100:+.1f} %), target <= {target:.2f}")


if __name__ == "__main__":
    main()
