"""`guard comment` and what it posts with (guard.github: publish, rendering, client, inputs,
workflow_commands): real github3.py over real HTTP against a local imitation of the GitHub REST
endpoints it uses (pytest-httpserver), with state, so each test asserts what ended up on the "pull
request", not which functions were called.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from guard import cli
from guard.github import client, inputs, publish, rendering, workflow_commands
from guard.config.budgets import DEFAULT_THRESHOLDS
from guard.report.markdown import render_markdown
from guard.errors import ExitCode, UsageError
from guard.model.jsonfiles import load_results, results_to_dict
from guard.model.records import InvalidReason, ReasonKind, Status, Verdict
from guard.model.results import Results
from guard.model.checks import LatencyCheck
from tests.conftest import clear_github_context
from tests.fakes.github import (  # noqa: F401 - constants the tests share
    BOT, FORK, HEAD, MARK, MERGE, OTHER, OWNER, REPO, TOKEN, WRITES, Call, FakeGitHub,
)

FIXTURE = Path(__file__).parent / "fixtures" / "synthetic-a10-regression.results.json"


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No real GitHub context leaks in (or out): every test sets exactly what it needs."""
    clear_github_context(monkeypatch)


@pytest.fixture
def fake(httpserver) -> FakeGitHub:
    return FakeGitHub(httpserver)


@pytest.fixture
def gh_env(monkeypatch, fake):
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("GITHUB_REPOSITORY", f"{OWNER}/{REPO}")
    monkeypatch.setenv("GITHUB_API_URL", fake.base)
    return fake


@pytest.fixture
def guard(monkeypatch, capsys):
    """Run `guard comment ...` through the real CLI dispatch (only the comment command registered,
    so the test does not import the engine-side commands). Returns (exit code, stdout, stderr)."""
    monkeypatch.setattr(cli, "COMMANDS", {"comment": cli.COMMANDS["comment"]})

    def run(*argv: str, results: Path | str = FIXTURE) -> tuple[int, str, str]:
        code = cli.main(["comment", "--results", str(results), "--backoff-base", "0", *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def regression() -> Results:
    return load_results(FIXTURE)


def write_results(tmp_path: Path, res: Results) -> Path:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results_to_dict(res)), encoding="utf-8")
    return path


def passing(res: Results) -> Results:
    return dataclasses.replace(res, verdict=Verdict.PASS,
                               ttft_checks=tuple(dataclasses.replace(c, status=Status.PASS) for c in res.ttft_checks),
                               op_checks=tuple(dataclasses.replace(c, status=Status.PASS) for c in res.op_checks))


# ----------------------------------------------------------------------------- the sticky comment
def test_first_run_creates_the_comment_and_sets_the_status_on_the_head_sha(gh_env, guard):
    code, out, err = guard("--pr", "7", "--run-url", "https://github.example/acme/guarded/actions/runs/9")
    assert code == 0, err  # a regression verdict is still a successful publish
    [c] = gh_env.comments[7]
    assert c["login"] == BOT
    assert c["body"].splitlines()[0] == MARK
    assert "## ❌ guard: regression" in c["body"]
    assert "[workflow run](https://github.example/acme/guarded/actions/runs/9)" in c["body"]
    [(sha, status)] = gh_env.statuses
    assert sha == HEAD and sha != MERGE
    assert status == {"state": "failure", "context": "guard/deepseek-ocr-2/a10",
                      "description": status["description"], "target_url": "https://github.example/acme/guarded/actions/runs/9"}
    assert status["description"].startswith("5 of 6 budgets exceeded: ttft p50, ttft p99, mask_path [1024x1024] aten::")
    assert "comment created" in out and f"status failure 'guard/deepseek-ocr-2/a10' on {HEAD}" in out


def test_second_run_edits_the_same_comment_in_place(gh_env, guard, tmp_path, regression):
    assert guard("--pr", "7")[0] == 0
    [first] = gh_env.comments[7]
    first_id = first["id"]
    fewer = dataclasses.replace(regression, op_checks=tuple(dataclasses.replace(c, status=Status.PASS)
                                                           for c in regression.op_checks))
    code, out, _ = guard("--pr", "7", results=write_results(tmp_path, fewer))
    assert code == 0
    [c] = gh_env.comments[7]
    assert c["id"] == first_id
    assert "## ❌ guard: regression" in c["body"] and c["body"].startswith(MARK) and "code path" not in c["body"]
    assert [x.method for x in gh_env.writes()] == ["POST", "POST", "PATCH", "POST"]  # comment, status, edit, status
    assert [s["state"] for _, s in gh_env.statuses] == ["failure", "failure"]
    assert "comment updated" in out


def test_unchanged_body_is_not_rewritten(gh_env, guard):
    guard("--pr", "7")
    guard("--pr", "7")
    assert [x.method for x in gh_env.writes()] == ["POST", "POST", "POST"]  # no PATCH the second time


def test_another_authors_comment_with_the_same_marker_is_left_alone(gh_env, guard):
    theirs = gh_env.add_comment(7, "mallory", f"{MARK}\nlooks like guard, is not")
    code, _, _ = guard("--pr", "7")
    assert code == 0
    by_id = {c["id"]: c for c in gh_env.comments[7]}
    assert by_id[theirs]["body"] == f"{MARK}\nlooks like guard, is not"
    assert len(by_id) == 2
    assert not [x for x in gh_env.writes() if x.path.endswith(f"/comments/{theirs}")]


def test_finds_its_comment_past_the_first_page(gh_env, guard):
    for i in range(140):
        gh_env.add_comment(7, "reviewer", f"comment {i}")
    ours = gh_env.add_comment(7, BOT, f"{MARK}\nold report")
    for i in range(20):
        gh_env.add_comment(7, "reviewer", f"later {i}")
    code, out, _ = guard("--pr", "7")
    assert code == 0
    assert len(gh_env.comments[7]) == 161  # edited, not added
    assert [c for c in gh_env.comments[7] if c["id"] == ours][0]["body"].startswith(f"{MARK}\n## ❌")
    pages = [x.query.get("page", "1") for x in gh_env.log if x.method == "GET" and x.path.endswith("/7/comments")]
    assert pages == ["1", "2"]


def test_stale_duplicates_are_deleted_keeping_the_oldest(gh_env, guard):
    keep = gh_env.add_comment(7, BOT, f"{MARK}\nfirst")
    other_profile = gh_env.add_comment(7, BOT, "<!-- guard:v1 model=deepseek-ocr-2 profile=cpu -->\ncpu report")
    dup1 = gh_env.add_comment(7, BOT, f"{MARK}\nsecond")
    dup2 = gh_env.add_comment(7, BOT, f"{MARK}\r\nthird")
    # the same bot quoting the marker further down (an older tool, a reply): not ours, never touched
    quoting = gh_env.add_comment(7, BOT, f"note\r\n{MARK}\r\nquoted")
    code, out, _ = guard("--pr", "7")
    assert code == 0
    ids = [c["id"] for c in gh_env.comments[7]]
    assert ids == [keep, other_profile, quoting]
    assert gh_env.comments[7][2]["body"] == f"note\r\n{MARK}\r\nquoted"
    assert {x.path for x in gh_env.writes() if x.method == "DELETE"} == {
        f"/repos/{OWNER}/{REPO}/issues/comments/{dup1}", f"/repos/{OWNER}/{REPO}/issues/comments/{dup2}"}
    assert "deleted 2 stale duplicate(s)" in out


def test_author_flag_selects_whose_comments_are_ours(gh_env, guard):
    pat_comment = gh_env.add_comment(7, "perf-bot", f"{MARK}\nold")
    assert guard("--pr", "7", "--author", "perf-bot")[0] == 0
    # the fake posts as github-actions[bot]; what matters here is that perf-bot's was the one edited
    assert [c for c in gh_env.comments[7] if c["id"] == pat_comment][0]["body"].startswith(f"{MARK}\n## ❌")
    assert len(gh_env.comments[7]) == 1


def test_marker_text_is_pinned():
    # Changing this breaks the link to every comment already posted: bump MARKER_VERSION on purpose only.
    assert rendering.marker("deepseek-ocr-2", "a10") == "<!-- guard:v1 model=deepseek-ocr-2 profile=a10 -->"
    assert rendering.marker("evil --> <b>", "a10") == "<!-- guard:v1 model=evil_--___b_ profile=a10 -->"


# ----------------------------------------------------------------------------- GitHub failing
def test_read_only_token_warns_and_exits_0(gh_env, guard):
    gh_env.read_only = True
    code, out, err = guard("--pr", "7")
    assert code == 0
    assert gh_env.comments[7] == [] and gh_env.statuses == []
    assert "::warning title=guard comment%3A not published::GitHub refused to create the comment (403" in out
    assert "fork" in out and "exits 0" in out


@pytest.mark.parametrize("mode", ["results", "no-results"])
def test_a_token_that_may_not_even_read_is_a_configuration_error_not_a_fork_warning(gh_env, guard, mode):
    """A fork PR's read-only token still reads: a 403 on the read means nothing can be posted, and
    exit 0 with the fork explanation would hide a workflow that never posts."""
    read = rf"/repos/{OWNER}/{REPO}/pulls/7" if mode == "results" else rf"/repos/{OWNER}/{REPO}"
    gh_env.fail("GET", read, 403)
    argv = ("--pr", "7") if mode == "results" else ("--no-results", "cancelled", "--model", "deepseek-ocr-2",
                                                    "--profile", "cpu", "--sha", HEAD)
    code, out, err = guard(*argv)
    assert code == ExitCode.CONFIG and "may not even read here" in err and "permissions" in err, out + err
    assert gh_env.writes() == [] and "fork" not in out


def test_server_error_then_success_is_retried(gh_env, guard):
    gh_env.fail("POST", rf"/repos/{OWNER}/{REPO}/issues/7/comments", 500)
    code, out, _ = guard("--pr", "7")
    assert code == 0
    assert len(gh_env.comments[7]) == 1
    assert "retried POST" in out and "500 server error" in out


def test_persistent_server_error_is_exit_4_after_bounded_retries(gh_env, guard):
    gh_env.fail("POST", rf"/repos/{OWNER}/{REPO}/statuses/{HEAD}", 502, times=10)
    code, out, err = guard("--pr", "7", "--max-attempts", "3")
    assert code == ExitCode.GITHUB == 4
    assert "502" in err and "commit status" in err
    assert len([x for x in gh_env.log if x.path.endswith(f"/statuses/{HEAD}")]) == 3
    assert len(gh_env.comments[7]) == 1  # the comment was still posted: one failure does not stop the other


@pytest.mark.parametrize(("method", "path", "body"), [
    ("GET", rf"/repos/{OWNER}/{REPO}/pulls/7", ["not", "a", "pull request"]),
    ("GET", rf"/repos/{OWNER}/{REPO}/issues/7/comments", {"not": "a list"}),
    ("POST", rf"/repos/{OWNER}/{REPO}/statuses/{HEAD}", []),
], ids=["pull request", "comments", "status"])
def test_an_answer_of_the_wrong_shape_is_githubs_failure_exit_4(gh_env, guard, method, path, body):
    """github3 cannot read it: GitHub's side failed (4), never a crash (5) and never bad input (2)."""
    gh_env.misshape(method, path, body, status=201 if method == "POST" else 200)
    code, _, err = guard("--pr", "7", "--max-attempts", "1")
    assert code == ExitCode.GITHUB, err
    assert "unexpected shape" in err and "internal error" not in err


def test_a_token_read_from_a_file_with_its_line_break_still_posts(gh_env, guard, monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN + "\n")
    code, _, err = guard("--pr", "7")
    assert code == 0, err
    assert len(gh_env.comments[7]) == 1 and len(gh_env.statuses) == 1
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN[:4] + "\n" + TOKEN[4:])
    code, _, err = guard("--pr", "7")
    assert code == ExitCode.CONFIG and "GITHUB_TOKEN holds whitespace" in err


def test_429_retry_after_is_honoured(fake):
    fake.fail("POST", rf"/repos/{OWNER}/{REPO}/issues/7/comments", 429, **{"Retry-After": "7"})
    waits: list[float] = []
    gh = client.github_client(TOKEN, fake.base, retry=client.RetryPolicy(attempts=3, base_s=0.5, sleep=waits.append))
    status = rendering.CommitStatus("success", "guard/m/p", "ok")
    report = publish.publish(gh, owner=OWNER, repo=REPO, number=7, mark=MARK, body=f"{MARK}\nhi", status=status)
    assert waits == [7.0]
    assert report.errors == [] and report.comment == "created"
    assert len([x for x in fake.log if x.method == "POST" and x.path.endswith("/7/comments")]) == 2


def test_backoff_doubles_and_a_long_retry_after_is_not_sat_out(fake):
    fake.fail("POST", rf"/repos/{OWNER}/{REPO}/issues/7/comments", 503, times=2)
    fake.fail("POST", rf"/repos/{OWNER}/{REPO}/statuses/{HEAD}", 429, **{"Retry-After": "3600"})
    waits: list[float] = []
    gh = client.github_client(TOKEN, fake.base, retry=client.RetryPolicy(attempts=4, base_s=0.5, sleep=waits.append))
    status = rendering.CommitStatus("success", "guard/m/p", "ok")
    report = publish.publish(gh, owner=OWNER, repo=REPO, number=7, mark=MARK, body=f"{MARK}\nhi", status=status)
    assert waits == [0.5, 1.0]  # the two 503s; the hour-long Retry-After made it give up at once
    assert report.comment == "created"
    assert len(report.errors) == 1 and "429" in report.errors[0]
    assert fake.statuses == []


def test_missing_token_is_a_usage_error(monkeypatch, fake, guard):
    monkeypatch.setenv("GITHUB_REPOSITORY", f"{OWNER}/{REPO}")
    monkeypatch.setenv("GITHUB_API_URL", fake.base)
    code, _, err = guard("--pr", "7")
    assert code == 2
    assert "GITHUB_TOKEN is not set" in err
    assert fake.log == []


def test_rejected_token_is_a_usage_error(gh_env, guard, monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "ghs_expired")
    code, _, err = guard("--pr", "7")
    assert code == 2 and "401" in err and gh_env.writes() == []


def test_unknown_pr_is_a_usage_error(gh_env, guard):
    code, _, err = guard("--pr", "99")
    assert code == 2 and "no pull request #99" in err


def test_bad_results_file_is_a_usage_error(gh_env, guard, tmp_path):
    bad = tmp_path / "results.json"
    bad.write_text("{not json", encoding="utf-8")
    code, _, err = guard("--pr", "7", results=bad)
    assert code == 2 and "not valid JSON" in err
    assert gh_env.log == []


# ----------------------------------------------------------------------------- body size, summary, annotations
def test_too_long_body_is_trimmed_with_a_note(gh_env, guard, tmp_path, regression, monkeypatch):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    huge = dataclasses.replace(regression, notices=[f"notice {i}: " + "x" * 200 for i in range(600)])
    code, _, err = guard("--pr", "7", results=write_results(tmp_path, huge))
    assert code == 0, err  # the fake, like GitHub, would have answered 422 to an over-long body
    [c] = gh_env.comments[7]
    assert len(c["body"]) <= rendering.COMMENT_LIMIT
    assert c["body"].startswith(MARK) and "Report trimmed" in c["body"]
    assert c["body"].count("<details>") == c["body"].count("</details>")
    # the job summary, with its own larger limit, keeps the whole report the note points to
    full = summary.read_text(encoding="utf-8")
    assert len(full) > rendering.COMMENT_LIMIT and "notice 599:" in full and "Report trimmed" not in full


def test_trim_body_closes_what_the_cut_left_open():
    body = MARK + "\n<details><summary>x</summary>\n\n```\n" + "\n".join("y" * 80 for _ in range(2000))
    out = rendering.trim_body(body)
    assert len(body) > rendering.COMMENT_LIMIT >= len(out)
    assert sum(ln.startswith("```") for ln in out.splitlines()) % 2 == 0
    assert out.count("<details>") == out.count("</details>")
    assert out.startswith(MARK) and "Report trimmed" in out
    assert rendering.trim_body("short") == "short"


def test_step_summary_is_appended(gh_env, guard, tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    summary.write_text("# earlier step\n", encoding="utf-8")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert guard("--pr", "7")[0] == 0
    text = summary.read_text(encoding="utf-8")
    # the one line, then (a finding) the report
    assert text.startswith("# earlier step\nguard deepseek-ocr-2 on a10: regression: 5 of 6 budgets exceeded, "
                           "2 finding(s): TTFT, mask\\_path\n\n## ❌ guard: regression")
    assert MARK not in text


def test_annotations_escape_as_the_runner_requires(regression):
    assert workflow_commands.escape_data("100% done\r\nnext") == "100%25 done%0D%0Anext"
    assert workflow_commands.escape_property("a:b,c%\n") == "a%3Ab%2Cc%25%0A"
    odd = LatencyCheck(percentile="p50,\nx:y", budget_ms=100, measured_ms=150, interval_ms=(140, 160), samples=6,
                    rounds=1, confidence=0.95, status=Status.FAIL)
    res = dataclasses.replace(regression, ttft_checks=(odd,), op_checks=(), notices=(), judged_invalid_reasons=())
    [line] = workflow_commands.annotations(res)
    assert line == ("::error title=guard%3A ttft p50%2C%0Ax%3Ay over budget::TTFT p50,%0Ax:y 150 ms is over its budget "
                    "<= 100 ms (+50.0 %25; 95 %25 interval [140, 160] ms, n=6) (deepseek-ocr-2 / a10)")


def test_annotations_one_error_per_failed_check(gh_env, guard, regression):
    code, out, _ = guard("--pr", "7")
    errors = [ln for ln in out.splitlines() if ln.startswith("::error ")]
    assert len(errors) == len(regression.failed) == 5
    assert errors[0].startswith("::error title=guard%3A ttft p50 over budget::TTFT p50 2619 ms is over its budget")
    assert any(ln.startswith("::notice title=guard notice::") for ln in out.splitlines())


def test_status_description_fits_githubs_limit(regression):
    many = tuple(dataclasses.replace(regression.ttft_checks[0], percentile=f"p{i}") for i in range(1, 41))
    st = rendering.commit_status(dataclasses.replace(regression, ttft_checks=many))
    assert st.state == "failure" and len(st.description) <= rendering.STATUS_DESCRIPTION_LIMIT
    assert rendering.commit_status(passing(regression)).state == "success"
    invalid = dataclasses.replace(regression, verdict=Verdict.INVALID, judged_invalid_reasons=(InvalidReason(ReasonKind.ENGINE, "engine died"),))
    assert (rendering.commit_status(invalid).state, rendering.commit_status(invalid).description) == \
        ("error", "invalid run: engine died")


# ----------------------------------------------------------------------------- dry run, inputs
def test_dry_run_prints_body_and_status_and_makes_no_requests(gh_env, guard, regression):
    code, out, _ = guard("--pr", "7", "--dry-run", "--run-url", "https://github.example/r/1")
    assert code == 0
    assert gh_env.log == []  # token and API URL were there; it still did not call
    report = render_markdown(regression, run_url="https://github.example/r/1", thresholds=DEFAULT_THRESHOLDS)
    assert rendering.comment_body(regression, run_url="https://github.example/r/1", report=report) in out
    assert "  state: failure\n  context: guard/deepseek-ocr-2/a10\n" in out
    assert f"  description: {rendering.commit_status(regression).description}\n" in out


def test_dry_run_needs_no_token_or_repository(monkeypatch, guard):
    code, out, _ = guard("--dry-run")
    assert code == 0 and out.count(MARK) == 1


def test_event_payload_supplies_pr_and_head_sha(gh_env, guard, tmp_path, monkeypatch):
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"pull_request": {"number": 7, "head": {"sha": HEAD, "repo": {"full_name": FORK}}}}))
    monkeypatch.setenv("GITHUB_EVENT_PATH", str(event))
    assert guard()[0] == 0
    assert len(gh_env.comments[7]) == 1 and gh_env.statuses[0][0] == HEAD


def test_enterprise_api_root_is_used_as_given(httpserver, monkeypatch, guard):
    ghe = FakeGitHub(httpserver, prefix="/api/v3")
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("GITHUB_REPOSITORY", f"{OWNER}/{REPO}")
    monkeypatch.setenv("GITHUB_API_URL", ghe.base)  # https://HOST/api/v3 on a real GHES
    assert guard("--pr", "7")[0] == 0
    assert len(ghe.comments[7]) == 1
    assert not any("/api/v3/api/v3" in c.path for c in ghe.log)


@pytest.mark.parametrize("raw", ["7abc\n", " 7\n", "7 \n", "7\n\n", "7\r\n", "+7", "-7", "0", "07", "٧", "7.0",
                                 "99999999999", "", "0x7"])
def test_pr_number_is_parsed_strictly(raw):
    with pytest.raises(UsageError) as info:
        inputs.parse_pr_number(raw)
    assert info.value.exit_code == 2


def test_pr_number_and_sha_accept_a_trailing_newline():
    assert inputs.parse_pr_number("7\n") == 7
    assert inputs.parse_sha(HEAD.upper() + "\n") == HEAD


# ----------------------------------------------------------------------------- the comment workflow's checks
def artifact(tmp_path: Path, pr: str, sha: str) -> list[str]:
    (tmp_path / "pr_number.txt").write_text(pr, encoding="utf-8")
    (tmp_path / "head_sha.txt").write_text(sha, encoding="utf-8")
    return ["--pr-file", str(tmp_path / "pr_number.txt"), "--sha-file", str(tmp_path / "head_sha.txt")]


def test_artifact_matching_the_triggering_run_is_posted(gh_env, guard, tmp_path):
    code, _, err = guard(*artifact(tmp_path, "7\n", HEAD + "\n"), "--sha", HEAD, "--expected-head-repo", FORK)
    assert code == 0, err
    assert len(gh_env.comments[7]) == 1 and gh_env.statuses[0][0] == HEAD


@pytest.mark.parametrize("pr, sha_file, sha_flag, head_repo, message", [
    ("7abc\n", HEAD, HEAD, FORK, "not a pull-request number"),
    ("7; rm -rf /\n", HEAD, HEAD, FORK, "not a pull-request number"),
    ("8\n", HEAD, HEAD, FORK, "has head " + OTHER),  # another PR than the run's
    ("7\n", OTHER, OTHER, FORK, "has head " + HEAD),  # a run of an older commit of the PR
    ("7\n", OTHER, HEAD, FORK, "does not belong"),  # artifact SHA differs from the run's
    ("7\n", "not-a-sha", HEAD, FORK, "not a full 40-character"),
    ("7\n", HEAD, HEAD, "mallory/guarded", "comes from contrib/guarded, not mallory/guarded"),
])
def test_tampered_artifact_is_refused(gh_env, guard, tmp_path, pr, sha_file, sha_flag, head_repo, message):
    code, _, err = guard(*artifact(tmp_path, pr, sha_file), "--sha", sha_flag, "--expected-head-repo", head_repo)
    assert code == 2
    assert message in err
    assert gh_env.writes() == []
    assert gh_env.comments[7] == [] and gh_env.statuses == []


def test_oversized_artifact_file_is_refused(gh_env, guard, tmp_path):
    args = artifact(tmp_path, "7" * 5000, HEAD)
    code, _, err = guard(*args, "--sha", HEAD)
    assert code == 2 and "longer than" in err and gh_env.log == []


def workflow_run_event(tmp_path: Path, head_sha: str = HEAD, head_repo: str = FORK) -> str:
    """What the runner writes for a workflow_run event of a fork PR: no pull_requests entry."""
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"workflow_run": {"head_sha": head_sha, "pull_requests": [],
                                                  "head_repository": {"full_name": head_repo}}}))
    return str(event)


def test_workflow_run_event_verifies_the_artifact_even_without_flags(gh_env, guard, tmp_path, monkeypatch):
    monkeypatch.setenv("GITHUB_EVENT_PATH", workflow_run_event(tmp_path))
    # the artifact names PR #8 with PR #8's head: consistent with itself, but not the run that triggered us
    code, _, err = guard(*artifact(tmp_path, "8\n", OTHER + "\n"))
    assert code == 2 and "does not belong" in err
    monkeypatch.setenv("GITHUB_EVENT_PATH", workflow_run_event(tmp_path, head_repo="mallory/guarded"))
    code, _, err = guard(*artifact(tmp_path, "7\n", HEAD + "\n"))
    assert code == 2 and "not mallory/guarded" in err
    assert gh_env.writes() == []
    monkeypatch.setenv("GITHUB_EVENT_PATH", workflow_run_event(tmp_path))
    assert guard(*artifact(tmp_path, "7\n", HEAD + "\n"))[0] == 0
    assert len(gh_env.comments[7]) == 1


# ----------------------------------------------------------------------------- no results (#32)
def test_no_results_posts_only_an_error_status_on_the_trusted_sha(gh_env, guard):
    code, out, _ = guard("--no-results", "the measuring run ended cancelled before writing results",
                         "--model", "deepseek-ocr-2", "--profile", "a10", "--sha", HEAD, results="/nonexistent")
    assert code == 0
    assert gh_env.statuses == [(HEAD, {"state": "error", "context": "guard/deepseek-ocr-2/a10",
                                       "description": "no results: the measuring run ended cancelled before writing results"})]
    assert gh_env.comments[7] == []


def test_not_run_is_a_success_saying_so(gh_env, guard):
    assert guard("--not-run", "label perf-a10 absent", "--model", "deepseek-ocr-2", "--profile", "a10",
                 "--sha", HEAD)[0] == 0
    [(sha, status)] = gh_env.statuses
    assert (status["state"], status["description"]) == ("success", "not run: label perf-a10 absent")


@pytest.mark.parametrize("argv", [
    ("--no-results", "x", "--model", "m", "--profile", "p"),  # no --sha
    ("--no-results", "x", "--model", "m", "--profile", "p", "--sha", HEAD, "--pr", "7"),  # a PR without results
    ("--no-results", "x", "--not-run", "y", "--model", "m", "--profile", "p", "--sha", HEAD),
    ("--not-run", "y", "--profile", "p", "--sha", HEAD),  # no --model
])
def test_no_results_refuses_incomplete_or_contradictory_arguments(gh_env, guard, argv):
    code, _, err = guard(*argv)
    assert code == 2 and gh_env.statuses == [], err


# ----------------------------------------------------------------------------- quiet comments (#40)
PR_FIXTURE = Path(__file__).parent / "fixtures" / "pr" / "mask-loop.results.json"  # a real `guard pr --only ops`
CPU_MARK = rendering.marker("deepseek-ocr-2", "cpu")
WORKFLOW = 4242  # the measuring workflow's id in the workflow_run event


def _clean_pr(res: Results, **pr_changes) -> Results:
    """The mask-loop `guard pr` run as a clean one: every check passes, nothing grew."""
    return dataclasses.replace(res, verdict=Verdict.PASS, census_checks=(), notices=(),
                               op_checks=tuple(dataclasses.replace(c, status=Status.PASS) for c in res.op_checks),
                               pr=dataclasses.replace(res.pr, **pr_changes))


def test_clean_run_posts_the_status_no_comment_and_one_summary_line(gh_env, guard, tmp_path, regression, monkeypatch):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code, out, err = guard("--pr", "7", results=write_results(tmp_path, passing(regression)))
    assert code == 0, err
    assert gh_env.comments[7] == []
    assert [(x.method, x.path) for x in gh_env.writes()] == [("POST", f"/repos/{OWNER}/{REPO}/statuses/{HEAD}")]
    assert gh_env.statuses[0][1]["state"] == "success"
    assert summary.read_text(encoding="utf-8") == "guard deepseek-ocr-2 on a10: pass: all 6 measured budgets held\n"
    assert "no finding: no comment posted" in out


def test_a_finding_creates_the_comment(gh_env, guard, tmp_path, regression):
    assert guard("--pr", "7", results=write_results(tmp_path, passing(regression)))[0] == 0
    assert gh_env.comments[7] == []
    assert guard("--pr", "7")[0] == 0  # the regression: a finding
    [c] = gh_env.comments[7]
    assert c["body"].startswith(f"{MARK}\n## ❌ guard: regression")
    assert [s["state"] for _, s in gh_env.statuses] == ["success", "failure"]


def test_the_comment_is_updated_in_place_while_findings_remain(gh_env, guard, tmp_path, regression):
    assert guard("--pr", "7")[0] == 0
    [first] = gh_env.comments[7]
    first = dict(first)
    only_ttft = dataclasses.replace(regression, op_checks=tuple(dataclasses.replace(c, status=Status.PASS)
                                                                for c in regression.op_checks))
    assert guard("--pr", "7", results=write_results(tmp_path, only_ttft))[0] == 0
    [c] = gh_env.comments[7]
    assert c["id"] == first["id"] and c["body"] != first["body"]
    assert "1 finding(s)" in c["body"] and "code path `mask_path`" not in c["body"]
    assert [x.method for x in gh_env.writes()] == ["POST", "POST", "PATCH", "POST"]


def test_resolved_once_then_later_clean_runs_leave_it_alone(gh_env, guard, tmp_path, regression):
    assert guard("--pr", "7")[0] == 0
    [first] = gh_env.comments[7]
    first = dict(first)
    clean = write_results(tmp_path, passing(regression))
    code, out, _ = guard("--pr", "7", results=clean)
    assert code == 0 and "comment resolved" in out
    [c] = gh_env.comments[7]
    assert c["id"] == first["id"]
    assert c["body"].splitlines()[:2] == [MARK, f"## ✅ guard: findings resolved in `{HEAD[:12]}`"]
    assert len(c["body"]) < 300  # short: the old report is gone
    resolved = c["body"]
    writes = len(gh_env.writes())
    for _ in range(2):  # later clean runs: the status again, the comment never
        code, out, _ = guard("--pr", "7", results=clean)
        assert code == 0 and "comment left resolved" in out
    assert [x.method for x in gh_env.writes()[writes:]] == ["POST", "POST"]
    assert gh_env.comments[7] == [c] and c["body"] == resolved
    assert [s["state"] for _, s in gh_env.statuses] == ["failure", "success", "success", "success"]
    # a finding coming back edits the same comment again, in place
    assert guard("--pr", "7")[0] == 0
    [again] = gh_env.comments[7]
    assert again["id"] == first["id"] and again["body"] == first["body"]


def test_not_measured_posts_the_status_only(gh_env, guard, tmp_path):
    nothing = _clean_pr(load_results(PR_FIXTURE), measured=False, function_changes=())
    code, out, err = guard("--pr", "7", results=write_results(tmp_path, nothing))
    assert code == 0, err
    [(sha, status)] = gh_env.statuses
    assert (sha, status["state"]) == (HEAD, "success")
    assert status["description"] == "not measured: the pull request changes nothing under vllm/"
    assert gh_env.comments[7] == []
    assert [x.method for x in gh_env.writes()] == ["POST"]


def test_a_pr_finding_is_one_entry_per_function_and_no_ab_section_for_ops_only(gh_env, guard):
    code, _, err = guard("--pr", "7", results=PR_FIXTURE)
    assert code == 0, err
    [c] = gh_env.comments[7]
    body = c["body"]
    assert body.startswith(f"{CPU_MARK}\n## ❌ guard: regression")
    assert "**6 of 6 budgets exceeded, 1 finding(s):**" in body
    # the renamed function with its loop: named once, both image sizes and both op budgets in that entry
    assert body.count("_create_custom_4d_mask") == 1
    entry = body[body.index("**1. "):body.index("Lines this pull request added inside it")]
    assert "2 → 6198 at 640×480, 4 → 13200 at 800×400" in entry
    assert "`aten::_index_put_impl_` ≤ 0: 513 at 640×480, 1091 at 800×400" in entry
    assert body.count("mask[t, image_pos] = 0") == 1  # the added lines, once, under their function
    # an ops-only run has no pairs: no A/B section, no "0 pairs"
    assert "### A/B" not in body and "0 pairs" not in body and "Operator counts that differ" not in body


def test_a_census_finding_says_what_it_would_cost_on_a_gpu_beside_its_counts(gh_env, guard, tmp_path):
    """The recorded pre-#49531 loop, judged again by this guard (which prices each change), posted:
    the estimate stands under the counts it prices, and the verdict is still the counts'."""
    from guard.config.loading import load_thresholds
    from guard.judge.rejudge import rejudge
    from tests.conftest import SHIPPED_THRESHOLDS

    stored = load_results(PR_FIXTURE)
    assert all(c.gpu_costs == () for c in stored.census_checks)  # written before guard priced a change
    fresh = rejudge(stored, load_thresholds(SHIPPED_THRESHOLDS), source="mask-loop.results.json")
    assert fresh.verdict == stored.verdict == Verdict.REGRESSION
    assert guard("--pr", "7", results=write_results(tmp_path, fresh))[0] == 0
    [c] = gh_env.comments[7]
    lines = c["body"].splitlines()
    counts = next(i for i, line in enumerate(lines) if line.startswith("- ops that grew most at 800×400:"))
    assert "+1091 aten::_index_put_impl_" in lines[counts]  # the counts stay, as they were
    assert lines[counts + 1].startswith("- on a GPU, at 800×400: ≈ +44.9 ms per request on an A10, +49.8 ms on an H100 "
                                        "(A10: 1091 index writes × 17 µs, 1094 host syncs × 12 µs, ")
    assert lines[counts + 1].endswith("; constants: estimates, see docs/gpu-cost.md)")


def test_growth_within_the_rule_in_a_function_the_pr_edited_is_a_finding(gh_env, guard, tmp_path):
    res = load_results(PR_FIXTURE)
    edited = res.pr.function_changes[0].function
    small = dataclasses.replace(res.census_checks[0], function=edited, baseline_calls=4, measured_calls=10,
                                status=Status.PASS, reason="", watched_ops=())
    elsewhere = dataclasses.replace(small, function="vllm/other.py:untouched")  # grew, but the PR did not edit it
    within = dataclasses.replace(_clean_pr(res), census_checks=(small, elsewhere))
    assert guard("--pr", "7", results=write_results(tmp_path, within))[0] == 0
    [c] = gh_env.comments[7]
    assert "1 function(s) this pull request edited grew within the census rule" in c["body"]
    assert "grew within the census rule, op calls per request: 4 → 10 at 800×400 (6 added at 800×400)" in c["body"]
    assert gh_env.statuses[0][1]["state"] == "success"
    gh_env.comments[7].clear()
    only_elsewhere = dataclasses.replace(within, census_checks=(elsewhere,))
    (tmp_path / "b").mkdir()
    assert guard("--pr", "7", results=write_results(tmp_path / "b", only_elsewhere))[0] == 0
    assert gh_env.comments[7] == []


def cancelled_event(tmp_path: Path, run_number: int = 10, conclusion: str = "cancelled") -> str:
    """The workflow_run event of a finished measuring run, as the runner writes it (fork PR: no pull_requests)."""
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"workflow_run": {
        "id": 90000 + run_number, "run_number": run_number, "workflow_id": WORKFLOW, "conclusion": conclusion,
        "head_sha": HEAD, "head_branch": "x", "pull_requests": [], "head_repository": {"full_name": FORK}}}))
    return str(event)


NO_RESULTS = ("--no-results", "the measuring run ended cancelled before writing results",
              "--model", "deepseek-ocr-2", "--profile", "cpu", "--sha", HEAD)


def test_a_cancelled_run_superseded_by_a_newer_run_of_the_same_commit_posts_nothing(gh_env, guard, tmp_path,
                                                                                   monkeypatch):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setenv("GITHUB_EVENT_PATH", cancelled_event(tmp_path, run_number=10))
    gh_env.add_run(WORKFLOW, 10, HEAD, "cancelled")
    gh_env.add_run(WORKFLOW, 11, HEAD)  # a label added: a new run of the same head, still going
    code, out, err = guard(*NO_RESULTS, results="/nonexistent")
    assert code == 0, err
    assert gh_env.writes() == [] and gh_env.statuses == [] and gh_env.comments[7] == []
    assert "superseded: run #11 of the same commit replaced it" in out
    assert "cancelled, superseded" in summary.read_text(encoding="utf-8")


def test_a_cancelled_run_whose_pr_moved_on_posts_nothing(gh_env, guard, tmp_path, monkeypatch):
    monkeypatch.setenv("GITHUB_EVENT_PATH", cancelled_event(tmp_path))
    gh_env.pulls = {7: (OTHER.replace("c", "9"), FORK, MERGE)}  # a push: the PR's head is a newer commit now
    code, out, err = guard(*NO_RESULTS, results="/nonexistent")
    assert code == 0, err
    assert gh_env.writes() == [] and gh_env.statuses == []
    assert "pull request #7 moved on to 999999999999" in out


def test_a_cancelled_run_nothing_replaced_still_posts_its_error(gh_env, guard, tmp_path, monkeypatch):
    monkeypatch.setenv("GITHUB_EVENT_PATH", cancelled_event(tmp_path, run_number=10))
    gh_env.add_run(WORKFLOW, 9, HEAD, "success")  # older runs do not supersede it
    gh_env.add_run(WORKFLOW, 10, HEAD, "cancelled")
    gh_env.add_run(WORKFLOW, 12, OTHER)  # another commit's run (another PR): not this one's
    assert guard(*NO_RESULTS, results="/nonexistent")[0] == 0
    [(sha, status)] = gh_env.statuses
    assert (sha, status["state"]) == (HEAD, "error")
    assert status["description"] == "no results: the measuring run ended cancelled before writing results"


def test_only_a_cancelled_run_can_be_superseded(gh_env, guard, tmp_path, monkeypatch):
    """A run that timed out or broke is an error even when a newer run exists: it says something went wrong."""
    monkeypatch.setenv("GITHUB_EVENT_PATH", cancelled_event(tmp_path, conclusion="timed_out"))
    gh_env.add_run(WORKFLOW, 11, HEAD)
    assert guard(*NO_RESULTS, results="/nonexistent")[0] == 0
    assert [s["state"] for _, s in gh_env.statuses] == ["error"]
    assert not [c for c in gh_env.log if "/actions/" in c.path]  # not even asked


def test_when_github_cannot_say_whether_it_was_superseded_the_error_is_posted(gh_env, guard, tmp_path, monkeypatch):
    monkeypatch.setenv("GITHUB_EVENT_PATH", cancelled_event(tmp_path))
    gh_env.add_run(WORKFLOW, 11, HEAD)
    gh_env.fail("GET", rf"/repos/{OWNER}/{REPO}/actions/workflows/{WORKFLOW}/runs", 404)
    code, out, _ = guard(*NO_RESULTS, results="/nonexistent")
    assert code == 0 and "cannot tell whether a newer run superseded" in out
    assert [s["state"] for _, s in gh_env.statuses] == ["error"]


def test_a_trusted_results_file_whose_verdict_its_own_checks_contradict_is_never_posted(gh_env, guard, tmp_path):
    """Without --check-pr-files the file is trusted, not re-judged; a verdict of 'pass' over a
    failing check is still damage, and posting it would show a green status over a red table."""
    data = json.loads(FIXTURE.read_text())
    assert data["verdict"] == "regression"
    data["verdict"] = "pass"
    lie = tmp_path / "results.json"
    lie.write_text(json.dumps(data))
    code, _, err = guard("--pr", "7", results=lie)
    assert code == ExitCode.CONFIG and "verdict: its verdict is 'pass' but its own checks" in err, err
    assert gh_env.writes() == []
