"""One harness for every measured run: the perf suite in a child pytest, and the record it leaves.

``guard check``, ``guard selftest``, each side of ``guard pr`` and each revision of ``guard bisect``
run the suite (tests/perf, one vLLM engine) through ``record_suite``; it records run.json, and the
command judges it. A child process keeps a crashing engine from taking the verdict with it: a suite
that dies without run.json is an invalid run, never a pass.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from guard.config.budgets import Profile, Thresholds
from guard.errors import InvalidRunError
from guard.measure.run import post_run_checks
from guard.model.environment import Environment
from guard.model.results import InvalidReason, ReasonKind, RunRecord, load_run

GRACE_S = 60.0  # how long an interrupted suite may take to write its run.json before it is killed
FORWARD_AFTER_S = 10.0  # a child still running this long after Ctrl-C did not get it: send it on


class Interrupted(InvalidRunError):
    """SIGTERM while the suite ran (Ctrl-C arrives as KeyboardInterrupt)."""

OPS_ONLY = "ops"  # run only the op-count pass (the self-test measures no TTFT)


def suite_dir() -> Path:
    """The perf suite: tests/perf in a checkout, guard/_suite in an installed wheel."""
    here = Path(__file__).resolve().parents[1]  # the guard package
    for candidate in (here.parent / "tests" / "perf", here / "_suite"):
        if (candidate / "pytest.ini").is_file():
            return candidate
    raise InvalidRunError("the perf suite (tests/perf) is missing from this guard installation")


def run_suite(profile_name: str, thresholds: Path, output: Path, *, inject: str | None = None,
              traces: str = "on-failure", only: str | None = None, engine_mode: str | None = None,
              server_url: str | None = None, python: str | None = None) -> tuple[int, str | None]:
    """The suite in a child pytest, which writes ``output/run.json`` (checkpoints during the run,
    the full record at the end). Returns (pytest's exit status, why it was interrupted or None).
    ``python``: the interpreter to run it with (default: guard's own; ``guard pr`` passes a
    revision's, guard.revisions.overlay), started in ``output`` so that no ``vllm/`` folder in the
    working directory can shadow the one it should import.

    A negative status is the signal that killed the child (``-9``: SIGKILL, e.g. the OOM killer).
    On Ctrl-C or SIGTERM the child gets the signal too and ``GRACE_S`` to write its run.json; a
    second Ctrl-C kills it. The engine is never left running behind guard."""
    suite = suite_dir()
    cmd = [python or sys.executable, "-m", "pytest", str(suite), "-c", str(suite / "pytest.ini"), "--rootdir", str(suite),
           "-q", "--guard-record-only", "--guard-profile", profile_name, "--guard-thresholds", str(thresholds),
           "--guard-output", str(output), "--guard-traces", traces]
    if only == OPS_ONLY:
        cmd += ["-k", "test_op_counts"]
    else:
        cmd += ["--benchmark-json", str(output / "benchmark.json")]
    if inject:
        cmd += ["--guard-inject", inject]
    if engine_mode:
        cmd += ["--guard-engine-mode", engine_mode]
    if server_url:
        cmd += ["--guard-server-url", server_url]

    def stop(signum, frame):
        raise Interrupted(f"guard received {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, stop)
    child = subprocess.Popen(cmd, cwd=output if python else None)
    try:
        try:
            return child.wait(), None
        except KeyboardInterrupt:  # a terminal's Ctrl-C reached the child as well, most likely
            why, forward_after = "interrupted (Ctrl-C)", FORWARD_AFTER_S
        except Interrupted as exc:  # SIGTERM was sent to guard alone
            why, forward_after = str(exc), 0.0
        print(f"guard: {why}; stopping the perf suite (up to {GRACE_S:.0f} s) ...", file=sys.stderr, flush=True)
        return _stop_child(child, forward_after), why
    finally:
        signal.signal(signal.SIGTERM, previous)
        if child.poll() is None:
            child.kill()
            child.wait()


def _stop_child(child: subprocess.Popen, forward_after: float) -> int:
    """Stop the child the way pytest stops cleanly, by SIGINT (it then writes its run.json). A
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


def read_record(run_file: Path, code: int, interrupted: str | None, fallback: RunRecord) -> RunRecord:
    """The child's run.json (final, or its last checkpoint) with why the run cannot be judged added;
    ``fallback`` (no measurements) when the child wrote none at all."""
    reasons: list[InvalidReason] = []
    if interrupted:
        reasons.append(InvalidReason(ReasonKind.INTERRUPTED, f"{interrupted}: the run was stopped before it finished"))
    if code < 0:
        reasons.append(InvalidReason(ReasonKind.CRASH, f"the perf suite process was killed by {_signal_name(code)} mid-run "
                                     "(the OOM killer, a timeout, or someone killed it)"))
    elif code not in (0, 1, 3) and not interrupted:  # pytest: 2 interrupted, 4 usage error, 5 no tests ran
        reasons.append(InvalidReason(ReasonKind.CRASH, f"the perf suite exited with pytest status {code}; see the output above"))
    if run_file.exists():
        record = load_run(run_file)
    else:
        record = fallback
        reasons.append(InvalidReason(ReasonKind.CRASH, f"the perf suite ended (exit {code}) without writing {run_file.name}: "
                                     "the engine or the suite crashed before its first checkpoint; see the output above"))
    record.invalid_reasons.extend(r for r in reasons if r not in record.invalid_reasons)
    return record


def empty_record(profile: Profile, thresholds: Thresholds, **fields) -> RunRecord:
    """A run record with no measurements: what a run that wrote none, or never started, leaves."""
    return RunRecord(profile=profile.name, thresholds_path=thresholds.recorded_path, model=thresholds.model,
                     environment=Environment(), **fields)


def record_suite(thresholds: Thresholds, profile: Profile, output: Path, *, inject: str | None = None,
                 python: str | None = None, **suite_options) -> RunRecord:
    """The suite in a child process (``run_suite``), and what it recorded, with why it cannot be
    judged added: a stop, a crash, a budget no op name can meet."""
    code, interrupted = run_suite(profile.name, thresholds.path.resolve(), output, inject=inject, python=python,
                                  **suite_options)
    record = read_record(output / "run.json", code, interrupted, empty_record(profile, thresholds, injected=inject))
    record.thresholds_path = thresholds.recorded_path  # as named from here; the child may run in another folder
    record.invalid_reasons.extend(r for r in post_run_checks(profile, record) if r not in record.invalid_reasons)
    return record
