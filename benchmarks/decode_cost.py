"""What the decode census and its request mixes cost: `guard check --only ops` with a model's
request mixes (the default set, or the profile's own) against the same check with `profile_mixes: {}`.

Per model and repetition, two real checks in fresh processes, alternating which goes first: the
wall time of each, guard's own run.duration_s, and what the mixes' part of the profile pass added
(run.census_s, the counting; the rest is the mixes' warm-up and profiled requests). Prints the
median ratio with / without per model and writes the rows as JSON. The counts do not depend on
the machine's speed; these times do: say whether other work shared the machine when quoting them.
Starts vLLM engines, one at a time: use the engine lock.

    flock /tmp/guard-engine.lock uv run --extra cpu python benchmarks/decode_cost.py --reps 2 --out /tmp/decode-cost.json
    ... --model deepseek-ocr-2 qwen2-5-vl
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def variant(model: str, tmp: Path, mixes: bool) -> Path:
    """The model's budget file with its cpu profile's mixes kept, or dropped (``profile_mixes: {}``)."""
    src = REPO / "thresholds" / f"{model}.yaml"
    data = yaml.safe_load(src.read_text())
    cpu = data["profiles"]["cpu"]
    census = cpu["budgets"].get("census")
    if census is None:
        raise SystemExit(f"{model}: the cpu profile has no census rule, so no decode census")
    for key in ("baseline", "baseline_without_native_bf16", "baseline_with_amx"):
        if key in census:
            census[key] = str((src.parent / census[key]).resolve())
    if not mixes:
        cpu["workload"]["profile_mixes"] = {}
    path = tmp / f"{model}-{'mixes' if mixes else 'none'}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def check(thresholds: Path, out: Path) -> dict:
    t = time.perf_counter()
    proc = subprocess.run([str(Path(sys.executable).parent / "guard"), "check", "--only", "ops", "--thresholds",
                           str(thresholds), "--output", str(out)], capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - t
    row = {"exit": proc.returncode, "wall_s": round(wall, 1)}
    results = out / "results.json"
    if results.exists():
        run = json.loads(results.read_text())["run"]
        row.update(duration_s=run.get("duration_s"), census_s=run.get("census_s"),
                   mixes_counted=sorted(run.get("decode_census", {})))
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", nargs="+", default=["deepseek-ocr-2"])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("/tmp/decode-cost.json"))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="decode-cost-"))
    rows = []
    for model in args.model:
        files = {True: variant(model, tmp, True), False: variant(model, tmp, False)}
        for rep in range(args.reps):
            for mixes in ((True, False) if rep % 2 == 0 else (False, True)):
                print(f"[decode-cost] {model} rep {rep + 1}: {'with' if mixes else 'without'} request mixes ...", flush=True)
                row = {"model": model, "rep": rep, "mixes": mixes,
                       **check(files[mixes], tmp / f"{model}-{rep}-{'with' if mixes else 'without'}")}
                print(f"[decode-cost]   {row}", flush=True)
                rows.append(row)
    summary = {}
    for model in args.model:
        walls = {m: [r["wall_s"] for r in rows if r["model"] == model and r["mixes"] == m and r["exit"] == 0]
                 for m in (True, False)}
        if walls[True] and walls[False]:
            w, wo = statistics.median(walls[True]), statistics.median(walls[False])
            summary[model] = {"with_s": w, "without_s": wo, "ratio": round(w / wo, 3)}
            print(f"{model}: guard check --only ops {w:.0f} s with its request mixes, {wo:.0f} s without: {w / wo:.2f}x")
    args.out.write_text(json.dumps({"rows": rows, "summary": summary}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
