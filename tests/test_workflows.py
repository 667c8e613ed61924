"""The GitHub workflows: valid against GitHub's schema, clean under zizmor (offline), and holding the
properties that make the perf-guard / perf-guard-comment split safe for fork pull requests."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
FILES = ["perf-guard.yml", "perf-guard-comment.yml", "ci.yml", "guard-history.yml", "guard-cpu.yml", "guard-gpu.yml", "guard-main.yml",
         "guard-comment.yml"]
PINNED = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40} # v\d+(\.\d+)*$")


def tool(name: str) -> str:
    """A dev-group console script from this interpreter's environment (never a global one)."""
    path = Path(sys.executable).parent / name
    found = str(path) if path.exists() else shutil.which(name)
    assert found, f"{name} is missing: run `uv sync --extra cpu` (it is in the dev dependency group)"
    return found


def load(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text(encoding="utf-8"))
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def steps(wf: dict) -> list[dict]:
    return [s for job in wf["jobs"].values() for s in job.get("steps", [])]


def test_workflows_match_githubs_schema():
    proc = subprocess.run([tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows",
                           *(str(WORKFLOWS / f) for f in FILES)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_zizmor_offline_has_no_findings_above_low():
    proc = subprocess.run([tool("zizmor"), "--offline", "--no-progress", "--format", "json",
                           "--min-severity", "medium", str(WORKFLOWS)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout) == []


def test_the_only_zizmor_suppression_is_the_reviewed_workflow_run_trigger():
    ignores = [(f, ln.strip()) for f in FILES for ln in (WORKFLOWS / f).read_text().splitlines() if "zizmor:" in ln]
    assert ignores == [("perf-guard-comment.yml",
                        "workflow_run:  # zizmor: ignore[dangerous-triggers] runs no PR code; the artifact is verified data")]


@pytest.mark.parametrize("name", FILES)
def test_actions_are_pinned_by_commit_with_a_version_comment(name):
    uses = [ln.split("uses:", 1)[1].strip() for ln in (WORKFLOWS / name).read_text().splitlines()
            if ln.strip().startswith(("uses:", "- uses:"))]
    assert uses
    for u in uses:
        assert PINNED.match(u), u


@pytest.mark.parametrize("name", FILES)
def test_no_expressions_inside_run_scripts(name):
    # template injection: data reaches scripts through env:, never spliced into the script text
    for step in steps(load(name)):
        assert "${{" not in step.get("run", ""), step


@pytest.mark.parametrize("name", FILES)
def test_checkouts_do_not_persist_credentials(name):
    checkouts = [s for s in steps(load(name)) if s.get("uses", "").startswith("actions/checkout@")]
    assert checkouts
    assert all(s["with"]["persist-credentials"] is False for s in checkouts)


def test_perf_guard_runs_pr_code_with_nothing_to_steal():
    wf = load("perf-guard.yml")
    text = (WORKFLOWS / "perf-guard.yml").read_text()
    assert wf["permissions"] == {"contents": "read"}
    assert "secrets." not in text and "github.token" not in text and "GITHUB_TOKEN" not in text
    [job] = wf["jobs"].values()
    assert "permissions" not in job
    assert job["runs-on"] == ["self-hosted", "linux", "gpu", "a10"]
    assert job["concurrency"]["cancel-in-progress"] is True
    assert set(wf["on"]["pull_request"]["paths"]) == {
        "guard/**", "thresholds/**", "tests/perf/**", "pyproject.toml", "uv.lock", ".github/workflows/perf-guard.yml"}
    assert set(wf["on"]["workflow_call"]["inputs"]) >= {"profile", "thresholds", "vllm"}
    runs = "\n".join(s.get("run", "") for s in job["steps"])
    assert "uv sync --locked --extra gpu" in runs
    assert re.search(r"uv run .*guard check --profile \"\$PROFILE\"", runs)


def test_perf_guard_uploads_results_with_pr_number_and_head_sha():
    wf = load("perf-guard.yml")
    [job] = wf["jobs"].values()
    record = next(s for s in job["steps"] if "pr_number.txt" in s.get("run", ""))
    assert record["env"] == {"PR_NUMBER": "${{ github.event.pull_request.number }}",
                             "HEAD_SHA": "${{ github.event.pull_request.head.sha }}"}
    assert "head_sha.txt" in record["run"]
    upload = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["with"]["name"] == "guard-results"
    assert upload["if"] == "${{ !cancelled() }}"  # a regression fails the check step; the results still go up
    assert upload["with"]["path"].split() == ["guard-results/", "guard-pr/"]


def test_comment_workflow_is_triggered_by_perf_guard_with_minimal_permissions():
    wf, guard_wf = load("perf-guard-comment.yml"), load("perf-guard.yml")
    assert wf["on"] == {"workflow_run": {"workflows": [guard_wf["name"]], "types": ["completed"]}}
    assert wf["permissions"] == {}
    [job] = wf["jobs"].values()
    # contents: read, or actions/checkout fails in a private repository
    assert job["permissions"] == {"contents": "read", "pull-requests": "write", "statuses": "write", "actions": "read"}
    assert job["runs-on"] == "ubuntu-latest"
    assert "'cancelled'" not in job["if"] and "conclusion == 'success'" in job["if"]  # only runs with a verdict
    assert "workflow_run.event == 'pull_request'" in job["if"]
    # `workflows:` matches by name, which a PR can reuse: only the default branch's file path counts
    assert "github.event.workflow_run.path == '.github/workflows/perf-guard.yml'" in job["if"]


NODE24_RELEASES = {  # first major that runs on Node 24
    "actions/checkout": 5, "actions/cache": 5, "actions/cache/restore": 5, "actions/cache/save": 5,
    "actions/upload-artifact": 6, "actions/download-artifact": 7, "astral-sh/setup-uv": 7}


@pytest.mark.parametrize("name", FILES)
def test_actions_are_node24_releases(name):
    for line in (WORKFLOWS / name).read_text().splitlines():
        if not line.strip().startswith(("uses:", "- uses:")):
            continue
        action, rest = line.split("uses:", 1)[1].strip().split("@", 1)
        major = int(rest.split("# v", 1)[1].split(".")[0])
        assert major >= NODE24_RELEASES[action], line


def test_a10_job_downloads_resolved_weights_and_measures_offline():
    [job] = load("perf-guard.yml")["jobs"].values()
    download = next(s for s in job["steps"] if "guard weights" in s.get("run", ""))
    check = next(s for s in job["steps"] if "guard check" in s.get("run", ""))
    assert download["env"]["HF_HOME"] == check["env"]["HF_HOME"] == "/opt/hf-cache"  # persistent, outside the workspace
    assert check["env"]["HF_HUB_OFFLINE"] == "1" and "HF_HUB_OFFLINE" not in download["env"]
    # a moving revision is resolved to a commit by guard weights (tests/test_weights.py), no longer refused
    assert job["steps"].index(download) < job["steps"].index(check)


def test_no_doc_or_workflow_uses_the_removed_huggingface_cli():
    for path in [ROOT / "README.md", *ROOT.glob("docs/*.md"), *WORKFLOWS.glob("*.yml")]:
        text = path.read_text(encoding="utf-8")
        assert "huggingface-cli download" not in text and "run huggingface-cli" not in text, path
        assert not re.search(r"^\s*(uv run [^\n]*)?huggingface-cli ", text, re.MULTILINE), path


def test_comment_workflow_never_runs_the_pull_requests_code():
    wf = load("perf-guard-comment.yml")
    [job] = wf["jobs"].values()
    checkout = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout@"))
    assert checkout["with"]["ref"] == "${{ github.event.repository.default_branch }}"
    assert "repository" not in checkout["with"]
    text = (WORKFLOWS / "perf-guard-comment.yml").read_text()
    assert "head_branch }}" not in text.split("jobs:", 1)[1]  # no PR ref is ever checked out or used in a job
    download = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/download-artifact@"))
    assert download["with"]["run-id"] == "${{ github.event.workflow_run.id }}"
    assert download["with"]["path"].startswith("${{ runner.temp }}")  # outside the checkout


def test_comment_workflow_verifies_the_artifact_against_the_triggering_run():
    wf = load("perf-guard-comment.yml")
    [job] = wf["jobs"].values()
    post = next(s for s in job["steps"] if "guard comment" in s.get("run", ""))
    assert post["env"]["RUN_HEAD_SHA"] == "${{ github.event.workflow_run.head_sha }}"
    assert post["env"]["RUN_HEAD_REPO"] == "${{ github.event.workflow_run.head_repository.full_name }}"
    assert post["env"]["GITHUB_TOKEN"] == "${{ github.token }}"
    cmd = post["run"]
    for flag in ('--pr-file "$ARTIFACT/guard-pr/pr_number.txt"', '--sha-file "$ARTIFACT/guard-pr/head_sha.txt"',
                 '--sha "$RUN_HEAD_SHA"', '--expected-head-repo "$RUN_HEAD_REPO"',
                 '--results "$ARTIFACT/guard-results/results.json"'):
        assert flag in cmd
    assert "--report" not in cmd  # the artifact's Markdown is not trusted; the body is re-rendered, escaped


def test_comment_workflow_flags_exist_in_guard_comment():
    from guard.commands import comment
    import argparse

    parser = argparse.ArgumentParser()
    comment.add_arguments(parser)
    known = {opt for a in parser._actions for opt in a.option_strings}
    cmd = next(s["run"] for s in steps(load("perf-guard-comment.yml")) if "guard comment" in s.get("run", ""))
    assert set(re.findall(r"--[a-z-]+", cmd)) - {"--no-sync"} <= known


def test_ci_runs_the_readme_test_command():
    wf = load("ci.yml")
    assert wf["permissions"] == {"contents": "read"}
    [job] = wf["jobs"].values()
    assert job["runs-on"] == "ubuntu-latest"
    assert [s["run"] for s in job["steps"] if "run" in s] == ["bash .ci/run"]


def test_perf_guard_runs_ab_when_a_baseline_vllm_is_given():
    wf = load("perf-guard.yml")
    assert "baseline-vllm" in wf["on"]["workflow_call"]["inputs"]
    by_name = {s.get("name"): s for s in steps(wf)}
    install = by_name["Install the baseline vLLM into its own environment (A/B)"]
    assert install["if"] == "inputs.baseline-vllm != ''"
    assert "--no-emit-project" in install["run"]  # guard is not installed into the baseline environment
    check = by_name["guard check"]
    assert '${BASELINE_PYTHON:+--baseline "$BASELINE_PYTHON"}' in check["run"]
    assert "baseline-vllm != ''" in check["env"]["BASELINE_PYTHON"]


def test_every_guard_command_a_workflow_runs_is_driven_by_a_test_with_the_workflows_own_arguments():
    """Issue #30: perf-guard-comment runs `guard comment` with --pr-file/--sha-file/--expected-head-repo,
    which switch its trust policy on (re-judging the artifact), and no test ever ran it that way, so
    re-judging a census, an A/B or a server-mode result was never exercised. Each `guard ...` a workflow
    runs must be run by a test with the arguments read from the workflow file
    (tests/workflow_commands.workflow_argv), so the flags in the test are the workflow's by construction."""
    from guard import cli
    from tests.workflow_commands import guard_invocations

    invocations = guard_invocations()
    found = {(i.workflow, i.command) for i in invocations}
    assert {("perf-guard-comment.yml", "comment"), ("perf-guard.yml", "check")} <= found, found
    sources = {p.name: p.read_text(encoding="utf-8") for p in Path(__file__).parent.glob("test_*.py")
               if p.name != Path(__file__).name}
    for inv in invocations:
        assert inv.command in cli.COMMANDS, f"{inv.workflow} '{inv.step}' runs an unknown `guard {inv.command}`"
        call = f'workflow_argv("{inv.workflow}", "{inv.command}"'
        drivers = sorted(name for name, text in sources.items() if call in text)
        assert drivers, (f"no test runs `guard {inv.command}` as {inv.workflow} '{inv.step}' does: call "
                         f"tests.workflow_commands.{call}, env) and run what it returns through guard.cli.main")


@pytest.mark.parametrize("env", [
    {"PROFILE": "cpu", "THRESHOLDS": "thresholds/deepseek-ocr-2.yaml", "BASELINE_PYTHON": ""},
    {"PROFILE": "a10", "THRESHOLDS": "thresholds/deepseek-ocr-2.yaml", "BASELINE_PYTHON": ".baseline-venv/bin/python"},
    {"ARTIFACT": "/tmp/a", "RUN_HEAD_SHA": "a" * 40, "RUN_HEAD_REPO": "o/r", "RUN_URL": "https://x"},
])
def test_every_workflow_guard_command_parses_with_guards_own_parser(env):
    """Each command line a workflow runs, expanded, is accepted by guard's argument parser: no flag
    the command does not know, none misspelt, none without its value."""
    from guard import cli
    from tests.workflow_commands import guard_invocations

    parser = cli.build_parser()
    for inv in guard_invocations():
        if inv.variables <= set(env):
            args = parser.parse_args(inv.argv(env))
            assert args.command == inv.command


def test_history_workflow_measures_main_read_only_and_only_the_record_job_may_push():
    wf = load("guard-history.yml")
    assert wf["on"]["push"]["branches"] == ["main"] and wf["permissions"] == {}
    assert wf["concurrency"]["cancel-in-progress"] is False  # every push of main is recorded, in order
    measure, record = wf["jobs"]["measure"], wf["jobs"]["record"]
    assert measure["permissions"] == {"contents": "read"} and measure["runs-on"] == "ubuntu-latest"
    assert record["permissions"] == {"contents": "write"} and record["needs"] == "measure"
    runs = "\n".join(s.get("run", "") for s in measure["steps"])
    assert "uv sync --locked --extra cpu" in runs and "guard check --profile cpu" in runs
    assert '[ "$code" -le 1 ]' in runs  # a regression is history; an invalid run is not
    push = next(s for s in record["steps"] if "guard record" in s.get("run", ""))
    assert push["env"]["GITHUB_TOKEN"] == "${{ github.token }}" and push["env"]["COMMIT"] == "${{ github.sha }}"
    assert "HEAD:refs/heads/guard-history" in push["run"] and "--replace" in push["run"]
    assert "guard check" not in "\n".join(s.get("run", "") for s in record["steps"])  # the writer runs no tests


def test_history_workflow_flags_exist_in_guard_record():
    from guard.commands import record
    import argparse

    parser = argparse.ArgumentParser()
    record.add_arguments(parser)
    known = {opt for a in parser._actions for opt in a.option_strings}
    cmd = next(s["run"] for s in steps(load("guard-history.yml")) if "guard record" in s.get("run", ""))
    used = set(re.findall(r"guard record (.*?)\n\s*git ", cmd, re.S)[0].split())
    assert {u for u in used if u.startswith("--")} <= known
