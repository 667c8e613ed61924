"""An installed guard is a whole guard: the wheel carries the perf suite, the shipped budgets with
their census baselines and the embedded checkpoint, and the engine stack's overrides ship beside it.

The end-to-end proof (uv tool install of this wheel with overrides.txt, then `guard check --only ops`
from an empty folder, exit 0) starts the engine and is recorded in docs/github.md ("Install guard as
a tool"), not repeated here."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
import zipfile

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH")
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([uv, "build", "--wheel", "-o", str(out), str(REPO)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [whl] = out.glob("guard-*.whl")
    return zipfile.ZipFile(whl)


def test_the_wheel_carries_the_suite_the_budgets_and_the_checkpoint(wheel):
    names = set(wheel.namelist())
    suite = {f"guard/_suite/{p.name}" for p in (REPO / "tests" / "perf").iterdir() if p.is_file()}
    budgets = {f"guard/_thresholds/{p.name}" for p in (REPO / "thresholds").iterdir()}
    model = {f"guard/models/tiny-deepseek-ocr2/{p.name}" for p in (REPO / "guard" / "models" / "tiny-deepseek-ocr2").iterdir()}
    assert {"guard/_suite/pytest.ini", "guard/_thresholds/deepseek-ocr-2.yaml"} <= suite | budgets
    assert suite | budgets | model | {"guard/model/results.schema.json", "guard/config/budgets.schema.json",
                                     "guard/judge/gpu_costs.json"} <= names  # the GPU pricing's constants
    assert not any(n.startswith("tests/") for n in names)
    # one subpackage per stage (guard/config, measure, judge, report, github)
    assert {f"guard/{s}/__init__.py" for s in ("config", "measure", "judge", "report", "github")} <= names
    # the measure stage's subpackage, whose worker a baseline environment runs (python -m guard.measure.worker)
    assert {"guard/measure/__init__.py", "guard/measure/worker.py", "guard/measure/side.py"} <= names


def test_overrides_txt_is_the_projects_override_set():
    """uv tool install --overrides overrides.txt gives an installed guard the stack the lock file has."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["uv"]["override-dependencies"]
    lines = [ln.strip() for ln in (REPO / "overrides.txt").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    norm = lambda xs: sorted(x.replace('"', "'") for x in xs)  # noqa: E731
    assert norm(lines) == norm(project)
