"""The readings a run records beside its checks, and the arithmetic that defines what they mean.

An image size is written ``WxH`` (``size``, the one writing of it: a census key, a label, a table
cell). A census (guard.measure.census counts it) is ``"WxH" -> function -> op -> calls``; a
comprehension's calls are its function's (``fold``), and pseudo-ops (CUDA activity the profiler
saw, ``cuda::*``; how many calls ran in vLLM's input processing, ``input::calls``) are counted
beside the operator calls but are not operator calls (``total_calls``). The counting lives in
measure, the rule that judges a change in judge; both, and the baseline file in config, read a
census by these definitions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

ImageSize = tuple[int, int]

# Pseudo-ops: CUDA runtime activity charged to the code that caused it, counted beside the operators
MEMCPY_HTOD, CUDA_SYNC = "cuda::memcpy_htod", "cuda::sync"
# Of a function's operator calls, those issued while vLLM processed the request's inputs (renderer,
# tokenizer, multimodal processor) and launching nothing on a device: a where, not an op. It rides
# beside the counts so that it folds and travels with them; it is never compared as an op.
INPUT_CALLS = "input::calls"
PSEUDO_PREFIXES = ("cuda::", "input::")

# function "file:qualname" -> op -> calls, for one profiled request
FunctionCounts = dict[str, dict[str, int]]
# "WxH" -> FunctionCounts
Census = dict[str, FunctionCounts]


def size(image_size: ImageSize) -> str:
    """``640x480``: how an image size is written everywhere, a census key included."""
    return f"{int(image_size[0])}x{int(image_size[1])}"


def parse_size(key: str) -> ImageSize:
    w, h = key.split("x")
    return int(w), int(h)


COMPREHENSIONS = (".<locals>.<listcomp>", ".<locals>.<setcomp>", ".<locals>.<dictcomp>", ".<locals>.<genexpr>")


def fold(qualname: str) -> str:
    """A comprehension's ops belong to the function that wrote it (Python 3.12 inlines them anyway,
    PEP 709): ``Encoder.forward.<locals>.<listcomp>`` -> ``Encoder.forward``."""
    while qualname.endswith(COMPREHENSIONS):
        qualname = qualname.rsplit(".<locals>.", 1)[0]
    return qualname


def folded(census: FunctionCounts) -> FunctionCounts:
    """The census with comprehension frames merged into their functions (idempotent)."""
    out: dict[str, Counter[str]] = {}
    for fn, ops in census.items():
        out.setdefault(fold(fn), Counter()).update(ops)
    return {fn: dict(sorted(c.items())) for fn, c in sorted(out.items())}


def total_calls(ops: Mapping[str, int]) -> int:
    """Operator calls of one function; pseudo-ops (CUDA activity, where calls ran) are not operator calls."""
    return sum(n for op, n in ops.items() if not op.startswith(PSEUDO_PREFIXES))


def input_processing_only(ops: Mapping[str, int]) -> bool:
    """Every op call of the function ran in vLLM's input processing and none touched a device. Its
    tensors are the processor's host tensors on any machine, so an ``.item()`` or ``nonzero`` there
    waits for no device: not a host sync, however often it runs."""
    n = total_calls(ops)
    return n > 0 and ops.get(INPUT_CALLS, 0) >= n and not any(op.startswith("cuda::") for op in ops)


def counts_only(census: FunctionCounts) -> FunctionCounts:
    """The census without the where-it-ran reading: what a baseline file, a digest or a total holds."""
    return {fn: {op: n for op, n in ops.items() if op != INPUT_CALLS} for fn, ops in census.items()}


def without(census: FunctionCounts, excluded: Iterable[str]) -> FunctionCounts:
    drop = set(excluded)
    return {fn: ops for fn, ops in census.items() if fn not in drop}


def op_deltas(base: Mapping[str, int], got: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """Per op, how one function's calls changed, largest growth first; unchanged ops left out."""
    deltas = [(op, got.get(op, 0) - base.get(op, 0)) for op in set(base) | set(got) if op != INPUT_CALLS]
    return tuple(sorted(((op, d) for op, d in deltas if d), key=lambda od: (-od[1], od[0])))


# ----------------------------------------------------------------------------- the decode census
@dataclass(frozen=True)
class DecodeCensus:
    """One request mix's decode steps (every engine step after the first, which is the prefill):
    ``census`` is the calls of *one* step when every step made exactly the same calls
    (``per_step``), else the calls of all ``steps`` together. Exact either way: each step is
    counted on its own (guard.measure.inprocess marks the steps) and the steps compared."""

    steps: int
    per_step: bool
    census: FunctionCounts

    def total(self) -> FunctionCounts:
        """The calls of all decode steps together."""
        if not self.per_step:
            return self.census
        return {fn: {op: n * self.steps for op, n in ops.items()} for fn, ops in self.census.items()}

    @classmethod
    def of_steps(cls, steps: Sequence[FunctionCounts]) -> DecodeCensus:
        """From each decode step's own census, in order."""
        if all(s == steps[0] for s in steps[1:]):
            return cls(steps=len(steps), per_step=True, census=steps[0] if steps else {})
        summed: dict[str, Counter[str]] = {}
        for s in steps:
            for fn, ops in s.items():
                summed.setdefault(fn, Counter()).update(ops)
        return cls(steps=len(steps), per_step=False, census={fn: dict(sorted(c.items())) for fn, c in sorted(summed.items())})

    @classmethod
    def from_dict(cls, d: Mapping) -> DecodeCensus:
        return cls(steps=int(d["steps"]), per_step=bool(d["per_step"]), census={fn: dict(ops) for fn, ops in d["census"].items()})

    def unit(self) -> str:
        """What one count is: ``per step`` or ``over 7 steps``."""
        return "per step" if self.per_step else f"over {self.steps} steps"


def comparable(baseline: DecodeCensus, measured: DecodeCensus) -> tuple[FunctionCounts, FunctionCounts] | None:
    """The two decode censuses in one unit (per step where both are, else over all steps); None when
    they counted a different number of steps (the mix's output length changed)."""
    if baseline.steps != measured.steps:
        return None
    if baseline.per_step and measured.per_step:
        return baseline.census, measured.census
    return baseline.total(), measured.total()
