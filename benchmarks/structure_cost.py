"""What the census costs per guarded model: engine start, census time, peak memory, wall (issue #58).

For each model (default: every thresholds/*.yaml), in a fresh process of its own:

    guard check --model NAME --only ops --output OUT/NAME

and prints, per model: the exit code, the wall seconds, the engine's start ("engine ready in" as
guard prints it), the census's own seconds (results.json ``run.census_s``), the profiled requests'
op calls, and the peak resident memory of the process tree (GNU time's "Maximum resident set size":
the largest single process, the engine's child). Then the whole matrix's wall, and with ``--before
FILE`` each column against an earlier run of this script (the issue's cap: 1.5x).

    uv run --extra cpu python benchmarks/structure_cost.py --out /tmp/cost-after.json \
        --before benchmarks/structure-cost-tiny-cpu.json

Run it alone on the machine: the seconds are wall-clock. The op calls are exact.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COLUMNS = ("wall_s", "engine_ready_s", "census_s", "peak_rss_mb")


def models() -> list[str]:
    return sorted(p.stem for p in (REPO / "thresholds").glob("*.yaml"))


def one(model: str, out: Path) -> dict:
    guard = str(Path(sys.executable).parent / "guard")
    cmd = ["/usr/bin/time", "-v", guard, "check", "--model", model, "--only", "ops", "--output", str(out)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - t0
    text = done.stdout + done.stderr
    ready = re.findall(r"engine ready in ([0-9.]+) s", text)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    row = {"model": model, "exit": done.returncode, "wall_s": round(wall, 1),
           "engine_ready_s": float(ready[0]) if ready else None,
           "peak_rss_mb": round(int(rss.group(1)) / 1024) if rss else None}
    results = out / "results.json"
    if results.exists():
        run = json.loads(results.read_text())["run"]
        row["census_s"] = run.get("census_s")
        row["op_calls"] = {size: sum(sum(ops.values()) for ops in fns.values())
                           for size, fns in (run.get("census") or {}).items()} or None
        row["functions"] = {size: len(fns) for size, fns in (run.get("census") or {}).items()} or None
    else:
        row["census_s"] = None
    (out / "stdout.txt").write_text(text)
    return row


def ratio(now: float | None, before: float | None) -> str:
    return f"{now / before:.2f}x" if now and before else "-"


def show(rows: list[dict], before: dict[str, dict]) -> None:
    print(f"{'model':16} {'exit':>4} {'wall s':>7} {'ready s':>8} {'census s':>9} {'peak MB':>8}  op calls")
    for r in rows:
        b = before.get(r["model"], {})
        print(f"{r['model']:16} {r['exit']:>4} {r['wall_s']:>7} {r['engine_ready_s'] or '-':>8} "
              f"{r['census_s'] or '-':>9} {r['peak_rss_mb'] or '-':>8}  {r.get('op_calls')}")
        if b:
            print(f"{'  vs before':16} {'':>4} " + " ".join(
                f"{ratio(r.get(c), b.get(c)):>{w}}" for c, w in zip(COLUMNS, (7, 8, 9, 8))) + f"  {b.get('op_calls')}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="*", help="models (default: every thresholds/*.yaml)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON this run writes")
    parser.add_argument("--before", type=Path, help="an earlier run's JSON to compare with")
    args = parser.parse_args()
    earlier = json.loads(args.before.read_text()) if args.before else None
    before = {r["model"]: r for r in earlier["models"]} if earlier else {}
    rows = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="guard-structure-cost-") as tmp:
        for model in args.model or models():
            print(f"--- {model}", flush=True)
            rows.append(one(model, Path(tmp) / model))
            print(json.dumps(rows[-1]), flush=True)
    total = round(time.perf_counter() - t0, 1)
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    args.out.write_text(json.dumps({"commit": git, "matrix_wall_s": total, "models": rows}, indent=1) + "\n")
    show(rows, before)
    print(f"matrix: {total} s" + (f" ({ratio(total, earlier['matrix_wall_s'])} before)" if earlier else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
