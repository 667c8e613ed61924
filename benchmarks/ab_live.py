"""Live A/B runs: the real `guard check --baseline` (and a plain `guard check`), repeated. Not a test.

Runs, in an interleaved order so that slow phases of a shared machine spread over all kinds:
identical sides (the baseline interpreter holds the same vLLM), the candidate slowed by
``--inject slow-encoder:P%``, and plain absolute checks (for the wall-time comparison). Each run is a
fresh `guard check` process writing its own output folder; this script prints one line per run and
a summary table, and writes everything to ``--summary`` (JSON). The results.json files it leaves
are the pools ``benchmarks/ab_sensitivity.py --from-results`` simulates from.

Wrap it in the engine lock on a shared machine:
    flock /tmp/guard-engine.lock uv run --extra cpu python benchmarks/ab_live.py --baseline /tmp/baseline-venv/bin/python
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

IDENTICAL, SLOW, PLAIN = "identical", "slow", "plain"


def plan(identical: int, slow: int, plain: int) -> list[str]:
    """Interleave the kinds: identical, slow, plain, identical, slow, ..."""
    left = {IDENTICAL: identical, SLOW: slow, PLAIN: plain}
    out: list[str] = []
    while any(left.values()):
        for kind in (IDENTICAL, SLOW, PLAIN):
            if left[kind]:
                out.append(kind)
                left[kind] -= 1
    return out


def guard_exe() -> str:
    return shutil.which("guard", path=str(Path(sys.executable).parent)) or "guard"


def run_one(kind: str, n: int, args: argparse.Namespace) -> dict:
    out = args.output / f"{kind}-{n}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [guard_exe(), "check", "--thresholds", args.thresholds, "--profile", args.profile, "--output", str(out)]
    if kind != PLAIN:
        cmd += ["--baseline", args.baseline]
    if kind == SLOW:
        cmd += ["--inject", args.inject]
    t0 = time.perf_counter()
    with open(args.output / f"{kind}-{n}.log", "w") as log:
        code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    wall = time.perf_counter() - t0
    row = {"kind": kind, "n": n, "exit_code": code, "wall_s": round(wall, 1), "output": str(out)}
    try:
        res = json.loads((out / "results.json").read_text())
    except (OSError, ValueError):
        return row
    row["verdict"] = res["verdict"]
    ratio = res["checks"].get("ttft_vs_baseline") or []
    if ratio:
        c = ratio[0]
        row.update(ratio_pct=round(c["measured_pct"], 2), interval_pct=c["interval_pct"], pairs=c["pairs"],
                   status=c["status"], candidate_ms=round(c["candidate_ms"]), baseline_ms=round(c["baseline_ms"]))
    slept = res["run"]["environment"].get("injected_sleep_s")
    if slept and ratio:
        per_request = slept / ratio[0]["pairs"]
        row.update(injected_ms=round(per_request * 1000), injected_pct=round(per_request * 1000 / ratio[0]["baseline_ms"] * 100, 2))
    ttft = res["checks"].get("ttft") or []
    if ttft and kind == PLAIN:
        row.update(p50_ms=round(ttft[0]["measured_ms"]), status=ttft[0]["status"], samples=ttft[0]["samples"])
    if kind != PLAIN:  # whether the baseline side's op-count pass was profiled or read from guard's cache
        row["baseline_ops"] = res["ab"]["baseline"]["environment"].get("worker", {}).get("op_counts_cache", {}).get("status")
    row["invalid_reasons"] = [*res["run"]["invalid_reasons"], *res["judged_invalid_reasons"]][:3]
    return row


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", required=True, help="python of the baseline environment (the same vLLM)")
    p.add_argument("--identical", type=int, default=2)
    p.add_argument("--slow", type=int, default=2)
    p.add_argument("--plain", type=int, default=1)
    p.add_argument("--inject", default="slow-encoder:5%")
    p.add_argument("--thresholds", default="thresholds/deepseek-ocr-2.yaml")
    p.add_argument("--profile", default="cpu")
    p.add_argument("--deadline", default=None, help="UTC HH:MM: start no run after it")
    p.add_argument("--output", type=Path, default=Path("guard-results/ab-live"))
    p.add_argument("--summary", type=Path, default=None, help="JSON summary (default: OUTPUT/summary-<time>.json)")
    args = p.parse_args(argv)
    args.output.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%H%M%S")
    summary = args.summary or args.output / f"summary-{stamp}.json"
    rows = []
    counters = {IDENTICAL: 0, SLOW: 0, PLAIN: 0}
    for kind in plan(args.identical, args.slow, args.plain):
        now = dt.datetime.now(dt.timezone.utc)
        if args.deadline and now.strftime("%H:%M") >= args.deadline:
            print(f"deadline {args.deadline} reached: stopping", flush=True)
            break
        counters[kind] += 1
        print(f"{now:%H:%M:%S} {kind} run {counters[kind]} ...", flush=True)
        row = run_one(kind, int(stamp + f"{counters[kind]:02d}"), args)
        rows.append(row)
        print(json.dumps(row), flush=True)
        summary.write_text(json.dumps({"baseline": args.baseline, "inject": args.inject, "runs": rows}, indent=2) + "\n")
    print("\n| run | exit | verdict | ratio p50 | interval | pairs | baseline op counts | wall |\n"
          "|---|---:|---|---:|---|---:|---|---:|")
    for r in rows:
        iv = r.get("interval_pct")
        ivs = f"[{iv[0]:+.1f}, {iv[1]:+.1f}] %" if iv and None not in iv else ("open" if iv else "—")
        ratio = f"{r['ratio_pct']:+.1f} %" if "ratio_pct" in r else (f"p50 {r['p50_ms']} ms" if "p50_ms" in r else "—")
        print(f"| {r['kind']} | {r['exit_code']} | {r.get('verdict', '—')} | {ratio} | {ivs} | {r.get('pairs', '—')} "
              f"| {r.get('baseline_ops') or '—'} | {r['wall_s']:.0f} s |")
    print(f"\nsummary: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
