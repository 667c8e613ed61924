"""Run the perf suite on this machine and judge it against the budgets.

Stages: budgets (validated here, before a minute is spent) -> run (the pytest suite in a child
process, one vLLM engine, writes run.json) -> verdict (guard.evaluate) -> report (terminal,
results.json, report.md). A child process keeps a crashing engine from taking the verdict with it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from guard import __version__
from guard.budgets import DEFAULT_THRESHOLDS, load_thresholds
from guard.canary import LEGACY_MASK
from guard.errors import InvalidRunError, UsageError
from guard.evaluate import evaluate
from guard.hardware import detect, select_profile
from guard.opnames import check_op_names, vacuous_budgets
from guard.markdown import render_markdown
from guard.results import RUN_SCHEMA, RunRecord, read_json, results_to_dict, run_from_dict, write_json_atomic
from guard.terminal import render_terminal

DEFAULT_OUTPUT = "guard-results"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", default="auto", help="hardware profile: auto (default), cpu, a10, ...")
    parser.add_argument("--thresholds", default=DEFAULT_THRESHOLDS, help="budget YAML (default: %(default)s)")
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help="folder for results.json, report.md, traces (default: %(default)s)")
    parser.add_argument("--inject", choices=[LEGACY_MASK], default=None,
                        help="canary: run with the pre-#49531 mask re-injected; the check must then fail")
    parser.add_argument("--traces", choices=["on-failure", "always"], default="on-failure",
                        help="save Chrome traces of the profiled requests only when an op budget fails (default), or always")


def suite_dir() -> Path:
    """The perf suite: tests/perf in a checkout, guard/_suite in an installed wheel."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here.parent / "tests" / "perf", here / "_suite"):
        if (candidate / "pytest.ini").is_file():
            return candidate
    raise InvalidRunError("the perf suite (tests/perf) is missing from this guard installation")


class Interrupted(InvalidRunError):
    """Ctrl-C or SIGTERM while the suite ran: reported as an invalid run (exit 3) with what was measured."""


GRACE_S = 60.0  # how long an interrupted suite may take to write its run.json before it is killed


def run_suite(profile_name: str, thresholds: Path, output: Path, inject: str | None, traces: str) -> tuple[int, str | None]:
    """Run the perf suite in a child process: (its exit status, why it was interrupted or None).

    A negative status is the signal that killed it (``-9``: SIGKILL, e.g. the OOM killer). On
    Ctrl-C or SIGTERM the child gets the signal too and ``GRACE_S`` to write its run.json."""
    suite = suite_dir()
    cmd = [sys.executable, "-m", "pytest", str(suite), "-c", str(suite / "pytest.ini"), "--rootdir", str(suite),
           "-q", "--guard-record-only", "--guard-profile", profile_name, "--guard-thresholds", str(thresholds),
           "--guard-output", str(output), "--guard-traces", traces, "--benchmark-json", str(output / "benchmark.json")]
    if inject:
        cmd += ["--guard-inject", inject]

    def stop(signum, frame):  # a terminated guard must not leave the engine running behind it
        raise Interrupted(f"guard check received {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, stop)
    child = subprocess.Popen(cmd)
    try:
        try:
            return child.wait(), None
        except KeyboardInterrupt:
            why, sig = "interrupted (Ctrl-C)", signal.SIGINT
        except Interrupted as exc:
            why, sig = str(exc), signal.SIGTERM
        print(f"guard check: {why}; stopping the perf suite (up to {GRACE_S:.0f} s) ...", file=sys.stderr, flush=True)
        return _stop_child(child, sig), why
    finally:
        signal.signal(signal.SIGTERM, previous)
        if child.poll() is None:  # never leave an engine running behind us
            child.kill()
            child.wait()


def _stop_child(child: subprocess.Popen, sig: int) -> int:
    """Give the child the signal (a terminal's Ctrl-C may already have reached it) and time to write
    run.json; a second Ctrl-C, or the grace period running out, kills it."""
    try:
        try:
            return child.wait(timeout=2)
        except subprocess.TimeoutExpired:
            child.send_signal(sig)
        return child.wait(timeout=GRACE_S)
    except (KeyboardInterrupt, Interrupted, subprocess.TimeoutExpired):
        child.kill()
        return child.wait()


def prepare_output(output: Path) -> None:
    """The output folder exists and is writable, or a clear error naming it (exit 2) before a
    minute is spent measuring."""
    if output.exists() and not output.is_dir():
        raise UsageError(f"--output {output}: exists and is not a folder",
                         hint="pass a folder (it is created if missing), e.g. --output guard-results")
    probe = output / f".guard-write-test-{os.getpid()}"
    try:
        output.mkdir(parents=True, exist_ok=True)
        try:
            probe.write_bytes(b"x" * 4096)  # a full disk fails here, not after minutes of measuring
        finally:
            probe.unlink(missing_ok=True)
    except OSError as exc:
        raise UsageError(f"--output {output}: cannot write there: {exc.strerror or exc}",
                         hint="pass a writable folder with free space, e.g. --output guard-results") from None
    for stale in ("run.json", "results.json", "report.md", "benchmark.json"):
        try:
            (output / stale).unlink(missing_ok=True)
        except OSError as exc:
            raise UsageError(f"--output {output}: cannot remove the stale {stale}: {exc.strerror or exc}") from None


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def read_record(run_file: Path, code: int, interrupted: str | None, fallback: RunRecord) -> RunRecord:
    """The child's run.json (final, or its last checkpoint), with why the run cannot be judged added."""
    reasons = []
    if interrupted:
        reasons.append(f"{interrupted}: the run was stopped before it finished")
    if code < 0:
        reasons.append(f"the perf suite process was killed by {_signal_name(code)} mid-run "
                       "(the OOM killer, a timeout, or someone killed it)")
    elif code not in (0, 1, 3) and not interrupted:  # pytest: 2 interrupted, 4 usage error, 5 no tests ran
        reasons.append(f"the perf suite exited with pytest status {code}; see the output above")
    if run_file.exists():
        record = run_from_dict(read_json(run_file, RUN_SCHEMA))
    else:
        record = fallback
        reasons.append(f"the perf suite ended (exit {code}) without writing {run_file.name}: "
                       "the engine or the suite crashed before the first request; see the output above")
    record.invalid_reasons.extend(r for r in reasons if r not in record.invalid_reasons)
    return record


def _write(path: Path, write) -> None:
    try:
        write()
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}",
                         hint="free some space or pass another --output folder") from None


def run(args: argparse.Namespace) -> int:
    thresholds = load_thresholds(args.thresholds)
    hw = detect(quick=True)  # the suite's own detection (with torch) is recorded and re-checked
    profile = select_profile(thresholds, args.profile, hw)
    output = Path(args.output).resolve()
    prepare_output(output)
    check_op_names(thresholds, profile)  # before the engine: a misspelt op would pass forever
    print(f"guard check: {thresholds.model}, profile '{profile.name}' on {hw.describe()}", flush=True)
    print(f"guard check: {profile.workload.warmup_requests} warm-up + {profile.workload.requests} measured "
          f"requests at concurrency {profile.workload.concurrency}, then the op-count profile pass", flush=True)

    t0 = time.perf_counter()
    code, interrupted = run_suite(profile.name, thresholds.path.resolve(), output, args.inject, args.traces)
    fallback = RunRecord(profile=profile.name, thresholds_path=str(thresholds.path.resolve()), model=thresholds.model,
                         environment={}, injected=args.inject)
    record = read_record(output / "run.json", code, interrupted, fallback)
    record.invalid_reasons.extend(r for r in vacuous_budgets(profile, record.op_counts) if r not in record.invalid_reasons)
    results = evaluate(profile, record, guard_version=__version__, output=args.output)
    _write(output / "results.json", lambda: write_json_atomic(output / "results.json", results_to_dict(results)))
    _write(output / "report.md", lambda: (output / "report.md").write_text(render_markdown(results), encoding="utf-8"))

    print()
    print(render_terminal(results))
    print(f"guard check: {time.perf_counter() - t0:.0f} s; wrote {output / 'results.json'} and {output / 'report.md'}")
    if interrupted:
        print(f"guard check: {interrupted}; results.json keeps what was measured, marked invalid", file=sys.stderr)
    return results.exit_code
