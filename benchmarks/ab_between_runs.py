"""Does a whole A/B run lean one way? Between-run spread of the paired ratio. Not a test.

The A/B interval treats a run's pairs as independent draws around one true ratio. If every run
also carries its own offset (the two engine processes' memory layout, the hour's machine), more
pairs shrink the interval but not that offset: a fully resolved clean run still lands above the
budget now and then, and a real slowdown below it. This script measures the offset on recorded
pairs and says what it costs at the profile's budget.

Input: pool files (``benchmarks/ab-pool-*.json``: pairs of several runs, a run starting wherever
the pair index starts again) and/or A/B ``results.json`` files (one run each). Per input it prints:

- runs, pairs, and each run's mean log ratio;
- Cochran's Q of the run means (weights 1/SE², SE from the run's own pairs) and a permutation
  p-value: the pairs shuffled across runs (run sizes kept) gave a Q at least this large in that
  share of shuffles, so heavy tails do not need a chi-square table;
- tau, the between-run SD of the ratio (DerSimonian-Laird, 0 when Q <= df);
- the floor tau puts under any pair count at the budget b: a clean run fully resolved is above b
  with probability 1 - Phi(b / tau), a +S % run below it with Phi((b - S) / tau).

    python benchmarks/ab_between_runs.py benchmarks/ab-pool-*.json
    python benchmarks/ab_between_runs.py --results guard-results/ab-live/identical-*/results.json
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the pool format belongs to ab_sensitivity.py
from ab_sensitivity import load_pool, pool_from_results  # noqa: E402

from guard.model.checks import Pair  # noqa: E402

MIN_PAIRS = 4  # a run's SE from fewer pairs is too rough to weigh it by


@dataclass(frozen=True)
class Heterogeneity:
    runs: int
    pairs: int
    run_means_pct: list[float]
    q: float
    p_value: float
    tau_pct: float


def log_ratios_per_run(pairs: Sequence[Pair]) -> list[list[float]]:
    """Log ratios per run of pooled pairs; a run starts where the pair index does not increase."""
    runs: list[list[float]] = []
    last = None
    for pair in pairs:
        if last is None or pair.index <= last:
            runs.append([])
        runs[-1].append(math.log(pair.ratio))
        last = pair.index
    return runs


def runs_in_pool(path: Path) -> list[list[float]]:
    return log_ratios_per_run(load_pool(path))


def run_in_results(path: Path) -> list[float]:
    return [math.log(p.ratio) for p in pool_from_results([path])]


def cochran_q(runs: Sequence[Sequence[float]]) -> tuple[float, list[float]]:
    """Q of the run means and the weights (1 / SE²) it used."""
    means = [statistics.fmean(r) for r in runs]
    weights = [len(r) / max(statistics.variance(r), 1e-12) for r in runs]
    centre = sum(w * m for w, m in zip(weights, means)) / sum(weights)
    return sum(w * (m - centre) ** 2 for w, m in zip(weights, means)), weights


def heterogeneity(runs: Sequence[Sequence[float]], shuffles: int, rng: random.Random) -> Heterogeneity:
    runs = [list(r) for r in runs if len(r) >= MIN_PAIRS]
    if len(runs) < 2:
        raise ValueError(f"needs at least 2 runs of {MIN_PAIRS}+ pairs, got {len(runs)}")
    q, weights = cochran_q(runs)
    df = len(runs) - 1
    sw = sum(weights)
    tau2 = max(0.0, (q - df) / (sw - sum(w * w for w in weights) / sw))
    flat = [x for r in runs for x in r]
    sizes = [len(r) for r in runs]
    at_least = 0
    for _ in range(shuffles):
        rng.shuffle(flat)
        cut, start = [], 0
        for n in sizes:
            cut.append(flat[start:start + n])
            start += n
        at_least += cochran_q(cut)[0] >= q
    return Heterogeneity(len(runs), len(flat), [statistics.fmean(r) * 100 for r in runs], q,
                         (at_least + 1) / (shuffles + 1), math.sqrt(tau2) * 100)


def normal_cdf(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def floor_rates(tau_pct: float, budget_pct: float, shift_pct: float) -> tuple[float, float]:
    """(false alarms, misses of +shift) that an offset of SD tau leaves at any number of pairs."""
    if tau_pct <= 0:
        return 0.0, 0.0
    b, s = math.log1p(budget_pct / 100), math.log1p(shift_pct / 100)
    t = tau_pct / 100
    return 1 - normal_cdf(b / t), normal_cdf((b - s) / t)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pools", type=Path, nargs="*", help="ab-pool JSON files (several runs each)")
    p.add_argument("--results", type=Path, nargs="*", default=[], help="A/B results.json files, pooled as one input")
    p.add_argument("--budget-pct", type=float, default=2.5, help="the A/B p50 budget the floor is computed at")
    p.add_argument("--shift-pct", type=float, default=5.0, help="the slowdown the floor's miss rate is for")
    p.add_argument("--shuffles", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    inputs = [(path.name, runs_in_pool(path)) for path in args.pools]
    if args.results:
        inputs.append((f"{len(args.results)} results files", [run_in_results(r) for r in args.results]))
    if not inputs:
        p.error("give pool files and/or --results")
    print(f"Between-run spread of log(candidate/baseline); floor at budget +{args.budget_pct:g} %, "
          f"slowdown +{args.shift_pct:g} %; {args.shuffles} shuffles per input.\n")
    print("| input | runs | pairs | Q (df) | permutation p | between-run SD | floor: false alarms | floor: +"
          f"{args.shift_pct:g} % missed | run means |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, runs in inputs:
        try:
            h = heterogeneity(runs, args.shuffles, random.Random(f"{args.seed}:{name}"))
        except ValueError as e:
            print(f"| {name} | {e} |||||||")
            continue
        fa, miss = floor_rates(h.tau_pct, args.budget_pct, args.shift_pct)
        means = ", ".join(f"{m:+.1f}" for m in h.run_means_pct)
        print(f"| {name} | {h.runs} | {h.pairs} | {h.q:.1f} ({h.runs - 1}) | {h.p_value:.3f} | {h.tau_pct:.2f} % "
              f"| {fa * 100:.1f} % | {miss * 100:.1f} % | {means} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
