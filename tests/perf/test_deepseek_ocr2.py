"""The perf suite: DeepSeek-OCR-2 through vLLM, judged against thresholds/ by the guard plugin.

Run it with `guard check` (which also writes results.json and report.md), or directly:
    pytest tests/perf -c tests/perf/pytest.ini --guard-profile cpu
The budgets are judged once, by guard.evaluate, at the end of the session; these tests assert
that the measurement itself is complete.
"""

from __future__ import annotations

import pytest


def feed_benchmark(benchmark, samples_s: list[float], extra_info: dict) -> None:
    """Put externally timed samples into pytest-benchmark's stats, so its JSON and
    `pytest-benchmark compare` show the TTFT distribution. pytest-benchmark has no public API
    for samples it did not time itself; `_make_stats` is the one it uses internally."""
    benchmark._mode = "guard: external TTFT samples"
    stats = benchmark._make_stats(1)
    for s in samples_s:
        stats.update(s)
    benchmark.extra_info.update(extra_info)


def test_ttft(benchmark, guard_run) -> None:
    profile = guard_run.profile
    if not profile.ttft_ms:
        pytest.skip(f"profile '{profile.name}' has no TTFT budget")
    benchmark.group = f"ttft-{profile.name}"
    guard_run.warm_up()
    guard_run.measure_until_decided()
    record = guard_run.record
    samples = record.ttft_client_s()
    feed_benchmark(benchmark, samples, {
        "unit": "s",
        "ttft_client_s": samples,
        "ttft_engine_s": [o.ttft_engine_s for o in record.measured if o.success],
        "rounds": record.rounds,
        "profile": profile.name,
        "image_sizes": [list(s) for s in profile.workload.image_sizes],
        "concurrency": profile.workload.concurrency,
    })
    failed = [o for o in record.measured if not o.success]
    assert not failed, f"{len(failed)} request(s) failed, first: {failed[0].error}"
    assert len(samples) >= profile.workload.requests
    assert all(s > 0 for s in samples)


def test_op_counts(guard_run) -> None:
    profile = guard_run.profile
    if not profile.ops and profile.census is None:
        pytest.skip(f"profile '{profile.name}' has no op-count budget and no census")
    counts = guard_run.profile_ops()
    guard_run.record.op_counts.extend(counts)
    never = [f"{c.scope} [{c.image_size[0]}x{c.image_size[1]}]" for c in counts if c.entered == 0]
    assert not never, f"scope(s) never entered, counts would prove nothing: {', '.join(never)}"
