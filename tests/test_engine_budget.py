"""The engine suite's cost counter (guard.measure.enginelog) and its reader (benchmarks/engine_budget.py):
lines written by real processes, read back per test."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import textwrap

from tests.conftest import REPO, benchmark_script

WRITE = textwrap.dedent("""
    import sys
    sys.path.insert(0, {repo!r})
    from guard.measure import enginelog
    enginelog.note("start", mode="in-process", ok=True, s=1.5)
    enginelog.note("request", label="warm-up", warmup=True, ok=True)
    enginelog.note("request", label="round 1", warmup=False, ok=True)
    enginelog.note("request", label="profiled", warmup=False, ok=True)
""").format(repo=str(REPO))


def write_lines(env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "-c", WRITE], check=True, env={**os.environ, **env})


def test_nothing_is_written_without_the_variable(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_lines({})
    assert list(tmp_path.iterdir()) == []


def test_lines_are_counted_per_test_and_joined_with_pytests_times(tmp_path, capsys) -> None:
    log = tmp_path / "engine.jsonl"
    write_lines({"GUARD_ENGINE_LOG": str(log), "GUARD_ENGINE_LOG_TEST": "tests/test_a.py::test_one"})
    write_lines({"GUARD_ENGINE_LOG": str(log), "GUARD_ENGINE_LOG_TEST": "tests/test_a.py::test_one"})
    write_lines({"GUARD_ENGINE_LOG": str(log), "GUARD_ENGINE_LOG_TEST": "tests/test_b.py::test_two"})
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(lines) == 12 and {x["event"] for x in lines} == {"start", "request"}
    junit = tmp_path / "engine.xml"
    junit.write_text('<testsuites><testsuite><testcase classname="tests.test_a" name="test_one" time="600"/>'
                     '<testcase classname="tests.test_b" name="test_two" time="300"/></testsuite></testsuites>')
    with benchmark_script("engine_budget") as eb:
        per = eb.read_log(log)
        one = dict(per["tests/test_a.py::test_one"])
        engine_s, engine_wall_s = one.pop("engine_s"), one.pop("engine_wall_s")
        assert engine_s >= 2 * 1.5  # both starts' seconds, and the requests' since
        assert 1.5 <= engine_wall_s <= engine_s  # the second start's 1.5 s reach back over the first process's lines
        assert one == {"starts": 2, "failed_starts": 0, "warmup": 2, "timed": 2, "profiled": 2}
        assert per["tests/test_b.py::test_two"]["starts"] == 1
        assert eb.main([str(log), "--junit", str(junit)]) == 0
        # the log is appended to by every run: a junit file stamped after these lines leaves none of them
        later = dt.datetime.fromtimestamp(max(x["t"] for x in lines) + 60, dt.timezone.utc).isoformat()
        newer = tmp_path / "newer.xml"
        newer.write_text(f'<testsuites><testsuite timestamp="{later}"><testcase classname="tests.test_a" '
                         'name="test_one" time="1"/></testsuite></testsuites>')
        assert eb.read_log(log, since=eb.junit_start(newer)) == {}
        assert eb.junit_start(junit) is None and eb.read_log(log, since=eb.junit_start(newer) - 3600) == per
    out = capsys.readouterr().out
    engine_s = sum(row["engine_wall_s"] for row in per.values())
    engine, rest = engine_s / 60, 15 - engine_s / 60
    assert (f"worst case for CI: engine {engine:.1f} min x 3.4 + the rest {rest:.1f} min x 1.5 + 10 min = "
            f"{engine * 3.4 + rest * 1.5 + 10:.0f} min") in out


def test_conftest_labels_each_line_with_the_test_that_caused_it(tmp_path) -> None:
    """A real pytest run with this suite's conftest: its isolation keeps the counter's variables,
    and its hook names the running test, module fixtures included."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import _isolated_env, pytest_runtest_protocol\n")
    (tmp_path / "test_x.py").write_text(textwrap.dedent("""
        import pytest
        from guard.measure import enginelog

        @pytest.fixture(scope="module")
        def shared():
            enginelog.note("start", ok=True)

        def test_first(shared):
            enginelog.note("request", label="profiled", warmup=False, ok=True)

        def test_second(shared):
            enginelog.note("request", label="round 1", warmup=False, ok=True)
    """))
    log = tmp_path / "engine.jsonl"
    env = {**os.environ, "GUARD_ENGINE_LOG": str(log), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:]
    lines = [(x["event"], x["test"].rsplit("::", 1)[-1]) for x in map(json.loads, log.read_text().splitlines())]
    assert lines == [("start", "test_first"), ("request", "test_first"), ("request", "test_second")]


def test_engine_tests_past_cis_deadline_are_skipped_and_named(tmp_path) -> None:
    """A real pytest run with this suite's conftest: with GUARD_ENGINE_DEADLINE passed, an engine
    test is skipped before its fixtures run and says why; a fast test still runs; with the deadline
    ahead, the engine test runs."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_runtest_setup\n")
    (tmp_path / "test_x.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.fixture
        def costly():
            raise AssertionError("set up although past the deadline")

        @pytest.mark.engine
        def test_engine(costly):
            pass

        def test_fast():
            pass
    """))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    engine: x\n")

    def run(deadline: float) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:randomly", "-p", "no:cacheprovider",
                               str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO), "GUARD_ENGINE_DEADLINE": str(deadline)})

    past = run(0)
    assert past.returncode == 0, past.stdout
    assert "1 passed, 1 skipped" in past.stdout and "past GUARD_ENGINE_DEADLINE" in past.stdout
    ahead = run(4102444800)  # 2100
    assert ahead.returncode == 1 and "set up although past the deadline" in ahead.stdout


def test_engines_busy_side_by_side_take_the_wall_once() -> None:
    with benchmark_script("engine_budget") as eb:
        assert eb.busy_s([(0.0, 14.0), (0.5, 14.2)]) == 14.2  # guard pr's two sides starting together
        assert eb.busy_s([(10.0, 12.0), (0.0, 3.0), (2.0, 4.0)]) == 6.0
        assert eb.busy_s([]) == 0.0
