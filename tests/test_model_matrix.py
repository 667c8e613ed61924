"""The model matrix (#42) without the engine: a budget file per tiny vision checkpoint, `--model
NAME|all|auto` on the real `guard` command (runs that end before measuring: unknown names, usage errors,
a pull request whose sides have the same vllm/), the exit-code precedence of `all`, the bf16 skip,
which code is shared, and host-sync growth judged on the committed census baselines (recorded by real
`guard check --model NAME --only ops` runs)."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest

from guard.commands import matrix
from guard.config import models
from guard.config.loading import load_thresholds
from guard.errors import ConfigError, UsageError
from guard.config.census import load_baseline, read_baseline
from guard.judge.census import compare
from guard.measure.hardware import Hardware, detect
from guard.measure.fit import mismatch, select_profile
from guard.model import format as fmt
from guard.model.records import Status
from tests.conftest import REPO, run_guard
from tests.vllm_repo import commit
from tests.vllm_repo import git as sh

THRESHOLDS = REPO / "thresholds"
TINY = ("qwen2-5-vl", "qwen3-vl", "glm-4-1v", "internvl", "minicpm-v", "llava-onevision", "gemma3", "llava-1-5")
AVX512_BF16 = Hardware(cuda=False, gpu_name=None, cpu_name="AMD EPYC", cpu_count=2,
                       cpu_isa=("avx2", "avx512f", "avx512_bf16"), native_bf16=True)
AVX2_ONLY = dataclasses.replace(AVX512_BF16, cpu_isa=("avx2",), native_bf16=False)


# ----------------------------------------------------------------------------- the budget files
def test_every_tiny_checkpoint_has_a_budget_file_and_names_are_matrix_safe() -> None:
    names = models.names(THRESHOLDS)
    assert names[0] == "deepseek-ocr-2" and set(TINY) <= set(names)
    for name in names:
        assert models.NAME_RE.match(name) and "." not in name  # an output folder and a status context as it is
        assert load_thresholds(THRESHOLDS / f"{name}.yaml").model == name


@pytest.mark.parametrize("name", TINY)
def test_each_budget_file_loads_with_its_checkpoint_prompt_scope_and_recorded_census(name: str) -> None:
    t = load_thresholds(THRESHOLDS / f"{name}.yaml")
    cpu = t.profiles["cpu"]
    folder = Path(models.__file__).parents[1] / "models" / cpu.engine.model.removeprefix("guard:")
    assert cpu.workload.prompt == (folder / "guard_prompt.txt").read_text()  # the model's own chat format
    assert len(cpu.workload.profile_image_sizes) == 2
    scope = cpu.ops[0].scope
    assert scope.file.startswith(models.MODEL_CODE) and not models.is_shared(scope.file)
    baseline = read_baseline(cpu.census)
    assert baseline is not None and baseline.model == name and baseline.profile == "cpu"
    assert set(baseline.census) == {"640x480", "800x400"}
    assert cpu.ops[0].total_ops.count > 0  # the budgeted vision path ran (its recorded total)
    assert models.model_files(cpu.census.baseline)  # and the census saw the model's own files
    # every budget is a recorded count, not the placeholder the file was written with
    assert all(b.count < 100000 for b in cpu.ops[0].ops.values()) and cpu.ops[0].total_ops.count < 10_000_000


def test_minicpm_v_says_it_needs_native_bf16_and_the_others_fall_back_to_float32() -> None:
    for name in TINY:
        engine = load_thresholds(THRESHOLDS / f"{name}.yaml").profiles["cpu"].engine
        if name == "minicpm-v":
            assert engine.requires_native_bf16 and engine.dtype_without_native_bf16 is None
        else:
            assert not engine.requires_native_bf16 and engine.dtype_without_native_bf16 == "float32"


@pytest.mark.parametrize("name", ["deepseek-ocr-2", *(n for n in TINY if n != "minicpm-v")])
def test_a_model_that_falls_back_to_float32_is_judged_against_a_float32_census(name: str) -> None:
    """Recorded by real float32 runs (docs/model-matrix.md): the same functions at the same sizes as
    the bf16 census, fewer calls where bf16 is cast and never more, so a float32 run on a CPU
    without native bf16 is judged against what float32 counts, not shown as shrinkage."""
    census = load_thresholds(THRESHOLDS / f"{name}.yaml").profiles["cpu"].census
    assert census.baseline_without_native_bf16 is not None
    bf16, f32 = load_baseline(census.baseline), load_baseline(census.baseline_without_native_bf16)
    assert f32.model == bf16.model and set(f32.census) == set(bf16.census)
    for size in bf16.census:
        assert set(f32.census[size]) == set(bf16.census[size]), size
        calls = lambda fns: sum(sum(ops.values()) for ops in fns.values())  # noqa: E731
        assert calls(f32.census[size]) < calls(bf16.census[size]), size


def test_requires_native_bf16_is_validated(tmp_path: Path) -> None:
    text = (THRESHOLDS / "minicpm-v.yaml").read_text()
    bad = tmp_path / "m.yaml"
    bad.write_text(text.replace("      requires_native_bf16: true", "      requires_native_bf16: true\n"
                                "      dtype_without_native_bf16: float32"))
    with pytest.raises(ConfigError, match=r"m\.yaml:\d+: profiles\.cpu\.engine\.requires_native_bf16: contradicts"):
        load_thresholds(bad)
    bad.write_text(text.replace("      dtype: bfloat16", "      dtype: float32"))
    with pytest.raises(ConfigError, match=r"requires_native_bf16: only meaningful with dtype: bfloat16"):
        load_thresholds(bad)


def test_a_cpu_without_native_bf16_does_not_fit_minicpm_v_and_the_matrix_says_not_run() -> None:
    t = load_thresholds(THRESHOLDS / "minicpm-v.yaml")
    cpu = t.profiles["cpu"]
    assert mismatch(cpu, AVX512_BF16) is None
    why = mismatch(cpu, AVX2_ONLY)
    assert why and "needs a CPU with native bf16" in why and "avx2" in why
    assert matrix.not_runnable_here(t, "auto", AVX2_ONLY) == why
    assert matrix.not_runnable_here(t, "auto", AVX512_BF16) is None
    # a model that falls back to float32 runs there: not a skip
    qwen = load_thresholds(THRESHOLDS / "qwen2-5-vl.yaml")
    assert matrix.not_runnable_here(qwen, "auto", AVX2_ONLY) is None
    assert select_profile(qwen, "auto", AVX2_ONLY).engine.dtype == "float32"


# ----------------------------------------------------------------------------- names and usage
def test_names_resolve_to_their_file_dotted_spellings_too_and_unknown_names_list_the_known_ones() -> None:
    assert models.resolve("qwen2.5-vl", THRESHOLDS) == [("qwen2-5-vl", THRESHOLDS / "qwen2-5-vl.yaml")]
    assert [n for n, _ in models.resolve("all", THRESHOLDS)] == models.names(THRESHOLDS)
    with pytest.raises(UsageError) as exc:
        models.resolve("qwen4", THRESHOLDS)
    assert "no such model" in str(exc.value) and all(n in exc.value.hint for n in TINY)


def test_the_cli_lists_the_models_and_refuses_unknown_names_and_model_with_thresholds(tmp_path: Path) -> None:
    done = run_guard("check", "--help")
    assert done.returncode == 0 and all(n in done.stdout.replace("\n", " ").replace("  ", " ") for n in ("qwen2-5-vl", "minicpm-v"))
    done = run_guard("check", "--model", "nope", "--output", str(tmp_path / "o"))
    assert done.returncode == 2 and "--model nope: no such model" in done.stderr and "llava-1-5" in done.stderr
    done = run_guard("check", "--model", "gemma3", "--thresholds", str(THRESHOLDS / "gemma3.yaml"))
    assert done.returncode == 2 and "give --model or --thresholds, not both" in done.stderr
    done = run_guard("pr", "--vllm-repo", str(tmp_path), "--base", "a", "--head", "b", "--model", "gemma3",
                     "--thresholds-in-repo", "x.yaml")  # one file for every model: which model's is it?
    assert done.returncode == 2 and "needs {model} in the path" in done.stderr


# ----------------------------------------------------------------------------- exit codes of `all`
@pytest.mark.parametrize(("codes", "expected"), [
    ([0, 0, 0], 0), ([0, 6, 0], 6), ([0, 1, 6], 1), ([1, 3, 0], 3), ([3, 2, 1], 2), ([2, 5, 3], 5), ([0, 42], 5), ([], 0)])
def test_all_exits_with_the_worst_model_by_the_stated_precedence(codes: list[int], expected: int) -> None:
    assert matrix.combined_exit(codes) == expected


@pytest.fixture
def small(tmp_path: Path) -> Path:
    """A git repository with a vllm/ folder: a head that changes nothing under it has nothing to
    measure, so the command ends before any engine, through every model's own budget file."""
    repo = tmp_path / "small"
    (repo / "vllm" / "multimodal").mkdir(parents=True)
    (repo / "vllm" / "__init__.py").write_text("")
    (repo / "vllm" / "multimodal" / "inputs.py").write_text("X = 1\n")
    sh(repo, "init", "-q", "-b", "main")
    sh(repo, "add", "-A")
    sh(repo, "commit", "-q", "-m", "base")
    return repo


def test_pr_model_all_runs_every_model_into_its_own_folder_with_a_summary(small: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    head = commit(small, "docs: nothing under vllm/ to measure", files={"README.md": "docs only\n"})
    done = run_guard("pr", "--vllm-repo", str(small), "--base", "main", "--head", head, "--only", "ops",
                     "--model", "all", "--output", str(out), "--cache-dir", str(tmp_path / "cache"))
    names = models.names(THRESHOLDS)
    native = detect(quick=True).native_bf16  # without it minicpm-v is not run: exit 6 for the matrix
    assert done.returncode == (0 if native else 6), done.stdout + done.stderr
    summary = (out / "matrix.md").read_text()
    for name in names:
        skipped = name == "minicpm-v" and not native
        assert f"  {name} " in done.stdout
        assert (out / name / "results.json").is_file() != skipped
        assert (f"| `{name}` | NOT RUN | 6 |" if skipped else f"| `{name}` | PASS | 0 |") in summary
    assert f"exit {done.returncode}: the worst model's" in done.stdout


def test_all_with_a_profile_only_some_models_have_runs_those_and_names_the_others(small: Path, tmp_path: Path) -> None:
    """`--model all --profile a10` on an A10: the models without an a10 profile are each one NOT RUN
    line (exit 6), the matrix goes on and writes its summary; a profile no model has is exit 2."""
    head = commit(small, "docs only", files={"README.md": "docs\n"})
    out = tmp_path / "out"
    done = run_guard("pr", "--vllm-repo", str(small), "--base", "main", "--head", head, "--only", "ops", "--model", "all",
                     "--profile", "a10", "--output", str(out), "--cache-dir", str(tmp_path / "cache"))
    with_a10 = {n for n in models.names(THRESHOLDS) if "a10" in load_thresholds(THRESHOLDS / f"{n}.yaml").profiles}
    assert with_a10 and with_a10 != set(models.names(THRESHOLDS))
    summary = (out / "matrix.md").read_text()  # written: the matrix was not cut short
    without = set(models.names(THRESHOLDS)) - with_a10
    assert all(f"| `{name}` | NOT RUN | 6 |" in summary for name in without), summary
    assert summary.count("has no profile 'a10'") == len(without)
    assert done.returncode not in (0, 1, 5), done.stdout + done.stderr
    typo = run_guard("pr", "--vllm-repo", str(small), "--base", "main", "--head", head, "--only", "ops", "--model", "all",
                     "--profile", "a1O", "--output", str(tmp_path / "o2"), "--cache-dir", str(tmp_path / "cache"))
    assert typo.returncode == 2 and "no model has a profile of that name" in typo.stderr


def test_pr_model_auto_picks_models_by_the_files_changed(small: Path, tmp_path: Path) -> None:
    (small / "vllm" / "model_executor" / "models").mkdir(parents=True)
    (small / "vllm" / "model_executor" / "models" / "paligemma.py").write_text("# no guarded model runs this\n")
    head = commit(small, "an unguarded model's file")
    done = run_guard("pr", "--vllm-repo", str(small), "--base", "main", "--head", head, "--only", "ops",
                     "--model", "auto", "--output", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "cache"))
    assert done.returncode == 0 and "no model" in done.stdout and "nothing to measure" in done.stdout


def test_which_models_a_pull_request_is_judged_on() -> None:
    own = {}
    for name, path in models.resolve("all", THRESHOLDS):
        t = load_thresholds(path)
        own[name] = models.model_files(t.profiles["cpu"].census.baseline)
    assert "vllm/model_executor/models/qwen2_5_vl.py" in own["qwen2-5-vl"]
    assert "vllm/model_executor/models/deepencoder2.py" in own["deepseek-ocr-2"]
    chosen, why = models.models_touched(["vllm/multimodal/inputs.py", "docs/x.md"], own)
    assert chosen == list(own) and why.startswith("shared code changed")
    chosen, why = models.models_touched(["vllm/model_executor/models/glm4_1v.py"], own)
    assert chosen == ["glm-4-1v"] and why.startswith("only model code changed")
    # Qwen3-VL's model file imports Qwen2.5-VL's vision blocks: its census runs qwen2_5_vl.py too
    chosen, _ = models.models_touched(["vllm/model_executor/models/qwen2_5_vl.py"], own)
    assert {"qwen2-5-vl", "qwen3-vl"} <= set(chosen) and "gemma3" not in chosen
    # a language model several checkpoints share: each model whose census ran it
    chosen, _ = models.models_touched(["vllm/model_executor/models/qwen2.py"], own)
    assert {"internvl", "llava-onevision"} <= set(chosen) and "gemma3" not in chosen
    assert models.models_touched(["README.md", "csrc/x.cu"], own)[0] == []


def test_shared_code_is_one_rule() -> None:
    for f in ("vllm/multimodal/inputs.py:MultiModalKwargs.x", "vllm/v1/worker/gpu_model_runner.py:GPUModelRunner.execute_model",
              "vllm/v1/sample/sampler.py:Sampler.forward", "vllm/v1/core/sched/scheduler.py:Scheduler.schedule",
              "vllm/model_executor/models/utils.py:merge_multimodal_embeddings",
              "vllm/model_executor/layers/linear.py:ReplicatedLinear.forward"):
        assert models.is_shared(f), f
    assert not models.is_shared("vllm/model_executor/models/glm4_1v.py:Glm4vVisionTransformer.forward")


# ----------------------------------------------------------------------------- host syncs, on recorded censuses
def test_added_host_syncs_fail_the_census_naming_the_function_in_every_model() -> None:
    """Each model's recorded census with one .item() and one nonzero added in its own vision path: the
    census fails naming that function, and the host-sync line names it with the counts."""
    for name in TINY:
        cpu = load_thresholds(THRESHOLDS / f"{name}.yaml").profiles["cpu"]
        baseline = read_baseline(cpu.census)
        own = [f for f in baseline.census["640x480"] if not models.is_shared(f)]
        fn = next((f for f in own if f.startswith(cpu.ops[0].scope.file + ":")), own[0])
        measured = copy.deepcopy(baseline.census["640x480"])
        ops = measured[fn]
        ops["aten::_local_scalar_dense"] = ops.get("aten::_local_scalar_dense", 0) + 1
        ops["aten::item"] = ops.get("aten::item", 0) + 1
        ops["aten::nonzero"] = ops.get("aten::nonzero", 0) + 1
        checks = compare(cpu.census, (640, 480), baseline.census["640x480"], measured)
        failed = [c for c in checks if c.status == Status.FAIL]
        assert [c.function for c in failed] == [fn], name  # 3 calls: below the slack, failed by the watch alone
        assert set(failed[0].watched_ops) == {"aten::_local_scalar_dense", "aten::nonzero"}
        line = fmt.host_syncs({"640x480": measured}, tuple(checks))[0]
        before = sum(baseline.census["640x480"].get(f, {}).get(op, 0) for f in baseline.census["640x480"]
                     for op in ("aten::_local_scalar_dense", "aten::nonzero", "aten::_index_put_impl_"))
        assert line.startswith(f"640x480: {before + 2} ") and f"baseline {before}: " in line
        assert f"+1 .item() in {fn}" in line and f"+1 nonzero in {fn}" in line


def test_host_syncs_that_moved_between_functions_are_not_growth() -> None:
    cpu = load_thresholds(THRESHOLDS / "qwen2-5-vl.yaml").profiles["cpu"]
    base = read_baseline(cpu.census).census["640x480"]
    donor = next((f for f, ops in base.items() if ops.get("aten::_local_scalar_dense")), None)
    if donor is None:
        pytest.skip("this model's recorded census has no .item() to move")
    measured = copy.deepcopy(base)
    measured[donor]["aten::_local_scalar_dense"] -= 1
    measured.setdefault("vllm/model_executor/models/qwen2_5_vl.py:helper", {})["aten::_local_scalar_dense"] = 1
    checks = compare(cpu.census, (640, 480), base, measured)
    assert not [c for c in checks if c.status == Status.FAIL]


def test_a_missing_or_damaged_census_baseline_is_an_error_not_a_model_no_change_touches(tmp_path: Path) -> None:
    """Read as "no files", --model auto would never pick the model and its pull requests would pass."""
    from guard.errors import ConfigError

    with pytest.raises(ConfigError, match="no such census baseline"):
        models.model_files(tmp_path / "gone.census.json")
    (tmp_path / "list.census.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not a guard/census file"):
        models.model_files(tmp_path / "list.census.json")


def test_one_models_crash_is_its_line_through_the_one_edge_and_the_others_still_run(tmp_path, capsys):
    """A bug while judging one model of `all` is exit 5 for the matrix, said and logged as the CLI
    says any crash (guard.edge), its traceback in that model's folder; a usage error in another is
    exit 2 on its own line; the remaining models run."""
    import argparse

    from guard.commands.matrix import run_models
    from guard.config import models as model_names

    ran = []

    def run_one(sub: argparse.Namespace) -> int:
        name = Path(sub.thresholds).stem
        ran.append(name)
        if name == "gemma3":
            raise ZeroDivisionError("a bug while judging gemma3")
        if name == "internvl":
            from guard.errors import UsageError
            raise UsageError("a budget gemma3 does not have")
        return 0

    from guard.config.budgets import DEFAULT_THRESHOLDS

    args = argparse.Namespace(model="all", thresholds=DEFAULT_THRESHOLDS, profile="auto", output=str(tmp_path / "out"))
    code = run_models(args, run_one, "check")
    err = capsys.readouterr().err
    assert code == 5 and {"gemma3", "internvl"} <= set(ran) and ran[-1] == model_names.names()[-1]
    assert "guard check: gemma3: internal error: ZeroDivisionError: a bug while judging gemma3" in err
    assert "guard check: internvl: error: a budget gemma3 does not have" in err
    log = tmp_path / "out" / "gemma3" / "crash.log"
    assert "ZeroDivisionError" in log.read_text(encoding="utf-8") and str(log) in err
