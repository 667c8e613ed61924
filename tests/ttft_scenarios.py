"""Shared TTFT scenarios: the pinned statistics thresholds, synthetic samples and run records."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from guard.model.records import RequestOutcome, RunRecord

THRESHOLDS = Path(__file__).parent / "fixtures" / "thresholds-statistics.yaml"  # pinned, see the file
CPU_ENV = {"hardware_profile": "cpu", "cuda": False, "gpu": None, "cpu": "Test CPU", "cpu_count": 2,
           "hardware_match": {"ok": True, "reason": None, "rule": {"cuda": False, "gpu_name_regex": None}},
           "gpu_state": None}


def budgeted(profile, **ttft_ms):
    return dataclasses.replace(profile, ttft_ms=ttft_ms)


def record(samples_s, rounds=1, env=None, profile="cpu"):
    outcomes = [RequestOutcome(index=i, image_size=(640, 480), warmup=False, success=True, ttft_client_s=s)
                for i, s in enumerate(samples_s)]
    return RunRecord(profile=profile, thresholds_path=str(THRESHOLDS), model="deepseek-ocr-2",
                     environment=dict(CPU_ENV if env is None else env), outcomes=outcomes, rounds=rounds)


def spread(center_s, n, width=0.01):
    """n samples evenly across center +- width/2 (relative)."""
    return [center_s * (1 - width / 2 + width * i / (n - 1)) for i in range(n)]
