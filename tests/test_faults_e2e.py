"""Faults during a real run (issue #11, section 7): the real `guard check`, the real vLLM engine.

The engine runs inside guard check's child process (guard.child). Killing that process with SIGKILL mid-run (what
the OOM killer does), or Ctrl-C, must end as an invalid run (exit 3) whose results.json keeps the
requests measured so far, from the run.json checkpoint the child writes after every round; the
thresholds file is never touched.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.test_e2e import measured_s, results_of, small_cpu_yaml

pytestmark = pytest.mark.engine


def _as_from_a_terminal() -> None:
    """Ctrl-C's default action, as in a shell at a terminal: a test run started in the background
    (``nohup``, ``cmd &`` in a script) inherits SIGINT ignored, and so would guard."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_guard(*args: str) -> subprocess.Popen:
    exe = shutil.which("guard", path=str(Path(sys.executable).parent)) or "guard"
    return subprocess.Popen([exe, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True,  # its own process group: Ctrl-C goes to guard and its child
                            preexec_fn=_as_from_a_terminal)


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def wait_for_checkpoint(run_json: Path, proc: subprocess.Popen, measured: int, timeout: float = 600) -> dict:
    """Until run.json (a checkpoint) holds ``measured`` successful measured requests."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "guard check ended before the checkpoint: " + proc.stdout.read()[-3000:]
        try:
            data = json.loads(run_json.read_text())
        except (OSError, ValueError):
            data = None
        if data and sum(1 for o in data["run"]["outcomes"] if not o["warmup"] and o["success"]) >= measured:
            return data
        time.sleep(0.2)
    raise AssertionError("no checkpoint in time")


def fingerprint(path: Path) -> tuple[str, int]:
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


@pytest.fixture
def long_profile_pass(tmp_path) -> Path:
    """2 measured requests, then a profile pass over two sizes (~20 s): room to kill mid-run."""
    return small_cpu_yaml(tmp_path, profile_sizes=[[640, 480], [800, 400]])


def test_sigkill_of_the_engine_process_is_invalid_and_keeps_the_measured_requests(tmp_path, long_profile_pass):
    out = tmp_path / "out"
    before = fingerprint(long_profile_pass)
    proc = start_guard("check", "--thresholds", str(long_profile_pass), "--output", str(out))
    checkpoint = wait_for_checkpoint(out / "run.json", proc, measured=2)
    assert any(r["kind"] == "unfinished" and "did not finish" in r["text"] for r in checkpoint["run"]["invalid_reasons"])
    [engine_pid] = children(proc.pid)  # the child run stage process that holds the engine
    os.kill(engine_pid, signal.SIGKILL)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 3, output[-3000:]
    res = results_of(out)  # written, and valid against the schema
    assert res["verdict"] == "invalid"
    reasons = res["run"]["invalid_reasons"] + res["judged_invalid_reasons"]
    assert any(r["kind"] == "crash" and "killed by SIGKILL" in r["text"] for r in reasons), reasons
    assert any("the last checkpoint was written after round 1" in r["text"] for r in reasons), reasons
    assert len(measured_s(res)) == 2 and all(s > 0 for s in measured_s(res))  # what was measured is kept
    assert (out / "report.md").read_text().strip()
    assert fingerprint(long_profile_pass) == before  # guard check never writes the thresholds file
    assert "Traceback" not in output


def test_ctrl_c_is_invalid_keeps_the_measured_requests_and_leaves_no_engine(tmp_path, long_profile_pass):
    out = tmp_path / "out"
    before = fingerprint(long_profile_pass)
    proc = start_guard("check", "--thresholds", str(long_profile_pass), "--output", str(out))
    wait_for_checkpoint(out / "run.json", proc, measured=2)
    [engine_pid] = children(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 3, output[-3000:]
    assert not Path(f"/proc/{engine_pid}").exists()
    res = results_of(out)
    assert res["verdict"] == "invalid"
    reasons = res["run"]["invalid_reasons"] + res["judged_invalid_reasons"]
    assert any(r["kind"] == "interrupted" and "interrupted (Ctrl-C)" in r["text"] for r in reasons), reasons
    assert len(measured_s(res)) == 2
    assert fingerprint(long_profile_pass) == before


def test_sigterm_to_guard_alone_stops_the_suite_cleanly(tmp_path, long_profile_pass):
    """A CI runner cancelling the job signals guard only: guard passes a SIGINT on to its child."""
    out = tmp_path / "out"
    proc = start_guard("check", "--thresholds", str(long_profile_pass), "--output", str(out))
    wait_for_checkpoint(out / "run.json", proc, measured=2)
    [engine_pid] = children(proc.pid)
    os.kill(proc.pid, signal.SIGTERM)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 3, output[-3000:]
    assert not Path(f"/proc/{engine_pid}").exists()
    res = results_of(out)
    reasons = res["run"]["invalid_reasons"] + res["judged_invalid_reasons"]
    assert res["verdict"] == "invalid" and any("guard received SIGTERM" in r["text"] for r in reasons), reasons
    assert len(measured_s(res)) == 2
