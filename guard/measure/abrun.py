"""A/B run stage: two engine workers (candidate, baseline) on one machine, measured in alternation.

Both engines start at the same time (each in its own worker process, guard/measure/worker.py), both are
warmed up on the same warm-up images, then measured requests run in blocks, each block on both
sides back to back in ABBA order (guard.ab.block_order), the same images on both sides, with the
idle side's process stopped (``WorkerClient.paused``). While a budgeted percentile of the paired
ratio is undecided, more pairs are measured by the same rule as absolute budgets (``ab.batch``
more, default ``statistics.batch``, up to ``statistics.max_requests`` pairs). Then the op-count
pass profiles one request per ``profile_image_sizes`` on each side, which also counts each
side's operator census (guard.census) when the profile has a census rule; the baseline side's
pass is read from guard.abcache instead when this baseline environment was profiled before.

Only the engine starts overlap. Warm-ups and profiled requests take turns like measured ones:
run on both sides at once they took longer than one after the other (two OpenMP teams on two
cores: a 640x480 warm-up pair 15.2 s instead of 13.4 s, an 800x400 pair 32.6 s instead of
25.4-29.0 s, measured here; docs/ab.md, "Wall time").

Everything is recorded in an ``ABRecord``: one ``RunRecord`` per side, plus the order.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guard import abcache
from guard import format as fmt
from guard.ab import BASELINE, CANDIDATE, SIDES, RatioDecision, block_order, blocks, pairs, undecided_ratios
from guard.budgets import Profile, Thresholds
from guard.census import size_key
from guard.contention import ContentionSampler
from guard.measure.inprocess import Job, plan_jobs
from guard.errors import InvalidRunError
from guard.files import cache_root
from guard.rules import measure_until_decided
from guard.hardware import Hardware, fingerprint
from guard.results import OpSite, RequestOutcome, RunRecord, ScopeCounts
from guard.measure.worker import WorkerClient, WorkerDied, WorkerError


# What a worker reports about its own environment (guard.measure.worker.versions). guard's fingerprint
# describes guard's environment, which is the candidate's; on the baseline side these stay unknown
# until its worker has said, so that a baseline that never started shows no borrowed versions.
WORKER_REPORTED = ("python", "vllm", "vllm_dist", "torch", "transformers", "cuda_runtime")


def baseline_hint(python: str) -> str:
    return (f"{python} is the baseline environment's python: it needs vllm, torch, pyyaml, pillow and numpy "
            "(not guard, which comes from this checkout); docs/ab.md")


@dataclass
class ABRecord:
    """What the A/B run stage hands to evaluation."""

    candidate: RunRecord
    baseline: RunRecord
    baseline_python: str
    order: list[str] = field(default_factory=list)  # per measured block: the side that ran first
    duration_s: float | None = None

    def side(self, name: str) -> RunRecord:
        return self.candidate if name == CANDIDATE else self.baseline


def _outcome(msg: dict[str, Any]) -> RequestOutcome:
    fields = {k: v for k, v in msg.items() if k != "type"}
    fields["image_size"] = tuple(fields["image_size"])
    return RequestOutcome(**fields)


def _counts(d: dict[str, Any]) -> ScopeCounts:
    return ScopeCounts(**{**d, "image_size": tuple(d["image_size"]), "sites": tuple(OpSite(**s) for s in d.get("sites", ()))})


class ABRun:
    def __init__(self, thresholds: Thresholds, profile: Profile, hw: Hardware, output: Path, baseline_python: str,
                 progress: Callable[[str], None] = print, inject: str | None = None, fresh_baseline: bool = False,
                 candidate_python: str | None = None) -> None:
        self.thresholds, self.profile, self.output = thresholds, profile, output
        self.progress = progress
        self.inject = inject
        self.fresh_baseline = fresh_baseline  # profile the baseline side even when its pass is cached
        self._cache_key: str | None = None
        self._cache_covers = ""
        from guard.weights import hub_resolver, pin

        # a moving engine.revision (main): both sides load, and the records name, the same commit
        self.profile = profile = pin(profile, hub_resolver(download=False))
        now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        env = fingerprint(hw, profile)
        records = {side: RunRecord(profile=profile.name, thresholds_path=str(thresholds.path), model=thresholds.model,
                                   environment=copy.deepcopy(env), started_at=now,
                                   injected=inject if side == CANDIDATE else None) for side in SIDES}
        records[BASELINE].environment.update(dict.fromkeys((*WORKER_REPORTED, "git_commit")))
        self.record = ABRecord(candidate=records[CANDIDATE], baseline=records[BASELINE], baseline_python=baseline_python)
        self.pythons = {CANDIDATE: candidate_python or sys.executable, BASELINE: baseline_python}
        self.workers: dict[str, WorkerClient] = {}
        self._buffer: dict[str, list[RequestOutcome]] = {s: [] for s in SIDES}
        self._label = ""
        self._done = {s: 0 for s in SIDES}
        self._total = 0
        self._next_index = 0
        self._blocks = 0
        self._warm_sizes: set[tuple[int, int]] = set()
        self.settle_s = 0.0  # a pause between stopping one side and timing the other
        self.contention = ContentionSampler()  # this process's tree: guard and both workers
        self._t0 = time.perf_counter()

    # -------------------------------------------------------------- workers
    def _on_message(self, side: str, msg: dict[str, Any]) -> None:
        if msg.get("type") == "outcome":
            o = _outcome(msg)
            self._buffer[side].append(o)
            self._done[side] += 1
            size = f"{o.image_size[0]}x{o.image_size[1]}"
            what = f"TTFT {o.ttft_client_s * 1000:.0f} ms" if o.success else f"FAILED: {o.error}"
            self.progress(f"{side:9} {self._label} {self._done[side]}/{self._total} [{size}] {what}")
        elif msg.get("type") == "progress":
            self.progress(f"{side:9} {msg.get('message', '')}")

    def _fail(self, exc: Exception) -> InvalidRunError:
        reason = str(exc)
        self.record.candidate.invalid_reasons.append(reason)  # the run's own reasons (results.run)
        return InvalidRunError(reason)

    def start(self) -> None:
        """Spawn both workers, start both engines concurrently, wait for both."""
        try:
            for side in SIDES:
                self.workers[side] = WorkerClient(side, self.pythons[side], self.output / f"worker-{side}.log",
                                                  cwd=self.output, on_message=self._on_message)
                self.progress(f"{side:9} worker {self.workers[side].hello.pid}: {self.pythons[side]} "
                              f"(guard from {self.workers[side].hello.guard_file})")
            e = self.profile.engine
            self.progress(f"starting both vLLM engines: {e.model} ({e.dtype}, load_format={e.load_format}) ...")
            for side in SIDES:
                self.workers[side].send("start", thresholds=str(self.thresholds.path.resolve()), profile=self.profile.name,
                                        seed=self.profile.workload.seed,
                                        gpu_memory_utilization=self.profile.ab.gpu_memory_utilization(side),
                                        inject=self.inject if side == CANDIDATE else None,
                                        cache_key=side == BASELINE and self.profile.has_op_count_pass,
                                        dtype=self.profile.engine.dtype,
                                        revision=self.profile.engine.revision)
            self._wait_until_both_ready()
        except WorkerError as exc:
            never_said_hello = BASELINE not in self.workers
            if exc.side == BASELINE and (never_said_hello or not isinstance(exc, WorkerDied)) \
                    and "worker" not in self.record.baseline.environment:
                exc.hint = baseline_hint(self.pythons[BASELINE])  # the worker's own hint is about guard's environment
            raise self._fail(exc) from exc

    def _wait_until_both_ready(self) -> None:
        """Both engines' "ready", in whichever order they come. The first side to fail ends the
        wait at once: the other worker is killed mid-start instead of finishing an engine start
        (25-55 s on the CPU default) that nothing will use, e.g. beside a baseline python without
        vllm."""
        with ThreadPoolExecutor(max_workers=len(SIDES)) as pool:
            waits = {pool.submit(self.workers[side].wait, "ready"): side for side in SIDES}
            try:
                for done in as_completed(waits):
                    self._on_ready(waits[done], done.result())
            except BaseException:  # a failed side, or Ctrl-C: no thread may wait on an engine start
                for w in self.workers.values():
                    w.kill()
                raise

    def _on_ready(self, side: str, ready: dict[str, Any]) -> None:
        env = self.record.side(side).environment
        versions = ready["versions"]
        env["worker"] = {**versions, "guard_file": self.workers[side].hello.guard_file, "init_s": round(ready["init_s"], 3)}
        env.update({key: versions[key] for key in WORKER_REPORTED if key in versions})
        if side == BASELINE:
            self._cache_key, self._cache_covers = ready.get("cache_key"), ready.get("cache_key_covers") or ""
        self.progress(f"{side:9} engine ready in {ready['init_s']:.1f} s: vllm {versions.get('vllm')} "
                      f"({versions.get('vllm_file')})")

    def close(self) -> None:
        for w in self.workers.values():
            w.close()

    def __enter__(self) -> ABRun:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -------------------------------------------------------------- requests
    def _jobs(self, count: int, warmup: bool, sizes=None) -> list[Job]:
        jobs = plan_jobs(self.profile.workload, self._next_index, count, warmup, sizes)
        self._next_index += count
        return jobs

    def _run_side(self, side: str, jobs: list[Job]) -> list[RequestOutcome]:
        self._buffer[side] = []
        try:
            done = self.workers[side].call("run", "done", jobs=[[j.index, list(j.image_size), j.warmup] for j in jobs])
        except WorkerError as exc:
            raise self._fail(exc) from exc
        if side == CANDIDATE and self.inject and not all(j.warmup for j in jobs):
            # the test hook's own account of what it added (worker total, seconds): the true injected slowdown
            env = self.record.candidate.environment
            env["injected_sleep_s"] = round(float(done.get("slept_s", 0.0)), 4)
        outcomes, self._buffer[side] = self._buffer[side], []
        self.record.side(side).outcomes.extend(outcomes)
        return outcomes

    def _run_timed(self, side: str, jobs: list[Job]) -> list[RequestOutcome]:
        """The other side's process is stopped while these requests run, ``settle_s`` after it was."""
        other = self.workers[BASELINE if side == CANDIDATE else CANDIDATE]
        with other.paused():
            if self.settle_s:
                time.sleep(self.settle_s)
            return self._run_side(side, jobs)

    def _run_pairwise(self, jobs: list[Job], label: str, alternate: bool, sides: tuple[str, ...] = SIDES) -> None:
        """Each block of jobs on both sides, back to back; ``alternate``: ABBA order, timed, the
        idle side stopped (measured blocks), else ``sides`` in that order (warm-ups)."""
        self._label, self._total = label, len(jobs)
        self._done = {s: 0 for s in SIDES}
        for block in blocks([j.index for j in jobs], self.profile.workload.concurrency):
            block_jobs = [j for j in jobs if j.index in set(block)]
            order = block_order(self._blocks) if alternate else sides
            if alternate:
                self.record.order.append(order[0])
                self._blocks += 1
            run = self._run_timed if alternate else self._run_side  # timed blocks stop the idle side
            for side in order:
                run(side, block_jobs)
        for j in jobs:
            self._warm_sizes.add(j.image_size)

    def warm_up(self) -> None:
        n = self.profile.workload.warmup_requests
        if n:
            self._run_pairwise(self._jobs(n, warmup=True), "warm-up", alternate=False)

    def measure(self, count: int) -> None:
        for side in SIDES:
            self.record.side(side).rounds += 1
        self._run_pairwise(self._jobs(count, warmup=False), f"round {self.record.candidate.rounds}", alternate=True)

    def ratios(self) -> list[float]:
        return [p.ratio for p in pairs(self.record.candidate.outcomes, self.record.baseline.outcomes)]

    def measure_until_decided(self) -> None:
        """guard.rules' sequential rule, with the paired ratios as samples and the ratio budgets."""
        stats, budgets = self.profile.ab_statistics, self.profile.ttft_vs_baseline_pct

        def measure(count: int) -> list[float]:
            before = len(self.ratios())
            self.measure(count)
            return self.ratios()[before:]  # pairs come in job-index order: the new ones are last

        def say(pending: list[RatioDecision], extra: int) -> None:
            self.progress(f"inconclusive after {len(self.ratios())} pairs: "
                          + "; ".join(f"{d.key} interval [{d.interval_pct[0]:+.1f}, {d.interval_pct[1]:+.1f}] % "
                                      f"vs budget +{d.budget_pct:g} %" for d in pending)
                          + f"; measuring {extra} more pairs (cap {stats.max_requests})")

        # What the rest of the machine did meanwhile: recorded and shown, never a gate here. Both
        # workers are this process's children, so "other processes" excludes both engines.
        self.contention.start()
        measure_until_decided(budgets, stats, self.profile.workload.requests, measure, on_undecided=say,
                              keep_going=lambda: all(o.success for s in SIDES for o in self.record.side(s).measured),
                              undecided_in=lambda ratios: undecided_ratios(budgets, ratios, stats))
        reading = self.contention.stop()
        self.record.candidate.environment["cpu_contention"] = reading.as_dict() if reading else None
        if reading:
            self.progress(f"CPU during measurement: {fmt.contention(reading, ab=True)}")
        gpu_state = self.record.candidate.environment.get("gpu_state")
        if gpu_state is not None:  # the end of the timing pass, while both engines hold the device
            from guard.hardware import read_gpu_state

            own = frozenset({os.getpid(), *(w.proc.pid for w in self.workers.values())})
            gpu_state["end"] = read_gpu_state(own_pids=own)

    def profile_ops(self) -> None:
        """One profiled request per profile image size on each side: the same image for both. The
        baseline side's counts come from guard.abcache when this baseline environment was profiled
        before (and are remembered when it was not)."""
        cached = self._cached_baseline_pass()
        sides = (CANDIDATE,) if cached is not None else SIDES
        for size in self.profile.workload.profile_image_sizes:
            if size not in self._warm_sizes:
                self._run_pairwise(self._jobs(1, warmup=True, sizes=[size]), f"profile warm-up {size[0]}x{size[1]}",
                                   alternate=False, sides=sides)
            (job,) = self._jobs(1, warmup=True, sizes=[size])
            for side in sides:
                self.progress(f"{side:9} profiling one {size[0]}x{size[1]} request ...")
                self._label, self._total, self._done[side] = "profiled", 1, 0
                self._buffer[side] = []
                try:
                    msg = self.workers[side].call("profile", "counts", size=list(size), index=job.index)
                except WorkerError as exc:
                    raise self._fail(exc) from exc
                rec = self.record.side(side)
                rec.outcomes.extend(self._buffer[side])
                self._buffer[side] = []
                self._take_counts(side, size, msg["counts"], msg.get("census"))
        if cached is None:
            self._remember_baseline_pass()

    def _take_counts(self, side: str, size: tuple[int, int], counts_msg: list[dict[str, Any]], census: Any) -> None:
        rec = self.record.side(side)
        counts = [_counts(c) for c in counts_msg]
        rec.op_counts.extend(counts)
        if census is not None:
            rec.census[size_key(size)] = census
        for c in counts:
            ops = ", ".join(f"{op} {n}" for op, n in list(c.calls_by_op.items())[:4]) or "none"
            self.progress(f"{side:9}   scope {c.scope} [{size[0]}x{size[1]}]: entered {c.entries}x, "
                          f"{c.total_calls} op calls ({ops})")

    def _cache_note(self, **fields: Any) -> None:
        self.record.baseline.environment.setdefault("worker", {})["op_counts_cache"] = {"key": self._cache_key, **fields}

    def _cached_baseline_pass(self) -> abcache.CachedPass | None:
        """The baseline side's remembered pass, taken into its record; None: profile it now."""
        root = cache_root()
        if root is None or self._cache_key is None or self.fresh_baseline:
            why = ("GUARD_CACHE_DIR is empty" if root is None else "--fresh-baseline" if self.fresh_baseline
                   else "the baseline environment has no key: " + (self._cache_covers or "unknown"))
            self._cache_note(status="not used", reason=why)
            return None
        cached = abcache.load(root, self._cache_key)
        sizes = [size_key(s) for s in self.profile.workload.profile_image_sizes]
        if cached is None or not all(k in cached.sizes for k in sizes):
            self._cache_note(status="miss")
            return None
        self._cache_note(status="hit", recorded_at=cached.recorded_at, path=str(cached.path), covers=self._cache_covers)
        self.progress(f"{BASELINE:9} op counts{' and census' if self.profile.census else ''} from guard's cache: this "
                      f"baseline environment was profiled {cached.recorded_at} (key {self._cache_key}); "
                      "`--fresh-baseline` profiles it again")
        for size, key in zip(self.profile.workload.profile_image_sizes, sizes):
            self._take_counts(BASELINE, size, cached.sizes[key]["counts"], cached.sizes[key]["census"])
        return cached

    def _remember_baseline_pass(self) -> None:
        """Remember the baseline side's pass when it was measured in full and every scope was entered."""
        rec = self.record.baseline
        sizes = {}
        for size in self.profile.workload.profile_image_sizes:
            key = size_key(size)
            counts = [c for c in rec.op_counts if tuple(c.image_size) == tuple(size)]
            if any(c.entries == 0 for c in counts) or (self.profile.census is not None and key not in rec.census):
                return  # an invalid pass is reported, never remembered
            sizes[key] = {"counts": [dataclasses.asdict(c) for c in counts], "census": rec.census.get(key)}
        path = abcache.store(cache_root(), self._cache_key, sizes, covers=self._cache_covers)
        if path is not None:
            self._cache_note(status="stored", path=str(path))

    def finish(self) -> ABRecord:
        duration = round(time.perf_counter() - self._t0, 3)
        self.record.duration_s = duration
        for side in SIDES:
            self.record.side(side).duration_s = duration
            if side in self.workers:  # evidence that the idle side was stopped while the other was timed
                self.record.side(side).environment.setdefault("worker", {})["stopped_s"] = round(self.workers[side].stopped_s, 3)
        return self.record


def run_ab(thresholds: Thresholds, profile: Profile, hw: Hardware, output: Path, baseline_python: str,
           progress: Callable[[str], None] = print, inject: str | None = None, fresh_baseline: bool = False,
           candidate_python: str | None = None) -> ABRecord:
    """The whole A/B run stage. A worker that fails makes the record invalid (its reason is kept),
    never raises past here: evaluation turns the record into the verdict. ``candidate_python``:
    the candidate side's interpreter (default guard's own; ``guard pr`` passes head's)."""
    with ABRun(thresholds, profile, hw, output, baseline_python, progress, inject, fresh_baseline,
               candidate_python) as run:
        try:
            run.start()
            run.warm_up()
            if profile.ttft_vs_baseline_pct or profile.ttft_ms:
                run.measure_until_decided()
            if profile.has_op_count_pass:
                run.profile_ops()
        except InvalidRunError:
            pass  # recorded in run.record.candidate.invalid_reasons
        return run.finish()
