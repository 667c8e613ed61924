"""Run the perf suite on this machine and judge it against the budgets.

Stages: budgets (validated here, before a minute is spent) -> run (the pytest suite in a child
process, one vLLM engine, writes run.json) -> verdict (guard.evaluate) -> report (terminal,
results.json, report.md). A child process keeps a crashing engine from taking the verdict with it.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

from guard import __version__
from guard.budgets import DEFAULT_THRESHOLDS, load_thresholds
from guard.canary import LEGACY_MASK
from guard.mutants import INJECTABLE
from guard.errors import InvalidRunError
from guard.evaluate import evaluate
from guard.hardware import detect, select_profile
from guard.markdown import render_markdown
from guard.results import RUN_SCHEMA, read_json, results_to_dict, run_from_dict, write_json_atomic
from guard.terminal import render_terminal

DEFAULT_OUTPUT = "guard-results"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", default="auto", help="hardware profile: auto (default), cpu, a10, ...")
    parser.add_argument("--thresholds", default=DEFAULT_THRESHOLDS, help="budget YAML (default: %(default)s)")
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help="folder for results.json, report.md, traces (default: %(default)s)")
    parser.add_argument("--inject", choices=[LEGACY_MASK, *INJECTABLE], default=None, metavar="CANARY",
                        help="canary: legacy-mask (the pre-#49531 mask re-injected), or mutant:NAME, a source-level "
                             f"test edit of vLLM's vision path ({', '.join(INJECTABLE)}); see docs/census.md")
    parser.add_argument("--traces", choices=["on-failure", "always"], default="on-failure",
                        help="save Chrome traces of the profiled requests only when an op budget fails (default), or always")


def suite_dir() -> Path:
    """The perf suite: tests/perf in a checkout, guard/_suite in an installed wheel."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here.parent / "tests" / "perf", here / "_suite"):
        if (candidate / "pytest.ini").is_file():
            return candidate
    raise InvalidRunError("the perf suite (tests/perf) is missing from this guard installation")


def run_suite(profile_name: str, thresholds: Path, output: Path, inject: str | None, traces: str) -> int:
    suite = suite_dir()
    cmd = [sys.executable, "-m", "pytest", str(suite), "-c", str(suite / "pytest.ini"), "--rootdir", str(suite),
           "-q", "--guard-record-only", "--guard-profile", profile_name, "--guard-thresholds", str(thresholds),
           "--guard-output", str(output), "--guard-traces", traces, "--benchmark-json", str(output / "benchmark.json")]
    if inject:
        cmd += ["--guard-inject", inject]

    def stop(signum, frame):  # a terminated guard must not leave the engine running behind it
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        return subprocess.run(cmd, check=False).returncode  # kills the child when interrupted
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args: argparse.Namespace) -> int:
    thresholds = load_thresholds(args.thresholds)
    hw = detect(quick=True)  # the suite's own detection (with torch) is recorded and re-checked
    profile = select_profile(thresholds, args.profile, hw)
    output = Path(args.output).resolve()
    output.mkdir(parents=True, exist_ok=True)
    for stale in ("run.json", "results.json", "report.md", "benchmark.json"):
        (output / stale).unlink(missing_ok=True)
    print(f"guard check: {thresholds.model}, profile '{profile.name}' on {hw.describe()}", flush=True)
    print(f"guard check: {profile.workload.warmup_requests} warm-up + {profile.workload.requests} measured "
          f"requests at concurrency {profile.workload.concurrency}, then the op-count profile pass", flush=True)

    t0 = time.perf_counter()
    code = run_suite(profile.name, thresholds.path.resolve(), output, args.inject, args.traces)
    run_file = output / "run.json"
    if not run_file.exists():
        raise InvalidRunError(f"the perf suite ended (pytest exit {code}) without writing {run_file}: "
                              "the engine or the suite crashed; see the output above")
    record = run_from_dict(read_json(run_file, RUN_SCHEMA))
    if code not in (0, 1, 3):  # pytest: 2 interrupted, 4 usage error, 5 no tests ran
        record.invalid_reasons.append(f"the perf suite exited with pytest status {code}; see the output above")
    results = evaluate(profile, record, guard_version=__version__, output=args.output)
    write_json_atomic(output / "results.json", results_to_dict(results))
    (output / "report.md").write_text(render_markdown(results), encoding="utf-8")

    print()
    print(render_terminal(results))
    print(f"guard check: {time.perf_counter() - t0:.0f} s; wrote {output / 'results.json'} and {output / 'report.md'}")
    return results.exit_code
