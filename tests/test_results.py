"""results.json (guard.model.jsonfiles, schema, upgrade): v3 round trip, reading v2 files, the shipped
JSON Schema, and files guard must refuse."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import jsonschema
import pytest

from guard.errors import ConfigError
from guard.judge.evaluate import evaluate
from guard.model.jsonfiles import load_results, load_run, results_to_dict, run_file_dict, write_json_atomic
from guard.model.records import InvalidReason, OpSite, ReasonKind, RequestOutcome, RunRecord, ScopeCounts, to_ms
from guard.model.checks import CensusCheck, GpuCost, OpCheck, PricedClass, LatencyCheck
from guard.model.schema import RESULTS_SCHEMA_VERSION, SCHEMA_FILE, field_names, results_schema
from guard.model.upgrade import classify_v2_reason
from guard.model.environment import Environment, EnvironmentTypeError, HardwareMatch
from tests.ttft_scenarios import record, spread

RECORDED_RUNS = sorted((Path(__file__).parent / "fixtures" / "runs").glob("*.json"))

FIXTURE = Path(__file__).parent / "fixtures" / "synthetic-a10-regression.results.json"


def test_results_json_round_trip_keeps_interval_samples_rounds(cpu, tmp_path):
    res = evaluate(cpu, record(spread(7.2, 15), rounds=3), guard_version="test")
    path = tmp_path / "results.json"
    write_json_atomic(path, results_to_dict(res))
    back = load_results(path)
    assert back == res
    by_key = {c.percentile: c for c in back.ttft_checks}
    assert by_key["p99"].interval_ms[1] == math.inf  # the unbounded side survives
    assert isinstance(by_key["p50"].interval_ms, tuple)
    assert {(c.samples, c.rounds) for c in back.ttft_checks} == {(15, 3)}


def test_written_results_validate_against_the_shipped_schema():
    # a version 2 file, written back as the current version (as JSON: tuples become arrays)
    data = json.loads(json.dumps(results_to_dict(load_results(FIXTURE))))
    jsonschema.Draft202012Validator.check_schema(results_schema())
    jsonschema.Draft202012Validator(results_schema()).validate(data)
    assert data["schema_version"] == RESULTS_SCHEMA_VERSION == 3


def test_invalid_reasons_are_written_as_kind_and_text_and_read_back(cpu, tmp_path):
    judged = evaluate(cpu, record(spread(7.2, 3)))  # too few samples for the profile: a judged reason
    run = dataclasses.replace(judged.run, invalid_reasons=[InvalidReason(ReasonKind.ENGINE, "engine died during round 2: boom")])
    res = dataclasses.replace(judged, run=run)
    data = json.loads(json.dumps(results_to_dict(res)))
    jsonschema.Draft202012Validator(results_schema()).validate(data)
    assert data["run"]["invalid_reasons"] == [{"kind": "engine", "text": "engine died during round 2: boom"}]
    assert {"kind": "too_few_samples", "text": "too few TTFT samples: 3 of 5 requested"} in data["judged_invalid_reasons"]
    write_json_atomic(tmp_path / "results.json", data)
    assert load_results(tmp_path / "results.json") == res
    write_json_atomic(tmp_path / "run.json", run_file_dict(run))
    assert load_run(tmp_path / "run.json").invalid_reasons[0].kind == ReasonKind.ENGINE


def test_the_schema_names_every_reason_kind():
    kinds = json.loads(SCHEMA_FILE.read_text())["$defs"]["invalid_reason"]["properties"]["kind"]["enum"]
    assert kinds == [k.value for k in ReasonKind]


def test_a_version_2_file_reads_with_its_reasons_typed_by_their_text(tmp_path):
    """Recorded v2 files hold reasons as strings; the loader gives each the kind its producer names now."""
    busy = Path(__file__).parent / "fixtures" / "runs" / "cpu-bf16-busy.json"
    assert json.loads(busy.read_text())["schema_version"] == 2
    (reason,) = load_results(busy).judged_invalid_reasons
    assert reason.kind == ReasonKind.BUSY_MACHINE and reason.text.startswith("busy machine: other processes used 0.81")

    def v2(reasons, judged):
        def change(d):
            d["run"]["invalid_reasons"], d["judged_invalid_reasons"] = reasons, judged
        return change
    path = _mutated(tmp_path, v2(["engine died during round 2: boom"],
                                 ["census: no census baseline at x.json; write it", "something guard never said"]))
    res = load_results(path)
    assert [(r.kind, r.text) for r in res.invalid_reasons] == [
        (ReasonKind.ENGINE, "engine died during round 2: boom"),
        (ReasonKind.CENSUS_BASELINE, "census: no census baseline at x.json; write it"),
        (ReasonKind.UNKNOWN, "something guard never said")]


@pytest.mark.parametrize("text, kind", [
    ("request 3 (640x480) failed: boom", ReasonKind.REQUEST_FAILED),
    ("baseline: request 3 (640x480) failed: boom", ReasonKind.REQUEST_FAILED),
    ("op-count scope 'vit' was budgeted but not measured", ReasonKind.SCOPE_NOT_MEASURED),
    ("op-count scope 'vit' was never entered for a 640x480 image: ...", ReasonKind.SCOPE_NEVER_ENTERED),
    ("census: baseline b.json has no 640x480 census", ReasonKind.CENSUS_BASELINE_MISMATCH),
    ("census: no census was measured for a 640x480 image", ReasonKind.CENSUS_MISSING),
    ("slow machine: guard's speed reference took 100 ms", ReasonKind.SLOW_MACHINE),
    ("the run did not finish: the last checkpoint was written after round 1", ReasonKind.UNFINISHED),
    ("the perf suite process was killed by SIGKILL mid-run", ReasonKind.CRASH),
    ("guard received SIGTERM: the run was stopped before it finished", ReasonKind.INTERRUPTED),
    ("2 request(s) failed during round 1; last lines of out/server.log:\nboom", ReasonKind.REQUEST_FAILED),
    ("busy machine: other processes used 0.81 of 2 cores", ReasonKind.BUSY_MACHINE),
    ("perf test tests/perf/test_ttft.py::test_ttft failed: boom", ReasonKind.TEST_FAILED),
])
def test_version_2_reason_kinds(text, kind):
    assert classify_v2_reason(text) == InvalidReason(kind, text)


@pytest.mark.parametrize("record_type, schema_def", [
    (LatencyCheck, "latency_check"), (OpCheck, "op_check"), (RequestOutcome, "request_outcome"), (OpSite, "op_site"),
    (ScopeCounts, "scope_counts"), (RunRecord, "run"), (CensusCheck, "census_check"), (GpuCost, "gpu_cost"),
    (PricedClass, "priced_class"),
])
def test_schema_describes_every_field_of_every_record(record_type, schema_def):
    """The schema and the dataclasses are one description: a field added to one must be added to the other."""
    props = json.loads(SCHEMA_FILE.read_text())["$defs"][schema_def]["properties"]
    implied = {"metric"} if record_type is LatencyCheck else set()  # the list a check is written in names its metric
    assert set(props) == set(field_names(record_type)) - implied


def test_each_fact_is_written_once(cpu):
    data = results_to_dict(evaluate(cpu, record(spread(7.2, 6))))
    assert "environment" not in data and "samples" not in data and "exit_code" not in data
    assert "environment" in data["run"] and len(data["run"]["outcomes"]) == 6


def test_every_number_names_its_unit(cpu):
    data = results_to_dict(evaluate(cpu, record(spread(7.2, 6))))
    ttft_keys = set(data["checks"]["ttft"][0])
    assert {"budget_ms", "measured_ms", "interval_ms"} <= ttft_keys and not {"budget", "measured", "interval"} & ttft_keys
    op = json.loads(FIXTURE.read_text())["checks"]["ops"][0]
    assert {"budget_calls", "measured_calls"} <= set(op)


def test_run_json_round_trip(tmp_path):
    res = load_results(FIXTURE)
    path = tmp_path / "run.json"
    write_json_atomic(path, run_file_dict(res.run))
    assert load_run(path) == res.run


def _mutated(tmp_path: Path, change) -> Path:
    data = json.loads(FIXTURE.read_text())
    change(data)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    return path


def _set(path: list, value):
    def change(data):
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


@pytest.mark.parametrize("change, where", [
    (_set(["verdict"], "banana"), "verdict"),
    (_set(["checks", "ops", 0, "measured_calls"], -3), "checks.ops[0].measured_calls"),
    (_set(["checks", "ops", 0, "measured_calls"], 2.5), "checks.ops[0].measured_calls"),
    (_set(["checks", "ops", 0, "measured_calls"], "12"), "checks.ops[0].measured_calls"),
    (_set(["checks", "ttft", 0, "budget_ms"], 0), "checks.ttft[0].budget_ms"),
    (_set(["run", "outcomes", 0, "ttft_client_s"], -1.0), "run.outcomes[0].ttft_client_s"),
    (_set(["run"], []), "run"),
    (_set(["run", "op_counts", 0, "calls_by_op", "aten::x"], -1), "run.op_counts[0].calls_by_op.aten::x"),
    (_set(["checks", "ops", 0, "rule"], "min"), "checks.ops[0].rule"),
    (_set(["checks", "ops", 0, "surprise"], 1), "checks.ops[0]"),
    (_set(["run", "environment", "cpu_count"], "two"), "run.environment.cpu_count"),
    (_set(["run", "environment", "cuda"], "12.8"), "run.environment.cuda"),
    (_set(["run", "environment", "cpu_isa"], "avx2"), "run.environment.cpu_isa"),
    (_set(["run", "environment", "engine_mode"], "inprocess"), "run.environment.engine_mode"),
    (_set(["run", "environment", "ttft_hardware_match"], {"reason": None}), "run.environment.ttft_hardware_match"),
])
def test_invalid_content_is_a_config_error_naming_the_json_path(tmp_path, change, where):
    with pytest.raises(ConfigError) as exc:
        load_results(_mutated(tmp_path, change))
    assert exc.value.key == where
    assert exc.value.exit_code == 2


@pytest.mark.parametrize("text, problem", [
    ('{"a": NaN}', "NaN"),
    ('{"a": Infinity}', "Infinity"),
    ('{"a": 1e999}', "out of range"),
    ("[" * 100_000 + "]" * 100_000, "deeply"),
    ("{not json", "not valid JSON"),
    ('[1, 2]', "not a guard/results file"),
])
def test_unreadable_files_are_config_errors(tmp_path, text, problem):
    path = tmp_path / "results.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=problem):
        load_results(path)


@pytest.mark.parametrize("where, value, problem", [
    (["checks", "ttft", 0, "measured_ms"], "NaN", "NaN is not a number guard writes"),
    (["run", "outcomes", 3, "ttft_client_s"], "-Infinity", "-Infinity is not a number guard writes"),
    (["run", "environment", "cpu_contention"], "1e999", "1e999 is out of range"),
    (["profile_config", "headroom_pct"], "Infinity", "Infinity is not a number guard writes"),
])
def test_a_non_number_names_the_json_path_of_its_field(tmp_path, where, value, problem):
    """NaN and friends are refused (guard writes strict JSON), and the error says which field held one."""
    marker = 123456789.25
    text = _mutated(tmp_path, _set(where, marker)).read_text()
    assert text.count(repr(marker)) == 1
    path = tmp_path / "results.json"
    path.write_text(text.replace(repr(marker), value))
    with pytest.raises(ConfigError) as exc:
        load_results(path)
    key = where[0] + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in where[1:])
    assert exc.value.key == key
    assert problem in str(exc.value) and str(path) in str(exc.value)


def test_binary_file_and_folder_are_config_errors(tmp_path):
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="UTF-8"):
        load_results(binary)
    folder = tmp_path / "d.json"
    folder.mkdir()
    with pytest.raises(ConfigError, match="cannot read"):
        load_results(folder)


def test_version_1_is_refused_with_the_fix(tmp_path):
    path = _mutated(tmp_path, _set(["schema_version"], 1))
    with pytest.raises(ConfigError, match="schema version 1") as exc:
        load_results(path)
    assert "re-run `guard check`" in str(exc.value)


def test_cpu_contention_reading_is_described_by_the_schema(cpu, tmp_path):
    """environment.cpu_contention: every field of ContentionReading (plus lost_cores) is in the schema,
    a recorded reading validates and round-trips, and a nonsense one is refused naming its path."""
    from guard.measure.contention import ContentionReading

    props = json.loads(SCHEMA_FILE.read_text())["$defs"]["cpu_contention"]["properties"]
    assert set(props) == set(field_names(ContentionReading)) | {"lost_cores"}
    reading = ContentionReading(window_s=36.2, cpus=2, other_cores=0.07, steal_cores=0.01, own_cores=1.93,
                                load_1m_start=1.1, load_1m_end=1.9, mhz_start=2596.1, mhz_end=2596.1, tree_processes=1)
    run = record(spread(7.2, 6))
    run.environment.cpu_contention = reading
    path = tmp_path / "results.json"
    write_json_atomic(path, results_to_dict(evaluate(cpu, run)))
    assert load_results(path).run.environment.cpu_contention == reading
    data = json.loads(path.read_text())
    data["run"]["environment"]["cpu_contention"]["other_cores"] = -1
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as err:
        load_results(path)
    assert "run.environment.cpu_contention.other_cores" in str(err.value)


def test_the_synthetic_a10_fixture_is_what_guard_itself_would_judge_from_its_run_record():
    """tests/fixtures/synthetic-a10-regression.results.json is hand-made a10 data (no GPU here, see
    tests/fixtures/README.md), so it must not claim what guard would not: it passes the schema, and
    re-judging its run record against the shipped thresholds (what `guard comment` does) gives back
    its checks, notices and verdict exactly. Its first version claimed a p99 pass at n=100, whose
    95 % interval has no upper end (p99 needs 368 samples)."""
    from guard.config.loading import load_thresholds
    from guard.judge.rejudge import rejudge
    from tests.conftest import SHIPPED_THRESHOLDS

    stored = load_results(FIXTURE)
    fresh = rejudge(stored, load_thresholds(SHIPPED_THRESHOLDS), source=str(FIXTURE))
    assert results_to_dict(fresh) == results_to_dict(stored)
    p99 = next(c for c in stored.ttft_checks if c.percentile == "p99")
    assert p99.samples < 368 and p99.interval_ms[1] == float("inf") and p99.status != "pass"


def test_seconds_become_milliseconds_in_one_place():
    """Seconds inside, milliseconds at the edge: ``to_ms`` is guard's one ×1000, so a unit change or
    a rounding rule cannot differ between the records, the reports and the history."""
    import ast

    guard_dir = Path(__file__).resolve().parent.parent / "guard"
    found = [f"{path.relative_to(guard_dir.parent)}:{node.lineno}"
             for path in sorted(guard_dir.rglob("*.py")) for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)
             and any(isinstance(x, ast.Constant) and x.value == 1000 for x in (node.left, node.right))]
    assert len(found) == 1 and found[0].startswith("guard/model/records.py:"), found
    assert to_ms(1.5) == 1500.0


# ----------------------------------------------------------------------------- run.environment, typed
def test_the_schema_describes_every_environment_field():
    props = json.loads(SCHEMA_FILE.read_text())["$defs"]["environment"]["properties"]
    assert set(props) == set(field_names(Environment)) - {"other"}


@pytest.mark.parametrize("path", [*RECORDED_RUNS, FIXTURE], ids=lambda p: p.stem)
def test_a_recorded_environment_reads_typed_and_writes_back_as_it_was(path):
    """Every recorded run's environment (both sides of an A/B run) types and comes back key for key;
    null is "not recorded" and is not written back."""
    data = json.loads(path.read_text())
    res = load_results(path)
    sides = [(data["run"]["environment"], res.run.environment)]
    if res.ab is not None:
        sides.append((data["ab"]["baseline"]["environment"], res.ab.baseline.environment))
    for stored, env in sides:
        assert isinstance(env, Environment)
        assert env.as_dict() == {k: v for k, v in stored.items() if v is not None}
        if "cpu_isa" in stored:
            assert env.cpu_isa == tuple(stored["cpu_isa"])
        if stored.get("ttft_hardware_match"):
            assert isinstance(env.ttft_hardware_match, HardwareMatch)
            assert env.ttft_hardware_match.ok is stored["ttft_hardware_match"]["ok"]
        if stored.get("engine_args"):  # the arguments as written; dtype and the bf16 fallback read once, typed
            engine = stored["engine_args"]
            assert env.engine_args.arguments == engine and env.dtype == engine["dtype"]
            assert env.engine_args.bf16_replaced is (engine["dtype"] != "bfloat16"
                                                     and engine.get("dtype_without_native_bf16") == engine["dtype"])


def test_unknown_environment_keys_are_kept_and_a_wrong_type_from_code_names_its_field():
    env = Environment.from_dict({"cpu": "AMD EPYC", "cpu_count": 2, "driver": "550.54.15"})
    assert env.cpu == "AMD EPYC" and env.other == {"driver": "550.54.15"}
    assert env.as_dict() == {"cpu": "AMD EPYC", "cpu_count": 2, "driver": "550.54.15"}
    with pytest.raises(EnvironmentTypeError, match=r"environment\.cpu_count: expected an integer, got bool"):
        env.update({"cpu_count": True})
    with pytest.raises(EnvironmentTypeError, match=r"environment\.cpu_isa\[\]: expected a string"):
        env.update({"cpu_isa": ["avx2", 3]})


def test_a_sides_own_reading_is_recorded_typed_as_of_each_merge():
    """A worker side writes its reading as a plain dict and adds ``stopped_s`` when it stops; the
    record types what it was given at each merge (the run stage merges at start and at the end),
    and writes it back as given, keys a newer guard wrote included."""
    side_adds = {"worker": {"executable": "/x/python", "init_s": 3, "vllm_file": "/v/vllm/__init__.py", "gpu_count": 0}}
    env = Environment.from_dict({"cpu": "c"})
    env.update(side_adds)
    side_adds["worker"]["stopped_s"] = 1.5
    assert env.worker.executable == "/x/python" and env.worker.init_s == 3.0 and env.worker.stopped_s is None
    env.update(side_adds)  # the merge at the end
    assert env.worker.stopped_s == 1.5 and env.worker.other == {"gpu_count": 0}
    assert env.as_dict()["worker"] == side_adds["worker"]
    side_adds["worker"]["op_counts_cache"] = {"key": "k1", "status": "hit", "recorded_at": "2026-12-05T10:00:00+00:00"}
    env.update(side_adds)
    assert env.op_counts_cache.status == "hit" and env.op_counts_cache.key == "k1"
    assert Environment.from_dict(env.as_dict()).as_dict() == env.as_dict()
    server = Environment.from_dict({"server": {"managed": False, "url": "http://h:8000", "served_model": "m"}}).server
    assert server.remote and server.url == "http://h:8000" and server.command is None
    assert Environment.from_dict({}).op_counts_cache is None


def test_guard_reads_the_environment_by_field_not_by_string_key():
    """The record is typed: only an engine side's own additions (``self.environment``) are a plain dict."""
    import re

    root = Path(__file__).parent.parent / "guard"
    keys = "|".join(field_names(Environment))
    pattern = re.compile(rf"(?<!self)\.environment(\.get\(|\[|\.setdefault\()|\benv(\.get\(|\[)\"({keys})\"")
    offenders = [f"{p.relative_to(root)}:{n}: {line.strip()}" for p in root.rglob("*.py")
                 for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert offenders == []
