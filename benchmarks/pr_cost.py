"""What `guard pr --only ops` costs against `guard check`, on this machine.

Builds a vLLM repository from the installed sources (tests/vllm_repo.py) with one head on top
(tests/pr_heads.py, the item-loop: a one-line Python change), then times, each in a fresh process:

  check          plain `guard check` on the shipped CPU profile (TTFT and op counts)
  check-ops      `guard check --only ops`
  pr-cold        `guard pr --only ops` with an empty cache: both environments built, both sides profiled
  pr-envs        the same again with --fresh: environments cached, both sides profiled again
  pr-warm        the same again: both sides' op counts from the cache (a re-run with nothing new; a
                 push to the pull request profiles only its new head, half of pr-envs)

Targets (issue #31): pr-envs <= 2x check-ops; check-ops <= 0.5x check. Run it alone on the machine:

    uv run --extra cpu python benchmarks/pr_cost.py [--skip-check]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def timed(label: str, cmd: list[str], expect: int) -> float:
    """Wall seconds of one command. A plain check may come out invalid (exit 3) on a busy machine:
    its time still counts, and the row says so; any other unexpected exit stops the measurement."""
    print(f"[pr_cost] {label}: {' '.join(cmd[1:])}", flush=True)
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - t
    print(f"[pr_cost] {label}: exit {done.returncode} (expected {expect}) in {wall:.0f} s", flush=True)
    if done.returncode != expect and not (label == "check" and done.returncode == 3):
        print(done.stdout[-3000:], done.stderr[-2000:])
        raise SystemExit(f"{label}: unexpected exit {done.returncode}")
    if done.returncode != expect:
        print(f"[pr_cost] {label}: invalid run (busy machine?): the timing is kept, the verdict is not", flush=True)
    return wall


def main() -> int:
    from tests.pr_heads import HEADS
    from tests.vllm_repo import build, commit

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-check", action="store_true", help="leave out the plain guard check (the slowest row)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pr-cost-"))
    repo = build(tmp)
    h = HEADS["item-loop"]
    head = commit(repo, h.message, edits=h.edits)
    guard = str(Path(sys.executable).parent / "guard")
    cache = tmp / "cache"
    pr = [guard, "pr", "--vllm-repo", str(repo), "--base", "main", "--head", head, "--only", "ops",
          "--cache-dir", str(cache), "--output", str(tmp / "pr")]
    rows = {}
    if not args.skip_check:
        rows["check"] = timed("check", [guard, "check", "--output", str(tmp / "check")], 0)
    rows["check-ops"] = timed("check-ops", [guard, "check", "--only", "ops", "--output", str(tmp / "ops")], 0)
    rows["pr-cold"] = timed("pr-cold", pr, HEADS["item-loop"].expect)
    rows["pr-envs"] = timed("pr-envs", [*pr, "--fresh"], HEADS["item-loop"].expect)
    rows["pr-warm"] = timed("pr-warm", pr, HEADS["item-loop"].expect)
    shutil.rmtree(tmp, ignore_errors=True)
    print("\nrun        wall (s)")
    for k, v in rows.items():
        print(f"{k:<10} {v:8.0f}")
    ops = rows["check-ops"]
    print(f"\npr-envs / check-ops = {rows['pr-envs'] / ops:.2f} (target <= 2)")
    print(f"pr-cold / check-ops = {rows['pr-cold'] / ops:.2f}; pr-warm / check-ops = {rows['pr-warm'] / ops:.2f}")
    if "check" in rows:
        print(f"check-ops / check = {ops / rows['check']:.2f} (target <= 0.5)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
