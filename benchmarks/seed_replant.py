"""The seed, re-planted: vLLM PR #49531's per-sample mask loop in a DeepSeek-OCR-2 that is real in
structure, at the seed's image size, priced, against what the PR measured (issue #58 item 4).

    uv run --extra cpu python benchmarks/seed_replant.py              # ~3 min on 2 cores
    uv run --extra cpu python benchmarks/seed_replant.py --json FILE  # also write the numbers

It runs the shipped checkpoint, real in structure (12 language layers, 11 of them MoE with 64 experts,
6 a token, 2 shared, from guard/models/real-configs/deepseek-ocr-2.json; widths tiny), writes a
budget file from the shipped `cpu` profile with the `a10` profile's image size (the PR's
measurement), counts one clean request (`guard check --only ops`), writes that census as the
baseline (`guard update-thresholds --only census`), then counts the request again with the
pre-#49531 mask injected (`--inject legacy-mask`), all through guard's own commands. It prints the
index writes the loop made, the census finding's GPU price (guard.judge.pricing's constants:
estimates until benchmarks/gpu_cost.py calibrates them) and how that compares with the PR:
TTFT p50 4193 -> 2283 ms at concurrency 10 on an A10, which by Little's law is ~192 ms of engine
time a request at its images' ~2,293 index writes (docs/gpu-cost.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from guard.config import structure  # noqa: E402

MODEL = "deepseek-ocr-2"
SHIPPED = ROOT / "thresholds" / f"{MODEL}.yaml"
# vLLM PR #49531 on an A10 (its description): TTFT p50 before and after, throughput before and after
# at concurrency 10, and the profiler's index writes over its 100 requests
PR = {"ttft_p50_ms": (4193.0, 2283.0), "req_per_s": (2.36, 4.31), "concurrency": 10, "index_writes": 229_296,
      "requests": 100}
MASK_FUNCTION = "_update_causal_mask"


def checkpoint(folder: Path) -> Path:
    """A copy of the shipped checkpoint (real in structure, tiny in width)."""
    shutil.copytree(structure.tiny_folder(MODEL), folder)
    return folder


def budget_file(folder: Path, model: Path) -> tuple[Path, list[int]]:
    """The shipped cpu profile on ``model`` at the a10 profile's image size, op counts and census only."""
    data = yaml.safe_load(SHIPPED.read_text())
    size = data["profiles"]["a10"]["workload"]["image_sizes"][0]
    cpu = data["profiles"]["cpu"]
    data["profiles"] = {"cpu": cpu}
    cpu["engine"].update(model=str(model), max_model_len=4096)
    cpu["workload"].update(profile_image_sizes=[size], profile_mixes={}, max_tokens=1)
    budgets = cpu["budgets"]
    for key in ("tpot_ms", "itl_ms", "modes", "ttft_vs_baseline_pct"):
        budgets.pop(key, None)
    budgets["census"] = {"baseline": "seed.cpu.census.json"}
    path = folder / f"{MODEL}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, size


def guard(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("guard", path=str(Path(sys.executable).parent)) or "guard"
    print("$ guard " + " ".join(args), flush=True)
    return subprocess.run([exe, *args], capture_output=True, text=True)


def replant(folder: Path) -> dict:
    model = checkpoint(folder / "checkpoint")
    budgets, size = budget_file(folder, model)
    clean = guard("check", "--thresholds", str(budgets), "--only", "ops", "--output", str(folder / "clean"))
    if clean.returncode not in (0, 3):  # 3: no baseline yet, which the next step writes
        raise SystemExit(f"the clean count failed (exit {clean.returncode}):\n{clean.stdout[-3000:]}{clean.stderr[-2000:]}")
    wrote = guard("update-thresholds", "--from", str(folder / "clean" / "results.json"), "--profile", "cpu",
                  "--thresholds", str(budgets), "--only", "census")
    if wrote.returncode != 0:
        raise SystemExit(f"writing the census baseline failed:\n{wrote.stdout[-2000:]}{wrote.stderr[-2000:]}")
    legacy = guard("check", "--thresholds", str(budgets), "--only", "ops", "--inject", "legacy-mask",
                   "--output", str(folder / "legacy"))
    if legacy.returncode != 1:
        raise SystemExit(f"the re-planted loop was not a regression (exit {legacy.returncode}):\n{legacy.stdout[-3000:]}")
    results = json.loads((folder / "legacy" / "results.json").read_text())
    (finding,) = [c for c in results["checks"]["census"] if c["function"].endswith(MASK_FUNCTION) and c["status"] == "fail"]
    costs = {g["gpu"]: g["ms_per_request"] for g in finding.get("gpu_costs", [])}
    deltas = {d["op"]: d["delta_calls"] for d in finding["op_deltas"]}
    language = json.loads((model / "config.json").read_text())["language_config"]
    return {"checkpoint": "shipped: real in structure", "image_size": size,
            "language_layers": language["num_hidden_layers"], "moe_layers": language["num_hidden_layers"]
            - min(language["first_k_dense_replace"], language["num_hidden_layers"]),
            "experts": language["n_routed_experts"], "index_writes": deltas.get("aten::_index_put_impl_"),
            "op_calls_added": finding["measured_calls"] - (finding["baseline_calls"] or 0),
            "predicted_ms_per_request": costs}


def compare(found: dict) -> dict:
    """The prediction against the PR, request by request and as TTFT at its concurrency."""
    (before, after), (tput_before, tput_after) = PR["ttft_p50_ms"], PR["req_per_s"]
    own_ms = (1 / tput_before - 1 / tput_after) * 1000  # a request's own engine time saved (Little's law)
    writes_pr = PR["index_writes"] / PR["requests"]
    scale = found["index_writes"] / writes_pr  # this image's loop against the PR's images' average
    a10 = found["predicted_ms_per_request"].get("A10")
    out = {"pr_ttft_saving_ms": before - after, "pr_own_ms_per_request": round(own_ms, 1),
           "pr_index_writes_per_request": round(writes_pr), "this_loop_vs_pr_images": round(scale, 3),
           "pr_own_ms_at_this_loop": round(own_ms * scale, 1)}
    if a10 is not None:
        out |= {"predicted_a10_ms_per_request": a10, "predicted_ttft_saving_ms_at_concurrency": round(a10 * PR["concurrency"], 1),
                "prediction_over_pr_own": round(a10 / (own_ms * scale), 2),
                "prediction_over_pr_ttft": round(a10 * PR["concurrency"] / (before - after), 2)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the numbers to this file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="guard-seed-") as tmp:
        found = replant(Path(tmp))
    numbers = {**found, **compare(found)}
    print(json.dumps(numbers, indent=2))
    if args.json:
        args.json.write_text(json.dumps(numbers, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
