"""How much of the CPU the rest of the machine took while guard measured TTFT.

A TTFT measured while other processes compete for the cores is a statement about the neighbours,
not the code. The sampler takes two snapshots of ``/proc`` around the measured requests (start,
stop) and the reading says, in cores, what the machine did in between:

- ``other_cores``: busy CPU time of the whole machine (``/proc/stat``: user, nice, system, irq,
  softirq) minus the busy time of this process tree (``/proc/<pid>/stat`` utime + stime, plus
  cutime + cstime for children that exited and were reaped), averaged over the window;
- ``steal_cores``: time the hypervisor ran someone else while this VM wanted the CPU (``steal``);
- the 1-minute load average at both ends (it counts our own runnable threads too, so it is
  recorded, not judged) and, where readable, the mean CPU frequency (``scaling_cur_freq``, else
  ``/proc/cpuinfo`` "cpu MHz"; in a VM this is often the nominal figure, so it is recorded only).

Everything but the sampler is a pure function over recorded text, tested on a real ``/proc``
capture (tests/fixtures/proc/). ``guard.judge.gates`` judges the reading (``busy``)
against the profile's ``validity.max_other_cpu_pct``; the reading itself goes into results.json
under ``run.environment.cpu_contention``.

Reusable by any runner (A/B included)::

    sampler = ContentionSampler()      # this process and its children are "us"
    sampler.start()
    ...                                # the measured requests
    reading = sampler.stop()           # ContentionReading, or None where /proc is unreadable
    over = reading.over(max_other_cpu_pct)  # the rest of the machine took more than the limit
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from guard.model.environment import ContentionReading  # the reading, typed where the record is

# /proc/stat "cpu" line: user nice system idle iowait irq softirq steal guest guest_nice.
# guest and guest_nice are already counted in user and nice, so they are not added again.
_BUSY_FIELDS = (0, 1, 2, 5, 6)  # user, nice, system, irq, softirq
_IDLE, _IOWAIT, _STEAL = 3, 4, 7


@dataclass(frozen=True)
class CpuTimes:
    """The machine's aggregate CPU time, in clock ticks (USER_HZ), from /proc/stat's "cpu" line."""

    busy: int
    idle: int  # idle + iowait
    steal: int
    cpus: int  # the number of "cpuN" lines: online CPUs

    @property
    def total(self) -> int:
        return self.busy + self.idle + self.steal


@dataclass(frozen=True)
class ProcTimes:
    """One process from /proc/<pid>/stat: its parent and its CPU time in clock ticks."""

    pid: int
    ppid: int
    own: int  # utime + stime: all its threads
    reaped_children: int  # cutime + cstime: children it has waited for
    state: str = ""  # field 3: R running, S sleeping, T stopped, ...


@dataclass(frozen=True)
class Snapshot:
    """Everything one look at /proc gives: taken at ``start()`` and ``stop()``."""

    wall_s: float  # time.monotonic()
    cpu: CpuTimes
    tree_ticks: int  # this process tree's CPU time (own + reaped children), clock ticks
    tree_pids: tuple[int, ...]
    load_1m: float | None
    mhz: float | None  # mean over CPUs; None when not readable


# ----------------------------------------------------------------------------- parsers (pure)
def parse_proc_stat(text: str) -> CpuTimes:
    """/proc/stat -> the aggregate "cpu" line. Missing trailing fields (old kernels) read as 0."""
    agg: list[int] | None = None
    cpus = 0
    for line in text.splitlines():
        if line.startswith("cpu "):
            agg = [int(x) for x in line.split()[1:]]
        elif re.match(r"cpu\d+\s", line):
            cpus += 1
    if agg is None:
        raise ValueError("/proc/stat has no aggregate 'cpu' line")
    agg += [0] * (10 - len(agg))
    return CpuTimes(busy=sum(agg[i] for i in _BUSY_FIELDS), idle=agg[_IDLE] + agg[_IOWAIT], steal=agg[_STEAL],
                    cpus=cpus or 1)


def parse_pid_stat(text: str) -> ProcTimes:
    """/proc/<pid>/stat -> pid, ppid and CPU ticks. The command name (field 2) may hold spaces and
    parentheses, so fields are counted from the last ')'."""
    head, _, tail = text.rpartition(")")
    if not head:
        raise ValueError(f"not a /proc/<pid>/stat line: {text[:60]!r}")
    pid = int(head.split("(", 1)[0])
    f = tail.split()  # f[0] is field 3 (state)
    utime, stime, cutime, cstime = (int(x) for x in f[11:15])  # fields 14-17
    return ProcTimes(pid=pid, ppid=int(f[1]), own=utime + stime, reaped_children=cutime + cstime, state=f[0])


def tree_of(root: int, procs: Iterable[ProcTimes]) -> list[ProcTimes]:
    """``root`` and all its live descendants."""
    procs = list(procs)
    children: dict[int, list[ProcTimes]] = {}
    for p in procs:
        children.setdefault(p.ppid, []).append(p)
    out = [p for p in procs if p.pid == root]
    i = 0
    while i < len(out):
        out += children.get(out[i].pid, [])
        i += 1
    return out


def tree_ticks(tree: Iterable[ProcTimes]) -> int:
    """CPU time of a process tree: every live member's own time, plus what each has collected from
    children that exited and were reaped (so a helper process that came and went still counts)."""
    return sum(p.own + p.reaped_children for p in tree)


def parse_loadavg(text: str) -> float | None:
    try:
        return float(text.split()[0])
    except (IndexError, ValueError):
        return None


def parse_cpuinfo_mhz(text: str) -> float | None:
    """Mean "cpu MHz" over the processors in /proc/cpuinfo (x86); None when absent."""
    values = [float(m) for m in re.findall(r"^cpu MHz\s*:\s*([\d.]+)", text, flags=re.M)]
    return sum(values) / len(values) if values else None


def mean_khz_as_mhz(values_khz: Iterable[str]) -> float | None:
    """scaling_cur_freq files (kHz) -> mean MHz."""
    vals = []
    for v in values_khz:
        try:
            vals.append(int(v.strip()) / 1000.0)
        except ValueError:
            continue
    return sum(vals) / len(vals) if vals else None


def reading(start: Snapshot, end: Snapshot) -> ContentionReading | None:
    """The contention between two snapshots. Machine-wide ticks come from the scheduler tick and
    per-process ticks from precise accounting, so small negative differences are rounded to 0.
    Cores are scaled by the machine's own elapsed ticks (busy + idle + steal over all CPUs), which
    is the wall time times the CPU count without depending on two clocks agreeing. None when no
    tick elapsed between the two."""
    d_total = end.cpu.total - start.cpu.total
    window_s = max(end.wall_s - start.wall_s, 0.0)
    cpus = end.cpu.cpus
    if d_total <= 0:  # no clock tick elapsed: nothing to say
        return None
    per_core = d_total / cpus  # ticks one core had in the window
    d_busy = end.cpu.busy - start.cpu.busy
    d_own = max(end.tree_ticks - start.tree_ticks, 0)
    d_steal = end.cpu.steal - start.cpu.steal
    return ContentionReading(
        window_s=round(window_s, 3),
        cpus=cpus,
        other_cores=round(max(d_busy - d_own, 0) / per_core, 4),
        steal_cores=round(max(d_steal, 0) / per_core, 4),
        own_cores=round(d_own / per_core, 4),
        load_1m_start=start.load_1m,
        load_1m_end=end.load_1m,
        mhz_start=None if start.mhz is None else round(start.mhz, 1),
        mhz_end=None if end.mhz is None else round(end.mhz, 1),
        tree_processes=len(end.tree_pids),
    )


# ----------------------------------------------------------------------------- the sampler (reads /proc)
def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:  # a process that exited between listing and reading, or no such file
        return None


class ContentionSampler:
    """``start()`` before the measured requests, ``stop()`` after them -> ContentionReading.

    ``root``: the process whose tree is "us" (default: this process; the vLLM engine runs in it).
    ``proc`` / ``sys``: the file systems to read (tests point them at recorded copies).
    Reusable: each start()/stop() pair is one reading. A machine without /proc (not Linux) gives
    ``None`` from ``stop()``, so a caller records "not measured" rather than failing the run.
    """

    def __init__(self, root: int | None = None, proc: Path = Path("/proc"), sys: Path = Path("/sys")) -> None:
        self.root = os.getpid() if root is None else root
        self.proc, self.sys = Path(proc), Path(sys)
        self._start: Snapshot | None = None

    @staticmethod
    def available(proc: Path = Path("/proc")) -> bool:
        return (Path(proc) / "stat").is_file()

    def snapshot(self) -> Snapshot | None:
        stat = _read(self.proc / "stat")
        if stat is None:
            return None
        procs = []
        for entry in self.proc.iterdir():
            if entry.name.isdigit():
                text = _read(entry / "stat")
                if text:
                    try:
                        procs.append(parse_pid_stat(text))
                    except (ValueError, IndexError):
                        continue
        tree = tree_of(self.root, procs)
        load = _read(self.proc / "loadavg")
        freqs = [t for p in sorted(self.sys.glob("devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq"))
                 if (t := _read(p)) is not None]
        mhz = mean_khz_as_mhz(freqs)
        if mhz is None:
            cpuinfo = _read(self.proc / "cpuinfo")
            mhz = parse_cpuinfo_mhz(cpuinfo) if cpuinfo else None
        return Snapshot(wall_s=time.monotonic(), cpu=parse_proc_stat(stat), tree_ticks=tree_ticks(tree),
                        tree_pids=tuple(p.pid for p in tree), load_1m=parse_loadavg(load) if load else None, mhz=mhz)

    def start(self) -> None:
        self._start = self.snapshot()

    def peek(self) -> ContentionReading | None:
        """The reading so far; the window stays open."""
        end = self.snapshot()
        if self._start is None or end is None:
            return None
        return reading(self._start, end)

    def stop(self) -> ContentionReading | None:
        out = self.peek()
        self._start = None
        return out
