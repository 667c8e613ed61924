"""pytest plugin (entry point ``pytest11: guard``): the perf suite (tests/perf) run by hand.

    pytest tests/perf -c tests/perf/pytest.ini --guard-profile cpu

Inert unless ``--guard-profile`` is given. Then one session-scoped ``GuardRun`` (guard.measure.single_run,
opened as ``guard check``'s child opens it: guard.child.open_run) serves every perf test,
whose bodies are the run stage's own steps (``timing_pass``, ``profile_pass``). At session end the
plugin writes ``run.json``, judges it (an edge, like a command: nothing else judges this run),
prints the verdict table after pytest's summary and fails the session on a regression or an
invalid run. ``guard check`` does not run pytest: it runs the same steps in guard.child.
"""

from __future__ import annotations

import contextlib

import pytest

from guard.config.budgets import DEFAULT_THRESHOLDS
from guard.model.records import Measures

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
        from pathlib import Path

        from guard.child import open_run
        from guard.measure.harness import RunSpec

        opt = pytestconfig.getoption
        spec = RunSpec(profile=opt("guard_profile"), thresholds=opt("guard_thresholds"), output=opt("guard_output"),
                       measures=pytestconfig.stash.get(MEASURES_KEY, Measures.BOTH), inject=opt("guard_inject"),
                       traces=opt("guard_traces"), engine_mode=opt("guard_engine_mode"), server_url=opt("guard_server_url"))
        Path(spec.output).mkdir(parents=True, exist_ok=True)
        run = open_run(spec, _progress(pytestconfig))
        run.record.measures = spec.measures
        pytestconfig.stash[RUN_KEY] = run  # --guard-inject: applied by the engine side (guard.measure.inprocess.Injection)
    return pytestconfig.stash[RUN_KEY]


MEASURES_KEY = pytest.StashKey[Measures]()
TIMING_TEST, OPS_TEST = "test_ttft", "test_op_counts"


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """What the run measures, decided by the tests the user selected (``-k test_op_counts``: ops only)."""
    names = {getattr(item, "originalname", item.name) for item in items}
    if OPS_TEST in names and TIMING_TEST not in names:
        config.stash[MEASURES_KEY] = Measures.OPS
    elif TIMING_TEST in names and OPS_TEST not in names:
        config.stash[MEASURES_KEY] = Measures.TTFT


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    run = session.config.stash.get(RUN_KEY, None)
    if run is None:
        return
    from guard.model.jsonfiles import run_file_dict, write_json_atomic
    from guard.model.records import InvalidReason, ReasonKind

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
    import dataclasses

    from guard.judge.evaluate import evaluate
    from guard.config.census import read_baseline

    judged = run.profile if record.measures.ttft else dataclasses.replace(run.profile, ttft_ms={}, token_ms={})
    results = evaluate(judged, record, output=str(run.output), census_baseline=read_baseline(run.profile.census))
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
