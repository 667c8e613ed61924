"""Cost of server mode: `guard check --engine-mode server` against the in-process `guard check`.

Runs both on the same thresholds file, alternately as fresh processes (in-process first), and
prints each run's wall time and verdict, the medians per mode, and the ratio. Server mode spends an
extra engine start: the TTFT pass goes through `vllm serve`, then the op-count pass starts an
in-process engine (docs/server-mode.md says why). The default stays in-process unless server mode
costs at most +20 %.

    flock /tmp/guard-engine.lock uv run --extra cpu python benchmarks/server_cost.py [--pairs 1]
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

from guard.config.budgets import DEFAULT_THRESHOLDS


def run_check(mode: str, thresholds: str, out: Path) -> tuple[float, int, dict]:
    cmd = [sys.executable, "-m", "guard.cli", "check", "--thresholds", thresholds, "--output", str(out),
           "--engine-mode", mode]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    results = out / "results.json"
    res = json.loads(results.read_text()) if results.exists() else {}
    tail = "\n".join(proc.stdout.strip().splitlines()[-12:])
    print(f"--- {mode}: exit {proc.returncode}, {wall:.1f} s\n{tail}", flush=True)
    return wall, proc.returncode, res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--thresholds", default=DEFAULT_THRESHOLDS)
    ap.add_argument("--pairs", type=int, default=1)
    ap.add_argument("--keep", default=None, help="folder to keep each run's output in (default: a temp folder)")
    ap.add_argument("--fixed-requests", action="store_true",
                    help="no resampling rounds (statistics.max_requests removed), so both modes send the same "
                         "number of requests and the wall times compare the modes, not the noise")
    args = ap.parse_args()
    base = Path(args.keep or tempfile.mkdtemp(prefix="guard-server-cost-"))
    base.mkdir(parents=True, exist_ok=True)
    if args.fixed_requests:
        import yaml

        data = yaml.safe_load(Path(args.thresholds).read_text())
        for prof in data["profiles"].values():
            prof.get("statistics", {}).pop("max_requests", None)
        fixed = base / "thresholds-fixed.yaml"
        fixed.write_text(yaml.safe_dump(data, sort_keys=False))
        args.thresholds = str(fixed)
    walls: dict[str, list[float]] = {"in-process": [], "server": []}
    rows = []
    for i in range(args.pairs):
        for mode in ("in-process", "server"):
            wall, code, res = run_check(mode, args.thresholds, base / f"{mode}-{i}")
            walls[mode].append(wall)
            ttft = [o["ttft_client_s"] for o in res.get("run", {}).get("outcomes", [])
                    if not o["warmup"] and o["success"]]
            rows.append((mode, i, wall, code, res.get("verdict"), statistics.median(ttft) if ttft else None))
    print()
    print(f"{'mode':<11} {'run':>3} {'wall s':>8} {'exit':>4} {'verdict':<10} {'TTFT p50 ms':>11}")
    for mode, i, wall, code, verdict, p50 in rows:
        print(f"{mode:<11} {i:>3} {wall:>8.1f} {code:>4} {str(verdict):<10} {'' if p50 is None else f'{p50 * 1000:.0f}':>11}")
    med = {m: statistics.median(v) for m, v in walls.items()}
    ratio = med["server"] / med["in-process"]
    print(f"median wall: in-process {med['in-process']:.1f} s, server {med['server']:.1f} s, ratio {ratio:.3f} "
          f"({(ratio - 1) * 100:+.0f} %); default stays in-process unless <= +20 %")
    print(f"outputs in {base}")


if __name__ == "__main__":
    main()
