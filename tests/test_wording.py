"""One word per concept in what people read (issue #60, item 6): the terminal report and the comment
rendered from a real guard pr result (tests/fixtures/pr/mask-loop.results.json)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from guard.model import format as fmt
from guard.model.jsonfiles import load_results
from guard.report.markdown import render_markdown
from guard.report.terminal import render_terminal

MASK_LOOP = Path(__file__).parent / "fixtures" / "pr" / "mask-loop.results.json"


def test_the_census_column_says_change_not_moved():
    """"moved" is what a refactor does to calls (the census rule's moved_calls); the column lists growth."""
    results = load_results(MASK_LOOP)
    terminal, comment = render_terminal(results), render_markdown(results)
    assert "change per op" in terminal and "ops that moved" not in terminal + comment
    assert "ops that grew most at" in comment


def test_identical_op_counts_name_the_budgeted_paths_not_every_scope():
    """Printed just above a census failure, the line must not read as "nothing changed anywhere"."""
    results = load_results(MASK_LOOP)
    same = dataclasses.replace(results, ab=dataclasses.replace(results.ab, op_diff=()))
    terminal = render_terminal(same)
    assert "every profiled scope" not in terminal + render_markdown(same)
    assert "identical on both sides in every budgeted code path" in terminal


def test_the_side_table_names_where_each_side_ran():
    results = load_results(MASK_LOOP)
    [row] = [ln for ln in render_terminal(results).splitlines() if ln.strip().startswith("python")]
    cells = row.split()
    assert len(cells) >= 3, row  # candidate and baseline both say where they ran


def test_added_lines_mark_the_unchanged_lines_between_them():
    assert fmt.added_snippet([(10, "a = 1"), (11, "b = 2"), (14, "c = 3"), (16, "d = 4")]) == [
        "   10 + a = 1", "   11 + b = 2", "        ... 2 unchanged lines", "   14 + c = 3",
        "        ... 1 unchanged line", "   16 + d = 4"]
