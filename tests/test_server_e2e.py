"""End to end, server mode: the real `guard check --engine-mode server` against a real `vllm serve`.

Both are failures that must be invalid runs (exit 3) whose message carries the server log's tail:
a server that cannot start (a model path that does not exist), and one killed while guard is
measuring. 1 warm-up + 2 requests, no op-count pass, so each stays short.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.test_e2e import results_of, small_cpu_yaml

pytestmark = pytest.mark.engine


def server_yaml(tmp_path: Path, model: str | None = None) -> Path:
    path = small_cpu_yaml(tmp_path, model=model)
    data = yaml.safe_load(path.read_text())
    cpu = data["profiles"]["cpu"]
    cpu["engine"]["mode"] = "server"
    cpu["budgets"].pop("modes", None)  # budgets.ttft_ms are this profile's own mode's now
    cpu["budgets"].pop("ops")  # TTFT only: no in-process pass after the server
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def guard_cmd(*args: str) -> list[str]:
    return [shutil.which("guard", path=str(Path(sys.executable).parent)) or "guard", *args]


def test_server_that_does_not_start_is_invalid_with_its_log(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(guard_cmd("check", "--thresholds", str(server_yaml(tmp_path, model="/nonexistent/guard-model")),
                                    "--output", str(out)), cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = results_of(out)
    assert res["verdict"] == "invalid"
    # guard's own reason (with the log), and pytest's failed perf test quoting its first line
    reason = next(r["text"] for r in res["run"]["invalid_reasons"] if r["text"].startswith("vllm serve exited"))
    assert "before it was healthy" in reason and "last lines of" in reason
    log = (out / "server.log").read_text()
    assert "/nonexistent/guard-model" in log and "/nonexistent/guard-model" in reason  # vLLM's own error
    assert log.strip().splitlines()[-1].strip() in reason  # the tail itself, in the message
    assert "vllm serve exited" in proc.stdout  # and in what the person sees


def test_server_killed_mid_run_is_invalid_with_its_log(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen(guard_cmd("check", "--thresholds", str(server_yaml(tmp_path)), "--output", str(out)),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    pid = None
    deadline = time.monotonic() + 600
    for line in proc.stdout:  # progress: "vllm serve MODEL on URL (pid N, log ...)", then "healthy"
        lines.append(line)
        if "(pid " in line and "vllm serve" in line:
            pid = int(line.split("(pid ", 1)[1].split(",", 1)[0])
        if "vllm serve healthy" in line:
            break
        assert time.monotonic() < deadline, "".join(lines)
    assert pid is not None, "".join(lines)
    time.sleep(2)  # the warm-up request (or, on a fast machine, the first round) is in flight
    os.killpg(pid, signal.SIGKILL)  # the server and its engine core, as an OOM kill would
    rest, _ = proc.communicate(timeout=600)
    text = "".join(lines) + rest
    assert proc.returncode == 3, text[-4000:]
    res = results_of(out)
    assert res["verdict"] == "invalid"
    reason = next(r["text"] for r in res["run"]["invalid_reasons"] if r["text"].startswith("vllm serve died during"))
    # which request was in flight depends on the machine's speed; that it was mid-run does not
    assert re.match(r"vllm serve died during (warm-up|round \d+) ", reason), reason
    assert "last lines of" in reason
    assert "INVALID RUN" in text
