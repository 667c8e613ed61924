"""`guard comment` exactly as perf-guard-comment runs it, on results.json files of real runs.

The arguments are the workflow's own (read from .github/workflows/perf-guard-comment.yml by
tests/workflow_commands.py), so the trust policy is on: the artifact's verdict is a claim, re-judged
from its run record against the default branch's thresholds file and the census baselines beside
it (guard.judge.rejudge). The results files were written by real `guard check` runs of each kind guard
has (tests/fixtures/runs/README.md says how each was made). Posting goes to the local GitHub of
tests/fakes/github.py over real HTTP; ``--dry-run`` prints the same verdict without it.

Issue #30: before these, the tests re-judged only one hand-kept a10 results file (no census, no
A/B, in-process) and ran the rest with `--check-pr-files off`, so re-judging never met a census, an
A/B result or a server-mode run, and the comment workflow posted "invalid" for a clean run and
crashed (exit 5) on a census regression and on A/B results.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from guard import cli
from guard.config.loading import load_thresholds
from guard.measure.fit import ran_bf16_fallback
from guard.judge.rejudge import judged_profile, rejudge
from guard.model.jsonfiles import load_results
from guard.model.records import ReasonKind
from tests.conftest import clear_github_context, thresholds_for_recorded_runs
from tests.fakes.github import FORK, HEAD, FakeGitHub
from tests.workflow_commands import workflow_argv

ALL_COMMANDS = dict(cli.COMMANDS)
RUNS = Path(__file__).parent / "fixtures" / "runs"
TH = "thresholds/deepseek-ocr-2.yaml"
RUN_URL = "https://github.example/acme/guarded/actions/runs/9"
CPU_MARK = "<!-- guard:v1 model=deepseek-ocr-2 profile=cpu -->"

# fixture -> (commit status, the comment's verdict line): what perf-guard-comment must post for it
POSTS = {
    "cpu-float32-clean": ("success", "## ✅ guard: pass — deepseek-ocr-2 on `cpu`"),
    "cpu-float32-mutant-token-copies": ("failure", "## ❌ guard: regression — deepseek-ocr-2 on `cpu`"),
    "cpu-bf16-ab-identical": ("success", "## ✅ guard: pass — deepseek-ocr-2 on `cpu`"),
    "cpu-float32-server": ("success", "## ✅ guard: pass — deepseek-ocr-2 on `cpu`"),
    "cpu-float32-server-url": ("success", "## ✅ guard: pass — deepseek-ocr-2 on `cpu`"),
    "cpu-bf16-busy": ("error", "## ⚠️ guard: invalid — deepseek-ocr-2 on `cpu`"),
}


def fixture(name: str) -> Path:
    return RUNS / f"{name}.json"


# ----------------------------------------------------------------------------- the workflow's setting
@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    clear_github_context(monkeypatch)
    monkeypatch.setattr(cli, "COMMANDS", {"comment": cli.COMMANDS["comment"]})  # no engine-side imports


@pytest.fixture
def checkout(tmp_path, monkeypatch) -> Path:
    """The default branch's checkout the workflow runs in: the shipped thresholds folder, YAML and
    census baselines (bfloat16 and float32) as the recorded runs were judged against
    (tests/conftest.thresholds_for_recorded_runs)."""
    root = tmp_path / "checkout"
    thresholds_for_recorded_runs(root / "thresholds")
    monkeypatch.chdir(root)
    return root


@pytest.fixture
def github(httpserver, monkeypatch) -> FakeGitHub:
    fake = FakeGitHub(httpserver)
    monkeypatch.setenv("GITHUB_TOKEN", "ghs_test_token")
    monkeypatch.setenv("GITHUB_REPOSITORY", "acme/guarded")
    monkeypatch.setenv("GITHUB_API_URL", fake.base)
    return fake


def artifact(tmp_path: Path, results: Path | dict) -> dict[str, str]:
    """The downloaded artifact as perf-guard uploads it (guard-results/, guard-pr/), and the step's env."""
    art = tmp_path / "guard-artifact"
    (art / "guard-results").mkdir(parents=True)
    (art / "guard-pr").mkdir()
    target = art / "guard-results" / "results.json"
    if isinstance(results, dict):
        target.write_text(json.dumps(results), encoding="utf-8")
    else:
        shutil.copyfile(results, target)
    (art / "guard-pr" / "pr_number.txt").write_text("7\n", encoding="utf-8")
    (art / "guard-pr" / "head_sha.txt").write_text(HEAD + "\n", encoding="utf-8")
    return {"ARTIFACT": str(art), "RUN_HEAD_SHA": HEAD, "RUN_HEAD_REPO": FORK, "RUN_URL": RUN_URL}


def comment(capsys, env: dict[str, str], *extra: str) -> tuple[int, str, str]:
    """The workflow's `guard comment` step, its arguments expanded from ``env`` as its shell would."""
    argv = workflow_argv("perf-guard-comment.yml", "comment", env)
    assert "--check-pr-files" not in argv and {"--pr-file", "--sha-file", "--expected-head-repo"} <= set(argv)
    code = cli.main([*argv, *extra])
    out, err = capsys.readouterr()
    return code, out, err


# ----------------------------------------------------------------------------- each kind of run posts its verdict
@pytest.mark.parametrize("name", sorted(POSTS))
def test_the_workflow_posts_the_verdict_of_a_real_run(name, github, checkout, tmp_path, capsys):
    state, verdict_line = POSTS[name]
    code, out, err = comment(capsys, artifact(tmp_path, fixture(name)))
    assert code == 0, err
    [(sha, status)] = github.statuses
    assert sha == HEAD
    assert status["state"] == state, status
    assert status["context"] == "guard/deepseek-ocr-2/cpu" and status["target_url"] == RUN_URL
    assert f"status {state} 'guard/deepseek-ocr-2/cpu' on {HEAD}" in out
    if state == "success":  # a clean run has no finding: the status only, no comment
        assert github.comments[7] == [] and "no finding: no comment posted" in out
        return
    [posted] = github.comments[7]
    lines = posted["body"].splitlines()
    assert lines[0] == CPU_MARK
    assert lines[1] == verdict_line


@pytest.mark.parametrize("name", sorted(POSTS))
def test_a_dry_run_prints_the_same_verdict_without_github(name, checkout, tmp_path, capsys):
    state, verdict_line = POSTS[name]
    code, out, err = comment(capsys, artifact(tmp_path, fixture(name)), "--dry-run")
    assert code == 0, err
    assert verdict_line in out.splitlines()
    assert f"  state: {state}" in out.splitlines()


@pytest.mark.parametrize("name", sorted(POSTS))
def test_re_judging_a_real_run_gives_back_its_own_checks_and_verdict(name, checkout):
    """Against the thresholds and census baselines it ran with, the default branch's guard finds
    exactly what guard check found: the same checks (same keys, measurements, statuses), the same
    reasons, the same verdict. Nothing is judged by a second path."""
    stored = load_results(fixture(name))
    fresh = rejudge(stored, load_thresholds(TH), source=name)
    assert fresh.verdict == stored.verdict
    assert fresh.checks == stored.checks
    assert fresh.invalid_reasons == stored.invalid_reasons
    assert fresh.ab == stored.ab


# ----------------------------------------------------------------------------- tampered copies are refused
def _judged(d: dict) -> list[dict]:
    c = d["checks"]
    return [x for x in (*c["ttft_vs_baseline"], *c["ops"], *c["census"], *c["ttft"]) if x["status"] != "not_judged"]


def flip_verdict(d: dict) -> str:
    d["verdict"] = "regression" if d["verdict"] == "pass" else "pass"
    return "its verdict is"


def flip_a_status(d: dict) -> str:
    """A check's status changed and the verdict with it, so the file agrees with itself."""
    if d["verdict"] == "pass":  # (a --server-url run judged nothing: its TTFT, not judged, is claimed failed)
        (_judged(d) or d["checks"]["ttft"])[0]["status"] = "fail"
        d["verdict"] = "regression"
    else:
        for c in _judged(d):
            if c["status"] == "fail":
                c["status"] = "pass"
        d["verdict"] = "pass"
    return "where the same budget and measurement give"


def change_a_measured_count(d: dict) -> str:
    c = d["checks"]
    if c["census"]:
        c["census"][0]["measured_calls"] -= 100
    elif c["ops"]:
        c["ops"][0]["measured_calls"] += 1
    elif c["ttft_vs_baseline"]:
        c["ttft_vs_baseline"][0]["measured_pct"] -= 10
    else:
        c["ttft"][0]["measured_ms"] -= 1000
    return "its run record gives"


TAMPERS = [flip_verdict, flip_a_status, change_a_measured_count]


@pytest.mark.parametrize("tamper", TAMPERS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("name", [n for n, (state, _) in sorted(POSTS.items()) if state != "error"])
def test_a_tampered_real_run_is_refused_and_nothing_posted(name, tamper, github, checkout, tmp_path, capsys):
    d = json.loads(fixture(name).read_text(encoding="utf-8"))
    expected = tamper(d)
    code, out, err = comment(capsys, artifact(tmp_path, d))
    assert code == 2, out + err
    assert expected in err and "Refusing to post" in err, err
    assert github.writes() == []  # GitHub was read (the PR, its files), nothing was written
    code, out, err = comment(capsys, artifact(tmp_path / "dry", d), "--dry-run")
    assert code == 2 and expected in err and "would post" not in out


def test_a_census_regression_hidden_by_its_artifact_is_refused(github, checkout, tmp_path, capsys):
    """The census checks the mutant failed (one per profiled image size), claimed to pass, and the
    verdict with them: a file that agrees with itself, but not with its run record's census."""
    d = json.loads(fixture("cpu-float32-mutant-token-copies").read_text(encoding="utf-8"))
    failed = [c for c in d["checks"]["census"] if c["status"] == "fail"]
    assert sorted(c["image_size"] for c in failed) == [[640, 480], [800, 400]]
    for c in failed:
        assert c["function"].endswith("DeepseekOCR2ForCausalLM._encode_global_features")
        c["status"] = "pass"
    d["verdict"] = "pass"
    code, _, err = comment(capsys, artifact(tmp_path, d))
    assert code == 2 and "_encode_global_features" in err and "says 'pass'" in err, err
    assert github.writes() == []


def test_an_ab_pair_edited_in_its_artifact_is_refused(github, checkout, tmp_path, capsys):
    d = json.loads(fixture("cpu-bf16-ab-identical").read_text(encoding="utf-8"))
    d["ab"]["pairs"][0]["candidate_s"] *= 0.5
    code, _, err = comment(capsys, artifact(tmp_path, d))
    assert code == 2 and "A/B pairs" in err, err
    assert github.writes() == []


# ----------------------------------------------------------------------------- the baselines re-judging reads
def test_a_float32_run_is_judged_against_the_float32_census_baseline(github, checkout, tmp_path, capsys):
    """The run fell back to float32 (no native bf16): re-judging swaps in the float32 engine and
    census, as guard check did; without that file in the default branch's checkout the run cannot be
    judged, and says which file it needed. The bfloat16 one is not read."""
    stored = load_results(fixture("cpu-float32-clean"))
    profile = judged_profile(stored.run, load_thresholds(TH), source="x")
    assert profile.engine.dtype == "float32"
    assert profile.census.baseline == Path("thresholds/deepseek-ocr-2.cpu.float32.census.json")
    (checkout / "thresholds" / "deepseek-ocr-2.cpu.census.json").unlink()
    assert comment(capsys, artifact(tmp_path, fixture("cpu-float32-clean")))[0] == 0
    assert github.statuses[-1][1]["state"] == "success"
    (checkout / "thresholds" / "deepseek-ocr-2.cpu.float32.census.json").unlink()
    code, _, err = comment(capsys, artifact(tmp_path / "again", fixture("cpu-float32-clean")))
    assert code == 0, err
    status = github.statuses[-1][1]
    assert status["state"] == "error"
    assert "no census baseline at thresholds/deepseek-ocr-2.cpu.float32.census.json" in status["description"]


def test_census_changes_within_the_rule_against_the_default_branchs_baseline_are_reported(github, checkout, tmp_path,
                                                                                         capsys):
    """The default branch's float32 census baseline, not the one the run was judged by: one function
    there counted 8 calls more than the clean run (it shrank: ratchet down), one 4 fewer (it grew
    within the rule). Re-judging finds both and passes; neither is a finding (not a pull request's
    edited function), so only the status is posted, and the report carries the notices."""
    path = checkout / "thresholds" / "deepseek-ocr-2.cpu.float32.census.json"
    baseline = json.loads(path.read_text(encoding="utf-8"))
    at = baseline["census"]["640x480"]
    at["vllm/ir/ops/layernorm.py:fused_add_rms_norm"]["aten::to"] += 8
    at["vllm/ir/ops/layernorm.py:rms_norm"]["aten::to"] -= 4
    path.write_text(json.dumps(baseline), encoding="utf-8")
    code, _, err = comment(capsys, artifact(tmp_path, fixture("cpu-float32-clean")))
    assert code == 0, err
    assert github.statuses[-1][1]["state"] == "success" and github.comments[7] == []
    code, body, err = comment(capsys, artifact(tmp_path / "dry", fixture("cpu-float32-clean")), "--dry-run")
    assert code == 0, err
    assert "1 function(s) shrank or vanished; ratchet the baseline down" in body
    assert "| `vllm/ir/ops/layernorm.py:rms_norm` | shared | 640×480 | 18 → 22 | `+4 aten::to` | ✅ pass |" in body
    assert "| `vllm/ir/ops/layernorm.py:fused_add_rms_norm` | shared | 640×480 | 108 → 100 | `-8 aten::to` | ✅ pass |" in body


def test_a_bf16_run_is_judged_against_the_bf16_census_baseline(checkout):
    stored = load_results(fixture("cpu-bf16-busy"))
    profile = judged_profile(stored.run, load_thresholds(TH), source="x")
    assert profile.engine.dtype == "bfloat16"
    assert profile.census.baseline == Path("thresholds/deepseek-ocr-2.cpu.census.json")
    fresh = rejudge(stored, load_thresholds(TH), source="x")
    assert [r.kind for r in fresh.invalid_reasons] == [ReasonKind.BUSY_MACHINE]  # no census reason


def test_the_census_baseline_is_read_beside_the_trusted_thresholds_file(github, checkout, tmp_path, capsys):
    """--trusted-thresholds elsewhere in the checkout: the census baselines it names are read beside
    it (the default branch's), never from the run's own thresholds path recorded in results.json."""
    moved = checkout / "budgets"
    shutil.move(checkout / "thresholds", moved)
    env = artifact(tmp_path, fixture("cpu-float32-mutant-token-copies"))
    code, _, err = comment(capsys, env, "--trusted-thresholds", "budgets/deepseek-ocr-2.yaml")
    assert code == 0, err
    assert github.statuses[-1][1]["state"] == "failure"
    assert "_encode_global_features" in github.statuses[-1][1]["description"]


def test_a_server_run_is_judged_by_the_server_modes_ttft_budget(checkout):
    stored = load_results(fixture("cpu-float32-server"))
    assert stored.run.environment.engine_mode == "server"
    profile = judged_profile(stored.run, load_thresholds(TH), source="x")
    assert profile.engine.mode == "server"
    assert profile.ttft_ms == load_thresholds(TH).profile("cpu").ttft_ms_by_mode["server"]


@pytest.mark.parametrize("name", ["cpu-float32-server", "cpu-float32-server-url"])
def test_a_server_run_is_posted_against_the_server_modes_ttft_budget(name, github, checkout, tmp_path, capsys):
    """Re-judged in-process, a server run's TTFT would meet the in-process budget (7000 ms), which on
    the budget's own machine fails every server run (~12 s); it is judged by budgets.modes.server."""
    code, _, err = comment(capsys, artifact(tmp_path, fixture(name)))
    assert code == 0, err
    assert github.statuses[-1][1]["state"] == "success" and github.comments[7] == []  # no finding, no comment
    code, body, err = comment(capsys, artifact(tmp_path / "dry", fixture(name)), "--dry-run")
    assert code == 0, err
    assert "p50 budget 13900 ms" in body and "budget 7000 ms" not in body
    if name.endswith("-url"):  # a server guard did not start: TTFT only
        assert "not measured in this mode" in body
        assert load_results(fixture(name)).run.environment.server.managed is False


# ----------------------------------------------------------------------------- perf-guard -> perf-guard-comment
@pytest.mark.parametrize("name, baseline, code, state", [
    ("cpu-float32-mutant-token-copies", False, 1, "failure"),
    ("cpu-bf16-ab-identical", True, 0, "success"),
])
def test_perf_guards_check_step_hands_the_comment_step_what_it_posts(name, baseline, code, state, github, checkout,
                                                                      tmp_path, capsys, monkeypatch):
    """perf-guard's `guard check` step with its own arguments, in the workspace it runs in, only the
    engine's part replaced by the recorded run (its run.json, or the A/B record of both sides); the
    harness, evaluation and the files written are guard check's own. The artifact it leaves is what
    perf-guard-comment then posts."""
    import sys

    from guard.measure import harness, hardware
    from guard.commands import check
    from guard.model.records import ABRecord
    from guard.model.jsonfiles import ab_run_file_dict, run_file_dict, write_json_atomic

    recorded = load_results(fixture(name))
    env = recorded.run.environment
    here = hardware.Hardware(cuda=False, gpu_name=None, cpu_name=env.cpu, cpu_count=env.cpu_count,
                             native_bf16=not ran_bf16_fallback(env))  # the machine it ran on
    monkeypatch.setattr(check, "detect", lambda quick=False: here)
    monkeypatch.setattr(hardware, "detect", lambda quick=False: here)

    def suite(spec):  # what the run stage's child leaves: a recorded run (A/B: both sides')
        output = Path(spec.output)
        if spec.is_ab:
            write_json_atomic(output / "ab-run.json", ab_run_file_dict(ABRecord(
                candidate=recorded.run, baseline=recorded.ab.baseline, baseline_python=spec.baseline.path,
                order=list(recorded.ab.order))))
        else:
            write_json_atomic(output / "run.json", run_file_dict(recorded.run))
        return 0, None

    monkeypatch.setattr(harness, "run_suite", suite)
    monkeypatch.setattr(cli, "COMMANDS", ALL_COMMANDS)
    argv = workflow_argv("perf-guard.yml", "check", {"PROFILE": "cpu", "THRESHOLDS": TH,
                                                     "BASELINE_PYTHON": sys.executable if baseline else ""})
    assert cli.main(argv) == code, capsys.readouterr()
    capsys.readouterr()
    written = load_results(checkout / "guard-results" / "results.json")
    assert written.verdict == recorded.verdict and written.checks == recorded.checks

    art = artifact(tmp_path, checkout / "guard-results" / "results.json")
    assert comment(capsys, art)[0] == 0
    assert github.statuses[-1][1]["state"] == state


# ----------------------------------------------------------------------------- guard-history: check -> record
def test_the_history_workflows_check_and_record_steps_with_their_own_arguments(checkout, tmp_path, capsys,
                                                                                 monkeypatch):
    """guard-history's `guard check` (engine replaced by a recorded clean run, as above) then its
    `guard record` into a fresh store, each with the arguments read from the workflow file."""
    from guard.measure import harness, hardware
    from guard.commands import check
    from guard.history.store import load_history
    from guard.model.jsonfiles import run_file_dict, write_json_atomic

    recorded = load_results(fixture("cpu-float32-clean"))
    env = recorded.run.environment
    here = hardware.Hardware(cuda=False, gpu_name=None, cpu_name=env.cpu, cpu_count=env.cpu_count,
                             native_bf16=not ran_bf16_fallback(env))
    monkeypatch.setattr(check, "detect", lambda quick=False: here)
    monkeypatch.setattr(hardware, "detect", lambda quick=False: here)
    monkeypatch.setattr(harness, "run_suite", lambda spec: (
        write_json_atomic(Path(spec.output) / "run.json", run_file_dict(recorded.run)), (0, None))[1])
    monkeypatch.setattr(cli, "COMMANDS", ALL_COMMANDS)
    assert cli.main(workflow_argv("guard-history.yml", "check", {})) == recorded.exit_code
    capsys.readouterr()
    runner_temp = tmp_path / "runner"
    (runner_temp / "guard-results").mkdir(parents=True)
    (checkout / "guard-results" / "results.json").replace(runner_temp / "guard-results" / "results.json")
    store = runner_temp / "store"
    store.mkdir()
    sha = "c" * 40
    argv = workflow_argv("guard-history.yml", "record", {"RUNNER_TEMP": str(runner_temp), "COMMIT": sha, "store": str(store),
                                                         "RUN_URL": "https://github.example/r/9"})
    assert cli.main(argv) == 0, capsys.readouterr()
    (rec,) = load_history(store / "history.jsonl")
    assert rec.commit == sha and rec.profile == "cpu"
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    argv = workflow_argv("guard-history.yml", "history", {"store": str(store)}, nth=0)
    assert cli.main(argv) == 0
    assert "xychart-beta" in capsys.readouterr().out  # the job summary's Mermaid chart
    assert cli.main(workflow_argv("guard-history.yml", "history", {"store": str(store)}, nth=1)) == 0
    assert (tmp_path / "guard-history.png").stat().st_size > 1000  # the chart it uploads
