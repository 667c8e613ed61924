"""The operator census: per Python function, how many operator calls it issued itself.

Named scopes (guard/measure/probes.py) budget the code paths someone already knows to watch. The census
watches everything under its roots (default: the vLLM package): for one profiled request, every
operator call is charged to the *innermost* frame on its Python stack whose file lies under a
root ("self" counts: a call made by a helper under the root is the helper's, not its caller's),
broken down by op name. A host-side loop of small tensor ops anywhere in the model shows up as
one function whose counts grew, wherever it was written.

A function is named ``file:qualname`` (``vllm/model_executor/models/deepencoder2.py:
Qwen2Decoder2Encoder.forward``): the file relative to its package's parent folder, and the
qualified name, never a line number (lines move with every edit). torch.profiler records
``file(first line): co_name``; ``QualnameResolver`` turns that into the qualified name by compiling
the module's source (through ``linecache``, so a source-level mutant resolves against the source
that actually ran) and looking the code object up by first line and name.

Everything here is pure over ``guard.measure.probes.ProfEvent`` records except the resolver, which reads
source files; tests pass recorded events and a resolver over the installed vLLM.

What a census means (folding comprehensions, operator calls against pseudo-ops) is
guard.model.readings'; the baseline file is guard.config.census, the rule that judges a change
guard.judge.census.
"""

from __future__ import annotations

import linecache
import os
import sys
import types
from collections import Counter
from collections.abc import Callable, Iterable

from guard.config.budgets import DEFAULT_ROOTS
from guard.model.readings import CUDA_SYNC, INPUT_CALLS, MEMCPY_HTOD, FunctionCounts, fold, total_calls
from guard.measure.probes import FRAME_RE, HTOD_PREFIX, SYNC_CALLS, ProfEvent

# Profiler events that ProfEvent.is_op lets through but that are Python calls, not operators:
# nn.Module forward calls ("nn.Module: Linear_3", numbered per instance) and optimizer steps.
NOT_OPS = ("nn.Module:", "Optimizer.")

class QualnameResolver:
    """``(file relative to sys.path, first line, co_name) -> co_qualname``, by compiling the source.

    Relative profiler paths are found under ``sys.path``; the source comes from ``linecache`` (a
    mutant registers its patched source there). Unresolvable frames keep their bare name.
    """

    def __init__(self, search_path: Iterable[str] | None = None) -> None:
        self._search = [p for p in (search_path if search_path is not None else sys.path) if p]
        self._files: dict[str, dict[tuple[int, str], str]] = {}

    def _absolute(self, rel: str) -> str | None:
        if os.path.isabs(rel):
            return rel
        for base in self._search:
            candidate = os.path.join(base, rel)
            if os.path.isfile(candidate):
                return candidate
        return None

    def _table(self, rel: str) -> dict[tuple[int, str], str]:
        table = self._files.get(rel)
        if table is None:
            table = {}
            path = self._absolute(rel)
            lines = linecache.getlines(path) if path else []
            if lines:
                try:
                    code = compile("".join(lines), path, "exec", dont_inherit=True)
                except (SyntaxError, ValueError):
                    code = None
                stack = [code] if code is not None else []
                while stack:
                    c = stack.pop()
                    table.setdefault((c.co_firstlineno, c.co_name), getattr(c, "co_qualname", c.co_name))
                    stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
            self._files[rel] = table
        return table

    def __call__(self, file: str, line: int, name: str) -> str:
        return self._table(file).get((line, name), name)


def bare_name(file: str, line: int, name: str) -> str:
    """A resolver that keeps the profiler's bare function name (for tests without sources)."""
    return name


# vLLM's input processing: where a request's prompt and images become tensors before the engine
# schedules it (LLMEngine.add_request -> InputProcessor.process_inputs -> renderer -> multimodal
# processor; `processor.py` is the input processor's older name). An op with one of these on its
# stack works on the processor's host tensors.
INPUT_PROCESSING = ("vllm/v1/engine/input_processor.py", "vllm/v1/engine/processor.py", "vllm/renderers",
                    "vllm/inputs/preprocess.py", "vllm/multimodal/processing")


# ----------------------------------------------------------------------------- counting
def _under(file: str, roots: tuple[str, ...]) -> bool:
    file = file.replace("\\", "/")
    return any(file == r or file.startswith(r.rstrip("/") + "/") for r in roots)


def _frames_under(stack: tuple[str, ...], roots: tuple[str, ...]):
    """The stack's frames whose file lies under a root, innermost first, as FRAME_RE matches."""
    for frame in stack:
        m = FRAME_RE.match(frame)
        if m and _under(m.group("file"), roots):
            yield m


def in_input_processing(stack: tuple[str, ...]) -> bool:
    """Whether a frame of vLLM's input processing is on the stack."""
    return next(_frames_under(stack, INPUT_PROCESSING), None) is not None


def function_of(stack: tuple[str, ...], roots: tuple[str, ...],
                resolve: Callable[[str, int, str], str]) -> str | None:
    """The innermost frame under a root, as ``file:qualname``; None when no frame is under one."""
    m = next(_frames_under(stack, roots), None)
    if m is None:
        return None
    file = m.group("file").replace("\\", "/")
    return f"{file}:{fold(resolve(file, int(m.group('line')), m.group('func')))}"


def count_functions(events: Iterable[ProfEvent], roots: tuple[str, ...] = DEFAULT_ROOTS,
                    resolve: Callable[[str, int, str], str] = bare_name) -> FunctionCounts:
    """One profiled request's census: function -> op -> calls, sorted by function then op.

    CUDA runtime calls are not operators; the blocking ones count as ``cuda::sync``, and a device
    "Memcpy HtoD" an operator launched counts once more as ``cuda::memcpy_htod`` on its function.
    An operator call made in vLLM's input processing that launched nothing on a device counts once
    more as ``input::calls``: where it ran, so that the judge knows its tensors were host tensors.
    """
    counts: dict[str, Counter[str]] = {}
    memo: dict[tuple[str, ...], tuple[str | None, bool]] = {}  # stack -> (its function, in input processing)
    for e in events:
        if not e.is_op or e.name.startswith(NOT_OPS):
            continue
        if e.name.startswith("cuda"):
            if e.name not in SYNC_CALLS:
                continue
            label = CUDA_SYNC
        else:
            label = e.name
        if e.stack not in memo:
            memo[e.stack] = function_of(e.stack, roots, resolve), in_input_processing(e.stack)
        fn, processing = memo[e.stack]
        if fn is None:
            continue
        c = counts.setdefault(fn, Counter())
        c[label] += 1
        htod = sum(1 for k in e.device_activity if k.startswith(HTOD_PREFIX))
        if htod:
            c[MEMCPY_HTOD] += htod
        if processing and label != CUDA_SYNC and not e.device_activity:
            c[INPUT_CALLS] += 1
    return {fn: dict(sorted(c.items())) for fn, c in sorted(counts.items())}


def unstable_functions(runs: list[FunctionCounts]) -> dict[str, list[int]]:
    """Functions whose counts differ between runs of the same request: name -> totals per run."""
    names = sorted(set().union(*runs)) if runs else []
    return {fn: [total_calls(r.get(fn, {})) for r in runs] for fn in names
            if any(r.get(fn) != runs[0].get(fn) for r in runs[1:])}
