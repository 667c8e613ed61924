"""guard.report.markdown: the report people read on the PR, and what run data can (not) do to it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from guard.report.markdown import code, render_markdown, text
from guard.judge.stats import percentile
from guard.model.jsonfiles import load_results
from guard.model.records import InvalidReason, ReasonKind, OpSite, Status, Verdict
from guard.model.results import Results

FIXTURE = Path(__file__).parent / "fixtures" / "synthetic-a10-regression.results.json"
HOSTILE = ("x | y `z` <img src=x onerror=alert(1)> </details> & [a](javascript:alert(1)) **b** _c_ @maintainers"
           "\n# not a heading\r\n- not a list")


@pytest.fixture
def regression() -> Results:
    return load_results(FIXTURE)


def passing(res: Results) -> Results:
    return dataclasses.replace(
        res, verdict=Verdict.PASS, notices=(),
        ttft_checks=tuple(dataclasses.replace(c, status=Status.PASS) for c in res.ttft_checks),
        op_checks=tuple(dataclasses.replace(c, status=Status.PASS, measured_calls=0) for c in res.op_checks))


def html(markdown: str) -> str:
    """GitHub-flavoured rendering (tables on, raw HTML passed through, as GitHub would before sanitising)."""
    import markdown_it  # a declared dev dependency: a missing one must fail, not skip
    return markdown_it.MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"]).render(markdown)


def table_after(md: str, heading: str) -> list[str]:
    lines = md.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("|") and i > lines.index(heading))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def cells(row: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]


# ----------------------------------------------------------------------------- content
def test_regression_report_has_headline_tables_sites_and_footer(regression):
    md = render_markdown(regression, run_url="https://github.com/acme/guarded/actions/runs/42")
    assert md.startswith("## ❌ guard: regression — deepseek-ocr-2 on `a10`\n")
    assert "**5 of 6 budgets exceeded, 2 finding(s):**" in md
    # each finding once: TTFT, then the code path whose op budgets failed (no census function explains it)
    assert "\n**1. TTFT**\n" in md and "\n**2. code path `mask_path`**: 3 op budget(s) exceeded" in md
    assert "Where the offending calls came from" not in md

    ttft = table_after(md, "### Time to first token")
    assert cells(ttft[0]) == ["percentile", "budget", "measured", "delta", "95 % CI (ms)", "samples", "rounds", "status"]
    assert cells(ttft[2]) == ["`p50`", "2511 ms", "2619 ms", "+4.3 %", "[2615, 2623]", "100", "1", "❌ fail"]
    assert cells(ttft[3])[-1] == "❌ fail"  # p99 at n=100: no upper bound, but its lower bound is over 2521

    ops = table_after(md, "### Operator counts per request")
    assert cells(ops[0]) == ["scope", "image size", "op", "budget (calls)", "measured (calls)", "excess", "status"]
    assert ["`mask_path`", "1024×1024", "`aten::_index_put_impl_`", "≤ 0", "12", "+12 calls", "❌ fail"] \
        in [cells(r) for r in ops]
    assert ["`mask_path`", "1024×1024", "`cuda::sync`", "≤ 0", "0", "—", "✅ pass"] in [cells(r) for r in ops]
    assert ["`mask_path`", "1024×1024", "`total_ops`", "≤ 4", "26", "+22 calls, 6.5x the budget", "❌ fail"] \
        in [cells(r) for r in ops]

    # the failing op's code site, and only its own op's sites under it
    sites_at = md.index("**`mask_path` [1024×1024] `aten::_index_put_impl_`**")
    block = md[sites_at: md.index("**`mask_path` [1024×1024] `cuda::memcpy_htod`**")]
    assert "| 12 | `aten::_index_put_impl_` | `_update_causal_mask` | `vllm/model_executor/models/deepencoder2.py:214` |" in block
    assert "memcpy" not in block

    assert "- GPU state (other processes, throttling) was not checked: NVML could not be read" in md  # guard's own notice
    assert "guard check --profile a10 --thresholds thresholds/deepseek-ocr-2.yaml\n" in md
    assert ("guard update-thresholds --from guard-results/results.json --profile a10 "
            "--thresholds thresholds/deepseek-ocr-2.yaml\n") in md
    assert "| `gpu` | `NVIDIA A10` |" in md
    env_at = md.index("<details><summary>Environment</summary>")
    assert md.index("| `gpu` | `NVIDIA A10` |") > env_at
    assert "[workflow run](https://github.com/acme/guarded/actions/runs/42)" in md
    assert md.count("<details>") == md.count("</details>") == 5  # + the op table, folded: its failures are findings


def test_mermaid_chart_shows_deciles_against_budgets_and_the_interval(regression):
    md = render_markdown(regression)
    chart = re.search(r"```mermaid\n(.*?)```", md, re.S)
    assert chart, md
    body = chart.group(1)
    assert body.startswith("%%{init: ") and "\nxychart-beta\n" in body
    # categorical x-axis (deciles and each budgeted percentile): no fractional ticks, no bars cut at the edges
    assert "x-axis [p10, p20, p30, p40, p50, p60, p70, p80, p90, p99]" in body
    bars = [float(v) for v in re.search(r"bar \[(.*?)\]", body).group(1).split(", ")]
    samples = regression.run.ttft_client_s()
    assert bars == [round(percentile(samples, p) * 1000) for p in (*range(10, 100, 10), 99)]  # ms, no warm-ups
    lines = [set(ln.split(", ")) for ln in re.findall(r"line \[(.*?)\]", body)]
    assert lines == [{"2511"}, {"2521"}, {"2615"}, {"2623"}]  # budgets, then p50's interval
    palette = re.search(r'"plotColorPalette": "(.*?)"', body).group(1).split(", ")
    assert len(palette) == 1 + len(lines)  # one colour per series, named in the legend
    assert "Lines: p50 budget 2511 ms (red), p99 budget 2521 ms (purple)." in md
    assert "Orange lines: the 95 % interval of p50 [2615, 2623] ms." in md
    y_lo, y_hi = map(float, re.search(r'y-axis "TTFT \(ms\)" (\d+) --> (\d+)', body).groups())
    assert y_lo < min(bars) and y_hi > 2521  # every series inside the axis


def test_chart_says_when_the_interval_has_an_open_side(regression):
    open_side = dataclasses.replace(regression.ttft_checks[0], interval_ms=(2610.0, float("inf")))
    md = render_markdown(dataclasses.replace(regression, ttft_checks=(open_side, *regression.ttft_checks[1:])))
    assert "one side is unbounded" in md
    assert "inf" not in re.search(r"```mermaid\n(.*?)```", md, re.S).group(1)


def test_pass_and_invalid_headlines(regression):
    md = render_markdown(passing(regression))
    assert md.splitlines()[0].startswith("## ✅ guard: pass")
    assert "**All 6 budgets held.**" in md
    assert "Where the offending calls came from" not in md

    invalid = dataclasses.replace(regression, verdict=Verdict.INVALID, ttft_checks=(), op_checks=(),
                                  judged_invalid_reasons=(InvalidReason(ReasonKind.REQUEST_FAILED, "request 3 (1024x1024) failed: CUDA out of memory"),))
    md = render_markdown(invalid)
    assert md.splitlines()[0].startswith("## ⚠️ guard: invalid")
    assert "- request 3 (1024x1024) failed: CUDA out of memory" in md
    assert "budgets exceeded" not in md


def test_no_samples_no_chart(regression):
    run = dataclasses.replace(regression.run, outcomes=[])
    md = render_markdown(dataclasses.replace(regression, verdict=Verdict.INVALID, run=run,
                                             judged_invalid_reasons=(InvalidReason(ReasonKind.TOO_FEW_SAMPLES, "no TTFT samples were measured"),)))
    assert "```mermaid" not in md


# ----------------------------------------------------------------------------- escaping
def hostile_results(res: Results) -> Results:
    site = OpSite(location=HOSTILE, function="mask|fn", op="aten::_index_put_impl_", calls=3)
    counts = dataclasses.replace(res.run.op_counts[0], sites=(site,))
    run = dataclasses.replace(res.run, model="evil | model", profile="a10 `x`", op_counts=[counts],
                              thresholds_path="thresholds/$(rm -rf ~).yaml",
                              environment={"gpu": HOSTILE, HOSTILE: "v", "cmd": "vllm | tee"})
    ttft = tuple(dataclasses.replace(c, note=HOSTILE) for c in res.ttft_checks)
    return dataclasses.replace(res, run=run, ttft_checks=ttft, notices=(HOSTILE,), judged_invalid_reasons=(InvalidReason(ReasonKind.UNKNOWN, HOSTILE),),
                               verdict=Verdict.INVALID)


def test_run_strings_cannot_inject_html_or_break_structure(regression):
    md = render_markdown(hostile_results(regression), run_url="javascript:alert(1)")
    # no raw HTML from data, and our own <details> blocks stay balanced
    assert "<img" not in md
    assert not re.search(r"(?<!\\)\]\(javascript", md)  # no live link, from the data or from run_url
    assert md.count("<details>") == md.count("</details>") == 4  # the folded op table; an invalid run: no "Accept these numbers"
    # @-mentions are defused; "# ..." and "- ..." inside data never start a line
    assert "@maintainers" not in md and "@\u200bmaintainers" in md
    assert not any(ln.startswith(("# not", "- not")) for ln in md.splitlines())
    # every table row keeps its column count
    for heading in ("### Time to first token", "### Operator counts per request"):
        rows = table_after(md, heading)
        assert len({len(cells(r)) for r in rows}) == 1, rows
    # shell commands never carry run data
    assert "guard check --profile PROFILE --thresholds THRESHOLDS\n" in md


def test_rendered_html_has_no_injected_tags_and_intact_tables(regression):
    out = html(render_markdown(hostile_results(regression), run_url="javascript:alert(1)"))
    assert "<img" not in out and "<script" not in out and 'href="javascript' not in out
    assert "<h1>" not in out  # "# not a heading" stayed text
    assert out.count("<details>") == 4
    for table in re.findall(r"<table>.*?</table>", out, re.S):
        widths = {len(re.findall(r"<t[hd]", row)) for row in re.findall(r"<tr>.*?</tr>", table, re.S)}
        assert len(widths) == 1, table
    assert "&lt;img src=x onerror=alert(1)&gt;" in out  # shown, as text
    assert "<td><code>vllm | tee</code></td>" in out  # a pipe inside a cell stays in its cell


@pytest.mark.parametrize("value, expected", [
    ("a|b", "a\\|b"),
    ("`x`", "&#96;x&#96;"),
    ("<b>&", "&lt;b&gt;&amp;"),
    ("one\ntwo\r\nthree", "one two three"),
    ("- item", "\\- item"),
    ("1. item", "1\\. item"),
    ("0.1.0", "0.1.0"),
    ("*bold* _it_ [l](u)", "\\*bold\\* \\_it\\_ \\[l\\](u)"),
])
def test_text_escaping(value, expected):
    assert text(value) == expected


def test_code_spans_fall_back_to_text_when_they_could_not_hold_the_value():
    assert code("aten::add") == "`aten::add`"
    assert code("a|b", in_table=True) == "`a\\|b`"
    assert code("a`b") == "a&#96;b"
    assert code("line\nbreak") == "`line break`"


def test_render_markdown_never_adds_the_comment_marker(regression):
    assert "<!--" not in render_markdown(regression)


def test_unknown_status_is_shown_as_text(regression):
    odd = dataclasses.replace(regression.ttft_checks[0], status="weird<b>")
    md = render_markdown(dataclasses.replace(regression, ttft_checks=(odd,)))
    assert "weird&lt;b&gt;" in md


def test_failed_op_sites_name_the_scope_code_path() -> None:
    res = load_results(FIXTURE)
    where = "vllm/model_executor/models/deepencoder2.py:_update_causal_mask"
    res.run.op_counts = [dataclasses.replace(c, where=where) for c in res.run.op_counts]
    md = render_markdown(res)
    assert f"calls in `{where}`" in md


def test_the_accept_these_numbers_recipe_works_off_the_runner(tmp_path):
    """The comment's "Accept these numbers" command, run as printed at a repository's root with the
    artifact unpacked into guard-results/, on a real run's results.json (recorded on another
    machine: its thresholds path does not exist here)."""
    import shlex
    import shutil

    from guard.model.jsonfiles import load_results
    from tests.conftest import REPO, engine_as_recorded, run_guard

    source = REPO / "tests" / "fixtures" / "runs" / "cpu-float32-clean.json"
    recorded_at = load_results(source).run.thresholds_path  # the runner's path, not this machine's
    shutil.copytree(REPO / "thresholds", tmp_path / "thresholds")
    engine_as_recorded(tmp_path / "thresholds" / "deepseek-ocr-2.yaml", source)
    (tmp_path / "guard-results").mkdir()
    shutil.copyfile(source, tmp_path / "guard-results" / "results.json")
    body = render_markdown(load_results(source), thresholds="thresholds/deepseek-ocr-2.yaml")
    (command,) = [line for line in body.splitlines() if line.startswith("guard update-thresholds")]
    assert "--thresholds thresholds/deepseek-ocr-2.yaml" in command
    before = (tmp_path / "thresholds" / "deepseek-ocr-2.yaml").read_text()
    done = run_guard(*shlex.split(command)[1:], cwd=tmp_path)  # exactly as printed
    assert done.returncode == 0, done.stdout + done.stderr
    assert recorded_at not in done.stdout + done.stderr
    after = (tmp_path / "thresholds" / "deepseek-ocr-2.yaml").read_text()
    assert after != before or "no changes" in done.stdout  # it edited the copy at the repository's root
