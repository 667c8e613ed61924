"""Does the census catch each loop mutant, and let the clean rewrite and the refactors pass?

For every mutant in guard/measure/mutants.py, runs the real `guard check --only ops --inject mutant:NAME` (a
fresh process and engine each; op counts only) on a small copy of the CPU profile (one profiled
request per size), and prints its exit code, whether that is the expected one (1 for a loop
mutant; 0 for the rewrite and for the `move-*` refactors, whose ops only move into a new helper),
and the census lines naming the function. Detection = loop mutants at exit 1; false alarms =
refactors and the rewrite not at exit 0.

    flock /tmp/guard-engine.lock uv run --extra cpu python benchmarks/census_mutants.py
    ... --only token-item,rewrite-clean
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def small_yaml(tmp: Path, sizes: list[list[int]]) -> Path:
    src = REPO / "thresholds" / "deepseek-ocr-2.yaml"
    data = yaml.safe_load(src.read_text())
    cpu = data["profiles"]["cpu"]
    cpu["workload"].update(requests=2, warmup_requests=1, profile_image_sizes=sizes)
    cpu["statistics"] = {"confidence": 0.95}
    cpu["budgets"]["ttft_ms"] = {"p50": 600_000}
    for tokens in ("tpot_ms", "itl_ms"):  # TTFT's numbers are the point: no token budget to fail
        cpu["budgets"].pop(tokens, None)
    census = cpu["budgets"].get("census")
    if census is None:
        raise SystemExit("the cpu profile has no census rule")
    census["baseline"] = str((src.parent / census["baseline"]).resolve())
    path = tmp / "small.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def main() -> int:
    from guard.measure.mutants import MUTANTS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated mutant names (default: all)")
    ap.add_argument("--sizes", default="640x480", help="profiled image sizes, e.g. 640x480,800x400")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or list(MUTANTS)
    sizes = [[int(x) for x in s.split("x")] for s in args.sizes.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="census-mutants-"))
    thresholds = small_yaml(tmp, sizes)
    rows = []
    for name in names:
        m = MUTANTS[name]
        out = tmp / name
        print(f"[mutants] guard check --inject mutant:{name} ({m.what}) ...", flush=True)
        t = time.perf_counter()
        proc = subprocess.run([str(Path(sys.executable).parent / "guard"), "check", "--thresholds", str(thresholds),
                               "--output", str(out), "--only", "ops", "--inject", f"mutant:{name}"],
                              capture_output=True, text=True, cwd=REPO)
        wall = time.perf_counter() - t
        expected = 1 if m.expect == "fail" else 0
        named = [line.strip() for line in proc.stdout.splitlines() if m.function.rsplit(":", 1)[1].split(".")[-1] in line
                 and ("->" in line or "→" in line)]
        census_failures = []
        results = out / "results.json"
        if results.exists():
            data = json.loads(results.read_text())
            census_failures = [c["function"] for c in data.get("checks", {}).get("census", []) if c["status"] == "fail"]
        ok = proc.returncode == expected and (expected == 0 or m.function in census_failures)
        rows.append((name, m.expect, proc.returncode, ok, wall, census_failures, named))
        print(f"[mutants] {name}: exit {proc.returncode} (expected {expected}) {'OK' if ok else 'WRONG'} in {wall:.0f} s",
              flush=True)
        if not ok:
            print(proc.stdout[-4000:], proc.stderr[-2000:])
    print()
    print("mutant              expect  exit  ok   failing census functions / lines naming the function")
    for name, expect, code, ok, wall, failures, named in rows:
        print(f"{name:<19} {expect:<7} {code:>4}  {'yes' if ok else 'NO ':<4} {', '.join(failures) or '-'}")
        for line in named[:3]:
            print(f"{'':<37}{line}")
    loops = [r for r in rows if r[1] == "fail"]
    clean = [r for r in rows if r[1] == "pass"]
    print(f"\ndetection: {sum(r[3] for r in loops)} of {len(loops)} loop mutants failed naming their function; "
          f"false alarms: {sum(not r[3] for r in clean)} of {len(clean)} refactors/rewrites; "
          f"median {sorted(r[4] for r in rows)[len(rows) // 2]:.0f} s a run")
    return 0 if all(r[3] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
