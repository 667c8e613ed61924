"""The run stage in a child process: ``python -m guard.child SPEC.json``.

Every command that measures (``guard check``, ``guard selftest``, each side of ``guard pr``, each
revision of ``guard bisect``, A/B) starts this through guard.measure.harness, so that an engine
that crashes or is OOM-killed cannot take the verdict with it. It reads the run's spec
(guard.measure.harness.RunSpec) and runs what it names: one side (guard.measure.single_run.run_side;
the engine in this process, or in a worker when the side's interpreter holds only vLLM) leaving
``run.json`` (checkpoints during the run, the full record at the end), or two sides
(guard.measure.ab_run.run_ab, two workers) leaving ``ab-run.json``.

An edge, like a command: it builds the timing pass's stopping rule from the judge stage
(guard.judge.sequential) and hands it to the run stage, which never imports the judge.

Exit status: 0 the record was written (whatever it says), 2 interrupted (Ctrl-C / SIGINT; the
record was still written), 1 an unexpected error (traceback on stderr; the last checkpoint stays).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from guard.measure.harness import INTERRUPTED, RunSpec
from guard.model.jsonfiles import ab_run_file_dict, run_file_dict, write_json_atomic
from guard.model.records import ABRecord, InvalidReason, ReasonKind, RunRecord


def open_run(spec: RunSpec, progress: Callable[[str], None]):
    """The spec's run stage: budgets loaded, hardware matched, the sides chosen (they start lazily),
    the timing pass's stopping rule the profile's own (guard.judge.sequential). Two sides: an
    ``ABRun`` over two workers; one: a ``GuardRun`` over the profile's engine mode, or over a worker
    when the side's interpreter holds only vLLM."""
    from guard.config.loading import load_thresholds
    from guard.judge.sequential import ab_run_rule, single_run_rule
    from guard.measure.harness import profile_to_run
    from guard.measure.hardware import detect, fingerprint
    from guard.measure.single_run import GuardRun

    thresholds = load_thresholds(spec.thresholds)
    output = Path(spec.output)
    # the parent chose the profile by name; here it is checked again on the machine as torch sees it
    hw = detect()
    profile = profile_to_run(thresholds, spec.profile, hw, engine_mode=spec.engine_mode, server_url=spec.server_url)
    if spec.baseline is not None:
        from guard.measure.ab_run import ABRun

        return ABRun(thresholds, profile, hw, output, spec.baseline.path or sys.executable, progress, spec.inject,
                     spec.fresh_baseline, candidate_python=spec.side.path, rule=ab_run_rule(profile))
    side = environment = None
    if not spec.side.has_guard:
        from guard.measure.worker import WORKER_REPORTED, WorkerSide

        name = spec.side.name
        progress = (lambda m, say=progress: say(f"{name} {m}"))
        side = WorkerSide(name, spec.side.path, output, thresholds=thresholds.path.resolve(), profile=profile,
                          progress=progress, inject=spec.inject)
        environment = fingerprint(hw, profile)  # this machine's; the versions are the worker's to say
        environment.update(dict.fromkeys((*WORKER_REPORTED, "git_commit")))
    return GuardRun(thresholds, profile, hw, output, progress=progress, injected=spec.inject, traces=spec.traces,
                    side=side, environment=environment, server_url=spec.server_url, rule=single_run_rule(profile))


def say(message: str) -> None:
    print(f"[guard] {message}", flush=True)


def run_child(argv: list[str]):
    """The run, recorded into its file; (exit status, the finished run: still holding its engine)."""
    spec = RunSpec.read(Path(argv[0]))
    run = open_run(spec, say)
    code = 0
    problem = None
    if spec.imports:  # a revision's side: it imports, or nothing is measured (no second process asks)
        from guard.revisions.overlay import import_problem

        problem = import_problem(spec.imports, spec.vllm_under)
    if problem is not None:
        run.record.invalid_reasons.append(InvalidReason(ReasonKind.REVISION, problem))
        record = run.finish()
    else:
        try:
            record = _run_stage(run, spec)
        except KeyboardInterrupt:  # the parent's grace: finish the record, then stop
            record, code = run.finish(), INTERRUPTED
    file = run.output / spec.record_file
    write_json_atomic(file, ab_run_file_dict(record) if spec.is_ab else run_file_dict(record))
    return code, run


def _run_stage(run, spec: RunSpec) -> RunRecord | ABRecord:
    if spec.is_ab:
        from guard.measure.ab_run import run_ab

        return run_ab(run)
    from guard.measure.single_run import run_side

    return run_side(run, spec.measures)


def leave(code: int) -> None:
    """End the process once run.json is written and every side is closed (a managed server stopped):
    what a normal exit would add is freeing the loaded engine and tearing the interpreter down,
    ~3 s on the CPU default that nobody reads. An error raised by the run exits the usual way,
    with its traceback."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    status, finished = run_child(sys.argv[1:])  # held, not freed: the process ends with it
    leave(status)
