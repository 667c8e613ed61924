"""How much does a busy neighbour inflate TTFT, and what does the contention reading say about it?

For each condition (quiet, one busy loop, two busy loops; `python -c 'while 1: pass'` each; a
fraction such as 0.25 is one loop busy that share of every 100 ms and asleep the rest) this
runs a real `guard check` on the CPU profile's timing pass (op budgets removed, no resampling,
the gate turned off so every run reports its numbers) and prints, per run, the contention reading
guard recorded (environment.cpu_contention in results.json) and the TTFT p50. Conditions are
interleaved (quiet, 1, 2, quiet, 1, 2, ...) so slow drifts of the machine fall on all of them.
Each run takes the engine lock (/tmp/guard-engine.lock) for itself; the busy loops start after it.

    uv run --extra cpu python benchmarks/contention.py --cycles 1 [--requests 6] [--busy 0,0.25,1,2]
    flock /tmp/guard-engine.lock uv run --extra cpu python benchmarks/contention.py --no-lock ...  # one hold for all runs
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
LOCK = "/tmp/guard-engine.lock"
BUSY = "while 1: pass"
# busy for DUTY x 100 ms, then asleep for the rest: a loop that takes DUTY of one core
DUTY_CYCLE = ("import time\nwhile 1:\n    t = time.perf_counter() + {duty} * 0.1\n    while time.perf_counter() < t: pass\n"
              "    time.sleep((1 - {duty}) * 0.1)")


def loops_for(busy: float) -> list[str]:
    """Python programs that together take ``busy`` cores: whole busy loops, then a duty-cycled one."""
    whole, part = int(busy), busy - int(busy)
    return [BUSY] * whole + ([DUTY_CYCLE.format(duty=round(part, 3))] if part > 1e-6 else [])


@contextlib.contextmanager
def engine_lock():
    with open(LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def timing_copy(src: Path, dest: Path, requests: int) -> Path:
    data = yaml.safe_load(src.read_text())
    cpu = data["profiles"]["cpu"]
    cpu["budgets"].pop("ops", None)
    cpu["budgets"]["ttft_ms"] = {"p50": 600_000}  # judged, never failing: we want the numbers
    for tokens in ("tpot_ms", "itl_ms"):  # TTFT's numbers are the point: no token budget to fail
        cpu["budgets"].pop(tokens, None)
    cpu["budgets"].pop("ttft_hardware", None)
    cpu["workload"]["requests"] = requests
    cpu["statistics"] = {"confidence": 0.95}  # no resampling rounds
    cpu["validity"] = {"max_other_cpu_pct": 100}  # the gate off: every run reports
    dest.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


def one_run(thresholds: Path, out: Path, busy: float, lock: bool = True) -> dict:
    guard = shutil.which("guard", path=str(Path(sys.executable).parent)) or "guard"
    with engine_lock() if lock else contextlib.nullcontext():
        loops = [subprocess.Popen([sys.executable, "-c", code]) for code in loops_for(busy)]
        try:
            t0 = time.perf_counter()
            proc = subprocess.run([guard, "check", "--thresholds", str(thresholds), "--output", str(out)],
                                  capture_output=True, text=True, cwd=REPO)
            wall = time.perf_counter() - t0
        finally:
            for p in loops:
                p.kill()
                p.wait()
    res = json.loads((out / "results.json").read_text())
    run = res["run"]
    samples = [o["ttft_client_s"] for o in run["outcomes"] if not o["warmup"] and o["success"]]
    return {"busy": busy, "exit": proc.returncode, "wall_s": wall, "p50_s": statistics.median(samples),
            "n": len(samples), "contention": run["environment"].get("cpu_contention")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=1)
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--busy", default="0,1,2", help="cores of busy loops per condition, comma-separated (0.25: a duty-cycled loop)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("--no-lock", action="store_true",
                    help="do not take the engine lock per run (the caller holds it: `flock LOCK python ...`)")
    args = ap.parse_args()
    conditions = [float(x) for x in args.busy.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        thresholds = timing_copy(REPO / "thresholds" / "deepseek-ocr-2.yaml", Path(tmp) / "t.yaml", args.requests)
        for cycle in range(args.cycles):
            for busy in conditions:
                print(f"cycle {cycle + 1}/{args.cycles}: busy loops worth {busy:g} core(s) ...", flush=True)
                row = one_run(thresholds, Path(tmp) / f"out-{cycle}-{busy}", busy, lock=not args.no_lock)
                c = row["contention"] or {}
                print(f"  exit {row['exit']}, p50 {row['p50_s'] * 1000:.0f} ms (n={row['n']}), other {c.get('other_cores')}"
                      f" steal {c.get('steal_cores')} own {c.get('own_cores')} of {c.get('cpus')} cores, "
                      f"load {c.get('load_1m_start')}->{c.get('load_1m_end')}, {c.get('mhz_end')} MHz", flush=True)
                rows.append(row)
    quiet = [r["p50_s"] for r in rows if r["busy"] == 0]
    base = statistics.median(quiet) if quiet else None
    print("\nbusy loops | other cores (median) | steal | TTFT p50 (median) | vs quiet")
    for busy in conditions:
        rs = [r for r in rows if r["busy"] == busy]
        other = statistics.median((r["contention"] or {}).get("other_cores", float("nan")) for r in rs)
        steal = statistics.median((r["contention"] or {}).get("steal_cores", float("nan")) for r in rs)
        p50 = statistics.median(r["p50_s"] for r in rs)
        vs = f"{(p50 / base - 1) * 100:+.1f} %" if base else "-"
        print(f"{busy:>10g} | {other:>20.2f} | {steal:>5.2f} | {p50 * 1000:>14.0f} ms | {vs}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
