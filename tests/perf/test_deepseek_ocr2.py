"""The perf suite: DeepSeek-OCR-2 through vLLM, judged against thresholds/ by the guard plugin.

Run it with `guard check` (which also writes results.json and report.md), or directly:
    pytest tests/perf -c tests/perf/pytest.ini --guard-profile cpu
The budgets are judged once, by guard.judge.evaluate, at the end of the session; these tests assert
that the measurement itself is complete.
"""

from __future__ import annotations

import pytest

from guard.measure.plugin import TTFT_BENCHMARK


def test_ttft(benchmark, guard_run) -> None:
    profile = guard_run.profile
    if not profile.ttft_ms:
        pytest.skip(f"profile '{profile.name}' has no TTFT budget")
    benchmark.group = f"ttft-{profile.name}"
    guard_run.warm_up()
    # one round: the timing pass; the plugin's pytest_benchmark_update_json puts the per-request
    # TTFT samples in its place in benchmark.json
    benchmark.pedantic(guard_run.measure_until_decided, rounds=1, iterations=1)
    record = guard_run.record
    samples = record.ttft_client_s()
    benchmark.extra_info.update({
        "guard": TTFT_BENCHMARK,
        "unit": "s",
        "ttft_client_s": samples,
        "ttft_engine_s": record.ttft_engine_s(),
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
    if not profile.has_op_count_pass:
        pytest.skip(f"profile '{profile.name}' has no op-count budget and no census")
    counts = guard_run.profile_ops()  # into the record, too
    never = [f"{c.scope} [{c.image_size[0]}x{c.image_size[1]}]" for c in counts if c.entries == 0]
    assert not never, f"scope(s) never entered, counts would prove nothing: {', '.join(never)}"
