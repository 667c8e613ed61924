"""TPOT and ITL beside TTFT: the p50/p90/p99 of every measured request, budgeted or not, as the
terminal and the pull request's comment both show them."""

from __future__ import annotations

from guard.judge.stats import percentile
from guard.model import format as fmt
from guard.model.records import ITL, TPOT, RunRecord


def token_summary(run: RunRecord) -> list[str]:
    """One line per token metric the run measured (its requests returned more than one token)."""
    out = []
    for metric, unit in ((TPOT, "requests"), (ITL, "inter-token gaps")):
        samples = run.latency_s(metric)
        if samples:
            cells = " · ".join(f"p{p} {fmt.seconds_as_ms(percentile(samples, p))}" for p in (50, 90, 99))
            out.append(f"{metric.upper()} over {len(samples)} {unit}: {cells}")
    return out
