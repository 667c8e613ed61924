"""guard.measure.run and guard.measure.single_run: the run stage's resampling and failure handling,
driven by a scripted driver (no engine)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from guard.config.budgets import Statistics, TtftHardware
from guard.measure.contention import ContentionSampler
from guard.judge.evaluate import evaluate
from guard.judge.sequential import single_run_rule
from guard.measure.hardware import Hardware
from guard.model.records import InvalidReason, ReasonKind, RequestOutcome, Verdict
from guard.measure.inprocess import InProcessSide
from guard.measure.single_run import GuardRun
from guard.measure.side import SideInfo
from guard.measure.speedref import WORKLOAD, SpeedReading
from guard.measure.fit import on_cpu
from tests.ttft_scenarios import CPU_ENV, budgeted


class ScriptedSide(InProcessSide):
    """Stands in for the engine: each job gets the next scripted TTFT (None: the request timed out).
    The rest is the in-process side's own (its speed reading in the engine's dtype)."""

    def __init__(self, profile, script, progress=lambda m: None, speed_reader=None):
        super().__init__(profile, progress, speed_reader=speed_reader)
        self.script = list(script)
        self.counts: list[int] = []

    def start(self):
        return SideInfo(init_s=0.0)

    def run(self, jobs, label, on_outcome):
        self.counts.append(len(jobs))
        out = []
        for job in jobs:
            t = self.script.pop(0)
            o = RequestOutcome(index=job.index, image_size=job.image_size, warmup=job.warmup, success=t is not None,
                               ttft_client_s=t, error=None if t is not None else "timed out after 600 s")
            on_outcome(o)
            out.append(o)
        return out


QUIET_READING = SpeedReading(WORKLOAD, 80.0, 4.0, 7, 2)  # a recorded reading of this machine


def scripted_run(thresholds, profile, script, tmp_path, contention=None, environment=None, speed=(QUIET_READING,),
                 rule=None):
    """A real GuardRun over the scripted side, stopping by ``rule`` (default: the profile's own,
    guard.judge.sequential.single_run_rule, as guard.child passes it); returns it, the side and its progress lines.
    The contention sampler reads no /proc unless given (the test machine's neighbours are not the subject),
    and the speed readings are ``speed``'s, in turn (guard.measure.speedref is tested on its own)."""
    lines = []
    readings = iter(speed * 2 if len(speed) == 1 else speed)
    driver = ScriptedSide(profile, script, lines.append, speed_reader=lambda workload: next(readings))
    run = GuardRun(thresholds, profile, Hardware(cuda=False, gpu_name=None, cpu_name="Test CPU", cpu_count=2), tmp_path,
                   progress=lines.append, side=driver, environment=dict(environment or CPU_ENV),
                   contention=contention or ContentionSampler(proc=tmp_path / "no-proc"),
                   rule=single_run_rule(profile) if rule is None else rule)
    return run, driver, lines


def test_run_stage_resamples_to_the_cap_and_the_verdict_agrees(thresholds, cpu, tmp_path):
    run, driver, lines = scripted_run(thresholds, cpu, [7.2] * 20, tmp_path)
    run.time_until_decided()
    assert driver.counts == [5, 5, 5]  # p90/p99 cannot be passed by their interval below n = 36
    assert run.record.rounds == 3
    assert any("p99" in line and "inconclusive" in line and "measuring 5 more" in line for line in lines)
    res = evaluate(cpu, run.finish())
    assert {(c.samples, c.rounds) for c in res.ttft_checks} == {(15, 3)}
    assert res.verdict == Verdict.PASS


def test_run_stage_stops_as_soon_as_every_percentile_is_decided(thresholds, cpu, tmp_path):
    profile = budgeted(cpu, p90=7000)  # a clear regression: the lower bound is above at n = 5
    run, driver, lines = scripted_run(thresholds, profile, [7.2] * 20, tmp_path)
    run.time_until_decided()
    assert driver.counts == [5]
    assert evaluate(profile, run.finish()).ttft_checks[0].note is None


def test_run_stage_cuts_the_last_batch_at_the_cap(thresholds, cpu, tmp_path):
    profile = dataclasses.replace(cpu, statistics=Statistics(confidence=0.95, max_requests=12, batch=5))
    run, driver, lines = scripted_run(thresholds, profile, [7.2] * 20, tmp_path)
    run.time_until_decided()
    assert driver.counts == [5, 5, 2]


def test_run_stage_does_not_resample_without_a_cap(thresholds, cpu, tmp_path):
    profile = dataclasses.replace(cpu, statistics=Statistics(confidence=0.95, max_requests=None, batch=5))
    run, driver, lines = scripted_run(thresholds, profile, [7.2] * 20, tmp_path)
    run.time_until_decided()
    assert driver.counts == [5] and not any("inconclusive" in ln for ln in lines)


def test_run_stage_stops_resampling_after_a_failed_request(thresholds, cpu, tmp_path):
    run, driver, lines = scripted_run(thresholds, cpu, [7.2, None, 7.2, 7.2, 7.2] + [7.2] * 10, tmp_path)
    run.time_until_decided()
    assert driver.counts == [5]  # the run is invalid whatever more samples say


@dataclasses.dataclass
class ScriptedRule:
    """A stopping rule (guard.measure.stopping.StoppingRule) that leaves "p50" undecided until it
    has seen ``decided_at`` samples, asking for ``batch`` more each time; what it was shown."""

    decided_at: int
    batch: int = 3
    cap: int | None = 100
    seen: list[int] = dataclasses.field(default_factory=list)

    def undecided(self, samples):
        self.seen.append(len(samples))
        return ["p50"] if len(samples) < self.decided_at else []

    def next_batch(self, measured, any_undecided):
        return self.batch if any_undecided else 0

    def describe(self, pending):
        return f"still open: {', '.join(pending)}"


def test_run_stage_stops_when_the_injected_rule_says_decided(thresholds, cpu, tmp_path):
    """The run stage measures by the rule it is given, not by one of its own: the profile's own
    rule would measure to the cap here (test above), this one decides after two more batches."""
    rule = ScriptedRule(decided_at=11)
    run, driver, lines = scripted_run(thresholds, cpu, [7.2] * 20, tmp_path, rule=rule)
    run.time_until_decided()
    assert driver.counts == [5, 3, 3] and rule.seen == [5, 8, 11]  # it saw every sample, the run's TTFTs
    assert run.record.rounds == 3 and len(run.record.ttft_client_s()) == 11
    assert "inconclusive after 5 requests: still open: p50; measuring 3 more (round 2, cap 100)" in lines


def test_run_stage_without_a_rule_refuses_to_time(thresholds, cpu, tmp_path):
    """A run that only profiles needs no rule; a timing pass without one is a caller's mistake, not a
    silent first batch."""
    run, driver, _ = scripted_run(thresholds, cpu, [7.2] * 20, tmp_path)
    run.rule = None
    with pytest.raises(TypeError, match="stopping rule"):
        run.time_until_decided()
    assert driver.counts == []




# ----------------------------------------------------------------------------- the machine under the run
CAPTURE = Path(__file__).parent / "fixtures" / "proc" / "busy-child-and-other"


class RecordedSampler(ContentionSampler):
    """The real sampler reading a recorded /proc: the first snapshot from start/, later ones from end/
    (a busy machine: 1.30 of 2 cores used by others, see tests/test_contention.py)."""

    def __init__(self):
        root = int((CAPTURE / "README.txt").read_text().split()[0].split("=")[1])
        super().__init__(root, proc=CAPTURE / "start", sys=CAPTURE / "no-sys")
        self.snapshots = 0

    def snapshot(self):
        self.proc = CAPTURE / ("start" if self.snapshots == 0 else "end")
        self.snapshots += 1
        return super().snapshot()


def test_a_busy_machine_stops_resampling_and_is_recorded(thresholds, cpu, tmp_path):
    run, driver, lines = scripted_run(thresholds, cpu, [7.2] * 20, tmp_path, contention=RecordedSampler())
    run.time_until_decided()
    assert driver.counts == [5]  # p90/p99 undecided, but more requests on a busy machine prove nothing
    reading = run.record.environment.cpu_contention
    assert reading.other_cores == pytest.approx(1.30, abs=0.01) and reading.cpus == 2
    assert any(line.startswith("CPU during measurement: other processes used 1.30 of 2 cores") for line in lines)
    res = evaluate(cpu, run.finish())
    assert res.verdict == Verdict.INVALID
    assert any("other processes used 1.30 of 2 cores" in r.text for r in res.invalid_reasons)


def test_ttft_bound_to_another_cpu_measures_no_extra_rounds(thresholds, cpu, tmp_path):
    profile = dataclasses.replace(cpu, ttft_hardware=TtftHardware(cpu_model_regex="^AMD EPYC$", cpu_count=(2, 2)))
    env = {**CPU_ENV, "ttft_hardware_match": {"ok": False, "reason": "budget measured on ..."}}
    run, driver, _ = scripted_run(thresholds, profile, [7.2] * 20, tmp_path, environment=env)
    run.time_until_decided()
    assert driver.counts == [5]  # nothing to decide here: the workload's requests, shown, not judged
    res = evaluate(profile, run.finish())
    assert res.verdict == Verdict.PASS and {c.status for c in res.ttft_checks} == {"not_judged"}
def test_the_speed_reference_is_read_around_the_timing_pass_and_judged(thresholds, cpu, tmp_path):
    """7.2 s against a 6.5 s p50 budget fails; on a machine 25 % slower than the budget's that is
    explained (7.2 / 1.25 = 5.8 s): invalid. At the budget's speed it is a regression, and so is a
    failure far beyond what the slowdown explains."""
    bound = dataclasses.replace(budgeted(cpu, p50=6500), ttft_hardware=TtftHardware(cpu_count=(2, 2), speed_reference_ms=80.0))
    slow = (SpeedReading(WORKLOAD, 96.0, 3.0, 7, 2), SpeedReading(WORKLOAD, 104.0, 3.0, 7, 2))
    run, _, lines = scripted_run(thresholds, bound, [7.2] * 20, tmp_path, speed=slow)
    run.time_until_decided()
    recorded = run.record.environment.speed_reference
    assert (recorded.before.ms, recorded.after.ms, recorded.ms) == (96.0, 104.0, 100.0)
    assert "speed reference: 100 ms (before and after the measured requests: 96, 104); the budget's machine: 80 ms, " \
           "this one +25.0 %" in lines
    record = run.finish()
    res = evaluate(bound, record)
    assert res.verdict == Verdict.INVALID  # never a regression: the machine, not the code, was slow
    (why,) = [r.text for r in res.invalid_reasons if r.kind == ReasonKind.SLOW_MACHINE]
    assert why.startswith("slow machine: guard's speed reference took 100 ms, +25.0 %")
    assert "ttft p50 7200 ms against 6500 ms; 5760 ms with the slowdown taken out" in why
    far = dataclasses.replace(bound, ttft_ms={"p50": 4000})  # 5.76 s > 4 s: beyond what the machine explains
    assert evaluate(far, record).verdict == Verdict.REGRESSION
    run, _, _ = scripted_run(thresholds, bound, [7.2] * 20, tmp_path)  # 80 ms: the budget's own speed
    run.time_until_decided()
    assert evaluate(bound, run.finish()).verdict == Verdict.REGRESSION


def test_a_speed_reading_that_breaks_is_reported_not_fatal(thresholds, cpu, tmp_path):
    def broken(workload):
        raise RuntimeError("no torch here")

    run, _, lines = scripted_run(thresholds, cpu, [7.2] * 20, tmp_path)
    run.side.speed_reader = broken
    run.time_until_decided()
    assert run.record.environment.speed_reference is None
    assert "speed reference not measured: no torch here" in lines


def test_the_speed_reference_runs_in_the_engines_dtype(thresholds, cpu, tmp_path):
    """Where the engine runs float32 for want of native bf16, so does the reference (bf16 is emulated there)."""
    from guard.measure.speedref import WORKLOAD, WORKLOAD_FLOAT32, SpeedReading

    bf16 = dataclasses.replace(cpu, engine=dataclasses.replace(cpu.engine, dtype="bfloat16",
                                                               dtype_without_native_bf16="float32"))
    for native, expected in ((True, WORKLOAD), (False, WORKLOAD_FLOAT32)):
        asked = []
        run, _, _ = scripted_run(thresholds, on_cpu(bf16, native_bf16=native), [7.2] * 20, tmp_path)
        run.side.speed_reader = lambda workload: asked.append(workload) or SpeedReading(workload, 80.0, 1.0, 5, 2)
        run.time_until_decided()
        assert set(asked) == {expected} and run.record.environment.speed_reference.workload == expected


def test_every_round_leaves_a_checkpoint_that_says_the_run_did_not_finish(thresholds, cpu, tmp_path):
    """If the process dies after any round (SIGKILL, OOM), run.json holds what was measured so far,
    marked unfinished, so `guard check` reports an invalid run with those samples (issue #11, 7)."""
    from guard.model.jsonfiles import load_run

    run, driver, _ = scripted_run(thresholds, cpu, [7.0] * 40, tmp_path)
    run.warm_up()
    first = load_run(tmp_path / "run.json")
    assert [o.warmup for o in first.outcomes] == [True] * cpu.workload.warmup_requests
    assert first.invalid_reasons == [InvalidReason(ReasonKind.UNFINISHED,
                                                   "the run did not finish: the last checkpoint was written after warm-up")]
    run.measure(3)
    second = load_run(tmp_path / "run.json")
    assert len(second.ttft_client_s()) == 3
    assert [r.text for r in second.invalid_reasons] == ["the run did not finish: the last checkpoint was written after round 1"]
    assert run.record.invalid_reasons == []  # the live record is not marked: only the file on disk
    assert evaluate(cpu, second).verdict == Verdict.INVALID


def test_every_side_offers_the_whole_interface(cpu, tmp_path):
    """Each engine side answers every EngineSide method with a method (no attribute of the same
    name shadows one), before anything is started."""
    import sys

    from guard.measure.server import ServerSide
    from guard.measure.side import EngineSide
    from guard.measure.worker import WorkerSide

    methods = [n for n, v in vars(EngineSide).items() if callable(v) and not n.startswith("_")]
    assert {"start", "launch", "run", "count_ops", "op_count_side", "pause", "resume", "kill", "close"} <= set(methods)
    sides = (InProcessSide(cpu), ServerSide(cpu, tmp_path), ServerSide(cpu, tmp_path, url="http://127.0.0.1:1"),
             WorkerSide("candidate", sys.executable, tmp_path, thresholds=tmp_path / "t.yaml", profile=cpu))
    for side in sides:
        for name in methods:
            assert callable(getattr(side, name)), f"{type(side).__name__}.{name}"
        assert isinstance(side.environment, dict)


class RecordedProfileSide(ScriptedSide):
    """The scripted side whose profiled request reads a recorded real profile of the engine
    (tests/fixtures/profiles, taken by `guard selftest`) instead of profiling one."""

    def __init__(self, profile, script, events):
        super().__init__(profile, script)
        self.events = events

    def count_ops(self, job, on_outcome, files):
        from guard.measure.probes import attribute
        from guard.measure.side import ProfiledRequest

        outcomes = self.run([job], "profiled", on_outcome)
        return ProfiledRequest(outcomes, attribute(self.events, self.profile.ops, job.image_size))


def test_a_scope_whose_function_never_runs_makes_the_run_invalid_not_a_pass(thresholds, tmp_path):
    """As if vLLM renamed the mask function: over a real recorded request the op budget's scope is
    never entered, so its "0 calls" would prove nothing. The profile pass records why, the verdict
    is invalid (exit 3), and the terminal says which budget."""
    from guard.measure.probes import load_events
    from guard.measure.single_run import run_side
    from guard.model.records import Measures
    from guard.report.terminal import render_terminal
    from tests.test_probes import FIXTURES, MASK

    renamed = dataclasses.replace(MASK, scope=dataclasses.replace(MASK.scope, function="_build_legacy_mask"))
    profile = dataclasses.replace(thresholds.profile("cpu"), ops=(renamed,), census=None)
    profile = dataclasses.replace(profile, workload=dataclasses.replace(profile.workload, profile_image_sizes=((640, 480),)))
    side = RecordedProfileSide(profile, [5.0] * 4, load_events(FIXTURES / "current-640x480.events.json.gz"))
    run = GuardRun(thresholds, profile, Hardware(cuda=False, gpu_name=None, cpu_name="Test CPU", cpu_count=2), tmp_path,
                   progress=lambda m: None, side=side, environment=dict(CPU_ENV),
                   contention=ContentionSampler(proc=tmp_path / "no-proc"))
    record = run_side(run, Measures.OPS)
    assert [r.kind for r in record.invalid_reasons] == [ReasonKind.SCOPE_NEVER_ENTERED]
    assert "mask_path [640x480]" in record.invalid_reasons[0].text
    results = evaluate(profile, record)
    assert results.verdict == Verdict.INVALID
    judged = [r.text for r in results.judged_invalid_reasons if r.kind == ReasonKind.SCOPE_NEVER_ENTERED]
    assert any("'mask_path' was never entered" in t for t in judged), judged
    shown = render_terminal(results)
    assert "INVALID RUN" in shown and "mask_path" in shown


def test_a_run_whose_every_warm_up_failed_measures_nothing(thresholds, cpu, tmp_path):
    """A server that hangs costs each request its timeout (600 s): with every warm-up failed, the
    timing pass stops there and says why, instead of spending every round on it."""
    from guard.measure.single_run import timing_pass

    warmups = cpu.workload.warmup_requests
    assert warmups >= 1
    run, driver, _ = scripted_run(thresholds, cpu, [None] * warmups, tmp_path)
    reasons = timing_pass(run)
    assert driver.counts == [warmups]  # no measured round was sent
    assert [r.kind for r in reasons] == [ReasonKind.REQUEST_FAILED]
    assert "every warm-up request failed, first: timed out after 600 s" in reasons[0].text
