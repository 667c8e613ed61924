"""End to end, A/B mode: the real `guard check --baseline`, two real vLLM engines on CPU.

Identical sides (the baseline is this environment's own interpreter, so the same vLLM): the check
passes, and results.json, the terminal and the report show both sides. Kept small: 1 warm-up and
2 measured pairs, one profiled 640x480 request per side (about 2 minutes on 2 cores); then a second
check against the same baseline reads that side's op counts from guard's cache (about 1 minute).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from guard.measure import opcache

from tests.conftest import SHIPPED_THRESHOLDS, run_guard

pytestmark = pytest.mark.engine


def small_ab_yaml(tmp_path: Path) -> Path:
    data = yaml.safe_load(SHIPPED_THRESHOLDS.read_text())
    cpu = data["profiles"]["cpu"]
    cpu["workload"].update(requests=2, warmup_requests=1, profile_image_sizes=[[640, 480]])
    cpu["statistics"] = {"confidence": 0.95}  # no resampling rounds: keep the test short
    # 2 pairs have no interval for the median: judged on the point estimate; identical sides sit
    # far below a 50 % budget whatever the machine's load does to single requests
    cpu["budgets"]["ttft_vs_baseline_pct"] = {"p50": 50}
    path = tmp_path / "budget.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_ab_with_identical_sides_passes_and_shows_both(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GUARD_CACHE_DIR", str(tmp_path / "cache"))  # the workers inherit it
    out = tmp_path / "out"
    proc = run_guard("check", "--thresholds", str(small_ab_yaml(tmp_path)), "--output", str(out),
                     "--baseline", sys.executable, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    res = json.loads((out / "results.json").read_text())
    assert res["verdict"] == "pass"
    ab = res["ab"]
    assert ab["baseline_python"] == sys.executable
    assert ab["baseline"]["environment"]["worker"]["executable"] == sys.executable
    # the baseline side's versions are what its worker reported (here the same environment's)
    for key in ("python", "vllm", "vllm_dist", "torch", "transformers", "cuda_runtime"):
        assert ab["baseline"]["environment"].get(key) == res["run"]["environment"].get(key), key  # absent: not known
    assert ab["baseline"]["environment"]["vllm"]
    assert len(ab["pairs"]) == 2 and all(p["candidate_s"] > 0 and p["baseline_s"] > 0 for p in ab["pairs"])
    assert ab["order"] == ["candidate", "baseline"]  # ABBA: the second block starts with the baseline
    # each side was stopped while the other side's requests were timed, at least that long
    for side, other in ((res["run"], ab["baseline"]), (ab["baseline"], res["run"])):
        timed = sum(o["ttft_client_s"] for o in other["outcomes"] if not o["warmup"])
        assert side["environment"]["worker"]["stopped_s"] >= timed > 0
    (ratio,) = res["checks"]["ttft_vs_baseline"]
    assert ratio["percentile"] == "p50" and ratio["budget_pct"] == 50 and ratio["pairs"] == 2
    assert ratio["candidate_ms"] > 0 and ratio["baseline_ms"] > 0
    assert ab["op_diff"] == []  # the same vLLM on both sides: not one op count differs
    assert len(ab["baseline"]["op_counts"]) == 1 and len(res["run"]["op_counts"]) == 1
    # each side counted its own census; the candidate's is judged against the baseline side's
    assert set(res["run"]["census"]) == set(ab["baseline"]["census"]) == {"640x480"}
    assert res["run"]["census"]["640x480"] == ab["baseline"]["census"]["640x480"]  # the same vLLM
    assert res["checks"]["census"] == [] and "census: " in proc.stdout and "against the baseline side" in proc.stdout
    # and each side's request mixes, the worker told each mix by the parent: the same decode steps on both
    mixes = {"greedy", "random-topk-topp", "seeded", "penalties-logprobs"}
    assert set(res["run"]["decode_census"]) == set(ab["baseline"]["decode_census"]) == mixes
    assert res["run"]["decode_census"] == ab["baseline"]["decode_census"]
    assert [c["status"] for c in res["checks"]["ttft"]] == ["not_judged"]  # absolute: shown, not judged
    # what the machine did during the pairs, with guard and both workers as "us": the engines ran
    reading = res["run"]["environment"]["cpu_contention"]
    assert reading["tree_processes"] >= 3 and reading["own_cores"] > 0.5, reading
    assert f"guard's two engines used {reading['own_cores']:.2f}" in proc.stdout
    assert "baseline" in proc.stdout and "candidate" in proc.stdout and "PASS" in proc.stdout
    report = (out / "report.md").read_text()
    assert "baseline" in report and "candidate" in report and "xychart-beta" in report
    assert (out / "worker-baseline.log").stat().st_size > 0

    # the baseline side's op-count pass was remembered for this baseline environment ...
    note = ab["baseline"]["environment"]["worker"]["op_counts_cache"]
    assert note["status"] == "stored", note
    entry = json.loads(Path(note["path"]).read_text())
    assert Path(note["path"]) == opcache.entry_path(tmp_path / "cache", note["key"])
    assert entry["schema"] == "guard/run" and entry["run"]["measures"] == "ops"  # a run record of the pass alone
    assert entry["run"]["op_counts"] == ab["baseline"]["op_counts"]
    assert entry["run"]["census"] == ab["baseline"]["census"] and entry["run"]["outcomes"] == []
    assert entry["run"]["decode_census"] == ab["baseline"]["decode_census"]

    # ... so a second check against it profiles the candidate only and reads the baseline's back
    data = yaml.safe_load(small_ab_yaml(tmp_path).read_text())
    for timing in ("ttft_vs_baseline_pct", "ttft_ms", "tpot_ms", "itl_ms", "modes", "ttft_hardware"):  # no pairs: the op-count pass is what is tested
        data["profiles"]["cpu"]["budgets"].pop(timing, None)
    second_yaml = tmp_path / "second.yaml"
    second_yaml.write_text(yaml.safe_dump(data, sort_keys=False))
    again = tmp_path / "again"
    proc = run_guard("check", "--thresholds", str(second_yaml), "--output", str(again), "--baseline", sys.executable,
                     timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    res2 = json.loads((again / "results.json").read_text())
    base2 = res2["ab"]["baseline"]
    assert base2["environment"]["worker"]["op_counts_cache"]["status"] == "hit"
    assert base2["op_counts"] == ab["baseline"]["op_counts"] and base2["census"] == ab["baseline"]["census"]
    assert base2["decode_census"] == ab["baseline"]["decode_census"]  # the mixes' decode steps came back too
    assert base2["outcomes"] == []  # no TTFT pairs and its counts cached: that side sent no request
    # ... and started no engine: its worker only said which environment it is
    assert "init_s" not in base2["environment"]["worker"] and base2["environment"]["worker"]["vllm"]
    assert "starting the candidate side's vLLM engine alone" in proc.stdout
    assert "baseline  engine ready" not in proc.stdout
    assert len(res2["run"]["op_counts"]) == 1 and res2["ab"]["op_diff"] == []  # the candidate was profiled
    assert "from guard's cache" in proc.stdout and res2["checks"]["census"] == []
