"""The model matrix on the real engine: one engine start in all (CI budget: at most one per model).

`guard check --model qwen2-5-vl --only ops` with a source mutant that reads Qwen2.5-VL's per-image
embedding sizes with one `.item()` per image (a host sync per image on a GPU, guard/measure/mutants.py
`image-item`): a valid run against the committed census baseline that exits 1, naming the function,
the watched op and the host-sync total that grew. The fast tests (test_model_matrix.py) judge the same
growth on every model's recorded census.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from guard.measure.mutants import MUTANTS
from guard.model.schema import results_schema
from tests.conftest import REPO, run_guard, skip_where_no_census_is_judged

pytestmark = pytest.mark.engine


def test_a_per_image_item_in_qwen2_5_vl_fails_the_census_naming_the_function(tmp_path: Path) -> None:
    skip_where_no_census_is_judged(REPO / "thresholds" / "qwen2-5-vl.yaml")
    m = MUTANTS["image-item"]
    out = tmp_path / "out"
    proc = run_guard("check", "--model", "qwen2.5-vl", "--only", "ops", "--output", str(out),
                     "--inject", "mutant:image-item")
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    jsonschema.Draft202012Validator(results_schema()).validate(res)
    assert res["run"]["model"] == "qwen2-5-vl" and res["verdict"] == "regression"
    failed = [c for c in res["checks"]["census"] if c["status"] == "fail"]
    assert {c["function"] for c in failed} == {m.function}
    assert {tuple(c["image_size"]) for c in failed} == {(640, 480), (800, 400)}  # one image each: +1 .item()
    for c in failed:
        grew = {d["op"]: d["delta_calls"] for d in c["op_deltas"]}
        assert grew["aten::_local_scalar_dense"] == 1 and "aten::_local_scalar_dense" in c["watched_ops"]
    # the terminal names it as the model's own code, and the host-sync line names the function
    assert m.function in proc.stdout and " model " in proc.stdout
    assert f"+1 .item() in {m.function}" in proc.stdout
    # the named vision path scope sees the .item() too. Its cap is the count recorded without AMX (10);
    # with AMX vLLM's GEMM path issues none of those, so there the cap leaves room and the census,
    # exact for each kernel set, is what fails it (above)
    ops = {(o["scope"], o["op"], tuple(o["image_size"])): o for o in res["checks"]["ops"]}
    item = ops[("vision_path", "aten::_local_scalar_dense", (640, 480))]
    if "amx_bf16" in (res["run"]["environment"].get("cpu_isa") or []):
        assert (item["status"], item["measured_calls"]) == ("pass", 1)
    else:
        assert item["status"] == "fail"
