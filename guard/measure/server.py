"""Server mode (``engine.mode: server``): TTFT measured the way vLLM users measure it.

guard starts ``vllm serve`` (the vllm of this environment) on 127.0.0.1 and a free port with the
profile's engine arguments, waits for ``/health`` while watching the process, and sends the
workload through the OpenAI-compatible chat API with streaming, as ``vllm bench serve
--backend openai-chat --max-concurrency N --request-rate inf`` does: every request of a round is
created at once and a semaphore keeps ``concurrency`` of them in flight. TTFT is vLLM's own
definition, measured by vLLM's own request function when it is importable (guard/compat.py):
from just before the POST to the first streamed message that carries ``choices``. The time a
request waits for the semaphore is not part of its TTFT, as in vLLM.

Images are the same deterministic pages as in-process mode (``guard.measure.inprocess.synthetic_image``),
sent as PNG data URLs (lossless: the server decodes the very pixels the in-process engine gets),
encoded before a round starts. The prompt is sent verbatim: it already holds the model's
``<image>`` placeholder, so vLLM adds none, and guard's pass-through chat template
(``CHAT_TEMPLATE``) renders the user message unchanged, so the model sees the in-process prompt.

The server's stdout and stderr go to ``server.log`` in the output folder; every failure (it does
not start, it dies, a request errors or times out) is an invalid run whose message carries the
log's tail.
"""

from __future__ import annotations

import asyncio
import http.client
import base64
import functools
import io
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from guard.config.budgets import EngineArgs, Workload, resolve_model
from guard.compat import vllm_cli
from guard.errors import InvalidRunError
from guard.measure import enginelog
from guard.measure.inprocess import DEFAULT_REQUEST_TIMEOUT_S, RETAIN_FREED_MEMORY_TUNABLES, InProcessSide, synthetic_image
from guard.measure.process import die_with_parent, log_tail
from guard.measure.side import EngineDied, Job, OnOutcome, ProfiledRequest, ProfileFiles, SideInfo
from guard.model.records import RequestOutcome
from guard.sanitize import one_line

HOST = "127.0.0.1"
SERVED_MODEL_NAME = "guard-model"
CHAT_PATH = "/v1/chat/completions"
# Renders the conversation's text unchanged: the model sees exactly the workload's prompt.
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
STARTUP_TIMEOUT_S = 900.0  # real weights load from disk; the tiny CPU model takes 25-55 s
STOP_TIMEOUT_S = 30.0
DYING_S = 3.0  # how long a server whose requests failed is given to exit before it counts as alive
LOG_TAIL_LINES = 25
SERVER_LOG = "server.log"


# ----------------------------------------------------------------------------- command line
def server_command(engine: EngineArgs, seed: int, port: int, host: str = HOST) -> list[str]:
    """``vllm serve`` with the profile's engine arguments (the in-process engine's, as flags)."""
    cmd = [*vllm_cli(), "serve", resolve_model(engine.model),
           "--host", host, "--port", str(port),
           "--served-model-name", SERVED_MODEL_NAME,
           "--load-format", engine.load_format,
           "--dtype", engine.dtype,
           "--max-model-len", str(engine.max_model_len),
           "--mm-processor-cache-gb", _num(engine.mm_processor_cache_gb),
           "--limit-mm-per-prompt", json.dumps({"image": 1}),
           "--seed", str(seed),
           "--chat-template", CHAT_TEMPLATE,
           "--enable-prefix-caching" if engine.enable_prefix_caching else "--no-enable-prefix-caching",
           "--disable-uvicorn-access-log"]
    if engine.revision:
        cmd += ["--revision", engine.revision, "--tokenizer-revision", engine.revision]
    if engine.enforce_eager:
        cmd.append("--enforce-eager")
    if engine.max_num_batched_tokens is not None:
        cmd += ["--max-num-batched-tokens", str(engine.max_num_batched_tokens)]
    if engine.gpu_memory_utilization is not None:
        cmd += ["--gpu-memory-utilization", _num(engine.gpu_memory_utilization)]
    if engine.skip_mm_profiling:
        cmd.append("--skip-mm-profiling")
    return cmd


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def server_environment(engine: EngineArgs, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    if engine.cpu_kvcache_space_gb is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(engine.cpu_kvcache_space_gb)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if engine.retain_freed_memory:  # guard.measure.inprocess.retain_freed_memory, for a process guard starts
        env["GLIBC_TUNABLES"] = ":".join(filter(None, (env.get("GLIBC_TUNABLES"), RETAIN_FREED_MEMORY_TUNABLES)))
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server runs vLLM as users do
    return env


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


# ----------------------------------------------------------------------------- the managed server
class VllmServer:
    """A ``vllm serve`` child process owned by guard: start, wait for health, stop.

    Its own process group, so stopping it also stops the engine-core processes it spawned.
    """

    def __init__(self, engine: EngineArgs, seed: int, log_path: Path, port: int | None = None,
                 startup_timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        self.engine, self.seed, self.log_path = engine, seed, log_path
        self.port = port if port is not None else free_port()
        self.startup_timeout_s = startup_timeout_s
        self.command = server_command(engine, seed, self.port)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def tail(self) -> str:
        tail = log_tail(self.log_path, LOG_TAIL_LINES)
        return "(no server log)" if tail is None else tail or "(the server log is empty)"

    def fail(self, what: str) -> InvalidRunError:
        return InvalidRunError(f"{what}; last lines of {self.log_path}:\n{self.tail()}")

    def start(self, progress: Callable[[str], None] = lambda m: None) -> None:
        model = resolve_model(self.engine.model)
        if port_in_use(self.port):
            raise InvalidRunError(f"vllm serve cannot start: port {self.port} on {HOST} is already in use")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")  # noqa: SIM115 - owned by the child for its lifetime
        try:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=server_environment(self.engine), start_new_session=True,
                                         preexec_fn=functools.partial(die_with_parent, signal.SIGTERM))
        except OSError as exc:
            raise InvalidRunError(f"cannot run vllm serve ({self.command[0]}): {exc}") from exc
        finally:
            log.close()
        progress(f"vllm serve {model} on {self.url} (pid {self.proc.pid}, log {self.log_path})")
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                enginelog.note("start", mode="server", ok=False)
                raise self.fail(f"vllm serve exited with status {code} before it was healthy")
            if health(self.url):
                enginelog.note("start", mode="server", ok=True)
                return
            if time.monotonic() > deadline:
                self.stop()
                raise self.fail(f"vllm serve was not healthy after {self.startup_timeout_s:.0f} s")
            time.sleep(0.5)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def alive_after_failures(self, wait_s: float = DYING_S) -> bool:
        """Whether the server still runs once requests failed: a killed server's broken responses
        reach the client before its process has exited, so it is given ``wait_s`` to end first."""
        if self.proc is None:
            return False
        try:
            self.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            return True
        return False

    def stop(self) -> int | None:
        """SIGTERM the process group, then SIGKILL after STOP_TIMEOUT_S. Returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _signal_group(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        _signal_group(self.proc.pid, signal.SIGKILL)  # engine-core children left behind, if any
        return self.proc.returncode

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def health(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


MODELS_MAX_BYTES = 1 << 20  # a model list, not a download


def served_model(url: str, timeout_s: float = 10.0) -> str:
    """The model id an already running server serves (its first /v1/models entry). ``timeout_s``
    bounds the whole answer, not each read: a server that trickles a byte at a time is not waited
    on for ever. The id is one line of at most 200 characters: it goes into the report."""
    deadline = time.monotonic() + timeout_s
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=timeout_s) as r:
            body = b""
            while chunk := r.read1(65536):
                body += chunk
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the answer took over {timeout_s:g} s")
                if len(body) > MODELS_MAX_BYTES:
                    raise ValueError(f"the answer is over {MODELS_MAX_BYTES} bytes")
        model = json.loads(body)["data"][0]["id"]
        if not isinstance(model, str) or not model.strip():
            raise TypeError(f"the first model's id is {model!r}, not a name")
        return one_line(model, 200)
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError, http.client.HTTPException) as exc:
        raise InvalidRunError(f"cannot list the models of the server at {url}: {exc}",
                              hint="is it a vLLM OpenAI-compatible server? `curl URL/v1/models`") from exc


# ----------------------------------------------------------------------------- the client
def _token_count(value: Any) -> int | None:
    """A server's ``usage.prompt_tokens`` when it is a count (else None: recorded as unknown, since
    a server that says -5 or "abc" must not make guard's own run.json unreadable)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**9
    return value if ok else None


def image_data_url(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


@dataclass(frozen=True)
class ChatRequest:
    """One prepared request: what both guard and `vllm bench serve` send."""

    job: Job
    prompt: str
    image_url: str
    max_tokens: int


def prepare(workload: Workload, jobs: list[Job]) -> list[ChatRequest]:
    return [ChatRequest(j, workload.prompt, image_data_url(synthetic_image(workload.seed, j.index, j.image_size)),
                        workload.max_tokens) for j in jobs]


@dataclass(frozen=True)
class StreamResult:
    """What a request function reports (the fields of vLLM's RequestFuncOutput guard uses)."""

    success: bool
    ttft_s: float
    error: str
    prompt_tokens: int | None
    output_tokens: int | None = None  # the usage chunk's completion_tokens
    latency_s: float | None = None  # until the last chunk that carried choices
    itl_s: tuple[float, ...] = ()  # between successive chunks with choices, after the first


async def request_chat_stream(url: str, model: str, req: ChatRequest, session) -> StreamResult:
    """guard's copy of vLLM 0.32's ``async_request_openai_chat_completions`` timing rules, used
    only when vLLM's own function cannot be imported: the clock starts just before the POST; TTFT
    stops at the first SSE data message (not ``[DONE]``) whose JSON has non-empty ``choices``, each
    later such message is one inter-token gap, and the last one ends the latency."""
    payload = _payload(model, req)
    st = time.perf_counter()
    ttft, prompt_tokens, output_tokens, buffer = None, None, None, ""
    last, gaps = st, []
    try:
        async with session.post(url + CHAT_PATH, json=payload, headers={"Content-Type": "application/json"}) as resp:
            if resp.status != 200:
                return StreamResult(False, 0.0, f"HTTP {resp.status} {resp.reason or ''}".strip(), None)
            async for chunk in resp.content.iter_any():
                buffer += chunk.decode("utf-8", errors="replace")
                while "\n\n" in buffer:
                    message, buffer = buffer.split("\n\n", 1)
                    message = message.strip()
                    if not message or message.startswith(":"):
                        continue
                    data = message.removeprefix("data: ")
                    if data == "[DONE]":
                        continue
                    now = time.perf_counter()
                    obj = json.loads(data)
                    if obj.get("choices"):
                        if ttft is None:
                            ttft = now - st
                        else:
                            gaps.append(now - last)
                        last = now
                    elif obj.get("usage"):
                        prompt_tokens = _token_count(obj["usage"].get("prompt_tokens"))
                        output_tokens = _token_count(obj["usage"].get("completion_tokens"))
    except Exception as exc:  # noqa: BLE001 - a broken request is data, like in vLLM
        return StreamResult(False, 0.0, f"{type(exc).__name__}: {exc}", None)
    if ttft is None:
        return StreamResult(False, 0.0, "never received a streamed chunk with choices", prompt_tokens)
    return StreamResult(True, ttft, "", prompt_tokens, output_tokens, last - st, tuple(gaps))


def _payload(model: str, req: ChatRequest) -> dict[str, Any]:
    # The body vLLM's openai-chat request function builds (text first, then the image), with ignore_eos.
    return {"model": model, "messages": [{"role": "user", "content": [
                {"type": "text", "text": req.prompt},
                {"type": "image_url", "image_url": {"url": req.image_url}}]}],
            "max_completion_tokens": req.max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}


def request_function(prefer_vllm: bool = True):
    """(name, async f(url, model, ChatRequest, session) -> StreamResult): vLLM's own when usable."""
    from guard.compat import vllm_chat_request_func

    found = vllm_chat_request_func() if prefer_vllm else None
    if found is None:
        return "guard.measure.server.request_chat_stream", request_chat_stream
    func, input_cls = found

    async def call(url: str, model: str, req: ChatRequest, session) -> StreamResult:
        inp = input_cls(prompt=req.prompt, api_url=url + CHAT_PATH, prompt_len=0, output_len=req.max_tokens,
                        model=model, multi_modal_content={"type": "image_url", "image_url": {"url": req.image_url}},
                        ignore_eos=True)
        out = await func(request_func_input=inp, session=session)
        return StreamResult(bool(out.success), float(out.ttft), str(out.error or "").strip(),
                            out.prompt_len or None, _token_count(getattr(out, "output_tokens", None)),
                            float(out.latency) if getattr(out, "latency", None) else None,
                            tuple(float(x) for x in getattr(out, "itl", ()) or ()))

    return f"{func.__module__}.{func.__name__}", call


async def _run_round(url: str, model: str, requests: list[ChatRequest], concurrency: int, timeout_s: float,
                     on_outcome: Callable[[RequestOutcome], None], func) -> list[RequestOutcome]:
    import aiohttp

    # Like `vllm bench serve`: one keep-alive session, a connector limited to the concurrency.
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency, force_close=False)
    semaphore = asyncio.Semaphore(concurrency)
    outcomes: list[RequestOutcome] = []

    async def one(req: ChatRequest, session) -> None:
        async with semaphore:
            try:
                res = await asyncio.wait_for(func(url, model, req, session), timeout_s)
            except TimeoutError:
                res = StreamResult(False, 0.0, f"timed out after {timeout_s:.0f} s", None)
        job = req.job
        if res.success:
            # no usage chunk: one token per chunk, as many as the chunks (a chunk may carry more)
            tokens = res.output_tokens if res.output_tokens is not None else len(res.itl_s) + 1
            o = RequestOutcome(job.index, job.image_size, job.warmup, True, ttft_client_s=res.ttft_s,
                               prompt_tokens=res.prompt_tokens, output_tokens=tokens,
                               latency_s=res.latency_s, itl_s=res.itl_s)
        else:
            o = RequestOutcome(job.index, job.image_size, job.warmup, False,
                               error=_error_summary(res.error) or "request failed")
        outcomes.append(o)
        on_outcome(o)

    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        await asyncio.gather(*(one(r, session) for r in requests))
    return sorted(outcomes, key=lambda o: o.index)


def _error_summary(text: str) -> str:
    """A traceback's last line (the exception), or the message itself."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if len(lines) > 1 else (lines[0].strip() if lines else "")


def run_jobs_http(url: str, model: str, workload: Workload, jobs: list[Job],
                  on_outcome: Callable[[RequestOutcome], None] = lambda o: None,
                  request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S, func=None) -> list[RequestOutcome]:
    """One round through the server: all requests created at once, ``concurrency`` in flight."""
    if func is None:
        func = request_function()[1]
    requests = prepare(workload, jobs)
    return asyncio.run(_run_round(url, model, requests, workload.concurrency, request_timeout_s, on_outcome, func))


# ----------------------------------------------------------------------------- the side
class ServerSide:
    """TTFT through a server (``guard.measure.side.EngineSide``): a ``vllm serve`` guard starts and
    stops, or, with ``url``, one already running (TTFT only). Op counts come from an in-process
    engine started after the managed server stopped (docs/server-mode.md: why not vLLM's profiler
    endpoints); a remote server shows no frames, so its op budgets are reported "not measured"."""

    def __init__(self, profile, output: Path, progress: Callable[[str], None] = lambda m: None,
                 inject: str | None = None, url: str | None = None) -> None:
        self.profile, self.output, self.progress, self.inject = profile, output, progress, inject
        self.url = url.rstrip("/") if url else None
        self.server: VllmServer | None = None  # the managed server (None with a remote url)
        self.model: str | None = None
        self.environment: dict[str, Any] = {"server": {}}

    @property
    def info(self) -> dict[str, Any]:
        return self.environment["server"]

    def launch(self) -> None:
        pass  # nothing to spawn ahead of start

    def environment_key(self) -> None:
        return None  # only a worker says which environment it is without an engine (guard.measure.worker)

    def start(self) -> SideInfo:
        self.info["request_function"] = request_function()[0]
        t = time.perf_counter()
        if self.url:
            self.progress(f"measuring the running server at {self.url} (TTFT only)")
            self.info.update(managed=False, url=self.url)
            self.model = self.info["served_model"] = served_model(self.url)
            return SideInfo(init_s=0.0)
        e = self.profile.engine
        self.server = VllmServer(e, self.profile.workload.seed, self.output / SERVER_LOG)
        self.info.update(managed=True, command=self.server.command, log=SERVER_LOG)
        self.server.start(self.progress)
        self.model = SERVED_MODEL_NAME
        init_s = time.perf_counter() - t
        self.progress(f"vllm serve healthy in {init_s:.1f} s")
        return SideInfo(init_s=init_s)

    def run(self, jobs: list[Job], label: str, on_outcome: OnOutcome) -> list[RequestOutcome]:
        outcomes = run_jobs_http(self.url or self.server.url, self.model, self.profile.workload, jobs,
                                 on_outcome=on_outcome)
        for o in outcomes:
            enginelog.note("request", label=label, warmup=o.warmup, ok=o.success)
        failed = any(not o.success for o in outcomes)
        if self.server is not None and not (self.server.alive_after_failures() if failed else self.server.alive()):
            exc = self.server.fail(f"vllm serve died during {label} (exit status {self.server.proc.returncode})")
            raise EngineDied(str(exc)) from exc
        return outcomes

    def failed_requests_context(self, label: str, failed: int) -> str | None:
        if self.server is None:
            return None
        return f"{failed} request(s) failed during {label}; last lines of {self.server.log_path}:\n{self.server.tail()}"

    def op_count_side(self) -> InProcessSide | None:
        if self.url:
            return None  # no frames of a remote server
        if self.server is not None:
            self.stop()
            self.progress("op counts: the in-process profile pass, as in in-process mode (docs/server-mode.md: why "
                          "not vLLM's profiler endpoints)")
        return InProcessSide(self.profile, self.progress, inject=self.inject)

    def count_ops(self, job: Job, on_outcome: OnOutcome, files: ProfileFiles | None) -> ProfiledRequest:
        raise NotImplementedError("a server is profiled through op_count_side()")

    def speed_reading(self) -> None:
        return None  # the engine is another process, whose threads guard's reading would not run on

    def process_ids(self) -> frozenset[int]:
        return frozenset()

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass

    def kill(self) -> None:
        self.stop()

    def stop(self) -> None:
        if self.server is not None and "exit_status" not in self.info:
            code = self.server.stop()
            self.info["exit_status"] = code
            self.progress(f"vllm serve stopped (status {code})")

    def close(self) -> None:
        self.stop()
