"""guard.measure.contention on recorded /proc text: the parsers, the tree walk, the reading and the gate.

tests/fixtures/proc/busy-child-and-other/ is a real capture on this project's 2-core VM, trimmed
to the processes that matter (README.txt): a root process with a busy child (ours) and a sleeping
grandchild, and one unrelated busy loop re-parented away from our tree, 3 s apart. The machine was
shared with other sessions, so "other" holds the loop plus their work.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from guard.model.environment import busy
from guard.model import format as fmt
from guard.measure.contention import (
    ContentionReading,
    ContentionSampler,
    Snapshot,
    mean_khz_as_mhz,
    parse_cpuinfo_mhz,
    parse_loadavg,
    parse_pid_stat,
    parse_proc_stat,
    reading,
    tree_of,
    tree_ticks,
)

CAPTURE = Path(__file__).parent / "fixtures" / "proc" / "busy-child-and-other"


def capture_info() -> dict[str, int]:
    first = (CAPTURE / "README.txt").read_text().split("\n", 1)[0]
    return {k: int(v.rstrip("s")) for k, v in (kv.split("=") for kv in first.split())}


# ----------------------------------------------------------------------------- parsers
def test_proc_stat_busy_excludes_idle_iowait_steal_and_guest():
    text = "cpu  100 5 20 1000 7 3 2 11 40 1\ncpu0 50 0 10 500 3 1 1 5 20 0\ncpu1 50 5 10 500 4 2 1 6 20 1\nintr 1 2\n"
    t = parse_proc_stat(text)
    assert t.busy == 100 + 5 + 20 + 3 + 2  # guest (40) and guest_nice (1) are already in user / nice
    assert t.idle == 1000 + 7 and t.steal == 11 and t.cpus == 2
    assert t.total == t.busy + t.idle + t.steal


def test_proc_stat_without_aggregate_line_is_an_error():
    with pytest.raises(ValueError):
        parse_proc_stat("intr 1 2\n")


def test_pid_stat_with_spaces_and_parentheses_in_the_name():
    fields = ["S", "77"] + ["0"] * 9 + ["120", "30", "400", "50"] + ["0"] * 30
    p = parse_pid_stat(f"4242 (vllm (worker) 1) {' '.join(fields)}")
    assert (p.pid, p.ppid, p.own, p.reaped_children, p.state) == (4242, 77, 150, 450, "S")


def test_tree_walk_follows_grandchildren_and_skips_strangers():
    procs = [parse_pid_stat((CAPTURE / "end" / d.name / "stat").read_text())
             for d in (CAPTURE / "end").iterdir() if d.name.isdigit()]
    info = capture_info()
    tree = {p.pid for p in tree_of(info["root"], procs)}
    assert info["busy_child"] in tree and info["root"] in tree
    assert info["other_busy_loop"] not in tree and 1 not in tree
    assert len(tree) == 3  # root, busy child, its sleeping grandchild
    assert tree_ticks([]) == 0


def test_load_cpuinfo_and_frequency_parsers():
    assert parse_loadavg("1.28 0.69 0.27 2/101 5071\n") == 1.28
    assert parse_loadavg("") is None
    assert parse_cpuinfo_mhz("model name\t: AMD EPYC\ncpu MHz\t\t: 2000.0\ncpu MHz\t\t: 3000.0\n") == 2500.0
    assert parse_cpuinfo_mhz("Processor\t: ARMv8\n") is None
    assert mean_khz_as_mhz(["2400000\n", "3600000\n", "garbage"]) == 3000.0
    assert mean_khz_as_mhz([]) is None


# ----------------------------------------------------------------------------- reading, on the capture
@pytest.fixture(scope="module")
def captured() -> ContentionReading:
    root = capture_info()["root"]
    start = ContentionSampler(root, proc=CAPTURE / "start", sys=CAPTURE / "no-sys").snapshot()
    end = ContentionSampler(root, proc=CAPTURE / "end", sys=CAPTURE / "no-sys").snapshot()
    r = reading(start, end)
    assert r is not None
    return r


def test_reading_splits_the_machine_into_ours_and_theirs(captured):
    # /proc/stat: 601 busy ticks over 3 s x 2 CPUs; our tree 209 (the busy child sharing its core),
    # the stranger loop 231, and the other sessions' work the rest.
    assert captured.cpus == 2
    assert captured.own_cores == pytest.approx(0.69, abs=0.01)
    assert captured.other_cores == pytest.approx(1.30, abs=0.01)
    assert captured.other_cores + captured.own_cores == pytest.approx(2.0, abs=0.02)  # the machine was full
    assert captured.steal_cores == pytest.approx(0.0066, abs=0.001)
    assert captured.mhz_end == pytest.approx(2596.1, abs=0.1) and captured.load_1m_end == 1.35
    assert captured.tree_processes == 3


def test_reading_describes_itself_in_cores(captured):
    text = fmt.contention(captured)
    assert fmt.contention(ContentionReading.from_dict(captured.as_dict())) == text  # the recorded form reads the same
    assert text.startswith("other processes used 1.30 of 2 cores and the hypervisor took 0.01 (steal)")
    assert "guard's engine used 0.69" in text


def test_reading_round_trips_through_its_dict(captured):
    d = captured.as_dict()
    assert d["lost_cores"] == pytest.approx(captured.other_cores + captured.steal_cores, abs=1e-4)
    assert ContentionReading.from_dict(d) == captured


def test_no_tick_elapsed_gives_no_reading():
    snap = ContentionSampler(1, proc=CAPTURE / "start", sys=CAPTURE / "no-sys").snapshot()
    assert reading(snap, snap) is None


def test_own_time_above_machine_time_is_not_negative_contention():
    cpu_a = parse_proc_stat("cpu 100 0 0 100 0 0 0 0 0 0\ncpu0 0\n")
    cpu_b = parse_proc_stat("cpu 150 0 0 150 0 0 0 0 0 0\ncpu0 0\n")
    a = Snapshot(wall_s=0.0, cpu=cpu_a, tree_ticks=0, tree_pids=(1,), load_1m=None, mhz=None)
    b = Snapshot(wall_s=1.0, cpu=cpu_b, tree_ticks=60, tree_pids=(1,), load_1m=None, mhz=None)  # 60 > 50 busy
    r = reading(a, b)
    assert r.other_cores == 0.0 and r.own_cores == pytest.approx(0.6)  # 60 of 100 elapsed ticks


def test_sampler_without_proc_reads_nothing(tmp_path):
    s = ContentionSampler(proc=tmp_path / "none")
    s.start()
    assert s.stop() is None
    assert not ContentionSampler.available(tmp_path / "none")


def test_live_sampler_sees_a_busy_loop_outside_its_tree():
    """The real /proc: a busy loop started from a shell that exits is not ours, and shows up."""
    import subprocess
    import sys
    import time

    if not ContentionSampler.available():
        pytest.skip("no /proc here")
    pid = int(subprocess.run(["sh", "-c", f"{sys.executable} -c 'while 1: pass' >/dev/null 2>&1 & echo $!"],
                             capture_output=True, text=True, check=True).stdout)
    try:
        time.sleep(0.3)
        s = ContentionSampler()
        s.start()
        time.sleep(1.5)
        r = s.stop()
    finally:
        subprocess.run(["kill", str(pid)], check=False)
    assert r is not None and r.cpus >= 1
    assert r.other_cores >= 0.8  # one whole core, give or take the tick and the scheduler
    assert r.own_cores < 0.3  # this test process slept


# ----------------------------------------------------------------------------- the gate
def _reading(other: float, steal: float = 0.0, cpus: int = 2) -> ContentionReading:
    return ContentionReading(window_s=36.0, cpus=cpus, other_cores=other, steal_cores=steal, own_cores=1.9)


def test_gate_passes_a_quiet_machine_and_a_missing_reading():
    assert busy(_reading(0.05), 10) is None
    assert busy(None, 10) is None


def test_gate_names_the_numbers_and_the_limit():
    over = busy(_reading(1.7), 10)
    assert over is not None
    why = fmt.busy_machine(over, 10)
    assert "other processes used 1.70 of 2 cores" in why
    assert "allows 0.20 (10 % of 2 cores, validity.max_other_cpu_pct)" in why


def test_gate_counts_steal_as_lost_capacity():
    assert busy(_reading(0.15), 10) is None
    assert busy(_reading(0.15, steal=0.1), 10) is not None


def test_gate_off_at_100_percent():
    assert busy(_reading(2.0), 100) is None
