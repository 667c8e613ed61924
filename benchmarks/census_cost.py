"""What the census costs, and whether a cheaper exact counter exists.

In one engine, per profiled image size and repetition, three ways to run the same kind of request:

  bare      no instrumentation: the request's own wall time;
  profiler  what `guard check`'s profile pass does: torch.profiler with Python stacks, then
            the profiler's results -> ProfEvents (guard.compat's lean reader; the named scopes need
            these anyway), then the census
            (guard.measure.census.count_functions) -- its added cost is the last step alone;
  dispatch  a TorchDispatchMode counter around the request that walks Python frames itself
            (sys._getframe, cached per code object) and charges each op to the innermost
            function under the roots; no profiler at all.

Prints wall times, the census's share, and how the two censuses compare (same functions? same
per-function call totals?). The two see operators at different depths: the profiler records
every nested aten call, the dispatch mode only the calls that reach the Python dispatch key
(aten::index_put_ but not the aten::_index_put_impl_ inside it), so totals differ by design;
what matters is that each is exact and repeatable. Starts a vLLM engine: use the engine lock.

    flock /tmp/guard-engine.lock uv run --extra cpu python benchmarks/census_cost.py --reps 2
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


class DispatchCensus:
    """Counts (function "file:qualname", op) pairs for every op reaching the Python dispatch key."""

    def __init__(self, roots: tuple[str, ...]) -> None:
        from guard.compat import frame_getter, torch_dispatch_mode

        getframe = frame_getter()
        prefixes = []
        for base in sys.path:
            if base and os.path.isdir(base):
                for r in roots:
                    p = os.path.join(os.path.abspath(base), r)
                    if os.path.exists(p):
                        prefixes.append((p, len(os.path.abspath(base)) + 1))
        self.counts: Counter = Counter()
        keys: dict = {}
        counts = self.counts
        missing = object()

        def key_for(co):
            fn = co.co_filename
            for p, cut in prefixes:
                if fn.startswith(p) and fn[len(p):len(p) + 1] in ("/", "", "."):
                    return f"{fn[cut:]}:{co.co_qualname}"
            return None

        class Mode(torch_dispatch_mode()):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                f = getframe(1)
                k = None
                while f is not None:
                    co = f.f_code
                    k = keys.get(co, missing)
                    if k is missing:
                        k = keys[co] = key_for(co)
                    if k is not None:
                        break
                    f = f.f_back
                if k is not None:
                    counts[(k, func)] += 1
                return func(*args, **(kwargs or {}))

        self.mode = Mode

    def census(self) -> dict[str, dict[str, int]]:
        out: dict[str, Counter] = {}
        for (fn, func), n in self.counts.items():
            out.setdefault(fn, Counter())[func.name().split(".")[0]] += n
        return {fn: dict(sorted(c.items())) for fn, c in sorted(out.items())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--thresholds", default=str(REPO / "thresholds" / "deepseek-ocr-2.yaml"))
    ap.add_argument("--profile", default="cpu")
    args = ap.parse_args()

    from guard.config.budgets import DEFAULT_ROOTS
    from guard.config.loading import load_thresholds
    from guard.measure.census import QualnameResolver, count_functions
    from guard.model.readings import total_calls
    from guard.measure.hardware import detect
    from guard.measure.fit import select_profile
    from guard.measure.probes import attribute, from_profiler
    from guard.measure.single_run import GuardRun

    thresholds = load_thresholds(args.thresholds)
    hw = detect()
    profile = select_profile(thresholds, args.profile, hw)
    roots = profile.census.roots if profile.census else DEFAULT_ROOTS
    run = GuardRun(thresholds, dataclasses.replace(profile), hw, Path(tempfile.mkdtemp()),
                   progress=lambda m: print(f"[cost] {m}", flush=True))
    sizes = profile.workload.profile_image_sizes
    for size in sizes:  # warm every size once
        run.run_jobs(run._jobs(1, warmup=True, sizes=[size]), f"warm-up {size[0]}x{size[1]}")
    resolver = QualnameResolver()
    rows: dict[tuple, list[float]] = {}
    censuses: dict[tuple, list] = {}

    def add(size, what, value):
        rows.setdefault((size, what), []).append(value)

    from torch.profiler import ProfilerActivity, _ExperimentalConfig, profile as torch_profile

    for rep in range(args.reps):
        for size in sizes:
            label = f"{size[0]}x{size[1]}"
            jobs = run._jobs(1, warmup=True, sizes=[size])
            t = time.perf_counter()
            run.run_jobs(jobs, f"bare {label}")
            add(size, "bare request", time.perf_counter() - t)

            jobs = run._jobs(1, warmup=True, sizes=[size])
            t = time.perf_counter()
            with torch_profile(activities=[ProfilerActivity.CPU], with_stack=True,
                               experimental_config=_ExperimentalConfig(verbose=True)) as prof:
                run.run_jobs(jobs, f"profiled {label}")
            t1 = time.perf_counter()
            events = from_profiler(prof)  # prof.events() and the conversion to ProfEvents
            t2 = time.perf_counter()
            attribute(events, profile.ops, size)
            t3 = time.perf_counter()
            prof_census = count_functions(events, roots, resolver)
            t4 = time.perf_counter()
            del prof
            add(size, "profiled request (run under the profiler)", t1 - t)
            add(size, "  profiler results -> ProfEvents", t2 - t1)
            add(size, "  named scopes (attribute)", t3 - t2)
            add(size, "  census (count_functions)", t4 - t3)
            add(size, "profile pass total, with census", t4 - t)

            jobs = run._jobs(1, warmup=True, sizes=[size])
            counter = DispatchCensus(roots)
            t = time.perf_counter()
            with counter.mode():
                run.run_jobs(jobs, f"dispatch {label}")
            t1 = time.perf_counter()
            disp_census = counter.census()
            t2 = time.perf_counter()
            add(size, "dispatch-mode request (counting inline)", t1 - t)
            add(size, "  dispatch census -> dict", t2 - t1)
            add(size, "dispatch total", t2 - t)
            censuses.setdefault(size, []).append((prof_census, disp_census))

    print()
    print(f"census cost: {args.reps} repetition(s) per size, one engine; medians in seconds "
          "(say in your notes whether the machine was otherwise idle)")
    for size in sizes:
        print(f"  {size[0]}x{size[1]}:")
        for (s, what), values in rows.items():
            if s == size:
                print(f"    {what:<45} {statistics.median(values):7.2f} s   ({', '.join(f'{v:.2f}' for v in values)})")
    print()
    for size, pairs in censuses.items():
        p_same = all(p == pairs[0][0] for p, _ in pairs)
        d_same = all(d == pairs[0][1] for _, d in pairs)
        p, d = pairs[0]
        common = set(p) & set(d)
        print(f"  {size[0]}x{size[1]}: profiler census {len(p)} functions / {sum(map(total_calls, p.values()))} calls, "
              f"repeatable: {p_same}; dispatch census {len(d)} functions / {sum(map(total_calls, d.values()))} calls, "
              f"repeatable: {d_same}; functions in both: {len(common)}; only profiler: {len(set(p) - set(d))}; "
              f"only dispatch: {len(set(d) - set(p))}")
        for fn in sorted(set(p) ^ set(d))[:8]:
            print(f"      only in {'profiler' if fn in p else 'dispatch'}: {fn} {p.get(fn) or d.get(fn)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
