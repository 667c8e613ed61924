"""The vLLM engine under measurement: start it, feed it the workload, time each request.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the profiler pass
(guard/probes.py) sees the model's Python frames and the canary can be injected into the live
model. Requests are driven through ``LLMEngine.add_request``/``step`` in a closed loop that keeps
``concurrency`` requests in flight, like a client that sends the next request when one returns.
"""

from __future__ import annotations

import ctypes
import os
import platform
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from guard import compat
from guard.budgets import EngineArgs, Workload, resolve_model
from guard.errors import InvalidRunError
from guard.results import RequestOutcome

DEFAULT_REQUEST_TIMEOUT_S = 600.0


def prepare_environment(engine: EngineArgs) -> None:
    """Environment vLLM reads at import time; call before importing vllm."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if engine.cpu_kvcache_space_gb is not None:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(engine.cpu_kvcache_space_gb))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if engine.retain_freed_memory:
        retain_freed_memory()


# glibc's <malloc.h> parameters for mallopt()
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
# The same for a process guard starts (`vllm serve`), read by glibc when the process starts.
RETAIN_FREED_MEMORY_TUNABLES = f"glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold={2**64 - 1}"


def retain_freed_memory() -> None:
    """Keep memory this process frees for its own later allocations instead of returning it to the kernel.

    The CPU engine allocates and frees ~1.6 GB per 640x480 request. By default glibc serves blocks
    above 32 MB with mmap and unmaps them on free, so every request faults ~400,000 fresh pages in
    again (a second of kernel time). With mmap off, every block comes from the heap, and with
    trimming off, the heap keeps what was freed: after the first request nothing is faulted in
    (measured: 0 faults, 0.1 s kernel time per request, the same peak RSS)."""
    if platform.libc_ver()[0] != "glibc":
        raise InvalidRunError("engine.retain_freed_memory needs glibc's malloc, which this Python does not use",
                              hint="set `retain_freed_memory: false` in the profile's engine section")
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # -1 is glibc's "never trim" (the value is read as an unsigned size); mallopt returns 1 on success
    if not (mallopt(_M_MMAP_MAX, 0) and mallopt(_M_TRIM_THRESHOLD, -1)):
        raise InvalidRunError("engine.retain_freed_memory: glibc's mallopt() refused the setting")


def start_engine(engine: EngineArgs, seed: int):
    """Build the vLLM engine; any failure is an invalid run (exit 3), with the reason."""
    prepare_environment(engine)
    model = resolve_model(engine.model)
    if model.startswith("/") and not os.path.exists(model):
        raise InvalidRunError(f"engine failed to start: model path does not exist: {model}")
    try:
        from vllm import LLM
    except Exception as exc:  # noqa: BLE001 - an unusable vllm install is an invalid environment
        raise InvalidRunError(f"cannot import vllm: {exc}",
                              hint="install an engine: `uv sync --extra cpu` (or --extra gpu)") from exc
    kwargs: dict[str, Any] = dict(
        model=model,
        revision=engine.revision,
        tokenizer_revision=engine.revision,
        load_format=engine.load_format,
        dtype=engine.dtype,
        max_model_len=engine.max_model_len,
        enforce_eager=engine.enforce_eager,
        enable_prefix_caching=engine.enable_prefix_caching,
        mm_processor_cache_gb=engine.mm_processor_cache_gb,
        limit_mm_per_prompt={"image": 1},
        disable_log_stats=False,  # the engine's own first_token_latency needs stats on
        seed=seed,
    )
    if engine.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = engine.max_num_batched_tokens
    if engine.gpu_memory_utilization is not None:
        kwargs["gpu_memory_utilization"] = engine.gpu_memory_utilization
    try:
        return LLM(**kwargs)
    except Exception as exc:  # noqa: BLE001
        raise InvalidRunError(f"engine failed to start: {type(exc).__name__}: {exc}") from exc


def synthetic_image(seed: int, index: int, size: tuple[int, int]):
    """A deterministic image distinct per (seed, index): a page of dark 'text' strokes on paper.

    Distinct content per request keeps any content cache from skipping the vision encoder.
    """
    import numpy as np
    from PIL import Image

    w, h = size
    rng = np.random.default_rng([seed, index, w, h])
    page = np.full((h, w, 3), 245, dtype=np.uint8)
    rows = rng.integers(0, 256, size=(h // 8 + 1, w // 4 + 1), dtype=np.uint8)
    ink = np.repeat(np.repeat(rows < 90, 8, axis=0), 4, axis=1)[:h, :w]
    page[ink] = rng.integers(0, 60, size=3, dtype=np.uint8)
    page[::8] = 245  # line spacing
    return Image.fromarray(page)


@dataclass(frozen=True)
class Job:
    index: int
    image_size: tuple[int, int]
    warmup: bool


def plan_jobs(workload: Workload, start: int, count: int, warmup: bool,
              sizes: tuple[tuple[int, int], ...] | None = None) -> list[Job]:
    """Requests cycle through ``sizes`` (default: the workload's image sizes); indices stay
    unique across rounds, so every request gets its own image."""
    sizes = sizes or workload.image_sizes
    return [Job(i, sizes[i % len(sizes)], warmup) for i in range(start, start + count)]


class EngineDied(Exception):
    """engine.step() raised: nothing after it can be trusted."""


def run_jobs(
    llm,
    workload: Workload,
    jobs: list[Job],
    on_outcome: Callable[[RequestOutcome], None] = lambda o: None,
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
) -> list[RequestOutcome]:
    """Closed loop: keep ``workload.concurrency`` requests in flight; TTFT per request.

    Client TTFT starts just before ``add_request`` (input processing included) and stops when
    ``step()`` first returns a token for that request. Raises EngineDied if the engine breaks;
    requests that fail individually come back as unsuccessful outcomes.
    """
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=workload.max_tokens, temperature=0.0, ignore_eos=True)
    engine = compat.engine_core(llm)
    pending: deque[Job] = deque(jobs)
    inflight: dict[str, tuple[Job, float, float | None]] = {}  # id -> (job, submitted, ttft)
    outcomes: list[RequestOutcome] = []

    def finish(rid: str, **kw: Any) -> None:
        job, _, _ = inflight.pop(rid)
        outcome = RequestOutcome(index=job.index, image_size=job.image_size, warmup=job.warmup, **kw)
        outcomes.append(outcome)
        on_outcome(outcome)

    while pending or inflight:
        while pending and len(inflight) < workload.concurrency:
            job = pending.popleft()
            rid = f"guard-{job.index}"
            prompt = {"prompt": workload.prompt,
                      "multi_modal_data": {"image": synthetic_image(workload.seed, job.index, job.image_size)}}
            submitted = time.perf_counter()
            inflight[rid] = (job, submitted, None)
            try:
                engine.add_request(rid, prompt, params)
            except Exception as exc:  # noqa: BLE001 - a rejected request is a failed outcome
                finish(rid, success=False, error=f"{type(exc).__name__}: {exc}")
        if not inflight:
            continue
        try:
            step_outputs = engine.step()
        except Exception as exc:  # noqa: BLE001
            raise EngineDied(f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}") from exc
        now = time.perf_counter()
        for out in step_outputs:
            if out.request_id not in inflight:
                continue
            job, submitted, ttft = inflight[out.request_id]
            if ttft is None and out.outputs and out.outputs[0].token_ids:
                ttft = now - submitted
                inflight[out.request_id] = (job, submitted, ttft)
            if out.finished:
                engine_ttft = compat.first_token_latency_s(out)
                if ttft is None:
                    finish(out.request_id, success=False, error="finished without producing a token")
                else:
                    finish(out.request_id, success=True, ttft_client_s=ttft, ttft_engine_s=engine_ttft,
                           prompt_tokens=len(out.prompt_token_ids or ()))
        for rid, (job, submitted, _) in list(inflight.items()):
            if now - submitted > request_timeout_s:
                engine.abort_request([rid])
                finish(rid, success=False, error=f"timed out after {request_timeout_s:.0f} s")
    return outcomes
