"""Would a sequential probability ratio test decide A/B runs in fewer pairs? Not a test.

The shipped rule looks at an interval of the median ratio after 6 pairs, then every 2, up to
24, and passes or fails when the interval clears the budget b. Wald's SPRT is the sequential
test with the smallest expected sample for given error rates between two points, here "no
change" and "+2b %" (the budget halfway between them): after each look it adds up the log
likelihood ratio of the pairs' log ratios under normal noise,

    LLR = (theta1 - theta0) / sigma^2 * sum(x_i - (theta0 + theta1) / 2),

fails when LLR >= log((1 - beta) / alpha), passes when LLR <= log(beta / (1 - alpha)), and at
the cap decides by the side of the midpoint the mean is on. sigma is not known and is taken
from the run's own pairs: their SD, or (``huber``) 1.4826 x their MAD with every log ratio
clipped at 1.5 of it from their median, since single requests here run up to 45 % slow; either
way at least the variant's floor (``VARIANTS``). Each variant is simulated on the shipped looks
(guard.measure.stopping.sample_until_decided: ``workload.requests`` pairs, then ``ab.batch``, up to
``statistics.max_requests``) and bootstrap draws from recorded pools as
benchmarks/ab_sensitivity.py draws them, beside the shipped rule on the same pools.

    python benchmarks/ab_sprt.py --pools retained avx2-float32 --trials 2000
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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the pools and the shipped rule's replay
from ab_sensitivity import load_pool, simulate_ab, slowed  # noqa: E402

from guard.config.budgets import Profile  # noqa: E402
from guard.config.loading import load_thresholds  # noqa: E402
from guard.model.checks import Pair  # noqa: E402
from guard.judge.sequential import SequentialRule  # noqa: E402
from guard.measure.stopping import sample_until_decided  # noqa: E402

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Sprt:
    alpha: float  # false alarms wanted at "no change"
    beta: float  # misses wanted at +2b %
    scale: str  # "sd" or "huber"
    sigma_floor_pct: float

    @property
    def label(self) -> str:
        return (f"SPRT alpha {self.alpha:g}, beta {self.beta:g}, sigma from the "
                f"{'pairs SD' if self.scale == 'sd' else 'MAD, clipped'} (floor {self.sigma_floor_pct:g} %)")


def sprt_decides(xs: Sequence[float], budget_pct: float, test: Sprt, at_cap: bool) -> bool | None:
    """True: fail, False: pass, None: look again. ``xs``: the log ratios so far."""
    theta0, theta1 = 0.0, math.log1p(2 * budget_pct / 100)
    mid = (theta0 + theta1) / 2
    floor = test.sigma_floor_pct / 100
    centre = statistics.median(xs)
    if test.scale == "huber":
        sigma = max(1.4826 * statistics.median(abs(x - centre) for x in xs), floor)
        xs = [centre + max(-1.5 * sigma, min(1.5 * sigma, x - centre)) for x in xs]
    else:
        sigma = max(statistics.stdev(xs), floor)
    excess = sum(x - mid for x in xs)
    llr = (theta1 - theta0) / sigma ** 2 * excess
    if llr >= math.log((1 - test.beta) / test.alpha):
        return True
    if llr <= math.log(test.beta / (1 - test.alpha)):
        return False
    return excess > 0 if at_cap else None


def simulate_sprt(pool: Sequence[Pair], profile: Profile, budget_pct: float, test: Sprt, trials: int,
                  rng: random.Random) -> tuple[float, float]:
    """Fail rate and mean pairs of ``test`` on runs drawn from ``pool`` with the profile's looks."""
    def draw(k: int) -> list[float]:
        return [math.log(p.ratio) for p in rng.choices(pool, k=k)]

    def undecided_in(xs: Sequence[float]) -> list[str]:
        return ["p50"] if sprt_decides(xs, budget_pct, test, at_cap=False) is None else []

    fails = total = 0
    for _ in range(trials):
        xs = sample_until_decided(SequentialRule(profile.ab_statistics, undecided_in), profile.workload.requests, draw)
        fails += sprt_decides(xs, budget_pct, test, at_cap=True)  # a crossed bound wins over the cap's midpoint
        total += len(xs)
    return fails / trials, total / trials


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pools", nargs="+", default=["retained", "avx2-float32", "avx2-float32-morning", "xeon"],
                   help="pool names: benchmarks/ab-pool-identical-NAME.json with its slow-encoder-5pct twin")
    p.add_argument("--thresholds", default="thresholds/deepseek-ocr-2.yaml")
    p.add_argument("--profile", default="cpu")
    p.add_argument("--trials", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


VARIANTS = (Sprt(0.05, 0.05, "sd", 2.0), Sprt(0.01, 0.05, "sd", 4.0), Sprt(0.005, 0.02, "huber", 4.0))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    profile = load_thresholds(args.thresholds).profile(args.profile)
    budget = profile.ttft_vs_baseline_pct.get("p50")
    if budget is None:
        raise SystemExit(f"profile '{profile.name}' has no p50 ttft_vs_baseline_pct budget")
    shift = 2 * budget
    print(f"Profile `{profile.name}`: p50 budget +{budget:g} %, the SPRT between 0 and +{shift:g} %; "
          f"{args.trials} simulated runs per cell.\n")
    print(f"| pools | rule | false alarms | mean pairs | +{shift:g} % caught | mean pairs | hook caught | mean pairs |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name in args.pools:
        same = load_pool(HERE / f"ab-pool-identical-{name}.json")
        hook = load_pool(HERE / f"ab-pool-slow-encoder-5pct-{name}.json")
        for rule in (None, *VARIANTS):
            cells = []
            for kind, pool in (("same", same), ("shift", slowed(same, shift)), ("hook", hook)):
                rng = random.Random(f"{args.seed}:{name}:{kind}:{rule}")
                if rule is None:
                    rates, pairs = simulate_ab(pool, profile, {"p50": budget}, args.trials, rng)
                    rate = rates["p50"]
                else:
                    rate, pairs = simulate_sprt(pool, profile, budget, rule, args.trials, rng)
                cells += [f"{rate * 100:.1f} %", f"{pairs:.1f}"]
            print(f"| {name} | {'shipped' if rule is None else rule.label} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
