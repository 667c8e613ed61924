"""What a census change would cost on a GPU: each op of a function's change classed (a kernel
launch, a host sync, a host-to-device copy, an index write, a view, or a composite that only calls
other ops), then priced per GPU by the per-call constants of ``gpu_costs.json`` beside this module.

The constants are estimates from published figures, each row naming its source, until a lent GPU
runs ``benchmarks/gpu_cost.py`` and its rows replace them ("calibrated"). What a price means and
where it is wrong is docs/gpu-cost.md; a price is shown beside the op counts, never judged.

A census counted on a CPU cannot see devices: an ``.item()`` there is priced as the host sync it
is when its tensor is on a GPU. A census counted on a GPU carries the CUDA activity the profiler
saw (``cuda::sync``, ``cuda::memcpy_htod``): there the waits are measured, and the ops that asked
for them are priced as the launches they also are. Pure, but for reading the constants file.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from guard.errors import ConfigError
from guard.model.checks import CostStatus, GpuCost, OpClass, PricedClass
from guard.model.readings import CUDA_SYNC, MEMCPY_HTOD, Census

COSTS_FILE = Path(__file__).with_name("gpu_costs.json")
COSTS_SCHEMA = "guard/gpu-costs"
COSTS_SCHEMA_VERSION = 1
COSTS_DOC = "docs/gpu-cost.md"
# The classes a constants file prices, each GPU once: a composite is never priced (its ops are).
PRICED_CLASSES = (OpClass.KERNEL_LAUNCH, OpClass.HOST_SYNC, OpClass.H2D_COPY, OpClass.INDEX_WRITE, OpClass.VIEW)

# ----------------------------------------------------------------------------- the op classes
# The host waits for the device: the result's value or size lives there. Their CPU kernels nest no
# recorded sync op, so each is counted once (``aten::item`` and ``aten::is_nonzero`` wrap
# ``_local_scalar_dense``: composites). On CUDA, masked_select and unique size their output from the
# device, as nonzero does (benchmarks/host-syncs-cuda-h200.json: nonzero, boolean-mask reads), and
# torch.equal reads its answer back.
HOST_SYNCS = frozenset({"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::_unique2",
                        "aten::unique_consecutive", "aten::unique_dim", "aten::unique_dim_consecutive",
                        "aten::equal"})
# An advanced-index write: one index kernel, with its index tensors (host tensors, as in the
# pre-#49531 mask loop) sent to the device first. ``index_put_`` wraps it.
INDEX_WRITES = frozenset({"aten::_index_put_impl_"})
# A tensor made from Python data (torch.tensor, a Python scalar written into a tensor): on a GPU it
# is copied to the device, and PyTorch waits for that copy (host-syncs-cuda-h200.json, x[idx] = 0).
H2D_COPIES = frozenset({"aten::lift_fresh"})
# Views and metadata: a new tensor header over the same storage, or none at all; no kernel.
VIEWS = frozenset({
    "aten::view", "aten::_unsafe_view", "aten::_reshape_alias", "aten::reshape", "aten::view_as", "aten::flatten",
    "aten::unflatten", "aten::slice", "aten::select", "aten::narrow", "aten::as_strided", "aten::as_strided_",
    "aten::t", "aten::transpose", "aten::permute", "aten::movedim", "aten::unsqueeze", "aten::squeeze",
    "aten::expand", "aten::expand_as", "aten::broadcast_tensors", "aten::unfold", "aten::diagonal", "aten::alias",
    "aten::detach", "aten::detach_", "aten::split", "aten::split_with_sizes", "aten::tensor_split", "aten::chunk",
    "aten::unbind", "aten::meshgrid", "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
    "aten::new_empty_strided", "aten::resize_", "aten::set_", "aten::result_type", "aten::promote_types",
    "aten::resolve_conj", "aten::resolve_neg", "aten::lift", "aten::numel", "aten::size", "aten::stride",
    "aten::is_same_size",
})
# Ops that only call other ops, each of which the profiler records and the census counts: pricing
# them too would count one kernel twice (e.g. ``linear`` -> ``t`` + ``mm``; ``to`` -> ``copy_``;
# ``zeros`` -> ``empty`` + ``zero_``). Checked under torch.profiler on a CPU, where the census is
# counted: ``zero_`` and ``scalar_tensor`` nest no recorded op there, so they are launches.
COMPOSITES = frozenset({
    "aten::item", "aten::is_nonzero", "aten::index_put_", "aten::index_put", "aten::to", "aten::_to_copy",
    "aten::type_as", "aten::contiguous", "aten::clone", "aten::linear", "aten::matmul", "aten::einsum",
    "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution", "aten::_convolution", "aten::layer_norm",
    "aten::group_norm", "aten::scaled_dot_product_attention", "aten::dropout", "aten::pad", "aten::constant_pad_nd",
    "aten::zeros", "aten::zeros_like", "aten::ones", "aten::ones_like", "aten::full",
    "aten::full_like", "aten::new_zeros", "aten::new_ones", "aten::new_full", "aten::repeat",
    "aten::stack", "aten::concat", "aten::concatenate", "aten::embedding", "aten::rsub", "aten::__and__",
    "aten::__or__", "aten::__xor__", "aten::__iand__", "aten::__ior__", "aten::__ixor__",
})


def op_class(op: str, *, on_gpu: bool = False) -> OpClass | None:
    """The class of one census op name; None for what is not an operator call (``input::calls``).

    ``on_gpu``: the census was counted on a GPU, so its CUDA activity is measured: ``cuda::sync`` is
    the host sync, and the ops that asked for a wait or a copy are priced as the launches they are."""
    if op.startswith("input::"):  # where calls ran (INPUT_CALLS), not calls
        return None
    if op == CUDA_SYNC:
        return OpClass.HOST_SYNC
    if op == MEMCPY_HTOD:  # its enqueue is the aten::copy_ that issued it, its wait the cuda::sync beside it
        return OpClass.COMPOSITE
    if op.startswith("vllm::"):  # vLLM's custom-op wrappers: the kernels they run are counted as their own ops
        return OpClass.COMPOSITE
    if op in VIEWS:
        return OpClass.VIEW
    if op in COMPOSITES:
        return OpClass.COMPOSITE
    if op in H2D_COPIES:
        return OpClass.VIEW if on_gpu else OpClass.H2D_COPY  # on a GPU its copy is counted (copy_, cuda::sync)
    if op in HOST_SYNCS:
        return OpClass.KERNEL_LAUNCH if on_gpu else OpClass.HOST_SYNC
    if op in INDEX_WRITES:
        return OpClass.KERNEL_LAUNCH if on_gpu else OpClass.INDEX_WRITE
    return OpClass.KERNEL_LAUNCH


def class_calls(deltas: Mapping[str, int], *, on_gpu: bool = False) -> dict[OpClass, int]:
    """Per priced class, the calls a change added (negative: removed); composites left out."""
    out: Counter[OpClass] = Counter()
    for op, n in deltas.items():
        cls = op_class(op, on_gpu=on_gpu)
        if cls is not None and cls != OpClass.COMPOSITE:
            out[cls] += n
    return {cls: out[cls] for cls in PRICED_CLASSES if out[cls]}


def counted_on_gpu(census: Census) -> bool:
    """A census with CUDA activity in it was counted on a GPU (every vLLM request there copies its
    inputs to the device); a CPU census never has any."""
    return any(op.startswith("cuda::") for fns in census.values() for ops in fns.values() for op in ops)


# ----------------------------------------------------------------------------- the constants
@dataclass(frozen=True)
class CostRow:
    gpu: str
    op_class: OpClass
    us_per_call: float
    status: CostStatus
    source: str


@dataclass(frozen=True)
class CostTable:
    """The constants file, read and checked: each GPU prices every class once."""

    rows: tuple[CostRow, ...]
    path: str = ""

    @property
    def gpus(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.gpu for r in self.rows))

    def row(self, gpu: str, cls: OpClass) -> CostRow:
        return next(r for r in self.rows if r.gpu == gpu and r.op_class == cls)


def _bad(path: str, field: str, problem: str) -> ConfigError:
    return ConfigError(path, None, field, problem, hint=f"the constants file's format is in {COSTS_DOC}")


def _row(d: Any, where: str, path: str) -> CostRow:
    if not isinstance(d, dict) or set(d) != {"gpu", "class", "us_per_call", "status", "source"}:
        raise _bad(path, where, "a row is an object with exactly gpu, class, us_per_call, status and source")
    if not isinstance(d["gpu"], str) or not d["gpu"].strip():
        raise _bad(path, f"{where}.gpu", "not a GPU name")
    if d["class"] not in PRICED_CLASSES:
        raise _bad(path, f"{where}.class", f"{d['class']!r} is not one of {', '.join(PRICED_CLASSES)}")
    us = d["us_per_call"]
    if isinstance(us, bool) or not isinstance(us, (int, float)) or not math.isfinite(us) or us < 0:
        raise _bad(path, f"{where}.us_per_call", f"{us!r} is not a number of microseconds >= 0")
    if d["status"] not in tuple(CostStatus):
        raise _bad(path, f"{where}.status", f"{d['status']!r} is neither 'estimate' nor 'calibrated'")
    if not isinstance(d["source"], str) or not d["source"].strip():
        raise _bad(path, f"{where}.source", "every constant names where it comes from")
    return CostRow(d["gpu"], OpClass(d["class"]), float(us), CostStatus(d["status"]), d["source"])


def parse_costs(data: Any, path: str = "(constants)") -> CostTable:
    """A constants file's content, checked (ConfigError naming the field): the schema header, and
    per GPU a row for every priced class, none twice. ``measured``: what a calibration saw (free form)."""
    if not isinstance(data, dict) or data.get("schema") != COSTS_SCHEMA:
        raise _bad(path, "schema", f"not a {COSTS_SCHEMA} file")
    if data.get("schema_version") != COSTS_SCHEMA_VERSION:
        raise _bad(path, "schema_version", f"version {data.get('schema_version')!r}; this guard reads {COSTS_SCHEMA_VERSION}")
    extra = set(data) - {"schema", "schema_version", "costs", "measured"}
    if extra:
        raise _bad(path, sorted(extra)[0], "not a field of the constants file")
    if not isinstance(data.get("costs"), list) or not data["costs"]:
        raise _bad(path, "costs", "a non-empty list of rows")
    rows = tuple(_row(d, f"costs[{i}]", path) for i, d in enumerate(data["costs"]))
    seen = Counter((r.gpu, r.op_class) for r in rows)
    twice = next((k for k, n in seen.items() if n > 1), None)
    if twice:
        raise _bad(path, "costs", f"{twice[0]} prices {twice[1]} twice")
    for gpu in dict.fromkeys(r.gpu for r in rows):
        missing = [str(c) for c in PRICED_CLASSES if (gpu, c) not in seen]
        if missing:
            raise _bad(path, "costs", f"{gpu} has no constant for {', '.join(missing)}")
    return CostTable(rows, path)


def load_costs(path: Path) -> CostTable:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise _bad(str(path), "(file)", f"cannot read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad(str(path), "(syntax)", f"not JSON: {exc}") from None
    return parse_costs(data, str(path))


@lru_cache(maxsize=1)
def shipped_costs() -> CostTable:
    """guard's own constants (gpu_costs.json), read once."""
    return load_costs(COSTS_FILE)


# ----------------------------------------------------------------------------- pricing
def price(deltas: Mapping[str, int], table: CostTable, *, on_gpu: bool = False) -> tuple[GpuCost, ...]:
    """What a function's change per request (op -> calls, measured - baseline) would cost on each
    GPU of the table, as host time: calls times the constant, per class. No priced calls: none."""
    calls = class_calls(deltas, on_gpu=on_gpu)
    if not calls:
        return ()
    out = []
    for gpu in table.gpus:
        rows = {cls: table.row(gpu, cls) for cls in calls}
        classes = [PricedClass(cls, n, rows[cls].us_per_call, rows[cls].status)
                   for cls, n in calls.items() if rows[cls].us_per_call > 0]
        classes.sort(key=lambda c: (-abs(c.calls * c.us_per_call), PRICED_CLASSES.index(c.op_class)))
        # to a tenth of a microsecond: the constants have that precision, float noise does not belong in a file
        out.append(GpuCost(gpu, round(sum(c.calls * c.us_per_call for c in classes) / 1000.0, 4), tuple(classes)))
    return tuple(out)
