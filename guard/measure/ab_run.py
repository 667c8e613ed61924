"""Two engine sides' run, A/B: ``ABRun``, its whole sequence ``run_ab``, and the baseline side's
op-count cache.

``ABRun`` is the run stage (guard.measure.run.RunStage) over two worker sides (candidate,
baseline) on one machine: both engines start at the same time, then measured blocks run in ABBA
order with the idle side stopped (``RunStage`` schedules them). While a budgeted percentile of the
paired ratio is undecided, more pairs are measured by the same loop as absolute budgets
(``ab.batch`` more, up to ``statistics.max_requests`` pairs; the rule:
guard.judge.sequential.ab_run_rule, passed in). The baseline side's profile pass is read from
guard.measure.opcache when this baseline environment was profiled before, and remembered there
when it was profiled in full.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from guard.config.budgets import Profile, Thresholds
from guard.errors import InvalidRunError
from guard.files import cache_root
from guard.measure import opcache
from guard.measure.hardware import Hardware, fingerprint
from guard.measure.run import RunStage
from guard.measure.side import EngineSide
from guard.measure.stopping import StoppingRule
from guard.model.environment import OpCountsCacheNote, WorkerReading
from guard.model.readings import size as size_key
from guard.model.records import BASELINE, CANDIDATE, SIDES, ABRecord, Measures, RunRecord


class ABRun(RunStage):
    """Two worker sides: the candidate in ``candidate_python`` (default guard's own interpreter;
    ``guard pr`` passes head's), the baseline in ``baseline_python``; ``sides``: others (tests).
    ``rule``: the timing pass's stopping rule (guard.judge.sequential.ab_run_rule of this profile)."""

    def __init__(self, thresholds: Thresholds, profile: Profile, hw: Hardware, output: Path, baseline_python: str,
                 progress: Callable[[str], None] = print, inject: str | None = None, fresh_baseline: bool = False,
                 candidate_python: str | None = None, sides: dict[str, EngineSide] | None = None,
                 rule: StoppingRule | None = None) -> None:
        from guard.measure.worker import WORKER_REPORTED, WorkerSide
        from guard.config.weights import hub_resolver, pin

        self.thresholds = thresholds
        # a moving engine.revision (main): both sides load, and the records name, the same commit
        profile = pin(profile, hub_resolver(download=False))
        now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        env = fingerprint(hw, profile)
        records = {side: RunRecord(profile=profile.name, thresholds_path=thresholds.recorded_path, model=thresholds.model,
                                   environment=copy.deepcopy(env), started_at=now,
                                   injected=inject if side == CANDIDATE else None) for side in SIDES}
        records[BASELINE].environment.update(dict.fromkeys((*WORKER_REPORTED, "git_commit")))
        self.record = ABRecord(candidate=records[CANDIDATE], baseline=records[BASELINE], baseline_python=baseline_python)
        pythons = {CANDIDATE: candidate_python or sys.executable, BASELINE: baseline_python}
        if sides is None:
            sides = {side: WorkerSide(side, pythons[side], output, thresholds=thresholds.path.resolve(), profile=profile,
                                      progress=lambda m, side=side: progress(f"{side:9} {m}"),
                                      inject=inject if side == CANDIDATE else None,
                                      gpu_memory_utilization=profile.ab.gpu_memory_utilization(side),
                                      cache_key=side == BASELINE and profile.has_op_count_pass)
                     for side in SIDES}
        super().__init__(profile, output, sides, records, progress=progress, checkpoints=False, rule=rule)
        self.order = self.record.order  # the record's own list: blocks append to it
        self.fresh_baseline = fresh_baseline

    # ------------------------------------------- the baseline's op-count cache (guard.measure.opcache)
    cache_key: str | None = None
    cache_covers: str = ""
    fresh_baseline: bool = False  # profile the baseline side even when its pass is cached

    cache_note: OpCountsCacheNote | None = None  # what the cache did for the baseline side, on its worker reading
    _entry: tuple[str | None, RunRecord | None] | None = None  # (key, the baseline's entry): read once a run

    def _cache_entry(self, key: str | None) -> RunRecord | None:
        if self._entry is None or self._entry[0] != key:
            self._entry = (key, opcache.load(cache_root(), key))
        return self._entry[1]

    def _cache_note(self, **fields: Any) -> None:
        self.cache_note = OpCountsCacheNote(key=self.cache_key, **fields)
        self._merge(BASELINE)

    def _cached_baseline_pass(self) -> RunRecord | None:
        """The baseline side's remembered pass, taken into its record; None: profile it now."""
        info = self.infos.get(BASELINE)
        if info is not None:
            self.cache_key, self.cache_covers = info.cache_key, info.cache_key_covers
        root = cache_root()
        if root is None or self.cache_key is None or self.fresh_baseline:
            why = ("GUARD_CACHE_DIR is empty" if root is None else "--fresh-baseline" if self.fresh_baseline
                   else "the baseline environment has no key: " + (self.cache_covers or "unknown"))
            self._cache_note(status="not used", reason=why)
            return None
        cached = self._cache_entry(self.cache_key)
        if cached is None or not self._complete_pass(cached):
            self._cache_note(status="miss")
            return None
        path = opcache.entry_path(root, self.cache_key)
        self._cache_note(status="hit", recorded_at=cached.started_at, path=str(path), covers=self.cache_covers)
        self.progress(f"{BASELINE:9} op counts{' and census' if self.profile.census else ''} from guard's cache: this "
                      f"baseline environment was profiled {cached.started_at} (key {self.cache_key}); "
                      "`--fresh-baseline` profiles it again")
        for size in self.profile.workload.profile_image_sizes:
            counts = [c for c in cached.op_counts if tuple(c.image_size) == tuple(size)]
            self._take_counts(BASELINE, size, counts, cached.census.get(size_key(size)))
        for mix, decode in cached.decode_census.items():
            self._take_decode(BASELINE, mix, decode)
        return cached

    def _complete_pass(self, rec: RunRecord) -> bool:
        """Every profiled size counted, every scope entered, the census of every size there."""
        for size in self.profile.workload.profile_image_sizes:
            counts = [c for c in rec.op_counts if tuple(c.image_size) == tuple(size)]
            if (self.profile.ops and not counts) or any(c.entries == 0 for c in counts):
                return False
            if self.profile.census is not None and size_key(size) not in rec.census:
                return False
        mixes = self.profile.workload.profile_mixes if self.profile.census is not None else ()
        return all(m.name in rec.decode_census for m in mixes)

    def _remember_baseline_pass(self) -> None:
        """Remember the baseline side's pass when it was measured in full and every scope was entered."""
        rec = self.records[BASELINE]
        if not self._complete_pass(rec):
            return  # an invalid pass is reported, never remembered
        profiled = [size_key(s) for s in self.profile.workload.profile_image_sizes]
        op_pass = RunRecord(profile=rec.profile, thresholds_path=rec.thresholds_path, model=rec.model,
                            environment=copy.deepcopy(rec.environment), measures=Measures.OPS,
                            op_counts=list(rec.op_counts), census={k: v for k, v in rec.census.items() if k in profiled},
                            census_s=rec.census_s, decode_census=dict(rec.decode_census),
                            started_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
        path = opcache.store(cache_root(), self.cache_key, op_pass)
        if path is not None:
            self._cache_note(status="stored", path=str(path))

    def _merge(self, name: str) -> None:
        super()._merge(name)
        if name == BASELINE and self.cache_note is not None:
            env = self.records[name].environment
            env.worker = dataclasses.replace(env.worker or WorkerReading(), op_counts_cache=self.cache_note)

    def _counts_from_cache(self) -> set[str]:
        return {BASELINE} if self._cached_baseline_pass() is not None else set()

    def _counted(self, names: set[str]) -> None:
        if BASELINE in names:
            self._remember_baseline_pass()

    @property
    def timed(self) -> bool:
        """Whether the run measures pairs of timed requests (else it only counts ops on both sides)."""
        p = self.profile
        return bool(p.ttft_vs_baseline_pct or p.tpot_vs_baseline_pct or p.latency_budgets)

    def _maybe_needless(self) -> set[str]:
        """The baseline's engine, when the run only counts ops and may find the baseline's pass cached."""
        usable = not self.fresh_baseline and cache_root() is not None
        return {BASELINE} if usable and not self.timed and self.profile.has_op_count_pass else set()

    def _needless(self, name: str) -> bool:
        """Whether the baseline's pass is cached: its worker says which environment it is without an
        engine (a start and a model load less)."""
        info = self.sides[name].environment_key()
        if info is None:
            return False
        self.infos[name] = info
        cached = self._cache_entry(info.cache_key)
        return cached is not None and self._complete_pass(cached)

    def finish(self) -> ABRecord:
        self.record.duration_s = self.finish_records()
        return self.record


def run_ab(run: ABRun) -> ABRecord:
    """The whole A/B run stage, measuring pairs until the run's rule
    (guard.judge.sequential.ab_run_rule of its profile) has decided. A side that fails makes the
    record invalid (its reason is kept), never raises past here: evaluation turns the record into
    the verdict. The workers end with it, even on an unexpected error or Ctrl-C."""
    with run:
        try:
            run.start()
            if run.timed:
                run.warm_up()
                run.time_until_decided()
            # an op-count pass warms each size it profiles, and only on the sides it profiles: a
            # baseline whose counts are cached sends no request at all
            if run.profile.has_op_count_pass:
                run.profile_ops()
        except InvalidRunError:
            pass  # recorded in run.record.candidate.invalid_reasons
        return run.finish()
