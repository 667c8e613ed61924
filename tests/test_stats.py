"""guard.judge.stats: percentiles, order-statistic and signed-rank intervals and their coverage; the sensitivity
simulation (benchmarks/sensitivity.py) on synthetic pools. No engine."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import pytest

from guard.config.loading import load_thresholds
from guard.judge.stats import (binomial_cdf, centre_estimate, order_statistic_ranks, percentile, percentile_interval,
                         signed_rank_cdf, walsh_cut)
from tests.conftest import benchmark_script

ROOT = Path(__file__).parent.parent
THRESHOLDS = ROOT / "tests" / "fixtures" / "thresholds-statistics.yaml"  # pinned, see the file


# ----------------------------------------------------------------------------- percentile
def test_percentile_interpolates_like_numpy_type_7():
    xs = [4.0, 1.0, 3.0, 2.0]
    assert percentile(xs, 50) == pytest.approx(2.5)
    assert percentile(xs, 90) == pytest.approx(3.7)  # pos 2.7 between 3 and 4
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 4.0


def test_percentile_of_nothing_is_an_error_not_zero():
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)


# ----------------------------------------------------------------------------- interval
def test_binomial_cdf_matches_the_closed_form():
    n, q = 7, 0.3
    direct = [sum(math.comb(n, i) * q**i * (1 - q) ** (n - i) for i in range(k + 1)) for k in range(n + 1)]
    assert binomial_cdf(n, q) == pytest.approx(direct, abs=1e-12)
    assert binomial_cdf(2000, 0.5)[-1] == pytest.approx(1.0)  # log space: no overflow at large n


@pytest.mark.parametrize("n, p, ranks", [
    (5, 50, (None, None)),  # 1 - 0.5**5 = 0.969 < 0.975: neither side exists yet
    (6, 50, (1, 6)),
    (10, 50, (2, 9)),
    (15, 50, (4, 12)),
    (5, 90, (3, None)),  # p90 can be failed early ...
    (15, 90, (11, None)),  # ... but passed only from n = 36
    (35, 90, (28, None)),
    (36, 90, (29, 36)),
    (15, 99, (14, None)),
    (367, 99, (359, None)),
    (368, 99, (360, 368)),
])
def test_order_statistic_ranks_at_95_percent(n, p, ranks):
    assert order_statistic_ranks(n, p, 0.95) == ranks


def test_ranks_hold_their_confidence_exactly():
    n, p, conf = 40, 75, 0.9
    lo, hi = order_statistic_ranks(n, p, conf)
    cdf = binomial_cdf(n, p / 100)
    alpha = (1 - conf) / 2
    assert cdf[lo - 1] <= alpha < cdf[lo]  # lower: the tightest rank still below alpha
    assert cdf[hi - 2] < 1 - alpha <= cdf[hi - 1]  # upper: the tightest rank reaching 1 - alpha


def test_missing_sides_are_infinite():
    lo, hi = percentile_interval([7.1, 7.3, 7.2, 7.4, 7.0], 99, 0.95)
    assert lo == 7.3 and hi == math.inf  # 4th of 5 sorted
    assert percentile_interval([1.0, 2.0, 3.0, 4.0, 5.0], 50, 0.95) == (-math.inf, math.inf)


@pytest.mark.parametrize("p", [50, 90])
def test_coverage_of_the_95_percent_interval_at_n_50(p):
    """The interval covers the true percentile of a known distribution in about 95 % of runs,
    and never less (the bound is exact, its coverage the binomial sum, not an approximation)."""
    rng = random.Random(1234)
    true = -math.log(1 - p / 100)  # quantile of Exp(1)
    lo_rank, hi_rank = order_statistic_ranks(50, p, 0.95)
    cdf = binomial_cdf(50, p / 100)
    exact = cdf[hi_rank - 1] - cdf[lo_rank - 1]
    trials = 2000
    covered = 0
    for _ in range(trials):
        lo, hi = percentile_interval([rng.expovariate(1.0) for _ in range(50)], p, 0.95)
        covered += lo <= true <= hi
    rate = covered / trials
    assert exact >= 0.95
    assert rate == pytest.approx(exact, abs=0.015)  # ~3.5 binomial standard errors at 2000 trials
    assert rate >= 0.94


# ----------------------------------------------------------------------------- sensitivity simulation


def _normal_pool(tmp_path: Path, spread: float, size: int = 40) -> tuple[Path, list[float]]:
    rng = random.Random(7)
    samples = [rng.gauss(7.2, 7.2 * spread) for _ in range(size)]
    path = tmp_path / "pool.json"
    path.write_text(json.dumps({"schema": "guard/ttft-pool", "schema_version": 1, "profile": "cpu", "samples_s": samples}))
    return path, samples


@pytest.fixture(scope="module")
def sensitivity():
    with benchmark_script("sensitivity") as module:
        yield module


def test_simulation_detects_5_percent_and_stays_quiet_at_minus_5_on_a_1_percent_pool(tmp_path, sensitivity):
    _, pool = _normal_pool(tmp_path, 0.01)
    profile = load_thresholds(THRESHOLDS, require_decidable=False).profile("cpu")
    cells = {(c.shift_pct, c.key): c for c in sensitivity.simulate(pool, profile, [5.0, -5.0], trials=300, seed=0)}
    for key in ("p50", "p90", "p99"):
        assert cells[(5.0, key)].fail_rate >= 0.95, key
        assert cells[(-5.0, key)].fail_rate <= 0.01, key
    # p99 can never be *passed* by its interval at n <= 15: every clean trial runs to the cap of 15
    assert cells[(-5.0, "p99")].mean_requests == 15
    assert cells[(-5.0, "p99")].by_interval == 0
    # a clear regression is failed by the interval itself, before the cap
    assert cells[(5.0, "p50")].by_interval >= 0.95
    assert cells[(5.0, "p50")].mean_requests < 15


def test_simulation_is_reproducible_per_seed(tmp_path, sensitivity):
    _, pool = _normal_pool(tmp_path, 0.03)
    profile = load_thresholds(THRESHOLDS, require_decidable=False).profile("cpu")
    a = sensitivity.simulate(pool, profile, [2.0], trials=100, seed=5)
    assert a == sensitivity.simulate(pool, profile, [2.0], trials=100, seed=5)
    assert a != sensitivity.simulate(pool, profile, [2.0], trials=100, seed=6)


def test_budgets_place_the_pool_percentile_relative_to_the_budget(sensitivity):
    pool = [float(x) for x in range(1, 101)]
    above = sensitivity.budgets_for(pool, ["p50"], 3.0)["p50"]
    below = sensitivity.budgets_for(pool, ["p50"], -3.0)["p50"]
    true_ms = percentile(pool, 50) * 1000
    assert (true_ms - above) / above == pytest.approx(0.03)
    assert (true_ms - below) / below == pytest.approx(-0.03)


def test_script_reuses_the_pool_and_prints_the_table_and_command(tmp_path, sensitivity, monkeypatch, capsys):
    path, _ = _normal_pool(tmp_path, 0.01)

    def no_engine(*args, **kwargs):
        raise AssertionError("an existing pool must not start the engine")

    monkeypatch.setattr(sensitivity, "start_run", no_engine)
    assert sensitivity.main(["--pool", str(path), "--trials", "50", "--shifts", "3", "--thresholds", str(THRESHOLDS)]) == 0
    out = capsys.readouterr().out
    assert "| true vs budget | rate | p50 | p90 | p99 | mean requests |" in out
    assert "| +3 % | detection |" in out and "| -3 % | false alarm |" in out
    assert f"python benchmarks/sensitivity.py --pool {path}" in out and "--trials 50 --seed 0 --shifts 3" in out


def test_script_rejects_a_file_that_is_not_a_pool(tmp_path, sensitivity):
    bad = tmp_path / "results.json"
    bad.write_text(json.dumps({"schema": "guard/results", "samples_s": [1.0, 2.0]}))
    with pytest.raises(SystemExit, match="not a guard/ttft-pool"):
        sensitivity.load_pool(bad)


# ----------------------------------------------------------------------------- the signed-rank interval (A/B's p50)
def _brute_signed_rank_cdf(n: int) -> list[float]:
    """W+ over every one of the 2**n sign patterns of ranks 1..n: the definition, counted."""
    sums = sorted(sum(rank for rank, bit in zip(range(1, n + 1), f"{mask:0{n}b}") if bit == "1") for mask in range(2 ** n))
    return [sum(1 for w in sums if w <= k) / 2 ** n for k in range(n * (n + 1) // 2 + 1)]


@pytest.mark.parametrize("n", [1, 2, 5, 6, 9, 12])
def test_signed_rank_cdf_is_the_enumerated_distribution(n):
    assert signed_rank_cdf(n) == pytest.approx(_brute_signed_rank_cdf(n), abs=1e-12)


def test_walsh_cut_matches_the_tables():
    # n = 5: the most extreme pattern has P = 1/32 > 0.025, so no 95 % interval exists (as for the sign test)
    assert walsh_cut(5, 0.95) == 0
    assert walsh_cut(6, 0.95) == 1  # P(W+ <= 0) = 1/64
    assert walsh_cut(8, 0.95) == 4  # P(W+ <= 3) = 5/256 <= 0.025 < P(W+ <= 4) = 7/256
    assert walsh_cut(12, 0.95) == 14  # the textbook critical value 13 for n = 12, two-sided 0.05


def test_hodges_lehmann_and_the_interval_on_small_samples():
    assert centre_estimate([1.0, 2.0, 3.0], 0.95)[0] == 2.0  # Walsh averages 1, 1.5, 2, 2, 2.5, 3
    assert centre_estimate([1.0, 2.0, 3.0, 4.0, 5.0], 0.95)[1] == (-math.inf, math.inf)
    xs = [0.3, -0.1, 0.2, 0.05, -0.2, 0.1]
    assert centre_estimate(xs, 0.95)[1] == (min(xs), max(xs))  # n = 6: the extreme Walsh averages


@pytest.mark.parametrize("noise", ["laplace", "student3"])
def test_centre_interval_covers_at_its_exact_level_on_symmetric_heavy_tailed_noise(noise):
    rng = random.Random(7)
    n, conf, trials = 10, 0.95, 3000
    exact = 1 - 2 * signed_rank_cdf(n)[walsh_cut(n, conf) - 1]
    draw = {"laplace": lambda: rng.expovariate(1.0) * rng.choice((-1, 1)),
            "student3": lambda: rng.gauss(0, 1) / math.sqrt(sum(rng.gauss(0, 1) ** 2 for _ in range(3)) / 3)}[noise]
    hits = 0
    for _ in range(trials):
        _, (lo, hi) = centre_estimate([0.4 + draw() for _ in range(n)], conf)
        hits += lo <= 0.4 <= hi
    sd = math.sqrt(exact * (1 - exact) / trials)
    assert abs(hits / trials - exact) < 4 * sd and exact >= conf


def test_centre_interval_is_narrower_than_the_sign_test_interval():
    rng = random.Random(3)
    widths = []
    for _ in range(300):
        xs = [rng.gauss(0, 0.04) for _ in range(12)]
        c, s = centre_estimate(xs, 0.95)[1], percentile_interval(xs, 50, 0.95)
        widths.append((c[1] - c[0]) / (s[1] - s[0]))
    assert statistics.median(widths) < 0.85
