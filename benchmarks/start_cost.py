"""What an engine start costs with dummy weights, and that guard's two shortcuts for them change no
weight.

For each guarded model (default: all), two fresh processes each start the CPU profile's engine:
one as vLLM builds it on its own (torch's and transformers' initialisers on, every tensor drawn
from its own seeded generator), one as guard builds it for ``load_format: dummy`` (initialisers
off, ``guard.compat.weights_left_uninitialised``; the dummy values drawn once and copied,
``guard.compat.dummy_weights_from_one_stream``). Each prints its start time and a SHA-256 over every
parameter and buffer of the live model (non-persistent buffers included); the two digests must be
equal.

    uv run --extra cpu python benchmarks/start_cost.py [model ...]

Run it alone on the machine: the start times are wall-clock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import hashlib, json, os, sys, time
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from guard.config.budgets import load_thresholds
from guard.measure import fit, hardware, inprocess
budget, skip = sys.argv[1], sys.argv[2] == "1"
profile = fit.select_profile(load_thresholds(budget), "auto", hardware.detect())
if not skip:
    import contextlib
    from guard import compat
    compat.weights_left_uninitialised = contextlib.nullcontext
    compat.dummy_weights_from_one_stream = contextlib.nullcontext
import vllm.entrypoints.llm  # imports outside the timed start, as in a run
t = time.perf_counter()
llm = inprocess.start_engine(profile.engine, seed=profile.workload.seed)
start_s = time.perf_counter() - t
digest = hashlib.sha256()
def fold(model):
    tensors = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    for name, tensor in sorted(tensors, key=lambda kv: kv[0]):
        digest.update(name.encode())
        digest.update(tensor.detach().float().contiguous().numpy().tobytes())
    return len(tensors)
count = llm.apply_model(fold)[0]  # one result per worker: one here
print("RESULT " + json.dumps({"start_s": round(start_s, 2), "sha256": digest.hexdigest(), "tensors": count}))
"""


def one(budget: Path, skip: bool) -> dict:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": ""}
    env.pop("PYTHONDONTWRITEBYTECODE")
    done = subprocess.run([sys.executable, "-c", CHILD, str(budget), "1" if skip else "0"], cwd=ROOT,
                          env=env, capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise SystemExit(f"{budget.stem}: the engine did not start (exit {done.returncode}):\n{done.stderr[-3000:]}")


def main(argv: list[str]) -> int:
    from guard.config.models import resolve

    models = [m for name in (argv or ["all"]) for m in resolve(name)]
    print(f"{'model':<18} {'start s (vLLM)':>18} {'start s (guard)':>18} {'saved':>7}  weights")
    differ = 0
    for name, budget in models:
        full, skipped = one(budget, skip=False), one(budget, skip=True)
        same = full["sha256"] == skipped["sha256"] and full["tensors"] == skipped["tensors"]
        differ += not same
        print(f"{name:<18} {full['start_s']:>18.2f} {skipped['start_s']:>18.2f} "
              f"{full['start_s'] - skipped['start_s']:>6.2f}s  "
              f"{'identical' if same else 'DIFFER'} ({full['tensors']} tensors)", flush=True)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
