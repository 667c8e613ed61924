"""guard.report.terminal: the tables and the verdict line, from the recorded regression fixture."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from guard.model.jsonfiles import load_results
from guard.model.records import InvalidReason, ReasonKind, Status, Verdict
from guard.report.terminal import render_terminal, sites_lines

FIXTURE = Path(__file__).parent / "fixtures" / "synthetic-a10-regression.results.json"


def test_regression_shows_tables_sites_and_one_sentence_per_failure():
    res = load_results(FIXTURE)
    out = render_terminal(res)
    lines = out.splitlines()
    assert lines[0] == "TTFT over 100 requests in 1 round(s): p50 2619 ms · p90 2637 ms · p99 2666 ms"
    row = next(ln for ln in lines if ln.startswith("ttft p50"))
    assert row.split() == ["ttft", "p50", "2511", "ms", "2619", "ms", "+4.3", "%", "[2615,", "2623]", "100", "FAIL"]
    op_row = next(ln for ln in lines if "aten::_index_put_impl_" in ln and ln.startswith("mask_path"))
    assert op_row.split() == ["mask_path", "1024x1024", "aten::_index_put_impl_", "<=", "0", "12", "FAIL"]
    assert "  calls in mask_path [1024x1024] came from:" in lines
    assert lines[-6] == "REGRESSION: deepseek-ocr-2 on profile 'a10': 5 budget(s) exceeded:"
    assert lines[-1].startswith("  - all ops (total_ops) in mask_path [1024x1024]: 26 calls per request")


def test_pass_counts_judged_budgets_and_lists_no_sites():
    res = load_results(FIXTURE)
    ops = tuple(dataclasses.replace(c, status=Status.PASS) for c in res.op_checks)
    ttft = (dataclasses.replace(res.ttft_checks[0], status=Status.NOT_JUDGED),
            dataclasses.replace(res.ttft_checks[1], status=Status.PASS))
    passing = dataclasses.replace(res, verdict=Verdict.PASS, op_checks=ops, ttft_checks=ttft, notices=())
    out = render_terminal(passing)
    assert out.splitlines()[-1] == "PASS: deepseek-ocr-2 on profile 'a10': all 5 budgets held"
    assert "not judged" in out and sites_lines(passing) == []


def test_invalid_run_lists_every_reason():
    res = dataclasses.replace(load_results(FIXTURE), verdict=Verdict.INVALID, judged_invalid_reasons=(InvalidReason(ReasonKind.ENGINE, "engine died"),))
    out = render_terminal(res)
    assert "invalid: engine died" in out
    assert out.splitlines()[-1].startswith("INVALID RUN: deepseek-ocr-2 on profile 'a10'")
