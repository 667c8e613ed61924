"""What the engine test suite costs, per test: engine starts, requests, profiled requests, wall.

Run the suite with the counter on (guard.measure.enginelog) and pytest's per-test times:

    GUARD_ENGINE_LOG=/tmp/engine.jsonl uv run --extra cpu pytest -m engine --junitxml=/tmp/engine.xml
    uv run --extra cpu python benchmarks/engine_budget.py /tmp/engine.jsonl --junit /tmp/engine.xml

A test's wall (from the JUnit file) includes its setup, so a module fixture's engine run counts for
the first test that uses it, as do its lines in the log. The estimate at the end is CI's worst case
on the slowest machine class drawn so far (docs/measurements.md), in two parts: the wall time the
engines were busy (their starts, and each request from the line before it in the same process;
two engines starting side by side count once) times ``--slow``, the float32 engine's slowdown there; the rest of the wall (imports, pytest, git, venvs,
reports) times ``--slow-rest``, a slower core's; plus ``--fast-min`` minutes for the README's test
command.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def busy_s(intervals: list[tuple[float, float]]) -> float:
    """How long at least one of the intervals was running: two engines starting side by side (the
    two sides of ``guard pr``, of an A/B run) take the wall time once, however many engine seconds."""
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total


def read_log(path: Path, since: float | None = None) -> dict[str, dict[str, float]]:
    """Per test: starts, failed starts, requests by kind, ``engine_s``: the seconds its engines
    spent starting (each start line's ``s``) and answering (a request line's time since the previous
    line of the same process; requests sent together share the interval), and ``engine_wall_s``: the
    wall time during which at least one engine was doing either. ``since``: only lines from then on
    (the log is appended to, run after run)."""
    per: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(int))
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    last_t: dict[int, float] = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError as exc:
            raise SystemExit(f"{path}:{n}: not a JSON line: {exc}") from exc
        pid, t = line.get("pid"), line.get("t")
        if since is not None and (t is None or t < since):
            continue
        test = line.get("test") or "(outside a test)"
        row = per[test]
        if line["event"] == "start":
            row["starts"] += 1
            row["failed_starts"] += not line.get("ok", True)
            row["engine_s"] += line.get("s") or 0.0
            if t is not None and line.get("s"):
                spans[test].append((t - line["s"], t))
        elif line["event"] == "request":
            key = "profiled" if line.get("label") == "profiled" else "warmup" if line.get("warmup") else "timed"
            row[key] += 1
            if pid in last_t and t is not None:
                row["engine_s"] += t - last_t[pid]
                spans[test].append((last_t[pid], t))
        if pid is not None and t is not None:
            last_t[pid] = t
    for test, row in per.items():
        row["engine_wall_s"] = busy_s(spans[test])
    return per


def junit_start(path: Path) -> float | None:
    """When the junit file's run began (its testsuite's timestamp), as a Unix time."""
    suite = next(ET.parse(path).iter("testsuite"), None)
    stamp = suite.get("timestamp") if suite is not None else None
    if not stamp:
        return None
    when = dt.datetime.fromisoformat(stamp)
    return (when if when.tzinfo else when.astimezone()).timestamp()


def read_junit(path: Path) -> dict[str, float]:
    """nodeid -> seconds (setup + call + teardown, pytest's default junit_duration_report)."""
    out = {}
    for case in ET.parse(path).iter("testcase"):
        module = case.get("classname", "").replace(".", "/") + ".py"
        out[f"{module}::{case.get('name')}"] = float(case.get("time", 0))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log", type=Path, help="the $GUARD_ENGINE_LOG file")
    p.add_argument("--junit", type=Path, help="pytest --junitxml file of the same run (per-test wall)")
    p.add_argument("--slow", type=float, default=3.4,
                   help="the slowest machine class's engine time / this one's (default 3.4)")
    p.add_argument("--slow-rest", type=float, default=1.5,
                   help="its time for everything else (imports, pytest, git) / this one's (default 1.5)")
    p.add_argument("--fast-min", type=float, default=10.0, help="the fast suite there, minutes (default 10)")
    a = p.parse_args(argv)
    # the log is appended to by every run; with the run's junit file, only that run's lines count
    per = read_log(a.log, since=junit_start(a.junit) - 5 if a.junit and junit_start(a.junit) else None)
    wall = read_junit(a.junit) if a.junit else {}
    tests = sorted(set(per) | set(wall), key=lambda t: -wall.get(t, 0))
    cols = ("starts", "warmup", "timed", "profiled")
    print(f"{'test':<100} {'wall s':>7} {'engine s':>8} {'engine wall s':>13} " + " ".join(f"{c:>8}" for c in cols))
    total = defaultdict(float)
    for t in tests:
        row = per.get(t, {})
        print(f"{t[-100:]:<100} {wall.get(t, float('nan')):>7.0f} {row.get('engine_s', 0):>8.0f} "
              f"{row.get('engine_wall_s', 0):>13.0f} " + " ".join(f"{row.get(c, 0):>8}" for c in cols))
        total["wall"] += wall.get(t, 0)
        for c in (*cols, "engine_s", "engine_wall_s"):
            total[c] += row.get(c, 0)
    print(f"{'total (' + str(len(tests)) + ' tests)':<100} {total['wall']:>7.0f} {total['engine_s']:>8.0f} "
          f"{total['engine_wall_s']:>13.0f} " + " ".join(f"{int(total[c]):>8}" for c in cols))
    if wall:
        # the wall the engines took (side-by-side starts once), scaled as the engine: the rest as a slower core
        engine = min(total["engine_wall_s"], total["wall"]) / 60
        rest = total["wall"] / 60 - engine
        worst = engine * a.slow + rest * a.slow_rest + a.fast_min
        print(f"worst case for CI: engine {engine:.1f} min x {a.slow:g} + the rest {rest:.1f} min x {a.slow_rest:g} "
              f"+ {a.fast_min:g} min = {worst:.0f} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
