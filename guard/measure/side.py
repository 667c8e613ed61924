"""The engine-side interface: what the run stage needs from one vLLM engine, wherever it runs.

As vLLM's ``EngineClient`` has an in-process and a process/HTTP implementation with everything
above it written once, guard's run stage (guard/measure/run.py) drives an ``EngineSide``:
- ``guard.measure.inprocess.InProcessSide``: the engine in this process (the profiler sees its frames);
- ``guard.measure.server.ServerSide``: a ``vllm serve`` guard starts, or one already running;
- ``guard.measure.worker.WorkerSide``: an in-process side in a worker process (one side of A/B).

A side only drives its engine; planning, warm-up, the decision rules, checkpoints and the record
are the run stage's. Light on purpose: a baseline worker imports this beside a foreign vLLM.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from guard.config.budgets import RequestMix, Workload
    from guard.model.readings import DecodeCensus
    from guard.model.records import RequestOutcome, ScopeCounts
    from guard.model.environment import SpeedReading

OnOutcome = Callable[["RequestOutcome"], None]


@dataclass(frozen=True)
class Job:
    index: int
    image_size: tuple[int, int]
    warmup: bool
    # a request mix of the profile pass (its sampling and output length); None: the workload's
    # greedy request with its image and max_tokens
    mix: RequestMix | None = None

    def message(self) -> list[Any]:
        """The job as an A/B worker is told it (guard.measure.worker): the mix with every parameter."""
        return [self.index, list(self.image_size), self.warmup, self.mix and self.mix.message()]

    @classmethod
    def of_message(cls, index: int, size: list[int], warmup: bool, mix: dict[str, Any] | None = None) -> Job:
        from guard.config.budgets import RequestMix

        return cls(int(index), (int(size[0]), int(size[1])), bool(warmup), RequestMix.of_message(mix))


def plan_jobs(workload: Workload, start: int, count: int, warmup: bool,
              sizes: tuple[tuple[int, int], ...] | None = None) -> list[Job]:
    """Requests cycle through ``sizes`` (default: the workload's image sizes); indices stay
    unique across rounds, so every request gets its own image."""
    sizes = sizes or workload.image_sizes
    return [Job(i, sizes[i % len(sizes)], warmup) for i in range(start, start + count)]


class EngineDied(Exception):
    """The engine broke: nothing after it can be trusted. A side raises it with the invalid-run
    reason as its message (its wording is the side's: which process, which log)."""

    def __init__(self, reason: str, hint: str | None = None) -> None:
        super().__init__(reason)
        self.hint = hint


@dataclass(frozen=True)
class SideInfo:
    """What a started side says about itself."""

    init_s: float  # engine start, seconds
    versions: dict[str, Any] = field(default_factory=dict)  # a worker's own environment (guard.measure.worker.versions)
    cache_key: str | None = None  # the environment's op-count cache key (guard.measure.opcache), when asked for
    cache_key_covers: str = ""


@dataclass(frozen=True)
class ProfileFiles:
    """Where a profiled request's files go: the budgeted scopes' events always, the full trace when
    ``traces_always`` or an op budget fails (it costs seconds to write and explains a failure)."""

    folder: Path
    label: str = ""  # in the file names: events{label}-WxH.json.gz
    traces_always: bool = False


@dataclass
class ProfiledRequest:
    """One profiled request: its outcomes (not TTFT samples), its op counts per budgeted scope,
    its operator census (when the profile has a census rule) and the trace file kept, if any."""

    outcomes: list[RequestOutcome]
    counts: list[ScopeCounts]
    census: dict[str, dict[str, int]] | None = None
    census_s: float = 0.0  # the census's own cost
    trace: str | None = None  # file name under ProfileFiles.folder
    decode: DecodeCensus | None = None  # a mix's request: its decode steps' census


class EngineSide(Protocol):
    """One engine the run stage drives. ``run`` and ``count_ops`` raise ``EngineDied``; requests that
    fail one by one come back as unsuccessful outcomes."""

    environment: dict[str, Any]  # what the side adds to its record's environment, filled as it goes

    def launch(self) -> None:
        """Begin starting without waiting (a worker spawns its process here, in the calling thread);
        a no-op where starting spawns nothing. ``start`` launches first if need be."""
        ...

    def start(self) -> SideInfo: ...

    def environment_key(self) -> SideInfo | None:
        """What ``start`` says about the side's environment (versions, op-count cache key), without
        starting its engine; None where only a start can tell."""
        return None

    def run(self, jobs: list[Job], label: str, on_outcome: OnOutcome) -> list[RequestOutcome]: ...

    def failed_requests_context(self, label: str, failed: int) -> str | None:
        """An invalid-run reason that explains failed requests from the side's own log, if it has one."""
        ...

    def op_count_side(self) -> EngineSide | None:
        """The side whose engine the profile pass runs on: this one, or (server mode) an in-process
        engine started after the server stopped, or None where no frames can be seen."""
        ...

    def count_ops(self, job: Job, on_outcome: OnOutcome, files: ProfileFiles | None) -> ProfiledRequest:
        """One request under the profiler: its op counts per budgeted scope and its census."""
        ...

    def speed_reading(self) -> SpeedReading | None:
        """guard's speed reference measured in the engine's own process, where that means something."""
        ...

    def process_ids(self) -> frozenset[int]:
        """The processes the engine runs in besides guard's own (GPU ownership); empty: guard's."""
        ...

    def pause(self) -> None:
        """Stop the engine from using the machine while the other side is timed; a no-op where meaningless."""
        ...

    def resume(self) -> None: ...

    def kill(self) -> None:
        """End the engine now (mid start, once the other side failed); a no-op in process."""
        ...

    def close(self) -> None: ...
