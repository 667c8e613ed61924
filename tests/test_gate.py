"""The gate vLLM can own (issue #57): its budgets and its approvals decide, read at post time.

Real `guard comment` through the CLI, real github3.py over real HTTP to the local GitHub of
tests/fakes/github.py (pull request, files, reviews, labels and their events, collaborator
permissions, team memberships, the contents API at base and head), and a real guard pr result
(tests/fixtures/pr/mask-loop.results.json: the DeepEncoder-V2 mask loop put back, a census
regression). The head copy of the budgets that accepts the growth is written by the real
`guard update-thresholds` from that same result.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest

from guard.commands.update_thresholds import update_thresholds
from tests.conftest import REPO
from tests.test_comment import (FORK, HEAD, artifact, clean_env, fake, gh_env, guard)  # noqa: F401
from tests.workflow_commands import workflow_argv

MASK_LOOP = REPO / "tests" / "fixtures" / "pr" / "mask-loop.results.json"  # a real guard pr run: regression
BASE = "e" * 40  # the pull request's base commit as the fake GitHub reports it
IN_REPO = ".buildkite/guard/deepseek-ocr-2.yaml"
GUARDS_OWN = "thresholds/deepseek-ocr-2.yaml"


def shipped_budgets() -> dict[str, str]:
    """guard's shipped budget file and the census baselines it names, at vLLM's in-repo folder."""
    out = {}
    for f in sorted((REPO / "thresholds").glob("deepseek-ocr-2*")):
        out[f".buildkite/guard/{f.name}"] = f.read_text(encoding="utf-8")
    return out


@pytest.fixture
def checkout(tmp_path, monkeypatch) -> Path:
    """The poster's checkout of guard (its own budgets: the fallback where vLLM has none)."""
    root = tmp_path / "guard-checkout"
    shutil.copytree(REPO / "thresholds", root / "thresholds")
    monkeypatch.chdir(root)
    return root


@pytest.fixture
def accepting(tmp_path) -> dict[str, str]:
    """Head's copy of the budgets after the author ran the recipe the comment gives: the real
    `guard update-thresholds --only ops|census --allow-increase` from the run's own results."""
    folder = tmp_path / "head-budgets" / ".buildkite" / "guard"
    folder.mkdir(parents=True)
    for path, text in shipped_budgets().items():
        (folder / Path(path).name).write_text(text, encoding="utf-8")
    budget = folder / "deepseek-ocr-2.yaml"
    # the fixture's run recorded the engine as it was configured then (2 GB of KV cache)
    budget.write_text(budget.read_text(encoding="utf-8").replace("cpu_kvcache_space_gb: 1\n", "cpu_kvcache_space_gb: 2\n"),
                      encoding="utf-8")
    for part in ("ops", "census"):  # the two commands of the comment's "Accept this growth"
        code = update_thresholds(results_path=MASK_LOOP, thresholds_path=budget, profile=None, headroom_pct=None,
                                 only=part, allow_increase=True, dry_run=False, out=io.StringIO())
        assert code == 0
    return {f".buildkite/guard/{f.name}": f.read_text(encoding="utf-8") for f in sorted(folder.iterdir())}


def in_repo(fake, base: dict[str, str], head: dict[str, str]) -> None:
    """The vLLM repository's files at the pull request's base and head; head's differences are its changes."""
    for path, text in base.items():
        fake.contents[(path, BASE)] = text
    for path, text in head.items():
        fake.contents[(path, HEAD)] = text
        if base.get(path) != text:
            fake.change(7, path, "modified" if path in base else "added")


def post(guard, tmp_path, *extra: str, results: Path = MASK_LOOP):
    art = tmp_path / "artifact"
    art.mkdir(exist_ok=True)
    return guard(*artifact(art, "7\n", HEAD + "\n"), "--sha", HEAD, "--expected-head-repo", FORK,
                 "--thresholds-in-repo", ".buildkite/guard/{model}.yaml", "--trusted-thresholds", GUARDS_OWN, *extra,
                 results=results)


def only_status(fake) -> dict:
    [(sha, status)] = fake.statuses
    assert sha == HEAD
    return status


# ----------------------------------------------------------------------------- whose budgets judge
def test_base_copy_in_vllms_tree_judges_and_the_status_says_whose(gh_env, guard, tmp_path, checkout):
    in_repo(gh_env, shipped_budgets(), shipped_budgets())
    code, out, err = post(guard, tmp_path)
    assert code == 0, err
    status = only_status(gh_env)
    assert status["state"] == "failure" and status["description"].startswith("vLLM's budgets: 6 of 6 budgets exceeded"), status
    assert f"vLLM's {IN_REPO} at base {BASE[:12]}" in out
    [c] = gh_env.comments[7]
    assert "Accept this growth" in c["body"]
    for part in ("ops", "census"):
        assert f"--thresholds {IN_REPO} --only {part} --allow-increase" in c["body"]
    assert ("/repos/acme/guarded/contents/" + IN_REPO, BASE) in {(x.path, x.query.get("ref")) for x in gh_env.log}


def test_where_vllm_has_no_budget_file_guards_own_judges_and_says_so(gh_env, guard, tmp_path, checkout):
    code, out, err = post(guard, tmp_path)
    assert code == 0, err
    status = only_status(gh_env)
    assert status["state"] == "failure" and "guard's budgets (vLLM has none)" in status["description"]
    assert f"guard's own {GUARDS_OWN}" in out


def test_a_budget_change_nobody_accepted_is_judged_by_base_and_says_how_to_accept(gh_env, guard, tmp_path, checkout,
                                                                                 accepting):
    in_repo(gh_env, shipped_budgets(), accepting)
    code, _, err = post(guard, tmp_path)
    assert code == 0, err
    assert only_status(gh_env)["state"] == "failure"  # base's copy: the growth still fails
    [c] = gh_env.comments[7]
    body = c["body"]
    assert "changes guard's budgets in vLLM's tree" in body and "base's copy judged it" in body
    assert "`guard: accept`" in body and "code owner" in body
    assert "census" in body  # the lines that say what head's copy would change


def test_a_label_by_someone_without_write_permission_is_ignored_and_the_comment_says_why(gh_env, guard, tmp_path,
                                                                                        checkout, accepting):
    in_repo(gh_env, shipped_budgets(), accepting)
    gh_env.permissions["contrib"] = "read"
    gh_env.label(7, "guard: accept", "contrib")  # the author labels their own pull request
    code, _, err = post(guard, tmp_path)
    assert code == 0, err
    status = only_status(gh_env)
    assert status["state"] == "failure" and "accepted" not in status["description"]
    [c] = gh_env.comments[7]
    assert "Not counted: label `guard: accept` was applied by @contrib, whose permission is read" in c["body"]


def test_a_writers_label_makes_heads_copy_judge_and_the_status_names_who_accepted(gh_env, guard, tmp_path, checkout,
                                                                                 accepting):
    in_repo(gh_env, shipped_budgets(), accepting)
    gh_env.permissions["contrib"] = "read"
    gh_env.permissions["maintainer"] = "write"
    gh_env.label(7, "guard: accept", "contrib")
    gh_env.label(7, "guard: accept", "contrib", event="unlabeled")
    gh_env.label(7, "guard: accept", "maintainer")  # the latest application is what counts
    code, out, err = post(guard, tmp_path)
    assert code == 0, err
    status = only_status(gh_env)
    assert status["state"] == "success", status
    assert "accepted by @maintainer" in status["description"]
    assert f"at head {HEAD[:12]}, accepted by @maintainer (label `guard: accept`, applied with write permission)" in out
    [c] = gh_env.comments[7]  # accepted growth is still news on the pull request
    assert "Budget change accepted" in c["body"] and "@maintainer" in c["body"]


def test_a_label_applied_by_a_writer_then_reapplied_by_a_reader_does_not_count(gh_env, guard, tmp_path, checkout,
                                                                              accepting):
    in_repo(gh_env, shipped_budgets(), accepting)
    gh_env.permissions.update(maintainer="write", contrib="read")
    gh_env.label(7, "guard: accept", "maintainer")
    gh_env.label(7, "guard: accept", "maintainer", event="unlabeled")
    gh_env.label(7, "guard: accept", "contrib")
    code, _, err = post(guard, tmp_path)
    assert code == 0, err
    assert only_status(gh_env)["state"] == "failure"


@pytest.mark.parametrize("owners, reviewer, teams, commit, accepted", [
    ("@alice", "alice", {}, HEAD, True),
    ("@vllm-project/perf", "bob", {"vllm-project/perf": {"bob"}}, HEAD, True),
    ("@alice", "bob", {}, HEAD, False),  # not a code owner of the budget file
    ("@alice", "alice", {}, "9" * 40, False),  # approved an older commit
])
def test_a_code_owners_approval_of_the_head_commit_accepts(gh_env, guard, tmp_path, checkout, accepting, owners,
                                                           reviewer, teams, commit, accepted):
    in_repo(gh_env, {**shipped_budgets(), ".github/CODEOWNERS": f"* @someone-else\n/.buildkite/guard/ {owners}\n"},
            accepting)
    gh_env.teams.update(teams)
    gh_env.review(7, reviewer, "APPROVED", commit, "MEMBER")
    code, _, err = post(guard, tmp_path)
    assert code == 0, err
    status = only_status(gh_env)
    assert (status["state"] == "success") is accepted, status
    assert (f"accepted by @{reviewer}" in status["description"]) is accepted


# ----------------------------------------------------------------------------- protected paths, checked first
def test_a_pr_changing_vllms_ci_needs_a_maintainers_approved_run(gh_env, guard, tmp_path, checkout):
    in_repo(gh_env, shipped_budgets(), shipped_budgets())
    gh_env.change(7, ".buildkite/guard/guard-pr.sh")
    code, _, err = post(guard, tmp_path)
    assert code == 0, err
    status = only_status(gh_env)
    assert status["state"] == "error" and "needs a run approved by a maintainer" in status["description"]


def test_an_artifact_judged_by_other_rules_still_gets_the_protected_status(gh_env, guard, tmp_path, checkout):
    """A pull request that changes the judging code: its run's verdict does not re-judge here (exit 2
    before this change, and nothing posted); the status must still say what it needs."""
    import json

    d = json.loads(MASK_LOOP.read_text(encoding="utf-8"))
    d["verdict"] = "pass"  # what a changed judge might have said
    claimed = tmp_path / "results.json"
    claimed.write_text(json.dumps(d), encoding="utf-8")
    in_repo(gh_env, shipped_budgets(), shipped_budgets())
    gh_env.change(7, ".github/workflows/guard.yml")
    code, out, err = post(guard, tmp_path, results=claimed)
    assert code == 0, err
    status = only_status(gh_env)
    assert status["state"] == "error" and "needs a run approved by a maintainer" in status["description"]
    [c] = gh_env.comments[7]
    assert ".github/workflows/guard.yml" in c["body"] and "could not be judged again" in c["body"]


def test_without_protected_changes_an_inconsistent_artifact_posts_nothing(gh_env, guard, tmp_path, checkout):
    import json

    d = json.loads(MASK_LOOP.read_text(encoding="utf-8"))
    d["verdict"] = "pass"
    claimed = tmp_path / "results.json"
    claimed.write_text(json.dumps(d), encoding="utf-8")
    in_repo(gh_env, shipped_budgets(), shipped_budgets())
    code, _, err = post(guard, tmp_path, results=claimed)
    assert code == 2 and "Refusing to post" in err
    assert gh_env.writes() == []


# ----------------------------------------------------------------------------- one verdict for every model
def post_dir(guard, tmp_path, folder: Path, *extra: str):
    art = tmp_path / "artifact"
    art.mkdir(exist_ok=True)
    return guard(*artifact(art, "7\n", HEAD + "\n"), "--sha", HEAD, "--expected-head-repo", FORK,
                 "--results-dir", str(folder), "--trusted-thresholds", "thresholds/{model}.yaml", *extra)


@pytest.fixture
def auto_output(tmp_path) -> Path:
    """What `guard pr --model auto` leaves when it judged deepseek-ocr-2 alone: OUTPUT/<model>/results.json."""
    folder = tmp_path / "guard-results"
    (folder / "deepseek-ocr-2").mkdir(parents=True)
    shutil.copy(MASK_LOOP, folder / "deepseek-ocr-2" / "results.json")
    return folder


def test_a_model_files_change_gets_one_status_for_the_profile_and_one_comment(gh_env, guard, tmp_path, checkout,
                                                                             auto_output):
    gh_env.change(7, "vllm/model_executor/models/deepencoder2.py")  # deepseek-ocr-2's own code only
    code, _, err = post_dir(guard, tmp_path, auto_output)
    assert code == 0, err
    status = only_status(gh_env)
    assert status["context"] == "guard/cpu" and status["state"] == "failure"
    assert status["description"].startswith("1 model(s), 0 fine; deepseek-ocr-2: ")
    [c] = gh_env.comments[7]
    assert c["body"].startswith("<!-- guard:v1 model=all profile=cpu -->")
    assert "| `deepseek-ocr-2` | failure |" in c["body"] and "<details open><summary><b>deepseek-ocr-2</b>" in c["body"]


def test_a_shared_code_change_expects_every_model_and_a_missing_one_is_an_error(gh_env, guard, tmp_path, checkout,
                                                                                auto_output):
    """The poster works out which models the pull request concerns from GitHub's file list; a run
    that left only one model's results cannot pass for the others."""
    from guard.config import models

    gh_env.change(7, "vllm/multimodal/processing.py")  # shared: every model runs it
    code, _, err = post_dir(guard, tmp_path, auto_output)
    assert code == 0, err
    status = only_status(gh_env)
    assert status["context"] == "guard/cpu" and status["state"] == "error"
    [c] = gh_env.comments[7]
    missing = [m for m in models.names() if m != "deepseek-ocr-2"]
    assert len(missing) == 8
    for m in missing:
        assert f"| `{m}` | error | the pull request concerns this model, but its run left no results |" in c["body"]


def test_a_docs_only_pull_request_is_a_success_with_no_results_at_all(gh_env, guard, tmp_path, checkout):
    gh_env.change(7, "docs/usage.md")
    empty = tmp_path / "guard-results"
    empty.mkdir()
    code, _, err = post_dir(guard, tmp_path, empty)
    assert code == 0, err
    status = only_status(gh_env)
    assert status["context"] == "guard/cpu" and status["state"] == "success"
    assert status["description"].startswith("nothing guard measures changed")
    assert gh_env.comments[7] == []  # nothing to say: no comment


def test_an_empty_results_folder_cannot_hide_a_change_to_vllm(gh_env, guard, tmp_path, checkout):
    """A measuring run that skipped measuring (or lost its results) while the PR changes a model's code."""
    gh_env.change(7, "vllm/model_executor/models/deepencoder2.py")
    empty = tmp_path / "guard-results"
    empty.mkdir()
    code, _, err = post_dir(guard, tmp_path, empty)
    assert code == 0, err
    status = only_status(gh_env)
    assert status["state"] == "error" and "deepseek-ocr-2" in status["description"]


# ----------------------------------------------------------------------------- shadow mode
def test_shadow_mode_records_what_was_posted_and_who_accepted(gh_env, guard, tmp_path, checkout, accepting):
    """The poster appends each model's run as it judged it; the history job merges it into the
    branch's store once; guard history --findings reads it back as accepted by the writer."""
    import subprocess
    import sys

    in_repo(gh_env, shipped_budgets(), accepting)
    gh_env.permissions["maintainer"] = "write"
    posted = tmp_path / "posted.jsonl"
    code, out, err = post(guard, tmp_path, "--findings", str(posted), "--run-url", "https://ci.example/run/1")
    assert code == 0, err  # base's copy judges: the growth is a finding, open
    assert "deepseek-ocr-2: findings recorded on line 1" in out
    gh_env.label(7, "guard: accept", "maintainer")
    code, out, err = post(guard, tmp_path, "--findings", str(posted), "--run-url", "https://ci.example/run/2")
    assert code == 0, err  # head's copy judges now; the record keeps what was accepted
    assert "deepseek-ocr-2: findings recorded on line 2" in out
    store = tmp_path / "branch"
    exe = [str(Path(sys.executable).parent / "guard")]
    # guard-comment.yml's findings job, flag for flag
    merge = workflow_argv("guard-comment.yml", "record", {"store": str(store), "POSTED": str(posted)})
    for appended in (2, 0):  # a re-run of the history job merges nothing twice
        done = subprocess.run([*exe, *merge], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert f"{appended} of 2 run(s)" in done.stdout
    shown = subprocess.run([*exe, "history", "--findings", str(store / "findings.jsonl")], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert "@maintainer" in shown.stdout or "maintainer" in shown.stdout, shown.stdout
    assert " 0 accepted" not in shown.stdout and "accepted" in shown.stdout, shown.stdout


def test_a_real_nine_model_run_is_one_status_and_no_comment_when_every_model_holds(gh_env, guard, tmp_path, checkout):
    """guard pr --model auto's real output for a shared-code change (tests/fixtures/pr/auto-shared.tar.gz:
    nine models, every one passing): one status for all of them, nothing to comment."""
    import tarfile

    from guard.config import models

    folder = tmp_path / "guard-results"
    with tarfile.open(REPO / "tests" / "fixtures" / "pr" / "auto-shared.tar.gz") as tar:
        tar.extractall(folder, filter="data")
    gh_env.change(7, "vllm/multimodal/__init__.py")
    code, out, err = post_dir(guard, tmp_path, folder)
    assert code == 0, err
    status = only_status(gh_env)
    assert status["context"] == "guard/cpu" and status["state"] == "success", status
    assert status["description"] == f"{len(models.names())} model(s), {len(models.names())} fine"
    assert gh_env.comments[7] == []
    assert "no finding: no comment posted" in out
