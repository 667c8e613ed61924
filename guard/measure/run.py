"""The run stage: one engine, the timing pass and the profile pass, recorded into a RunRecord.

Used by the pytest suite (tests/perf) through the plugin's ``guard_run`` fixture, and directly
by ``guard selftest``. Progress goes to the ``progress`` callback: runs take minutes.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import Callable
from pathlib import Path

from guard import format as fmt
from guard import speedref
from guard.budgets import Profile, Thresholds
from guard.contention import ContentionSampler, contention_problems
from guard.census import QualnameResolver, count_functions, size_key
from guard.measure.inprocess import EngineDied, Job, plan_jobs, run_jobs, start_engine
from guard.errors import InvalidRunError
from guard.evaluate import op_checks
from guard.hardware import Hardware, fingerprint
from guard.probes import attribute, profile_request, save_events, save_trace, scope_events
from guard.results import RequestOutcome, RunRecord, ScopeCounts, Status
from guard.rules import TtftDecision, measure_until_decided
from guard.speedref import SpeedReading


TRACES_ON_FAILURE, TRACES_ALWAYS = "on-failure", "always"
UNFINISHED_PREFIX = "the run did not finish: the last checkpoint was written after"

# Runs a list of jobs, calling back per finished request; raises EngineDied when the engine breaks.
Driver = Callable[[list[Job], Callable[[RequestOutcome], None]], list[RequestOutcome]]


class GuardRun:
    """``driver``: what sends the requests; by default the in-process vLLM engine (started lazily).
    ``environment``: the fingerprint to record; by default this machine's."""

    def __init__(self, thresholds: Thresholds, profile: Profile, hw: Hardware, output: Path,
                 progress: Callable[[str], None] = print, injected: str | None = None,
                 traces: str = TRACES_ON_FAILURE, driver: Driver | None = None,
                 environment: dict | None = None, server_url: str | None = None,
                 contention: ContentionSampler | None = None,
                 speed_reader: Callable[..., SpeedReading | None] | None = None) -> None:
        self.thresholds, self.profile, self.output = thresholds, profile, output
        self.server_url = server_url.rstrip("/") if server_url else None
        # what the rest of the machine does during the timing pass (guard.contention)
        self.contention = contention if contention is not None else ContentionSampler()
        # how fast the machine runs a fixed workload around the timing pass (guard.speedref)
        self.speed_reader = speed_reader or speedref.measure
        self.traces = traces
        self.progress = progress
        self.driver: Driver = driver or (lambda jobs, on_outcome: run_jobs(self.llm, profile.workload, jobs, on_outcome))
        self.record = RunRecord(
            profile=profile.name, thresholds_path=str(thresholds.path), model=thresholds.model,
            environment=fingerprint(hw, profile) if environment is None else environment, injected=injected,
            started_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        )
        self.record.environment["engine_mode"] = self.mode
        self._t0 = time.perf_counter()
        self._llm = None
        self._server = None  # guard.measure.server.VllmServer in server mode (None with --server-url)
        self._served_model: str | None = None
        self._next_index = 0
        self._warm_sizes: set[tuple[int, int]] = set()
        self._resolver = QualnameResolver()

    # -------------------------------------------------------------- engine
    @property
    def mode(self) -> str:
        return "server" if self.server_url else self.profile.engine.mode

    def _ensure_server(self) -> str:
        """The server's base URL: the given one, or a `vllm serve` started now."""
        from guard.measure import server as srv

        if self._served_model is not None:
            return self.server_url or self._server.url
        info = self.record.environment.setdefault("server", {})
        name, _ = srv.request_function()
        info["request_function"] = name
        if self.server_url:
            self.progress(f"measuring the running server at {self.server_url} (TTFT only)")
            info.update(managed=False, url=self.server_url)
            self._served_model = srv.served_model(self.server_url)
            info["served_model"] = self._served_model
            return self.server_url
        e = self.profile.engine
        self._server = srv.VllmServer(e, self.profile.workload.seed, self.output / srv.SERVER_LOG)
        info.update(managed=True, command=self._server.command, log=srv.SERVER_LOG)
        t = time.perf_counter()
        try:
            self._server.start(self.progress)
        except InvalidRunError as exc:
            self.record.invalid_reasons.append(str(exc))
            raise
        self._served_model = srv.SERVED_MODEL_NAME
        self.progress(f"vllm serve healthy in {time.perf_counter() - t:.1f} s")
        return self._server.url

    def stop_server(self) -> None:
        if self._server is not None and "exit_status" not in self.record.environment["server"]:
            code = self._server.stop()
            self.record.environment["server"]["exit_status"] = code
            self.progress(f"vllm serve stopped (status {code})")

    @property
    def llm(self):
        if self._llm is None:
            e = self.profile.engine
            self.progress(f"starting vLLM engine: {e.model} ({e.dtype}, load_format={e.load_format}) ...")
            t = time.perf_counter()
            try:
                self._llm = start_engine(e, seed=self.profile.workload.seed)
            except InvalidRunError as exc:
                self.record.invalid_reasons.append(str(exc))
                raise
            self.progress(f"engine ready in {time.perf_counter() - t:.1f} s")
        return self._llm

    def _jobs(self, count: int, warmup: bool, sizes=None) -> list[Job]:
        jobs = plan_jobs(self.profile.workload, self._next_index, count, warmup, sizes)
        self._next_index += count
        return jobs

    def _run(self, jobs: list[Job], label: str, in_process: bool = False) -> list[RequestOutcome]:
        total = len(jobs)
        done = 0

        def report(o: RequestOutcome) -> None:
            nonlocal done
            done += 1
            size = fmt.size(o.image_size)
            if o.success:
                eng = f", engine {fmt.seconds_as_ms(o.ttft_engine_s)}" if o.ttft_engine_s else ""
                self.progress(f"{label} {done}/{total} [{size}] TTFT {fmt.seconds_as_ms(o.ttft_client_s)}{eng}")
            else:
                self.progress(f"{label} {done}/{total} [{size}] FAILED: {o.error}")

        if self.mode == "server" and not in_process:
            return self._run_server(jobs, label, report)
        try:
            outcomes = self.driver(jobs, report)
        except EngineDied as exc:
            self.record.invalid_reasons.append(f"engine died during {label}: {exc}")
            raise InvalidRunError(f"engine died during {label}: {exc}") from exc
        self.record.outcomes.extend(outcomes)
        for o in outcomes:
            self._warm_sizes.add(o.image_size)
        if label != "profiled":  # not inside the profiler: the write would be in the profiled request
            self.checkpoint(label)
        return outcomes

    def _run_server(self, jobs: list[Job], label: str, report) -> list[RequestOutcome]:
        from guard.measure.server import run_jobs_http

        url = self._ensure_server()
        outcomes = run_jobs_http(url, self._served_model, self.profile.workload, jobs, on_outcome=report)
        self.record.outcomes.extend(outcomes)
        server = self._server
        if server is not None and not server.alive():
            exc = server.fail(f"vllm serve died during {label} (exit status {server.proc.returncode})")
            self.record.invalid_reasons.append(str(exc))
            raise exc
        failed = [o for o in outcomes if not o.success]
        if failed and server is not None:  # the log says why (5xx, engine errors)
            self.record.invalid_reasons.append(
                f"{len(failed)} request(s) failed during {label}; last lines of {server.log_path}:\n{server.tail()}")
        return outcomes
    def checkpoint(self, after: str, op_counts: list[ScopeCounts] | None = None) -> None:
        """Write run.json as it stands, marked unfinished: if this process is killed (SIGKILL, OOM),
        `guard check` still reports what was measured, as an invalid run. The session's final
        run.json replaces it."""
        from dataclasses import replace

        from guard.results import run_file_dict, write_json_atomic

        snapshot = replace(self.record, op_counts=[*self.record.op_counts, *(op_counts or [])],
                           invalid_reasons=[*self.record.invalid_reasons, f"{UNFINISHED_PREFIX} {after}"],
                           duration_s=round(time.perf_counter() - self._t0, 3))
        try:
            write_json_atomic(self.output / "run.json", run_file_dict(snapshot))
        except OSError as exc:  # a full disk must not stop the measurement; the final write will report it
            self.progress(f"could not write the run.json checkpoint: {exc}")

    # -------------------------------------------------------------- timing pass
    def warm_up(self) -> None:
        n = self.profile.workload.warmup_requests
        if n:
            self._run(self._jobs(n, warmup=True), "warm-up")

    def measure(self, count: int) -> list[float]:
        """One round of measured requests; returns their TTFT samples (seconds)."""
        self.record.rounds += 1
        outcomes = self._run(self._jobs(count, warmup=False), f"round {self.record.rounds}")
        return [o.ttft_client_s for o in outcomes if o.success and o.ttft_client_s is not None]

    def measure_until_decided(self) -> None:
        """The workload's measured requests, then more batches while a budgeted TTFT percentile's
        interval straddles its budget (guard.rules: the verdict's own rule, so the two agree)."""
        from guard.hardware import GpuStateSampler, read_gpu_state  # this method's concern only

        stats = self.profile.statistics

        def say_undecided(pending: list[TtftDecision], extra: int) -> None:
            self.progress(f"inconclusive after {len(self.record.measured)} requests: "
                          + "; ".join(d.describe() for d in pending)
                          + f"; measuring {extra} more (round {self.record.rounds + 1}, cap {stats.max_requests})")

        env = self.record.environment
        # Budgets measured on another CPU are shown, not judged: more requests would decide nothing.
        budgets = self.profile.ttft_ms if (env.get("ttft_hardware_match") or {}).get("ok", True) else {}
        limit = self.profile.validity.max_other_cpu_pct

        def keep_going() -> bool:
            if not all(o.success for o in self.record.measured):
                return False  # a failed request makes the run invalid: stop measuring
            so_far = self.contention.peek()
            # over the limit: the run is invalid already, and more requests on a busy machine would not fix it
            return so_far is None or not contention_problems(so_far.as_dict(), limit)

        gpu_state = env.get("gpu_state")
        # NVML while the requests run (throttling shows under load, not on an idle GPU), on a GPU only
        sampler = GpuStateSampler() if gpu_state is not None else contextlib.nullcontext()
        before = self._speed_reading()
        self.contention.start()
        with sampler:
            measure_until_decided(budgets, stats, self.profile.workload.requests, self.measure,
                                  on_undecided=say_undecided, keep_going=keep_going)
        reading = self.contention.stop()
        env["cpu_contention"] = reading.as_dict() if reading else None
        if reading:
            self.progress(f"CPU during measurement: {fmt.contention(reading)}")
        if gpu_state is not None:  # the end of the timing pass, while the engine holds the device
            gpu_state["during"] = sampler.snapshots
            gpu_state["end"] = read_gpu_state()
        speed = speedref.combined(before, self._speed_reading())
        if speed is not None:
            env["speed_reference"] = speed
            self.progress(f"speed reference: {fmt.speed_reference(speed, self.profile.speed_reference_ms)}")

    def _speed_reading(self) -> SpeedReading | None:
        """A reading of guard's speed reference in the engine's own process (its threads, bound to
        cores by vLLM), between requests. In-process mode on a CPU profile only: on a GPU TTFT is
        the device's, and in server mode the engine is another process, whose threads guard's
        reading would not run on (unbound, it reads ~12 % slower here). In the engine's dtype:
        float32 where the engine runs it for want of native bf16 (speedref.WORKLOAD_FLOAT32)."""
        if self.profile.match.cuda or self.mode != "in-process":
            return None
        try:
            return self.speed_reader(workload=speedref.workload_for(self.profile.engine.dtype))
        except Exception as exc:  # noqa: BLE001 - a reading is evidence, not a requirement
            self.progress(f"speed reference not measured: {exc}")
            return None

    # -------------------------------------------------------------- profile pass
    def profile_ops(self, label: str = "") -> list[ScopeCounts]:
        """One profiled request per profile image size, in steady state; counts per scope."""
        found: list[ScopeCounts] = []
        if self.server_url:
            return found  # no frames of a remote server: op budgets are reported "not measured"
        if self._server is not None:  # server mode: counts come from an in-process engine (docs/server-mode.md)
            self.stop_server()
            self.progress("op counts: the in-process profile pass, as in in-process mode (docs/server-mode.md: why not "
                          "vLLM's profiler endpoints)")
        sizes = self.profile.workload.profile_image_sizes
        for size in sizes:
            if size not in self._warm_sizes:  # first request of a size fills its caches
                self._run(self._jobs(1, warmup=True, sizes=[size]), f"profile warm-up {fmt.size(size)}", in_process=True)
            jobs = self._jobs(1, warmup=True, sizes=[size])  # profiled requests are not TTFT samples
            self.output.mkdir(parents=True, exist_ok=True)
            self.progress(f"profiling one {fmt.size(size)} request{label and ' (' + label.strip('-') + ')'} ...")
            events, prof = profile_request(lambda: self._run(jobs, "profiled", in_process=True))
            # Keep the events that touch the budgeted code paths: small, and enough to re-attribute.
            save_events(scope_events(events, self.profile.ops), self.output / f"events{label}-{fmt.size(size)}.json.gz")
            counts = attribute(events, self.profile.ops, size)
            if self.profile.census is not None:
                self.take_census(events, size)
            # The full trace costs seconds to write; it is there to explain a failure.
            if self.traces == TRACES_ALWAYS or any(c.status == Status.FAIL for c in op_checks(self.profile, counts)):
                name = f"trace{label}-{fmt.size(size)}.json.gz"
                save_trace(prof, self.output / name)
                self.record.traces.append(name)
            del prof
            for c in counts:
                ops = ", ".join(f"{op} {n}" for op, n in list(c.calls_by_op.items())[:4]) or "none"
                self.progress(f"  scope {c.scope} [{fmt.size(size)}]: entered {c.entries}x, "
                              f"{fmt.calls(c.total_calls)} ({ops})")
            found.extend(counts)
            self.checkpoint(f"profiling {size[0]}x{size[1]}", found)
        return found

    def take_census(self, events, size: tuple[int, int]) -> None:
        """The per-function operator census of one profiled request, into the record."""
        rule = self.profile.census
        t = time.perf_counter()
        census = count_functions(events, rule.roots, self._resolver)
        self.record.census_s = round(self.record.census_s + time.perf_counter() - t, 3)
        self.record.census[size_key(size)] = census
        calls = sum(n for ops in census.values() for n in ops.values())
        self.progress(f"  census [{size[0]}x{size[1]}]: {len(census)} functions under {', '.join(rule.roots)}, "
                      f"{calls} op calls ({time.perf_counter() - t:.2f} s)")

    def finish(self) -> RunRecord:
        self.stop_server()
        self.record.duration_s = round(time.perf_counter() - self._t0, 3)
        return self.record
