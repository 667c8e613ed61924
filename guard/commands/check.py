"""Run the perf suite on this machine and judge it against the budgets.

Stages: budgets (validated here, before a minute is spent) -> run and verdict (guard.harness: the
pytest suite in a child process, then guard.evaluate) -> report (terminal, results.json, report.md).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from guard.budgets import DEFAULT_THRESHOLDS, load_thresholds
from guard.canary import LEGACY_MASK
from guard.errors import UsageError
from guard.evaluate import DEFAULT_OUTPUT
from guard.harness import run_and_judge
from guard.hardware import detect, select_profile
from guard.markdown import render_markdown
from guard.opnames import check_op_names
from guard.results import Results, results_to_dict, write_json_atomic
from guard.terminal import render_terminal


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", default="auto", help="hardware profile: auto (default), cpu, a10, ...")
    parser.add_argument("--thresholds", default=DEFAULT_THRESHOLDS, help="budget YAML (default: %(default)s)")
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help="folder for results.json, report.md, traces (default: %(default)s)")
    parser.add_argument("--inject", choices=[LEGACY_MASK], default=None,
                        help="canary: run with the pre-#49531 mask re-injected; the check must then fail")
    parser.add_argument("--traces", choices=["on-failure", "always"], default="on-failure",
                        help="save Chrome traces of the profiled requests only when an op budget fails (default), or always")


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
    results = run_and_judge(thresholds, profile, output, inject=args.inject, traces=args.traces)
    write_report(results, output)
    print()
    print(render_terminal(results))
    print(f"guard check: {time.perf_counter() - t0:.0f} s; wrote {output / 'results.json'} and {output / 'report.md'}")
    return results.exit_code


def prepare_output(output: Path) -> None:
    """The output folder exists and is writable with some room, or a clear error naming it (exit 2)
    before a minute is spent measuring. Only guard's own files in it are touched."""
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


def write_report(results: Results, output: Path) -> None:
    for name, write in (("results.json", lambda p: write_json_atomic(p, results_to_dict(results))),
                        ("report.md", lambda p: p.write_text(render_markdown(results), encoding="utf-8"))):
        try:
            write(output / name)
        except OSError as exc:  # the disk filled up during the run
            raise UsageError(f"cannot write {output / name}: {exc.strerror or exc}",
                             hint="free some space or pass another --output folder") from None
