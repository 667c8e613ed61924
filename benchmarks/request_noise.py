"""Where does the request-to-request TTFT spread come from, and does an engine-side setting shrink it?

A/B mode's per-pair spread is what limits how fast it decides (docs/ab.md): about sqrt(2) times
one side's request-to-request spread, since the two members of a pair correlate weakly. This
measures that spread for one in-process engine of the `cpu` profile under environment variants,
each in a fresh process (the allocator and OpenMP read their settings at start), one after the
other: a warm-up of 2 requests, then ``--requests`` measured ones. Per request it also records
what the process spent: minor page faults, voluntary and involuntary context switches, CPU time.

    uv run --extra cpu python benchmarks/request_noise.py --requests 12 \\
        --variant default: \\
        --variant thp:GLIBC_TUNABLES=glibc.malloc.hugetlb=1 \\
        --variant one-thread:OMP_NUM_THREADS=1 \\
        --variant passive:OMP_WAIT_POLICY=PASSIVE

The profile's engine keeps the memory it frees (``engine.retain_freed_memory``); the variant
``released:REQUEST_NOISE_RELEASE_FREED_MEMORY=1`` runs it with glibc's defaults instead, which hand
freed memory back to the kernel. ``--ballast stopped`` with both is how that setting was found
(docs/ab.md, "Freed memory and the VM's host"):

    uv run --extra cpu python benchmarks/request_noise.py --requests 8 --ballast stopped \\
        --variant retained: --variant released:REQUEST_NOISE_RELEASE_FREED_MEMORY=1

``--pinned-pairs N``: instead, two engines at once, one OpenMP thread each, each pinned to its own
core (the cores swapped every pair), both given the same image at the same moment: does running
the sides simultaneously make a slow phase of the machine fall on both members of a pair?

The machine's phases move the spread as much as any setting: interleave variants, repeat them,
and run nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing as mp
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULT = "RESULT "
RELEASE = "REQUEST_NOISE_RELEASE_FREED_MEMORY"


def _engine():
    sys.path.insert(0, str(REPO))
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from guard.config.loading import load_thresholds
    from guard.measure.fit import on_cpu
    from guard.measure.inprocess import run_jobs, start_engine
    from guard.measure.side import plan_jobs

    from guard.measure.hardware import detect

    profile = on_cpu(load_thresholds(REPO / "thresholds" / "deepseek-ocr-2.yaml").profile("cpu"), detect(quick=True).native_bf16)
    engine = profile.engine
    if os.environ.get(RELEASE) == "1":  # as before engine.retain_freed_memory: glibc's defaults
        engine = dataclasses.replace(engine, retain_freed_memory=False)
    llm = start_engine(engine, seed=profile.workload.seed)

    def request(index: int, warmup: bool) -> float:
        (outcome,) = run_jobs(llm, profile.workload, plan_jobs(profile.workload, index, 1, warmup), lambda o: None)
        if not outcome.success:
            raise SystemExit(f"request failed: {outcome.error}")
        return outcome.ttft_client_s

    return request


# System-wide memory-management counters (/proc/vmstat): does a request beside another engine make
# the kernel do more work (compaction, reclaim, huge-page fallbacks) than the same request alone?
VMSTAT_KEYS = ("pgfault", "pgalloc_normal", "pgfree", "compact_stall", "compact_migrate_scanned", "thp_fault_alloc",
               "thp_fault_fallback", "pgscan_kswapd", "pgscan_direct", "numa_hint_faults", "pgmigrate_success")


def _vmstat() -> dict[str, int]:
    values = {}
    with open("/proc/vmstat") as f:
        for line in f:
            key, _, value = line.partition(" ")
            if key in VMSTAT_KEYS:
                values[key] = int(value)
    return values


def spread_pct(values: list[float]) -> float:
    """SD of the log, in percent: the spread of a ratio-scale quantity."""
    return statistics.stdev(math.log(v) for v in values) * 100


# ------------------------------------------------------------------------- one engine, one variant
def child(requests: int, hold: bool = False) -> None:
    request = _engine()
    if hold:  # a ballast engine: ready, then idle until killed (the parent stops it)
        print("READY", flush=True)
        while True:
            time.sleep(3600)
    for i in range(2):
        request(i, True)
    rows = []
    for i in range(requests):
        r0, c0, v0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), _vmstat()
        ttft = request(100 + i, False)
        r1, c1, v1 = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), _vmstat()
        rows.append({"ttft_s": ttft, "minor_faults": r1.ru_minflt - r0.ru_minflt, "cpu_s": c1 - c0,
                     "user_s": r1.ru_utime - r0.ru_utime, "system_s": r1.ru_stime - r0.ru_stime,
                     "voluntary_switches": r1.ru_nvcsw - r0.ru_nvcsw, "involuntary_switches": r1.ru_nivcsw - r0.ru_nivcsw,
                     "vmstat": {k: v1.get(k, 0) - v0.get(k, 0) for k in v0}, "max_rss_mb": r1.ru_maxrss / 1024})
    print(RESULT + json.dumps(rows), flush=True)


def start_ballast(env: dict[str, str], stop: bool) -> subprocess.Popen:
    """A second engine beside the measured one, as in an A/B check: built, then stopped (SIGSTOP,
    as A/B stops its idle side) or left idle."""
    proc = subprocess.Popen([sys.executable, __file__, "--child", "--hold"], env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in proc.stdout:
        if line.startswith("READY"):
            break
    else:
        raise SystemExit("the ballast engine did not start")
    if stop:
        os.kill(proc.pid, signal.SIGSTOP)
    return proc


def run_variant(name: str, env: dict[str, str], requests: int, ballast: str | None = None,
                ballast_env: dict[str, str] | None = None) -> dict:
    extra = start_ballast({**env, **(ballast_env or {})}, stop=ballast == "stopped") if ballast else None
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", "--requests", str(requests)], env={**os.environ, **env},
                              capture_output=True, text=True, check=False)
    finally:
        if extra is not None:
            extra.kill()
            extra.wait()
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    if proc.returncode or not lines:
        raise SystemExit(f"variant {name} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    rows = json.loads(lines[-1][len(RESULT):])
    ttft = [r["ttft_s"] for r in rows]
    med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    return {"variant": name, "env": env, "requests": len(rows), "ttft_p50_ms": statistics.median(ttft) * 1000,
            "spread_pct": spread_pct(ttft), "minor_faults": med("minor_faults"), "cpu_s": med("cpu_s"),
            "user_s": med("user_s"), "system_s": med("system_s"), "max_rss_mb": rows[-1]["max_rss_mb"],
            "vmstat": {k: statistics.median(r["vmstat"][k] for r in rows) for k in rows[0]["vmstat"]},
            "voluntary_switches": med("voluntary_switches"), "rows": rows}


def parse_env(assignments: str, option: str) -> dict[str, str]:
    """``VAR=VALUE[,VAR=VALUE]`` (empty: none); a malformed item is an error naming ``option``."""
    env = {}
    for item in filter(None, assignments.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"{option}: expected VAR=VALUE[,VAR=VALUE], got {item!r}")
        env[key] = value
    return env


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, assignments = text.partition(":")
    return name, parse_env(assignments, f"--variant {text!r} (NAME:VAR=VALUE[,VAR=VALUE])")


# ------------------------------------------------------------------------- two pinned engines at once
def _pinned_side(conn) -> None:
    request = _engine()
    conn.send(os.getpid())
    while (msg := conn.recv()) is not None:
        conn.send(request(*msg))


def _pin(pid: int, core: int) -> None:
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), {core})
        except OSError:
            pass  # a thread that ended meanwhile


def pinned_pairs(n: int) -> dict:
    if (os.cpu_count() or 0) < 2:
        raise SystemExit("--pinned-pairs needs two cores")
    os.environ["OMP_NUM_THREADS"] = "1"
    ctx = mp.get_context("spawn")
    sides = {}
    for name in ("A", "B"):
        parent, child_conn = ctx.Pipe()
        ctx.Process(target=_pinned_side, args=(child_conn,), daemon=True).start()
        sides[name] = parent
    pids = {name: conn.recv() for name, conn in sides.items()}

    def pair(index: int, warmup: bool, k: int) -> dict[str, float]:
        _pin(pids["A"], k % 2)
        _pin(pids["B"], 1 - k % 2)
        for name, conn in sides.items():
            conn.send((index, warmup))
        return {name: conn.recv() for name, conn in sides.items()}

    pair(0, True, 0)
    pair(1, True, 1)
    rows = [pair(100 + k, False, k) for k in range(n)]
    for conn in sides.values():
        conn.send(None)
    log_a = [math.log(r["A"]) for r in rows]
    log_b = [math.log(r["B"]) for r in rows]
    return {"pairs": n, "pair_spread_pct": spread_pct([r["A"] / r["B"] for r in rows]),
            "side_spread_pct": [spread_pct([r["A"] for r in rows]), spread_pct([r["B"] for r in rows])],
            "correlation": statistics.correlation(log_a, log_b), "ttft_p50_ms": statistics.median(r["A"] for r in rows) * 1000,
            "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:VAR=VALUE[,VAR=VALUE]",
                    help="an environment variant (repeatable; in order); NAME: for none")
    ap.add_argument("--requests", type=int, default=12, help="measured requests per variant")
    ap.add_argument("--pinned-pairs", type=int, default=0, metavar="N", help="instead: N pairs of two pinned engines at once")
    ap.add_argument("--json", type=Path, help="write every request here")
    ap.add_argument("--ballast", choices=("stopped", "idle"),
                    help="a second engine beside the measured one, stopped (SIGSTOP, as A/B's idle side) or idle")
    ap.add_argument("--ballast-env", metavar="VAR=VALUE[,VAR=VALUE]", default="",
                    help="extra environment for the ballast engine only (e.g. VLLM_CPU_KVCACHE_SPACE=1)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.requests, args.hold)
        return 0
    if args.pinned_pairs:
        out = pinned_pairs(args.pinned_pairs)
        print(f"two engines at once, 1 OpenMP thread each, pinned to their own core (swapped every pair): "
              f"{out['pairs']} pairs, TTFT p50 {out['ttft_p50_ms']:.0f} ms, per-pair spread {out['pair_spread_pct']:.1f} %, "
              f"sides {out['side_spread_pct'][0]:.1f} % / {out['side_spread_pct'][1]:.1f} %, "
              f"correlation {out['correlation']:+.2f}")
        results: object = out
    else:
        results = []
        ballast_env = parse_env(args.ballast_env, "--ballast-env")
        if args.ballast:
            extra = ", ".join(f"`{k}={v}`" for k, v in ballast_env.items())
            print(f"a second engine beside the measured one, {args.ballast}{' (' + extra + ')' if extra else ''}\n")
        print("| variant | environment | requests | TTFT p50 | spread | minor faults / request | CPU s (user + system) / request "
              "| voluntary switches / request | kernel, per request (median) |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---|")
        for name, env in map(parse_variant, args.variant or ["default:"]):
            r = run_variant(name, env, args.requests, args.ballast, ballast_env)
            results.append(r)
            shown = ", ".join(f"`{k}={v}`" for k, v in env.items()) or "-"
            kernel = ", ".join(f"{k} {v:.0f}" for k, v in r["vmstat"].items() if v)
            print(f"| {name} | {shown} | {r['requests']} | {r['ttft_p50_ms']:.0f} ms | {r['spread_pct']:.1f} % "
                  f"| {r['minor_faults']:.0f} | {r['cpu_s']:.2f} ({r['user_s']:.2f} + {r['system_s']:.2f}) "
                  f"| {r['voluntary_switches']:.0f} | {kernel} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
