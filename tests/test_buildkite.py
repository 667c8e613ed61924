"""The Buildkite examples (docs/examples/buildkite/): what can be checked without Buildkite.

No Buildkite agent, registry or vLLM CPU image here: these tests parse the pipeline YAML, check the
properties the design rests on (the measuring step runs in the per-commit CPU image with no token,
the poster is a trigger into a pipeline whose steps are not read from the repository), check the
scripts with `bash -n`, and parse every `guard` command line they run with guard's own parser."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from guard import cli

BK = Path(__file__).resolve().parent.parent / "docs" / "examples" / "buildkite"
VALUES = {"base": "a" * 40, "BUILDKITE_COMMIT": "b" * 40, "GUARD_SHA": "c" * 40, "art": "/tmp/art",
          "head_repo": "fork/vllm", "MEASURED_COMMIT": "b" * 40}


def load(name: str) -> dict:
    return yaml.safe_load((BK / name).read_text(encoding="utf-8"))


def guard_lines(text: str) -> list[list[str]]:
    """Each `guard <command> ...` line, its variables expanded ($$ is Buildkite's escaped $)."""
    out = []
    for line in text.replace("$$", "$").splitlines():
        m = re.search(r"(?:^|\s)(?:/opt/venv/bin/|uv run --no-sync )(guard\s+(pr|comment|record)\b.*)$", line)
        if m:
            words = shlex.split(re.sub(r"\$\{?(\w+)\}?", lambda v: VALUES.get(v.group(1), v.group(0)), m.group(1)))
            out.append(words[1:])
    return out


def test_the_measuring_step_runs_in_the_per_commit_cpu_image_with_no_token():
    [measure, post] = load("guard-pr.yml")["steps"]
    assert measure["depends_on"] == "image-build-cpu"  # vLLM's ":docker: Build CPU image" step
    [plugin] = measure["plugins"]
    [(name, docker)] = plugin.items()
    assert name.startswith("docker#v") and docker["image"] == "${REGISTRY}/${REPO}:${BUILDKITE_COMMIT}-cpu"
    assert docker["mount-checkout"] is True
    for text in ((BK / "guard-pr.yml").read_text(), (BK / "guard-pr.sh").read_text()):
        assert "TOKEN" not in text and "secret" not in text.lower()
    assert set(measure["artifact_paths"]) == {"guard-results/results.json", "guard-results/report.md", "guard-pr/*"}
    # the poster: a trigger into a pipeline whose steps Buildkite holds, after any outcome of the measurement
    assert post["trigger"] == "vllm-guard-post" and post["allow_dependency_failure"] is True
    assert post["depends_on"] == measure["key"]
    assert post["build"]["env"]["MEASURED_COMMIT"] == "${BUILDKITE_COMMIT}"


def test_the_scripts_are_valid_bash_and_install_guard_without_touching_the_images_vllm():
    for script in ("guard-pr.sh", "guard-main.sh"):
        subprocess.run(["bash", "-n", str(BK / script)], check=True)
        text = (BK / script).read_text()
        assert '--no-deps "guard @ git+https://github.com/OWNER/guard@${GUARD_SHA}"' in text
        installs = [ln for ln in text.splitlines() if "uv pip install" in ln]
        assert all("torch" not in ln and "vllm" not in ln for ln in installs)
    assert "git merge-base HEAD" in (BK / "guard-pr.sh").read_text()  # base: the branch point, not main's tip


@pytest.mark.parametrize(("name", "commands"), [("guard-pr.sh", ["pr"]), ("guard-main.sh", ["pr"]),
                                                ("guard-post.yml", ["comment", "comment"])])
def test_every_guard_line_parses_with_guards_parser(name, commands):
    lines = guard_lines((BK / name).read_text(encoding="utf-8"))
    assert [argv[0] for argv in lines] == commands
    parser = cli.build_parser()
    for argv in lines:
        args = parser.parse_args(argv)
        if args.command == "pr":
            assert args.only == "ops" and args.head == "b" * 40
    if name == "guard-post.yml":
        verified = lines[0]
        for flag in ("--pr-file", "--sha-file", "--sha", "--expected-head-repo", "--trusted-thresholds"):
            assert flag in verified  # the same verification as guard-comment.yml


def test_the_history_step_runs_on_main_only():
    [step] = load("guard-main.yml")["steps"]
    assert step["if"] == 'build.branch == "main" && build.pull_request.id == null'
    assert "--base \"$BUILDKITE_COMMIT^1\"" in (BK / "guard-main.sh").read_text()
