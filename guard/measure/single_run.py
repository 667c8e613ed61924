"""One engine side's run: ``GuardRun`` and its whole sequence, ``run_side``.

``GuardRun`` is the run stage (guard.measure.run.RunStage) over one side, against absolute
budgets: the in-process engine, a managed ``vllm serve``, or a running server. ``run_side`` is its
whole sequence (``timing_pass``, ``profile_pass``, each with its completeness checks), whatever
started it: guard check's child process (guard.child), guard pr's own-environment side and, step by
step, the pytest suite (tests/perf). The timing pass stops by the rule its caller passes in
(guard.judge.sequential.single_run_rule).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path

from guard.config.budgets import Profile, Thresholds
from guard.errors import InvalidRunError
from guard.measure.contention import ContentionSampler
from guard.measure.hardware import Hardware, fingerprint
from guard.measure.run import TRACES_ON_FAILURE, RunStage
from guard.measure.side import EngineSide, Job
from guard.measure.stopping import StoppingRule
from guard.model import format as fmt
from guard.model.environment import Environment
from guard.model.records import InvalidReason, Measures, ReasonKind, RequestOutcome, RunRecord


class GuardRun(RunStage):
    """One side: ``side`` (tests: a scripted engine), by default the profile's engine mode's: the
    in-process vLLM engine, a managed ``vllm serve``, or with ``server_url`` a running server.
    Every side starts lazily, at its first request. ``environment``: the fingerprint to record; by
    default this machine's. ``rule``: the timing pass's stopping rule
    (guard.judge.sequential.single_run_rule of this profile); a run that only profiles needs none."""

    def __init__(self, thresholds: Thresholds, profile: Profile, hw: Hardware, output: Path,
                 progress: Callable[[str], None] = print, injected: str | None = None,
                 traces: str = TRACES_ON_FAILURE, side: EngineSide | None = None,
                 environment: Environment | None = None, server_url: str | None = None,
                 contention: ContentionSampler | None = None, rule: StoppingRule | None = None) -> None:
        self.thresholds = thresholds
        self.mode = "server" if server_url else profile.engine.mode
        if side is None and self.mode == "server":
            from guard.measure.server import ServerSide

            side = ServerSide(profile, output, progress, inject=injected, url=server_url)
        elif side is None:
            from guard.measure.inprocess import InProcessSide

            side = InProcessSide(profile, progress, inject=injected)
        self.record = RunRecord(
            profile=profile.name, thresholds_path=thresholds.recorded_path, model=thresholds.model,
            environment=fingerprint(hw, profile) if environment is None else environment, injected=injected,
            started_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        )
        self.record.environment.engine_mode = self.mode
        super().__init__(profile, output, {"": side}, {"": self.record}, progress=progress, traces=traces,
                         contention=contention, checkpoints=True, rule=rule)

    @property
    def side(self) -> EngineSide:
        return self.sides[""]

    @property
    def llm(self):
        """The in-process engine, started now if need be: for benchmarks that reach into the model."""
        self.start()
        return self.side.llm

    def run_jobs(self, jobs: list[Job], label: str) -> list[RequestOutcome]:
        """``jobs`` through the side, recorded and checkpointed: for benchmarks that time their own passes."""
        self._label, self._total, self._done = label, len(jobs), {"": 0}
        return self._run("", jobs)

    def use_record(self, record: RunRecord) -> None:
        """Record from now on into ``record`` (a benchmark's fresh pool on the same engine)."""
        self.record = self.own = self.records[""] = record

    def finish(self) -> RunRecord:
        self.finish_records()
        return self.record


def timing_pass(run: GuardRun) -> list[InvalidReason]:
    """Warm-up, then timing until decided; why its samples are incomplete (none: complete)."""
    run.warm_up()
    warm = [o for o in run.record.outcomes if o.warmup]
    if warm and not any(o.success for o in warm):  # a server that hangs would cost every round its timeout
        return [InvalidReason(ReasonKind.REQUEST_FAILED, f"every warm-up request failed, first: {warm[0].error}; "
                              "nothing was measured")]
    run.time_until_decided()
    record, want = run.record, run.profile.workload.requests
    failed = [o for o in record.measured if not o.success]
    samples = record.ttft_client_s()
    out = []
    if failed:
        out.append(InvalidReason(ReasonKind.REQUEST_FAILED, f"{len(failed)} request(s) failed, first: {failed[0].error}"))
    elif len(samples) < want or not all(s > 0 for s in samples):
        out.append(InvalidReason(ReasonKind.TOO_FEW_SAMPLES, f"the timing pass measured {len(samples)} of {want} TTFT samples"))
    return out


def profile_pass(run: GuardRun) -> list[InvalidReason]:
    """One profiled request per image size; why its counts prove nothing (none: they do)."""
    never = [f"{c.scope} [{fmt.size(c.image_size)}]" for c in run.profile_ops() if c.entries == 0]
    return [InvalidReason(ReasonKind.SCOPE_NEVER_ENTERED, "scope(s) never entered, counts would prove nothing: "
                          + ", ".join(never))] if never else []


def run_side(run: GuardRun, measures: Measures) -> RunRecord:
    """The run stage for one side, whatever started it (``guard check``'s child process, each side of
    ``guard pr``, the pytest suite): the timing pass when ``measures`` includes TTFT and the profile
    budgets it, the profile pass when it includes op counts and the profile has them, each pass's
    completeness as invalid reasons on the record. A run that stops (the engine died) says why
    there and never raises past here; Ctrl-C does, once the record is finished."""
    run.record.measures = measures
    try:
        with run:
            if measures.ttft and run.profile.latency_budgets:
                run.record.invalid_reasons.extend(timing_pass(run))
            if measures.ops and run.profile.has_op_count_pass:
                run.record.invalid_reasons.extend(profile_pass(run))
    except InvalidRunError:
        pass  # recorded in run.record.invalid_reasons
    return run.finish()
