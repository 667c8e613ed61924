"""guard pr with budgets kept in the vLLM tree (--thresholds-in-repo), and a budgeted scope whose
function head renamed, without the engine: real git repositories (a small one for the budget file,
tests/vllm_repo.py's copy of the installed vLLM for the sources), the real `guard` command where it
ends before measuring, and the recorded real `guard pr` run of tests/fixtures/pr for the counts.
tests/test_e2e_pr.py runs a renamed scope on the real engine."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from guard.commands import pr as pr_command
from guard.config.loading import load_thresholds
from guard.errors import ConfigError, UsageError
from guard.judge.evaluate import evaluate_pr
from guard.measure.hardware import detect
from guard.measure.fit import select_profile
from guard.model.records import ABRecord, ReasonKind, Verdict
from guard.model.jsonfiles import load_results
from guard.revisions import git, inrepo, scopes
from tests.conftest import SHIPPED_THRESHOLDS, run_guard
from tests.pr_heads import ENC2, HEADS
from tests.vllm_repo import build, commit
from tests.vllm_repo import git as sh

FIXTURES = Path(__file__).parent / "fixtures" / "pr"
IN_REPO = ".buildkite/guard/deepseek-ocr-2.yaml"
CENSUS = ".buildkite/guard/deepseek-ocr-2.cpu.census.json"
CENSUS_F32 = ".buildkite/guard/deepseek-ocr-2.cpu.float32.census.json"
RENAMED_FN = ("vllm/model_executor/models/deepencoder2.py:CustomQwen2Decoder._create_custom_model.<locals>."
              "CustomQwen2ModelInner._build_causal_mask")


# ----------------------------------------------------------------------------- a small repository with budgets
@pytest.fixture
def small(tmp_path: Path) -> Path:
    """A git repository with a vllm/ folder and the shipped budget file committed under .buildkite/guard/,
    with its census baselines beside it (named relative to it, as the shipped file names them)."""
    repo = tmp_path / "small"
    (repo / "vllm").mkdir(parents=True)
    (repo / "vllm" / "__init__.py").write_text("")
    where = repo / ".buildkite" / "guard"
    where.mkdir(parents=True)
    for f in SHIPPED_THRESHOLDS.parent.iterdir():
        shutil.copy(f, where / f.name)
    sh(repo, "init", "-q", "-b", "main")
    sh(repo, "add", "-A")
    sh(repo, "commit", "-q", "-m", "base: budgets in the tree")
    return repo


def set_budget(repo: Path, count: int, census_note: str | None = None) -> None:
    """The working tree's budget file with mask_path's _index_put_impl_ budget at ``count``."""
    path = repo / IN_REPO
    path.write_text(path.read_text().replace("aten::_index_put_impl_: {max: 0}", f"aten::_index_put_impl_: {{max: {count}}}"))
    if census_note:
        data = json.loads((repo / CENSUS).read_text())
        data["provenance"]["note"] = census_note
        (repo / CENSUS).write_text(json.dumps(data))


def test_the_budget_file_and_its_census_baselines_come_from_the_revision_not_the_working_tree(small: Path) -> None:
    base = git.resolve(small, "main", "--base")
    set_budget(small, 100)  # uncommitted: never read
    thresholds, files = inrepo.load_at(small, base, IN_REPO, "base")
    assert files == (IN_REPO, CENSUS, CENSUS_F32)  # sorted
    assert thresholds.profiles["cpu"].ops[0].ops["aten::_index_put_impl_"].count == 0  # base's, not the edit's
    census = thresholds.profiles["cpu"].census
    root = thresholds.path.parents[2]  # the copy's repository root
    assert thresholds.path == root / IN_REPO and census.baseline == root / CENSUS
    assert census.baseline.read_bytes() == (small / CENSUS).read_bytes()  # committed, unchanged
    assert census.baseline_without_native_bf16.is_file() and census.baseline_with_amx is None


def test_a_budget_file_missing_at_base_is_a_usage_error_naming_path_and_revision(small: Path, tmp_path: Path) -> None:
    base = git.resolve(small, "main", "--base")
    with pytest.raises(UsageError, match=rf"--thresholds-in-repo ci/guard.yaml: does not exist in base main \({base.sha[:12]}\)") as exc:
        inrepo.load_at(small, base, "ci/guard.yaml", "base")
    assert "committed in base" in exc.value.hint and f"show {base.sha[:12]}:ci/guard.yaml" in exc.value.hint
    # the command: exit 2 before anything is built or measured, even when head adds the file
    head = commit(small, "add the budget file in the pull request", files={"ci/guard.yaml": (small / IN_REPO).read_text()})
    done = run_guard("pr", "--vllm-repo", str(small), "--base", "main", "--head", head, "--only", "ops",
                     "--thresholds-in-repo", "ci/guard.yaml", "--output", str(tmp_path / "out"),
                     "--cache-dir", str(tmp_path / "cache"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"ci/guard.yaml: does not exist in base main ({base.sha[:12]})" in done.stderr
    assert "hint:" in done.stderr and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("path", ["../budget.yaml", "/etc/budget.yaml", "."])
def test_a_path_outside_the_repository_is_refused(small: Path, path: str) -> None:
    with pytest.raises(UsageError, match="inside the vLLM repository"):
        inrepo.load_at(small, git.resolve(small, "main", "--base"), path, "base")


def test_a_broken_budget_file_at_base_names_the_file_as_the_repository_has_it(small: Path) -> None:
    (small / IN_REPO).write_text((small / IN_REPO).read_text().replace("schema_version: 1", "schema_version: 9"))
    sha = commit(small, "break the budget file")
    with pytest.raises(ConfigError, match=rf"^{IN_REPO} \(in base {sha} \({sha[:12]}\)\):\d+: schema_version"):
        inrepo.load_at(small, git.resolve(small, sha, "--base"), IN_REPO, "base")


def test_thresholds_and_thresholds_in_repo_are_exclusive(small: Path, tmp_path: Path) -> None:
    done = run_guard("pr", "--vllm-repo", str(small), "--base", "main", "--head", "main", "--thresholds",
                     str(SHIPPED_THRESHOLDS), "--thresholds-in-repo", IN_REPO, "--output", str(tmp_path / "o"))
    assert done.returncode == 2 and "not both" in done.stderr


def test_heads_budget_change_is_reported_for_approval_and_never_judges(small: Path, tmp_path: Path) -> None:
    base = git.resolve(small, "main", "--base")
    set_budget(small, 100, census_note="looser")
    head = commit(small, "loosen the mask budget")  # nothing under vllm/: judged without measuring
    # what the command judges with: base's copy, though head (checked out) has 100
    args = argparse.Namespace(thresholds_in_repo=IN_REPO, thresholds=pr_command.DEFAULT_THRESHOLDS,
                              vllm_repo=str(small), base="main")
    thresholds, _, in_repo = pr_command._budgets(args)
    assert in_repo == IN_REPO
    assert thresholds.profiles["cpu"].ops[0].ops["aten::_index_put_impl_"].count == 0

    done = run_guard("pr", "--vllm-repo", str(small), "--base", "main", "--head", head, "--only", "ops",
                     "--thresholds-in-repo", IN_REPO, "--output", str(tmp_path / "out"), "--cache-dir",
                     str(tmp_path / "cache"))
    assert done.returncode == 0, done.stdout + done.stderr  # the perf verdict: nothing under vllm/ changed
    assert "needs a maintainer's approval" in done.stdout
    res = load_results(tmp_path / "out" / "results.json")  # validated against the schema
    src = res.pr.budgets
    assert (src.revision, src.path, src.files) == (base.sha, IN_REPO, (IN_REPO, CENSUS, CENSUS_F32))
    assert src.head_changed_files == (CENSUS, IN_REPO)
    assert "profile cpu: op budget mask_path aten::_index_put_impl_: max 0 → max 100 calls" in src.head_changes
    assert f"{CENSUS} (named by the budget file) is changed in this pull request" in src.head_changes
    assert res.run.thresholds_path == IN_REPO  # repository-relative, not the temporary copy
    assert res.notices[0].startswith("budget change in this pull request, needs a maintainer's approval")
    assert any(n.startswith(f"budgets: {IN_REPO} as base {base.sha[:12]} has it") for n in res.notices)


def test_head_without_budget_changes_reports_none(small: Path) -> None:
    base = git.resolve(small, "main", "--base")
    head = git.resolve(small, commit(small, "docs", files={"docs/x.md": "x\n"}), "--head")
    _, files = inrepo.load_at(small, base, IN_REPO, "base")
    src = inrepo.budget_source(small, base, head, IN_REPO, files, git.changed_files(small, base, head))
    assert src.head_changed_files == () and src.head_changes == ()


def test_head_deleting_the_budget_file_is_reported(small: Path) -> None:
    base = git.resolve(small, "main", "--base")
    (small / IN_REPO).unlink()
    head = git.resolve(small, commit(small, "drop the budgets"), "--head")
    _, files = inrepo.load_at(small, base, IN_REPO, "base")
    src = inrepo.budget_source(small, base, head, IN_REPO, files, git.changed_files(small, base, head))
    assert src.head_changed_files == (IN_REPO,)
    assert src.head_changes == ("the thresholds file is deleted in this pull request",)


# ----------------------------------------------------------------------------- a scope head renamed
@pytest.fixture(scope="module")
def vllm_repo(tmp_path_factory) -> tuple[Path, git.Revision]:
    repo = build(tmp_path_factory.mktemp("pr-scopes"))
    return repo, git.resolve(repo, "main", "--base")


@pytest.fixture(scope="module")
def cpu_profile():
    return select_profile(load_thresholds(SHIPPED_THRESHOLDS), "cpu", detect(quick=True))


def recorded_sides() -> ABRecord:
    """The recorded real run's base side, and a head side that is the same run with the mask_path
    scope never entered: what a pure rename of its function measures (the census is unchanged:
    _update_causal_mask issues no op itself)."""
    res = load_results(FIXTURES / "mask-loop.results.json")
    base = res.ab.baseline
    head = dataclasses.replace(base, op_counts=[dataclasses.replace(c, entries=0, calls_by_op={}, total_calls=0, sites=())
                                                for c in base.op_counts])
    return ABRecord(candidate=head, baseline=base, baseline_python="base")


def head_of(repo: Path, name: str) -> git.Revision:
    h = HEADS[name]
    return git.resolve(repo, commit(repo, h.message, edits=h.edits, files=h.files, renames=h.renames), "--head")


def test_a_renamed_scope_function_is_named_with_its_new_name(vllm_repo, cpu_profile) -> None:
    repo, base = vllm_repo
    head = head_of(repo, "rename-mask-scope")
    gone = scopes.gone_scopes(cpu_profile, recorded_sides(), repo, base, head, git.changed_files(repo, base, head))
    reason = gone["mask_path"]
    assert reason.kind == ReasonKind.SCOPE_GONE
    assert reason.text.startswith("op budget 'mask_path' of profile 'cpu': its scope "
                                  "vllm/model_executor/models/deepencoder2.py:_update_causal_mask no longer exists in head")
    assert f"renamed to {RENAMED_FN}? (same file, its body unchanged but for the name)" in reason.text
    assert "still runs, under another name" in reason.text
    assert reason.text.endswith("(set profiles.cpu.budgets.ops.mask_path.scope.function to _build_causal_mask)")


def test_the_pr_verdict_names_the_budget_instead_of_a_scope_never_entered(vllm_repo, cpu_profile) -> None:
    repo, base = vllm_repo
    head = head_of(repo, "rename-mask-scope")
    rec = recorded_sides()
    res = load_results(FIXTURES / "mask-loop.results.json")
    judged = evaluate_pr(cpu_profile, rec, res.pr)
    assert any(r.kind == ReasonKind.SCOPE_NEVER_ENTERED for r in judged.judged_invalid_reasons)  # before
    named = pr_command._with_gone_scopes(judged, cpu_profile, rec, repo, base, head, git.changed_files(repo, base, head))
    kinds = [r.kind for r in named.judged_invalid_reasons]
    assert kinds.count(ReasonKind.SCOPE_GONE) == 1 and ReasonKind.SCOPE_NEVER_ENTERED not in kinds
    assert named.verdict == Verdict.INVALID and named.exit_code == 3


def test_a_scope_whose_function_still_exists_stays_never_entered(vllm_repo, cpu_profile) -> None:
    repo, base = vllm_repo
    head = head_of(repo, "item-loop")  # _update_causal_mask is still there: not called is not renamed
    assert scopes.gone_scopes(cpu_profile, recorded_sides(), repo, base, head, git.changed_files(repo, base, head)) == {}


def test_a_renamed_function_that_issued_ops_itself_is_found_through_the_census(vllm_repo, cpu_profile) -> None:
    """The census's moved calls name where the scope's own ops went, before any source likeness."""
    repo, base = vllm_repo
    old, new = "_create_custom_4d_mask", "_make_4d_mask"
    head = git.resolve(repo, commit(repo, "rename the mask builder", renames={ENC2: (old, new)}), "--head")
    mask = cpu_profile.ops[0]
    profile = dataclasses.replace(cpu_profile, ops=(dataclasses.replace(
        mask, scope=dataclasses.replace(mask.scope, function=old)),))
    rec = recorded_sides()
    moved = {size: {fn.replace(old, new): ops for fn, ops in fns.items()} for size, fns in rec.baseline.census.items()}
    rec = dataclasses.replace(rec, candidate=dataclasses.replace(rec.candidate, census=moved))
    reason = scopes.gone_scopes(profile, rec, repo, base, head, git.changed_files(repo, base, head))["mask_path"]
    first = reason.text.index("renamed to ")
    assert reason.text[first:].startswith(f"renamed to {RENAMED_FN.replace('_build_causal_mask', new)}? "
                                          "(4 op calls per request moved there from it)")


def test_bisect_reads_the_budget_file_as_good_has_it(small: Path, tmp_path: Path) -> None:
    good = git.resolve(small, "main", "--good")
    bad = commit(small, "docs", files={"docs/x.md": "x\n"})
    done = run_guard("bisect", "--vllm-repo", str(small), "--good", "main", "--bad", bad, "--thresholds-in-repo",
                     "ci/guard.yaml", "--output", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"--thresholds-in-repo ci/guard.yaml: does not exist in good main ({good.sha[:12]})" in done.stderr
    args = argparse.Namespace(thresholds_in_repo=IN_REPO, thresholds=pr_command.DEFAULT_THRESHOLDS,
                              vllm_repo=str(small), good=bad)
    from guard.commands.bisect import _budgets

    assert _budgets(args).profiles["cpu"].ops[0].name == "mask_path"
