"""What each op class of guard's GPU pricing costs per call on this machine's GPU: the calibration
of guard/judge/gpu_costs.json (docs/gpu-cost.md). Torch only (no vLLM); well under 5 minutes on one
CUDA GPU, most of it CUDA's start.

Each class is timed as a tight loop of one small op, the device synchronized before and after, the
median of --repeats loops of --iterations calls: kernel_launch (x.add_(1) on one element),
host_sync (x.item()), h2d_copy (a 512-byte pageable tensor copied in, as PyTorch waits for it; a
pinned non-blocking copy is timed beside it), index_write (mask[row, cols] = v with host index
tensors and a device value, the index write alone), view (x.view(16)). Then the pre-#49531 mask
loop (guard/measure/canary.py) is built --mask-builds times: its time per build, per index write,
and what the measured constants predict for it from its own op counts (torch.profiler, as the
census counts them), which says how far the pricing model is off on the loop it was made for.

    python benchmarks/gpu_cost.py --output gpu-costs.json
    python benchmarks/gpu_cost.py --output gpu-costs.json --merge-into guard/judge/gpu_costs.json
    python benchmarks/gpu_cost.py --device cpu --iterations 50 --output /tmp/dry.json   # a dry run

The output is a constants file (schema guard/gpu-costs) whose rows are this GPU's, status
"calibrated"; --merge-into replaces that GPU's rows in a constants file (or adds them). --device cpu
runs every step on the CPU, to test the script: its rows are marked as a dry run and never merged.

Exit codes: 0 written; 2 bad arguments; 3 no CUDA device (nothing measured, nothing written).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from guard.judge import pricing  # noqa: E402 - after the path: torch and the standard library only
from guard.measure.canary import expected_index_puts, legacy_create_custom_4d_mask  # noqa: E402

NO_CUDA = 3  # as guard's invalid run: nothing can be measured here
DRY_RUN = "CPU (dry run)"


def short_name(device_name: str) -> str:
    """The GPU as the constants name it: 'NVIDIA H100 80GB HBM3' -> 'H100', 'NVIDIA A10' -> 'A10',
    'NVIDIA A100-SXM4-80GB' -> 'A100'; memory size and form factor are not the GPU's name."""
    kept = []
    for word in device_name.removeprefix("NVIDIA ").replace("-", " ").split():
        if re.fullmatch(r"\d+GB|PCIe|SXM\d*|HBM\d*e?|NVL", word, re.IGNORECASE):
            break
        kept.append(word)
    return " ".join(kept) or device_name


# ----------------------------------------------------------------------------- timing
def per_call_us(step: Callable[[], object], sync: Callable[[], None], iterations: int, repeats: int) -> float:
    """The median over ``repeats`` loops of ``iterations`` calls, in microseconds per call; the
    device synchronized before each loop and at its end, so queued work is paid inside the loop."""
    for _ in range(min(iterations, 50)):  # warm: kernels loaded, allocator primed
        step()
    sync()
    loops = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iterations):
            step()
        sync()
        loops.append((time.perf_counter() - start) / iterations * 1e6)
    return statistics.median(loops)


def class_steps(torch, dev) -> dict[str, Callable[[], object]]:
    """One small op per priced class, on ``dev``."""
    one = torch.zeros(1, device=dev)
    scalar = torch.ones((), device=dev)
    src = torch.arange(64)  # 512 bytes of pageable host memory
    dst = torch.empty(64, dtype=torch.long, device=dev)
    mask = torch.zeros(512, 512, device=dev)
    cols = torch.arange(0, 512, 2)  # host index tensors, as the pre-#49531 loop had them
    zero = torch.zeros((), device=dev)  # a device value: no Python scalar to send (that is h2d_copy's)
    square = torch.zeros(4, 4, device=dev)
    return {
        "kernel_launch": lambda: one.add_(1),
        "host_sync": lambda: scalar.item(),
        "h2d_copy": lambda: dst.copy_(src),
        "index_write": lambda: mask.__setitem__((7, cols), zero),
        "view": lambda: square.view(16),
    }


def measure_classes(torch, dev, sync, iterations: int, repeats: int) -> dict[str, float]:
    steps = class_steps(torch, dev)
    out = {}
    for cls in pricing.PRICED_CLASSES:
        out[str(cls)] = per_call_us(steps[str(cls)], sync, iterations, repeats)
        print(f"  {cls:14} {out[str(cls)]:8.2f} us per call", flush=True)
    return out


def pinned_copy_us(torch, dev, sync, iterations: int, repeats: int) -> float | None:
    """The same copy from pinned memory, not waited for: what a pageable copy could cost instead."""
    if dev.type != "cuda":
        return None  # pinning needs a CUDA device
    src = torch.arange(64).pin_memory()
    dst = torch.empty(64, dtype=torch.long, device=dev)
    return per_call_us(lambda: dst.copy_(src, non_blocking=True), sync, iterations, repeats)


def mask_loop(torch, dev, sync, builds: int, sequence_length: int, constants: dict[str, float]) -> dict:
    """The pre-#49531 mask, built on ``dev``: measured per build, and predicted from its own op counts."""
    from torch.profiler import ProfilerActivity, profile

    build = lambda: legacy_create_custom_4d_mask(None, sequence_length, torch.float32, dev, 1)  # noqa: E731
    build()
    sync()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        build()
    ops = Counter(e.name for e in prof.events() if "::" in e.name)
    calls = pricing.class_calls(ops)
    predicted_us = sum(n * constants[str(cls)] for cls, n in calls.items())
    ms = per_call_us(build, sync, builds, 1) / 1000
    puts = expected_index_puts(sequence_length)
    return {"sequence_length": sequence_length, "builds": builds, "ms_per_build": round(ms, 3),
            "index_puts": puts, "counted_index_puts": ops.get("aten::_index_put_impl_", 0),
            "us_per_index_put": round(ms * 1000 / puts, 2), "predicted_ms": round(predicted_us / 1000, 3),
            "class_calls": {str(cls): n for cls, n in calls.items()}}


# ----------------------------------------------------------------------------- the file
def rows_for(gpu: str, constants: dict[str, float], status: str, source: str) -> list[dict]:
    return [{"gpu": gpu, "class": str(cls), "us_per_call": round(constants[str(cls)], 2), "status": status,
             "source": source} for cls in pricing.PRICED_CLASSES]


def merged(existing: dict, rows: list[dict]) -> dict:
    """A constants file with ``rows``' GPU replaced where it stood (or added at the end), checked."""
    gpu = rows[0]["gpu"]
    kept = [r for r in existing["costs"] if r["gpu"] != gpu]
    at = next((i for i, r in enumerate(existing["costs"]) if r["gpu"] == gpu), len(existing["costs"]))
    before = sum(1 for r in existing["costs"][:at] if r["gpu"] != gpu)
    out = {**existing, "costs": kept[:before] + rows + kept[before:]}
    pricing.parse_costs(out, "(merged)")
    return out


def write_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output", type=Path, required=True, help="the constants file to write (this GPU's rows)")
    ap.add_argument("--merge-into", type=Path, default=None, metavar="CONSTANTS",
                    help="also replace this GPU's rows in a constants file, e.g. guard/judge/gpu_costs.json")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a dry run of every step")
    ap.add_argument("--gpu-name", default=None, help="the name the constants give this GPU (default: from the device name)")
    ap.add_argument("--iterations", type=int, default=5000, help="calls per timed loop")
    ap.add_argument("--repeats", type=int, default=7, help="timed loops per class (the median is kept)")
    ap.add_argument("--mask-builds", type=int, default=5, help="timed builds of the pre-#49531 mask")
    ap.add_argument("--sequence-length", type=int, default=512, help="the mask's size (512: the global view)")
    args = ap.parse_args(argv)
    if min(args.iterations, args.repeats, args.mask_builds, args.sequence_length) < 1:
        ap.error("--iterations, --repeats, --mask-builds and --sequence-length must be at least 1")
    if args.device == "cpu" and args.merge_into is not None:
        ap.error("--merge-into takes a GPU's measurement; a --device cpu dry run is never merged")

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_cost: no CUDA device here (torch.cuda.is_available() is False); nothing was measured and "
              f"{args.output} was not written. Run it on a GPU machine, or --device cpu for a dry run.", file=sys.stderr)
        return NO_CUDA
    dev = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    device_name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else (platform.processor() or platform.machine())
    gpu = DRY_RUN if dev.type == "cpu" else (args.gpu_name or short_name(device_name))
    date = datetime.date.today().isoformat()
    print(f"gpu_cost: {device_name} ({gpu}), torch {torch.__version__}, {args.iterations} calls x {args.repeats}", flush=True)

    constants = measure_classes(torch, dev, sync, args.iterations, args.repeats)
    pinned = pinned_copy_us(torch, dev, sync, args.iterations, args.repeats)
    if pinned is not None:
        print(f"  {'(pinned copy)':14} {pinned:8.2f} us per call, not waited for", flush=True)
    loop = mask_loop(torch, dev, sync, args.mask_builds, args.sequence_length, constants)
    print(f"  pre-#49531 mask, S={loop['sequence_length']}: {loop['ms_per_build']} ms a build, "
          f"{loop['us_per_index_put']} us per index write; the constants predict {loop['predicted_ms']} ms", flush=True)

    if dev.type == "cpu":
        status, source = "estimate", (f"benchmarks/gpu_cost.py --device cpu on {device_name}, {date}: a dry run of the "
                                      "script, which measures no GPU")
    else:
        status, source = "calibrated", f"benchmarks/gpu_cost.py on {device_name}, {date}"
    data = {"schema": pricing.COSTS_SCHEMA, "schema_version": pricing.COSTS_SCHEMA_VERSION,
            "costs": rows_for(gpu, constants, status, source),
            "measured": {"device": device_name, "torch": torch.__version__, "date": date, "iterations": args.iterations,
                         "repeats": args.repeats, "us_per_call": {k: round(v, 3) for k, v in constants.items()},
                         "pinned_h2d_copy_us": None if pinned is None else round(pinned, 3), "mask_loop": loop}}
    pricing.parse_costs(data, str(args.output))  # what it writes, guard can read
    write_atomic(args.output, data)
    print(f"gpu_cost: wrote {args.output}")
    if args.merge_into is not None:
        existing = json.loads(args.merge_into.read_text(encoding="utf-8"))
        write_atomic(args.merge_into, merged(existing, data["costs"]))
        print(f"gpu_cost: {gpu}'s rows in {args.merge_into} are now calibrated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
