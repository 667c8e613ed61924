"""Replay recorded A/B runs under the shipped rule, pair by pair, in the order they were measured. Not a test.

A live run stops where its own rule decided; a changed rule (another interval, another batch)
would have stopped elsewhere on the same pairs. This replays each run's recorded pairs through
the profile's A/B rule (guard.judge.sequential.ab_run_rule) through the run stage's own loop
(guard.measure.stopping.sample_until_decided: ``workload.requests`` pairs, then ``ab.batch`` more
while a ratio budget is undecided, up to ``statistics.max_requests``; then
guard.judge.ab.judge_ratio) and prints, per run, the verdict and the
pairs the rule needed, or "needs more" when the recorded run stopped before the rule would have.
The wall time a run would have taken is its recorded wall time minus the requests it would not
have measured (their TTFTs, both sides).

    uv run --extra cpu python benchmarks/ab_replay.py /tmp/ab-live/*/results.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from guard.judge.ab import judge_ratio
from guard.judge.sequential import ab_run_rule
from guard.config.loading import load_thresholds
from guard.model.records import Status
from guard.model.checks import Pair
from guard.measure.stopping import sample_until_decided


class _RecordingEnds(Exception):
    """The rule asked for more pairs than the run recorded."""


def replay(pairs: Sequence[Pair], profile) -> tuple[str, int, bool]:
    """(status, pairs used, complete): complete is False when the recording ran out first."""
    stats, budgets = profile.ab_statistics, profile.ttft_vs_baseline_pct
    taken: list[Pair] = []
    rounds = 0

    def measure(count: int) -> list[float]:  # the next pairs as the run stage would have measured them
        nonlocal rounds
        if len(taken) + count > len(pairs):
            raise _RecordingEnds
        new = list(pairs[len(taken):len(taken) + count])
        taken.extend(new)
        rounds += 1
        return [p.ratio for p in new]

    try:
        sample_until_decided(ab_run_rule(profile), profile.workload.requests, measure)
    except _RecordingEnds:
        return "needs more", len(pairs), False
    checks = [judge_ratio(k, b, taken, rounds, stats)
              for k, b in budgets.items()]
    status = "fail" if any(c.status == Status.FAIL for c in checks) else "pass"
    return status, len(taken), True


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path, nargs="+", help="A/B results.json files")
    p.add_argument("--thresholds", default="thresholds/deepseek-ocr-2.yaml")
    p.add_argument("--profile", default="cpu")
    p.add_argument("--plain-wall-s", type=float, default=None, help="a plain check's wall time, for the ratio column")
    args = p.parse_args(argv)
    profile = load_thresholds(args.thresholds).profile(args.profile)
    print("| run | injected | recorded: verdict, pairs, wall | replayed: verdict | pairs | wall (est.) |"
          + (" × plain |" if args.plain_wall_s else "") + "\n|---|---|---|---|---:|---:|" + ("---:|" if args.plain_wall_s else ""))
    walls = []
    for path in args.results:
        data = json.loads(path.read_text(encoding="utf-8"))
        ab = data.get("ab") or {}
        got = [Pair(int(x["index"]), float(x["candidate_s"]), float(x["baseline_s"])) for x in ab.get("pairs", [])]
        got.sort(key=lambda x: x.index)
        status, n, complete = replay(got, profile)
        wall = float(data["run"].get("duration_s") or 0.0)
        dropped = sum(x.candidate_s + x.baseline_s for x in got[n:])
        est = wall - dropped
        if complete:
            walls.append(est)
        injected = data["run"].get("injected") or "—"
        ratio = f" {est / args.plain_wall_s:.2f}× |" if args.plain_wall_s and complete else (" — |" if args.plain_wall_s else "")
        print(f"| {path.parent.name} | {injected} | {data.get('verdict')}, {len(got)}, {wall:.0f} s | {status} | {n} | "
              f"{est:.0f} s |" + ratio)
    if walls and args.plain_wall_s:
        med = statistics.median(walls)
        print(f"\nmedian estimated wall {med:.0f} s = {med / args.plain_wall_s:.2f}× the plain check's {args.plain_wall_s:.0f} s; "
              f"{sum(w <= 2 * args.plain_wall_s for w in walls)} of {len(walls)} runs within 2×", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
