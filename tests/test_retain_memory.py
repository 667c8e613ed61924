"""engine.retain_freed_memory: glibc keeps what the engine frees, so a request does not fault it in again.

Checked on real processes with real glibc: a loop that allocates and frees the same large blocks
faults pages in on every round by default, and on the first round only with the setting, both
when guard sets it in its own process (mallopt) and when it hands it to a process it starts
(`vllm serve`'s environment, GLIBC_TUNABLES).
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import textwrap

import pytest

from guard.config.loading import load_thresholds
from guard.measure.inprocess import RETAIN_FREED_MEMORY_TUNABLES
from guard.measure.server import server_environment
from tests.conftest import REPO, SHIPPED_THRESHOLDS

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's")

# Four rounds of allocating and freeing 112 MB (blocks above glibc's mmap threshold); prints the
# page faults of each round.
CHURN = textwrap.dedent("""
    import json, resource, sys
    sys.path.insert(0, {repo!r})
    import numpy as np
    if sys.argv[1] == "in-process":
        from guard.measure.inprocess import retain_freed_memory
        retain_freed_memory()
    faults = []
    for _ in range(4):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        a = np.ones(64 * 2**20 // 8)
        b = np.ones(48 * 2**20 // 8)
        del a, b
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(json.dumps(faults))
""").format(repo=str(REPO))


def churn_faults(how: str, env: dict[str, str] | None = None) -> list[int]:
    out = subprocess.run([sys.executable, "-c", CHURN, how], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout)


def test_by_default_every_round_faults_its_memory_in_again():
    faults = churn_faults("default")
    assert min(faults[1:]) > 20, faults  # 112 MB in 2 MB huge pages is 56 faults; in 4 kB pages, 28,000


def test_retained_in_process_only_the_first_round_faults():
    faults = churn_faults("in-process")
    assert faults[0] > 20 and faults[1:] == [0, 0, 0], faults


def test_a_started_server_gets_the_setting_through_its_environment():
    cpu = load_thresholds(SHIPPED_THRESHOLDS).profile("cpu").engine
    env = server_environment(cpu, base={"PATH": "/usr/bin:/bin", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:" + RETAIN_FREED_MEMORY_TUNABLES  # the user's stay
    faults = churn_faults("environment", env)
    assert faults[0] > 20 and faults[1:] == [0, 0, 0], faults
    a10 = load_thresholds(SHIPPED_THRESHOLDS).profile("a10").engine
    assert "GLIBC_TUNABLES" not in server_environment(a10, base={})
