"""How fast this machine runs a fixed reference workload, against the machine a TTFT budget was
measured on.

The contention gate (guard.measure.contention) sees other processes in /proc. It cannot see a slowdown
from outside the process table: a VM's host giving its cores less (a clean run's p50 can sit
23 % over its usual value for an hour with /proc quiet and steal 0), a container's CPU quota, a
laptop on battery. The engine then spends more CPU time on the same work, and an absolute TTFT budget
fails a clean checkout. Such a slowdown also slows other code run on the same cores at the same
time, so guard times a small fixed workload of the engine's kind of work (bf16 matrix products,
attention, a convolution, norms, fresh allocations; nothing of vLLM's or the model's, so no pull
request can change it) right before and right after the measured requests. Measured: under a CPU
quota the reference moved as TTFT did; in the machine's own phases it moved about twice as much.
``update-thresholds`` writes its time next to the TTFT budget (``budgets.ttft_hardware.
speed_reference_ms``). A run that fails a TTFT budget on a machine that ran the reference more
than ``validity.max_slowdown_pct`` slower, by enough to explain the failure, measured a slow
machine, not slow code: invalid (exit 3), never 1. Passes stand, and so does a failure beyond what
the slowdown explains (a 2x regression on a 10 % slow machine is still a regression).

The measurements behind these choices (``benchmarks/speed_reference.py``: the quiet spread, and
the reference against TTFT under a CPU quota that /proc does not report as contention) are in
docs/reliability.md, "The machine's speed: guard's speed reference".

``WORKLOAD`` names the workload; a budget written for another version is not compared. The gate
that judges a reading (``speed_problems``, ``unsteady``) is guard.judge.gates'.
"""

from __future__ import annotations

import math
import statistics
import time

from guard.model.environment import SPEED_WORKLOAD, SPEED_WORKLOAD_FLOAT32, SPEED_WORKLOADS, SpeedReading
from guard.model.records import to_ms

# The workloads, named where the record is typed: a budget's reference and a run's reading are in
# the same dtype, since ttft_hardware.cpu_isa binds the budget to CPUs that resolve the engine's dtype alike.
WORKLOAD, WORKLOAD_FLOAT32, WORKLOADS = SPEED_WORKLOAD, SPEED_WORKLOAD_FLOAT32, SPEED_WORKLOADS


def workload_for(engine_dtype: str) -> str:
    return WORKLOAD_FLOAT32 if engine_dtype == "float32" else WORKLOAD
REPEATS = 5  # the median of 5 timed blocks (after one untimed pass)
# Each timed block runs passes back to back for at least this long. A CPU quota throttles a process
# once per scheduler period (CFS: 100 ms) after it spent its share: a pass shorter than that (18 ms
# on an AMX Xeon) mostly ran unthrottled and the median of single passes hid a 1.3-core quota that
# slowed TTFT by 59 %; a block of several periods pays its share of every throttled stretch.
MIN_BLOCK_S = 0.3


def _workload(workload: str):
    """The tensors and the pass, built once per reading (seeded: every machine runs the same numbers)."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    bf = torch.float32 if workload == WORKLOAD_FLOAT32 else torch.bfloat16
    tokens = torch.randn(512, 896, generator=g).to(bf)  # the encoder's S=512 x hidden 896
    w_in = (torch.randn(896, 2432, generator=g) * 0.03).to(bf)
    w_out = (torch.randn(2432, 896, generator=g) * 0.03).to(bf)
    heads = torch.randn(1, 14, 512, 64, generator=g).to(bf)
    image = torch.randn(1, 3, 256, 256, generator=g)
    kernel = torch.randn(64, 3, 16, 16, generator=g) * 0.05

    def one_pass() -> None:
        with torch.inference_mode():
            for _ in range(4):
                h = F.layer_norm(tokens, (896,))
                h = F.gelu(h @ w_in) @ w_out  # fresh outputs every time: allocation is part of the work
                F.scaled_dot_product_attention(heads, heads, heads)
            F.conv2d(image, kernel, stride=16)

    return torch, one_pass


def measure(repeats: int = REPEATS, workload: str = WORKLOAD) -> SpeedReading:
    """Time the reference workload on this process's torch threads (one untimed pass first)."""
    torch, one_pass = _workload(workload)
    one_pass()
    t = time.perf_counter()
    one_pass()
    per_block = max(1, math.ceil(MIN_BLOCK_S / max(time.perf_counter() - t, 1e-6)))
    times = []
    for _ in range(max(1, repeats)):
        t = time.perf_counter()
        for _ in range(per_block):
            one_pass()
        times.append((time.perf_counter() - t) / per_block)
    median = statistics.median(times)
    return SpeedReading(workload=workload, ms=round(to_ms(median), 2),
                        spread_pct=round((max(times) - min(times)) / median * 100.0, 1),
                        repeats=len(times), threads=torch.get_num_threads())
