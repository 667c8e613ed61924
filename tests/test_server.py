"""Server mode without an engine: the profile settings, the `vllm serve` command line, the streaming
TTFT client against a real local HTTP server, and how a --server-url run is judged and shown."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import threading
import time
from pathlib import Path

import jsonschema
import pytest

from guard.config.loading import load_thresholds
from guard.measure.side import plan_jobs
from guard.errors import ConfigError, InvalidRunError
from guard.judge.evaluate import evaluate
from guard.report.markdown import render_markdown
from guard.model.jsonfiles import results_to_dict
from guard.model.records import InvalidReason, ReasonKind, RequestOutcome, RunRecord, Status, Verdict
from guard.model.schema import results_schema
from guard.measure.server import (
    SERVED_MODEL_NAME,
    VllmServer,
    port_in_use,
    request_chat_stream,
    request_function,
    run_jobs_http,
    server_command,
    server_environment,
)
from guard.report.terminal import render_terminal
from tests.conftest import SHIPPED_THRESHOLDS
from tests.test_budgets import GOOD, write


# ----------------------------------------------------------------------------- profile settings
def with_engine(extra: str, budgets_extra: str = "") -> str:
    text = GOOD.replace("      max_model_len: 2048\n", "      max_model_len: 2048\n" + extra)
    return text.replace("      ttft_ms: {p50: 9000, p99: 10000}\n", "      ttft_ms: {p50: 9000, p99: 10000}\n" + budgets_extra)


def test_engine_mode_and_server_settings_load(tmp_path):
    p = load_thresholds(write(tmp_path, with_engine(
        "      mode: server\n      max_num_batched_tokens: 4096\n      gpu_memory_utilization: 0.85\n"))).profile("cpu")
    assert (p.engine.mode, p.engine.max_num_batched_tokens, p.engine.gpu_memory_utilization) == ("server", 4096, 0.85)
    assert load_thresholds(write(tmp_path, GOOD)).profile("cpu").engine.mode == "in-process"  # the default


@pytest.mark.parametrize("extra, line, key, words", [
    ("      mode: sever\n", 9, "profiles.cpu.engine.mode", "did you mean `server`"),
    ("      gpu_memory_utilization: 1.5\n", 9, "profiles.cpu.engine.gpu_memory_utilization", "must be a fraction in (0, 1]"),
    ("      max_num_batched_tokens: 0\n", 9, "profiles.cpu.engine.max_num_batched_tokens", "must be >= 1"),
])
def test_bad_engine_settings_name_file_line_key(tmp_path, extra, line, key, words):
    path = write(tmp_path, with_engine(extra))
    with pytest.raises(ConfigError) as e:
        load_thresholds(path)
    assert (e.value.line, e.value.key) == (line, key)
    assert str(path) in str(e.value) and words in str(e.value)


def test_mode_budgets_apply_only_in_their_mode(tmp_path):
    p = load_thresholds(write(tmp_path, with_engine("", "      modes:\n        server:\n          ttft_ms: {p50: 20000}\n"))).profile("cpu")
    assert p.ttft_ms == {"p50": 9000, "p99": 10000}
    server = p.with_engine_mode("server")
    assert server.engine.mode == "server" and server.ttft_ms == {"p50": 20000}
    assert server.with_engine_mode("in-process").ttft_ms == {"p50": 9000, "p99": 10000}  # and back
    assert p.with_engine_mode(None) is p and p.with_engine_mode("in-process") is p


def test_a_mode_without_its_own_ttft_budgets_is_a_config_error(tmp_path):
    path = write(tmp_path, GOOD)
    with pytest.raises(ConfigError) as e:
        load_thresholds(path).profile("cpu").with_engine_mode("server")
    assert e.value.key == "profiles.cpu.budgets.modes.server.ttft_ms" and "guard check --engine-mode server" in str(e.value)


@pytest.mark.parametrize("mode_block, key, words", [
    ("      modes:\n        sevrer:\n          ttft_ms: {p50: 1}\n", "profiles.cpu.budgets.modes.sevrer", "unknown engine mode"),
    ("      modes:\n        in-process:\n          ttft_ms: {p50: 1}\n", "profiles.cpu.budgets.modes.in-process",
     "its budgets are budgets.ttft_ms"),
    ("      modes:\n        server:\n          ttft: {p50: 1}\n", "profiles.cpu.budgets.modes.server.ttft", "did you mean `ttft_ms`"),
])
def test_bad_mode_budgets(tmp_path, mode_block, key, words):
    with pytest.raises(ConfigError) as e:
        load_thresholds(write(tmp_path, with_engine("", mode_block)))
    assert e.value.key == key and words in str(e.value) and e.value.line


def test_shipped_profiles_server_settings():
    t = load_thresholds(SHIPPED_THRESHOLDS)
    a10 = t.profile("a10")  # PR #49531's serving arguments
    assert a10.engine.mode == "server" and a10.engine.max_model_len == 4096
    assert a10.engine.gpu_memory_utilization == 0.85 and a10.workload.concurrency == 10
    cpu = t.profile("cpu")
    assert cpu.engine.mode == "in-process" and cpu.with_engine_mode("server").ttft_ms["p50"] > cpu.ttft_ms["p50"]


# ----------------------------------------------------------------------------- the command line
def test_server_command_carries_the_engine_arguments():
    t = load_thresholds(SHIPPED_THRESHOLDS)
    cmd = server_command(t.profile("a10").engine, seed=7, port=8123)
    assert cmd[1:4] == ["-m", "guard.compat", "serve"] and cmd[4] == "deepseek-ai/DeepSeek-OCR-2"

    def flag(name):
        return cmd[cmd.index(name) + 1]

    assert (flag("--host"), flag("--port"), flag("--seed")) == ("127.0.0.1", "8123", "7")
    assert (flag("--max-model-len"), flag("--gpu-memory-utilization"), flag("--mm-processor-cache-gb")) == ("4096", "0.85", "0")
    assert json.loads(flag("--limit-mm-per-prompt")) == {"image": 1}
    assert "--no-enable-prefix-caching" in cmd and "--enforce-eager" not in cmd and "--max-num-batched-tokens" not in cmd
    assert "--skip-mm-profiling" not in cmd  # a GPU sizes its KV cache from that pass
    assert flag("--revision") == "main" and flag("--served-model-name") == SERVED_MODEL_NAME
    cpu = server_command(t.profile("cpu").engine, seed=0, port=1)
    assert "--enforce-eager" in cpu and cpu[cpu.index("--load-format") + 1] == "dummy"
    assert "--skip-mm-profiling" in cpu
    assert cpu[4].endswith("guard/models/tiny-deepseek-ocr2")  # resolved like the in-process engine
    env = server_environment(t.profile("cpu").engine, base={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and "VLLM_ENABLE_V1_MULTIPROCESSING" not in env


def test_port_in_use_is_an_invalid_run_before_anything_starts(tmp_path):
    engine = load_thresholds(SHIPPED_THRESHOLDS).profile("cpu").engine
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert port_in_use(port)
        server = VllmServer(engine, 0, tmp_path / "server.log", port=port)
        with pytest.raises(InvalidRunError, match=f"port {port} on 127.0.0.1 is already in use"):
            server.start()
        assert server.proc is None


# ----------------------------------------------------------------------------- the client, real HTTP
class SSEServer:
    """A real OpenAI-style streaming endpoint on 127.0.0.1 (aiohttp, in a thread): waits
    ``first_chunk_s``, then streams a role chunk, ``tokens`` token chunks ``gap_s`` apart, a usage
    chunk and [DONE], as vLLM's chat endpoint streams them."""

    def __init__(self, first_chunk_s: float = 0.2, status: int = 200, tokens: int = 1, gap_s: float = 0.0) -> None:
        self.first_chunk_s, self.status, self.tokens, self.gap_s = first_chunk_s, status, tokens, gap_s
        self.bodies: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    async def _chat(self, request):
        from aiohttp import web

        self.bodies.append(await request.json())
        if self.status != 200:
            return web.Response(status=self.status, text="boom")
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await asyncio.sleep(self.first_chunk_s)
            await resp.write(b'data: {"choices": [{"delta": {"role": "assistant", "content": ""}}]}\n\n')
            for i in range(self.tokens):
                await asyncio.sleep(self.gap_s if i else 0.0)
                await resp.write(f"data: {json.dumps({'choices': [{'delta': {'content': 'x'}}]})}\n\n".encode())
            usage = {"choices": [], "usage": {"prompt_tokens": 267, "completion_tokens": self.tokens}}
            await resp.write(f"data: {json.dumps(usage)}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            return resp
        finally:
            self.in_flight -= 1

    async def _models(self, request):
        from aiohttp import web

        return web.json_response({"data": [{"id": "served-name"}]})

    def _serve(self) -> None:
        from aiohttp import web

        self.loop = asyncio.new_event_loop()
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        runner = self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        self.loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        self._ready.set()
        self.loop.run_forever()

    def __enter__(self) -> SSEServer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        # close the handlers still streaming (a request the client gave up on), then the loop
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@pytest.fixture(scope="module")
def cpu_workload():
    return load_thresholds(SHIPPED_THRESHOLDS).profile("cpu").workload


@pytest.mark.parametrize("prefer_vllm", [True, False], ids=["vllm-request-func", "guard-fallback"])
def test_ttft_is_the_time_to_the_first_streamed_choice(cpu_workload, prefer_vllm):
    name, func = request_function(prefer_vllm)
    assert ("vllm.benchmarks" in name) == prefer_vllm  # vLLM 0.32's own function is importable here
    with SSEServer(first_chunk_s=0.3) as srv:
        jobs = plan_jobs(cpu_workload, 0, 2, False)
        seen = []
        out = run_jobs_http(srv.url, "m", cpu_workload, jobs, on_outcome=seen.append, func=func)
    assert [o.index for o in out] == [0, 1] and len(seen) == 2
    for o in out:
        assert o.success and 0.3 <= o.ttft_client_s < 0.6 and o.ttft_engine_s is None
        assert o.prompt_tokens == 267
    body = srv.bodies[0]
    assert body["model"] == "m" and body["stream"] is True and body["max_completion_tokens"] == cpu_workload.max_tokens and body["ignore_eos"]
    text, image = body["messages"][0]["content"]
    assert text == {"type": "text", "text": cpu_workload.prompt}  # the <image> placeholder is in the prompt
    assert image["image_url"]["url"].startswith("data:image/png;base64,")
    assert srv.bodies[0] != srv.bodies[1]  # every request its own image


def test_concurrency_is_a_semaphore_over_requests_sent_at_once(cpu_workload):
    import dataclasses

    w = dataclasses.replace(cpu_workload, concurrency=3, image_sizes=((64, 64),))
    with SSEServer(first_chunk_s=0.3) as srv:
        t = time.perf_counter()
        out = run_jobs_http(srv.url, "m", w, plan_jobs(w, 0, 7, False))
        wall = time.perf_counter() - t
    assert all(o.success for o in out) and srv.max_in_flight == 3
    assert 0.9 <= wall < 2.0  # 7 requests of 0.3 s, 3 at a time: 3 waves
    assert all(o.ttft_client_s < 0.6 for o in out)  # waiting for a slot is not part of TTFT, as in vLLM


@pytest.mark.parametrize("prefer_vllm", [True, False], ids=["vllm-request-func", "guard-fallback"])
def test_5xx_is_a_failed_outcome(cpu_workload, prefer_vllm):
    with SSEServer(status=500) as srv:
        (o,) = run_jobs_http(srv.url, "m", cpu_workload, plan_jobs(cpu_workload, 0, 1, False),
                             func=request_function(prefer_vllm)[1])
    assert not o.success and o.ttft_client_s is None and "Internal Server Error" in o.error


def test_a_request_past_its_timeout_is_a_failed_outcome(cpu_workload):
    with SSEServer(first_chunk_s=5) as srv:
        (o,) = run_jobs_http(srv.url, "m", cpu_workload, plan_jobs(cpu_workload, 0, 1, False), request_timeout_s=0.5)
    assert not o.success and o.error == "timed out after 0 s" or "timed out" in o.error


def test_nothing_listening_is_a_failed_outcome(cpu_workload):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (o,) = asyncio.run(_one(f"http://127.0.0.1:{port}", cpu_workload))
    assert not o.success and "Connect" in o.error


async def _one(url, workload):
    import aiohttp

    from guard.measure.server import StreamResult, prepare

    (req,) = prepare(workload, plan_jobs(workload, 0, 1, False))
    async with aiohttp.ClientSession() as session:
        res: StreamResult = await request_chat_stream(url, "m", req, session)
    return [RequestOutcome(0, req.job.image_size, False, res.success, error=res.error)]


# ----------------------------------------------------------------------------- --server-url runs
def remote_run(samples_s: list[float]) -> RunRecord:
    return RunRecord(profile="cpu", thresholds_path=str(SHIPPED_THRESHOLDS), model="deepseek-ocr-2",
                     environment={"engine_mode": "server", "server": {"managed": False, "url": "http://127.0.0.1:8000"}},
                     outcomes=[RequestOutcome(i, (640, 480), False, True, ttft_client_s=s) for i, s in enumerate(samples_s)],
                     rounds=1)


def test_server_url_op_budgets_are_not_measured_never_passed():
    profile = load_thresholds(SHIPPED_THRESHOLDS).profile("cpu").with_engine_mode("server")
    res = evaluate(profile, remote_run([12.0, 12.5, 13.0, 12.2, 12.8, 12.4]))
    assert res.verdict == Verdict.PASS and res.op_checks == ()
    assert {(c.scope, c.op, c.status) for c in res.unmeasured_op_checks} == {
        ("mask_path", "aten::_index_put_impl_", Status.NOT_MEASURED), ("mask_path", "total_ops", Status.NOT_MEASURED)}
    assert all(c.status != Status.PASS for c in res.checks if c not in res.ttft_checks)
    assert "vllm serve" in res.ttft_definition and "first streamed message" in res.ttft_definition
    data = json.loads(json.dumps(results_to_dict(res)))  # as written to results.json
    jsonschema.Draft202012Validator(results_schema()).validate(data)
    assert [c["status"] for c in data["checks"]["ops_not_measured"]] == ["not_measured", "not_measured"]
    term = render_terminal(res)
    assert "not measured in this mode" in term and "2 op-count budget(s) not measured" in term.splitlines()[-1]
    md = render_markdown(res)
    assert "not measured in this mode" in md and "measured budgets held" in md


def test_a_managed_server_run_without_op_counts_is_still_invalid():
    profile = load_thresholds(SHIPPED_THRESHOLDS).profile("cpu").with_engine_mode("server")
    run = remote_run([12.0] * 6)
    run.environment.server = dataclasses.replace(run.environment.server, managed=True)  # guard started it: the in-process pass must have counted
    res = evaluate(profile, run)
    assert res.verdict == Verdict.INVALID and res.unmeasured_op_checks == ()
    assert any("budgeted but not measured" in r.text for r in res.invalid_reasons)


def test_check_rejects_inject_in_server_mode_and_bad_urls(tmp_path):
    from tests.conftest import run_guard

    proc = run_guard("check", "--engine-mode", "server", "--inject", "legacy-mask", "--output", str(tmp_path))
    assert proc.returncode == 2 and "--inject" in proc.stderr
    proc = run_guard("check", "--server-url", "localhost:8000", "--output", str(tmp_path))
    assert proc.returncode == 2 and "http(s) URL" in proc.stderr
    proc = run_guard("check", "--server-url", "http://x", "--engine-mode", "in-process", "--output", str(tmp_path))
    assert proc.returncode == 2


def test_vllm_cli_runs_under_vllm_cpu():
    """vllm-cpu's own `vllm` script cannot start (it asks for the 'vllm' distribution); guard's can."""
    import subprocess
    import sys

    from guard.compat import vllm_cli

    proc = subprocess.run([*vllm_cli(), "--version"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().startswith("0.32"), proc.stdout
    assert Path(sys.executable).exists()


# ----------------------------------------------------------------------------- update-thresholds
def test_update_thresholds_from_a_server_run_writes_the_server_budget(tmp_path, capsys, monkeypatch):
    import shutil

    from guard.commands import update_thresholds as ut
    from tests.test_update_thresholds import ENV, guard, make_results

    monkeypatch.setattr(ut, "git_commit", lambda cwd=None: None)
    y = tmp_path / "t.yaml"
    shutil.copyfile(SHIPPED_THRESHOLDS, y)
    server = load_thresholds(y).profile("cpu").with_engine_mode("server")
    config = {"engine": server.engine.as_dict(), "workload": server.workload.as_dict()}
    env = {**ENV, "engine_mode": "server", "server": {"managed": True}}
    r = make_results(tmp_path / "r.json", y, ttft={"p50": 10000.0}, env=env, config=config)
    code, out, err = guard(capsys, "--from", str(r), "--thresholds", str(y), "--only", "ttft")
    assert code == 0, err
    cpu = load_thresholds(y).profile("cpu")
    assert cpu.ttft_ms == {"p50": 7000}  # the in-process budget is untouched
    assert cpu.ttft_ms_by_mode["server"]["p50"] == 11500  # 10000 + 15 % headroom
    assert "modes.server.ttft_ms.p50" in out

    env["server"] = {"managed": False, "url": "http://127.0.0.1:8000"}
    r = make_results(tmp_path / "r.json", y, ttft={"p50": 12000.0}, env=env, config=config)
    code, _, err = guard(capsys, "--from", str(r), "--thresholds", str(y), "--only", "ttft")
    assert code == 2 and "did not start" in err


def test_report_keeps_the_server_log_tail_line_by_line():
    profile = load_thresholds(SHIPPED_THRESHOLDS).profile("cpu").with_engine_mode("server")
    run = remote_run([12.0] * 6)
    run.environment.server = dataclasses.replace(run.environment.server, managed=True)
    run.invalid_reasons.append(InvalidReason(ReasonKind.ENGINE, "vllm serve died during round 1 (exit status -9); last lines of out/server.log:\n"
                                               "INFO engine ready\nERROR ```boom``` @someone"))
    md = render_markdown(evaluate(profile, run))
    assert "- vllm serve died during round 1" in md
    assert "  ````text\n  INFO engine ready\n  ERROR ```boom``` @someone\n  ````" in md


def test_runner_measures_a_running_server_ttft_only(tmp_path):
    """GuardRun with --server-url: the TTFT pass goes over HTTP, the model name comes from
    /v1/models, the op pass measures nothing, and the environment says how it was measured."""
    from guard.measure.hardware import Hardware
    from guard.measure.single_run import GuardRun
    from tests.ttft_scenarios import CPU_ENV

    t = load_thresholds(SHIPPED_THRESHOLDS)
    profile = t.profile("cpu").with_engine_mode("server")
    profile = dataclasses_replace(profile, workload=dataclasses_replace(profile.workload, requests=3, image_sizes=((64, 64),)))
    with SSEServer(first_chunk_s=0.1) as srv:
        run = GuardRun(t, profile, Hardware(cuda=False, gpu_name=None, cpu_name="Test CPU", cpu_count=2), tmp_path,
                       progress=lambda m: None, environment=dict(CPU_ENV), server_url=srv.url + "/")
        run.warm_up()
        run.measure(3)
        assert run.profile_ops() == []
        record = run.finish()
    assert {b["model"] for b in srv.bodies} == {"served-name"} and len(srv.bodies) == 4
    assert len(record.ttft_client_s()) == 3 and all(0.1 <= s < 0.5 for s in record.ttft_client_s())
    env = record.environment
    assert env.engine_mode == "server" and env.server.managed is False and env.server.url == srv.url
    assert "vllm.benchmarks" in env.server.request_function
    res = evaluate(profile, record)
    assert res.verdict == Verdict.PASS and len(res.unmeasured_op_checks) == 2


def dataclasses_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)


def test_a_server_that_trickles_its_model_list_is_given_up_on_as_a_whole():
    """The urlopen timeout bounds each read; a byte every 0.5 s would never end it. The whole
    answer is bounded by the same seconds."""
    import socket
    import time as clock

    from guard.measure.server import served_model

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]

    def trickle():
        conn, _ = listener.accept()
        conn.recv(4096)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
        try:
            for _ in range(40):
                conn.sendall(b" ")
                clock.sleep(0.5)
        except OSError:
            pass
        conn.close()

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    t0 = clock.monotonic()
    with pytest.raises(InvalidRunError, match="cannot list the models"):
        served_model(f"http://127.0.0.1:{port}", timeout_s=2.0)
    assert clock.monotonic() - t0 < 5
    listener.close()


@pytest.mark.parametrize(("value", "kept"), [(267, 267), (0, 0), (-5, None), ("abc", None), (1.5, None), ([1], None),
                                             (10**30, None), (True, None), (None, None)])
def test_a_servers_prompt_token_count_is_kept_only_when_it_is_one(value, kept):
    from guard.measure.server import _token_count

    assert _token_count(value) == kept


def test_a_server_whose_requests_failed_is_given_a_moment_to_exit_before_it_counts_as_alive(tmp_path):
    """A killed server's broken responses reach the client before its process is gone: right after
    the failures ``alive()`` still says yes, ``alive_after_failures`` waits for the exit."""
    import subprocess
    import sys

    cpu = load_thresholds(SHIPPED_THRESHOLDS).profile("cpu")
    server = VllmServer(cpu.engine, 0, tmp_path / "server.log")
    server.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    assert server.alive()  # the process has not exited yet
    assert server.alive_after_failures(wait_s=30) is False
    server.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert server.alive_after_failures(wait_s=0.2) is True  # a live server whose requests failed
    finally:
        server.proc.kill()
        server.proc.wait()
