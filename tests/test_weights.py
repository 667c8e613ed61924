"""A moving model revision (`main`) is measured as one commit, recorded and carried into provenance.

The Hub is never reached: the resolver is a stub at the boundary, or the real huggingface_hub
reading a Hugging Face cache laid out on disk here (refs/main -> snapshots/<commit>), which is what
an offline measuring step reads after the download step. What stays unproven here: that
`snapshot_download` against the live Hub returns the snapshot of the commit `main` names (the
download itself), see docs/limitations.md."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from guard.config.loading import load_thresholds
from guard.commands.update_thresholds import provenance_for
from guard.commands.weights import fetch
from guard.errors import GuardError
from guard.measure.hardware import detect, fingerprint
from guard.model.jsonfiles import load_results
from guard.config.weights import hub_resolver, pin
from tests.conftest import REPO, SHIPPED_THRESHOLDS

SHA = "0123456789abcdef0123456789abcdef01234567"
A10 = load_thresholds(SHIPPED_THRESHOLDS).profile("a10")


def test_main_is_resolved_to_a_commit_and_both_names_are_kept() -> None:
    asked = []
    pinned = pin(A10, lambda model, rev: asked.append((model, rev)) or SHA)
    assert asked == [("deepseek-ai/DeepSeek-OCR-2", "main")]
    assert pinned.engine.revision == SHA and pinned.engine.requested_revision == "main"
    assert pinned.engine.as_dict()["requested_revision"] == "main"


def test_a_pinned_commit_an_embedded_or_a_local_model_is_not_resolved(tmp_path: Path) -> None:
    def never(model, rev):
        raise AssertionError("must not resolve")

    committed = dataclasses.replace(A10, engine=dataclasses.replace(A10.engine, revision=SHA))
    assert pin(committed, never) is committed
    cpu = load_thresholds(SHIPPED_THRESHOLDS).profile("cpu")
    assert pin(cpu, never) is cpu and "requested_revision" not in cpu.engine.as_dict()
    local = dataclasses.replace(A10, engine=dataclasses.replace(A10.engine, model=str(tmp_path)))
    assert pin(local, never) is local


def test_a_resolver_failure_or_a_non_commit_answer_is_an_error_with_the_fix() -> None:
    def offline(model, rev):
        raise OSError("no cached snapshot")

    with pytest.raises(GuardError) as e:
        pin(A10, offline)
    assert "deepseek-ai/DeepSeek-OCR-2@main" in str(e.value) and "guard weights" in str(e.value)
    with pytest.raises(GuardError, match="not a 40-hex commit"):
        pin(A10, lambda m, r: "main")


def test_the_run_environment_records_the_commit_and_the_requested_name() -> None:
    env = fingerprint(detect(quick=True), pin(A10, lambda m, r: SHA))
    assert env.model_revision == SHA and env.model_revision_requested == "main"
    assert "model_revision_requested" not in fingerprint(detect(quick=True), load_thresholds(SHIPPED_THRESHOLDS).profile("cpu")).as_dict()


def test_update_thresholds_writes_the_resolved_commit_into_provenance() -> None:
    res = load_results(REPO / "tests" / "fixtures" / "runs" / "cpu-float32-clean.json")
    assert "model_revision" not in provenance_for(res, 15, REPO)  # the embedded checkpoint has none
    res.run.environment.model_revision = SHA
    assert provenance_for(res, 15, REPO)["model_revision"] == SHA


def _hf_cache(root: Path, model: str, ref: str, commit: str) -> Path:
    repo = root / f"models--{model.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / ref).write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    return root


def test_the_real_resolver_reads_an_offline_cache_as_the_measuring_step_does(tmp_path, monkeypatch) -> None:
    from huggingface_hub import constants

    cache = _hf_cache(tmp_path / "hub", "deepseek-ai/DeepSeek-OCR-2", "main", SHA)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert pin(A10, hub_resolver(download=False)).engine.revision == SHA


def test_guard_weights_prints_the_commit_and_writes_the_step_output(tmp_path, monkeypatch, capsys) -> None:
    out = tmp_path / "github_output"
    monkeypatch.setenv("GITHUB_OUTPUT", str(out))
    assert fetch(thresholds=str(SHIPPED_THRESHOLDS), profile="a10", github_output=True, resolver=lambda m, r: SHA) == 0
    assert f"deepseek-ai/DeepSeek-OCR-2@main -> {SHA}" in capsys.readouterr().out
    assert out.read_text() == f"commit={SHA}\n"
    assert fetch(thresholds=str(SHIPPED_THRESHOLDS), profile="cpu", github_output=False, resolver=None) == 0
    assert "nothing to download" in capsys.readouterr().out


def test_guard_weights_of_a_pinned_commit_it_cannot_fetch_or_a_step_output_it_cannot_write_is_exit_2(
        tmp_path, monkeypatch, capsys) -> None:
    """A pinned revision is downloaded as named; the Hub failing there (offline, gated, gone) is the
    same error as for `main`, not a crash; GITHUB_OUTPUT naming a folder likewise."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    from guard.errors import GuardError
    from tests.conftest import SHIPPED_THRESHOLDS as real

    pinned = tmp_path / "t.yaml"
    pinned.write_text(real.read_text().replace("revision: main", f"revision: {SHA}", 1))
    assert f"revision: {SHA}" in pinned.read_text()

    def offline(model, revision):
        raise LocalEntryNotFoundError("the Hub is switched off and the cache has no such revision")

    with pytest.raises(GuardError, match=f"cannot resolve deepseek-ai/DeepSeek-OCR-2@{SHA}") as err:
        fetch(thresholds=str(pinned), profile="a10", github_output=False, resolver=offline)
    assert err.value.exit_code == 2
    monkeypatch.setenv("GITHUB_OUTPUT", str(tmp_path))
    with pytest.raises(GuardError, match="GITHUB_OUTPUT .*: cannot write"):
        fetch(thresholds=str(SHIPPED_THRESHOLDS), profile="a10", github_output=True, resolver=lambda m, r: SHA)


@pytest.mark.parametrize("workflow", ["perf-guard.yml"])
def test_the_workflows_download_step_resolves_main_where_it_used_to_refuse_it(workflow, monkeypatch, capsys) -> None:
    """The download step once stopped with exit 2 on `revision: main`; run as the workflow runs it
    (its own arguments), it now resolves the name (stub Hub at the boundary) and exits 0."""
    from guard import cli
    from guard.commands import weights
    from tests.workflow_commands import workflow_argv

    monkeypatch.setattr(weights, "hub_resolver", lambda download: (lambda m, r: SHA))
    argv = workflow_argv("perf-guard.yml", "weights", {"PROFILE": "a10", "THRESHOLDS": str(SHIPPED_THRESHOLDS)})
    assert cli.main(argv) == 0
    assert SHA in capsys.readouterr().out


def test_ab_mode_pins_both_sides_to_one_commit(tmp_path, monkeypatch) -> None:
    """A/B starts two engines from the thresholds file: both get the commit resolved once, and the
    run records name it, so a push to the Hub between the two starts cannot split the sides."""
    from guard.measure.ab_run import ABRun
    from guard.config import weights

    monkeypatch.setattr(weights, "hub_resolver", lambda download: (lambda m, r: SHA))
    run = ABRun(load_thresholds(SHIPPED_THRESHOLDS), A10, detect(quick=True), tmp_path, sys.executable)
    assert run.profile.engine.revision == SHA
    assert run.record.candidate.environment.model_revision == SHA
    assert run.record.candidate.environment.model_revision_requested == "main"
