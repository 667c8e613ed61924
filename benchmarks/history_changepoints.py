"""False alarms and detection of `guard history`'s change-point method, on recorded identical runs. Not a test.

Input: every machine's history of identical runs (``history_from_pools.py``: the baseline side of
every recorded A/B run, and the candidate side of the identical runs, each in the order they ran).
Nothing changed in the code between those runs, so every flag on them is a false alarm.

- **Recorded order**: the flags on each whole history, and at how many pushes a flag would have
  shown (every prefix of at least 2 x min_segment runs, as `guard history` sees main grow).
- **Shuffled order**: the same runs in random order (``--shuffles`` per history): the false alarms
  of the run-to-run noise alone, without the machine's drift.
- **Injected steps**: at every position k with min_segment runs on each side, the runs from k on
  multiplied by 1 + step (+5, +10, +20 %): caught when a flag lands at k exactly, or within 2 runs;
  on the whole history, and on the history cut 5 and 10 runs after the step (what `guard history`
  shows that many pushes after the regression landed).

    uv run --extra cpu python benchmarks/history_changepoints.py
    uv run --extra cpu python benchmarks/history_changepoints.py --min-shift 5 --both-directions
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from history_from_pools import BASELINE, CANDIDATE, MACHINES, history  # noqa: E402

from guard.history.changepoints import DEFAULT, Method, change_points, noise  # noqa: E402

STEPS_PCT = (5.0, 10.0, 20.0)
NEAR = 2  # runs: "caught near the step"


def histories() -> list[tuple[str, list[float]]]:
    out = []
    for m in MACHINES:
        for side in (BASELINE, CANDIDATE):
            out.append((f"{m.name}, {side} side", [r.ttft_p50_ms for r in history(m, side)]))
    return out


def flags(values: Sequence[float], method: Method) -> list[int]:
    return [s.index for s in change_points(values, method)]


def detection(series: list[tuple[str, list[float]]], method: Method, step_pct: float,
              after: int | None) -> tuple[int, int, int]:
    """(caught at the step, caught within NEAR runs, positions tried)."""
    exact = near = tried = 0
    for _, values in series:
        n, m = len(values), method.min_segment
        last = n - m if after is None else n - after
        for k in range(m, last + 1):
            end = n if after is None else k + after
            shifted = [*values[:k], *(v * (1 + step_pct / 100) for v in values[k:end])]
            found = [s.index for s in change_points(shifted, method) if s.shift_pct > 0]
            tried += 1
            exact += k in found
            near += any(abs(i - k) <= NEAR for i in found)
    return exact, near, tried


def demo_png(path: Path, method: Method) -> None:
    import dataclasses

    from guard.history.analysis import analyse
    from guard.history.chart import write_png

    records = history(next(m for m in MACHINES if m.name == "zen5"))
    k = len(records) // 2
    demo = [dataclasses.replace(r, **({f"ttft_p{p}_ms": getattr(r, f"ttft_p{p}_ms") * 1.10 for p in (50, 90, 99)}
                                      if i >= k else {}),
                                census_digest="0" * 16 if i >= k + 6 else r.census_digest,
                                census=tuple(dataclasses.replace(c, calls=c.calls + 768) for c in r.census)
                                if i >= k + 6 else r.census)
            for i, r in enumerate(records)]
    write_png(analyse("cpu", demo, method).rows, path,
              title=f"Zen 5 identical runs; +10 % injected from run {k + 1}, census +768 calls from run {k + 7} (synthetic)")
    print(f"wrote {path}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--min-segment", type=int, default=DEFAULT.min_segment)
    p.add_argument("--min-shift", type=float, default=DEFAULT.min_shift_pct, help="percent")
    p.add_argument("--penalty", type=float, default=DEFAULT.penalty_per_log_n, help="per ln(n), in noise units")
    p.add_argument("--both-directions", action="store_true", help="flag lasting speed-ups too")
    p.add_argument("--shuffles", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--synthetic-noise", type=float, default=None, metavar="PCT",
                   help="replace the recorded histories by 8 of 30 runs with normal noise of this SD (log, percent)")
    p.add_argument("--demo-png", type=Path, default=None, metavar="FILE",
                   help="also chart the Zen 5 history with +10 %% injected from its middle run and a census change "
                        "6 runs later (docs/history.md's picture)")
    args = p.parse_args(argv)
    method = Method(min_segment=args.min_segment, min_shift_pct=args.min_shift,
                    penalty_per_log_n=args.penalty, slowdowns_only=not args.both_directions)
    series = histories()
    if args.synthetic_noise is not None:
        rng = random.Random(f"{args.seed}:synthetic")
        series = [(f"synthetic {i + 1}, {args.synthetic_noise:g} % noise",
                   [6000 * math.exp(rng.gauss(0, args.synthetic_noise / 100)) for _ in range(30)]) for i in range(8)]
    if args.demo_png:
        demo_png(args.demo_png, method)
    print(f"Method: ruptures PELT (l2) on log p50 / short-term noise, penalty {method.penalty_per_log_n:g} x ln(n), "
          f"segments >= {method.min_segment} runs, shift >= {method.min_shift_pct:g} % lasting to the newest run, "
          f"{'slowdowns only' if method.slowdowns_only else 'both directions'}.\n")

    print("| identical history | runs | noise | flags, whole history | pushes showing a flag | shuffled: histories with a flag |")
    print("|---|---:|---:|---|---:|---:|")
    totals = [0, 0, 0, 0, 0]
    for name, values in series:
        whole = change_points(values, method)
        shown = tried = 0
        for end in range(2 * method.min_segment, len(values) + 1):
            tried += 1
            shown += bool(flags(values[:end], method))
        rng = random.Random(f"{args.seed}:{name}")
        shuffled_hits = 0
        for _ in range(args.shuffles):
            order = list(values)
            rng.shuffle(order)
            shuffled_hits += bool(flags(order, method))
        sd = noise([math.log(v) for v in values]) * 100
        listed = ", ".join(f"run {s.index + 1} ({s.shift_pct:+.1f} %)" for s in whole) or "none"
        print(f"| {name} | {len(values)} | {sd:.1f} % | {listed} | {shown} of {tried} | "
              f"{shuffled_hits} of {args.shuffles} |")
        totals = [totals[0] + len(whole), totals[1] + shown, totals[2] + tried, totals[3] + shuffled_hits,
                  totals[4] + args.shuffles]
    print(f"| **all {len(series)}** | {sum(len(v) for _, v in series)} | | {totals[0]} flags | "
          f"{totals[1]} of {totals[2]} ({totals[1] / max(totals[2], 1) * 100:.0f} %) | "
          f"{totals[3]} of {totals[4]} ({totals[3] / max(totals[4], 1) * 100:.1f} %) |")

    print(f"\n| injected step | history seen | at the step | within {NEAR} runs | positions |\n|---|---|---:|---:|---:|")
    for step in STEPS_PCT:
        for after, label in ((5, "5 runs after the step"), (10, "10 runs after the step"), (None, "the whole history")):
            exact, near, tried = detection(series, method, step, after)
            print(f"| +{step:g} % | {label} | {exact / tried * 100:.0f} % | {near / tried * 100:.0f} % | {tried} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
