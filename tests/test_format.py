"""guard.model.format: how every view writes numbers, intervals, sizes, rules and failures."""

from __future__ import annotations

import math

import pytest

from guard.model import format as fmt
from guard.model.records import TOTAL_OPS, Rule, Status
from guard.model.checks import OpCheck, LatencyCheck


def op(measured: int, budget: int, rule: Rule = Rule.MAX, name: str = "aten::copy_") -> OpCheck:
    return OpCheck(scope="mask_path", image_size=(640, 480), op=name, rule=rule, budget_calls=budget,
                   measured_calls=measured, status=Status.FAIL)


def ttft(measured: float = 2619.4, budget: float = 2511) -> LatencyCheck:
    return LatencyCheck(percentile="p50", budget_ms=budget, measured_ms=measured, interval_ms=(2610.0, math.inf),
                     samples=100, rounds=2, confidence=0.95, status=Status.FAIL)


@pytest.mark.parametrize("bounds, text", [
    ((7012.4, math.inf), "[7012, ∞)"),
    ((-math.inf, math.inf), "(-∞, ∞)"),
    ((5938.2, 6572.5), "[5938, 6572]"),
])
def test_interval_shows_unbounded_sides(bounds, text):
    assert fmt.interval(bounds) == text


def test_units_sizes_and_rules():
    assert fmt.seconds_as_ms(6.0864) == "6086 ms"
    assert fmt.size((800, 400)) == "800x400"
    assert fmt.rule(Rule.MAX, 4) == "<= 4" and fmt.rule(Rule.EXACT, 0, "calls") == "== 0 calls"
    assert fmt.calls(1) == "1 call" and fmt.calls(513) == "513 calls"
    assert fmt.confidence(0.95) == "95 %"


def test_delta_is_relative_only_where_a_budget_is_not_zero():
    assert fmt.delta_pct(2619.4, 2511) == "+4.3 %"
    assert fmt.delta_pct(5, 0) is None


@pytest.mark.parametrize("measured, budget, text", [
    (6195, 4, "+6191 calls, 1,549x the budget"),  # a percentage of a tiny budget says nothing
    (513, 0, "+513 calls"),  # no factor of zero
    (5, 4, "+1 call"),  # under 2x: the calls alone
])
def test_op_excess_is_in_calls_with_a_factor_where_it_helps(measured, budget, text):
    assert fmt.op_excess(op(measured, budget)) == text


def test_failure_sentences_name_what_measured_budget_and_by_how_much():
    assert fmt.failure(ttft()) == ("TTFT p50 2619 ms is over its budget <= 2511 ms (+4.3 %; 95 % interval "
                                   "[2610, ∞) ms, n=100)")
    assert fmt.failure(op(513, 0, name="aten::_index_put_impl_")) == (
        "aten::_index_put_impl_ in mask_path [640x480]: 513 calls per request, budget at most 0 (+513 calls)")
    assert fmt.failure(op(3, 2, Rule.EXACT, TOTAL_OPS)).startswith("all ops (total_ops) in mask_path [640x480]: "
                                                                  "3 calls per request, budget exactly 2")


def test_labels_are_typed_and_unknown_records_are_refused():
    assert fmt.label(ttft()) == "ttft p50"
    assert fmt.label(op(1, 0)) == "mask_path [640x480] aten::copy_"
    with pytest.raises(TypeError):
        fmt.label("ttft_ms.p50")  # a string is no check
