"""Shared fixtures. Tests stay away from the real home directory, GitHub and stray env vars."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHIPPED_THRESHOLDS = REPO / "thresholds" / "deepseek-ocr-2.yaml"


@contextlib.contextmanager
def benchmark_script(stem: str):
    """benchmarks/ is scripts, not a package: load one as a module, registered under a private name
    while in use (its dataclasses look their module up by name)."""
    name = f"guard_benchmarks_{stem}"
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)


# benchmarks/engine_budget.py's counting (guard.measure.enginelog): set for the whole run, kept
# through the isolation below, and each line labelled with the test that caused it
ENGINE_LOG_VARS = ("GUARD_ENGINE_LOG", "GUARD_ENGINE_LOG_TEST")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Around setup, call and teardown, so a module fixture's engine run counts for the test that
    started it."""
    if os.environ.get("GUARD_ENGINE_LOG"):
        os.environ["GUARD_ENGINE_LOG_TEST"] = item.nodeid
    yield


# .ci/run's deadline for starting an engine test (epoch seconds). CI fails as a whole past 90
# minutes, and a machine slow enough to get there would land nothing: there, the engine tests not
# started by then are skipped, each named with why, and run again on the next faster machine
# (docs/measurements.md, "The engine suite against CI's 90-minute limit"). Read once: the isolation
# below clears GUARD_ variables inside tests.
ENGINE_DEADLINE = os.environ.get("GUARD_ENGINE_DEADLINE")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if ENGINE_DEADLINE and item.get_closest_marker("engine") and time.time() > float(ENGINE_DEADLINE):
        pytest.skip("not started: past GUARD_ENGINE_DEADLINE, the time CI leaves for starting an engine test "
                    "on this machine (.ci/run); it runs on a faster one")


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if (name.startswith(("GITHUB_", "GUARD_")) or name in ("CI_GITHUB_TOKEN",)) and name not in ENGINE_LOG_VARS:
            monkeypatch.delenv(name, raising=False)


def clear_github_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """No real GitHub Actions context leaks into a test (or out of it), and the local fake GitHub is
    reached directly: tests of the comment path set exactly what they need."""
    for name in list(os.environ):
        if name.startswith(("GITHUB_", "GH_", "RUNNER_", "ACTIONS_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


RECORDED_RUNS_CENSUS = Path(__file__).parent / "fixtures" / "runs" / "census-2-layer"


def thresholds_for_recorded_runs(dest: Path) -> Path:
    """The shipped thresholds folder copied to ``dest``, with DeepSeek-OCR-2's census baselines as the
    recorded runs (tests/fixtures/runs) were judged against: counted on the 2-layer checkpoint those
    runs ran, before it became real in structure (issue #58). Judged against today's baselines, every
    function of the language model would have grown."""
    shutil.copytree(REPO / "thresholds", dest)
    for census in RECORDED_RUNS_CENSUS.glob("*.census.json"):
        shutil.copyfile(census, dest / census.name)
    return dest


def engine_as_recorded(thresholds_file: Path, results_file: Path) -> None:
    """Set the engine keys and max_tokens a recorded run's ``profile_config`` names back to what it ran with
    (a one-token run: without the TPOT and ITL budgets), in a
    copy of a shipped thresholds file: the fixtures were recorded before later engine settings
    (``cpu_kvcache_space_gb`` 2 -> 1), and update-thresholds rightly refuses a run made under
    another engine. Edits each differing ``key: value`` line in place, keeping the comments."""
    import json
    import re

    config = json.loads(results_file.read_text())["profile_config"]
    text = thresholds_file.read_text()
    # the engine's keys, and the workload's max_tokens (recorded runs sent 1 token, the shipped cpu profile 16)
    settings = {**config["engine"], "max_tokens": config.get("workload", {}).get("max_tokens")}
    for key, value in settings.items():
        line = re.compile(rf"^(\s+{re.escape(key)}: )(\S+)$", re.M)
        other = [m for m in line.finditer(text) if m.group(2) != str(value)]  # one line differs: that profile's
        if isinstance(value, (int, float)) and not isinstance(value, bool) and len(other) == 1:
            text = text[:other[0].start()] + f"{other[0].group(1)}{value}" + text[other[0].end():]
    if (settings["max_tokens"] or 1) < 2:  # one-token runs had no TPOT or ITL to judge: those budgets came later
        text = re.sub(r"^(\s+)(tpot_ms|itl_ms):\n(?:\1  .*\n)+", "", text, flags=re.M)
    thresholds_file.write_text(text)


def census_not_judged_here(thresholds_file: Path = SHIPPED_THRESHOLDS) -> str | None:
    """Why this machine's `guard check` judges no census on the file's cpu profile (an AMX CPU where no
    AMX census is recorded), or None. Engine tests that assert a census finding skip with it: there
    the census is counted and shown, never failed, and that is what such a machine must do."""
    from guard.config.loading import load_thresholds
    from guard.measure.fit import select_profile
    from guard.measure.hardware import detect

    machine = detect(quick=True)
    if machine.cuda:
        return None
    census = select_profile(load_thresholds(thresholds_file), "cpu", machine).census
    return None if census is None else census.not_judged


def skip_where_no_census_is_judged(thresholds_file: Path = SHIPPED_THRESHOLDS) -> None:
    why = census_not_judged_here(thresholds_file)
    if why is not None:
        pytest.skip(f"this CPU judges no census with {thresholds_file.name}: {why}")


def run_guard(*args: str, cwd: Path | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """The real `guard` console entry point, in a child process, as a person would run it."""
    exe = shutil.which("guard", path=str(Path(sys.executable).parent)) or "guard"
    return subprocess.run([exe, *args], cwd=cwd or REPO, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def thresholds():
    """The pinned statistics thresholds (tests/fixtures/thresholds-statistics.yaml)."""
    from guard.config.loading import load_thresholds
    from tests.ttft_scenarios import THRESHOLDS

    return load_thresholds(THRESHOLDS, require_decidable=False)


@pytest.fixture
def cpu(thresholds):
    """The pinned cpu profile (5 requests, batches of 5 up to 15, p50/p90/p99), TTFT budgets only."""
    import dataclasses

    return dataclasses.replace(thresholds.profile("cpu"), ops=())


@pytest.fixture(scope="session")
def engine_cache(tmp_path_factory) -> Path:
    """One guard cache (per-revision environments and op counts) for the engine tests of a session:
    `guard pr` and `guard bisect` over repositories built from the same installed vLLM share their
    base tree, which is then profiled once. What is cached is keyed by what it measured
    (guard.revisions.sides), so sharing cannot hand a test another revision's counts."""
    return tmp_path_factory.mktemp("engine-cache")
