"""How sensitive is the A/B verdict, and how does it compare with the absolute one? Not a test.

1. Pools. Paired TTFT samples recorded once with two live engines through guard's own A/B run
   stage (guard.measure.ab_run.run_ab: two workers, warm-up, ABBA blocks, same image per pair), cached
   in JSON files: ``--pool`` with identical sides (the baseline is ``--baseline PYTHON``, by
   default this interpreter), ``--slow-pool`` with the candidate slowed by
   ``--inject slow-encoder:5%``. An existing pool file is reused; no engine is started.
2. Simulation. Each trial bootstraps a run from a pool: ``workload.requests`` pairs drawn with
   replacement, then ``ab.batch`` (default ``statistics.batch``) more while any ratio budget is undecided, up to
   ``statistics.max_requests`` pairs, through the run stage's own loop (guard.measure.stopping.sample_until_decided
   with guard.judge.sequential.ab_run_rule: guard.judge.ab's undecided_ratios), judged by guard.judge.ab.judge_ratio. Rows:
   - the identical pool as recorded (false alarms), and with every ratio multiplied by 1 + s
     (a synthetic slowdown s: detection);
   - the slowed pool as recorded (detection of the real injected slowdown);
   - the absolute rule on the same candidate samples (guard.judge.evaluate.ttft_check against the
     profile's ``ttft_ms`` budget), for the A/B vs absolute table.
3. Coverage. For the identical pool, the share of simulated intervals (at fixed n) that contain
   the pool's own percentile of the ratio: the interval's real confidence on this data.

    python benchmarks/ab_sensitivity.py --baseline /tmp/baseline-venv/bin/python   # records pools when missing
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import random
import sys
from collections.abc import Sequence
from pathlib import Path

from guard.model import format as fmt
from guard.judge.ab import decide_ratio, judge_ratio, ratio_estimate, undecided_ratios
from guard.model.records import Status
from guard.model.checks import Pair, pairs
from guard.config.budgets import Profile
from guard.config.loading import load_thresholds
from guard.judge.rules import judge_latency, undecided
from guard.judge.sequential import SequentialRule, ab_run_rule
from guard.measure.stopping import sample_until_decided
from guard.judge.stats import percentile

POOL_SCHEMA = "guard/ab-pool"


# ----------------------------------------------------------------------------- pools
def record_pool(path: Path, args: argparse.Namespace, inject: str | None) -> None:
    from guard.measure.ab_run import ABRun, run_ab
    from guard.measure.hardware import detect
    from guard.measure.fit import select_profile

    thresholds = load_thresholds(args.thresholds)
    hw = detect()
    profile = select_profile(thresholds, args.profile, hw)
    # every pair measured (no early stop), no op-count pass: this records TTFT pairs only
    profile = dataclasses.replace(profile, ops=(), ttft_vs_baseline_pct={},
                                  workload=dataclasses.replace(profile.workload, requests=args.pool_size))
    out = args.output / (inject or "identical").replace(":", "-").replace("%", "pct")
    out.mkdir(parents=True, exist_ok=True)
    rec = run_ab(ABRun(thresholds, profile, hw, out, args.baseline, inject=inject,
                       progress=lambda m: print(f"[guard] {m}", file=sys.stderr, flush=True), rule=ab_run_rule(profile)))
    if rec.candidate.invalid_reasons:
        raise SystemExit("pool run invalid: " + "; ".join(rec.candidate.invalid_reasons))
    got = pairs(rec.candidate.outcomes, rec.baseline.outcomes)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "schema": POOL_SCHEMA, "schema_version": 1, "profile": profile.name, "inject": inject,
        "baseline_python": args.baseline, "order": rec.order, "duration_s": rec.duration_s,
        "recorded_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "pairs": [[p.index, p.candidate_s, p.baseline_s] for p in got],
        "environment": {"candidate": rec.candidate.environment.worker,
                        "baseline": rec.baseline.environment.worker, "cpu": rec.candidate.environment.cpu},
    }, indent=2) + "\n", encoding="utf-8")


def pool_from_results(paths: Sequence[Path]) -> list[Pair]:
    """The measured pairs of A/B results.json files (e.g. benchmarks/ab_live.py's runs), pooled."""
    out: list[Pair] = []
    for path in paths:
        data = json.loads(path.read_text(encoding="utf-8"))
        ab = data.get("ab") or {}
        out += [Pair(int(p["index"]), float(p["candidate_s"]), float(p["baseline_s"])) for p in ab.get("pairs", [])]
    return out


def write_pool(path: Path, pool: Sequence[Pair], sources: Sequence[Path], inject: str | None) -> None:
    path.write_text(json.dumps({
        "schema": POOL_SCHEMA, "schema_version": 1, "inject": inject, "sources": [str(s) for s in sources],
        "recorded_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "pairs": [[p.index, p.candidate_s, p.baseline_s] for p in pool]}, indent=2) + "\n", encoding="utf-8")


def load_pool(path: Path) -> list[Pair]:
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("schema") != POOL_SCHEMA:
        raise SystemExit(f"{path}: not a {POOL_SCHEMA} file")
    return [Pair(int(i), float(c), float(b)) for i, c, b in data["pairs"]]


def slowed(pool: Sequence[Pair], shift_pct: float) -> list[Pair]:
    """The candidate side multiplied by 1 + shift: a synthetic slowdown."""
    return [Pair(p.index, p.candidate_s * (1 + shift_pct / 100), p.baseline_s) for p in pool]


# ----------------------------------------------------------------------------- simulation
def _draw_until_decided(draw, first: int, stats, undecided_in) -> tuple[list, int]:
    """One simulated run through the run stage's own loop (guard.measure.stopping.sample_until_decided),
    ``draw(k)`` standing in for measuring k samples: (every sample, rounds)."""
    drawn: list = []

    def measure(count: int) -> list:
        new = draw(count)
        drawn.append(new)
        return new

    samples = sample_until_decided(SequentialRule(stats, undecided_in), first, measure)
    return samples, len(drawn)


def _simulated_ab_run(pool: Sequence[Pair], profile: Profile, budgets: dict[str, float],
                      rng: random.Random, run_offset_pct: float = 0.0) -> tuple[list, int]:
    """One A/B run drawn from ``pool`` under the profile's A/B rule: (its pairs, rounds).
    ``run_offset_pct``: the SD of a lean shared by all of this run's pairs (the candidate side
    times exp(N(0, SD))), which a bootstrap of pairs pooled over many runs averages away;
    benchmarks/ab_between_runs.py measures it."""
    stats = profile.ab_statistics
    factor = math.exp(rng.gauss(0, run_offset_pct / 100)) if run_offset_pct else 1.0

    def draw(k: int) -> list[Pair]:
        drawn = rng.choices(pool, k=k)
        return drawn if factor == 1.0 else [Pair(p.index, p.candidate_s * factor, p.baseline_s) for p in drawn]

    return _draw_until_decided(draw, profile.workload.requests, stats,
                               lambda drawn: undecided_ratios(budgets, [p.ratio for p in drawn], stats))


def simulate_ab(pool: Sequence[Pair], profile: Profile, budgets: dict[str, float], trials: int,
                rng: random.Random, run_offset_pct: float = 0.0) -> tuple[dict[str, float], float]:
    """Fail rate per budgeted percentile and mean pairs per run."""
    stats = profile.ab_statistics
    fails = dict.fromkeys(budgets, 0)
    total = 0
    for _ in range(trials):
        sample, rounds = _simulated_ab_run(pool, profile, budgets, rng, run_offset_pct)
        total += len(sample)
        for k, b in budgets.items():
            c = judge_ratio(k, b, sample, rounds, stats)
            fails[k] += c.status == Status.FAIL
    return {k: v / trials for k, v in fails.items()}, total / trials


def simulate_cap_rules(pool: Sequence[Pair], profile: Profile, budgets: dict[str, float], trials: int,
                       rng: random.Random) -> tuple[float, float, float, float]:
    """Each simulated run judged two ways once the run stage stops: as shipped (a budget still
    straddled at the cap is settled by the point estimate) and by the alternative that a run the
    cap leaves straddled is invalid (exit 3, "cannot decide on this machine"). Returns the shipped
    fail rate, the alternative's fail and exit-3 rates, and the mean pairs."""
    stats = profile.ab_statistics
    fails = alt_fails = alt_undecided = total = 0
    for _ in range(trials):
        sample, rounds = _simulated_ab_run(pool, profile, budgets, rng)
        total += len(sample)
        checks = [judge_ratio(k, b, sample, rounds, stats) for k, b in budgets.items()]
        fails += any(c.status == Status.FAIL for c in checks)
        by_interval = any(c.status == Status.FAIL and c.note is None for c in checks)  # note: settled by the estimate
        alt_fails += by_interval
        alt_undecided += not by_interval and any(c.note is not None for c in checks)
    return fails / trials, alt_fails / trials, alt_undecided / trials, total / trials


def cap_rules(profile: Profile, args: argparse.Namespace) -> None:
    """What settling a straddled budget at the cap by the point estimate buys, against calling
    such a run undecided (exit 3): on the recorded pools and on normal noise of each --spreads."""
    budgets = profile.ttft_vs_baseline_pct
    st = profile.ab_statistics
    print(f"Profile `{profile.name}`: A/B budget {', '.join(f'{k} +{b:g} %' for k, b in budgets.items())}; "
          f"{profile.workload.requests} pairs, then {st.batch} at a time up to {st.max_requests}, "
          f"{fmt.levels(st.confidence, st.fail_confidence)} looks; {args.trials} simulated runs per row.\n")
    print("| pairs drawn from | candidate | as shipped: fails | straddled at the cap → exit 3: fails | … exit 3 | mean pairs |")
    print("|---|---|---:|---:|---:|---:|")
    sources: list[tuple[str, list[Pair], list[Pair] | None]] = []
    if args.pool.exists():
        pool = load_pool(args.pool)
        centre = percentile([p.ratio for p in pool], 50)
        centred = [Pair(p.index, p.candidate_s / centre, p.baseline_s) for p in pool]
        sources.append((f"{args.pool.name} ({len(pool)} pairs)", pool, slowed(centred, args.grid_shift)))
    if args.slow_pool.exists():
        sources.append((f"{args.slow_pool.name}", load_pool(args.slow_pool), None))
    rng = random.Random(f"{args.seed}:cap-rules")
    for spread in [float(x) for x in args.spreads.split(",")]:
        sources.append((f"normal, {spread:g} % spread", normal_pool(spread, 0, rng), normal_pool(spread, args.grid_shift, rng)))
    for label, same, slow in sources:
        for who, pool in (("identical" if slow is not None else args.inject, same), (f"+{args.grid_shift:g} %", slow)):
            if pool is None:
                continue
            fail, alt_fail, alt_undecided, n = simulate_cap_rules(pool, profile, budgets, args.trials,
                                                                  random.Random(f"{args.seed}:{label}:{who}"))
            print(f"| {label} | {who} | {fail * 100:.1f} % | {alt_fail * 100:.1f} % | {alt_undecided * 100:.1f} % | {n:.1f} |",
                  flush=True)


def simulate_absolute(samples: Sequence[float], profile: Profile, trials: int, rng: random.Random) -> tuple[dict[str, float], float]:
    stats = profile.statistics
    fails = dict.fromkeys(profile.ttft_ms, 0)
    total = 0
    for _ in range(trials):
        sample, rounds = _draw_until_decided(
            lambda k: rng.choices(samples, k=k), profile.workload.requests, stats,
            lambda drawn: undecided(profile.ttft_ms, drawn, stats.confidence))
        total += len(sample)
        for k, b in profile.ttft_ms.items():
            c = judge_latency(k, b, sample, rounds, confidence=stats.confidence, max_requests=stats.max_requests)
            fails[k] += c.status == Status.FAIL
    return {k: v / trials for k, v in fails.items()}, total / trials


def coverage(ratios: Sequence[float], key: str, n: int, confidence: float, trials: int, rng: random.Random) -> float:
    truth, _ = ratio_estimate(key, ratios, confidence)  # the pool's own value of the rule's statistic
    hit = 0
    for _ in range(trials):
        d = decide_ratio(key, 0.0, rng.choices(ratios, k=n), confidence)
        lo, hi = d.interval_pct
        hit += lo <= truth * 100 - 100 <= hi
    return hit / trials


# ----------------------------------------------------------------------------- command line
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pool", type=Path, default=Path("benchmarks/ab-pool-identical.json"))
    p.add_argument("--slow-pool", type=Path, default=Path("benchmarks/ab-pool-slow-encoder-5pct.json"))
    p.add_argument("--baseline", default=sys.executable, help="baseline interpreter when recording pools")
    p.add_argument("--inject", default="slow-encoder:5%", help="candidate hook of the slowed pool")
    p.add_argument("--pool-size", type=int, default=24, help="pairs per recorded pool")
    p.add_argument("--thresholds", default="thresholds/deepseek-ocr-2.yaml")
    p.add_argument("--profile", default="cpu")
    p.add_argument("--trials", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shifts", default="0,2,3,5", help="synthetic slowdowns in %% applied to the identical pool")
    p.add_argument("--busy-pct", type=float, default=20.0,
                   help="add a row where both sides are this much slower (a busy machine, synthetic); 0: none")
    p.add_argument("--run-offset-sd", type=float, default=0.0, metavar="PCT",
                   help="give each simulated A/B run its own lean, normal with this SD in %% (the between-run "
                        "SD benchmarks/ab_between_runs.py measures); 0: pairs only, as pooled")
    p.add_argument("--no-record", action="store_true", help="never start an engine; skip missing pools")
    p.add_argument("--identical-results", type=Path, nargs="*", default=None,
                   help="build --pool from these A/B results.json files (identical sides) instead of recording")
    p.add_argument("--proxy-from-absolute-pool", type=Path, default=None,
                   help="build --pool from a benchmarks/sensitivity.py pool (one engine, sequential requests): "
                        "consecutive requests paired (2k+1 as candidate, 2k as baseline). A proxy for identical "
                        "sides: same process, adjacent in time, different images")
    p.add_argument("--slow-results", type=Path, nargs="*", default=None,
                   help="build --slow-pool from these A/B results.json files (candidate slowed by --inject)")
    p.add_argument("--output", type=Path, default=Path("guard-results/ab-sensitivity"))
    p.add_argument("--grid", default=None, metavar="CONFIDENCES",
                   help="instead of the pools: the A/B rule at these per-look confidences (e.g. 0.95,0.9,0.8; "
                        "0.8/0.95 passes a look at 0.8 and fails it at 0.95: ab.fail_confidence) on "
                        "synthetic normal log-ratio noise of each --spreads, identical and +--grid-shift %%")
    p.add_argument("--spreads", default="3,4,5,6,7", help="per-pair spreads in %% (SD of log ratio) for --grid")
    p.add_argument("--grid-shift", type=float, default=5.0, help="the slowdown in %% --grid and --cap-rules must catch")
    p.add_argument("--cap-rules", action="store_true",
                   help="instead: the shipped rule at the cap (point estimate) against calling a run the cap leaves "
                        "straddled undecided (exit 3), on the pools and on normal noise of each --spreads")
    return p.parse_args(argv)


def normal_pool(spread_pct: float, shift_pct: float, rng: random.Random, size: int = 4000) -> list[Pair]:
    """Pairs whose log ratio is normal with SD ``spread_pct`` %, centred on log(1 + shift)."""
    return [Pair(i, 6.0 * (1 + shift_pct / 100) * math.exp(rng.gauss(0, spread_pct / 100)), 6.0) for i in range(size)]


def grid(profile: Profile, args: argparse.Namespace) -> None:
    """Operating characteristics of the whole sequential rule (looks, batches, cap, point estimate
    at the cap) against the per-look confidence: what `ab.confidence` trades."""
    budgets = profile.ttft_vs_baseline_pct
    st = profile.ab_statistics
    print(f"Profile `{profile.name}`: A/B budget {', '.join(f'{k} +{b:g} %' for k, b in budgets.items())}; "
          f"{profile.workload.requests} pairs, then {st.batch} at a time up to {st.max_requests}; normal log-ratio "
          f"noise; {args.trials} simulated runs per cell.\n")
    print(f"| confidence per look | per-pair spread | false alarms (identical) | +{args.grid_shift:g} % caught "
          "| mean pairs, identical | mean pairs, slowed |")
    print("|---:|---:|---:|---:|---:|---:|")
    for spec in args.grid.split(","):
        conf, _, fail = spec.partition("/")
        conf, fail = float(conf), float(fail) if fail else None
        p = dataclasses.replace(profile, ab=dataclasses.replace(profile.ab, confidence=conf, fail_confidence=fail))
        label = f"{conf:g}" + (f", fails at {fail:g}" if fail else "")
        for spread in [float(x) for x in args.spreads.split(",")]:
            rng = random.Random(f"{args.seed}:grid:{conf}:{spread}")
            fa, n_same = simulate_ab(normal_pool(spread, 0, rng), p, budgets, args.trials, rng)
            caught, n_slow = simulate_ab(normal_pool(spread, args.grid_shift, rng), p, budgets, args.trials, rng)
            print(f"| {label} | {spread:g} % | {max(fa.values()) * 100:.1f} % | {min(caught.values()) * 100:.1f} % "
                  f"| {n_same:.1f} | {n_slow:.1f} |", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    profile = load_thresholds(args.thresholds).profile(args.profile)
    budgets = profile.ttft_vs_baseline_pct
    if not budgets:
        raise SystemExit(f"profile '{profile.name}' has no ttft_vs_baseline_pct budget")
    if args.grid:
        grid(profile, args)
        return 0
    if args.proxy_from_absolute_pool:
        seq = [float(x) for x in json.loads(args.proxy_from_absolute_pool.read_text())["samples_s"]]
        proxy = [Pair(i, seq[2 * i + 1], seq[2 * i]) for i in range(len(seq) // 2)]
        write_pool(args.pool, proxy, [args.proxy_from_absolute_pool], None)
        print(f"pool {args.pool}: {len(proxy)} proxy pairs from {args.proxy_from_absolute_pool}", file=sys.stderr)
    for path, inject, sources in ((args.pool, None, args.identical_results), (args.slow_pool, args.inject, args.slow_results)):
        if sources:
            pool = pool_from_results(sources)
            write_pool(path, pool, sources, inject)
            print(f"pool {path}: {len(pool)} pairs from {len(sources)} results files", file=sys.stderr)
    for path, inject in ((args.pool, None), (args.slow_pool, args.inject)):
        if not path.exists() and not args.no_record:
            print(f"pool {path} missing: recording {args.pool_size} pairs (inject={inject})", file=sys.stderr)
            record_pool(path, args, inject)
    if args.cap_rules:
        cap_rules(profile, args)
        return 0
    st = profile.statistics
    keys = list(budgets)
    rows: list[str] = []

    def row(label: str, pool: Sequence[Pair]) -> None:
        cand = [p.candidate_s for p in pool]
        ab, ab_n = simulate_ab(pool, profile, budgets, args.trials, random.Random(f"{args.seed}:{label}:ab"),
                               args.run_offset_sd)
        ab_cells = " | ".join(f"{ab[k] * 100:.1f} %" for k in keys)
        med = (percentile([p.ratio for p in pool], 50) - 1) * 100
        if profile.ttft_ms:
            ab_abs, abs_n = simulate_absolute(cand, profile, args.trials, random.Random(f"{args.seed}:{label}:abs"))
            abs_cells = " | ".join(f"{ab_abs[k] * 100:.1f} %" for k in profile.ttft_ms)
        else:
            abs_cells, abs_n = "—", 0
        rows.append(f"| {label} | {med:+.1f} % | {ab_cells} | {ab_n:.1f} | {abs_cells} | {abs_n:.1f} |")

    print(f"Profile `{profile.name}`: A/B budget {', '.join(f'{k} +{b:g} %' for k, b in budgets.items())}, "
          f"absolute budget {', '.join(f'{k} {b:.0f} ms' for k, b in profile.ttft_ms.items()) or 'none'}; "
          f"{profile.workload.requests} pairs/requests, then batches of {profile.ab_statistics.batch} pairs / "
          f"{st.batch} requests up to {st.max_requests}, "
          f"{fmt.levels(profile.ab_statistics.confidence, profile.ab_statistics.fail_confidence)} ratio intervals, "
          f"{st.confidence * 100:g} % absolute "
          f"intervals; {args.trials} simulated runs per row"
          + (f"; each A/B run leaning by its own N(0, {args.run_offset_sd:g} %)" if args.run_offset_sd else "")
          + ".\n")
    print("| candidate | pool's median ratio − 1 | A/B fails: " + " | ".join(keys)
          + " | A/B mean pairs | absolute fails: " + " | ".join(profile.ttft_ms or ["—"]) + " | absolute mean requests |")
    print("|---|---:|" + "---:|" * len(keys) + "---:|" + "---:|" * max(1, len(profile.ttft_ms)) + "---:|")
    if args.pool.exists():
        pool = load_pool(args.pool)
        print(f"(identical pool: {len(pool)} pairs, {args.pool})", file=sys.stderr)
        # synthetic slowdowns start from the pool centred on a median ratio of exactly 1, so that
        # "+5 %" is the true median slowdown of the simulated candidate, not 5 % on top of chance
        centre = percentile([p.ratio for p in pool], 50)
        centred = [Pair(p.index, p.candidate_s / centre, p.baseline_s) for p in pool]
        for s in [float(x) for x in args.shifts.split(",") if x.strip()]:
            label = "identical (recorded)" if s == 0 else f"synthetic: median slowdown +{s:g} %"
            row(label, pool if s == 0 else slowed(centred, s))
        if args.busy_pct:
            # a uniformly slower machine (both sides): A/B's ratios are unchanged by construction;
            # the absolute rule sees a regression. Real contention is not uniform: see ab_live.py.
            b = 1 + args.busy_pct / 100
            row(f"identical, machine {args.busy_pct:g} % slower (synthetic, both sides)",
                [Pair(p.index, p.candidate_s * b, p.baseline_s * b) for p in pool])
    if args.slow_pool.exists():
        row(f"{args.inject} (recorded)", load_pool(args.slow_pool))
    print("\n".join(rows))
    if args.pool.exists():
        ratios = [p.ratio for p in load_pool(args.pool)]
        print("\nCoverage of the ratio interval on the identical pool (share of intervals that contain the pool's own value):\n")
        print("| percentile | n = 6 | n = 12 | n = 24 |\n|---|---:|---:|---:|")
        for k in keys:
            cells = [coverage(ratios, k, n, profile.ab_statistics.confidence, args.trials, random.Random(f"{args.seed}:cov:{k}:{n}"))
                     for n in (6, 12, 24)]
            print(f"| {k} | " + " | ".join(f"{c * 100:.1f} %" for c in cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
