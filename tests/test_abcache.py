"""guard.measure.abcache: the baseline side's op-count pass, remembered per baseline environment.

The key is computed from this test's own environment (the same code path as a baseline worker's);
every change that can change the baseline's op counts must change the key, and nothing else may.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import pytest

from guard.measure import abcache
from guard.config.budgets import load_thresholds
from guard.errors import UsageError
from guard.files import cache_root
from tests.conftest import SHIPPED_THRESHOLDS


@pytest.fixture(scope="module")
def cpu():
    return load_thresholds(SHIPPED_THRESHOLDS).profile("cpu")


def key(profile, gpu=None):
    k, covers = abcache.environment_key(profile, gpu)
    assert k is not None, covers
    return k


def test_the_same_environment_and_profile_give_the_same_key(cpu):
    first, covers = abcache.environment_key(cpu, None)
    assert first == key(cpu) and len(first) == 24 and int(first, 16) >= 0
    assert "installed distributions" in covers and "guard's own code" in covers


def test_what_changes_the_baseline_op_counts_changes_the_key(cpu, monkeypatch):
    base = key(cpu)
    w = cpu.workload
    changed = {
        "profiled sizes": dataclasses.replace(cpu, workload=dataclasses.replace(w, profile_image_sizes=((640, 480),))),
        "prompt": dataclasses.replace(cpu, workload=dataclasses.replace(w, prompt=w.prompt + " ")),
        "census roots": dataclasses.replace(cpu, census=dataclasses.replace(cpu.census, roots=("vllm/v1/",))),
        "op scopes": dataclasses.replace(cpu, ops=()),
        "engine": dataclasses.replace(cpu, engine=dataclasses.replace(cpu.engine, max_model_len=1024)),
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
    before = abcache._tree(tmp_path, (".py", ".so"))
    (tmp_path / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"junk")  # not source
    (tmp_path / "notes.txt").write_text("not source")
    assert abcache._tree(tmp_path, (".py", ".so")) == before
    os.utime(src, (1, 1))  # checked out or installed again: same content, new mtime
    assert abcache._tree(tmp_path, (".py", ".so")) == before
    src.write_text("x = 2\n")  # same size, other content
    assert abcache._tree(tmp_path, (".py", ".so")) != before


def test_a_rebuilt_library_changes_the_tree_without_reading_all_of_it(tmp_path):
    lib = tmp_path / "_C.abi3.so"
    lib.write_bytes(b"\x7fELF" + bytes(1 << 20))
    before = abcache._tree(tmp_path, (".so",))
    lib.write_bytes(b"\x7fELF" + bytes((1 << 20) - 4) + b"shdr")  # a rebuild: new section headers at the end
    assert abcache._tree(tmp_path, (".so",)) != before
    (tmp_path / "libtorch.so.2").write_bytes(b"versioned")  # versioned shared objects count as libraries
    assert len(abcache._tree(tmp_path, (".so",))) == 2


def test_a_model_on_a_moving_revision_cannot_be_keyed(cpu):
    remote = dataclasses.replace(cpu, engine=dataclasses.replace(cpu.engine, model="org/model", revision="main"))
    k, why = abcache.environment_key(remote, None)
    assert k is None and "'main'" in why and "pinned commit" in why
    pinned = dataclasses.replace(remote, engine=dataclasses.replace(remote.engine, revision="a" * 40))
    assert key(pinned) != key(dataclasses.replace(pinned, engine=dataclasses.replace(pinned.engine, revision="b" * 40)))


SIZES = {"640x480": {"counts": [{"scope": "mask_path", "image_size": [640, 480], "entries": 2,
                                 "calls_by_op": {"aten::_index_put_impl_": 0}, "total_calls": 2, "sites": []}],
                     "census": {"vllm/x.py:f": {"calls": 3}}}}


def test_a_stored_pass_reads_back_and_a_damaged_one_is_a_miss(tmp_path):
    path = abcache.store(tmp_path, "k1", SIZES, covers="test")
    assert path == abcache.entry_path(tmp_path, "k1") and path.exists()
    got = abcache.load(tmp_path, "k1")
    assert got is not None and got.sizes == SIZES and got.key == "k1" and got.recorded_at
    assert abcache.load(tmp_path, "k2") is None  # another environment
    data = json.loads(path.read_text())
    for damage in ('{"schema": "guard/ab-baseline-ops"', json.dumps({**data, "key": "other"}),
                   json.dumps({**data, "schema_version": 99}), json.dumps({**data, "sizes": {"640x480": {"counts": 3}}})):
        path.write_text(damage)
        assert abcache.load(tmp_path, "k1") is None, damage
    assert abcache.load(None, "k1") is None and abcache.store(None, "k1", SIZES) is None


def test_a_cache_that_cannot_be_written_is_not_an_error(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache folder would be")
    assert abcache.store(blocked, "k1", SIZES) is None


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
        check_arguments(argparse.Namespace(inject=None, baseline=None, fresh_baseline=True))
    args = argparse.Namespace(inject=None, baseline=sys.executable, fresh_baseline=True)
    check_arguments(args)
    assert os.path.isabs(args.baseline)
