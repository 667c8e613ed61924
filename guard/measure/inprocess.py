"""The in-process engine side: start vLLM in this process, feed it the workload, time each request,
profile one request.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the profiler pass
(guard/measure/probes.py) sees the model's Python frames and the canary can be injected into the live
model. Requests are driven through ``LLMEngine.add_request``/``step`` in a closed loop that keeps
``concurrency`` requests in flight, like a client that sends the next request when one returns.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from guard import compat
from guard.config.budgets import MIX_TEXT_PROMPT, EngineArgs, Workload, resolve_model
from guard.errors import InvalidRunError
from guard.measure import enginelog
from guard.measure.side import EngineDied, Job, OnOutcome, ProfiledRequest, ProfileFiles, SideInfo
from guard.model.records import RequestOutcome, ScopeCounts
from guard.sanitize import clipped

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


@contextlib.contextmanager
def model_construction(load_format: str) -> Iterator[None]:
    """How guard has vLLM build the model: dummy weights overwrite whatever initialisation the
    construction does, so it is skipped (guard.compat.weights_left_uninitialised), and they are
    drawn once and copied, to the same bits (guard.compat.dummy_weights_from_one_stream); real
    weights load as vLLM loads them."""
    if load_format != "dummy":
        yield
        return
    with compat.weights_left_uninitialised(), compat.dummy_weights_from_one_stream():
        yield


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
    if engine.skip_mm_profiling:
        kwargs["skip_mm_profiling"] = True
    t = time.perf_counter()
    try:
        with model_construction(engine.load_format):
            llm = LLM(**kwargs)
    except Exception as exc:  # noqa: BLE001
        enginelog.note("start", mode="in-process", ok=False, s=round(time.perf_counter() - t, 2))
        where = raised_at(exc)
        raise InvalidRunError(f"engine failed to start: {type(exc).__name__}: {clipped(exc)}"
                              f"{f' (raised at {where})' if where else ''}") from exc
    enginelog.note("start", mode="in-process", ok=True, s=round(time.perf_counter() - t, 2))
    return llm


def raised_at(exc: BaseException) -> str | None:
    """Where an exception was raised, as a reader finds it in a vLLM checkout: the innermost frame
    in vLLM's own files (``vllm/utils/x.py:33, in f``), else the innermost frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return None
    paths = [f.filename.replace(os.sep, "/") for f in frames]
    in_vllm = [i for i, p in enumerate(paths) if "/vllm/" in p]
    i = in_vllm[-1] if in_vllm else len(frames) - 1
    path = paths[i]
    return f"{path[path.rfind('/vllm/') + 1:] if i in in_vllm else path}:{frames[i].lineno}, in {frames[i].name}"


def died_because(exc: BaseException) -> str:
    """The engine's exception for an invalid reason: its first line names the file, line and function
    that raised it (a revision that cannot run on this stack is named there, not deep in a log), then
    the outermost frame and the innermost three."""
    frames = traceback.extract_tb(exc.__traceback__)
    shown = (traceback.format_list(frames[:1]) + (["  ...\n"] if len(frames) > 4 else [])
             + traceback.format_list(frames[1:][-3:]))
    where = raised_at(exc)
    return (f"{type(exc).__name__}: {exc}{f' (raised at {where})' if where else ''}\n"
            f"Traceback (outermost and innermost frames):\n{''.join(shown)}")


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


def request_of(workload: Workload, job: Job) -> tuple[dict[str, Any], Any]:
    """The prompt and SamplingParams of a job: the workload's greedy request with its image, or the
    job's request mix (its sampling, its output length, a text prompt or the workload's image)."""
    from vllm import SamplingParams

    mix = job.mix
    if mix is not None and not mix.images:
        return {"prompt": MIX_TEXT_PROMPT}, SamplingParams(**mix.sampling_kwargs())
    prompt = {"prompt": workload.prompt,
              "multi_modal_data": {"image": synthetic_image(workload.seed, job.index, job.image_size)}}
    if mix is None:
        return prompt, SamplingParams(max_tokens=workload.max_tokens, temperature=0.0, ignore_eos=True)
    return prompt, SamplingParams(**mix.sampling_kwargs())


@contextlib.contextmanager
def marked_step(marked: bool) -> Iterator[None]:
    """One engine step between the profiler markers guard.measure.probes.split_steps reads."""
    if not marked:
        yield
        return
    from torch.profiler import record_function

    from guard.measure.probes import STEP_BEGIN, STEP_END

    with record_function(STEP_BEGIN):
        yield
    with record_function(STEP_END):
        pass


@dataclass
class TokenClock:
    """One in-flight request's clock: when it was submitted, when each new token arrived."""

    job: Job
    submitted: float
    ttft: float | None = None
    tokens: int = 0
    last: float | None = None
    gaps: list[float] = field(default_factory=list)

    def saw(self, tokens: int, now: float) -> None:
        """The request's output now holds ``tokens`` tokens (cumulative, as vLLM's outputs hold them)."""
        if tokens <= self.tokens:
            return
        if self.last is None:
            self.ttft = now - self.submitted
        else:  # one gap per step that brought tokens, as `vllm bench serve` counts a chunk
            self.gaps.append(now - self.last)
        self.tokens, self.last = tokens, now


def run_jobs(
    llm,
    workload: Workload,
    jobs: list[Job],
    on_outcome: Callable[[RequestOutcome], None] = lambda o: None,
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
) -> list[RequestOutcome]:
    """Closed loop: keep ``workload.concurrency`` requests in flight; TTFT, TPOT and ITL per request.

    Client TTFT starts just before ``add_request`` (input processing included) and stops when
    ``step()`` first returns a token for that request; each later step that returns more tokens
    is one inter-token gap, and the step that finishes it ends its latency. Raises EngineDied if
    the engine breaks; requests that fail individually come back as unsuccessful outcomes.
    """
    engine = compat.engine_core(llm)
    marked = any(j.mix is not None for j in jobs)  # a mix's decode steps are counted step by step
    pending: deque[Job] = deque(jobs)
    inflight: dict[str, TokenClock] = {}
    outcomes: list[RequestOutcome] = []

    def finish(rid: str, **kw: Any) -> None:
        job = inflight.pop(rid).job
        outcome = RequestOutcome(index=job.index, image_size=job.image_size, warmup=job.warmup, **kw)
        outcomes.append(outcome)
        on_outcome(outcome)

    while pending or inflight:
        while pending and len(inflight) < workload.concurrency:
            job = pending.popleft()
            rid = f"guard-{job.index}"
            prompt, params = request_of(workload, job)
            inflight[rid] = TokenClock(job, time.perf_counter())
            try:
                engine.add_request(rid, prompt, params)
            except Exception as exc:  # noqa: BLE001 - a rejected request is a failed outcome
                finish(rid, success=False, error=f"{type(exc).__name__}: {exc}")
        if not inflight:
            continue
        try:
            with marked_step(marked):
                step_outputs = engine.step()
        except Exception as exc:  # noqa: BLE001
            raise EngineDied(died_because(exc)) from exc
        now = time.perf_counter()
        for out in step_outputs:
            clock = inflight.get(out.request_id)
            if clock is None:
                continue
            if out.outputs:
                clock.saw(len(out.outputs[0].token_ids), now)
            if out.finished:
                if clock.ttft is None:
                    finish(out.request_id, success=False, error="finished without producing a token")
                else:
                    finish(out.request_id, success=True, ttft_client_s=clock.ttft,
                           ttft_engine_s=compat.first_token_latency_s(out),
                           prompt_tokens=len(out.prompt_token_ids or ()), output_tokens=clock.tokens,
                           latency_s=now - clock.submitted, itl_s=tuple(clock.gaps))
        for rid, clock in list(inflight.items()):
            if now - clock.submitted > request_timeout_s:
                engine.abort_request([rid])
                finish(rid, success=False, error=f"timed out after {request_timeout_s:.0f} s")
    return outcomes


# ----------------------------------------------------------------------------- injection (--inject)
SLOW_ENCODER = "slow-encoder"
ENCODER_CLASS = "Qwen2Decoder2Encoder"  # vllm/model_executor/models/deepencoder2.py: the vision encoder


def parse_inject(spec: str | None) -> float | None:
    """``slow-encoder:5%`` -> 5.0 (percent of TTFT added to the vision encoder); None -> None."""
    if spec is None:
        return None
    name, _, amount = spec.partition(":")
    if not amount:
        amount = "-1"
    try:
        pct = float(amount.rstrip("%").strip())
    except ValueError:
        pct = -1.0
    if name != SLOW_ENCODER or not 0 < pct <= 100:
        from guard.errors import UsageError

        raise UsageError(f"bad --inject value {spec!r}", hint=f"e.g. `--inject {SLOW_ENCODER}:5%` (0 < percent <= 100)")
    return pct


class SlowEncoder:
    """Test hook (``--inject slow-encoder:P%``, candidate only): every vision-encoder forward
    sleeps for P % of a request's TTFT, spread over the request's encoder calls.

    The sleep is proportional to the forward's own measured time: ``sleep = P/100 x forward time
    x k``, with k = (warm-up TTFT) / (warm-up encoder time), calibrated on the warm-up requests
    (run without sleeping), so the added time is P % of TTFT whatever the image size or machine.
    """

    def __init__(self, llm, pct: float) -> None:
        from guard.compat import model_modules

        self.pct = pct
        self.scale: float | None = None  # k above; None until calibrated
        self.encoder_s = 0.0  # encoder forward time since the last calibration reset
        self.slept_s = 0.0
        self.calls = 0
        modules = model_modules(llm, ENCODER_CLASS)
        if not modules:
            raise RuntimeError(f"cannot inject {SLOW_ENCODER}: no {ENCODER_CLASS} module in the live model "
                               "(renamed in vLLM's deepencoder2.py?)")
        for m in modules:
            m.forward = self._wrap(m.forward)  # an instance attribute shadows the class's forward

    def _wrap(self, original):
        def forward(*args, **kwargs):
            t0 = time.perf_counter()
            out = original(*args, **kwargs)
            if getattr(out, "is_cuda", False):
                import torch

                torch.cuda.synchronize()  # the forward's time, not its launch time
            spent = time.perf_counter() - t0
            self.encoder_s += spent
            self.calls += 1
            if self.scale is not None:
                pause = self.pct / 100.0 * spent * self.scale
                time.sleep(pause)
                self.slept_s += pause
            return out
        return forward

    def calibrate(self, ttft_s: list[float]) -> None:
        if not ttft_s or self.encoder_s <= 0:
            raise RuntimeError(f"cannot calibrate {SLOW_ENCODER}: the warm-up ran no vision encoder")
        self.scale = sum(ttft_s) / self.encoder_s


class Injection:
    """``--inject``, applied in one place for every in-process engine (a plain check's, a worker's):
    a source mutant of vLLM before the engine imports its model code (guard.measure.mutants), the canary
    (guard.measure.canary) or the slowed encoder into the live model once it runs. Held until ``close``."""

    def __init__(self, spec: str | None, progress: Callable[[str], None]) -> None:
        self.spec, self.progress = spec, progress
        self.slow: SlowEncoder | None = None
        self._canary = None

    def before_start(self) -> None:
        from guard.measure.canary import LEGACY_MASK
        from guard.measure.mutants import MUTANT_PREFIX

        if self.spec is None:
            return
        if self.spec.startswith(MUTANT_PREFIX):
            from guard.measure.mutants import install

            mutant = install(self.spec)
            self.progress(f"MUTANT {mutant.name}: {mutant.what} ({mutant.function}); expected verdict: {mutant.expect}")
        elif self.spec == LEGACY_MASK:
            self.progress("CANARY: the pre-#49531 mask is injected; this run must fail")
        else:
            parse_inject(self.spec)  # a bad spec fails before a minute of engine start

    def after_start(self, llm) -> None:
        from guard.measure.canary import LEGACY_MASK, inject_legacy_mask
        from guard.measure.mutants import MUTANT_PREFIX

        if self.spec is None or self.spec.startswith(MUTANT_PREFIX):
            return
        if self.spec == LEGACY_MASK:
            # Held until close: a dropped generator context would be closed by the garbage
            # collector, silently restoring the current mask.
            self._canary = inject_legacy_mask(llm)
            self._canary.__enter__()
        else:
            self.slow = SlowEncoder(llm, parse_inject(self.spec))

    def close(self) -> None:
        if self._canary is not None:
            canary, self._canary = self._canary, None
            canary.__exit__(None, None, None)


def exceeds_a_budget(profile, counts: list[ScopeCounts]) -> bool:
    """Whether some op budget's own rule (config's ``OpBudget.fails``) fails on these counts: then
    the trace is kept, to explain what judging will report. A scope never entered keeps none."""
    budgets = {sb.name: sb for sb in profile.ops}
    for c in counts:
        sb = budgets.get(c.scope)
        if sb is None or c.entries == 0:
            continue
        if any(b.fails(c.calls_by_op.get(op, 0)) for op, b in sb.ops.items()):
            return True
        if sb.total_ops is not None and sb.total_ops.fails(c.total_calls):
            return True
    return False


# ----------------------------------------------------------------------------- the side
class InProcessSide:
    """The engine in this process (``guard.measure.side.EngineSide``): the only place that profiles
    a request, for a plain check and for each worker of an A/B check alike."""

    def __init__(self, profile, progress: Callable[[str], None] = lambda m: None, inject: str | None = None,
                 speed_reader: Callable[..., Any] | None = None, announce_start: bool = True) -> None:
        self.profile = profile
        self.progress = progress
        self.injection = Injection(inject, progress)
        self.speed_reader = speed_reader  # None: guard.measure.speedref.measure
        self.announce_start = announce_start  # a worker's parent says it instead, with the versions
        self.environment: dict[str, Any] = {}
        self.llm = None
        self._resolver = None  # guard.measure.census.QualnameResolver: it compiles each vLLM source once, keep it

    def launch(self) -> None:
        pass  # nothing to spawn ahead of start

    def environment_key(self) -> None:
        return None  # only a worker says which environment it is without an engine (guard.measure.worker)

    def start(self) -> SideInfo:
        e = self.profile.engine
        self.injection.before_start()
        if self.announce_start:
            self.progress(f"starting vLLM engine: {e.model} ({e.dtype}, load_format={e.load_format}) ...")
        t = time.perf_counter()
        self.llm = start_engine(e, seed=self.profile.workload.seed)
        init_s = time.perf_counter() - t
        self.injection.after_start(self.llm)
        if self.announce_start:
            self.progress(f"engine ready in {init_s:.1f} s")
        return SideInfo(init_s=init_s)

    def run(self, jobs: list[Job], label: str, on_outcome: OnOutcome, *, first_token_only: bool = False) -> list[RequestOutcome]:
        """``first_token_only``: the requests stop at their first token whatever ``workload.max_tokens``
        (the prefill census profiles the prefill; decode is the request mixes' census)."""
        slow = self.injection.slow
        if slow is not None and slow.scale is None and not all(j.warmup for j in jobs):
            raise RuntimeError(f"{SLOW_ENCODER} is not calibrated: run the warm-up requests first")
        workload = replace(self.profile.workload, max_tokens=1) if first_token_only else self.profile.workload
        try:
            outcomes = run_jobs(self.llm, workload, jobs, on_outcome)
        except EngineDied as exc:
            raise EngineDied(f"engine died during {label}: {exc}") from exc
        for o in outcomes:
            enginelog.note("request", label=label, warmup=o.warmup, ok=o.success)
        if slow is not None:
            if slow.scale is None:
                slow.calibrate([o.ttft_client_s for o in outcomes if o.success])
                self.progress(f"{SLOW_ENCODER}: calibrated on {len(outcomes)} warm-up request(s): "
                              f"+{slow.pct:g} % of TTFT = {slow.pct:g} % x encoder time x {slow.scale:.2f}")
            elif not all(j.warmup for j in jobs):  # the hook's own account: the true injected slowdown
                self.environment["injected_sleep_s"] = round(slow.slept_s, 4)
        return outcomes

    def failed_requests_context(self, label: str, failed: int) -> str | None:
        return None  # each outcome carries its own error

    def op_count_side(self) -> InProcessSide:
        return self

    def count_ops(self, job: Job, on_outcome: OnOutcome, files: ProfileFiles | None) -> ProfiledRequest:
        """One request under torch.profiler: op counts per budgeted scope (guard.measure.probes), the census
        (guard.measure.census), and with ``files`` the scopes' events and, on a failed op budget, the trace."""
        from guard.model import format as fmt
        from guard.measure.probes import attribute, profile_request, save_events, save_trace, scope_events

        outcomes: list[RequestOutcome] = []
        prefill = job.mix is None
        events, prof = profile_request(lambda: outcomes.extend(self.run([job], "profiled", on_outcome, first_token_only=prefill)))
        if job.mix is not None:
            del prof
            return self._count_decode(events, outcomes)
        size = fmt.size(job.image_size)
        if files is not None:  # small, and enough to re-attribute
            files.folder.mkdir(parents=True, exist_ok=True)
            save_events(scope_events(events, self.profile.ops), files.folder / f"events{files.label}-{size}.json.gz")
        counts = attribute(events, self.profile.ops, job.image_size)
        found = ProfiledRequest(outcomes, counts)
        if self.profile.census is not None:  # each side counts its own vLLM's functions
            from guard.measure.census import QualnameResolver, count_functions

            t = time.perf_counter()
            if self._resolver is None:
                self._resolver = QualnameResolver()
            found.census = count_functions(events, self.profile.census.roots, self._resolver)
            found.census_s = time.perf_counter() - t
        if files is not None:
            if files.traces_always or exceeds_a_budget(self.profile, counts):
                found.trace = f"trace{files.label}-{size}.json.gz"
                save_trace(prof, files.folder / found.trace)
        del prof
        return found

    def _count_decode(self, events, outcomes: list[RequestOutcome]) -> ProfiledRequest:
        """A mix's request: the census of each engine step after the first (the prefill), counted
        step by step and kept per step when every step made the same calls (DecodeCensus)."""
        from guard.measure.census import QualnameResolver, count_functions
        from guard.measure.probes import split_steps
        from guard.model.readings import DecodeCensus

        found = ProfiledRequest(outcomes, [])
        if self.profile.census is None:
            return found
        t = time.perf_counter()
        if self._resolver is None:
            self._resolver = QualnameResolver()
        steps = [count_functions(step, self.profile.census.roots, self._resolver) for step in split_steps(events)[1:]]
        found.decode = DecodeCensus.of_steps(steps)
        found.census_s = time.perf_counter() - t
        return found

    def speed_reading(self):
        """guard's speed reference in the engine's own process (its threads, bound to cores by
        vLLM), between requests; on a CPU profile only: on a GPU TTFT is the device's. In the
        engine's dtype: float32 where the engine runs it for want of native bf16
        (speedref.WORKLOAD_FLOAT32)."""
        from guard.measure import speedref

        if self.profile.match.cuda:
            return None
        try:
            return (self.speed_reader or speedref.measure)(workload=speedref.workload_for(self.profile.engine.dtype))
        except Exception as exc:  # noqa: BLE001 - a reading is evidence, not a requirement
            self.progress(f"speed reference not measured: {exc}")
            return None

    def process_ids(self) -> frozenset[int]:
        return frozenset()

    def pause(self) -> None:
        pass  # guard's own process: nothing else to stop

    def resume(self) -> None:
        pass

    def kill(self) -> None:
        pass

    def close(self) -> None:
        self.injection.close()
