"""benchmarks/rule_floors.py on the recorded replays and holdouts: its offline re-judgement is
faithful to what guard said when they ran, and the finding docs/census.md reports still holds."""

from __future__ import annotations

import dataclasses

import pytest

from tests.conftest import benchmark_script


@pytest.fixture(scope="module")
def floors():
    with benchmark_script("rule_floors") as script:
        yield script


@pytest.fixture(scope="module")
def recorded(floors):
    replay, holdouts = floors.replay_data(), floors.holdout_data()
    return replay.rows + holdouts.rows, replay.replaced


def test_the_shipped_floors_reproduce_every_recorded_verdict_and_reason(floors, recorded) -> None:
    rows, replaced = recorded
    # the records are all there: nine models, both heads of seven holdouts, the earlier runs too
    assert len({r.model for r in rows}) == 9 and len(rows) >= 230 and len(replaced) >= 30
    assert {r.kind for r in rows} == {floors.BENIGN, floors.REGRESSION, floors.REAL_GROWTH, floors.SLOW_HEAD,
                                      floors.REFACTOR_HEAD}
    assert floors.cross_check(rows + replaced) == []


def test_the_cross_check_fails_a_row_recorded_otherwise(floors, recorded) -> None:
    rows, _ = recorded
    padding = next(r for r in rows if r.function.endswith("_prepare_padding_mask") and r.recorded_reason is not None)
    said_failed = dataclasses.replace(padding, recorded_status="fail")
    other_reason = dataclasses.replace(padding, recorded_reason="new function with 8 op calls")
    assert len(floors.cross_check([said_failed, other_reason])) == 2


def test_a_rows_census_pair_gives_the_rule_its_growth_moves_and_watched_ops(floors) -> None:
    rule = floors.shipped_rule("deepseek-ocr-2")
    row = floors.Row("test", "pair", "deepseek-ocr-2", "vllm/x.py:f", "640x480", None, 20, 12, (), "pass", None,
                     floors.BENIGN)
    # new -> 20 with 12 moved in: 8 calls of its own, at the floor
    assert floors.judged(row, rule)[0] == "pass"
    assert floors.judged(row, floors.with_floors(rule, {"new_function_max_calls": 7}))[0] == "fail"
    grown = dataclasses.replace(row, baseline_calls=100, measured_calls=117, moved_calls=0)
    assert floors.judged(grown, rule) == ("fail", "+17 op calls: more than 2 % of 100 and more than min_growth_calls 16")
    synced = dataclasses.replace(grown, measured_calls=101, watched=(("aten::_local_scalar_dense", 1),))
    loose = floors.with_floors(rule, {"min_growth_calls": 1000, "max_growth_pct": 1000})
    assert floors.judged(synced, loose) == ("fail", "watched op(s) grew in the request: +1 aten::_local_scalar_dense")
    with pytest.raises(ValueError):
        floors.census_pair(dataclasses.replace(row, measured_calls=5))


def test_a_notice_line_reads_as_its_function_counts_and_moves(floors) -> None:
    moved = floors.NOTICE.match("census: moved: 11 op calls from vllm/a.py:A.f, vllm/b.py:g to vllm/c.py:C.h "
                                "[640x480]: new → 15 op calls (+4 aten::view, +2 aten::to, ... 2 more)")
    assert (moved["fn"], moved["where"], moved["b"], moved["m"], moved["moved"]) == (
        "vllm/c.py:C.h", "640x480", "new", "15", "11")
    better = floors.NOTICE.match("census: improvement: vllm/s.py:f [decode seeded, per step]: 4 → gone op calls (-1 x)")
    assert (better["fn"], better["where"], better["b"], better["m"], better["moved"]) == (
        "vllm/s.py:f", "decode seeded, per step", "4", "gone", None)


def test_today_no_false_alarm_and_one_call_less_for_new_functions_fails_the_padding_mask(floors, recorded) -> None:
    """docs/census.md's finding: new_function_max_calls 7 fails vLLM 0.31's 8-call padding mask in
    every model that ran 0.30 -> 0.31, and nothing else; today's floors flag no benign function."""
    rows, _ = recorded
    today = floors.outcome(rows, floors.SHIPPED)
    assert today.failed(rows, floors.BENIGN, floors.REFACTOR_HEAD) == []
    assert {r.model for r in today.failed(rows, floors.SLOW_HEAD)} == {r.model for r in rows if r.kind == floors.SLOW_HEAD}
    stricter = floors.outcome(rows, dict(floors.SHIPPED, new_function_max_calls=7))
    newly = [r for r in rows if r.key in stricter.failing - today.failing]
    assert {floors.short(r.function) for r in newly} == {"gpu_model_runner.py:GPUModelRunner._prepare_padding_mask"}
    assert {r.kind for r in newly} == {floors.BENIGN} and len({r.model for r in newly}) == 7


def test_at_real_depth_the_records_rejudge_as_recorded_and_the_rule_flags_only_per_layer_growth(floors) -> None:
    """The replays and holdouts re-run on the real-structured checkpoints (issue #58): the shipped floors
    give back every recorded verdict, every slow head still fails, no benign change is flagged, and what
    the rule now flags side against side is per-layer host work of two refactors (0.30's MoE buffers,
    0.32's per-layer-norm dtype lookup), each passed in the replay only by the committed census."""
    replay = floors.replay_data(floors.REAL_REPLAY_FILES, documented=False)
    holdouts = floors.holdout_data(floors.REAL_HOLDOUTS_FILE)
    rows = replay.rows + holdouts.rows
    assert floors.cross_check(rows) == []
    today = floors.outcome(rows, floors.SHIPPED)
    assert today.failed(replay.rows, floors.BENIGN) == []
    grown = today.failed(replay.rows, floors.REAL_GROWTH)
    assert {r.function.rsplit(":", 1)[1] for r in grown} == {
        "LayerNorm._compute_dtype", "FusedMoEKernelModularImpl._allocate_buffers", "_resize_cache", "_grouped_topk"}
    assert all(r.committed_baseline_accepted and r.measured_calls >= 22 for r in grown)
    slow = [r for r in holdouts.rows if r.kind == floors.SLOW_HEAD]
    assert {r.model for r in today.failed(slow, floors.SLOW_HEAD)} == {r.model for r in slow}
