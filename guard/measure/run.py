"""The run stage, written once over ``guard.measure.side.EngineSide``: one engine side or two.

``RunStage`` holds what every run shares: job planning, warm-up, the timing pass until its budgets
are decided (``time_until_decided``: guard.measure.stopping's loop, by the verdict's own rule,
which whoever starts the run passes in), what the machine did meanwhile (contention, speed
reference, GPU state), the profile pass per side and checkpoints. Its two shapes live beside it:
- guard.measure.single_run: ``GuardRun``, one side (the in-process engine, a managed
  ``vllm serve``, or a running server) against absolute budgets, and ``run_side``, its whole
  sequence. Each measured round runs all its jobs at once, ``concurrency`` in flight.
- guard.measure.ab_run: ``ABRun`` / ``run_ab``, two worker sides (candidate, baseline) on one
  machine, and the baseline side's op-count cache. Both engines start at the same time; then
  every request runs on both sides in blocks of ``concurrency``, the same images on both sides;
  measured blocks in ABBA order (``block_order``, here because ``RunStage`` schedules the blocks;
  why: guard.judge.ab), the idle side's process stopped.

Only the engine starts overlap. Warm-ups and profiled requests take turns like measured ones:
run on both sides at once they take longer than one after the other, because two OpenMP teams
then share the same cores (measured: docs/campaigns/2026-11-30-ab-wall-time.md).

Progress goes to the ``progress`` callback: runs take minutes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from guard.config.budgets import Profile
from guard.errors import InvalidRunError
from guard.measure.contention import ContentionSampler
from guard.measure.side import EngineDied, EngineSide, Job, ProfileFiles, SideInfo, plan_jobs
from guard.measure.stopping import StoppingRule, sample_until_decided
from guard.model import format as fmt
from guard.model.environment import SpeedReference, busy
from guard.model.readings import DecodeCensus, size as size_key, total_calls
from guard.model.records import BASELINE, CANDIDATE, InvalidReason, ReasonKind, RequestOutcome, RunRecord, ScopeCounts
from guard.model.checks import pairs

TRACES_ON_FAILURE, TRACES_ALWAYS = "on-failure", "always"
UNFINISHED_PREFIX = "the run did not finish: the last checkpoint was written after"


def block_order(block: int) -> tuple[str, str]:
    """Which side runs block ``block`` (0-based, counted over the whole run) first: ABBA..."""
    return (CANDIDATE, BASELINE) if block % 2 == 0 else (BASELINE, CANDIDATE)


def blocks(indices: Sequence[int], size: int) -> list[list[int]]:
    """Job indices cut into blocks of ``size`` (the workload's concurrency)."""
    size = max(1, size)
    return [list(indices[i:i + size]) for i in range(0, len(indices), size)]


class RunStage:
    """The run stage over ``sides`` (name -> side, in their warm-up order), each recorded into
    ``records[name]``. The first side's record holds the run's own invalid reasons. ``rule``: when
    the timing pass has measured enough (guard.measure.stopping), the verdict's own rule, which the
    caller builds (guard.judge.sequential.single_run_rule, guard.judge.sequential.ab_run_rule); a
    run that only profiles needs none."""

    def __init__(self, profile: Profile, output: Path, sides: dict[str, EngineSide], records: dict[str, RunRecord],
                 progress: Callable[[str], None] = print, traces: str = TRACES_ON_FAILURE,
                 contention: ContentionSampler | None = None, checkpoints: bool = True,
                 rule: StoppingRule | None = None) -> None:
        self.profile, self.output, self.progress, self.traces = profile, output, progress, traces
        self.rule = rule
        self.sides, self.records = sides, records
        self.infos: dict[str, SideInfo] = {}  # what each side said when it started
        self.names = tuple(sides)
        self.paired = len(sides) > 1
        self.own = records[self.names[0]]  # the run's own reasons (evaluate_ab: "for either side")
        self.checkpoints = checkpoints  # run.json as it stands after each step (a plain check's child process)
        # what the rest of the machine does during the timing pass (guard.measure.contention): with two
        # sides, both workers are this process's children, so "other processes" excludes both engines
        self.contention = contention if contention is not None else ContentionSampler()
        self.settle_s = 0.0  # a pause between stopping the idle side and timing the other
        self.order: list[str] = []  # per measured block (two sides): the side that ran first
        self._started = False
        self._start_failed: str | None = None
        self._started_extra: set[int] = set()
        self._skipped: set[str] = set()  # run sides whose engine was not started (_needless)
        self._next_index = 0
        self._blocks = 0
        self._warm: dict[int, set[tuple[int, int]]] = {}  # id(side) -> image sizes it has run
        self._mixes_warm: set[int] = set()  # id(side) of each side that has run every request mix once
        self._label, self._total, self._done = "", 0, dict.fromkeys(self.names, 0)
        self._t0 = time.perf_counter()
        for name in self.names:
            self._merge(name)

    # -------------------------------------------------------------- sides
    def _merge(self, name: str) -> None:
        """What the side says about its environment, into its record, typed: a side keeps writing its
        own dict (a worker's stopped time when it stops), so this runs at its start and at the end."""
        self.records[name].environment.update(self.sides[name].environment)

    def _fail(self, exc: Exception) -> InvalidRunError:
        """``exc``'s reason, recorded as the run's; the InvalidRunError to raise for it."""
        reason = InvalidReason(ReasonKind.ENGINE, str(exc))
        if reason not in self.own.invalid_reasons:
            self.own.invalid_reasons.append(reason)
        return exc if isinstance(exc, InvalidRunError) else InvalidRunError(reason.text)

    def start(self) -> None:
        """Start every side, at the same time when there are two. The first side to fail ends the
        wait at once: the other is killed mid-start instead of finishing an engine start (25-55 s
        on the CPU default) that nothing will use, e.g. beside a baseline python without vllm."""
        if self._start_failed is not None:  # a later step of a run whose engine never started
            raise InvalidRunError(self._start_failed)
        if self._started:
            return
        self._started = True
        try:
            if not self.paired:
                self.infos[self.names[0]] = self.sides[self.names[0]].start()
                return
            e = self.profile.engine
            try:
                maybe = self._maybe_needless()
                for name, side in self.sides.items():  # spawned from this thread, which outlives the run
                    if name not in maybe:
                        side.launch()
                self._skipped = {name for name in maybe if self._needless(name)}  # while the others start
                needed = {name: side for name, side in self.sides.items() if name not in self._skipped}
                for name in maybe - self._skipped:
                    self.sides[name].launch()
                which = "both vLLM engines" if len(needed) > 1 else f"the {', '.join(needed)} side's vLLM engine alone"
                self.progress(f"starting {which}: {e.model} ({e.dtype}, load_format={e.load_format}) ...")
                with ThreadPoolExecutor(max_workers=len(needed)) as pool:
                    waits = {pool.submit(side.start): name for name, side in needed.items()}
                    try:
                        for done in as_completed(waits):
                            self.infos[waits[done]] = done.result()
                    except BaseException:  # before the pool waits: no thread may wait on an engine start
                        for side in self.sides.values():
                            side.kill()
                        raise
            except BaseException:  # a failed launch, or Ctrl-C
                for side in self.sides.values():
                    side.kill()
                raise
        except (InvalidRunError, EngineDied) as exc:
            err = self._fail(exc)
            self._start_failed = str(exc)
            if err is exc:
                raise
            raise err from exc
        finally:
            for name in self.names:
                self._merge(name)

    def _maybe_needless(self) -> set[str]:
        """Sides of a two-sided run whose engine the run may never use: each is asked (``_needless``)
        while the others start."""
        return set()

    def _needless(self, name: str) -> bool:
        return False

    def close(self) -> None:
        for side in self.sides.values():
            side.close()

    def __enter__(self) -> RunStage:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -------------------------------------------------------------- requests
    def _jobs(self, count: int, warmup: bool, sizes=None) -> list[Job]:
        jobs = plan_jobs(self.profile.workload, self._next_index, count, warmup, sizes)
        self._next_index += count
        return jobs

    def _report(self, name: str) -> Callable[[RequestOutcome], None]:
        prefix = f"{name:9} " if self.paired else ""

        def report(o: RequestOutcome) -> None:
            self._done[name] += 1
            where = f"{prefix}{self._label} {self._done[name]}/{self._total} [{fmt.size(o.image_size)}]"
            if o.success:
                eng = f", engine {fmt.seconds_as_ms(o.ttft_engine_s)}" if o.ttft_engine_s else ""
                tpot = f", TPOT {fmt.seconds_as_ms(o.tpot_s)} over {o.output_tokens} tokens" if o.tpot_s is not None else ""
                self.progress(f"{where} TTFT {fmt.seconds_as_ms(o.ttft_client_s)}{eng}{tpot}")
            else:
                self.progress(f"{where} FAILED: {o.error}")
        return report

    def _ensure_started(self, side: EngineSide) -> None:
        """Sides start at their first request: the run's own sides all together, a side that only
        profiles (server mode's in-process engine) on its own."""
        own = [name for name, s in self.sides.items() if s is side]
        if own:
            self.start()
        if own and own[0] in self._skipped:  # its engine was thought needless (its cache entry went since)
            self._skipped.discard(own[0])
            self.infos[own[0]] = self._start_alone(side)
            self._merge(own[0])
        elif not own and id(side) not in self._started_extra:
            self._started_extra.add(id(side))
            self._start_alone(side)

    def _start_alone(self, side: EngineSide) -> SideInfo:
        try:
            return side.start()
        except (InvalidRunError, EngineDied) as exc:
            err = self._fail(exc)
            if err is exc:
                raise
            raise err from exc

    def _run(self, name: str, jobs: list[Job], side: EngineSide | None = None) -> list[RequestOutcome]:
        """``jobs`` on one side (``side``: the one its profile pass runs on), into its record."""
        side = side or self.sides[name]
        self._ensure_started(side)
        try:
            outcomes = side.run(jobs, self._label, self._report(name))
        except EngineDied as exc:
            raise self._fail(exc) from exc
        self.records[name].outcomes.extend(outcomes)
        self._merge(name)
        self._warm.setdefault(id(side), set()).update(o.image_size for o in outcomes)
        failed = sum(not o.success for o in outcomes)
        why = side.failed_requests_context(self._label, failed) if failed else None
        if why:  # the side's log says why (5xx, engine errors)
            self.own.invalid_reasons.append(InvalidReason(ReasonKind.REQUEST_FAILED, why))
        if self.checkpoints:
            self.checkpoint(self._label)
        return outcomes

    def _pass(self, jobs: list[Job], label: str, timed: bool, names: tuple[str, ...] | None = None,
              op_count_sides: dict[str, EngineSide] | None = None) -> None:
        """``jobs`` on every side in ``names``. One side: all at once. Two: block by block, each block
        on both sides back to back; ``timed``: in ABBA order with the idle side stopped."""
        names = names or self.names
        self._label, self._total, self._done = label, len(jobs), dict.fromkeys(self.names, 0)
        sides = op_count_sides or {}
        if not self.paired:
            self._run(names[0], jobs, sides.get(names[0]))
            return
        for block in blocks([j.index for j in jobs], self.profile.workload.concurrency):
            block_jobs = [j for j in jobs if j.index in set(block)]
            order = block_order(self._blocks) if timed else names
            if timed:
                self.order.append(order[0])
                self._blocks += 1
            for name in order:
                idle = [self.sides[n] for n in self.names if n != name] if timed else []
                with self._paused(idle):
                    self._run(name, block_jobs, sides.get(name))

    @contextlib.contextmanager
    def _paused(self, idle: list[EngineSide]):
        """The idle sides stopped while the other's requests run, ``settle_s`` after they were."""
        for side in idle:
            side.pause()
        try:
            if idle and self.settle_s:
                time.sleep(self.settle_s)
            yield
        finally:
            for side in idle:
                side.resume()

    def checkpoint(self, after: str) -> None:
        """Write run.json as it stands, marked unfinished: if this process is killed (SIGKILL, OOM),
        `guard check` still reports what was measured, as an invalid run. The session's final
        run.json replaces it."""
        from guard.model.jsonfiles import run_file_dict, write_json_atomic

        snapshot = dataclasses.replace(self.own, invalid_reasons=[*self.own.invalid_reasons,
                                                                    InvalidReason(ReasonKind.UNFINISHED, f"{UNFINISHED_PREFIX} {after}")],
                                       duration_s=round(time.perf_counter() - self._t0, 3))
        try:
            write_json_atomic(self.output / "run.json", run_file_dict(snapshot))
        except OSError as exc:  # a full disk must not stop the measurement; the final write will report it
            self.progress(f"could not write the run.json checkpoint: {exc}")

    # -------------------------------------------------------------- timing pass
    def warm_up(self) -> None:
        n = self.profile.workload.warmup_requests
        if n:
            self._pass(self._jobs(n, warmup=True), "warm-up", timed=False)

    def measure(self, count: int) -> list:
        """One round of ``count`` measured requests on every side; its new samples (``samples``)."""
        before = len(self.samples())
        for rec in self.records.values():
            rec.rounds += 1
        self._pass(self._jobs(count, warmup=False), f"round {self.own.rounds}", timed=True)
        return self.samples()[before:]  # samples come in order: the new ones are last

    def ratios(self) -> list[float]:
        """Two sides: the paired ratios (candidate / baseline TTFT), in job-index order."""
        return [p.ratio for p in pairs(self.records[CANDIDATE].outcomes, self.records[BASELINE].outcomes)]

    def samples(self) -> list:
        """What the budgets judge: one side's timed requests (each a TTFT, and a TPOT and ITL gaps
        where it returned more tokens), or two sides' paired ratios."""
        if self.paired:
            return self.ratios()
        return [o for o in self.own.measured if o.success and o.ttft_client_s is not None]

    def time_until_decided(self) -> None:
        """The timing pass's measured rounds: the workload's measured requests, then more batches while
        a budgeted percentile's interval straddles its budget, by ``rule`` (the verdict's own, so the
        two agree; guard.measure.stopping.sample_until_decided asks it): TTFT against absolute budgets
        for one side, the paired ratio against ratio budgets for two. Around them, what the machine
        did meanwhile: contention, GPU state, the speed reference."""
        from guard.measure.hardware import GpuStateSampler, read_gpu_state  # this method's concern only

        given = self.rule
        if given is None:
            raise TypeError("the timing pass needs its stopping rule: pass rule= (guard.judge.sequential.single_run_rule, "
                            "guard.judge.sequential.ab_run_rule)")
        env = self.own.environment
        rule: StoppingRule | None = given

        def measure(count: int) -> list[float]:  # read from the records, whatever ran the round
            before = len(self.samples())
            self.measure(count)
            return self.samples()[before:]  # samples come in order: the new ones are last

        if self.paired:
            def say(pending: Sequence[Any], extra: int) -> None:
                self.progress(f"inconclusive after {len(self.ratios())} pairs: {given.describe(pending)}"
                              f"; measuring {extra} more pairs (cap {given.cap})")

            def keep_going() -> bool:  # contention is recorded and shown, never a gate here
                return all(o.success for rec in self.records.values() for o in rec.measured)
        else:
            # Budgets measured on another CPU are shown, not judged: more requests would decide nothing.
            if env.ttft_hardware_match is not None and not env.ttft_hardware_match.ok:
                rule = None
            limit = self.profile.validity.max_other_cpu_pct

            def say(pending: Sequence[Any], extra: int) -> None:
                self.progress(f"inconclusive after {len(self.own.measured)} requests: {given.describe(pending)}"
                              f"; measuring {extra} more (round {self.own.rounds + 1}, cap {given.cap})")

            def keep_going() -> bool:
                if not all(o.success for o in self.own.measured):
                    return False  # a failed request makes the run invalid: stop measuring
                so_far = self.contention.peek()
                # over the limit: the run is invalid already, and more requests on a busy machine would not fix it
                return busy(so_far, limit) is None

        gpu_state = env.gpu_state
        # NVML while the requests run (throttling shows under load, not on an idle GPU), on a GPU only
        sampler = GpuStateSampler() if gpu_state is not None else contextlib.nullcontext()
        reference = self.sides[self.names[0]]
        before = reference.speed_reading()
        self.contention.start()
        with sampler:
            sample_until_decided(rule, self.profile.workload.requests, measure, on_undecided=say, keep_going=keep_going)
        reading = self.contention.stop()
        env.cpu_contention = reading
        if reading:
            self.progress(f"CPU during measurement: {fmt.contention(reading, ab=self.paired)}")
        if gpu_state is not None:  # the end of the timing pass, while the engines hold the device
            pids = frozenset().union(*(side.process_ids() for side in self.sides.values()))
            end = read_gpu_state(own_pids=frozenset({os.getpid(), *pids})) if pids else read_gpu_state()
            env.gpu_state = dataclasses.replace(gpu_state, during=tuple(sampler.snapshots), end=end)
        speed = SpeedReference.of(before, reference.speed_reading())
        if speed is not None:
            env.speed_reference = speed
            self.progress(f"speed reference: {fmt.speed_reference(speed, self.profile.speed_reference_ms)}")

    # -------------------------------------------------------------- profile pass
    def profile_ops(self, label: str = "") -> list[ScopeCounts]:
        """One profiled request per profile image size on each side, in steady state, the same image
        on every side: op counts per scope and the census, into each side's record. Returns the
        first side's counts. A side whose engine shows no frames (a remote server) measures none."""
        from_cache = self._counts_from_cache() if self.profile.has_op_count_pass else set()
        profiled = {}
        for name in self.names:
            if name in from_cache:
                continue
            side = self.sides[name].op_count_side()
            if side is not None:
                profiled[name] = side
        found: list[ScopeCounts] = []
        if not profiled:
            return found  # e.g. a remote server: its op budgets are reported "not measured"
        for size in self.profile.workload.profile_image_sizes:
            cold = tuple(n for n, side in profiled.items() if size not in self._warm.get(id(side), ()))
            if cold:  # first request of a size fills its caches
                self._pass(self._jobs(1, warmup=True, sizes=[size]), f"profile warm-up {fmt.size(size)}",
                           timed=False, names=cold, op_count_sides=profiled)
            (job,) = self._jobs(1, warmup=True, sizes=[size])  # profiled requests are not TTFT samples
            for name, side in profiled.items():
                got = self._count_on(name, side, job, f"one {fmt.size(size)} request", label)
                self._take_counts(name, size, got.counts, got.census, census_s=got.census_s)
                if name == self.names[0]:
                    found.extend(got.counts)
            if self.checkpoints:
                self.checkpoint(f"profiling {fmt.size(size)}")
        self._profile_mixes(profiled, label)
        self._counted(set(profiled))
        return found

    def _count_on(self, name: str, side: EngineSide, job: Job, what: str, label: str):
        """One profiled request on one side, its outcomes, trace and census cost into the side's record."""
        prefix = f"{name:9} " if self.paired else ""
        self.progress(f"{prefix}profiling {what}{label and ' (' + label.strip('-') + ')'} ...")
        self._label, self._total, self._done[name] = "profiled", 1, 0
        files = None if self.paired else ProfileFiles(self.output, label, self.traces == TRACES_ALWAYS)
        self._ensure_started(side)
        try:
            got = side.count_ops(job, self._report(name), files)
        except EngineDied as exc:
            raise self._fail(exc) from exc
        rec = self.records[name]
        rec.outcomes.extend(got.outcomes)
        if got.trace is not None:
            rec.traces.append(got.trace)
        if got.census is not None or got.decode is not None:
            rec.census_s = round(rec.census_s + got.census_s, 3)
        return got

    def _profile_mixes(self, profiled: dict[str, EngineSide], label: str) -> None:
        """One profiled request per request mix on each side (workload.profile_mixes), after one
        unprofiled request of every mix (the first use of a sampling path sets it up): the census of
        its decode steps. Only with a census rule: the decode census is judged by it."""
        mixes = self.profile.workload.profile_mixes if self.profile.census is not None else ()
        if not mixes:
            return
        size = self.profile.workload.profile_image_sizes[0]  # a mix with an image sends this size
        warmup = [dataclasses.replace(j, mix=m) for j, m in zip(self._jobs(len(mixes), True, [size]), mixes)]
        cold = tuple(n for n, side in profiled.items() if id(side) not in self._mixes_warm)
        if cold:
            self._pass(warmup, "profile warm-up, request mixes", timed=False, names=cold, op_count_sides=profiled)
            self._mixes_warm.update(id(profiled[n]) for n in cold)
        for mix in mixes:
            job = dataclasses.replace(self._jobs(1, warmup=True, sizes=[size])[0], mix=mix)
            for name, side in profiled.items():
                got = self._count_on(name, side, job, f"the decode steps of mix {mix.name}", label)
                if got.decode is not None:
                    self._take_decode(name, mix.name, got.decode, got.census_s)
        if self.checkpoints:
            self.checkpoint("profiling the request mixes")

    def _take_decode(self, name: str, mix: str, decode: DecodeCensus, census_s: float | None = None) -> None:
        self.records[name].decode_census[mix] = decode
        if census_s is not None:
            prefix = f"{name:9} " if self.paired else ""
            calls = sum(total_calls(ops) for ops in decode.census.values())
            self.progress(f"{prefix}  decode census [{mix}]: {decode.steps} steps, {len(decode.census)} functions, "
                          f"{calls} op calls {decode.unit()} ({census_s:.2f} s)")

    def _counts_from_cache(self) -> set[str]:
        """The sides whose op counts a cache held, taken into their records; they are not profiled."""
        return set()

    def _counted(self, names: set[str]) -> None:
        """After the profile pass: ``names`` were profiled."""

    def _take_counts(self, name: str, size: tuple[int, int], counts: list[ScopeCounts], census: Any,
                     census_s: float | None = None) -> None:
        rec = self.records[name]
        prefix = f"{name:9} " if self.paired else ""
        rec.op_counts.extend(counts)
        if census is not None:
            rec.census[size_key(size)] = census
            if census_s is not None:
                calls = sum(total_calls(ops) for ops in census.values())
                roots = ", ".join(self.profile.census.roots) if self.profile.census else ""
                self.progress(f"{prefix}  census [{fmt.size(size)}]: {len(census)} functions under {roots}, "
                              f"{calls} op calls ({census_s:.2f} s)")
        for c in counts:
            ops = ", ".join(f"{op} {n}" for op, n in list(c.calls_by_op.items())[:4]) or "none"
            self.progress(f"{prefix}  scope {c.scope} [{fmt.size(size)}]: entered {c.entries}x, "
                          f"{fmt.calls(c.total_calls)} ({ops})")

    # -------------------------------------------------------------- finish
    def finish_records(self) -> float:
        """Close every side and stamp each side's record with the run's duration, which it returns."""
        self.close()
        duration = round(time.perf_counter() - self._t0, 3)
        for name in self.names:
            self._merge(name)
            self.records[name].duration_s = duration
        return duration
