"""One harness for every measured run: the run stage in a child process, and the record it leaves.

Every command that measures says *what* to run in a ``RunSpec``: one side or two (A/B), each in
its interpreter (``SidePython``), which measures, which profile. How it runs is decided here and in
guard.child alone: ``python -m guard.child SPEC.json`` runs the run stage and leaves ``run.json``
(one side) or ``ab-run.json`` (two); the command judges that file. A child process keeps a
crashing engine from taking the verdict with it: a run that dies without its file is an invalid
run, never a pass.

How a side is hosted follows from its interpreter: one that holds guard runs the child itself, the
engine in-process; one that holds only vLLM (another environment, guard.revisions.installed) gets a
worker process (guard.measure.worker) driven by a child in guard's own interpreter; two sides
always get two workers, driven by one child (guard.measure.ab_run).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

from guard.config.budgets import Profile, Thresholds
from guard.config.weights import hub_resolver, pin
from guard.errors import InvalidRunError
from guard.files import clear_run_files
from guard.measure.fit import Machine, select_profile
from guard.measure.process import die_with_parent
from guard.model.environment import Environment
from guard.model.jsonfiles import load_ab_run, load_run, write_json_atomic
from guard.model.records import ABRecord, InvalidReason, Measures, ReasonKind, RunRecord

GRACE_S = 60.0  # how long an interrupted run may take to write its run.json before it is killed
FORWARD_AFTER_S = 10.0  # a child still running this long after Ctrl-C did not get it: send it on
SPEC_FILE = "run-spec.json"
RUN_FILE, AB_RUN_FILE = "run.json", "ab-run.json"  # what the child leaves: one side's record, two sides' records
CHILD = "guard.child"  # the child's module: an edge, which builds the stopping rule from guard.judge
R = TypeVar("R", RunRecord, ABRecord)
INTERRUPTED = 2  # the child's exit status when SIGINT stopped it (it still wrote run.json)


@dataclass(frozen=True)
class SidePython:
    """The interpreter whose vLLM a side runs: ``path`` (None: guard's own), and whether guard itself
    imports there (False: another environment's, with nothing of guard's installed but what the
    worker needs, guard.measure.worker)."""

    path: str | None = None
    has_guard: bool = True  # the child itself can run there, the engine in its own process
    name: str = "side"  # a worker's name in its progress lines and log file (guard pr: head, base)


@dataclass(frozen=True)
class RunSpec:
    """What one run is: everything the command decided, as the child reads it. ``baseline`` set: an
    A/B run, ``side`` the candidate; else one side."""

    profile: str
    thresholds: str  # absolute: the child may run in another folder
    output: str
    measures: Measures = Measures.BOTH
    inject: str | None = None
    traces: str = "on-failure"
    engine_mode: str | None = None
    server_url: str | None = None
    # a revision's side (guard pr, guard bisect): import these first, from ``vllm_under``, and stop
    # before the engine if they do not (guard.revisions.overlay.import_problem)
    imports: tuple[str, ...] = ()
    vllm_under: str | None = None
    side: SidePython = SidePython()
    baseline: SidePython | None = None
    fresh_baseline: bool = False  # A/B: profile the baseline even when its pass is cached

    @property
    def is_ab(self) -> bool:
        return self.baseline is not None

    @property
    def record_file(self) -> str:
        return AB_RUN_FILE if self.is_ab else RUN_FILE

    @property
    def child_python(self) -> str | None:
        """The interpreter the child runs in (None: guard's own): the side's, where it holds guard
        and the run has one side; guard's, which starts the workers, otherwise."""
        return self.side.path if not self.is_ab and self.side.has_guard else None

    def write(self, path: Path) -> None:
        write_json_atomic(path, {**asdict(self), "measures": str(self.measures), "imports": list(self.imports)})

    @classmethod
    def read(cls, path: Path) -> RunSpec:
        data = json.loads(path.read_text(encoding="utf-8"))
        baseline = data.get("baseline")
        return cls(**{**data, "measures": Measures(data["measures"]), "imports": tuple(data.get("imports") or ()),
                      "side": SidePython(**data.get("side") or {}),
                      "baseline": None if baseline is None else SidePython(**baseline)})


class Interrupted(InvalidRunError):
    """SIGTERM while the run stage ran (Ctrl-C arrives as KeyboardInterrupt)."""


def run_suite(spec: RunSpec) -> tuple[int, str | None]:
    """The run stage in a child process (guard.child), which writes the spec's record file in its
    output folder (one side: checkpoints during the run, the full record at the end). Returns (its
    exit status, why it was interrupted or None). A child in another interpreter than guard's
    starts in the output folder, so that no ``vllm/`` folder in the working directory can shadow
    the one it should import.

    A negative status is the signal that killed the child (``-9``: SIGKILL, e.g. the OOM killer).
    On Ctrl-C or SIGTERM the child gets SIGINT too and ``GRACE_S`` to write its record; a
    second Ctrl-C kills it. The engine is never left running behind guard."""
    output = Path(spec.output)
    spec_file = output / SPEC_FILE
    spec.write(spec_file)
    python = spec.child_python
    cmd = [python or sys.executable, "-m", CHILD, str(spec_file)]

    def stop(signum, frame):
        raise Interrupted(f"guard received {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, stop)
    # a guard killed outright (SIGKILL: no finally) takes its run with it: no engine, worker or
    # server is left measuring for nobody
    child = subprocess.Popen(cmd, cwd=output if python else None, preexec_fn=partial(die_with_parent, signal.SIGKILL))
    try:
        try:
            return child.wait(), None
        except KeyboardInterrupt:  # a terminal's Ctrl-C reached the child as well, most likely
            why, forward_after = "interrupted (Ctrl-C)", FORWARD_AFTER_S
        except Interrupted as exc:  # SIGTERM was sent to guard alone
            why, forward_after = str(exc), 0.0
        print(f"guard: {why}; stopping the run (up to {GRACE_S:.0f} s) ...", file=sys.stderr, flush=True)
        return _stop_child(child, forward_after), why
    finally:
        signal.signal(signal.SIGTERM, previous)
        if child.poll() is None:
            child.kill()
            child.wait()


def _stop_child(child: subprocess.Popen, forward_after: float) -> int:
    """Stop the child the way it stops cleanly, by SIGINT (it then writes its run.json). A
    terminal's Ctrl-C reaches the child by itself, so it is first given ``forward_after`` seconds
    undisturbed; a child still running then did not get it."""
    try:
        try:
            return child.wait(timeout=forward_after) if forward_after else child.wait(timeout=0.01)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGINT)
        return child.wait(timeout=GRACE_S)
    except (KeyboardInterrupt, Interrupted, subprocess.TimeoutExpired):
        child.kill()
        return child.wait()


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def stop_reasons(code: int, interrupted: str | None) -> list[InvalidReason]:
    """Why a child's run cannot be judged from how it ended: a stop, a signal, a failure."""
    reasons: list[InvalidReason] = []
    if interrupted:
        reasons.append(InvalidReason(ReasonKind.INTERRUPTED, f"{interrupted}: the run was stopped before it finished"))
    if code < 0:
        reasons.append(InvalidReason(ReasonKind.CRASH, f"the run stage process was killed by {_signal_name(code)} mid-run "
                                     "(the OOM killer, a timeout, or someone killed it)"))
    elif code == INTERRUPTED and not interrupted:
        reasons.append(InvalidReason(ReasonKind.INTERRUPTED, "the run stage process was interrupted (SIGINT) before it finished"))
    elif code not in (0, INTERRUPTED):
        reasons.append(InvalidReason(ReasonKind.CRASH, f"the run stage process failed with exit status {code}; see the output above"))
    return reasons


def _never_written(run_file: Path, code: int) -> InvalidReason:
    return InvalidReason(ReasonKind.CRASH, f"the run stage process ended (exit {code}) without writing {run_file.name}: "
                         "the engine or guard crashed before its first checkpoint; see the output above")


def _read_child_file(run_file: Path, code: int, interrupted: str | None, load: Callable[[Path], R],
                     fallback: R) -> tuple[R, list[InvalidReason]]:
    """The record the child left (``fallback`` where it left none) and why it cannot be judged."""
    reasons = stop_reasons(code, interrupted)
    if run_file.exists():
        return load(run_file), reasons
    return fallback, [*reasons, _never_written(run_file, code)]


def _add_reasons(record: RunRecord, reasons: list[InvalidReason]) -> None:
    record.invalid_reasons.extend(r for r in reasons if r not in record.invalid_reasons)


def read_record(run_file: Path, code: int, interrupted: str | None, fallback: RunRecord) -> RunRecord:
    """The child's run.json (final, or its last checkpoint) with why the run cannot be judged added;
    ``fallback`` (no measurements) when the child wrote none at all."""
    record, reasons = _read_child_file(run_file, code, interrupted, load_run, fallback)
    _add_reasons(record, reasons)
    return record


def read_ab_record(run_file: Path, code: int, interrupted: str | None, fallback: ABRecord) -> ABRecord:
    """The child's ab-run.json with why the run cannot be judged added to the candidate's record
    (where A/B evaluation reads a run's reasons); ``fallback`` when the child wrote none."""
    record, reasons = _read_child_file(run_file, code, interrupted, load_ab_run, fallback)
    _add_reasons(record.candidate, reasons)
    return record


def empty_record(profile: Profile, thresholds: Thresholds, **fields) -> RunRecord:
    """A run record with no measurements: what a run that wrote none, or never started, leaves."""
    return RunRecord(profile=profile.name, thresholds_path=thresholds.recorded_path, model=thresholds.model,
                     environment=Environment(), **fields)


def profile_to_run(thresholds: Thresholds, requested: str, machine: Machine, *, engine_mode: str | None,
                   server_url: str | None) -> Profile:
    """The profile a run measures, worked out the one way for the command that starts the run and
    the child that runs it: the profile that fits the machine, as it runs there
    (guard.measure.fit), in the engine mode asked for, its moving model revision pinned to the
    commit in the local cache (a remote server loaded whatever it loaded: nothing to pin)."""
    profile = select_profile(thresholds, requested, machine).with_engine_mode("server" if server_url else engine_mode)
    return profile if server_url else pin(profile, hub_resolver(download=False))


def _run_spec(thresholds: Thresholds, profile: Profile, output: Path, **spec_fields) -> RunSpec:
    return RunSpec(profile=profile.name, thresholds=str(thresholds.path.resolve()), output=str(output), **spec_fields)


def record_suite(thresholds: Thresholds, profile: Profile, output: Path, *, measures: Measures = Measures.BOTH,
                 inject: str | None = None, side: SidePython = SidePython(), **spec_fields) -> RunRecord:
    """One side's run stage in a child process (``run_suite``), and what it recorded, with why it
    cannot be judged added: a stop, a crash. What an earlier run left in ``output`` goes first."""
    clear_run_files(output)
    spec = _run_spec(thresholds, profile, output, measures=measures, inject=inject, side=side, **spec_fields)
    code, interrupted = run_suite(spec)
    record = read_record(output / spec.record_file, code, interrupted,
                         empty_record(profile, thresholds, injected=inject, measures=measures))
    record.thresholds_path = thresholds.recorded_path  # as named from here; the child may run in another folder
    return record


def record_ab(thresholds: Thresholds, profile: Profile, output: Path, *, baseline: SidePython,
              candidate: SidePython = SidePython(), inject: str | None = None, fresh_baseline: bool = False) -> ABRecord:
    """Two sides' run stage (A/B: ``candidate`` against ``baseline``, guard.measure.ab_run) in a child
    process, and what it recorded, with why it cannot be judged added."""
    clear_run_files(output)
    spec = _run_spec(thresholds, profile, output, inject=inject, side=candidate, baseline=baseline,
                     fresh_baseline=fresh_baseline)
    code, interrupted = run_suite(spec)
    fallback = ABRecord(candidate=empty_record(profile, thresholds, injected=inject),
                        baseline=empty_record(profile, thresholds), baseline_python=baseline.path or sys.executable)
    record = read_ab_record(output / spec.record_file, code, interrupted, fallback)
    for side in (record.candidate, record.baseline):
        side.thresholds_path = thresholds.recorded_path
    return record
