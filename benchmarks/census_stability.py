"""Is the operator census deterministic? Run the profile pass N times in one engine and compare.

Uses guard's own runner (the same GuardRun.profile_ops that `guard check` runs): one warm-up
request, then N profile passes (one profiled request per `profile_image_sizes` entry each).
Prints, per image size, whether all N censuses are identical; if not, every function whose
counts moved, with its op calls per run: those are the candidates for the rule's `exclude:`
(with the reason), never a guess. Also prints what counting the census cost per request.

Starts a vLLM engine: run it under the engine lock on shared machines.

    flock /tmp/guard-engine.lock uv run --extra cpu python benchmarks/census_stability.py --runs 10
    ... --save-events tests/fixtures/profiles   # also record one request's operator events per size
    ... --write-census runs.json                # every run's census, for later analysis
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--thresholds", default=str(REPO / "thresholds" / "deepseek-ocr-2.yaml"))
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--save-events", type=Path, default=None, metavar="DIR",
                    help="write census-<W>x<H>.events.json.gz (operator events of one profiled request) here")
    ap.add_argument("--write-census", type=Path, default=None, metavar="JSON")
    args = ap.parse_args()

    from guard.config.budgets import CensusRule
    from guard.config.loading import load_thresholds
    from guard.measure.census import unstable_functions
    from guard.model.readings import total_calls
    from guard.measure.hardware import detect
    from guard.measure.fit import select_profile
    from guard.measure.probes import profile_request, save_events
    from guard.measure.single_run import GuardRun

    thresholds = load_thresholds(args.thresholds)
    hw = detect()
    profile = select_profile(thresholds, args.profile, hw)
    if profile.census is None:  # measure with the default rule (roots: vllm)
        profile = dataclasses.replace(profile, census=CensusRule(baseline=Path("unused")))
    # the named scopes are irrelevant here, and the census must not depend on them
    profile = dataclasses.replace(profile, ops=())
    out = Path(tempfile.mkdtemp(prefix="census-stability-"))
    run = GuardRun(thresholds, profile, hw, out, progress=lambda m: print(f"[census] {m}", flush=True))
    t0 = time.perf_counter()
    run.warm_up()
    runs: list[dict] = []
    per_run_s = []
    for i in range(args.runs):
        t = time.perf_counter()
        run.profile_ops(label=f"-run{i}")
        per_run_s.append(time.perf_counter() - t)
        runs.append(json.loads(json.dumps(run.record.census)))  # a deep copy
        print(f"[census] run {i + 1}/{args.runs} done in {per_run_s[-1]:.1f} s", flush=True)

    if args.save_events:
        args.save_events.mkdir(parents=True, exist_ok=True)
        for size in profile.workload.profile_image_sizes:
            jobs = run._jobs(1, warmup=True, sizes=[size])
            # one unprofiled request of the size first, as guard check sends: the request before was a
            # decode mix's, and the first request after a sampling change moves state (async_tensor_h2d)
            run.side.run(run._jobs(1, warmup=True, sizes=[size]), "warm-up", lambda o: None, first_token_only=True)
            # the prefill alone, as guard check profiles an image size (its first token, whatever max_tokens)
            events, _ = profile_request(lambda: run.side.run(jobs, "recorded", lambda o: None, first_token_only=True))
            ops = [e for e in events if e.is_op]  # the census reads only operator events
            path = args.save_events / f"census-{size[0]}x{size[1]}.events.json.gz"
            save_events(ops, path)
            print(f"[census] saved {len(ops)} operator events to {path}")

    print()
    print(f"census stability: {args.runs} runs of the profile pass in one engine "
          f"({time.perf_counter() - t0:.0f} s in all, roots {', '.join(profile.census.roots)})")
    identical = True
    for size in runs[0]:
        per_size = [r[size] for r in runs]
        moved = unstable_functions(per_size)
        fns = len(per_size[0])
        calls = sum(total_calls(ops) for ops in per_size[0].values())
        if not moved:
            print(f"  {size}: IDENTICAL in all {args.runs} runs ({fns} functions, {calls} op calls)")
            continue
        identical = False
        print(f"  {size}: {len(moved)} of {fns} functions moved between runs:")
        for fn, totals in moved.items():
            print(f"    {fn}: op calls per run {totals}")
    n_req = args.runs * len(runs[0])
    print(f"census counting cost: {run.record.census_s / n_req * 1000:.0f} ms per profiled request "
          f"(mean over {n_req}; machine shared, timings noisy)")
    print(f"profile pass: {min(per_run_s):.1f}-{max(per_run_s):.1f} s per run ({len(runs[0])} profiled requests)")
    print("RESULT:", "identical" if identical else "NOT identical")
    if args.write_census:
        args.write_census.write_text(json.dumps(runs, indent=1, sort_keys=True))
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
