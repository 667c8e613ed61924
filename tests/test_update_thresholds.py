"""guard update-thresholds: golden files, minimal diffs, ratchet, hysteresis, refusals, atomic write.

Results are recorded data built from guard.model.records' dataclasses (no engine). Goldens live in
tests/fixtures/update/<case>/{input,expected}.yaml; REGEN_GOLDEN=1 rewrites the expected files.
"""

from __future__ import annotations

import datetime as dt
import difflib
import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import yaml

from guard import cli
from guard.config import yamledit
from guard.config.loading import load_thresholds
from guard.commands import update_thresholds as ut
from guard.errors import ConfigError
from guard.model.jsonfiles import results_to_dict, write_json_atomic
from guard.model.records import InvalidReason, ReasonKind as K, RequestOutcome, Rule, RunRecord, Status, Verdict
from guard.model.results import Results
from guard.model.checks import OpCheck, LatencyCheck
from guard.model.environment import SpeedReading, SpeedReference
from guard.measure.fit import ttft_binding_fits

FIXTURES = Path(__file__).parent / "fixtures" / "update"
REAL = Path(__file__).parent.parent / "thresholds" / "deepseek-ocr-2.yaml"
NOW = dt.datetime(2025, 6, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
# Keys as guard.measure.hardware.fingerprint writes them.
ENV = {"hardware_profile": "cpu", "git_commit": "0123456789abcdef0123456789abcdef01234567", "gpu": None,
       "cpu": "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", "cpu_count": 2, "cpu_isa": ["avx2", "avx512f"],
       "vllm": "0.32.0"}
BUDGET_CPU = {"cpu": "AMD EPYC", "cpu_count": 2, "cpu_isa": ["avx2", "avx512f", "avx512_bf16"]}  # the shipped binding's


@pytest.fixture(autouse=True)
def pinned(monkeypatch):
    """A fixed clock, and no `git rev-parse` against whatever checkout runs the tests."""
    monkeypatch.setattr(ut, "_utcnow", lambda: NOW)
    monkeypatch.setattr(ut, "git_commit", lambda cwd=None: None)


# ----------------------------------------------------------------------------- helpers
def make_results(path: Path, yaml_path: Path, *, profile: str = "cpu", ttft: dict[str, float] | None = None,
                 ops: dict[tuple[str, tuple[int, int]], dict[str, int]] | None = None, samples: int = 5,
                 verdict: str = "pass", invalid_reasons: tuple[InvalidReason, ...] = (),
                 run_invalid: tuple[InvalidReason, ...] = (),
                 env: dict | None = None, injected: str | None = None, config: dict | None = None,
                 model: str = "deepseek-ocr-2") -> Path:
    """Write a results.json as `guard check` would."""
    outcomes = [RequestOutcome(index=i, image_size=(640, 480), warmup=False, success=True, ttft_client_s=7.0)
                for i in range(samples)]
    run = RunRecord(profile=profile, thresholds_path=str(yaml_path), model=model,
                    environment=dict(ENV if env is None else env), outcomes=outcomes, rounds=1,
                    invalid_reasons=list(run_invalid), injected=injected)
    ttft_checks = tuple(LatencyCheck(percentile=k, budget_ms=1.0, measured_ms=v, interval_ms=(v, v), samples=samples,
                                  rounds=1, confidence=0.95, status=Status.PASS)
                        for k, v in (ttft or {}).items() if samples)
    op_checks = tuple(OpCheck(scope=scope, image_size=size, op=op, rule=Rule.MAX, budget_calls=0, measured_calls=n,
                              status=Status.PASS)
                      for (scope, size), counts in (ops or {}).items() for op, n in counts.items())
    res = Results(verdict=Verdict(verdict), run=run, ttft_checks=ttft_checks, op_checks=op_checks,
                  judged_invalid_reasons=tuple(invalid_reasons),
                  profile_config=config if config is not None else _config(yaml_path, profile))
    write_json_atomic(path, results_to_dict(res))
    return path


def _config(yaml_path: Path, profile: str) -> dict:
    try:
        p = load_thresholds(yaml_path).profiles[profile]
    except (ConfigError, KeyError):
        return {}
    return {"engine": p.engine.as_dict(), "workload": p.workload.as_dict()}


def guard(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["update-thresholds", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def changed_lines(old: str, new: str) -> tuple[list[int], list[str]]:
    """(1-based numbers of old lines removed or replaced, text of every new line added)."""
    a, b = old.splitlines(), new.splitlines()
    removed, added = [], []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op != "equal":
            removed += range(i1 + 1, i2 + 1)
            added += b[j1:j2]
    return removed, added


def line_of(text: str, needle: str) -> int:
    (n,) = [i for i, line in enumerate(text.splitlines(), 1) if needle in line]
    return n


def temp_leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


PROVENANCE_LINES = [
    "date: '2025-06-01T12:00:00Z'",
    "commit: 0123456789abcdef0123456789abcdef01234567",
    "hardware: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz (2 cores)",
    "vllm: 0.32.0",
    "samples: 5",
]

# case -> (extra CLI args, make_results kwargs)
CASES = {
    "formatting": ([], dict(
        ttft={"p50": 7000.0, "p90": 8300.0, "p99": 9500.0},  # -> 8050 moves, 9550 kept (0.5 %), 11000 moves
        ops={("mask_path", (640, 480)): {"aten::_index_put_impl_": 0, "aten::copy_": 2, "total_ops": 3},
             ("mask_path", (1000, 700)): {"aten::_index_put_impl_": 0, "aten::copy_": 2, "total_ops": 2}})),
    "indent4": ([], dict(ttft={"p50": 5000.0}, ops={("mask_path", (640, 480)): {"total_ops": 1}})),
    "provenance": ([], dict(ttft={"p50": 9999.0, "p90": 9600.0}, ops={("mask_path", (640, 480)): {"total_ops": 4}})),
    "increase": (["--allow-increase"], dict(
        ttft={"p50": 7800.0},  # 8970: within 5 % of 9000, kept
        ops={("mask_path", (640, 480)): {"aten::_index_put_impl_": 0, "total_ops": 4},
             ("mask_path", (1000, 700)): {"aten::_index_put_impl_": 2, "total_ops": 6}})),
}


def run_case(case: str, tmp_path: Path, capsys) -> tuple[str, str, str, int, str]:
    args, kw = CASES[case]
    y = tmp_path / "thresholds.yaml"
    shutil.copyfile(FIXTURES / case / "input.yaml", y)
    r = make_results(tmp_path / "results.json", y, **kw)
    old = y.read_text()
    code, out, err = guard(capsys, "--from", str(r), "--thresholds", str(y), *args)
    return old, y.read_text(), out, code, err


# ----------------------------------------------------------------------------- golden files
@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case, tmp_path, capsys):
    _, new, out, code, err = run_case(case, tmp_path, capsys)
    assert code == 0, err
    expected = FIXTURES / case / "expected.yaml"
    if os.environ.get("REGEN_GOLDEN"):  # not GUARD_: conftest clears those
        expected.write_text(new)
    assert new == expected.read_text()
    assert out.rstrip().endswith(f"wrote {tmp_path / 'thresholds.yaml'}") or case == "increase"


def test_formatting_diff_touches_only_the_budgets_and_provenance(tmp_path, capsys):
    old, new, out, code, _ = run_case("formatting", tmp_path, capsys)
    assert code == 0
    removed, added = changed_lines(old, new)
    # p90 (within hysteresis) and the unchanged _index_put_impl_ stay; nothing else in the file moves.
    assert removed == [line_of(old, "p50: 9000"), line_of(old, "p99: 10000"),
                       line_of(old, '"aten::copy_"'), line_of(old, "total_ops: {max: 4}   #")]
    assert added == [
        "        p50: 8050  # seeded by hand",
        "        p99: 11000",
        '            "aten::copy_": { exact: 2 }   # quoted key, spaced flow mapping',
        "          total_ops: {max: 3}   # trailing comment stays",
        # the TTFT budgets moved, so they are bound to the run's CPU (the file had no binding)
        "      ttft_hardware:", r"        cpu_model_regex: '^Intel\(R\) Xeon\(R\) Platinum 8375C CPU @ 2\.90GHz$'",
        "        cpu_count: 2", "        cpu_isa: [avx2, avx512f]",
        "    provenance:", *("      " + p for p in PROVENANCE_LINES), "      headroom_pct: 15",
    ]
    # The provenance block sits at the end of the cpu profile, before the blank line and final comment.
    assert new.endswith("      headroom_pct: 15\n\n# end-of-file comment\n")
    # Only the chosen profile changed: everything up to `cpu:` is byte-identical.
    cut = old.index("  cpu:\n")
    assert new[:cut] == old[:cut]
    assert "p90: 9500 ms kept" in out and "+++ " in out


def test_crlf_line_endings_are_kept(tmp_path, capsys):
    _, kw = CASES["indent4"]
    y = tmp_path / "t.yaml"
    y.write_bytes((FIXTURES / "indent4" / "input.yaml").read_bytes().replace(b"\n", b"\r\n"))
    r = make_results(tmp_path / "r.json", y, **kw)
    code, _, err = guard(capsys, "--from", str(r), "--thresholds", str(y))
    assert code == 0, err
    new = y.read_bytes()
    assert new.count(b"\n") == new.count(b"\r\n") > 0
    assert new.replace(b"\r\n", b"\n") == (FIXTURES / "indent4" / "expected.yaml").read_bytes()


def test_indent4_provenance_follows_the_files_indentation(tmp_path, capsys):
    old, new, _, code, _ = run_case("indent4", tmp_path, capsys)
    assert code == 0
    _, added = changed_lines(old, new)
    assert "        provenance:" in added
    assert "            date: '2025-06-01T12:00:00Z'" in added
    assert "                        max: 1" in added


def test_existing_provenance_updated_in_place_keeping_quotes_and_own_keys(tmp_path, capsys):
    old, new, _, code, _ = run_case("provenance", tmp_path, capsys)
    assert code == 0
    _, added = changed_lines(old, new)
    assert '      date: "2025-06-01T12:00:00Z"' in added  # was double-quoted: stays double-quoted
    assert "      commit: '0123456789abcdef0123456789abcdef01234567'" in added  # was single-quoted
    assert "      samples: 5" in added and "      vllm: 0.32.0" in added  # vllm was missing: appended
    assert "      note: first baseline, by hand" in new.splitlines()
    assert new.count("provenance:") == 1
    assert new[new.index("\n  gpu:\n"):] == old[old.index("\n  gpu:\n"):]  # the other profile is untouched


# ----------------------------------------------------------------------------- idempotence, hysteresis
def test_second_run_on_the_same_results_changes_nothing(tmp_path, capsys, monkeypatch):
    _, first, _, code, _ = run_case("formatting", tmp_path, capsys)
    assert code == 0
    y = tmp_path / "thresholds.yaml"
    mtime = y.stat().st_mtime_ns
    monkeypatch.setattr(ut, "_utcnow", lambda: NOW + dt.timedelta(days=3))  # no provenance churn either
    code, out, _ = guard(capsys, "--from", str(tmp_path / "results.json"), "--thresholds", str(y))
    assert code == 0
    assert "no changes" in out and "+++" not in out
    assert y.read_text() == first and y.stat().st_mtime_ns == mtime


def test_small_drift_within_hysteresis_leaves_the_file_alone(tmp_path, capsys):
    y = tmp_path / "t.yaml"
    shutil.copyfile(FIXTURES / "formatting" / "input.yaml", y)
    before = y.read_bytes()
    # Each new budget within ±5 % (a third of 15 %) of the old one; op counts equal to their budgets.
    r = make_results(tmp_path / "r.json", y, ttft={"p50": 7600.0, "p90": 8500.0, "p99": 8900.0},
                     ops={("mask_path", (640, 480)): {"aten::_index_put_impl_": 0, "aten::copy_": 3, "total_ops": 4}})
    code, out, _ = guard(capsys, "--from", str(r), "--thresholds", str(y))
    assert code == 0 and "no changes" in out
    assert y.read_bytes() == before


@pytest.mark.parametrize("measured, headroom, expected", [
    (2283.0, 10, 2520),  # 2511.3 rounded up to 3 significant figures
    (8000.0, 10, 8800),  # exact: no float noise pushing it to 8810
    (8130.0, 15, 9350),
    (12.34, 10, 13.6),  # small budgets keep 3 significant figures
    (10925 / 1.15, 15, 11000),
    (100.0, 0, 100),
])
def test_ttft_budget_rounds_up_to_three_significant_figures(measured, headroom, expected):
    got = ut.ttft_budget(measured, headroom)
    assert got == expected and type(got) is type(expected)
    assert got >= measured * (1 + headroom / 100) - 1e-9  # never less headroom than asked for


@pytest.mark.parametrize("old, new, headroom, moved", [
    (9000, 9440, 15, False),  # 4.9 % < 5 %
    (9000, 9460, 15, True),  # 5.1 % > 5 %
    (9000, 8540, 15, True),  # downward too
    (2500, 2580, 10, False),  # 3.2 % < 3.33 %
    (2500, 2590, 10, True),
    (100, 101, 0, True),  # zero headroom: any change moves
    (100, 100, 0, False),
])
def test_hysteresis_is_a_third_of_the_headroom(old, new, headroom, moved):
    assert ut.moves(old, new, headroom) is moved


def test_headroom_flag_overrides_the_profile(tmp_path, capsys):
    y = tmp_path / "t.yaml"
    shutil.copyfile(FIXTURES / "indent4" / "input.yaml", y)  # no headroom_pct: default 10
    r = make_results(tmp_path / "r.json", y, ttft={"p50": 4000.0}, ops={("mask_path", (640, 480)): {"total_ops": 4}})
    code, out, _ = guard(capsys, "--from", str(r), "--thresholds", str(y), "--headroom", "50", "--dry-run")
    assert code == 0
    assert "+                p50: 6000" in out and "+            headroom_pct: 50" in out
    code, out, _ = guard(capsys, "--from", str(r), "--thresholds", str(y), "--dry-run")
    assert "+                p50: 4400" in out and "+            headroom_pct: 10" in out


# ----------------------------------------------------------------------------- ratchet
def test_ratchet_down_is_automatic_for_max_and_exact(tmp_path, capsys):
    old, new, out, code, _ = run_case("formatting", tmp_path, capsys)
    assert code == 0
    t = load_thresholds(tmp_path / "thresholds.yaml").profiles["cpu"].ops[0]
    assert (t.total_ops.rule, t.total_ops.count) == ("max", 3)  # the max over image sizes, not the last one's 2
    assert (t.ops["aten::copy_"].rule, t.ops["aten::copy_"].count) == ("exact", 2)
    assert "WARNING" not in out


def test_ratchet_up_refused_without_the_flag(tmp_path, capsys):
    args, kw = CASES["increase"]
    y = tmp_path / "t.yaml"
    shutil.copyfile(FIXTURES / "increase" / "input.yaml", y)
    before = y.read_bytes()
    r = make_results(tmp_path / "r.json", y, **kw)
    code, out, err = guard(capsys, "--from", str(r), "--thresholds", str(y))
    assert code == 2
    assert "refusing to raise op-count budgets" in err and "aten::_index_put_impl_ (max) 0 -> 2" in err
    assert "--allow-increase" in err
    assert y.read_bytes() == before and out == ""


def test_ratchet_up_with_the_flag_warns_loudly(tmp_path, capsys):
    _, new, out, code, _ = run_case("increase", tmp_path, capsys)
    assert code == 0
    warning = [line for line in out.splitlines() if line.startswith("WARNING")]
    assert "WARNING: this update RAISES 2 op-count budget(s) (--allow-increase):" in warning
    assert "WARNING:   mask_path.ops.aten::_index_put_impl_ (max): 0 -> 2 calls" in warning
    assert out.index("WARNING") < out.index("+++ ")  # above the diff, where a reviewer starts reading
    assert out.rstrip().splitlines()[-1].startswith("WARNING: 2 op-count budget(s) raised")
    assert "aten::_index_put_impl_: {max: 2}  # the pre-#49531" in new


# ----------------------------------------------------------------------------- --only, --dry-run
def test_only_ops_needs_no_ttft_samples_and_leaves_ttft_alone(tmp_path, capsys):
    y = tmp_path / "t.yaml"
    shutil.copyfile(FIXTURES / "formatting" / "input.yaml", y)
    r = make_results(tmp_path / "r.json", y, samples=0,
                     ops={("mask_path", (640, 480)): {"aten::_index_put_impl_": 0, "aten::copy_": 3, "total_ops": 2}})
    code, _, err = guard(capsys, "--from", str(r), "--thresholds", str(y), "--only", "ops")
    assert code == 0, err
    cpu = load_thresholds(y).profiles["cpu"]
    assert cpu.ttft_ms == {"p50": 9000, "p90": 9500, "p99": 10000}
    assert cpu.ops[0].total_ops.count == 2 and cpu.provenance["samples"] == 0


def test_only_ttft_ignores_op_counts(tmp_path, capsys):
    y = tmp_path / "t.yaml"
    shutil.copyfile(FIXTURES / "formatting" / "input.yaml", y)
    r = make_results(tmp_path / "r.json", y, ttft={"p50": 7000.0, "p90": 8300.0, "p99": 9500.0})  # no op checks
    code, _, err = guard(capsys, "--from", str(r), "--thresholds", str(y), "--only", "ttft")
    assert code == 0, err
    cpu = load_thresholds(y).profiles["cpu"]
    assert cpu.ttft_ms["p50"] == 8050 and cpu.ops[0].total_ops.count == 4


def test_dry_run_prints_the_diff_and_writes_nothing(tmp_path, capsys):
    y = tmp_path / "t.yaml"
    shutil.copyfile(FIXTURES / "formatting" / "input.yaml", y)
    before = y.read_bytes()
    _, kw = CASES["formatting"]
    r = make_results(tmp_path / "r.json", y, **kw)
    code, out, _ = guard(capsys, "--from", str(r), "--thresholds", str(y), "--dry-run")
    assert code == 0
    assert "-        p50: 9000  # seeded by hand\n+        p50: 8050  # seeded by hand" in out
    assert "dry run" in out
    assert y.read_bytes() == before and temp_leftovers(tmp_path) == []


def test_thresholds_default_to_the_file_the_run_used(tmp_path, capsys):
    _, kw = CASES["indent4"]
    y = tmp_path / "t.yaml"
    shutil.copyfile(FIXTURES / "indent4" / "input.yaml", y)
    r = make_results(tmp_path / "r.json", y, **kw)
    code, out, _ = guard(capsys, "--from", str(r))
    assert code == 0 and f"wrote {y}" in out
    assert load_thresholds(y).profiles["cpu"].ttft_ms["p50"] == 5500


# ----------------------------------------------------------------------------- atomic write
@pytest.mark.parametrize("fail_at", ["os.replace", "os.fsync"])
def test_interrupted_write_leaves_the_original_and_no_temp_file(tmp_path, capsys, monkeypatch, fail_at):
    _, kw = CASES["formatting"]
    y = tmp_path / "t.yaml"
    shutil.copyfile(FIXTURES / "formatting" / "input.yaml", y)
    r = make_results(tmp_path / "r.json", y, **kw)
    before, listing = y.read_bytes(), sorted(os.listdir(tmp_path))

    def boom(*a, **k):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(os, fail_at.split(".")[1], boom)
    code, _, err = guard(capsys, "--from", str(r), "--thresholds", str(y))
    assert code == 2 and "disk full (simulated)" in err and "unchanged" in err
    assert y.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == listing


def test_write_keeps_the_file_mode(tmp_path, capsys):
    _, kw = CASES["formatting"]
    y = tmp_path / "t.yaml"
    shutil.copyfile(FIXTURES / "formatting" / "input.yaml", y)
    os.chmod(y, 0o640)
    r = make_results(tmp_path / "r.json", y, **kw)
    code, _, _ = guard(capsys, "--from", str(r), "--thresholds", str(y))
    assert code == 0
    assert stat.S_IMODE(y.stat().st_mode) == 0o640


# ----------------------------------------------------------------------------- refusals (exit 2)
GOOD = dict(ttft={"p50": 7000.0, "p90": 8300.0, "p99": 9500.0},
            ops={("mask_path", (640, 480)): {"aten::_index_put_impl_": 0, "aten::copy_": 2, "total_ops": 2}})

# name -> (make_results overrides, extra args, message fragment)
REFUSALS = {
    "other hardware": (dict(profile="a10"), ["--profile", "cpu"], "measured with hardware profile 'a10', not 'cpu'"),
    "invalid verdict": (dict(verdict="invalid", invalid_reasons=(InvalidReason(K.REQUEST_FAILED, "request 3 (640x480) failed: boom"),)), [],
                        "the run was invalid (request 3 (640x480) failed: boom)"),
    "invalid reasons": (dict(invalid_reasons=(InvalidReason(K.TOO_FEW_SAMPLES, "too few TTFT samples: 2 of 5 requested"),)), [],
                        "the run was invalid"),
    "run invalid reasons": (dict(run_invalid=(InvalidReason(K.ENGINE, "engine died"),)), [], "the run was invalid (engine died)"),
    # the kind decides, never the words: a reason that merely mentions a census baseline still refuses
    "census words, other kind": (dict(invalid_reasons=(InvalidReason(K.UNKNOWN, "no census baseline (said elsewhere)"),)), [],
                                 "the run was invalid (no census baseline (said elsewhere))"),
    "no ttft samples": (dict(samples=0), [], "no TTFT samples in this run"),
    "missing percentile": (dict(ttft={"p50": 7000.0, "p99": 9500.0}), [], "no TTFT p90 measurement"),
    "unmeasured op scope": (dict(ops={}), [], "op-count scope 'mask_path' has no measurement"),
    "injected canary": (dict(injected="mask-regression"), [], "regression injected on purpose"),
    "config drift": (dict(config={"workload": {"requests": 50}}), [], "the run used workload.requests = 50"),
    "no such profile": (dict(profile="h100"), [], "no such hardware profile"),
    "other model": (dict(model="qwen2-vl"), [], "measured model 'qwen2-vl'; this thresholds file is for 'deepseek-ocr-2'"),
    "negative headroom": ({}, ["--headroom", "-5"], "--headroom must be a percentage"),
    "machine changed speed": (dict(env={**ENV, "speed_reference": SpeedReference.of(SpeedReading("speedref-1", 194.0, 8.0, 5, 2),
                                                                                      SpeedReading("speedref-1", 311.0, 8.0, 5, 2)).as_dict()}), [],
        "run.environment.speed_reference: the machine changed speed while it measured: guard's speed reference "
        "took 194 ms before the measured requests and 311 ms after (slower by 60 %"),
}


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_refusals_exit_2_with_a_reason(name, tmp_path, capsys):
    overrides, args, message = REFUSALS[name]
    y = tmp_path / "t.yaml"
    shutil.copyfile(FIXTURES / "formatting" / "input.yaml", y)
    before = y.read_bytes()
    r = make_results(tmp_path / "r.json", y, **{**GOOD, **overrides})
    code, out, err = guard(capsys, "--from", str(r), "--thresholds", str(y), *args)
    assert code == 2
    assert message in err
    assert y.read_bytes() == before and out == ""


BAD_RESULTS = {
    "not json": ("{ nope", "not valid JSON"),
    "unknown schema version": (json.dumps({"schema": "guard/results", "schema_version": 99}), "schema version 99"),
    "version 1": (json.dumps({"schema": "guard/results", "schema_version": 1}), "re-run `guard check`"),
    "not a results file": (json.dumps({"schema": "guard/run", "schema_version": 2}), "not a guard/results file"),
    "malformed": (json.dumps({"schema": "guard/results", "schema_version": 2, "verdict": "pass"}),
                  "not a valid guard/results file"),
}


@pytest.mark.parametrize("name", sorted(BAD_RESULTS))
def test_malformed_results_refused(name, tmp_path, capsys):
    content, message = BAD_RESULTS[name]
    y = tmp_path / "t.yaml"
    shutil.copyfile(FIXTURES / "formatting" / "input.yaml", y)
    r = tmp_path / "r.json"
    r.write_text(content)
    code, _, err = guard(capsys, "--from", str(r), "--thresholds", str(y))
    assert code == 2 and message in err


def test_unparseable_yaml_refused(tmp_path, capsys):
    y = tmp_path / "t.yaml"
    shutil.copyfile(FIXTURES / "formatting" / "input.yaml", y)
    r = make_results(tmp_path / "r.json", y, **GOOD)
    y.write_text(y.read_text().replace("p90: 9500", "p90: [9500"))
    before = y.read_bytes()
    code, _, err = guard(capsys, "--from", str(r), "--thresholds", str(y))
    assert code == 2 and "not valid YAML" in err and str(y) in err
    assert y.read_bytes() == before


def test_commit_falls_back_to_unknown(tmp_path, capsys):
    _, kw = CASES["indent4"]
    y = tmp_path / "t.yaml"
    shutil.copyfile(FIXTURES / "indent4" / "input.yaml", y)
    r = make_results(tmp_path / "r.json", y, env={}, **kw)
    code, _, _ = guard(capsys, "--from", str(r), "--thresholds", str(y))
    assert code == 0
    prov = load_thresholds(y).profiles["cpu"].provenance
    assert (prov["commit"], prov["hardware"], prov["vllm"]) == ("unknown", "unknown", "unknown")


# ----------------------------------------------------------------------------- the real thresholds file
def test_real_thresholds_cpu_update_changes_only_the_cpu_profile(tmp_path, capsys):
    y = tmp_path / "deepseek-ocr-2.yaml"
    shutil.copyfile(REAL, y)
    old = y.read_text()
    r = make_results(tmp_path / "r.json", y, ttft={"p50": 4000.0, "p90": 4300.0, "p99": 4800.0},
                     ops={("mask_path", (640, 480)): {"aten::_index_put_impl_": 0, "total_ops": 2},
                          ("mask_path", (1000, 700)): {"aten::_index_put_impl_": 0, "total_ops": 3}})
    code, _, err = guard(capsys, "--from", str(r), "--thresholds", str(y))
    assert code == 0, err
    new = y.read_text()
    removed, added = changed_lines(old, new)
    cpu_start = load_thresholds(REAL).profiles["cpu"].line
    assert removed and all(n > cpu_start for n in removed)
    assert new.splitlines()[:cpu_start] == old.splitlines()[:cpu_start]
    had_provenance = bool(load_thresholds(REAL).profiles["cpu"].provenance)
    # each budget line replaced; provenance updated in place, or inserted (`provenance:` + 6 keys)
    assert len(added) == len(removed) + (0 if had_provenance else 7)
    a10_before, a10_after = load_thresholds(REAL).profiles["a10"], load_thresholds(y).profiles["a10"]
    assert a10_after.ttft_ms == a10_before.ttft_ms and a10_after.ops == a10_before.ops
    cpu = load_thresholds(y).profiles["cpu"]
    want = {"p50": 4600, "p90": 4950, "p99": 5520}  # measured + 15 %, rounded up to 3 figures
    assert cpu.ttft_ms == {k: want[k] for k in load_thresholds(REAL).profiles["cpu"].ttft_ms}
    assert cpu.provenance["samples"] == 5 and cpu.provenance["date"] == "2025-06-01T12:00:00Z"


def test_a_budget_shared_through_a_yaml_anchor_is_refused_naming_its_line(tmp_path, capsys):
    """The loader accepts anchors and aliases; an in-place edit would drop the anchor its aliases
    read (or change them too), so update-thresholds says where and changes nothing."""
    y = tmp_path / "deepseek-ocr-2.yaml"
    text = REAL.read_text()
    cpu_p50 = load_thresholds(REAL).profiles["cpu"].ttft_ms["p50"]
    at = text.index(f"p50: {cpu_p50:g}", text.index("\n  cpu:"))
    y.write_text(text[:at] + f"p50: &cpu_p50 {cpu_p50:g}" + text[at + len(f"p50: {cpu_p50:g}"):])
    before = y.read_bytes()
    assert load_thresholds(y).profiles["cpu"].ttft_ms["p50"] == cpu_p50  # a file guard check accepts
    r = make_results(tmp_path / "r.json", y, ttft={"p50": 4000.0, "p90": 4300.0, "p99": 4800.0},
                     ops={("mask_path", (640, 480)): {"aten::_index_put_impl_": 0, "total_ops": 2},
                          ("mask_path", (1000, 700)): {"aten::_index_put_impl_": 0, "total_ops": 3}})
    code, _, err = guard(capsys, "--from", str(r), "--thresholds", str(y))
    line = y.read_text()[:y.read_text().index("&cpu_p50")].count("\n") + 1
    assert code == 2 and f"{y}:{line}: profiles.cpu.budgets.ttft_ms.p50" in err and "&cpu_p50" in err, err
    assert y.read_bytes() == before


@pytest.mark.parametrize(("text", "path"), [
    ("a:\n  p50: &b 7000\nb:\n  p50: *b\n", ("a", "p50")),  # the anchor itself
    ("a:\n  p50: &b 7000\nb:\n  p50: *b\n", ("b", "p50")),  # read through the alias
    ("a: &m\n  p50: 7000\nb: *m\n", ("b", "p50")),  # inside a shared mapping
])
def test_set_scalar_refuses_a_node_shared_through_an_anchor(text, path):
    root = yamledit.compose(text)
    with pytest.raises(yamledit.YamlEditError, match="anchor") as caught:
        yamledit.set_scalar(text, root, path, 8000)
    assert caught.value.line == 1 + (text.index("&") > text.index("\n")) and caught.value.key == ".".join(path)
    plain = text.replace("&b ", "").replace("*b", "7000").replace(" &m", "").replace("b: *m", "b:\n  p50: 7000")
    edit = yamledit.set_scalar(plain, yamledit.compose(plain), path, 8000)
    assert yaml.safe_load(yamledit.apply(plain, [edit]))[path[0]]["p50"] == 8000  # unshared: edited as before


# ----------------------------------------------------------------------------- yamledit
def test_set_scalar_keeps_quote_style_and_comments():
    text = "a: 'x'  # c\nb: \"x\"\nc: x\nd:\n"
    root = yamledit.compose(text)
    edits = [yamledit.set_scalar(text, root, (k,), "y's") for k in "abcd"]
    assert yamledit.apply(text, edits) == "a: 'y''s'  # c\nb: \"y's\"\nc: 'y''s'\nd: 'y''s'\n"


def test_set_scalar_returns_none_when_unchanged():
    text = "a: 1\n"
    assert yamledit.set_scalar(text, yamledit.compose(text), ("a",), 1) is None


def test_set_mapping_into_flow_mappings():
    text = "p: {a: 1}\nq: { }\n"
    root = yamledit.compose(text)
    edits = yamledit.set_mapping(text, root, ("p",), {"a": 2, "b": "x"})
    edits += yamledit.set_mapping(text, root, ("q",), {"c": 3})
    assert yamledit.apply(text, edits) == "p: {a: 2, b: x}\nq: { c: 3}\n"


def test_set_mapping_appends_with_crlf_and_without_final_newline():
    text = "p:\r\n  a: 1\r\n  b:\r\n    c: 2"
    root = yamledit.compose(text)
    new = yamledit.apply(text, yamledit.set_mapping(text, root, ("p", "prov"), {"k": "v"}))
    assert new == "p:\r\n  a: 1\r\n  b:\r\n    c: 2\r\n  prov:\r\n    k: v\r\n"


def test_apply_rejects_overlapping_edits():
    with pytest.raises(yamledit.YamlEditError):
        yamledit.apply("abcdef", [yamledit.Edit(0, 3, "x"), yamledit.Edit(2, 4, "y")])


def test_verify_catches_an_unintended_change():
    with pytest.raises(yamledit.YamlEditError):
        yamledit.verify("a: 1\nb: 2\n", "a: 5\nb: 3\n", {("a",): 5})
    yamledit.verify("a: 1\nb: 2\n", "a: 5\nb: 2\n", {("a",): 5})


@pytest.mark.parametrize("value", ["2025-06-01T12:00:00Z", "1234567", "1.0", "true", "null", "a: b", "#x",
                                   "it's", "x, y", "NVIDIA A10G", "0.32.0", "", " pad", 13.6, 1e-05, 2520, False, None])
def test_format_scalar_round_trips(value):
    for wrap in ("k: {}", "k: {{v: {}}}"):  # block and flow context
        loaded = yaml.safe_load(wrap.format(yamledit.format_scalar(value)))
        assert (loaded["k"] if wrap == "k: {}" else loaded["k"]["v"]) == value


# ----------------------------------------------------------------------------- budgets: provenance
@pytest.mark.parametrize("block, message", [
    ("provenance: [a, b]\n", "expected a mapping"),
    ("provenance:\n            date: {y: 1}\n", "expected a single value"),
    ("provenance:\n            blob: !!binary aGk=\n", "tag 'tag:yaml.org,2002:binary' is not allowed"),
])
def test_provenance_must_be_a_flat_mapping_of_scalars(tmp_path, block, message):
    y = tmp_path / "t.yaml"  # indent4's profile keys sit at 8 spaces, their children at 12
    y.write_text((FIXTURES / "indent4" / "input.yaml").read_text().replace(
        "        budgets:\n", "        " + block + "        budgets:\n"))
    with pytest.raises(ConfigError) as exc:
        load_thresholds(y)
    assert message in str(exc.value) and "profiles.cpu.provenance" in str(exc.value) and exc.value.line


def test_provenance_is_loaded_with_dates_as_strings(tmp_path):
    y = tmp_path / "t.yaml"
    y.write_text((FIXTURES / "provenance" / "input.yaml").read_text().replace('"2024-01-02T03:04:05Z"', "2024-01-02"))
    prov = load_thresholds(y).profiles["cpu"].provenance
    assert prov == {"date": "2024-01-02", "commit": "deadbeef", "hardware": "old machine",
                    "note": "first baseline, by hand", "samples": 3}


# ----------------------------------------------------------------------------- hardware-bound TTFT budgets
def _shipped_copy(tmp_path: Path) -> Path:
    y = tmp_path / "t.yaml"
    shutil.copyfile(REAL, y)
    return y


def test_budget_bound_to_another_cpu_is_rewritten_and_rebound(tmp_path, capsys):
    y = _shipped_copy(tmp_path)  # cpu profile: p50 7000 ms bound to ^AMD EPYC$ with 2 cores
    old_p50 = load_thresholds(y).profile("cpu").ttft_ms["p50"]
    r = make_results(tmp_path / "r.json", y, ttft={"p50": old_p50 / 1.15},  # would be within hysteresis
                     ops={("mask_path", (640, 480)): {"aten::_index_put_impl_": 0, "total_ops": 4},
                          ("mask_path", (800, 400)): {"aten::_index_put_impl_": 0, "total_ops": 4}})
    code, out, err = guard(capsys, "--from", str(r), "--thresholds", str(y))
    assert code == 0, err
    assert "rewritten for this CPU" in out and "AMD EPYC" in out
    cpu = load_thresholds(y).profile("cpu")
    xeon = ("avx2", "avx512f")
    assert ttft_binding_fits(cpu.ttft_hardware, ENV["cpu"], 2, xeon) and not ttft_binding_fits(cpu.ttft_hardware, "AMD EPYC", 2, xeon)
    assert cpu.ttft_hardware.cpu_count == (2, 2) and cpu.ttft_hardware.cpu_isa == xeon
    assert cpu.provenance["hardware"].startswith("Intel(R) Xeon(R)")


def test_same_name_other_cpu_extensions_is_another_cpu(tmp_path, capsys):
    """The VM names an AVX2-only EPYC like the AVX-512 one the budget was measured on: a run there
    rebinds the budget, with the extensions written as a list beside the rest of the binding."""
    y = _shipped_copy(tmp_path)
    env = {**ENV, **BUDGET_CPU, "cpu_isa": ["avx2"]}
    r = make_results(tmp_path / "r.json", y, ttft={"p50": 16000.0}, env=env)
    code, out, err = guard(capsys, "--from", str(r), "--thresholds", str(y), "--only", "ttft")
    assert code == 0, err
    assert "rewritten for this CPU" in out and "ISA avx2;" in out
    assert "        cpu_isa: [avx2]\n" in y.read_text()
    hw = load_thresholds(y).profile("cpu").ttft_hardware
    assert hw.cpu_isa == ("avx2",) and ttft_binding_fits(hw, "AMD EPYC", 2, ("avx2",))
    assert not ttft_binding_fits(hw, "AMD EPYC", 2, ("avx2", "avx512f", "avx512_bf16"))


def test_budget_bound_to_this_cpu_keeps_its_hysteresis(tmp_path, capsys):
    y = _shipped_copy(tmp_path)
    old_p50 = load_thresholds(y).profile("cpu").ttft_ms["p50"]
    env = {**ENV, **BUDGET_CPU}
    r = make_results(tmp_path / "r.json", y, ttft={"p50": old_p50 / 1.15}, env=env)
    before = y.read_text()
    code, out, err = guard(capsys, "--from", str(r), "--thresholds", str(y), "--only", "ttft")
    assert code == 0, err
    assert y.read_text() == before and "no changes" in out


def test_a_hand_written_range_that_fits_is_kept(tmp_path, capsys):
    y = _shipped_copy(tmp_path)
    y.write_text(y.read_text().replace("cpu_count: 2\n", "cpu_count: [2, 8]\n", 1))
    env = {**ENV, **BUDGET_CPU, "cpu_count": 4}
    r = make_results(tmp_path / "r.json", y, ttft={"p50": 9000.0}, env=env)  # moves
    code, out, err = guard(capsys, "--from", str(r), "--thresholds", str(y), "--only", "ttft")
    assert code == 0, err
    cpu = load_thresholds(y).profile("cpu")
    assert cpu.ttft_ms["p50"] == 10400 and cpu.ttft_hardware.cpu_count == (2, 8)  # the range stays


def test_the_not_judged_notice_is_a_recipe_that_works(tmp_path, capsys):
    """A run on another CPU: TTFT not judged; following the notice (a local copy, update-thresholds
    --only ttft) gives a budget for this CPU that the same run is then judged against."""
    import dataclasses

    from guard.judge.evaluate import evaluate

    profile = dataclasses.replace(load_thresholds(REAL).profile("cpu"), ops=(), census=None)  # TTFT alone here
    outcomes = [RequestOutcome(index=i, image_size=(640, 480), warmup=False, success=True, ttft_client_s=9.0 + i / 100)
                for i in range(6)]
    run = RunRecord(profile="cpu", thresholds_path=str(REAL), model="deepseek-ocr-2", environment=dict(ENV),
                    outcomes=outcomes, rounds=1)
    first = evaluate(profile, run, output=tmp_path)
    assert first.verdict == Verdict.PASS and {c.status for c in first.ttft_checks} == {Status.NOT_JUDGED}
    (notice,) = [n for n in first.notices if n.startswith("TTFT not judged")]
    # beside the original, so its census baselines resolve for the copy; named from the repository's root
    assert "`cp thresholds/deepseek-ocr-2.yaml thresholds/local.yaml`" in notice
    assert (f"`guard update-thresholds --from {tmp_path / 'results.json'} --profile cpu "
            "--thresholds thresholds/local.yaml --only ttft`") in notice
    assert "`guard check --profile cpu --thresholds thresholds/local.yaml`" in notice
    local = _shipped_copy(tmp_path)  # followed in a copy of the thresholds folder: the shipped one stays clean
    write_json_atomic(tmp_path / "results.json", results_to_dict(first))
    code, out, err = guard(capsys, "--from", str(tmp_path / "results.json"), "--thresholds", str(local), "--only", "ttft")
    assert code == 0, err
    mine = dataclasses.replace(load_thresholds(local).profile("cpu"), ops=())
    assert mine.ttft_ms["p50"] == 10400  # 9025 ms + 15 %, 3 significant figures up
    again = evaluate(mine, run, output=tmp_path)
    assert [c.status for c in again.ttft_checks] == [Status.PASS]
    assert load_thresholds(REAL).profile("cpu").ttft_ms == profile.ttft_ms  # the shipped file is untouched
    assert ttft_binding_fits(mine.ttft_hardware, ENV["cpu"], 2, tuple(ENV["cpu_isa"]))


# ----------------------------------------------------------------------------- the speed reference
SPEED = {"workload": "speedref-1", "ms": 81.37, "before": None, "after": None}


def test_moved_ttft_budgets_record_the_runs_speed_reference(tmp_path, capsys):
    """Budgets rebound to the run's CPU carry that machine's speed reference too, so a later run on
    the same CPU model can tell a slow machine from slow code."""
    y = _shipped_copy(tmp_path)
    r = make_results(tmp_path / "r.json", y, ttft={"p50": 9000.0}, env={**ENV, "speed_reference": SPEED})
    code, out, err = guard(capsys, "--from", str(r), "--thresholds", str(y), "--only", "ttft")
    assert code == 0, err
    hw = load_thresholds(y).profile("cpu").ttft_hardware
    assert hw.speed_reference_ms == 81.4 and ttft_binding_fits(hw, ENV["cpu"], 2, tuple(ENV["cpu_isa"]))
    assert "ttft_hardware.speed_reference_ms: 81.4" in out


def test_a_budget_on_its_own_cpu_gets_the_reference_beside_its_binding(tmp_path, capsys):
    y = _shipped_copy(tmp_path)
    env = {**ENV, **BUDGET_CPU, "speed_reference": SPEED}
    r = make_results(tmp_path / "r.json", y, ttft={"p50": 9000.0}, env=env)  # moves; the CPU binding fits
    code, _, err = guard(capsys, "--from", str(r), "--thresholds", str(y), "--only", "ttft")
    assert code == 0, err
    hw = load_thresholds(y).profile("cpu").ttft_hardware
    assert (hw.cpu_model_regex, hw.cpu_count, hw.speed_reference_ms) == ("^AMD EPYC$", (2, 2), 81.4)


def _readings(before_ms: float, after_ms: float) -> dict:
    return SpeedReference.of(SpeedReading("speedref-1", before_ms, 8.0, 5, 2),
                             SpeedReading("speedref-1", after_ms, 8.0, 5, 2)).as_dict()


@pytest.mark.parametrize(("before_ms", "after_ms", "refused"), [
    (80.0, 95.9, False),  # +19.9 %: within twice validity.max_slowdown_pct (10 in the shipped file)
    (80.0, 96.1, True),  # +20.1 %
    (96.1, 80.0, True),  # faster after by as much: a machine that changed speed either way
])
def test_ttft_budgets_are_only_written_from_a_machine_that_held_its_speed(tmp_path, capsys, before_ms, after_ms,
                                                                          refused):
    y = _shipped_copy(tmp_path)
    before = y.read_bytes()
    env = {**ENV, **BUDGET_CPU, "speed_reference": _readings(before_ms, after_ms)}
    r = make_results(tmp_path / "r.json", y, ttft={"p50": 9000.0}, env=env)
    code, _, err = guard(capsys, "--from", str(r), "--thresholds", str(y), "--only", "ttft")
    assert code == (2 if refused else 0), err
    assert (y.read_bytes() == before) == refused
    assert ("changed speed while it measured" in err) == refused
    if refused:
        assert "--only ops updates the op-count budgets alone" in err


def test_op_counts_are_updated_from_a_run_whose_machine_changed_speed(tmp_path, capsys):
    """Op counts do not depend on the machine's speed: --only ops still takes such a run."""
    y = _shipped_copy(tmp_path)
    env = {**ENV, **BUDGET_CPU, "speed_reference": _readings(194.0, 311.0)}
    r = make_results(tmp_path / "r.json", y, ttft={"p50": 9000.0}, env=env,
                     ops={("mask_path", (640, 480)): {"aten::_index_put_impl_": 0, "total_ops": 3},
                          ("mask_path", (800, 400)): {"aten::_index_put_impl_": 0, "total_ops": 3}})
    code, _, err = guard(capsys, "--from", str(r), "--thresholds", str(y), "--only", "ops")
    assert code == 0, err
    assert load_thresholds(y).profile("cpu").ops[0].total_ops.count == 3


@pytest.mark.parametrize("case", ["kept budget", "ops only", "another workload"])
def test_the_reference_is_only_written_with_the_budget_it_belongs_to(tmp_path, capsys, case):
    y = _shipped_copy(tmp_path)
    before = load_thresholds(y).profile("cpu").ttft_hardware.speed_reference_ms
    speed = {**SPEED, "workload": "speedref-0"} if case == "another workload" else SPEED
    p50 = load_thresholds(y).profile("cpu").ttft_ms["p50"] / 1.15 if case == "kept budget" else 9000.0
    env = {**ENV, **BUDGET_CPU, "speed_reference": speed}
    r = make_results(tmp_path / "r.json", y, ttft={"p50": p50}, env=env,
                     ops={("mask_path", (640, 480)): {"aten::_index_put_impl_": 0, "total_ops": 3},
                          ("mask_path", (800, 400)): {"aten::_index_put_impl_": 0, "total_ops": 3}})
    argv = ["--only", "ops"] if case == "ops only" else ["--only", "ttft"]
    code, _, err = guard(capsys, "--from", str(r), "--thresholds", str(y), *argv)
    assert code == 0, err
    assert load_thresholds(y).profile("cpu").ttft_hardware.speed_reference_ms == before
