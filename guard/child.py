"""The run stage in a child process: ``python -m guard.child SPEC.json``.

``guard check``, ``guard selftest``, each side of ``guard pr`` and each revision of ``guard bisect``
start this (guard.measure.harness), so that an engine that crashes or is OOM-killed cannot take the
verdict with it. It reads the run's spec (guard.measure.harness.RunSpec), runs one side
(guard.measure.single_run.run_side) and leaves ``run.json`` in the output folder: checkpoints during the
run, the full record at the end.

An edge, like a command: it builds the timing pass's stopping rule from the judge stage
(guard.judge.sequential.single_run_rule) and hands it to the run stage, which never imports the judge.

Exit status: 0 the record was written (whatever it says), 2 interrupted (Ctrl-C / SIGINT; the
record was still written), 1 an unexpected error (traceback on stderr; the last checkpoint stays).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from guard.measure.harness import INTERRUPTED, RunSpec
from guard.model.jsonfiles import run_file_dict, write_json_atomic
from guard.model.records import InvalidReason, ReasonKind, RunRecord


def open_run(spec: RunSpec, progress: Callable[[str], None]):
    """The spec's GuardRun: budgets loaded, hardware matched, the engine side chosen (it starts
    lazily), the timing pass's stopping rule the profile's own (guard.judge.sequential.single_run_rule)."""
    from guard.config.loading import load_thresholds
    from guard.judge.sequential import single_run_rule
    from guard.measure.harness import profile_to_run
    from guard.measure.hardware import detect
    from guard.measure.single_run import GuardRun

    thresholds = load_thresholds(spec.thresholds)
    # the parent chose the profile by name; here it is checked again on the machine as torch sees it
    hw = detect()
    profile = profile_to_run(thresholds, spec.profile, hw, engine_mode=spec.engine_mode, server_url=spec.server_url)
    return GuardRun(thresholds, profile, hw, Path(spec.output), progress=progress, injected=spec.inject,
                    traces=spec.traces, server_url=spec.server_url, rule=single_run_rule(profile))


def say(message: str) -> None:
    print(f"[guard] {message}", flush=True)


def run_child(argv: list[str]):
    """The run, recorded into run.json; (exit status, the finished run: still holding its engine)."""
    from guard.measure.single_run import run_side

    spec = RunSpec.read(Path(argv[0]))
    run = open_run(spec, say)
    code = 0
    problem = None
    if spec.imports:  # a revision's side: it imports, or nothing is measured (no second process asks)
        from guard.revisions.overlay import import_problem

        problem = import_problem(spec.imports, spec.vllm_under)
    if problem is not None:
        run.record.invalid_reasons.append(InvalidReason(ReasonKind.REVISION, problem))
        record: RunRecord = run.finish()
    else:
        try:
            record = run_side(run, spec.measures)
        except KeyboardInterrupt:  # the parent's grace: finish the record, then stop
            record, code = run.finish(), INTERRUPTED
    write_json_atomic(run.output / "run.json", run_file_dict(record))
    return code, run


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
