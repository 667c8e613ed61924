"""The census through evaluation, the three views, results.json, and `guard update-thresholds`
(recorded data built from guard's own records; no engine)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from guard import cli
from guard.config.loading import load_thresholds
from guard.config.census import load_baseline, render_baseline
from guard.commands import update_thresholds as ut
from guard.judge.evaluate import evaluate
from guard.judge.pricing import shipped_costs
from guard.model import format as fmt
from guard.model.checks import OpClass
from guard.report.markdown import render_markdown
from guard.model.jsonfiles import load_results, results_to_dict, write_json_atomic
from guard.model.records import ReasonKind, RequestOutcome, RunRecord, Status, Verdict
from guard.report.terminal import render_terminal
from guard.measure.fit import on_cpu
from tests.conftest import SHIPPED_THRESHOLDS

LOOP = "vllm/model_executor/models/deepseek_ocr2.py:DeepseekOCR2ForCausalLM._encode_global_features"
OTHER = "vllm/model_executor/models/deepencoder.py:ImageEncoderViT.forward"
NOISY = "vllm/v1/core/sched/scheduler.py:Scheduler.schedule"
BASE = {"640x480": {LOOP: {"aten::view": 1}, OTHER: {"aten::add": 40, "aten::mm": 60}, NOISY: {"aten::add": 3}}}
ENV = {"hardware_profile": "cpu", "git_commit": "0" * 40, "gpu": None, "cpu": "EPYC", "cpu_count": 2, "vllm": "0.32.0"}


@pytest.fixture(autouse=True)
def pinned(monkeypatch):
    monkeypatch.setattr(ut, "git_commit", lambda cwd=None: None)


def setup(tmp_path: Path, *, baseline: dict | None = BASE, exclude: dict | None = None) -> Path:
    """A thresholds file whose cpu profile has a census rule (and only that), and its baseline."""
    data = yaml.safe_load(SHIPPED_THRESHOLDS.read_text())
    cpu = data["profiles"]["cpu"]
    cpu["workload"]["profile_image_sizes"] = [[640, 480]]
    cpu["budgets"] = {"census": {"baseline": "t.cpu.census.json", "max_growth_pct": 10, "min_growth_calls": 16,
                                 "new_function_max_calls": 8, "exclude": exclude or {NOISY: "varies per step"}}}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    if baseline is not None:
        (tmp_path / "t.cpu.census.json").write_text(
            render_baseline("deepseek-ocr-2", "cpu", ("vllm",), {s: {f: o for f, o in fns.items() if f != NOISY}
                                                                 for s, fns in baseline.items()},
                            {"date": "x"}, {NOISY: "varies per step"}))
    return path


def run_with(census: dict, yaml_path: Path, injected: str | None = None, requests: int = 1,
             environment: dict | None = None) -> RunRecord:
    return RunRecord(profile="cpu", thresholds_path=str(yaml_path), model="deepseek-ocr-2",
                     environment=dict(ENV if environment is None else environment),
                     outcomes=[RequestOutcome(i, (640, 480), False, True, ttft_client_s=7.0) for i in range(requests)],
                     rounds=1, census=census, injected=injected)


def judged(tmp_path: Path, census: dict, **kw):
    path = setup(tmp_path, **kw)
    profile = load_thresholds(path).profile("cpu")
    baseline = load_baseline(profile.census.baseline) if profile.census.baseline.exists() else None
    return evaluate(profile, run_with(census, path), output=tmp_path / "out", census_baseline=baseline), path


def grown() -> dict:
    return {"640x480": {**BASE["640x480"],
                        LOOP: {"aten::view": 1, "aten::empty_like": 1, "aten::select": 512, "aten::copy_": 256},
                        NOISY: {"aten::add": 300}}}


def test_identical_census_passes_with_no_checks(tmp_path: Path) -> None:
    res, _ = judged(tmp_path, BASE)
    assert res.verdict == Verdict.PASS and res.census_checks == ()
    assert "census: 3 functions x image sizes counted; 0 grew beyond the rule" in render_terminal(res)


def test_a_loop_of_small_ops_fails_and_every_view_names_function_and_ops(tmp_path: Path) -> None:
    res, _ = judged(tmp_path, grown())
    assert res.verdict == Verdict.REGRESSION and res.exit_code == 1
    (c,) = res.census_checks  # the excluded scheduler function is not judged
    assert c.function == LOOP and c.status == Status.FAIL and (c.baseline_calls, c.measured_calls) == (1, 770)
    term = render_terminal(res)
    row = next(line for line in term.splitlines() if line.startswith(LOOP))
    assert row.split() == [LOOP, "model", "640x480", "1", "→", "770", "+512", "aten::select,", "+256", "aten::copy_,", "+1",
                           "aten::empty_like", "FAIL"]
    assert "REGRESSION" in term and "more than 10 % of 1" in term
    md = render_markdown(res)
    assert "### Operator census per function" in md and "1 → 770" in md and "+512 aten::select" in md
    out = tmp_path / "results.json"
    write_json_atomic(out, results_to_dict(res))  # and back, through the JSON Schema
    again = load_results(out)
    assert again.census_checks == res.census_checks and again.run.census == res.run.census


def test_a_finding_says_what_it_would_cost_on_a_gpu_beside_its_counts_in_every_view(tmp_path: Path) -> None:
    res, _ = judged(tmp_path, grown())
    (c,) = res.census_checks  # +512 select (views), +256 copy_ (kernels), +1 empty_like (a view)
    launch = {gpu: shipped_costs().row(gpu, OpClass.KERNEL_LAUNCH).us_per_call for gpu in ("A10", "H100")}
    assert [(g.gpu, g.ms_per_request) for g in c.gpu_costs] == [(gpu, pytest.approx(256 * us / 1000))
                                                                 for gpu, us in launch.items()]
    said = (f"≈ {fmt.signed_ms(256 * launch['A10'] / 1000)} per request on an A10, "
            f"{fmt.signed_ms(256 * launch['H100'] / 1000)} on an H100 (A10: 256 kernel launches × {launch['A10']:g} µs; "
            "constants: estimates, see docs/gpu-cost.md)")
    term = render_terminal(res).splitlines()
    row = next(i for i, line in enumerate(term) if line.startswith(LOOP))
    assert term[row + 1] == f"  on a GPU, {LOOP} [640x480]: {said}"  # under the row whose counts it prices
    md = render_markdown(res).splitlines()
    counts = md.index("- ops that grew most at 640×480: `+512 aten::select, +256 aten::copy_, +1 aten::empty_like`")
    assert md[counts + 1] == f"- on a GPU, at 640×480: {said}"
    out = tmp_path / "results.json"
    write_json_atomic(out, results_to_dict(res))  # and back, through the JSON Schema
    assert load_results(out).census_checks[0].gpu_costs == c.gpu_costs


def test_a_growth_that_costs_nothing_on_a_gpu_still_fails_the_rule(tmp_path: Path) -> None:
    """The estimate is shown beside the counts, never as the verdict: 300 more views fail the rule."""
    res, _ = judged(tmp_path, {"640x480": {**BASE["640x480"], LOOP: {"aten::view": 301}}})
    assert res.verdict == Verdict.REGRESSION
    (c,) = res.census_checks
    assert [g.ms_per_request for g in c.gpu_costs] == [0, 0]
    assert ("≈ 0.00 ms per request on an A10, 0.00 ms on an H100 (A10: views and metadata only: no kernel, no copy, "
            "no sync; constants: estimates, see docs/gpu-cost.md)") in render_terminal(res)


def test_shrinkage_is_a_notice_with_the_update_command(tmp_path: Path) -> None:
    census = {"640x480": {LOOP: {"aten::view": 1}, OTHER: {"aten::add": 10, "aten::mm": 60}}}
    res, _ = judged(tmp_path, census)
    assert res.verdict == Verdict.PASS
    assert any("shrank or vanished" in n and "--only census" in n for n in res.notices)
    assert any(f"{OTHER} [640x480]: 100 → 70" in n for n in res.notices)


def test_missing_baseline_is_an_invalid_run_that_says_how_to_write_it(tmp_path: Path) -> None:
    res, _ = judged(tmp_path, BASE, baseline=None)
    assert res.verdict == Verdict.INVALID and res.exit_code == 3
    assert any(r.kind == ReasonKind.CENSUS_BASELINE and "update-thresholds" in r.text for r in res.invalid_reasons)


def test_a_size_without_census_is_an_invalid_run(tmp_path: Path) -> None:
    res, _ = judged(tmp_path, {})
    assert res.verdict == Verdict.INVALID
    assert any("no census was measured for a 640x480" in r.text for r in res.invalid_reasons)


# ----------------------------------------------------------------------------- update-thresholds
def results_file(tmp_path: Path, census: dict, yaml_path: Path, **kw) -> Path:
    profile = load_thresholds(yaml_path).profile("cpu")
    baseline = load_baseline(profile.census.baseline) if profile.census.baseline.exists() else None
    res = evaluate(profile, run_with(census, yaml_path, **kw), output=tmp_path, census_baseline=baseline)
    path = tmp_path / "results.json"
    write_json_atomic(path, results_to_dict(res))
    return path


def update(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(["update-thresholds", *argv])
    out, err = capsys.readouterr()
    return code, out + err


def test_first_baseline_is_written_from_a_run_that_had_none(tmp_path: Path, capsys) -> None:
    path = setup(tmp_path, baseline=None)
    res = results_file(tmp_path, grown(), path)
    code, out = update(capsys, "--from", str(res), "--only", "census")
    assert code == 0, out
    b = load_baseline(tmp_path / "t.cpu.census.json")
    assert b.census["640x480"][LOOP]["aten::copy_"] == 256
    assert NOISY not in b.census["640x480"] and b.excluded == {NOISY: "varies per step"}
    assert b.provenance["commit"] and "writing the first baseline" in out


def test_decrease_is_accepted_and_written_atomically_with_a_diff(tmp_path: Path, capsys) -> None:
    path = setup(tmp_path)
    census = {"640x480": {LOOP: {"aten::view": 1}, OTHER: {"aten::add": 10, "aten::mm": 60}}}
    code, out = update(capsys, "--from", str(results_file(tmp_path, census, path)), "--only", "census")
    assert code == 0, out
    assert f'-      "{OTHER}": {{"aten::add": 40, "aten::mm": 60}}' in out
    assert f'+      "{OTHER}": {{"aten::add": 10, "aten::mm": 60}}' in out
    assert load_baseline(tmp_path / "t.cpu.census.json").census["640x480"][OTHER]["aten::add"] == 10
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_increase_is_refused_without_allow_increase(tmp_path: Path, capsys) -> None:
    path = setup(tmp_path)
    before = (tmp_path / "t.cpu.census.json").read_text()
    res = results_file(tmp_path, grown(), path)
    # a regression run is valid: its numbers may become the baseline, but only on purpose
    code, out = update(capsys, "--from", str(res), "--only", "census")
    assert code == 2 and "refusing to raise the census of 1 function(s)" in out and "--allow-increase" in out
    assert (tmp_path / "t.cpu.census.json").read_text() == before


def test_allow_increase_writes_with_a_loud_warning_and_dry_run_writes_nothing(tmp_path: Path, capsys) -> None:
    path = setup(tmp_path)
    res = results_file(tmp_path, grown(), path)
    before = (tmp_path / "t.cpu.census.json").read_text()
    code, out = update(capsys, "--from", str(res), "--only", "census", "--allow-increase", "--dry-run")
    assert code == 0 and "WARNING: this update RAISES the census of 1 function(s)" in out and "dry run" in out
    assert (tmp_path / "t.cpu.census.json").read_text() == before
    code, out = update(capsys, "--from", str(res), "--only", "census", "--allow-increase")
    assert code == 0 and "WARNING" in out
    assert load_baseline(tmp_path / "t.cpu.census.json").census["640x480"][LOOP]["aten::select"] == 512


def test_same_census_changes_nothing(tmp_path: Path, capsys) -> None:
    path = setup(tmp_path)
    before = (tmp_path / "t.cpu.census.json").read_text()
    code, out = update(capsys, "--from", str(results_file(tmp_path, BASE, path)), "--only", "census")
    assert code == 0 and "no changes" in out
    assert (tmp_path / "t.cpu.census.json").read_text() == before


def test_a_mutant_run_is_never_a_baseline(tmp_path: Path, capsys) -> None:
    path = setup(tmp_path)
    res = results_file(tmp_path, grown(), path, injected="mutant:token-copies")
    code, out = update(capsys, "--from", str(res), "--only", "census", "--allow-increase")
    assert code == 2 and "injected" in out


# ----------------------------------------------------------------------------- a CPU without native bf16
SHRUNK = {"640x480": {LOOP: {"aten::view": 1}, OTHER: {"aten::add": 10, "aten::mm": 60}}}  # fewer casts, say


def setup_float32(tmp_path: Path, *, own_baseline: bool) -> Path:
    """The census profile with the engine's bf16 fallback; ``own_baseline``: a float32 census file of its own."""
    path = setup(tmp_path)
    data = yaml.safe_load(path.read_text())
    cpu = data["profiles"]["cpu"]
    assert (cpu["engine"]["dtype"], cpu["engine"]["dtype_without_native_bf16"]) == ("bfloat16", "float32")
    if own_baseline:
        cpu["budgets"]["census"]["baseline_without_native_bf16"] = "t.cpu.float32.census.json"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def results_on(tmp_path: Path, census: dict, yaml_path: Path, *, native_bf16: bool = True, amx: bool = False):
    """A run as `guard check` records it on a CPU with or without native bf16 and AMX: the profile as
    Profile.on_cpu gives it there, the engine and CPU extensions as the run records them."""
    profile = on_cpu(load_thresholds(yaml_path).profile("cpu"), native_bf16=native_bf16, amx=amx)
    run = run_with(census, yaml_path)
    run.environment.update({"engine_args": profile.engine.as_dict()})
    if amx:
        run.environment.cpu_isa = AMX_ISA
    baseline = load_baseline(profile.census.baseline) if profile.census.baseline.exists() else None
    res = evaluate(profile, run, output=tmp_path, census_baseline=baseline)
    path = tmp_path / "results.json"
    write_json_atomic(path, results_to_dict(res))
    return res, path


def float32_results(tmp_path: Path, census: dict, yaml_path: Path):
    return results_on(tmp_path, census, yaml_path, native_bf16=False)


def test_a_float32_census_is_kept_apart_from_the_bfloat16_one(tmp_path: Path, capsys) -> None:
    path = setup_float32(tmp_path, own_baseline=True)
    bf16_before = (tmp_path / "t.cpu.census.json").read_text()
    first, res = float32_results(tmp_path, SHRUNK, path)
    assert first.verdict == Verdict.INVALID  # its own baseline is not written yet: nothing to compare with
    assert any(r.kind == ReasonKind.CENSUS_BASELINE and "t.cpu.float32.census.json" in r.text for r in first.invalid_reasons)
    code, out = update(capsys, "--from", str(res), "--only", "census")
    assert code == 0, out
    assert load_baseline(tmp_path / "t.cpu.float32.census.json").census == SHRUNK
    assert (tmp_path / "t.cpu.census.json").read_text() == bf16_before  # the bfloat16 census is untouched
    again, _ = float32_results(tmp_path, SHRUNK, path)
    assert again.verdict == Verdict.PASS and again.census_checks == ()
    assert any(n.startswith("engine dtype: float32") and "against its float32 baseline" in n for n in again.notices)
    worse, _ = float32_results(tmp_path, grown(), path)  # a loop is still caught against the float32 census
    assert worse.verdict == Verdict.REGRESSION and LOOP in {c.function for c in worse.census_checks}


def test_a_float32_run_never_ratchets_a_bfloat16_census(tmp_path: Path, capsys) -> None:
    path = setup_float32(tmp_path, own_baseline=False)
    before = (tmp_path / "t.cpu.census.json").read_text()
    res, results = float32_results(tmp_path, SHRUNK, path)
    assert res.verdict == Verdict.PASS
    assert any("fewer calls than the bfloat16 baseline" in n for n in res.notices)
    assert not any("ratchet" in n for n in res.notices)  # following it would fail every bf16 machine after
    code, out = update(capsys, "--from", str(results), "--only", "census")
    assert code == 2 and "bfloat16 census" in out and "baseline_without_native_bf16" in out
    code, out = update(capsys, "--from", str(results))  # a full update leaves the census alone, and says so
    assert code == 0 and "not bfloat16" in out
    assert (tmp_path / "t.cpu.census.json").read_text() == before


# ----------------------------------------------------------------------------- a CPU with AMX
# On an AMX CPU vLLM runs small bf16 GEMMs on sgl-kernel's AMX kernels instead of oneDNN: a new
# function and other calls where the baseline counted none (seen on an Intel Xeon with amx_bf16).
AMX_GEMM = "vllm/_custom_ops.py:weight_packed_linear_cpu"
ON_AMX = {"640x480": {LOOP: {"aten::view": 1}, OTHER: {"aten::add": 40, "aten::mm": 51},
                     AMX_GEMM: {"_C::weight_packed_linear": 9, "aten::empty": 9, "aten::view": 18}}}
AMX_ISA = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16")


def setup_amx(tmp_path: Path, *, own_baseline: bool) -> Path:
    path = setup(tmp_path)
    if own_baseline:
        data = yaml.safe_load(path.read_text())
        data["profiles"]["cpu"]["budgets"]["census"]["baseline_with_amx"] = "t.cpu.amx.census.json"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def amx_results(tmp_path: Path, census: dict, yaml_path: Path):
    return results_on(tmp_path, census, yaml_path, amx=True)


def test_an_amx_run_is_never_judged_against_a_census_counted_without_amx(tmp_path: Path, capsys) -> None:
    path = setup_amx(tmp_path, own_baseline=False)
    before = (tmp_path / "t.cpu.census.json").read_text()
    res, results = amx_results(tmp_path, grown(), path)  # even a real loop: no baseline fits this CPU
    assert res.verdict == Verdict.PASS and res.census_checks == ()
    (note,) = [n for n in res.notices if n.startswith("census: counted, not judged")]
    assert "AMX" in note and "t.cpu.census.json" in note and "census.baseline_with_amx" in note
    assert "--only census" in note
    assert res.run.census == grown()  # counted and kept: the AMX baseline can be written from it
    code, out = update(capsys, "--from", str(results), "--only", "census")
    assert code == 2 and "AMX" in out and "baseline_with_amx" in out
    code, out = update(capsys, "--from", str(results))  # a full update leaves the census alone, and says so
    assert code == 0 and "counted with AMX" in out
    assert (tmp_path / "t.cpu.census.json").read_text() == before


def test_an_amx_census_of_its_own_is_written_and_judged_apart(tmp_path: Path, capsys) -> None:
    path = setup_amx(tmp_path, own_baseline=True)
    before = (tmp_path / "t.cpu.census.json").read_text()
    first, results = amx_results(tmp_path, ON_AMX, path)
    assert first.verdict == Verdict.INVALID  # not written yet: nothing to compare with
    assert any(r.kind == ReasonKind.CENSUS_BASELINE and "t.cpu.amx.census.json" in r.text for r in first.invalid_reasons)
    code, out = update(capsys, "--from", str(results), "--only", "census")
    assert code == 0, out
    assert load_baseline(tmp_path / "t.cpu.amx.census.json").census == ON_AMX
    assert (tmp_path / "t.cpu.census.json").read_text() == before  # the census without AMX is untouched
    again, _ = amx_results(tmp_path, ON_AMX, path)
    assert again.verdict == Verdict.PASS and again.census_checks == ()
    loop = {"640x480": {**ON_AMX["640x480"], LOOP: grown()["640x480"][LOOP]}}
    worse, _ = amx_results(tmp_path, loop, path)  # a loop is still caught against the AMX census
    assert worse.verdict == Verdict.REGRESSION and LOOP in {c.function for c in worse.census_checks}
    # without AMX the same profile is judged against its first baseline
    plain = on_cpu(load_thresholds(path).profile("cpu"), native_bf16=True, amx=False)
    assert plain.census.baseline == tmp_path / "t.cpu.census.json"


def census_and_ttft_update(tmp_path: Path, environment: dict | None = None) -> tuple[Path, Path]:
    """A thresholds file with a census rule and a TTFT budget, and the results of a run (6 requests,
    7000 ms each) whose update moves both: the budget down from 20000 ms, one census count down."""
    path = setup(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["profiles"]["cpu"]["budgets"]["ttft_ms"] = {"p50": 20000}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    census = {"640x480": {LOOP: {"aten::view": 1}, OTHER: {"aten::add": 10, "aten::mm": 60}}}
    return path, results_file(tmp_path, census, path, requests=6, environment=environment)


def test_a_thresholds_file_that_cannot_be_written_leaves_the_census_as_it_was(tmp_path: Path, capsys) -> None:
    """The census baseline and the budgets it goes with change together or not at all: the census
    is written first, so a YAML that then cannot be written (here read-only, which guard refuses
    even as root) puts the census back."""
    path, res = census_and_ttft_update(tmp_path)
    baseline = tmp_path / "t.cpu.census.json"
    before_census, before_yaml = baseline.read_bytes(), path.read_bytes()
    path.chmod(0o444)
    code, out = update(capsys, "--from", str(res))
    assert code == 2, out
    assert f"wrote {baseline}" in out  # it was written, then put back
    assert "read-only" in out and f"{baseline} is back as it was" in out
    assert baseline.read_bytes() == before_census and path.read_bytes() == before_yaml
    path.chmod(0o644)
    code, out = update(capsys, "--from", str(res))
    assert code == 0, out
    assert load_baseline(baseline).census["640x480"][OTHER]["aten::add"] == 10 and b"20000" not in path.read_bytes()


def test_budgets_that_would_not_load_after_the_update_leave_the_census_unwritten_too(tmp_path: Path, capsys) -> None:
    """The updated budgets are loaded before anything is written: a speed reference that rounds to
    0.0 ms (a crafted run; guard's reference takes tens of ms) is refused with the census as it was."""
    from guard.model.environment import SpeedReading, SpeedReference

    reading = SpeedReading("speedref-1", 0.01, 1.0, 5, 2)
    path, res = census_and_ttft_update(tmp_path, environment={
        **ENV, "cpu_isa": ["avx2"], "speed_reference": SpeedReference.of(reading, reading).as_dict()})
    baseline = tmp_path / "t.cpu.census.json"
    before_census, before_yaml = baseline.read_bytes(), path.read_bytes()
    code, out = update(capsys, "--from", str(res))
    assert code == 2 and "the updated budgets would not load" in out and "nothing was written" in out, out
    assert baseline.read_bytes() == before_census and path.read_bytes() == before_yaml
