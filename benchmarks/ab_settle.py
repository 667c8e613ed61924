"""Does the timed side need a moment after the other side is stopped (and after it was itself
continued) before its request is timed? An experiment on the real A/B run stage.

Two workers as in ``guard check --baseline`` (the baseline is this interpreter: identical sides),
warm-up, then measured pairs in ABBA units of 2 pairs, the units cycling through the
``--settle`` values (seconds slept between stopping one side and timing the other; the side
about to be timed was continued right before). Per value: the per-pair spread (SD of the log
ratio, what A/B decides under), each side's request-to-request spread, and the mean TTFT.

    uv run --extra cpu python benchmarks/ab_settle.py --settle 0,1 --units 6
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def spread_pct(values) -> float:
    values = list(values)
    return statistics.stdev(math.log(v) for v in values) * 100 if len(values) > 1 else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settle", default="0,1", help="seconds, comma-separated; cycled per ABBA unit")
    ap.add_argument("--units", type=int, default=6, help="ABBA units (2 pairs each) per settle value")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    settles = [float(x) for x in args.settle.split(",")]

    from guard.model.checks import pairs
    from guard.measure.ab_run import ABRun
    from guard.config.loading import load_thresholds
    from guard.measure.hardware import detect
    from guard.measure.fit import select_profile

    thresholds = load_thresholds(REPO / "thresholds" / "deepseek-ocr-2.yaml")
    hw = detect()
    profile = select_profile(thresholds, "cpu", hw)  # in the dtype this CPU runs (float32 without native bf16)
    profile = dataclasses.replace(profile, ops=(), census=None, ttft_vs_baseline_pct={})  # timing only
    rows = []
    with tempfile.TemporaryDirectory(prefix="guard-ab-settle-") as tmp, \
            ABRun(thresholds, profile, hw, Path(tmp), sys.executable, progress=lambda m: print(m, file=sys.stderr)) as run:
        run.start()
        run.warm_up()
        for unit in range(args.units):
            for settle in settles:
                run.settle_s = settle
                before = {p.index for p in pairs(run.record.candidate.outcomes, run.record.baseline.outcomes)}
                first_block = run._blocks
                run.measure(2)
                new = [p for p in pairs(run.record.candidate.outcomes, run.record.baseline.outcomes) if p.index not in before]
                for k, p in enumerate(new):
                    rows.append({"settle_s": settle, "unit": unit, "candidate_first": (first_block + k) % 2 == 0,
                                 "candidate_s": p.candidate_s, "baseline_s": p.baseline_s})
                print(json.dumps(rows[-2:]), file=sys.stderr, flush=True)
    print("| settle | pairs | per-pair spread | candidate spread | baseline spread | mean TTFT | continued side slower by |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for settle in settles:
        mine = [r for r in rows if r["settle_s"] == settle]
        ratios = [r["candidate_s"] / r["baseline_s"] for r in mine]
        # the side timed second in a pair was the one continued just before: its log excess over the first
        second_slower = [math.log(r["baseline_s"] / r["candidate_s"]) if r["candidate_first"]
                         else math.log(r["candidate_s"] / r["baseline_s"]) for r in mine]
        mean_ms = statistics.mean([r["candidate_s"] for r in mine] + [r["baseline_s"] for r in mine]) * 1000
        print(f"| {settle:g} s | {len(mine)} | {spread_pct(ratios):.1f} % | {spread_pct(r['candidate_s'] for r in mine):.1f} % "
              f"| {spread_pct(r['baseline_s'] for r in mine):.1f} % | {mean_ms:.0f} ms | {statistics.mean(second_slower) * 100:+.1f} % |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
