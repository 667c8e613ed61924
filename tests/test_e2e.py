"""End to end: the real `guard` CLI, the real vLLM engine on CPU, the real torch profiler.

Each test runs `guard check` (or `selftest`) on a small copy of the shipped CPU profile:
1 warm-up + 2 measured requests and one profiled 640x480 request, about a minute each.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from guard.results import results_schema

from tests.conftest import SHIPPED_THRESHOLDS, run_guard

pytestmark = pytest.mark.engine


def small_cpu_yaml(tmp_path: Path, *, ttft_ms: dict | None = None, model: str | None = None,
                   profile_sizes: list | None = None, mask_function: str | None = None) -> Path:
    """The shipped file with the CPU profile cut down, written elsewhere (the shipped one stays)."""
    data = yaml.safe_load(SHIPPED_THRESHOLDS.read_text())
    cpu = data["profiles"]["cpu"]
    cpu["workload"].update(requests=2, warmup_requests=1, profile_image_sizes=profile_sizes or [[640, 480]])
    cpu["statistics"] = {"confidence": 0.95}  # no resampling rounds: keep the test short
    cpu["budgets"]["ttft_ms"] = ttft_ms or {"p50": 600_000, "p99": 600_000}
    if model:
        cpu["engine"]["model"] = model
    if mask_function:
        cpu["budgets"]["ops"]["mask_path"]["scope"]["function"] = mask_function
    path = tmp_path / "budget.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def results_of(out: Path) -> dict:
    """results.json as written, after checking it against the shipped JSON Schema."""
    data = json.loads((out / "results.json").read_text())
    jsonschema.Draft202012Validator(results_schema()).validate(data)
    return data


def measured_s(res: dict, key: str = "ttft_client_s") -> list[float]:
    return [o[key] for o in res["run"]["outcomes"] if not o["warmup"] and o["success"]]


def op_check(res: dict, size: list[int], op: str = "aten::_index_put_impl_") -> dict:
    (c,) = [c for c in res["checks"]["ops"] if c["image_size"] == size and c["op"] == op]
    return c


@pytest.fixture(scope="module")
def passing_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pass")
    out = tmp / "out"
    proc = run_guard("check", "--thresholds", str(small_cpu_yaml(tmp)), "--output", str(out))
    return proc, out


def test_check_passes_and_writes_results(passing_run) -> None:
    proc, out = passing_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = results_of(out)
    assert res["schema"] == "guard/results" and res["schema_version"] == 2 and res["verdict"] == "pass"
    samples = measured_s(res)
    assert len(samples) == 2 and all(s > 0 for s in samples)
    engine = measured_s(res, "ttft_engine_s")
    # the engine's own clock starts after input processing, so it never exceeds the client's
    assert len(engine) == 2 and all(0 < e <= c for e, c in zip(engine, samples))
    assert {c["percentile"] for c in res["checks"]["ttft"]} == {"p50", "p99"}
    index_put = op_check(res, [640, 480])
    assert index_put["measured_calls"] == 0 and index_put["budget_calls"] == 0 and index_put["status"] == "pass"
    env = res["run"]["environment"]
    for key in ("cpu", "vllm", "torch", "transformers", "guard", "model"):
        assert env.get(key), key
    assert (out / "report.md").read_text().strip()
    assert res["run"]["traces"] == []  # traces are written to explain a failing op budget
    assert (out / "events-640x480.json.gz").stat().st_size > 0


def test_check_prints_progress_table_and_verdict(passing_run) -> None:
    proc, _ = passing_run
    assert "engine ready" in proc.stdout
    assert proc.stdout.count("TTFT") >= 3  # one progress line per request
    assert "ttft p50" in proc.stdout and "PASS:" in proc.stdout


def test_benchmark_json_carries_the_samples(passing_run) -> None:
    _, out = passing_run
    bench = json.loads((out / "benchmark.json").read_text())
    (b,) = [b for b in bench["benchmarks"] if b["name"] == "test_ttft"]
    samples = measured_s(results_of(out))
    assert b["stats"]["rounds"] == len(samples)
    assert b["stats"]["median"] == pytest.approx(sorted(samples)[len(samples) // 2] if len(samples) % 2 else
                                                 sum(sorted(samples)[len(samples) // 2 - 1:][:2]) / 2)
    assert b["extra_info"]["ttft_client_s"] == samples


def test_tight_budget_exits_1_and_names_the_metric(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_guard("check", "--thresholds", str(small_cpu_yaml(tmp_path, ttft_ms={"p50": 1})), "--output", str(out))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "REGRESSION" in proc.stdout and "TTFT p50" in proc.stdout
    res = results_of(out)
    assert res["verdict"] == "regression"
    (p50,) = [c for c in res["checks"]["ttft"] if c["percentile"] == "p50"]
    assert p50["status"] == "fail" and p50["measured_ms"] > 1


def test_legacy_mask_injected_exits_1_and_names_the_code_path(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_guard("check", "--thresholds", str(small_cpu_yaml(tmp_path)), "--output", str(out),
                     "--inject", "legacy-mask")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = results_of(out)
    ip = op_check(res, [640, 480])
    assert ip["status"] == "fail" and ip["measured_calls"] == 513
    assert "_update_causal_mask" in proc.stdout and "513" in proc.stdout
    report = (out / "report.md").read_text()
    assert "_update_causal_mask" in report and "513" in report
    assert res["run"]["injected"] == "legacy-mask"
    (trace,) = res["run"]["traces"]
    assert trace == "trace-640x480.json.gz" and (out / trace).stat().st_size > 100_000


def test_missing_model_path_is_an_invalid_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_guard("check", "--thresholds", str(small_cpu_yaml(tmp_path, model="/nonexistent/deepseek-ocr-2")),
                     "--output", str(out))
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "/nonexistent/deepseek-ocr-2" in proc.stdout + proc.stderr
    assert results_of(out)["verdict"] == "invalid"


def test_scope_that_never_runs_is_an_invalid_run(tmp_path: Path) -> None:
    # As if vLLM renamed the mask function: "0 calls" must not read as a pass.
    out = tmp_path / "out"
    proc = run_guard("check", "--thresholds", str(small_cpu_yaml(tmp_path, mask_function="_build_legacy_mask")),
                     "--output", str(out))
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = results_of(out)
    assert res["verdict"] == "invalid"
    reasons = res["run"]["invalid_reasons"] + res["judged_invalid_reasons"]
    assert any("'mask_path' was never entered" in r for r in reasons), reasons
    assert "INVALID RUN" in proc.stdout and "mask_path" in proc.stdout


def test_selftest_catches_the_legacy_mask(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_guard("selftest", "--thresholds", str(small_cpu_yaml(tmp_path, profile_sizes=[[640, 480], [800, 400]])),
                     "--output", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "SELFTEST PASS" in proc.stdout
    # both runs went through guard check's own harness and verdict, and wrote results.json v2
    clean, canary = results_of(out / "clean"), results_of(out / "canary")
    assert clean["verdict"] == "pass" and canary["verdict"] == "regression"
    assert canary["run"]["injected"] == "legacy-mask" and clean["run"]["injected"] is None
    assert op_check(canary, [640, 480])["measured_calls"] == 513
    assert op_check(canary, [800, 400])["measured_calls"] == 513 + 2 * 289
    assert all(c["measured_calls"] == 0 for c in clean["checks"]["ops"] if c["op"] == "aten::_index_put_impl_")


def test_the_suite_runs_under_plain_pytest_and_judges_itself(tmp_path: Path) -> None:
    """Without guard check, the plugin evaluates at session end, prints the table and fails the
    session on a regression (here: a 1 ms budget)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    suite = REPO / "tests" / "perf"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(suite), "-c", str(suite / "pytest.ini"), "--guard-profile", "cpu",
         "--guard-thresholds", str(small_cpu_yaml(tmp_path, ttft_ms={"p50": 1})), "--guard-output", str(tmp_path / "o")],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "REGRESSION" in proc.stdout and "TTFT p50" in proc.stdout
    assert "2 passed" in proc.stdout  # the measurement itself was complete
    assert (tmp_path / "o" / "run.json").exists()
