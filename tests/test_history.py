"""The history of main: the store (round trip, errors with file:line:field, duplicates), `guard record`
and `guard history` through the real CLI on the committed stores of recorded identical runs, the
change-point method (nothing on identical runs, an injected +10 % step at its commit), the PNG and
Mermaid charts, and the PR comment's "Against main's recent history" section."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest

from guard.errors import ConfigError, InvalidRunError, UsageError
from guard.history import chart
from guard.history.analysis import analyse, pr_standing, standing
from guard.history.changepoints import change_points
from guard.history.store import (append, census_digest, load_history, parse_history,
                                 record_from_results, record_to_dict, to_line)
from guard.report.markdown import render_markdown
from guard.model.jsonfiles import load_results, write_json_atomic
from guard.model.records import Verdict
from guard.model.results import Results
from guard.judge.stats import percentile
from tests.conftest import run_guard

FIXTURES = Path(__file__).parent / "fixtures"
STORES = sorted((FIXTURES / "history").glob("identical-*.jsonl"))
ZEN5 = FIXTURES / "history" / "identical-zen5.jsonl"
REAL_RUN = FIXTURES / "pr" / "mask-loop.results.json"  # a real run: its environment and census
SHA = "0123456789abcdef0123456789abcdef01234567"
TTFT_S = (6.10, 6.32, 5.98, 6.45, 6.21, 6.05)


def check_results(tmp_path: Path, *, commit: str | None = SHA, verdict: str = "pass", ttft_s=TTFT_S) -> Path:
    """A `guard check` results.json: the real run's environment and census, six measured requests."""
    d = json.loads(REAL_RUN.read_text(encoding="utf-8"))
    d.pop("pr")
    d["ab"] = None
    d["verdict"] = verdict
    d["checks"] = {"ttft": [], "ops": [], "ops_not_measured": [], "ttft_vs_baseline": [], "census": []}
    run = d["run"]
    run["environment"]["git_commit"] = commit
    run["outcomes"] += [{"index": 10 + i, "image_size": [640, 480], "warmup": False, "success": True,
                         "ttft_client_s": t, "ttft_engine_s": t - 0.01, "prompt_tokens": 267, "error": None}
                        for i, t in enumerate(ttft_s)]
    if verdict == "invalid":
        run["invalid_reasons"] = ["engine died"]  # a version 2 file, as REAL_RUN is
    path = tmp_path / "results.json"
    write_json_atomic(path, d)
    return path


@pytest.fixture
def results(tmp_path) -> Results:
    return load_results(check_results(tmp_path))


@pytest.fixture
def store(tmp_path) -> Path:
    """A copy of the committed zen5 store (29 real runs), to append to."""
    path = tmp_path / "history.jsonl"
    shutil.copy(ZEN5, path)
    return path


# ----------------------------------------------------------------------------- the store
def test_a_run_becomes_one_record_and_round_trips(results, tmp_path):
    r = record_from_results(results)
    assert r.commit == SHA and r.profile == "cpu" and r.model == "deepseek-ocr-2" and r.verdict == Verdict.PASS
    assert r.ttft_p50_ms == pytest.approx(percentile(TTFT_S, 50) * 1000, abs=1e-3)
    assert r.ttft_p90_ms == pytest.approx(percentile(TTFT_S, 90) * 1000, abs=1e-3)
    assert r.samples == len(TTFT_S)
    assert r.machine == "AMD EPYC (2 cores, native bf16)" and r.dtype == "bfloat16"
    census = results.run.census
    assert [(c.image_size, c.functions) for c in r.census] == [((640, 480), len(census["640x480"])),
                                                                 ((800, 400), len(census["800x400"]))]
    assert r.census_calls == sum(sum(ops.values()) for fns in census.values() for ops in fns.values())
    assert r.census_digest == census_digest(census) and len(r.census_digest) == 16
    line = to_line(r)
    assert line == json.dumps(record_to_dict(r), separators=(",", ":")) + "\n"  # one compact line
    assert parse_history(line, "h.jsonl") == [r]


def test_the_committed_stores_read_back_and_hold_at_least_20_real_runs():
    total = 0
    for path in STORES:
        records = load_history(path)
        assert len({r.commit for r in records}) == len(records)
        assert all(r.note and "synthetic commit" in r.note for r in records)
        total += len(records)
    assert len(load_history(ZEN5)) >= 20 and total >= 100


GOOD = json.loads(ZEN5.read_text(encoding="utf-8").splitlines()[0])


@pytest.mark.parametrize("change, field", [
    ({"ttft_p50_ms": "fast"}, "ttft_p50_ms"),
    ({"ttft_p90_ms": -1}, "ttft_p90_ms"),
    ({"commit": "not-a-sha"}, "commit"),
    ({"samples": 0}, "samples"),
    ({"census": [{"image_size": [640], "calls": 1, "functions": 1}]}, "census[0].image_size"),
    ({"verdict": "invalid"}, "verdict"),
    ({"date": "yesterday"}, "date"),
    ({"date": "2026-12-02T14:11:04"}, "date"),
    ({"extra": 1}, "(record)"),
    ({"schema_version": 3}, "schema_version"),  # 1 and 2 are read; a newer guard wrote 3
])
def test_a_bad_record_is_named_by_file_line_and_field(change, field):
    second = {**GOOD, "commit": "f" * 40, **change}
    text = json.dumps(GOOD) + "\n" + json.dumps(second) + "\n"
    with pytest.raises(ConfigError) as e:
        parse_history(text, "main.jsonl")
    assert str(e.value).startswith(f"main.jsonl:2: {field}: "), str(e.value)


def test_a_missing_field_a_broken_line_and_an_empty_line_are_named_too():
    missing = {k: v for k, v in GOOD.items() if k != "census_digest"}
    for text, where in ((json.dumps(missing) + "\n", "h:1: (record): "), ('{"schema": \n', "h:1: (syntax): "),
                        (json.dumps(GOOD) + "\n\n", "h:2: (line): "), ("[1]\n", "h:1: (record): "),
                        (json.dumps({**GOOD, "ttft_p50_ms": float("nan")}) + "\n", "h:1: ttft_p50_ms: "),
                        # beyond any time guard records (1e400 does not even convert to a float), a key twice
                        (json.dumps({**GOOD, "ttft_p90_ms": 1.7e308}) + "\n", "h:1: ttft_p90_ms: "),
                        (json.dumps({**GOOD, "samples": 10**400}) + "\n", "h:1: samples: "),
                        (json.dumps(GOOD)[:-1] + ', "commit": "0000000"}\n', "h:1: commit: ")):
        with pytest.raises(ConfigError) as e:
            parse_history(text, "h")
        assert str(e.value).startswith(where), (where, str(e.value))
    with pytest.raises(ConfigError, match="census_digest"):
        parse_history(json.dumps(missing) + "\n", "h")
    with pytest.raises(ConfigError, match=r"ttft_p90_ms: not a record guard can read: 1\.7e\+308 is out of range"):
        parse_history(json.dumps({**GOOD, "ttft_p90_ms": 1.7e308}) + "\n", "h")
    with pytest.raises(ConfigError, match="commit: not a record guard can read: the key 'commit' is given twice"):
        parse_history(json.dumps(GOOD)[:-1] + ', "commit": "0000000"}\n', "h")


def test_the_same_commit_twice_in_a_file_is_an_error_at_the_second_line():
    text = json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "ttft_p50_ms": 1.0}) + "\n"
    with pytest.raises(ConfigError, match=r"^h:2: commit: .* is already on line 1"):
        parse_history(text, "h")
    other_profile = json.dumps({**GOOD, "profile": "a10"})
    assert len(parse_history(json.dumps(GOOD) + "\n" + other_profile + "\n", "h")) == 2


def test_append_refuses_a_recorded_commit_unless_replace_and_replaces_in_place(results, store):
    before = load_history(store)
    r = record_from_results(results, commit=before[3].commit)
    with pytest.raises(UsageError, match="already recorded \\(line 4\\)"):
        append(store, r)
    assert load_history(store) == before
    records, replaced = append(store, r, replace=True)
    assert replaced and len(records) == len(before) and records[3] == r and load_history(store) == records
    new = record_from_results(results)
    records, replaced = append(store, new)
    assert not replaced and records[-1] == new and len(load_history(store)) == len(before) + 1


def test_an_invalid_run_a_run_with_nothing_measured_and_a_run_without_a_commit_are_not_recorded(tmp_path):
    with pytest.raises(InvalidRunError, match="engine died"):
        record_from_results(load_results(check_results(tmp_path, verdict="invalid")))
    no_census = json.loads(check_results(tmp_path, ttft_s=()).read_text(encoding="utf-8"))
    no_census["run"]["census"] = {}
    write_json_atomic(tmp_path / "nothing.json", no_census)
    with pytest.raises(UsageError, match="neither TTFT samples nor a census"):
        record_from_results(load_results(tmp_path / "nothing.json"))
    with pytest.raises(UsageError, match="--commit"):
        record_from_results(load_results(check_results(tmp_path, commit=None)))
    # a canary run (guard check --inject) judged guard, not the commit: a real one, recorded with its regression
    with pytest.raises(UsageError, match="injected on purpose"):
        record_from_results(load_results(FIXTURES / "runs" / "cpu-float32-mutant-token-copies.json"), commit="1234567")


@pytest.mark.parametrize(("date", "problem"), [("yesterday", "is not an ISO 8601"), ("2026-12-02T14:11:04", "no UTC offset")])
def test_a_date_flag_the_history_would_refuse_is_named_as_the_flag(tmp_path, store, date, problem, capsys):
    from guard import cli

    before = store.read_bytes()
    code = cli.main(["record", "--from", str(check_results(tmp_path)), "--history", str(store), "--date", date])
    err = capsys.readouterr().err
    assert code == 2 and f"--date {date!r} " in err and problem in err and "line" not in err, err
    assert store.read_bytes() == before


# ----------------------------------------------------------------------------- ops-only runs (schema version 2)
def test_an_ops_only_check_is_recorded_with_its_census_and_no_ttft_as_version_2(tmp_path):
    r = record_from_results(load_results(check_results(tmp_path, ttft_s=())))
    assert (r.ttft_p50_ms, r.ttft_p90_ms, r.ttft_p99_ms, r.samples) == (None, None, None, 0) and not r.has_ttft
    assert r.census_calls > 0 and r.census_digest is not None
    d = json.loads(to_line(r))
    assert d["schema_version"] == 2 and d["ttft_p50_ms"] is None and d["samples"] == 0
    assert parse_history(to_line(r), "h.jsonl") == [r]


def test_a_record_with_ttft_is_still_written_as_version_1_byte_for_byte(results):
    """An older guard that reads version 1 only keeps reading every record that has TTFT."""
    d = json.loads(to_line(record_from_results(results)))
    assert d["schema_version"] == 1 and isinstance(d["ttft_p50_ms"], float) and d["samples"] == len(TTFT_S)
    assert list(d) == ["schema", "schema_version", "commit", "date", "profile", "model", "machine", "dtype",
                       "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "samples", "census", "census_digest", "verdict",
                       "guard_version"]


def test_the_committed_version_1_stores_read_unchanged_and_take_ops_only_records_after_them(tmp_path, store):
    old = load_history(ZEN5)
    assert {json.loads(line)["schema_version"] for line in ZEN5.read_text().splitlines()} == {1}
    ops = record_from_results(load_results(check_results(tmp_path, commit="ab" * 20, ttft_s=())))
    records, _ = append(store, ops)
    assert records[:-1] == old and records[-1] == ops
    text = store.read_text(encoding="utf-8")
    assert text.startswith(ZEN5.read_text(encoding="utf-8"))  # the old lines are kept as they were
    analysis = analyse("cpu", records)
    assert analysis.rows[-1].record is ops and analysis.rows[-1].shift is None
    axis = next(line for line in chart.mermaid(analysis.rows) if "x-axis" in line)
    assert f'"{ops.commit[:chart.AXIS_HEX]}"' not in axis and f'"{old[-1].commit[:chart.AXIS_HEX]}"' in axis
    chart.write_png(analysis.rows, tmp_path / "h.png", title="t")  # a gap in the TTFT lines, a census point
    assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("change", "field"), [
    ({"schema_version": 1, "ttft_p50_ms": None, "ttft_p90_ms": None, "ttft_p99_ms": None, "samples": 0}, "ttft_p"),
    ({"schema_version": 2, "ttft_p50_ms": None}, "ttft_p50_ms"),  # some percentiles null, others not
    ({"schema_version": 2, "ttft_p50_ms": None, "ttft_p90_ms": None, "ttft_p99_ms": None, "samples": 6}, "samples"),
    ({"schema_version": 2, "ttft_p50_ms": None, "ttft_p90_ms": None, "ttft_p99_ms": None, "samples": 0,
      "census": [], "census_digest": None}, "census"),
    ({"schema_version": 1, "samples": 0}, "samples"),
])
def test_a_record_without_ttft_must_be_version_2_and_hold_a_census(change, field):
    bad = {**GOOD, **change}
    with pytest.raises(ConfigError) as e:
        parse_history(json.dumps(bad) + "\n", "h.jsonl")
    assert e.value.key.startswith(field) and e.value.line == 1, str(e.value)


def test_guard_pr_ops_only_results_record_heads_census_at_heads_commit(tmp_path):
    """The real `guard pr --only ops` results (tests/fixtures/pr): head's side, head's commit."""
    res = load_results(REAL_RUN)
    r = record_from_results(res)
    assert r.commit == res.pr.head.sha and not r.has_ttft and r.verdict == Verdict.REGRESSION
    assert r.census_digest == census_digest(res.run.census)
    out = run_guard("record", "--from", str(REAL_RUN), "--history", str(tmp_path / "h.jsonl"), timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"appended {res.pr.head.sha[:12]} (cpu)" in out.stdout and "no TTFT (an ops-only run)" in out.stdout
    shown = run_guard("history", "--history", str(tmp_path / "h.jsonl"), timeout=120)
    assert shown.returncode == 0, shown.stderr
    row = next(line for line in shown.stdout.splitlines() if line.startswith(res.pr.head.sha[:7]))
    assert row.split()[3:6] == ["-", "-", "ops"] and str(r.census_calls) in row


# ----------------------------------------------------------------------------- the commands
def test_guard_record_and_guard_history_through_the_cli(tmp_path, store):
    res = check_results(tmp_path)
    out = run_guard("record", "--from", str(res), "--history", str(store), timeout=120)
    assert out.returncode == 0, out.stderr
    assert re.search(r"appended 0123456789ab \(cpu\) .*TTFT p50 \d+ ms.*; 30 record\(s\)", out.stdout), out.stdout
    again = run_guard("record", "--from", str(res), "--history", str(store), timeout=120)
    assert again.returncode == 2 and "already recorded (line 30)" in again.stderr and "--replace" in again.stderr
    replaced = run_guard("record", "--from", str(res), "--history", str(store), "--replace", "--note", "run 7",
                         timeout=120)
    assert replaced.returncode == 0 and "replaced" in replaced.stdout
    assert load_history(store)[-1].note == "run 7" and len(load_history(store)) == 30
    bad_sha = run_guard("record", "--from", str(res), "--history", str(store), "--commit", "HEAD", timeout=120)
    assert bad_sha.returncode == 2 and "not a commit hash" in bad_sha.stderr

    png, mmd = tmp_path / "h.png", tmp_path / "h.mmd"
    shown = run_guard("history", "--history", str(store), "--last", "10", "--png", str(png), "--mermaid", str(mmd),
                      timeout=120)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"guard history: {store}, profile cpu: 10 of 30 commit(s) shown")
    assert lines[1].split() == ["commit", "date", "p50", "p90", "n", "census", "calls"]
    [row] = [ln for ln in lines if ln.startswith("0123456")]
    assert lines.index(row) == 11 and "census changed" in row and "machine: AMD EPYC (2 cores" in row
    assert "census changed at: 0123456" in shown.stdout
    assert "lasting TTFT shifts" in shown.stdout and png.stat().st_size > 10_000 and "xychart-beta" in mmd.read_text()


def test_guard_history_names_a_bad_store_line_and_an_unknown_profile(tmp_path, store):
    store.write_text(store.read_text() + '{"schema": "guard/history"}\n')
    out = run_guard("history", "--history", str(store), timeout=120)
    assert out.returncode == 2 and f"{store}:30: (record): " in out.stderr
    shutil.copy(ZEN5, store)
    out = run_guard("history", "--history", str(store), "--profile", "a10", timeout=120)
    assert out.returncode == 2 and "no record of profile 'a10'" in out.stderr and "profiles in it: cpu" in out.stderr


# ----------------------------------------------------------------------------- change points
@pytest.mark.parametrize("path", STORES, ids=lambda p: p.stem)
def test_nothing_is_flagged_on_a_recorded_history_of_identical_runs(path):
    assert change_points([r.ttft_p50_ms for r in load_history(path)]) == []


@pytest.mark.parametrize("name", ["identical-zen5", "identical-zen4-1dec"])
def test_a_ten_percent_step_in_the_later_half_is_flagged_at_its_commit(name):
    records = load_history(FIXTURES / "history" / f"{name}.jsonl")
    k = len(records) // 2
    stepped = [dataclasses.replace(r, ttft_p50_ms=r.ttft_p50_ms * (1.10 if i >= k else 1)) for i, r in enumerate(records)]
    analysis = analyse("cpu", stepped)
    [shift] = analysis.shifts
    assert shift.index == k and analysis.rows[k].shift == shift
    assert 5 < shift.shift_pct < 15 and shift.lasting_pct >= 6


def test_a_single_outlier_or_a_speed_up_is_never_flagged():
    values = [r.ttft_p50_ms for r in load_history(ZEN5)]
    for i in range(len(values)):
        assert change_points([*values[:i], values[i] * 3, *values[i + 1:]]) == [], i
    k = len(values) // 2
    assert change_points([v * (0.8 if i >= k else 1) for i, v in enumerate(values)]) == []
    assert change_points([4000.0] * 8) == [] and change_points([4000.0] * 20) == []
    with pytest.raises(ValueError):
        change_points([1.0, 0.0] * 10)


def test_census_and_machine_changes_are_marked_against_the_previous_commit():
    records = load_history(ZEN5)
    moved = dataclasses.replace(records[5], census_digest="0" * 16)
    other = dataclasses.replace(records[9], machine="Intel Xeon (2 cores, no native bf16)")
    rows = analyse("cpu", [*records[:5], moved, *records[6:9], other, *records[10:]]).rows
    assert [i for i, r in enumerate(rows) if r.census_changed] == [5, 6]  # changed, then back
    assert [i for i, r in enumerate(rows) if r.machine_changed] == [9, 10]
    assert not any(r.census_changed for r in analyse("cpu", records).rows)


# ----------------------------------------------------------------------------- charts
def test_the_png_is_written_and_is_a_real_chart(tmp_path):
    from PIL import Image

    records = load_history(ZEN5)
    k = len(records) // 2
    stepped = [dataclasses.replace(r, ttft_p50_ms=r.ttft_p50_ms * (1.10 if i >= k else 1),
                                   census_digest="0" * 16 if i >= 20 else r.census_digest) for i, r in enumerate(records)]
    rows = analyse("cpu", stepped).rows
    path = tmp_path / "out" / "history.png"
    chart.write_png(rows, path, title="test")
    with Image.open(path) as img:
        assert img.format == "PNG" and img.width >= 800 and img.height >= 600
        small = img.convert("RGB").resize((200, 120))
        colours = len({small.getpixel((x, y)) for x in range(200) for y in range(120)})
    assert path.stat().st_size > 20_000 and colours > 50
    assert not list(path.parent.glob(".*.png"))  # no temp file left


def test_the_mermaid_chart_is_an_xychart_of_the_last_30_commits():
    records = load_history(FIXTURES / "history" / "identical-zen4-30nov.jsonl")
    lines = chart.mermaid(analyse("cpu", records).rows)
    assert lines[0] == "```mermaid" and lines[2] == "xychart-beta" and lines[-2] == "```"
    assert lines[1].startswith("%%{init: ") and lines[1].endswith("}%%")
    assert json.loads(lines[1][len("%%{init: "):-len("}%%")])["xyChart"]["width"] == 36 * 30
    assert re.fullmatch(r'    title "TTFT of main, last 30 commits \(ms\)"', lines[3])
    x = re.fullmatch(r"    x-axis \[(.*)\]", lines[4]).group(1).split(", ")
    assert x == [f'"{r.commit[:5]}"' for r in records[-30:]]
    lo, hi = map(float, re.fullmatch(r'    y-axis "TTFT \(ms\)" (\d+) --> (\d+)', lines[5]).groups())
    p50, p90 = ([float(v) for v in re.fullmatch(r"    line \[(.*)\]", ln).group(1).split(", ")] for ln in lines[6:8])
    assert p50 == [round(r.ttft_p50_ms) for r in records[-30:]] and len(p90) == 30
    assert lo <= min(p50) and hi >= max(p90)
    assert lines[-1].startswith("Dark line: p50") and "No lasting TTFT shift." in lines[-1]


# ----------------------------------------------------------------------------- the PR comment
def test_the_comment_places_the_run_in_mains_range_only_when_its_base_is_in_the_history(results):
    records = load_history(ZEN5)
    plain = render_markdown(results)
    assert render_markdown(results, history=pr_standing(results, None)) == plain
    assert render_markdown(results, history=pr_standing(results, records)) == plain  # no base known
    assert render_markdown(results, history=pr_standing(results, records, "f" * 40)) == plain  # base not in the history

    base = records[24]
    md = render_markdown(results, history=pr_standing(results, records, base.commit[:10]))
    assert md != plain and "### Against main's recent history" in md
    section = md.split("### Against main's recent history", 1)[1].split("\n### ", 1)[0]
    assert f"`{base.commit[:7]}`" in section
    window = records[5:25]
    lo, hi = min(r.ttft_p50_ms for r in window), max(r.ttft_p50_ms for r in window)
    assert f"| main, 20 commit(s) up to the base: min / median / max | {lo:.0f} / " in section
    assert f" / {hi:.0f} ms | |" in section
    p50 = percentile(TTFT_S, 50) * 1000
    assert f"| this run | {p50:.0f} ms | {record_from_results(results).census_calls} (" in section
    assert "above 20 of those 20 (percentile rank 100 %)" in section  # ~6.2 s on a ~3.7 s history
    assert "main's history was measured on AMD EPYC Zen 5" in section

    st = standing(records, profile="cpu", base=base.commit, p50_ms=base.ttft_p50_ms, census_calls=None)
    assert st.base == base and len(st.window) == 20 and 0 < st.rank_pct < 100
    assert standing(records, profile="a10", base=base.commit, p50_ms=1.0, census_calls=None) is None


def test_an_ops_only_base_in_the_history_shows_its_census_and_the_range_of_the_commits_with_ttft(results, tmp_path):
    records = load_history(ZEN5)
    ops = dataclasses.replace(record_from_results(load_results(check_results(tmp_path, commit="cd" * 20, ttft_s=()))))
    history = [*records[:25], ops]
    md = render_markdown(results, history=pr_standing(results, history, ops.commit))
    section = md.split("### Against main's recent history", 1)[1].split("\n### ", 1)[0]
    assert f"| base `{ops.commit[:7]}` | — | {ops.census_calls} |" in section
    window = records[6:25]  # the window is 20 records ending at the base; 19 of them measured TTFT
    lo = min(r.ttft_p50_ms for r in window)
    assert f"| main, 19 of 20 commit(s) (with TTFT) up to the base: min / median / max | {lo:.0f} / " in section
    assert "above 19 of those 19" in section
    only_ops = render_markdown(results, history=pr_standing(results, [ops], ops.commit))
    assert "min / median / max" not in only_ops and "percentile rank" not in only_ops


def test_guard_pr_results_use_the_measured_base_and_guard_comment_passes_the_history_through(tmp_path):
    pr = load_results(REAL_RUN)  # guard pr --only ops: no TTFT, a census, the base it measured
    record = dataclasses.replace(record_from_results(load_results(check_results(tmp_path))), commit=pr.pr.base.sha)
    history = tmp_path / "main.jsonl"
    history.write_text(to_line(record))
    md = render_markdown(pr, history=pr_standing(pr, load_history(history)))
    assert "| this run | — | " in md and "### Against main's recent history" in md

    res = check_results(tmp_path)
    out = run_guard("comment", "--results", str(res), "--dry-run", "--history", str(history),
                    "--history-base", pr.pr.base.sha, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "### Against main's recent history" in out.stdout and "percentile rank 50 %" in out.stdout
    out = run_guard("comment", "--results", str(res), "--dry-run", timeout=120)
    assert out.returncode == 0 and "Against main's recent history" not in out.stdout


def test_text_from_the_store_never_becomes_a_workflow_command_or_a_second_line(tmp_path, store, capsys):
    """The store is written from results.json artifacts: a machine name carrying
    "\\n::error ..." is shown on its own row, escaped, and no printed line starts a command."""
    from guard import cli

    lines = store.read_text().splitlines()
    last = json.loads(lines[-1])
    last["machine"] = "AMD EPYC\n::error title=pwn::injected\n::add-mask::x"
    store.write_text("\n".join([*lines[:-1], json.dumps(last)]) + "\n")
    assert cli.main(["history", "--history", str(store), "--last", "3", "--mermaid", "-"]) == 0
    out = capsys.readouterr().out
    assert not [ln for ln in out.splitlines() if ln.lstrip().startswith("::")], out
    assert "AMD EPYC\\n::error title=pwn::injected" in out


def test_two_records_at_once_both_land(tmp_path, store):
    """Read, change, replace without a lock: of two `guard record` runs at once, one record was lost
    while both said "appended". Real processes, 6 pairs."""
    import subprocess
    import sys as _sys

    res = check_results(tmp_path)
    before = len(load_history(store))
    code = ("import sys; from guard import cli; sys.exit(cli.main(['record', '--from', sys.argv[1], "
            "'--history', sys.argv[2], '--commit', sys.argv[3]]))")
    for i in range(6):
        procs = [subprocess.Popen([_sys.executable, "-c", code, str(res), str(store), f"{side}{i:06x}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for side in "ab"]
        assert [p.wait(timeout=120) for p in procs] == [0, 0], [p.stderr.read() for p in procs]
    assert len(load_history(store)) == before + 12
