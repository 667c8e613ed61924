"""Can server mode take its op counts from vLLM's own profiler endpoints? Measures it.

Starts `vllm serve` with the CPU profile's engine arguments and vLLM's torch profiler on
(`--profiler-config` with `profiler: torch`; vLLM 0.32 replaced the VLLM_TORCH_PROFILER_DIR
variable with this flag), sends one warm-up request, then one request between POST /start_profile
and POST /stop_profile, and reports:
- the time each step takes (stop_profile includes vLLM writing the trace);
- whether the trace has the Python frames guard's attribution needs (events naming
  deepencoder2.py's `_update_causal_mask`, and any python_function events at all);
- how many `aten::_index_put_impl_` calls it holds (all of them: without frames they cannot be
  attributed to a code path).
The in-process profile pass's cost is in docs/measurements.md ("What guard costs": ~17 s for two requests).

    flock /tmp/guard-engine.lock uv run --extra cpu python benchmarks/server_profiler.py
    uv run --extra cpu python benchmarks/server_profiler.py --trace PATH.pt.trace.json.gz   # no server

Each trace is also fed to guard's own attribution (guard.measure.probes.attribute) after turning its
`cpu_op` events into ProfEvents whose stack is the `python_function` events enclosing them in time
on the same thread, so the counts compare directly with the in-process pass's.
"""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

from guard.config.budgets import DEFAULT_THRESHOLDS
from guard.config.loading import load_thresholds
from guard.measure.side import plan_jobs
from guard.measure.hardware import detect
from guard.measure.fit import select_profile
from guard.measure.probes import ProfEvent, attribute
from guard.measure.server import SERVED_MODEL_NAME, VllmServer, run_jobs_http


def trace_events(events: list[dict]) -> list[ProfEvent]:
    """Chrome-trace events -> ProfEvents: python_function events as Python calls, cpu_op events
    as operators whose stack is the python_function intervals around them (innermost first)."""
    by_thread: dict[tuple, list[dict]] = {}
    for e in events:
        if e.get("cat") in ("python_function", "cpu_op") and "dur" in e:
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    out: list[ProfEvent] = []
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_py: list[dict] = []  # enclosing python_function events, outermost first
        for e in evs:
            while open_py and open_py[-1]["ts"] + open_py[-1]["dur"] <= e["ts"]:
                open_py.pop()
            if e["cat"] == "python_function":
                out.append(ProfEvent(e["name"], tuple(p["name"] for p in reversed(open_py)), False))
                open_py.append(e)
            else:
                out.append(ProfEvent(e["name"], tuple(p["name"] for p in reversed(open_py)), True))
    return out


def analyse(path: Path, profile) -> None:
    t = time.perf_counter()
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        events = json.load(fh).get("traceEvents", [])
    parsed_s = time.perf_counter() - t
    cats = Counter(e.get("cat") for e in events)
    names = Counter(e.get("name") for e in events)
    python = [e for e in events if e.get("cat") == "python_function"]
    mask = [e for e in python if "_update_causal_mask" in str(e.get("name"))]
    deepenc = [e for e in python if "deepencoder2.py" in str(e.get("name"))]
    print(f"{path.name}: {len(events)} events, parsed in {parsed_s:.1f} s; categories {dict(cats.most_common(6))}")
    print(f"  python_function events: {len(python)}; naming deepencoder2.py: {len(deepenc)}; "
          f"naming _update_causal_mask: {len(mask)}")
    print(f"  aten::_index_put_impl_ events: {names.get('aten::_index_put_impl_', 0)} (whole trace)")
    t = time.perf_counter()
    for c in attribute(trace_events(events), profile.ops, (0, 0)):
        print(f"  guard.measure.probes.attribute: scope {c.scope}: entered {c.entries}x, {c.total_calls} op calls "
              f"{dict(c.calls_by_op)} ({time.perf_counter() - t:.1f} s)")


def post(url: str) -> float:
    t = time.perf_counter()
    req = urllib.request.Request(url, method="POST", data=b"")
    with urllib.request.urlopen(req, timeout=600) as r:
        r.read()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--thresholds", default=DEFAULT_THRESHOLDS)
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--trace", type=Path, default=None, help="analyse this saved trace; start no server")
    args = ap.parse_args()
    # as `guard check` would run it here: float32 on a CPU without native bf16
    profile = select_profile(load_thresholds(args.thresholds), args.profile, detect())
    if args.trace:
        analyse(args.trace, profile)
        return
    work = Path(tempfile.mkdtemp(prefix="guard-server-profiler-"))
    trace_dir = work / "traces"
    server = VllmServer(profile.engine, profile.workload.seed, work / "server.log")
    server.command += ["--profiler-config", json.dumps({"profiler": "torch", "torch_profiler_dir": str(trace_dir)})]
    with server:
        t = time.perf_counter()
        server.start(print)
        print(f"server healthy in {time.perf_counter() - t:.1f} s")
        w = profile.workload
        run_jobs_http(server.url, SERVED_MODEL_NAME, w, plan_jobs(w, 0, 1, True))
        start_s = post(server.url + "/start_profile")
        t = time.perf_counter()
        out = run_jobs_http(server.url, SERVED_MODEL_NAME, w, plan_jobs(w, 1, 1, False))
        request_s = time.perf_counter() - t
        stop_s = post(server.url + "/stop_profile")
        t = time.perf_counter()
        while not list(trace_dir.rglob("*.json*")) and time.perf_counter() - t < 120:
            time.sleep(1)
        wait_s = time.perf_counter() - t
    files = sorted(p for p in trace_dir.rglob("*") if p.is_file())
    print(f"start_profile {start_s:.2f} s, profiled request {request_s:.2f} s (TTFT {out[0].ttft_client_s:.2f} s), "
          f"stop_profile {stop_s:.2f} s, trace appeared after a further {wait_s:.1f} s")
    for f in files:
        print(f"  {f.relative_to(work)}  {f.stat().st_size / 1e6:.1f} MB")
    for f in files:
        if ".json" in f.name:
            analyse(f, profile)


if __name__ == "__main__":
    main()
