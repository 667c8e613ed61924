"""guard.measure.opcache: one engine stack's op-count pass, remembered under a key of what it depends on.

The key is computed from this test's own environment (the same code path as a baseline worker's and
as guard pr's sides); every change that can change the op counts must change the key, and nothing
else may. Entries are real run records (tests/fixtures/runs: recorded runs).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

from guard.config.loading import load_thresholds
from guard.errors import UsageError
from guard.files import cache_root
from guard.measure import opcache
from guard.model.jsonfiles import load_results
from guard.model.records import Measures
from guard.revisions import sides
from guard.revisions.git import Revision
from guard.revisions.overlay import SideEnvironment
from tests.conftest import SHIPPED_THRESHOLDS

RECORDED = Path(__file__).parent / "fixtures" / "runs" / "cpu-float32-clean.json"
STACK = ({"python": "3.11", "packages": "as tested"}, "a test's stack")


@pytest.fixture(scope="module")
def cpu():
    return load_thresholds(SHIPPED_THRESHOLDS).profile("cpu")


def key(profile, gpu=None, stack=STACK):
    k, covers = opcache.pass_key(*stack, profile, gpu)
    assert k is not None, covers
    return k


def test_installed_distributions_do_not_change_with_what_was_imported(tmp_path, monkeypatch):
    """Importing setuptools (vLLM's engine start does) puts its vendored packages on sys.path; an
    A/B baseline keyed before its engine starts must key as one keyed after. A folder of
    distributions put on sys.path stands in for setuptools/_vendor (synthetic)."""
    from importlib import metadata

    before = opcache.distributions()
    (tmp_path / "vendored_thing-1.0.dist-info").mkdir()
    (tmp_path / "vendored_thing-1.0.dist-info" / "METADATA").write_text("Name: vendored_thing\nVersion: 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert any(d.metadata["Name"] == "vendored_thing" for d in metadata.distributions())  # what made the key move
    assert opcache.distributions() == before and any(d.startswith("torch==") for d in before)


def test_the_kernel_set_is_part_of_the_key_and_the_cpus_model_name_is_not(cpu, monkeypatch):
    """Another instruction-set class runs other kernels (AMX, native bf16): another key. Another CPU
    model of the same class (a CI runner restored onto another model) keys the same."""
    from guard.measure import hardware

    base = key(cpu)
    monkeypatch.setattr(hardware, "cpu_name", lambda: "Another CPU model of the same class")
    assert key(cpu) == base
    here = hardware.read_cpu_features() or frozenset()
    other = here ^ {"amx_bf16", "avx512_bf16"}  # gains or loses AMX and native bf16
    monkeypatch.setattr(hardware, "read_cpu_features", lambda: frozenset(other))
    assert key(cpu) != base


def test_gpu_names_come_from_the_nvidia_drivers_proc_files(tmp_path):
    """The driver's file as published (NVIDIA's README, "Using the /proc File System Interface"; the
    lines of an H100's), one folder per GPU by PCI address: the key names each GPU without torch."""
    for address, model in (("0000:62:00.0", "NVIDIA H100 80GB HBM3"), ("0000:63:00.0", "NVIDIA A10")):
        (tmp_path / address).mkdir()
        (tmp_path / address / "information").write_text(
            f"Model: \t\t {model}\nIRQ: \t\t 10\nGPU UUID: \t GPU-9221d5d1-b60b-a624-bf14-0a1819cfda3b\n"
            "Video BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nGPU Excluded: \t No\n")
    assert opcache._gpu_names(str(tmp_path / "*" / "information")) == ["NVIDIA H100 80GB HBM3", "NVIDIA A10"]


def test_the_same_stack_and_profile_give_the_same_key(cpu):
    first, covers = opcache.pass_key(*STACK, cpu)
    assert first == key(cpu) and len(first) == 24 and int(first, 16) >= 0
    assert covers.startswith("a test's stack") and "guard's own code" in covers


def test_this_interpreters_stack_is_its_packages_by_content():
    material, covers = opcache.stack_material()
    assert material["packages"]["vllm"] and material["packages"]["torch"]  # the engine stack guard runs
    assert any(f.endswith(".so") or ".so:" in f for f in material["packages"]["torch"]["files"])
    assert material["distributions"] == opcache.distributions() and "installed distributions" in covers
    assert key(load_thresholds(SHIPPED_THRESHOLDS).profile("cpu"), stack=(material, covers)) != key(
        load_thresholds(SHIPPED_THRESHOLDS).profile("cpu"))  # another stack, another key


def test_what_changes_the_baseline_op_counts_changes_the_key(cpu, monkeypatch):
    base = key(cpu)
    w = cpu.workload
    changed = {
        "profiled sizes": dataclasses.replace(cpu, workload=dataclasses.replace(w, profile_image_sizes=((640, 480),))),
        "prompt": dataclasses.replace(cpu, workload=dataclasses.replace(w, prompt=w.prompt + " ")),
        "census roots": dataclasses.replace(cpu, census=dataclasses.replace(cpu.census, roots=("vllm/v1/",))),
        "op scopes": dataclasses.replace(cpu, ops=()),
        "engine": dataclasses.replace(cpu, engine=dataclasses.replace(cpu.engine, max_model_len=1024)),
        # the request mixes of the decode census: which, and each one's sampling and length
        "no mixes": dataclasses.replace(cpu, workload=dataclasses.replace(w, profile_mixes=())),
        "a mix's seed": dataclasses.replace(cpu, workload=dataclasses.replace(w, profile_mixes=tuple(
            dataclasses.replace(m, seed=1) if m.name == "seeded" else m for m in w.profile_mixes))),
        "a mix's length": dataclasses.replace(cpu, workload=dataclasses.replace(w, profile_mixes=tuple(
            dataclasses.replace(m, output_tokens=9) for m in w.profile_mixes))),
    }
    keys = {what: key(p) for what, p in changed.items()}
    keys["gpu share"] = key(cpu, 0.4)
    assert base not in keys.values() and len(set(keys.values())) == len(keys), keys
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")
    assert key(cpu) != base
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND")
    assert key(cpu) == base
    # what only judges the counts (limits and where they sit in the YAML, statistics) is not part of the pass
    (mask,) = cpu.ops
    looser = dataclasses.replace(mask, ops={op: dataclasses.replace(b, count=b.count + 5, line=(b.line or 0) + 40)
                                            for op, b in mask.ops.items()})
    assert key(dataclasses.replace(cpu, ops=(looser,), ttft_ms={"p50": 1.0}, line=999,
                                   statistics=dataclasses.replace(cpu.statistics, max_requests=99))) == base


def test_an_edited_model_file_is_another_environment(cpu, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    profile = dataclasses.replace(cpu, engine=dataclasses.replace(cpu.engine, model=str(model)))
    before = key(profile)
    (model / "config.json").write_text('{"hidden_size": 8}')
    assert key(profile) != before


def test_an_edited_source_file_changes_the_tree(tmp_path):
    (tmp_path / "pkg").mkdir()
    src = tmp_path / "pkg" / "model.py"
    src.write_text("x = 1\n")
    (tmp_path / "pkg" / "__pycache__").mkdir()
    before = opcache._tree(tmp_path, (".py", ".so"))
    (tmp_path / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"junk")  # not source
    (tmp_path / "notes.txt").write_text("not source")
    assert opcache._tree(tmp_path, (".py", ".so")) == before
    os.utime(src, (1, 1))  # checked out or installed again: same content, new mtime
    assert opcache._tree(tmp_path, (".py", ".so")) == before
    src.write_text("x = 2\n")  # same size, other content
    assert opcache._tree(tmp_path, (".py", ".so")) != before


def test_a_rebuilt_library_changes_the_tree_without_reading_all_of_it(tmp_path):
    lib = tmp_path / "_C.abi3.so"
    lib.write_bytes(b"\x7fELF" + bytes(1 << 20))
    before = opcache._tree(tmp_path, (".so",))
    lib.write_bytes(b"\x7fELF" + bytes((1 << 20) - 4) + b"shdr")  # a rebuild: new section headers at the end
    assert opcache._tree(tmp_path, (".so",)) != before
    (tmp_path / "libtorch.so.2").write_bytes(b"versioned")  # versioned shared objects count as libraries
    assert len(opcache._tree(tmp_path, (".so",))) == 2


def test_a_model_on_a_moving_revision_cannot_be_keyed(cpu):
    remote = dataclasses.replace(cpu, engine=dataclasses.replace(cpu.engine, model="org/model", revision="main"))
    k, why = opcache.pass_key(*STACK, remote)
    assert k is None and "'main'" in why and "pinned commit" in why
    pinned = dataclasses.replace(remote, engine=dataclasses.replace(remote.engine, revision="a" * 40))
    assert key(pinned) != key(dataclasses.replace(pinned, engine=dataclasses.replace(pinned.engine, revision="b" * 40)))


def recorded_pass():
    run = copy.deepcopy(load_results(RECORDED).run)
    run.measures = Measures.OPS
    return run


def test_a_stored_pass_reads_back_and_a_damaged_one_is_a_miss(tmp_path):
    rec = recorded_pass()
    assert rec.op_counts and rec.census  # a real pass: counts and census
    path = opcache.store(tmp_path / "new", "k1", rec)  # the folder is made when missing
    assert path == opcache.entry_path(tmp_path / "new", "k1") and path.exists()
    got = opcache.load(tmp_path / "new", "k1")
    assert got is not None and got.op_counts == rec.op_counts and got.census == rec.census
    assert got.environment.as_dict() == rec.environment.as_dict() and got.measures == Measures.OPS
    assert opcache.load(tmp_path / "new", "k2") is None  # another key
    data = json.loads(path.read_text())
    broken = copy.deepcopy(data)
    broken["run"]["op_counts"][0]["entries"] = "two"
    for damage in ('{"schema": "guard/run"', json.dumps({**data, "schema": "guard/results"}),
                   json.dumps({**data, "schema_version": 99}), json.dumps(broken)):
        path.write_text(damage)
        assert opcache.load(tmp_path / "new", "k1") is None, damage
    assert opcache.load(None, "k1") is None and opcache.store(None, "k1", rec) is None
    assert opcache.load(tmp_path, None) is None and opcache.store(tmp_path, None, rec) is None


def test_a_folder_keeps_its_most_recently_used_entries(tmp_path, monkeypatch):
    monkeypatch.setattr(opcache, "MAX_ENTRIES", 3)
    rec = recorded_pass()
    for n, key in enumerate("abcd"):
        opcache.store(tmp_path, key, rec)
        os.utime(opcache.entry_path(tmp_path, key), (1000 + n, 1000 + n))  # stored one after the other
    assert not opcache.entry_path(tmp_path, "a").exists()  # the oldest went when the fourth came
    assert opcache.load(tmp_path, "b") is not None  # used again: now the newest
    (tmp_path / "op-registry-x.json").write_text("{}")  # another cache's file in the same folder
    opcache.store(tmp_path, "e", rec)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "op-counts-b.json", "op-counts-d.json", "op-counts-e.json", "op-registry-x.json"]


def test_a_cache_that_cannot_be_written_is_not_an_error(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache folder would be")
    assert opcache.store(blocked, "k1", recorded_pass()) is None


def side(tmp_path: Path, key: str) -> SideEnvironment:
    rev = Revision("main", "a" * 40, "a commit", "b" * 40)
    return SideEnvironment(rev, tmp_path / key, tmp_path / key / "bin" / "python", key, reused=True, linked=0)


def test_a_revisions_pass_is_kept_in_its_own_environment_under_its_key(tmp_path, cpu):
    base, head = side(tmp_path, "base-stack0"), side(tmp_path, "head-stack0")
    k_base, covers = sides.op_pass_key(base, cpu)
    assert k_base is not None and "base-stack0" in covers
    assert sides.op_pass_key(head, cpu)[0] not in (None, k_base)  # another vLLM tree or stack
    assert sides.side_cache(base, cpu).entry is None
    opcache.store(base.root / sides.CACHE_FOLDER, k_base, recorded_pass())
    got = sides.side_cache(base, cpu).entry
    assert got is not None and got.op_counts == recorded_pass().op_counts
    assert sides.side_cache(base, cpu, fresh=True).entry is None  # --fresh: profiled again
    assert sides.side_cache(head, cpu).entry is None  # evicting base's folder takes its counts with it
    looser = dataclasses.replace(cpu, ttft_ms={"p50": 1.0})  # a limit: not part of the pass
    assert sides.side_cache(base, looser).entry is not None
    other = dataclasses.replace(cpu, workload=dataclasses.replace(cpu.workload, seed=cpu.workload.seed + 1))
    assert sides.side_cache(base, other).entry is None


def test_a_hub_model_on_a_moving_revision_is_pinned_first_or_not_cached(tmp_path, cpu, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # read once, when first imported
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # nothing downloaded: main cannot be resolved
    remote = dataclasses.replace(cpu, engine=dataclasses.replace(cpu.engine, model="org/model", revision="main"))
    k, why = sides.op_pass_key(side(tmp_path, "base-stack0"), remote)
    assert k is None and "could not be pinned" in why and "org/model" in why


def test_the_cache_folder_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("GUARD_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path
    monkeypatch.setenv("GUARD_CACHE_DIR", "")
    assert cache_root() is None
    monkeypatch.delenv("GUARD_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "guard"


def test_fresh_baseline_needs_a_baseline():
    import argparse

    from guard.commands.check import check_arguments

    with pytest.raises(UsageError, match="--fresh-baseline"):
        check_arguments(argparse.Namespace(inject=None, baseline=None, fresh_baseline=True, server_url=None, output="o"))
    args = argparse.Namespace(inject=None, baseline=sys.executable, fresh_baseline=True, server_url=None, output="o")
    args = check_arguments(args)
    assert os.path.isabs(args.baseline)


def test_the_key_counts_the_cpus_the_process_may_use_not_the_machines(tmp_path):
    """The census differs between one usable core and two (docs/census.md): a process pinned by
    taskset (or a container's cpuset) must not reuse counts made on more cores."""
    import shutil
    import subprocess
    import sys

    if shutil.which("taskset") is None or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs taskset and two usable CPUs")
    code = "from guard.measure.opcache import _hardware; import os; print(_hardware()['cpu_count'], os.cpu_count())"
    pinned = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.split()
    free = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert pinned[0] == "1" and pinned[1] == free[1]  # os.cpu_count() would not have told them apart
    assert int(free[0]) == len(os.sched_getaffinity(0)) >= 2
