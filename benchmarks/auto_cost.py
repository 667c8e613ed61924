"""What a shared-code pull request costs on every model: `guard pr --model auto --only ops`, base warm.

Builds a vLLM repository from the installed sources (tests/vllm_repo.py) and two heads on base, each
a one-line change to shared code (so `--model auto` picks every guarded model), then times, each a
fresh process with one --cache-dir:

  warm-base     head 1 with an empty cache: every model's base and head environment built and
                profiled (what guard-main.yml leaves in the cache for base, and more)
  base-warm     head 2: base's op counts of every model from the cache, every model's head profiled:
                what a pull request's job costs once main's cache holds its base (issue #57's target:
                within 5 minutes on a 2-core runner)

and prints the per-model seconds `guard pr` reports in its summary. Run it alone on the machine:

    uv run --extra cpu python benchmarks/auto_cost.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
SHARED = "vllm/multimodal/__init__.py"  # every guarded model's request runs it


def timed(label: str, cmd: list[str], env: dict[str, str]) -> dict:
    print(f"[auto_cost] {label}: {' '.join(cmd[1:])}", flush=True)
    load = os.getloadavg()
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    wall = time.perf_counter() - t
    rows = re.findall(r"^\s+(\S+)\s+(PASS|FAIL|INVALID|NOT RUN|ERROR[^\n]*?|CRASH[^\n]*?)\s+exit (\d+)\s+(\S+) s", done.stdout,
                      re.M)
    print(f"[auto_cost] {label}: exit {done.returncode} in {wall:.0f} s (load before {load[0]:.2f})", flush=True)
    for name, word, code, secs in rows:
        print(f"[auto_cost]   {name:<18} {word:<8} exit {code} {secs} s", flush=True)
    if done.returncode not in (0, 1, 6):
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
    return {"wall_s": round(wall, 1), "exit": done.returncode, "load_before": round(load[0], 2),
            "models": {n: {"verdict": w, "exit": int(c), "s": float(s) if s != "-" else None} for n, w, c, s in rows}}


def main() -> int:
    from tests.vllm_repo import build, commit

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="also write the numbers here")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="guard-auto-cost-"))
    repo = build(work / "vllm")
    base = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    heads = []
    for n in (1, 2):
        subprocess.run(["git", "-C", str(repo), "checkout", "-q", base], check=True)
        text = (repo / SHARED).read_text(encoding="utf-8")
        heads.append(commit(repo, f"multimodal: a comment ({n})", files={SHARED: text + f"\n# shared change {n}\n"},
                            parent=base))
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    cache = work / "cache"
    rows = {}
    for label, head in (("warm-base", heads[0]), ("base-warm", heads[1])):
        rows[label] = timed(label, [sys.executable, "-m", "guard.cli", "pr", "--vllm-repo", str(repo), "--base", base,
                                    "--head", head, "--only", "ops", "--model", "auto", "--cache-dir", str(cache),
                                    "--output", str(work / label)], env)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": len(os.sched_getaffinity(0)),
            "machine": platform.machine(), "cpu": _cpu_name()}
    print(json.dumps({"meta": meta, "rows": rows}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n", encoding="utf-8")
    return 0


def _cpu_name() -> str:
    from guard.measure.hardware import cpu_name

    return cpu_name()


if __name__ == "__main__":
    sys.exit(main())
