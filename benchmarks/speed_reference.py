"""Does guard's speed reference (guard.measure.speedref) move with TTFT when the machine slows down, and
how much does it move on its own?

One in-process engine (the `cpu` profile), one warm-up, then cycles of: a speed reading, one
measured request. Conditions interleave in blocks of ``--per`` cycles:

- ``quiet``: nothing else;
- ``quota:Q``: this process (engine included) under a CFS CPU quota of Q cores (cgroup v1
  ``cpu.cfs_quota_us``, root only): a slowdown the contention gate cannot see, since no other
  process runs; what a container's CPU limit or a VM's host does.

Per condition it prints the median TTFT and the median reading, and their change against quiet.
The quiet cycles also give the reading's own spread: the gate's threshold
(``validity.max_slowdown_pct``) must sit well above it.

    uv run --extra cpu python benchmarks/speed_reference.py --conditions quiet,quota:1.6,quota:1.3 --per 4 --cycles 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CGROUP = Path("/sys/fs/cgroup/cpu/guard-speedref")
ROOT_CGROUP = Path("/sys/fs/cgroup/cpu")


@contextlib.contextmanager
def quota(cores: float | None):
    """This process's threads under a CFS quota of ``cores`` (None: no limit)."""
    if cores is None:
        yield
        return
    CGROUP.mkdir(exist_ok=True)
    (CGROUP / "cpu.cfs_period_us").write_text("100000")
    (CGROUP / "cpu.cfs_quota_us").write_text(str(int(cores * 100000)))
    tids = os.listdir(f"/proc/{os.getpid()}/task")
    for tid in tids:
        with contextlib.suppress(OSError):
            (CGROUP / "tasks").write_text(tid)
    try:
        yield
    finally:
        for tid in os.listdir(f"/proc/{os.getpid()}/task"):
            with contextlib.suppress(OSError):
                (ROOT_CGROUP / "tasks").write_text(tid)
        with contextlib.suppress(OSError):
            CGROUP.rmdir()  # empty again: leave no quota group behind


def parse_condition(text: str) -> tuple[str, float | None]:
    if text == "quiet":
        return text, None
    kind, _, value = text.partition(":")
    if kind != "quota" or not value:
        raise SystemExit(f"unknown condition {text!r}: quiet or quota:CORES")
    return text, float(value)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conditions", default="quiet,quota:1.6")
    ap.add_argument("--per", type=int, default=4, help="cycles per condition block")
    ap.add_argument("--cycles", type=int, default=2, help="blocks of each condition, interleaved")
    ap.add_argument("--json", type=Path, help="write every cycle here")
    args = ap.parse_args()
    conditions = [parse_condition(c) for c in args.conditions.split(",")]
    if any(q is not None for _, q in conditions) and not ROOT_CGROUP.exists():
        raise SystemExit("quota conditions need cgroup v1's cpu controller at /sys/fs/cgroup/cpu (and root)")

    from guard.measure import speedref
    from guard.config.loading import load_thresholds
    from guard.measure.fit import on_cpu
    from guard.measure.inprocess import run_jobs, start_engine
    from guard.measure.side import plan_jobs

    from guard.measure.hardware import detect

    profile = on_cpu(load_thresholds(REPO / "thresholds" / "deepseek-ocr-2.yaml").profile("cpu"), detect(quick=True).native_bf16)
    t = time.perf_counter()
    llm = start_engine(profile.engine, seed=profile.workload.seed)
    print(f"engine ready in {time.perf_counter() - t:.1f} s", flush=True)
    index = 0

    def request(warmup: bool = False) -> float:
        nonlocal index
        jobs = plan_jobs(profile.workload, index, 1, warmup)
        index += 1
        (outcome,) = run_jobs(llm, profile.workload, jobs, lambda o: None)
        if not outcome.success:
            raise SystemExit(f"request failed: {outcome.error}")
        return outcome.ttft_client_s

    request(warmup=True)
    rows = []
    for cycle in range(args.cycles):
        for name, cores in conditions:
            with quota(cores):
                for _ in range(args.per):
                    reading = speedref.measure()
                    ttft = request()
                    rows.append({"condition": name, "cycle": cycle, "reading_ms": reading.ms,
                                 "reading_spread_pct": reading.spread_pct, "ttft_ms": round(ttft * 1000, 1)})
                    print(json.dumps(rows[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))

    def med(name, key):
        return statistics.median(r[key] for r in rows if r["condition"] == name)

    quiet = [r for r in rows if r["condition"] == "quiet"]
    print()
    print("| condition | cycles | TTFT p50 | vs quiet | speed reference (median) | vs quiet |")
    print("|---|---|---|---|---|---|")
    for name, _ in conditions:
        n = sum(1 for r in rows if r["condition"] == name)
        tt, rd = med(name, "ttft_ms"), med(name, "reading_ms")
        vs_t = f"{(tt / med('quiet', 'ttft_ms') - 1) * 100:+.1f} %" if quiet else "-"
        vs_r = f"{(rd / med('quiet', 'reading_ms') - 1) * 100:+.1f} %" if quiet else "-"
        print(f"| {name} | {n} | {tt:.0f} ms | {vs_t} | {rd:.1f} ms | {vs_r} |")
    if len(quiet) >= 3:
        logs = [math.log(r["reading_ms"]) for r in quiet]
        lt = [math.log(r["ttft_ms"]) for r in quiet]
        print(f"\nquiet: reading spread (SD of log) {statistics.stdev(logs) * 100:.1f} %, "
              f"range {(max(r['reading_ms'] for r in quiet) / min(r['reading_ms'] for r in quiet) - 1) * 100:.1f} %; "
              f"TTFT spread {statistics.stdev(lt) * 100:.1f} %; "
              f"correlation reading/TTFT {statistics.correlation(logs, lt):+.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
