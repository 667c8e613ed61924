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

``WORKLOAD`` names the workload; a budget written for another version is not compared.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from guard.model.environment import SPEED_WORKLOAD, SPEED_WORKLOAD_FLOAT32, SPEED_WORKLOADS
from guard.model.results import Status, TtftCheck, to_ms

# The workloads, named where the record is typed: a budget's reference and a run's reading are in
# the same dtype, since ttft_hardware.cpu_isa binds the budget to CPUs that resolve the engine's dtype alike.
WORKLOAD, WORKLOAD_FLOAT32, WORKLOADS = SPEED_WORKLOAD, SPEED_WORKLOAD_FLOAT32, SPEED_WORKLOADS


def workload_for(engine_dtype: str) -> str:
    return WORKLOAD_FLOAT32 if engine_dtype == "float32" else WORKLOAD
REPEATS = 5  # the median of 5 passes of ~75 ms (after one untimed pass): ~0.45 s per reading


@dataclass(frozen=True)
class SpeedReading:
    """One reading: the median time of ``repeats`` passes of the reference workload."""

    workload: str
    ms: float  # median pass, milliseconds
    spread_pct: float  # (slowest - fastest) / median of the passes, percent
    repeats: int
    threads: int  # torch intra-op threads the passes ran on

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


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
    times = []
    for _ in range(max(1, repeats)):
        t = time.perf_counter()
        one_pass()
        times.append(time.perf_counter() - t)
    median = statistics.median(times)
    return SpeedReading(workload=workload, ms=round(to_ms(median), 2),
                        spread_pct=round((max(times) - min(times)) / median * 100.0, 1),
                        repeats=len(times), threads=torch.get_num_threads())


def combined(before: SpeedReading | None, after: SpeedReading | None) -> dict[str, Any] | None:
    """The run's record (``run.environment.speed_reference``): both readings and their mean, the
    figure the gate judges (a slowdown during the measured requests shows in one or both; where
    the two differ by more than ``unsteady`` allows, the gate judges the slower one)."""
    got = [r for r in (before, after) if r is not None]
    if not got:
        return None
    return {"workload": got[0].workload, "ms": round(sum(r.ms for r in got) / len(got), 2),
            "before": before.as_dict() if before else None, "after": after.as_dict() if after else None}


# ----------------------------------------------------------------------------- the gate (pure)
def slowdown_pct(recorded: Mapping[str, Any] | None, reference_ms: float | None) -> float | None:
    """How much slower (+) or faster (-) this run's machine ran the reference than the budget's, in
    percent; None where either side is missing or they timed different workloads."""
    if not recorded or not reference_ms or recorded.get("workload") not in WORKLOADS or not recorded.get("ms"):
        return None
    return (float(recorded["ms"]) / reference_ms - 1.0) * 100.0


def explained_by(check: TtftCheck, slowdown: float) -> float:
    """The failed check's lowest plausible value (its interval's lower end, else its estimate) with
    the machine's slowdown taken out, ms: at or below the budget, the slowdown explains the failure."""
    low = check.interval_ms[0]
    low = low if math.isfinite(low) else check.measured_ms
    return low / (1.0 + slowdown / 100.0)


def readings_ms(recorded: Mapping[str, Any] | None) -> tuple[float, float] | None:
    """The readings before and after the measured requests, ms; None without both of one workload."""
    before, after = ((recorded or {}).get(side) or {} for side in ("before", "after"))
    if not before.get("ms") or not after.get("ms") or before.get("workload") != after.get("workload"):
        return None
    return float(before["ms"]), float(after["ms"])


def change_pct(recorded: Mapping[str, Any] | None) -> float | None:
    """How much the reading after the measured requests differs from the one before, percent of the
    faster one (+ slower after, - faster after); None without both readings of one workload."""
    pair = readings_ms(recorded)
    if pair is None:
        return None
    b, a = pair
    return (a / b - 1.0) * 100.0 if a >= b else -(b / a - 1.0) * 100.0


def unsteady(recorded: Mapping[str, Any] | None, max_slowdown_pct: float) -> str | None:
    """Why the run is no basis for a TTFT budget: the machine changed speed while it measured. Its
    readings before and after the requests differ by more than twice ``max_slowdown_pct``, so their
    mean, the reference a budget written from the run would carry, is off from the machine's speed at
    one end or the other by more than the drift the gate forgives, and the TTFT samples mix two
    speeds. A budget written from such a run carries the change and fails a clean checkout on the
    same machine (exit 1; the run that showed it: docs/reliability.md, "The machine's speed")."""
    pct = change_pct(recorded)
    if pct is None or abs(pct) <= 2 * max_slowdown_pct:
        return None
    before_ms, after_ms = readings_ms(recorded)
    return (f"the machine changed speed while it measured: guard's speed reference took "
            f"{before_ms:.0f} ms before the measured requests and {after_ms:.0f} ms "
            f"after ({'slower' if pct > 0 else 'faster'} by {abs(pct):.0f} %, more than twice validity.max_slowdown_pct "
            f"{max_slowdown_pct:g}); its TTFT mixes two speeds, so it is no basis for a TTFT budget")


def speed_problems(recorded: Mapping[str, Any] | None, reference_ms: float | None, max_slowdown_pct: float,
                   checks: Sequence[TtftCheck]) -> list[str]:
    """Why the run's TTFT failures say nothing about the code: the machine ran the reference more
    than ``max_slowdown_pct`` slower than the budget's, and that slowdown explains every failure
    (each failed percentile's interval, slowdown taken out, reaches its budget). A failure beyond
    what the slowdown explains stands; passes stand; within the limit is the machine's own drift
    (the reading moves with TTFT's phases, ~4-6 % here) and changes nothing."""
    failed = [c for c in checks if c.status == Status.FAIL]
    pct = slowdown_pct(recorded, reference_ms)
    took = f"{recorded['ms']:.0f} ms" if recorded else ""
    if pct is not None and unsteady(recorded, max_slowdown_pct):
        # The machine changed speed during the requests: those after the change ran at the slower
        # reading's speed, which the mean dilutes: a quota set mid-run reads as a few % slow on the
        # mean while TTFT is far over budget, which would be exit 1 for the machine's fault
        # (measured: docs/reliability.md, "The machine's speed").
        before_ms, after_ms = readings_ms(recorded)
        slowest = max(before_ms, after_ms)
        pct = (slowest / reference_ms - 1.0) * 100.0
        took = (f"{slowest:.0f} ms at the slower of its readings ({before_ms:.0f} before the measured "
                f"requests, {after_ms:.0f} after)")
    if not failed or pct is None or pct <= max_slowdown_pct:
        return []
    if any(explained_by(c, pct) > c.budget_ms for c in failed):
        return []
    worst = max(failed, key=lambda c: c.measured_ms / c.budget_ms)
    return [f"slow machine: guard's speed reference took {took}, {pct:+.1f} % against the "
            f"{reference_ms:.0f} ms measured with the TTFT budget (validity.max_slowdown_pct {max_slowdown_pct:g}), "
            f"and that explains the TTFT over budget (ttft {worst.percentile} {worst.measured_ms:.0f} ms against "
            f"{worst.budget_ms:.0f} ms; {explained_by(worst, pct):.0f} ms with the slowdown taken out). Something "
            "/proc does not show (a VM's host, a CPU quota, power saving) slows this machine, so its TTFT is not "
            "judged: re-run when it is back to speed, or compare against a baseline (A/B)"]


def speed_notice(recorded: Mapping[str, Any] | None, reference_ms: float | None, max_slowdown_pct: float) -> str | None:
    """A machine clearly faster than the budget's (twice the limit): the budget's headroom grows by that much."""
    pct = slowdown_pct(recorded, reference_ms)
    if pct is None or pct >= -2 * max_slowdown_pct:
        return None
    return (f"fast machine: guard's speed reference took {recorded['ms']:.0f} ms, {pct:+.1f} % against the "
            f"{reference_ms:.0f} ms measured with the TTFT budget: a TTFT regression up to that much more "
            "fits in the budget here; re-baseline on this machine with update-thresholds for a tighter one")
