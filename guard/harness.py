"""One harness for every measured run: the perf suite in a child pytest, then evaluation.

``guard check``, ``guard check --inject legacy-mask`` and ``guard selftest`` all run through
``run_and_judge``: the suite (tests/perf, one vLLM engine) records run.json, and
``guard.evaluate`` judges it. A child process keeps a crashing engine from taking the verdict
with it: a suite that dies without run.json is an invalid run, never a pass.
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
from pathlib import Path

from guard import __version__
from guard.budgets import Profile, Thresholds
from guard.census import read_baseline
from guard.errors import InvalidRunError
from guard.evaluate import evaluate
from guard.results import Results, load_run

OPS_ONLY = "ops"  # run only the op-count pass (the self-test measures no TTFT)


def suite_dir() -> Path:
    """The perf suite: tests/perf in a checkout, guard/_suite in an installed wheel."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "tests" / "perf", here / "_suite"):
        if (candidate / "pytest.ini").is_file():
            return candidate
    raise InvalidRunError("the perf suite (tests/perf) is missing from this guard installation")


def run_suite(profile_name: str, thresholds: Path, output: Path, *, inject: str | None = None,
              traces: str = "on-failure", only: str | None = None, engine_mode: str | None = None,
              server_url: str | None = None) -> int:
    """The suite in a child pytest; returns pytest's exit status. It writes ``output/run.json``."""
    suite = suite_dir()
    cmd = [sys.executable, "-m", "pytest", str(suite), "-c", str(suite / "pytest.ini"), "--rootdir", str(suite),
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

    def stop(signum, frame):  # a terminated guard must not leave the engine running behind it
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        return subprocess.run(cmd, check=False).returncode  # kills the child when interrupted
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_and_judge(thresholds: Thresholds, profile: Profile, output: Path, *, inject: str | None = None,
                  traces: str = "on-failure", only: str | None = None, engine_mode: str | None = None,
                  server_url: str | None = None) -> Results:
    """Run the suite into ``output`` and judge what it recorded."""
    census_baseline = read_baseline(profile.census)  # a malformed baseline stops here, before a minute is spent
    output.mkdir(parents=True, exist_ok=True)
    for stale in ("run.json", "results.json", "report.md", "benchmark.json", "server.log"):
        (output / stale).unlink(missing_ok=True)
    code = run_suite(profile.name, thresholds.path.resolve(), output, inject=inject, traces=traces, only=only,
                     engine_mode=engine_mode, server_url=server_url)
    run_file = output / "run.json"
    if not run_file.exists():
        raise InvalidRunError(f"the perf suite ended (pytest exit {code}) without writing {run_file}: "
                              "the engine or the suite crashed; see the output above")
    record = load_run(run_file)
    if code not in (0, 1, 3):  # pytest: 2 interrupted, 4 usage error, 5 no tests ran
        record.invalid_reasons.append(f"the perf suite exited with pytest status {code}; see the output above")
    judged = dataclasses.replace(profile, ttft_ms={}) if only == OPS_ONLY else profile
    return evaluate(judged, record, guard_version=__version__, output=output, census_baseline=census_baseline)

