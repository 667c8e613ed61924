"""The Buildkite poster posts only for the build that triggered it (issue #57): the pull request,
commit and head repository come from Buildkite's record of the triggering build, read through its
REST API, never from what the measured pipeline (the pull request's own YAML) set or uploaded.

Real `guard comment --buildkite-measuring-pipeline` through the CLI, its real HTTP client against
the local Buildkite API of tests/fakes/buildkite.py (a second real HTTP server) and real github3.py
against the local GitHub of tests/fakes/github.py; the results are a real guard pr run
(tests/fixtures/pr/mask-loop.results.json)."""

from __future__ import annotations

import shutil

import pytest
from pytest_httpserver import HTTPServer

from tests.conftest import REPO
from tests.fakes.buildkite import ORG, TOKEN as BK_TOKEN, FakeBuildkite
from tests.test_comment import HEAD, OTHER, clean_env, fake, gh_env, guard  # noqa: F401

MASK_LOOP = REPO / "tests" / "fixtures" / "pr" / "mask-loop.results.json"
POSTER, MEASURING = "vllm-guard-post", "ci"


@pytest.fixture
def buildkite():
    server = HTTPServer()
    server.start()
    try:
        yield FakeBuildkite(server)
    finally:
        server.clear()
        server.stop()


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    root = tmp_path / "guard-checkout"
    shutil.copytree(REPO / "thresholds", root / "thresholds")
    monkeypatch.chdir(root)
    return root


def measured(bk: FakeBuildkite, number: int, commit: str, pr: int, claims: tuple[str, str] | None = None,
             results: bool = True) -> None:
    """A build of the measuring pipeline for pull request ``pr`` at ``commit``, and what it uploaded
    (``claims``: the PR number and head SHA its artifact names; its own by default)."""
    bk.build(MEASURING, number, commit, pr=pr)
    pr_text, sha_text = claims or (str(pr), commit)
    if results:
        bk.upload(MEASURING, number, "guard-results/results.json", MASK_LOOP.read_bytes())
    bk.upload(MEASURING, number, "guard-pr/pr_number.txt", pr_text + "\n")
    bk.upload(MEASURING, number, "guard-pr/head_sha.txt", sha_text + "\n")


def poster_env(monkeypatch, bk: FakeBuildkite, number: int, build_id: str | None = None) -> None:
    own = bk.builds[(POSTER, number)]
    for k, v in {"BUILDKITE_API_TOKEN": BK_TOKEN, "BUILDKITE_API_URL": bk.base, "BUILDKITE_ORGANIZATION_SLUG": ORG,
                 "BUILDKITE_PIPELINE_SLUG": POSTER, "BUILDKITE_BUILD_NUMBER": str(number),
                 "BUILDKITE_BUILD_ID": build_id or own["id"]}.items():
        monkeypatch.setenv(k, v)


def post(guard, *extra):
    return guard("--buildkite-measuring-pipeline", MEASURING, "--trusted-thresholds", "thresholds/deepseek-ocr-2.yaml",
                 *extra)


def test_the_poster_posts_the_triggering_builds_verdict_on_its_pull_request(gh_env, buildkite, guard, checkout,
                                                                            monkeypatch):
    measured(buildkite, 100, HEAD, 7)
    buildkite.build(POSTER, 5, HEAD, triggered_from=(MEASURING, 100))
    poster_env(monkeypatch, buildkite, 5)
    code, out, err = post(guard)
    assert code == 0, err
    assert f"measured by {MEASURING} build 100 (pull request #7 from contrib/guarded, commit {HEAD[:12]})" in out
    [(sha, status)] = gh_env.statuses
    assert sha == HEAD and status["state"] == "failure"
    assert status["target_url"] == f"https://buildkite.example/{ORG}/{MEASURING}/builds/100"
    assert len(gh_env.comments[7]) == 1


def test_a_pull_requests_build_cannot_post_on_another_pull_requests_commit(gh_env, buildkite, guard, checkout,
                                                                          monkeypatch):
    """PR #8's own pipeline uploads an artifact naming PR #7 and its head commit, and starts the poster."""
    measured(buildkite, 101, OTHER, 8, claims=("7", HEAD))
    buildkite.build(POSTER, 6, OTHER, triggered_from=(MEASURING, 101))
    poster_env(monkeypatch, buildkite, 6)
    code, out, err = post(guard)
    assert code == 2
    assert "names pull request #7, but Buildkite built #8" in err
    assert gh_env.writes() == [] and gh_env.statuses == [] and gh_env.comments[7] == []


def test_an_artifact_naming_the_right_pr_but_another_commit_posts_nothing(gh_env, buildkite, guard, checkout,
                                                                         monkeypatch):
    measured(buildkite, 102, OTHER, 7, claims=("7", HEAD))  # built OTHER, claims HEAD
    buildkite.build(POSTER, 7, OTHER, triggered_from=(MEASURING, 102))
    poster_env(monkeypatch, buildkite, 7)
    code, _, err = post(guard)
    assert code == 2 and "does not belong to the run" in err
    assert gh_env.writes() == []


def test_a_poster_started_from_another_pipeline_posts_nothing(gh_env, buildkite, guard, checkout, monkeypatch):
    buildkite.build("someones-fork", 3, HEAD, pr=7)
    buildkite.build(POSTER, 8, HEAD, triggered_from=("someones-fork", 3))
    poster_env(monkeypatch, buildkite, 8)
    code, out, err = post(guard)
    assert code == 2 and "not the measuring pipeline ci" in err and "nothing posted" in out
    assert gh_env.log == []  # GitHub is not even asked


def test_a_poster_whose_build_id_is_not_buildkites_record_posts_nothing(gh_env, buildkite, guard, checkout,
                                                                       monkeypatch):
    measured(buildkite, 103, HEAD, 7)
    buildkite.build(POSTER, 9, HEAD, triggered_from=(MEASURING, 103))
    poster_env(monkeypatch, buildkite, 9, build_id="00000000-0000-0000-0000-000000000000")
    code, _, err = post(guard)
    assert code == 2 and "not this job's BUILDKITE_BUILD_ID" in err
    assert gh_env.log == []


def test_a_poster_not_started_by_a_trigger_posts_nothing(gh_env, buildkite, guard, checkout, monkeypatch):
    buildkite.build(POSTER, 10, HEAD, source="ui")
    poster_env(monkeypatch, buildkite, 10)
    code, _, err = post(guard)
    assert code == 2 and "not started by a trigger step" in err
    assert gh_env.log == []


def test_flags_that_would_name_the_target_are_refused(gh_env, buildkite, guard, checkout, monkeypatch):
    code, _, err = post(guard, "--sha", OTHER)
    assert code == 2 and "from Buildkite's records" in err


def test_a_measured_build_that_left_no_results_gets_an_error_status_on_its_own_commit(gh_env, buildkite, guard,
                                                                                    checkout, monkeypatch):
    measured(buildkite, 104, HEAD, 7, results=False)
    buildkite.build(POSTER, 11, HEAD, triggered_from=(MEASURING, 104))
    poster_env(monkeypatch, buildkite, 11)
    code, _, err = post(guard)
    assert code == 0, err
    [(sha, status)] = gh_env.statuses
    assert sha == HEAD and status["state"] == "error" and "build 104 ended before writing results" in status["description"]


def test_a_model_auto_build_is_posted_as_one_status_for_every_model(gh_env, buildkite, guard, checkout, monkeypatch):
    """guard-pr.sh runs guard pr --model auto: the poster takes the build's guard-results/ folder as
    one verdict, the models due worked out from GitHub's file list (guard-post.yml's flags)."""
    buildkite.build(MEASURING, 105, HEAD, pr=7)
    buildkite.upload(MEASURING, 105, "guard-results/deepseek-ocr-2/results.json", MASK_LOOP.read_bytes())
    buildkite.upload(MEASURING, 105, "guard-pr/pr_number.txt", "7\n")
    buildkite.upload(MEASURING, 105, "guard-pr/head_sha.txt", HEAD + "\n")
    buildkite.build(POSTER, 12, HEAD, triggered_from=(MEASURING, 105))
    poster_env(monkeypatch, buildkite, 12)
    gh_env.change(7, "vllm/model_executor/models/deepencoder2.py")
    code, _, err = guard("--buildkite-measuring-pipeline", MEASURING, "--results-dir", "guard-results",
                         "--trusted-thresholds", "thresholds/{model}.yaml")
    assert code == 0, err
    [(sha, status)] = gh_env.statuses
    assert sha == HEAD and status["context"] == "guard/cpu" and status["state"] == "failure"
    assert gh_env.comments[7][0]["body"].startswith("<!-- guard:v1 model=all profile=cpu -->")


def test_a_results_dir_outside_the_artifacts_is_refused(gh_env, buildkite, guard, checkout, monkeypatch):
    measured(buildkite, 106, HEAD, 7)
    buildkite.build(POSTER, 13, HEAD, triggered_from=(MEASURING, 106))
    poster_env(monkeypatch, buildkite, 13)
    code, _, err = guard("--buildkite-measuring-pipeline", MEASURING, "--results-dir", "../etc",
                         "--trusted-thresholds", "thresholds/{model}.yaml")
    assert code == 2 and "inside the measured build's artifacts" in err and gh_env.writes() == []
