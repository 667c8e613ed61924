"""How sensitive is guard's TTFT verdict? Detection and false-alarm rates, measured. Not a test.

1. Pool. Real TTFT samples of one profile (default: cpu), recorded once with the live engine
   through guard.measure.single_run.GuardRun (one warm-up, then --pool-size measured requests) and cached in
   the --pool JSON file; an existing pool file is reused and no engine is started.
2. Simulation. Each trial bootstraps a run from the pool: ``workload.requests`` samples drawn with
   replacement, then, while any budgeted percentile is inconclusive, ``statistics.batch`` more up
   to ``statistics.max_requests``, by the run stage's own loop and rule (guard.measure.stopping
   with guard.judge.sequential.single_run_rule), and every percentile judged by the verdict's
   (guard.judge.rules.judge_latency). The budgets are
   placed relative to the pool's own percentiles: the true value s % above the budget
   (budget = true / (1 + s)) gives the detection rate (share of trials that FAIL), s % below
   (budget = true / (1 - s)) the false-alarm rate. All budgeted percentiles move together, as a
   real slowdown moves them, so they share the resampling rounds of a real run.
   Limits of the method: the pool *is* the distribution, so its tail is only as good as its size
   (the pool's p99 of 40 samples is close to its maximum, and a bootstrap run can never exceed
   the pool's maximum: p99 false alarms come out near zero by construction).
3. --live-slowdown. With the live engine: measure clean TTFT, set the p50 budget just above it
   (clean p50 x (1 + --margin-pct)), then wrap the forward of every ``Qwen2Decoder2Encoder``
   module (the vision encoder) with a sleep worth --delay-pct of the clean TTFT, and run the real
   run stage (GuardRun.time_until_decided) and guard.judge.evaluate against that budget. It must FAIL.

Targets: >= 95 % detection at +3 %, <= 1 % false alarms at -3 %.

    python benchmarks/sensitivity.py --pool benchmarks/ttft-pool-cpu.json            # records the pool once
    python benchmarks/sensitivity.py --pool benchmarks/ttft-pool-cpu.json --live-slowdown
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import random
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from guard.model import format as fmt
from guard.config.budgets import Profile, percentile_value
from guard.config.loading import load_thresholds
from guard.model.records import RunRecord, Status
from guard.judge.rules import judge_latency
from guard.judge.sequential import single_run_rule, ttft_rule
from guard.measure.stopping import sample_until_decided
from guard.judge.stats import percentile

POOL_SCHEMA = "guard/ttft-pool"
ENCODER_CLASS = "Qwen2Decoder2Encoder"  # vllm/model_executor/models/deepencoder2.py: the vision encoder
DEFAULT_SHIFTS = (1.0, 2.0, 3.0, 5.0)
TARGET_DETECTION, TARGET_FALSE_ALARM, TARGET_SHIFT = 0.95, 0.01, 3.0


# ----------------------------------------------------------------------------- pool
def load_pool(path: Path) -> list[float]:
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("schema") != POOL_SCHEMA:
        raise SystemExit(f"{path}: not a {POOL_SCHEMA} file")
    samples = [float(s) for s in data["samples_s"]]
    if len(samples) < 2:
        raise SystemExit(f"{path}: a pool needs at least 2 samples, has {len(samples)}")
    return samples


def write_pool(path: Path, samples: Sequence[float], profile: str, environment: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "schema": POOL_SCHEMA, "schema_version": 1, "profile": profile, "samples_s": list(samples),
        "recorded_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "environment": environment,
    }, indent=2) + "\n", encoding="utf-8")


# ----------------------------------------------------------------------------- simulation
@dataclass(frozen=True)
class Cell:
    """One percentile at one budget placement, over all trials."""

    shift_pct: float  # (true - budget) / budget: > 0 a regression to detect, < 0 a false alarm to avoid
    key: str  # "p50"
    fail_rate: float
    by_interval: float  # share of trials decided by the interval alone (the rest: point estimate at the cap)
    mean_requests: float


def budgets_for(pool: Sequence[float], keys: Sequence[str], shift_pct: float) -> dict[str, float]:
    """Budgets (ms) that put the pool's own percentile shift_pct % above (or below) each budget."""
    return {k: percentile(pool, percentile_value(k)) * 1000.0 / (1.0 + shift_pct / 100.0) for k in keys}


def simulate_run(pool: Sequence[float], profile: Profile, rng: random.Random) -> tuple[list[float], int]:
    """One bootstrapped run: the first round, then resampling rounds by the run stage's rule."""
    rounds = 0

    def measure(n: int) -> list[float]:
        nonlocal rounds
        rounds += 1
        return rng.choices(pool, k=n)

    # the run stage's rule on TTFT alone (single_run_rule reads it from each timed request)
    samples = sample_until_decided(ttft_rule(profile.ttft_ms, profile.statistics), profile.workload.requests, measure)
    return samples, rounds


def simulate(pool: Sequence[float], profile: Profile, shifts_pct: Sequence[float], trials: int, seed: int) -> list[Cell]:
    keys = list(profile.ttft_ms)
    stats = profile.statistics
    cells = []
    for shift in shifts_pct:
        budgets = budgets_for(pool, keys, shift)
        placed = dataclasses.replace(profile, ttft_ms=budgets)
        rng = random.Random(f"{seed}:{shift}")  # per row: a row does not depend on which others are run
        fails = dict.fromkeys(keys, 0)
        by_interval = dict.fromkeys(keys, 0)
        requests = 0
        for _ in range(trials):
            samples, rounds = simulate_run(pool, placed, rng)
            requests += len(samples)
            for k in keys:
                c = judge_latency(k, budgets[k], samples, rounds, confidence=stats.confidence, max_requests=stats.max_requests)
                fails[k] += c.status == Status.FAIL
                by_interval[k] += c.note is None
        cells += [Cell(shift, k, fails[k] / trials, by_interval[k] / trials, requests / trials) for k in keys]
    return cells


def render_table(cells: Sequence[Cell], pool: Sequence[float], profile: Profile, trials: int) -> str:
    keys = list(dict.fromkeys(c.key for c in cells))
    shifts = sorted({c.shift_pct for c in cells}, key=lambda s: (s < 0, abs(s)))
    at = {(c.shift_pct, c.key): c for c in cells}
    st = profile.statistics
    lines = [
        f"Profile `{profile.name}`: {profile.workload.requests} requests, then batches of {st.batch} up to "
        f"{st.max_requests}, {st.confidence * 100:g} % distribution-free intervals; pool of {len(pool)} samples "
        f"(median {percentile(pool, 50) * 1000:.0f} ms, spread p10-p90 "
        f"{(percentile(pool, 90) - percentile(pool, 10)) / percentile(pool, 50) * 100:.1f} %); {trials} trials per row.",
        "",
        "| true vs budget | rate | " + " | ".join(keys) + " | mean requests |",
        "|---|---|" + "---:|" * len(keys) + "---:|",
    ]
    for s in shifts:
        rate = "detection" if s > 0 else "false alarm"
        row = []
        for k in keys:
            c = at[(s, k)]
            miss = (s >= TARGET_SHIFT and c.fail_rate < TARGET_DETECTION) or (s <= -TARGET_SHIFT and c.fail_rate > TARGET_FALSE_ALARM)
            row.append(f"{c.fail_rate * 100:.1f} %{' ✗' if miss else ''} ({c.by_interval * 100:.0f} % by CI)")
        lines.append(f"| {s:+g} % | {rate} | " + " | ".join(row) + f" | {at[(s, keys[0])].mean_requests:.1f} |")
    lines += ["", f"Rate: share of trials that FAIL the percentile. \"by CI\": share decided by the interval alone, "
              f"the rest on the point estimate at the cap. ✗: misses the target (>= {TARGET_DETECTION * 100:g} % "
              f"detection at +{TARGET_SHIFT:g} %, <= {TARGET_FALSE_ALARM * 100:g} % false alarms at -{TARGET_SHIFT:g} %)."]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- live engine
def start_run(thresholds_path: str, profile_name: str, output: Path):
    from guard.measure.hardware import detect
    from guard.measure.fit import select_profile
    from guard.measure.single_run import GuardRun

    thresholds = load_thresholds(thresholds_path, require_decidable=False)  # a simulation studies any rule
    hw = detect()
    profile = select_profile(thresholds, profile_name, hw)
    return GuardRun(thresholds, profile, hw, output, progress=lambda m: print(f"[guard] {m}", flush=True),
                    rule=single_run_rule(profile))


def fresh_record(run, profile: Profile) -> None:
    """Point the run at a new record and profile (and the profile's stopping rule); the engine (run.llm) stays."""
    old = run.record
    run.profile = run.side.profile = profile
    run.rule = single_run_rule(profile)
    run.use_record(RunRecord(profile=old.profile, thresholds_path=old.thresholds_path, model=old.model,
                             environment=old.environment, started_at=old.started_at))


def record_pool(run, size: int) -> list[float]:
    run.warm_up()
    samples = run.measure(size)
    if len(samples) < size:
        raise SystemExit(f"{size - len(samples)} of {size} pool requests failed; see the progress lines above")
    return samples


@contextlib.contextmanager
def slowed_encoder(llm, seconds: float) -> Iterator[list[int]]:
    """Sleep ``seconds`` before every vision-encoder forward; yields a one-item call counter."""
    from guard.compat import model_modules

    modules = model_modules(llm, ENCODER_CLASS)
    if not modules:
        raise SystemExit(f"no {ENCODER_CLASS} module in the live model (renamed in vLLM's deepencoder2.py?)")
    calls = [0]
    for m in modules:
        original = m.forward

        def slow(*args, _original=original, **kwargs):
            calls[0] += 1
            if seconds:
                time.sleep(seconds)
            return _original(*args, **kwargs)

        m.forward = slow  # an instance attribute shadows the class's forward; deleted on exit
    try:
        yield calls
    finally:
        for m in modules:
            m.__dict__.pop("forward", None)


def live_slowdown(run, delay_pct: float, margin_pct: float, clean_requests: int) -> list[str]:
    """Clean TTFT -> p50 budget just above it -> slowed encoder -> the real run stage and verdict."""
    from guard.judge.evaluate import evaluate

    base = dataclasses.replace(run.profile, ops=())  # TTFT only: the profile pass is not part of this
    with slowed_encoder(run.llm, 0.0) as calls:  # count encoder calls per request while warming up
        run.warm_up()
    per_request = max(1, calls[0] // max(1, base.workload.warmup_requests))
    fresh_record(run, base)
    clean = run.measure(clean_requests)
    clean_p50_ms = percentile(clean, 50) * 1000.0
    budget = clean_p50_ms * (1.0 + margin_pct / 100.0)
    delay_s = clean_p50_ms * delay_pct / 100.0 / 1000.0 / per_request
    slowed_profile = dataclasses.replace(base, ttft_ms={"p50": budget})
    fresh_record(run, slowed_profile)
    with slowed_encoder(run.llm, delay_s):
        run.time_until_decided()
    results = evaluate(slowed_profile, run.record)
    (c,) = results.ttft_checks
    caught = c.status == Status.FAIL
    return [
        "| clean p50 | budget | injected delay | slowed p50 | interval | samples | rounds | status | caught |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---|",
        f"| {clean_p50_ms:.0f} ms (n={len(clean)}) | {budget:.0f} ms (+{margin_pct:g} %) | "
        f"{delay_s * 1000 * per_request:.0f} ms/request ({per_request} encoder call(s), +{delay_pct:g} %) | "
        f"{fmt.ms_unit(c.measured_ms)} ({fmt.delta_pct(c.measured_ms, c.budget_ms)}) | {fmt.interval(c.interval_ms)} | "
        f"{c.samples} | {c.rounds} | "
        f"{c.status} | {'yes' if caught else 'NO'} |",
        *(["", f"note: {c.note}"] if c.note else []),
        *[f"\ninvalid: {r}" for r in results.invalid_reasons],
    ]


# ----------------------------------------------------------------------------- command line
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pool", type=Path, default=Path("benchmarks/ttft-pool-cpu.json"),
                   help="TTFT pool JSON; recorded with the live engine when missing (default: %(default)s)")
    p.add_argument("--pool-size", type=int, default=40, help="measured requests when recording the pool")
    p.add_argument("--thresholds", default="thresholds/deepseek-ocr-2.yaml")
    p.add_argument("--profile", default="cpu", help="profile whose workload, statistics and percentiles are simulated")
    p.add_argument("--trials", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shifts", default=",".join(f"{s:g}" for s in DEFAULT_SHIFTS),
                   help="true-vs-budget shifts in %%, each simulated above and below the budget")
    p.add_argument("--max-requests", type=int, default=None, help="override statistics.max_requests (what-if)")
    p.add_argument("--confidence", type=float, default=None, help="override statistics.confidence (what-if)")
    p.add_argument("--live-slowdown", action="store_true", help="also confirm one slowdown with the live engine")
    p.add_argument("--delay-pct", type=float, default=5.0, help="live: injected delay, %% of clean TTFT")
    p.add_argument("--margin-pct", type=float, default=0.5, help="live: p50 budget = clean p50 x (1 + margin)")
    p.add_argument("--clean-requests", type=int, default=15, help="live: clean requests behind the budget")
    p.add_argument("--output", type=Path, default=Path("guard-results/sensitivity"), help="engine output folder")
    return p.parse_args(argv)


def command_line(args: argparse.Namespace) -> str:
    """The exact command that reproduces the table (every setting spelled out)."""
    argv = ["python", "benchmarks/sensitivity.py", "--pool", str(args.pool), "--thresholds", args.thresholds,
            "--profile", args.profile, "--trials", str(args.trials), "--seed", str(args.seed), "--shifts", args.shifts]
    if args.max_requests is not None:
        argv += ["--max-requests", str(args.max_requests)]
    if args.confidence is not None:
        argv += ["--confidence", str(args.confidence)]
    if args.live_slowdown:
        argv += ["--live-slowdown", "--delay-pct", f"{args.delay_pct:g}", "--margin-pct", f"{args.margin_pct:g}",
                 "--clean-requests", str(args.clean_requests)]
    return shlex.join(argv)


def simulated_profile(args: argparse.Namespace) -> Profile:
    profile = load_thresholds(args.thresholds, require_decidable=False).profile(args.profile)
    stats = profile.statistics
    if args.max_requests is not None:
        stats = dataclasses.replace(stats, max_requests=args.max_requests)
    if args.confidence is not None:
        stats = dataclasses.replace(stats, confidence=args.confidence)
    return dataclasses.replace(profile, statistics=stats)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    shifts = [float(s) for s in args.shifts.split(",") if s.strip()]
    profile = simulated_profile(args)
    run = None
    if args.pool.exists():
        pool = load_pool(args.pool)
        print(f"pool: {len(pool)} samples from {args.pool}", file=sys.stderr)
    else:
        print(f"pool: {args.pool} missing; recording {args.pool_size} requests with the live engine", file=sys.stderr)
        run = start_run(args.thresholds, args.profile, args.output)
        pool = record_pool(run, args.pool_size)
        write_pool(args.pool, pool, run.profile.name, run.record.environment.as_dict())
    cells = simulate(pool, profile, [s for x in shifts for s in (x, -x)], args.trials, args.seed)
    print("## Simulated sensitivity\n")
    print(render_table(cells, pool, profile, args.trials))
    if args.live_slowdown:
        run = run or start_run(args.thresholds, args.profile, args.output)
        print("\n## Live slowdown\n")
        print("\n".join(live_slowdown(run, args.delay_pct, args.margin_pct, args.clean_requests)))
    print(f"\nReproduce: `{command_line(args)}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
