"""End to end: the real `guard` CLI, the real vLLM engine on CPU, the real torch profiler.

Each test runs `guard check` (or `selftest`) on a small copy of the shipped CPU profile:
1 warm-up + 2 measured requests and one profiled 640x480 request, about a minute each. Every engine
start costs CI time on the slowest machine (docs/measurements.md), so a claim rides on a run
another test already makes where it can (the shared clean run), and what recorded profiles of the
real engine can show is shown in the unit tests (a scope that never runs: tests/test_runner.py).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from guard.model.jsonfiles import load_run
from guard.model.schema import RESULTS_SCHEMA_VERSION, results_schema
from guard.judge.gates import unsteady
from guard.model.environment import SpeedReference

from tests.conftest import REPO, SHIPPED_THRESHOLDS, run_guard, skip_where_no_census_is_judged

pytestmark = pytest.mark.engine


def small_cpu_yaml(tmp_path: Path, *, ttft_ms: dict | None = None, model: str | None = None,
                   profile_sizes: list | None = None, mixes: dict | None = None,
                   max_other_cpu_pct: float = 100, ttft_hardware: dict | None = None, timing_only: bool = False,
                   tpot_ms: dict | None = None) -> Path:
    """The shipped file with the CPU profile cut down, written elsewhere (the shipped one stays).
    The contention gate is off unless asked for (``max_other_cpu_pct``): these tests share their
    machine, and only the contention test is about it. The TTFT budgets are bound to whatever CPU
    runs the test unless ``ttft_hardware`` says otherwise, so they are judged everywhere.
    ``timing_only``: no op budgets and no census, so no profiled request (for tests about TTFT alone).
    ``mixes``: the profile's request mixes (default: the default set). ``tpot_ms``: a TPOT budget
    (default: none, nor ITL's: the shipped ones are bound to the CPU they were measured on)."""
    data = yaml.safe_load(SHIPPED_THRESHOLDS.read_text())
    cpu = data["profiles"]["cpu"]
    cpu["workload"].update(requests=2, warmup_requests=1, profile_image_sizes=profile_sizes or [[640, 480]])
    cpu["statistics"] = {"confidence": 0.95}  # no resampling rounds: keep the test short
    cpu["validity"] = {"max_other_cpu_pct": max_other_cpu_pct}
    cpu["budgets"]["ttft_ms"] = ttft_ms or {"p50": 600_000, "p99": 600_000}
    cpu["budgets"]["ttft_hardware"] = ttft_hardware or {"cpu_model_regex": ".", "cpu_count": [1, 4096]}
    cpu["budgets"].pop("itl_ms", None)
    cpu["budgets"].pop("tpot_ms", None)
    if tpot_ms:
        cpu["budgets"]["tpot_ms"] = tpot_ms
    if model:
        cpu["engine"]["model"] = model
    if mixes is not None:
        cpu["workload"]["profile_mixes"] = mixes
    if timing_only:
        cpu["budgets"].pop("ops", None)
        cpu["budgets"].pop("census", None)
    census = cpu["budgets"].get("census")
    if census:  # the committed baselines, not ones beside the copy
        for key in ("baseline", "baseline_without_native_bf16", "baseline_with_amx"):
            if key in census:
                census[key] = str((SHIPPED_THRESHOLDS.parent / census[key]).resolve())
    path = tmp_path / "budget.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def results_of(out: Path) -> dict:
    """results.json as written, after checking it against the shipped JSON Schema."""
    data = json.loads((out / "results.json").read_text())
    jsonschema.Draft202012Validator(results_schema()).validate(data)
    return data


def recorded_speed(res: dict) -> SpeedReference | None:
    """The run's speed reference as results.json holds it, typed for the gates."""
    speed = res["run"]["environment"].get("speed_reference")
    return SpeedReference.from_dict(speed) if speed else None


def measured_s(res: dict, key: str = "ttft_client_s") -> list[float]:
    return [o[key] for o in res["run"]["outcomes"] if not o["warmup"] and o["success"]]


def op_check(res: dict, size: list[int], op: str = "aten::_index_put_impl_") -> dict:
    (c,) = [c for c in res["checks"]["ops"] if c["image_size"] == size and c["op"] == op]
    return c


def other_cpu_budget_folder(tmp: Path) -> Path:
    """A copy of the shipped thresholds folder (census baselines beside the YAML, by relative path,
    as shipped), cut down, whose TTFT budget (1 ms: any judged run would fail it) is bound to a CPU
    this test never runs on. Returns the copied budget file."""
    folder = tmp / "thresholds"
    shutil.copytree(SHIPPED_THRESHOLDS.parent, folder)
    budget = folder / SHIPPED_THRESHOLDS.name
    data = yaml.safe_load(budget.read_text())
    cpu = data["profiles"]["cpu"]
    cpu["workload"].update(requests=2, warmup_requests=1, profile_image_sizes=[[640, 480]])
    cpu["statistics"] = {"confidence": 0.95}
    cpu["validity"] = {"max_other_cpu_pct": 100, "max_slowdown_pct": 10}
    cpu["budgets"]["ttft_hardware"] = {"cpu_model_regex": "^a CPU this test never runs on$", "cpu_count": 2}
    cpu["budgets"]["ttft_ms"] = {"p50": 1}
    for key in ("tpot_ms", "itl_ms"):  # still measured (16 tokens a request); a budget of them is the mutant test's
        cpu["budgets"].pop(key, None)
    budget.write_text(yaml.safe_dump(data, sort_keys=False))
    return budget


@pytest.fixture(scope="module")
def passing_run(tmp_path_factory):
    """The shared clean run: `guard check` in a folder of its own on a copy of the shipped budgets
    whose TTFT budget is bound to another CPU, so TTFT is measured and shown, op counts and the
    census judged. It is also the local-budget recipe's first step and the clean run the quota test
    takes its budget from, and update-thresholds takes a budget only from a run that held its
    speed (guard.judge.gates.unsteady): so it is run again, up to twice, while the machine changed
    speed inside it. Returns the last run's process, its output folder and its working folder."""
    tmp = tmp_path_factory.mktemp("pass")
    budget = other_cpu_budget_folder(tmp)
    for _ in range(3):
        proc = run_guard("check", "--thresholds", str(budget), "--output", str(tmp / "out"), cwd=tmp)
        if proc.returncode != 0 or not unsteady(recorded_speed(results_of(tmp / "out")), 10):
            break
    return proc, tmp / "out", tmp


def test_check_passes_and_writes_results(passing_run) -> None:
    proc, out, _ = passing_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = results_of(out)
    assert res["schema"] == "guard/results" and res["schema_version"] == RESULTS_SCHEMA_VERSION == 3 and res["verdict"] == "pass"
    assert res["run"]["measures"] == "both"  # decided by guard check, recorded by its child run
    samples = measured_s(res)
    assert len(samples) == 2 and all(s > 0 for s in samples)
    engine = measured_s(res, "ttft_engine_s")
    # the engine's own clock starts after input processing, so it never exceeds the client's
    assert len(engine) == 2 and all(0 < e <= c for e, c in zip(engine, samples))
    # every timed request returned its 16 tokens: TPOT and ITL of the same requests, shown beside TTFT
    timed = [o for o in res["run"]["outcomes"] if not o["warmup"] and o["success"]]
    assert all(o["output_tokens"] == 16 and len(o["itl_s"]) == 15 and all(g > 0 for g in o["itl_s"]) for o in timed)
    assert all(o["latency_s"] == pytest.approx(o["ttft_client_s"] + sum(o["itl_s"]), abs=1e-3) for o in timed)
    assert "TPOT over 2 requests: p50" in proc.stdout and "ITL over 30 inter-token gaps: p50" in proc.stdout
    # a TTFT budget bound to another CPU is shown, not judged: exit 0 with a 1 ms budget
    (p50,) = res["checks"]["ttft"]
    assert p50["percentile"] == "p50" and p50["status"] == "not_judged" and p50["measured_ms"] > 1
    assert p50["note"].startswith("not judged: budget measured on a CPU matching /^a CPU this test never runs on")
    index_put = op_check(res, [640, 480])
    assert index_put["measured_calls"] == 0 and index_put["budget_calls"] == 0 and index_put["status"] == "pass"
    env = res["run"]["environment"]
    for key in ("cpu", "vllm", "torch", "transformers", "guard", "model"):
        assert env.get(key), key
    assert (out / "report.md").read_text().strip()
    speed = env["speed_reference"]  # guard.measure.speedref, read in the engine's process around the timing pass
    assert speed["before"]["ms"] > 0 and speed["after"]["ms"] > 0
    assert speed["ms"] == pytest.approx((speed["before"]["ms"] + speed["after"]["ms"]) / 2, abs=0.01)
    assert res["run"]["traces"] == []  # traces are written to explain a failing op budget
    assert (out / "events-640x480.json.gz").stat().st_size > 0


def test_check_prints_progress_table_and_verdict(passing_run) -> None:
    proc, _, _ = passing_run
    assert "engine ready" in proc.stdout
    assert proc.stdout.count("TTFT") >= 3  # one progress line per request
    assert "ttft p50" in proc.stdout and "PASS:" in proc.stdout


def test_census_catches_a_source_mutant_and_a_tight_ttft_budget_in_one_run(tmp_path: Path) -> None:
    """A source-level edit of vLLM's vision path (guard/measure/mutants.py), outside every named scope,
    measured against a 1 ms p50 budget: one valid run over two budgets of different kinds exits 1
    and names both, the census function with its op deltas and the TTFT percentile."""
    skip_where_no_census_is_judged()
    from guard.measure.mutants import MUTANTS

    m = MUTANTS["token-item"]
    out = tmp_path / "out"
    proc = run_guard("check", "--thresholds", str(small_cpu_yaml(tmp_path, ttft_ms={"p50": 1}, tpot_ms={"p50": 0.001})),
                     "--output", str(out), "--inject", "mutant:token-item")
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-3000:]
    res = results_of(out)
    assert res["verdict"] == "regression" and res["run"]["injected"] == "mutant:token-item"
    # the TTFT budget
    assert "REGRESSION" in proc.stdout and "TTFT p50" in proc.stdout
    (p50,) = [c for c in res["checks"]["ttft"] if c["percentile"] == "p50"]
    assert p50["status"] == "fail" and p50["measured_ms"] > 1
    # the TPOT budget, judged on the same requests' decode steps
    (tpot,) = res["checks"]["tpot"]
    assert tpot["status"] == "fail" and tpot["samples"] == 2 and 0.001 < tpot["measured_ms"] < 1000
    assert "TPOT p50" in proc.stdout and "tpot p50" in proc.stdout
    # the census
    (c,) = [c for c in res["checks"]["census"] if c["status"] == "fail"]
    assert c["function"] == m.function and c["image_size"] == [640, 480]
    grew = {d["op"]: d["delta_calls"] for d in c["op_deltas"]}
    assert grew["aten::_local_scalar_dense"] == 256  # one .item() per causal-flow query of the global view
    assert c["watched_ops"] == ["aten::_local_scalar_dense"]
    assert m.function in proc.stdout and "+256 aten::_local_scalar_dense" in proc.stdout
    # the named mask scope still holds: only the census can see this one
    assert all(o["status"] == "pass" for o in res["checks"]["ops"])


def test_a_host_sync_per_decoder_layer_counts_once_per_real_layer(tmp_path: Path) -> None:
    """The tiny DeepSeek-OCR-2 is real in structure (issue #58): an `.item()` added to every decoder
    layer shows as many host syncs a prefill as the real model has layers (12), where the old
    2-layer checkpoint showed 2, under the census's growth floor."""
    skip_where_no_census_is_judged()
    from guard.measure.mutants import MUTANTS

    m = MUTANTS["layer-item"]
    config = json.loads((REPO / "guard" / "models" / "tiny-deepseek-ocr2" / "config.json").read_text())
    layers = config["language_config"]["num_hidden_layers"]
    out = tmp_path / "out"
    proc = run_guard("check", "--thresholds", str(small_cpu_yaml(tmp_path)), "--output", str(out),
                     "--inject", "mutant:layer-item", "--only", "ops")
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-3000:]
    res = results_of(out)
    (c,) = [c for c in res["checks"]["census"] if c["status"] == "fail" and not c.get("mix")]
    assert c["function"] == m.function and c["image_size"] == [640, 480]
    grew = {d["op"]: d["delta_calls"] for d in c["op_deltas"]}
    assert grew["aten::_local_scalar_dense"] == layers == 12  # one forward pass, one sync a layer
    assert c["watched_ops"] == ["aten::_local_scalar_dense"]


def test_the_clean_rewrite_mutant_passes_the_census(tmp_path: Path) -> None:
    """The same vision code rewritten without changing its work (guard/measure/mutants.py): no function
    grows, so the census passes. Op counts only: no TTFT to time for this question."""
    out = tmp_path / "out"
    proc = run_guard("check", "--thresholds", str(small_cpu_yaml(tmp_path)), "--output", str(out),
                     "--inject", "mutant:rewrite-clean", "--only", "ops")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    res = results_of(out)
    assert res["verdict"] == "pass" and res["run"]["injected"] == "mutant:rewrite-clean"
    assert [c for c in res["checks"]["census"] if c["status"] == "fail"] == []
    assert res["run"]["census"]["640x480"]  # the census was taken, not skipped
    assert res["checks"]["ttft"] == [] and measured_s(res) == []  # --only ops timed nothing


@pytest.mark.parametrize("mutant", ["topk-row-item", "topk-vectorised"])
def test_the_decode_census_catches_a_per_request_item_in_the_sampler_and_passes_its_vectorised_form(
        tmp_path: Path, mutant: str) -> None:
    """A per-request loop with an .item() in the CPU sampler's top-k mask, which runs on every decode
    step of a mix with top-k and never in the greedy prefill the image sizes profile: the seeded mix's
    decode census fails naming the function; the vectorised refactor of the same lines passes.
    Against the committed decode baseline, one mix (the default set's seeded one) to keep it short."""
    from guard.config.budgets import DEFAULT_MIXES
    from guard.measure.mutants import MUTANTS

    skip_where_no_census_is_judged()
    seeded = next(m for m in DEFAULT_MIXES if m.name == "seeded")
    out = tmp_path / "out"
    proc = run_guard("check", "--thresholds", str(small_cpu_yaml(tmp_path, mixes={"seeded": seeded.as_dict()})),
                     "--output", str(out), "--inject", f"mutant:{mutant}", "--only", "ops")
    res = results_of(out)
    decode = res["run"]["decode_census"]["seeded"]
    assert decode["steps"] == seeded.output_tokens - 1 and decode["per_step"] is True
    failed = [c for c in res["checks"]["census"] if c["status"] == "fail"]
    if MUTANTS[mutant].expect == "pass":
        assert proc.returncode == 0 and failed == [], proc.stdout[-4000:] + proc.stderr[-3000:]
        return
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-3000:]
    (c,) = failed
    assert (c["function"], c["mix"], c["unit"]) == (MUTANTS[mutant].function, "seeded", "per step")
    assert "aten::_local_scalar_dense" in c["watched_ops"]  # one .item() per request and step
    assert "decode seeded, per step" in proc.stdout and "apply_top_k_top_p_pytorch" in proc.stdout


def test_missing_model_path_is_an_invalid_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_guard("check", "--thresholds", str(small_cpu_yaml(tmp_path, model="/nonexistent/deepseek-ocr-2")),
                     "--output", str(out))
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "/nonexistent/deepseek-ocr-2" in proc.stdout + proc.stderr
    assert results_of(out)["verdict"] == "invalid"


def test_selftest_catches_the_legacy_mask(tmp_path: Path) -> None:
    """The self-test's two op-count runs through guard check's harness: the clean code holds its
    budgets, and the pre-#49531 mask injected in the live engine fails the mask-path budget with
    exactly the expected index_put calls per image size, named where they come from."""
    out = tmp_path / "out"
    proc = run_guard("selftest", "--thresholds", str(small_cpu_yaml(tmp_path, profile_sizes=[[640, 480], [800, 400]])),
                     "--output", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "SELFTEST PASS" in proc.stdout
    # both runs went through guard check's own harness and verdict, and wrote results.json (schema 3)
    clean, canary = results_of(out / "clean"), results_of(out / "canary")
    assert clean["verdict"] == "pass" and canary["verdict"] == "regression"
    assert canary["run"]["injected"] == "legacy-mask" and clean["run"]["injected"] is None
    assert clean["run"]["measures"] == canary["run"]["measures"] == "ops"
    assert op_check(canary, [640, 480])["measured_calls"] == 513
    assert op_check(canary, [800, 400])["measured_calls"] == 513 + 2 * 289
    assert all(c["measured_calls"] == 0 for c in clean["checks"]["ops"] if c["op"] == "aten::_index_put_impl_")
    # the canary run names the code path: in the output, its report.md and the saved trace
    ip = op_check(canary, [640, 480])
    assert ip["status"] == "fail" and ip["budget_calls"] == 0
    assert "_update_causal_mask" in proc.stdout and "513" in proc.stdout
    report = (out / "canary" / "report.md").read_text()
    assert "_update_causal_mask" in report and "513" in report
    assert "trace-640x480.json.gz" in canary["run"]["traces"]
    assert (out / "canary" / "trace-640x480.json.gz").stat().st_size > 100_000
    assert clean["run"]["traces"] == []  # traces are written to explain a failing op budget


def test_the_suite_runs_under_plain_pytest_and_judges_itself(tmp_path: Path) -> None:
    """By hand, the suite runs the run stage's steps as tests; the plugin judges once at session end,
    prints the table and fails the session on a regression (here: a 1 ms budget)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    suite = REPO / "tests" / "perf"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(suite), "-c", str(suite / "pytest.ini"), "--guard-profile", "cpu",
         "--guard-thresholds", str(small_cpu_yaml(tmp_path, ttft_ms={"p50": 1})), "--guard-output", str(tmp_path / "o"),
         "--benchmark-json", str(tmp_path / "bench.json")],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "REGRESSION" in proc.stdout and "TTFT p50" in proc.stdout
    assert "2 passed" in proc.stdout  # the measurement itself was complete
    run = load_run(tmp_path / "o" / "run.json")
    assert run.measures == "both" and not run.invalid_reasons
    # pytest-benchmark's JSON carries the per-request TTFT samples in place of the one timed round
    bench = json.loads((tmp_path / "bench.json").read_text())
    (b,) = [b for b in bench["benchmarks"] if b["name"] == "test_ttft"]
    samples = run.ttft_client_s()
    assert b["stats"]["rounds"] == len(samples) == 2
    assert b["stats"]["median"] == pytest.approx(sum(samples) / 2)
    assert b["extra_info"]["ttft_client_s"] == samples


# ----------------------------------------------------------------------------- the machine under the numbers
def _busy_loop_outside_our_tree() -> int:
    """`python -c 'while 1: pass'` started through a shell that exits, so it is nobody's child here."""
    import subprocess
    import sys

    out = subprocess.run(["sh", "-c", f"{sys.executable} -c 'while 1: pass' >/dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True)
    return int(out.stdout)


def test_a_busy_core_never_gives_a_regression(tmp_path: Path) -> None:
    """A clean checkout measured while a busy loop holds one of the cores: pass or invalid, never 1.
    The budget is the shipped p50, which the busy loop's slowdown exceeds (measured: docs/reliability.md, the CPU contention gate), so
    without the gate this run would report a regression."""
    import os
    import signal

    from guard.config.loading import load_thresholds

    shipped = load_thresholds(SHIPPED_THRESHOLDS).profile("cpu")
    out = tmp_path / "out"
    yaml_path = small_cpu_yaml(tmp_path, ttft_ms=dict(shipped.ttft_ms),
                               max_other_cpu_pct=shipped.validity.max_other_cpu_pct, timing_only=True)
    pid = _busy_loop_outside_our_tree()
    try:
        proc = run_guard("check", "--thresholds", str(yaml_path), "--output", str(out))
    finally:
        os.kill(pid, signal.SIGKILL)
    assert proc.returncode in (0, 3), proc.stdout[-3000:] + proc.stderr[-3000:]
    res = results_of(out)
    reading = res["run"]["environment"]["cpu_contention"]
    # the loop, seen from /proc: it shares two cores with the engine's two threads, so it gets at
    # least about two thirds of one (a quiet machine reads ~0)
    assert reading["other_cores"] >= 0.5, reading
    if proc.returncode == 3:
        assert res["verdict"] == "invalid"
        assert any(r["kind"] == "busy_machine" and r["text"].startswith("busy machine: other processes used")
                   for r in res["judged_invalid_reasons"])
        assert "other processes used" in proc.stdout


CPU_CGROUP = Path("/sys/fs/cgroup/cpu")


def steady_clean_run(tmp_path: Path, passing_run, attempts: int = 2) -> dict:
    """A clean run fit to write a budget and its speed reference from, by update-thresholds' own
    rule (guard.judge.gates.unsteady: readings before and after the measured requests within twice
    validity.max_slowdown_pct, 10 in small_cpu_yaml). In CI on 2 December this VM slowed inside
    the shared clean run (readings 194 then 311 ms, requests 13.0 then 17.4 s): a budget and
    reference averaged across such a phase describe no machine, and the 1.3-core run after it read
    the same reference (231, 276 ms) while its TTFT went over the budget: exit 1. The premise, the
    budget's machine and then the same machine under a quota, needs a machine that held its speed
    while the budget was measured."""
    out = passing_run[1]
    for attempt in range(attempts + 1):
        res = results_of(out)
        if unsteady(recorded_speed(res), 10) is None or attempt == attempts:
            return res
        again = tmp_path / f"clean-{attempt + 1}"
        again.mkdir()
        out = again / "out"
        proc = run_guard("check", "--thresholds", str(small_cpu_yaml(again)), "--output", str(out))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    raise AssertionError("unreachable")


@pytest.mark.skipif(os.geteuid() != 0 or not (CPU_CGROUP / "cpu.cfs_quota_us").exists(),
                    reason="needs root and cgroup v1's cpu controller to impose a CPU quota")
def test_a_slowdown_proc_cannot_see_is_never_a_regression(tmp_path: Path, passing_run) -> None:
    """The budget and its speed reference as update-thresholds writes them from a clean run
    (passing_run, or a new one if the machine changed speed during it: p50 + 15 %, its speed
    reading); then the same checkout under a CPU quota of 1.3 cores, which no other process
    explains: TTFT exceeds the budget, the contention gate sees nothing, and the speed reference
    explains the excess: exit 3, never 1."""
    clean = steady_clean_run(tmp_path, passing_run)
    p50_ms = statistics.median(measured_s(clean)) * 1000
    reference_ms = clean["run"]["environment"]["speed_reference"]["ms"]
    yaml_path = small_cpu_yaml(tmp_path, ttft_ms={"p50": round(p50_ms * 1.15)}, max_other_cpu_pct=5,
                               ttft_hardware={"cpu_model_regex": ".", "cpu_count": [1, 4096],
                                              "speed_reference_ms": reference_ms}, timing_only=True)
    group = CPU_CGROUP / f"guard-e2e-quota-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("130000")  # 1.3 cores: TTFT +63 %, the reading +56 % (benchmark)
        out = tmp_path / "out"
        exe = shutil.which("guard", path=str(Path(sys.executable).parent)) or "guard"
        proc = subprocess.run([exe, "check", "--thresholds", str(yaml_path), "--output", str(out)], cwd=REPO,
                              capture_output=True, text=True, timeout=900,
                              preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())))
    finally:
        for pid in (group / "cgroup.procs").read_text().split():  # nothing should be left; never leak a quota
            (CPU_CGROUP / "cgroup.procs").write_text(pid)
        group.rmdir()
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = results_of(out)
    (ttft,) = res["checks"]["ttft"]
    assert ttft["measured_ms"] > ttft["budget_ms"]  # without the speed gate: a regression
    assert res["run"]["environment"]["cpu_contention"]["other_cores"] < 0.2  # /proc: a quiet machine
    (why,) = [r["text"] for r in res["judged_invalid_reasons"] if r["kind"] == "slow_machine"]
    assert why.startswith("slow machine")
    assert "validity.max_slowdown_pct" in why
    assert res["run"]["environment"]["speed_reference"]["ms"] > reference_ms * 1.1  # beyond validity.max_slowdown_pct
    assert "slow machine" in proc.stdout and "machine speed: guard's speed reference" in proc.stdout


def test_the_local_budget_recipe_guard_prints_works_when_followed_exactly(passing_run) -> None:
    """On a CPU the shipped TTFT budget is not bound to, guard check shows TTFT without judging it
    (even against a 1 ms budget) and prints a recipe for a local budget (the shared clean run).
    Followed to the letter (its commands, as printed) in that run's folder, beside the copied
    thresholds folder, it ends in a check whose TTFT is judged against the new local budget, with
    the census found. That check passes unless the machine itself changed speed meanwhile (this VM's
    host once doubled guard's speed reference between two runs): then guard's speed gate makes it
    invalid, which is the machine's doing, not the recipe's, and the test says so rather than failing."""
    import re
    import shlex

    first, out, tmp_path = passing_run
    folder = tmp_path / "thresholds"
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    # A TTFT budget bound to another CPU is shown, not judged: exit 0 with a 1 ms budget, op counts judged.
    res = results_of(out)
    assert res["verdict"] == "pass"
    (p50,) = res["checks"]["ttft"]
    assert p50["percentile"] == "p50" and p50["status"] == "not_judged" and p50["measured_ms"] > 1
    assert p50["note"].startswith("not judged: budget measured on a CPU matching /^a CPU this test never runs on")
    assert res["checks"]["ops"] and all(c["status"] == "pass" for c in res["checks"]["ops"])
    assert "not judged" in first.stdout and "guard update-thresholds --from" in first.stdout
    assert "not judged" in (out / "report.md").read_text()
    (notice,) = [line for line in first.stdout.splitlines() if line.startswith("notice: TTFT not judged")]
    steps = re.findall(r"`([^`]+)`", notice)
    assert [s.split()[0] for s in steps] == ["cp", "guard", "guard"], steps
    subprocess.run(shlex.split(steps[0]), cwd=tmp_path, check=True)
    update = run_guard(*shlex.split(steps[1])[1:], cwd=tmp_path)
    assert update.returncode == 0, update.stdout[-2000:] + update.stderr[-2000:]
    local_p50 = yaml.safe_load((folder / "local.yaml").read_text())["profiles"]["cpu"]["budgets"]["ttft_ms"]["p50"]
    last = run_guard(*shlex.split(steps[2])[1:], cwd=tmp_path)  # as printed: results in ./guard-results
    res = results_of(tmp_path / "guard-results")
    (ttft,) = res["checks"]["ttft"]
    assert ttft["budget_ms"] == local_p50 and ttft["status"] != "not_judged"  # judged against the local budget
    assert not any(r["kind"].startswith("census") for r in res["judged_invalid_reasons"])  # its baselines resolved beside the copy
    if last.returncode == 3:  # only the machine's speed may stand in the way, never the recipe
        assert res["judged_invalid_reasons"] and all(r["kind"] == "slow_machine" for r in res["judged_invalid_reasons"])
    else:
        assert last.returncode == 0, last.stdout[-3000:] + last.stderr[-2000:]
        assert res["verdict"] == "pass" and ttft["status"] in ("pass", "inconclusive")
