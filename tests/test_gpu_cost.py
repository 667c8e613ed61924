"""benchmarks/gpu_cost.py, the calibration of guard's GPU pricing, without a GPU: its --device cpu
dry run through every step (a real subprocess, tiny counts), the clear refusal where no CUDA device
is, and the merge of a GPU's rows into a constants file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from guard.judge.pricing import COSTS_FILE, PRICED_CLASSES, load_costs, parse_costs, price
from guard.measure.canary import expected_index_puts
from guard.model.checks import CostStatus
from tests.conftest import REPO, benchmark_script

SCRIPT = REPO / "benchmarks" / "gpu_cost.py"


def run_script(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=300, cwd=REPO)


def test_a_cpu_dry_run_writes_a_constants_file_guard_can_price_with(tmp_path: Path) -> None:
    out = tmp_path / "dry.json"
    done = run_script("--device", "cpu", "--iterations", "20", "--repeats", "2", "--mask-builds", "1",
                      "--sequence-length", "16", "--output", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    table = load_costs(out)
    assert table.gpus == ("CPU (dry run)",)
    rows = [table.row("CPU (dry run)", cls) for cls in PRICED_CLASSES]
    # a dry run measures no GPU: never calibrated, and says so
    assert all(r.status == CostStatus.ESTIMATE and "dry run" in r.source and r.us_per_call > 0 for r in rows)
    loop = json.loads(out.read_text())["measured"]["mask_loop"]
    # the pre-#49531 loop at S=16: its index writes as the canary's arithmetic has them, counted by the profiler
    assert loop["index_puts"] == loop["counted_index_puts"] == expected_index_puts(16) == 17
    assert loop["class_calls"]["index_write"] == 17 and loop["ms_per_build"] > 0 and loop["predicted_ms"] > 0
    (cost,) = price({"aten::_index_put_impl_": 17, "aten::add": 3}, table)  # the file prices what it measured
    assert cost.ms_per_request == pytest.approx((17 * rows[3].us_per_call + 3 * rows[0].us_per_call) / 1000, abs=5e-4)
    assert "pre-#49531 mask, S=16" in done.stdout


def test_without_a_cuda_device_it_says_so_and_writes_nothing(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    out = tmp_path / "gpu.json"
    done = run_script("--output", str(out))
    assert done.returncode == 3  # not a crash (1), not bad arguments (2)
    assert "no CUDA device here" in done.stderr and "--device cpu for a dry run" in done.stderr
    assert "Traceback" not in done.stderr and not out.exists()


def test_a_dry_run_is_never_merged_into_the_constants(tmp_path: Path) -> None:
    done = run_script("--device", "cpu", "--output", str(tmp_path / "x.json"), "--merge-into", str(COSTS_FILE))
    assert done.returncode == 2 and "never merged" in done.stderr


def _calibrated_a10() -> list[dict]:
    return [{"gpu": "A10", "class": str(cls), "us_per_call": 3.0, "status": "calibrated",
             "source": "benchmarks/gpu_cost.py on NVIDIA A10, 2026-12-09"} for cls in PRICED_CLASSES]


def test_merging_a_gpus_rows_replaces_that_gpu_in_place_and_keeps_the_others() -> None:
    shipped = json.loads(COSTS_FILE.read_text(encoding="utf-8"))
    with benchmark_script("gpu_cost") as script:
        merged = script.merged(shipped, _calibrated_a10())
        added = script.merged(shipped, [dict(r, gpu="L4") for r in _calibrated_a10()])
    table = parse_costs(merged)
    assert table.gpus == ("A10", "H100")  # where it stood
    assert all(r.status == CostStatus.CALIBRATED for r in table.rows if r.gpu == "A10")
    assert [r for r in table.rows if r.gpu == "H100"] == [r for r in parse_costs(shipped).rows if r.gpu == "H100"]
    assert parse_costs(added).gpus == ("A10", "H100", "L4")


@pytest.mark.parametrize("device, name", [("NVIDIA A10", "A10"), ("NVIDIA H100 80GB HBM3", "H100"),
                                          ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA H100 PCIe", "H100"),
                                          ("NVIDIA A10G", "A10G"), ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090")])
def test_a_device_is_named_as_the_constants_name_gpus(device, name) -> None:
    with benchmark_script("gpu_cost") as script:
        assert script.short_name(device) == name
