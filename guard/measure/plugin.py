"""pytest plugin (entry point ``pytest11: guard``): hooks and fixtures only.

Inert unless ``--guard-profile`` is given (``guard check`` passes it). Then one session-scoped
``GuardRun`` (guard.measure.run: one engine side) serves every perf test; at session end the plugin writes
``run.json`` for ``guard check``, prints the verdict table after pytest's summary, and fails
the session on a regression or an invalid run.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from guard.config.budgets import DEFAULT_THRESHOLDS

RUN_KEY = pytest.StashKey["GuardRun"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("guard", "guard: vLLM performance budgets")
    g.addoption("--guard-profile", default=None, help="hardware profile to run (auto, cpu, a10, ...); enables the suite")
    g.addoption("--guard-thresholds", default=DEFAULT_THRESHOLDS, help="budget YAML (default: %(default)s)")
    g.addoption("--guard-output", default="guard-results", help="where run.json and traces go")
    from guard.measure.mutants import INJECTABLE

    g.addoption("--guard-inject", default=None, choices=["legacy-mask", *INJECTABLE],
                help="canary: re-inject the pre-#49531 mask, or apply a source-level test mutant of vLLM "
                     "(guard/measure/mutants.py), before measuring")
    g.addoption("--guard-traces", default="on-failure", choices=["on-failure", "always"],
                help="save the profiled requests' Chrome traces always, or only when an op budget fails")
    g.addoption("--guard-engine-mode", default=None, choices=["server", "in-process"],
                help="measure TTFT through `vllm serve` or the in-process engine (default: the profile's engine.mode)")
    g.addoption("--guard-server-url", default=None, help="measure this running vLLM server (TTFT only)")
    g.addoption("--guard-record-only", action="store_true", help="only write run.json; the caller (guard check) judges and reports it")


def _progress(config: pytest.Config):
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")

    def say(msg: str) -> None:
        # Progress must reach the terminal while a test runs, so step around output capture.
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            if reporter is not None:
                reporter.write_line(f"[guard] {msg}", flush=True)
            else:
                print(f"[guard] {msg}", flush=True)

    return say


@pytest.fixture(scope="session")
def guard_run(pytestconfig: pytest.Config):
    """The session's GuardRun: budgets loaded, hardware matched, engine started lazily."""
    if pytestconfig.getoption("guard_profile") is None:
        pytest.skip("perf suite: run it through `guard check` (or pass --guard-profile)")
    if RUN_KEY not in pytestconfig.stash:
        from guard.config.budgets import load_thresholds
        from guard.measure.hardware import detect, select_profile
        from guard.measure.run import GuardRun

        thresholds = load_thresholds(pytestconfig.getoption("guard_thresholds"))
        hw = detect()
        server_url = pytestconfig.getoption("guard_server_url")
        profile = select_profile(thresholds, pytestconfig.getoption("guard_profile"), hw).with_engine_mode(
            "server" if server_url else pytestconfig.getoption("guard_engine_mode"))
        if not server_url:  # a remote server loaded whatever it loaded; guard names what it starts
            from guard.config.weights import hub_resolver, pin

            profile = pin(profile, hub_resolver(download=False))  # a moving revision measured as one commit
        run = GuardRun(thresholds, profile, hw, Path(pytestconfig.getoption("guard_output")),
                       progress=_progress(pytestconfig), injected=pytestconfig.getoption("guard_inject"),
                       traces=pytestconfig.getoption("guard_traces"), server_url=server_url)
        pytestconfig.stash[RUN_KEY] = run  # --guard-inject: applied by the engine side (guard.measure.inprocess.Injection)
    return pytestconfig.stash[RUN_KEY]


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    run = session.config.stash.get(RUN_KEY, None)
    if run is None:
        return
    from guard.model.results import InvalidReason, ReasonKind, run_file_dict, write_json_atomic

    record = run.finish()
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for outcome in ("failed", "error"):
        for rep in (reporter.stats.get(outcome, []) if reporter else []):
            crash = getattr(rep.longrepr, "reprcrash", None)
            why = crash.message.splitlines()[0] if crash else str(rep.longrepr).splitlines()[-1]
            record.invalid_reasons.append(InvalidReason(ReasonKind.TEST_FAILED, f"perf test {rep.nodeid} {outcome}: {why}"))
    bench_json = session.config.getoption("benchmark_json", None)
    if bench_json is not None:
        record.benchmark_json = getattr(bench_json, "name", str(bench_json))
    write_json_atomic(run.output / "run.json", run_file_dict(record))
    if session.config.getoption("guard_record_only"):
        return  # run by guard check, which judges run.json itself
    from guard.judge.evaluate import evaluate

    from guard.measure.census import read_baseline

    results = evaluate(run.profile, record, output=str(run.output), census_baseline=read_baseline(run.profile.census))
    session.config.stash[_RESULTS_KEY] = results
    if results.exit_code and session.exitstatus == 0:
        session.exitstatus = results.exit_code


_RESULTS_KEY = pytest.StashKey["object"]()
TTFT_BENCHMARK = "guard-ttft"  # extra_info marker of the perf suite's TTFT benchmark entry


def pytest_benchmark_update_json(config: pytest.Config, benchmarks, output_json: dict) -> None:
    """pytest-benchmark timed the whole timing pass as one round; replace that entry's stats with
    the per-request TTFT samples (seconds), so benchmark.json and `pytest-benchmark compare` show
    the TTFT distribution. Public API only: this hook and the Stats class."""
    from pytest_benchmark.stats import Stats

    for bench in output_json.get("benchmarks", []):
        extra = bench.get("extra_info") or {}
        samples = extra.get("ttft_client_s")
        if extra.get("guard") != TTFT_BENCHMARK or not samples:
            continue
        stats = Stats()
        for s in samples:
            stats.update(s)
        bench["stats"] = {**stats.as_dict(), "data": list(samples), "iterations": 1}


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    results = config.stash.get(_RESULTS_KEY, None)
    if results is None:
        return
    from guard.report.terminal import render_terminal

    terminalreporter.write_sep("=", "guard")
    for line in render_terminal(results).splitlines():
        terminalreporter.write_line(line)
