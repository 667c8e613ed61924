"""The perf suite: DeepSeek-OCR-2 through vLLM, judged against thresholds/ by the guard plugin.

Run it directly (pytest-benchmark writes benchmark.json with `--benchmark-json`):
    pytest tests/perf -c tests/perf/pytest.ini --guard-profile cpu
`guard check` runs the same run-stage steps (guard.measure.single_run) without pytest. The budgets are
judged once, by guard.judge.evaluate, at the end of the session; these tests assert that the
measurement itself is complete (the run stage's own completeness checks).
"""

from __future__ import annotations

import pytest

from guard.measure.single_run import profile_pass, timing_pass
from guard.pytest_plugin import TTFT_BENCHMARK


def test_ttft(benchmark, guard_run) -> None:
    profile = guard_run.profile
    if not profile.ttft_ms:
        pytest.skip(f"profile '{profile.name}' has no TTFT budget")
    benchmark.group = f"ttft-{profile.name}"
    # one round: warm-up and the timing pass; the plugin's pytest_benchmark_update_json puts the
    # per-request TTFT samples in its place in benchmark.json
    incomplete = benchmark.pedantic(timing_pass, args=(guard_run,), rounds=1, iterations=1)
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
    assert not incomplete, "; ".join(map(str, incomplete))


def test_op_counts(guard_run) -> None:
    profile = guard_run.profile
    if not profile.has_op_count_pass:
        pytest.skip(f"profile '{profile.name}' has no op-count budget and no census")
    incomplete = profile_pass(guard_run)  # the counts go into the record
    assert not incomplete, "; ".join(map(str, incomplete))
