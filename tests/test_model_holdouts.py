"""The model holdouts (tests/model_holdouts.py) still apply to the installed vLLM, without an engine.

benchmarks/holdouts.py runs them on the real engine, outside the suite; here, in milliseconds, that
every edit's old text is in the installed source exactly once, that the edited file compiles, that
the functions each holdout names are defined in it, and that the function both heads edit runs on
the model's request path (its committed census baseline has it for every profiled size). A vLLM
upgrade that moves this code fails here, by holdout and edit, not an hour into a benchmark.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import yaml

from guard.measure.mutants import MUTANTS
from tests.model_holdouts import HOLDOUTS, Holdout, HoldoutHead, apply
from tests.vllm_repo import installed_vllm

REPO = Path(__file__).resolve().parent.parent
HEADS = [(name, kind, getattr(h, kind)) for name, h in HOLDOUTS.items() for kind in ("slow", "refactor")]


def source(path: str) -> str:
    return (installed_vllm().parent / path).read_text(encoding="utf-8")


def qualnames(text: str) -> set[str]:
    """Every function's qualified name in a module, as the census writes it (``Class.method``,
    ``f.<locals>.g``)."""
    out: set[str] = set()

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.add(prefix + child.name)
                walk(child, f"{prefix}{child.name}.<locals>.")

    walk(ast.parse(text), "")
    return out


def edited(head: HoldoutHead) -> dict[str, str]:
    return {path: apply(source(path), pairs, path) for path, pairs in head.edits.items()}


@pytest.mark.parametrize(("model", "kind", "head"), HEADS, ids=[f"{m}-{k}" for m, k, _ in HEADS])
def test_every_edit_applies_once_to_the_installed_vllm_and_the_file_still_compiles(model, kind, head: HoldoutHead):
    assert head.edits, f"{model} {kind}: no edits"
    for path, pairs in head.edits.items():
        original = source(path)
        for i, (old, new) in enumerate(pairs):
            assert original.count(old) == 1, f"{model} {kind}: {path} edit {i + 1}: old text occurs {original.count(old)} times"
            assert old != new
        text = apply(original, pairs, path)
        compile(text, path, "exec", dont_inherit=True)


@pytest.mark.parametrize("holdout", HOLDOUTS.values(), ids=list(HOLDOUTS))
def test_the_named_functions_are_defined_where_the_heads_leave_them(holdout: Holdout):
    def defined(texts: dict[str, str], function: str) -> bool:
        path, _, qual = function.partition(":")
        return path in texts and qual in qualnames(texts[path])

    slow, refactor = edited(holdout.slow), edited(holdout.refactor)
    base = {path: source(path) for path in {*holdout.slow.edits, *holdout.refactor.edits}}
    for texts, what in ((base, "base"), (slow, "slow"), (refactor, "refactor")):
        assert defined(texts, holdout.function), f"{holdout.model}: {holdout.function} not defined in {what}"
    assert all(defined(slow, f) for f in holdout.fails), f"{holdout.model}: a function in fails is not in the slow head"
    assert defined(refactor, holdout.helper) and not defined(base, holdout.helper), \
        f"{holdout.model}: the refactor's helper {holdout.helper} must be new in the refactor head"
    assert holdout.slow.expect == 1 and holdout.refactor.expect == 0
    # both heads edit the file of the function they are about
    assert set(holdout.slow.edits) == set(holdout.refactor.edits) == {holdout.function.partition(":")[0]}


@pytest.mark.parametrize("holdout", HOLDOUTS.values(), ids=list(HOLDOUTS))
def test_the_edited_function_runs_on_the_models_request_path(holdout: Holdout):
    """The committed census baseline of the model's cpu profile has the function for every profiled
    image size: the tiny checkpoint's requests run it, so the engine run judges the edit."""
    budget = yaml.safe_load((REPO / "thresholds" / f"{holdout.model}.yaml").read_text())
    profile = budget["profiles"]["cpu"]
    baseline = json.loads((REPO / "thresholds" / profile["budgets"]["census"]["baseline"]).read_text())
    sizes = {f"{w}x{h}" for w, h in profile["workload"]["profile_image_sizes"]}
    assert sizes == set(baseline["census"])
    for size in sizes:
        assert holdout.function in baseline["census"][size], f"{holdout.model}: {holdout.function} not run at {size}"


def test_holdouts_are_not_guards_own_mutants():
    """A holdout is a pattern the census was not built around: no edit of it is a mutant's edit."""
    mutant_olds = {e.old for m in MUTANTS.values() for e in m.edits}
    for name, kind, head in HEADS:
        for path, pairs in head.edits.items():
            assert not any(old in mutant_olds for old, _ in pairs), f"{name} {kind} repeats a mutant's edit"
    assert len(HOLDOUTS) >= 3 and "deepseek-ocr-2" not in HOLDOUTS
