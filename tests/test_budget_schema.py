"""The budget file's published JSON Schema: current, valid, and in agreement with guard's loader.

An editor validates a budget file with guard/config/budgets.schema.json while guard reads it with
guard.config.loading; both come from guard.config.schema's tables. These tests keep the shipped
copy generated from them, check every shipped budget file against it, and mutate real budget files
key by key (a key added, removed, given a value of the wrong kind) to show the schema refuses what
the loader refuses and admits what it admits.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from guard.cli import main
from guard.config.loading import load_thresholds
from guard.config.schema import SCHEMA_FILE, json_schema, render
from guard.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "thresholds").glob("*.yaml"))
GOOD_FIXTURES = sorted((ROOT / "tests" / "fixtures" / "good-thresholds").glob("*/thresholds.yaml")) + sorted(
    (ROOT / "tests" / "fixtures" / "update").glob("*/*.yaml"))
VALIDATOR = jsonschema.Draft202012Validator(json_schema(), format_checker=jsonschema.FormatChecker())


def test_the_shipped_schema_is_generated_from_the_tables(capsys) -> None:
    """`guard schema --write` made the shipped copy from today's tables; `guard schema` prints the same."""
    assert SCHEMA_FILE.read_text() == render(), "run `guard schema --write` and commit guard/config/budgets.schema.json"
    assert main(["schema"]) == 0
    assert capsys.readouterr().out == SCHEMA_FILE.read_text()


def test_the_schema_is_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(json.loads(SCHEMA_FILE.read_text()))


def test_schema_output_to_a_file(tmp_path: Path, capsys) -> None:
    out = tmp_path / "budgets.schema.json"
    assert main(["schema", "--output", str(out)]) == 0
    assert json.loads(out.read_text()) == json_schema()
    (tmp_path / "a-file").write_text("")
    assert main(["schema", "--output", str(tmp_path / "a-file" / "x.json")]) == 2
    assert "cannot write" in capsys.readouterr().err


@pytest.mark.parametrize("path", SHIPPED + GOOD_FIXTURES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_budget_file_validates(path: Path) -> None:
    load_thresholds(path)  # guard reads it, so the schema must admit it
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(yaml.safe_load(path.read_text()))]
    assert not errors


# ----------------------------------------------------------------------------- agreement
def _every_key(doc: dict[str, Any]) -> dict[str, Any]:
    """A real budget file with the optional keys no shipped file sets filled in (synthetic values,
    each one guard accepts), so every key of the schema is mutated somewhere."""
    doc = copy.deepcopy(doc)
    cpu = doc["profiles"]["cpu"]
    cpu["engine"]["max_num_batched_tokens"] = 4096
    census = cpu["budgets"]["census"]
    census.update(watch=["aten::nonzero"], roots=["vllm"], exclude={"vllm/x.py:f": "synthetic: a reason"},
                  baseline_with_amx="x.cpu.amx.census.json")
    scope = next(iter(cpu["budgets"]["ops"].values()))
    scope.setdefault("ops", {})["aten::mm"] = {"exact": 3}
    cpu["budgets"]["ops"]["synthetic_request"] = {"scope": "request", "total_ops": {"exact": 100}}
    cpu["budgets"]["modes"]["server"].update(tpot_ms={"p50": 90}, itl_ms={"p90": 95})
    cpu["budgets"]["tpot_vs_baseline_pct"] = {"p50": 5}
    cpu["workload"]["profile_mixes"] = {"every-key": {
        "output_tokens": 12, "images": 1, "temperature": 0.7, "top_k": 20, "top_p": 0.8, "seed": 3,
        "repetition_penalty": 1.1, "frequency_penalty": 0.2, "presence_penalty": -0.2, "logprobs": 2, "min_tokens": 4,
        "stop": ["@@stop@@"]}}
    return doc


BASES = {
    "deepseek-ocr-2 (every key)": _every_key(yaml.safe_load((ROOT / "thresholds" / "deepseek-ocr-2.yaml").read_text())),
    "minicpm-v": yaml.safe_load((ROOT / "thresholds" / "minicpm-v.yaml").read_text()),
    "good-thresholds/base": yaml.safe_load((ROOT / "tests" / "fixtures" / "good-thresholds" / "base" / "thresholds.yaml").read_text()),
}
BASE_PATH = ROOT / "thresholds" / "x.yaml"  # census baselines resolve beside it; nothing is read there

def _wrong(value: Any) -> Any:
    """A value of another kind: a mapping for a scalar, a scalar for a list, a list for a mapping."""
    if isinstance(value, dict):
        return ["text"]
    if isinstance(value, list):
        return "text"
    return {"a": 1} if isinstance(value, str) else "text"


def _mutations(node: Any, path: tuple = ()) -> Iterator[tuple[tuple, str]]:
    if isinstance(node, dict):
        yield path, "add an unknown key"
        for key, value in node.items():
            yield path + (key,), "remove"
            yield path + (key,), "give a value of another kind"
            yield from _mutations(value, path + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield path + (i,), "give a value of another kind"
            yield from _mutations(value, path + (i,))


def _mutated(doc: dict[str, Any], path: tuple, how: str) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    if how == "add an unknown key":
        node = doc
        for p in path:
            node = node[p]
        node["zz_not_a_key"] = 1
        return doc
    node = doc
    for p in path[:-1]:
        node = node[p]
    if how == "remove":
        del node[path[-1]]
    else:
        node[path[-1]] = _wrong(node[path[-1]])
    return doc


@pytest.mark.parametrize("base", list(BASES))
def test_schema_and_loader_agree_on_every_mutation(base: str) -> None:
    """Each key of a real budget file added, removed or given a value of the wrong kind: the
    schema refuses exactly what the loader refuses, so an editor never flags a file guard reads,
    nor passes one a mutation of a single key breaks. (What JSON Schema cannot say, relations
    between two values such as ab.fail_confidence >= ab.confidence, the loader alone refuses:
    docs/budgets.md.)"""
    doc = BASES[base]
    load_thresholds(BASE_PATH, text=yaml.safe_dump(doc, sort_keys=False))
    disagree, count = [], 0
    for path, how in _mutations(doc):
        mutated = _mutated(doc, path, how)
        count += 1
        try:
            load_thresholds(BASE_PATH, text=yaml.safe_dump(mutated, sort_keys=False))
            loader = None
        except ConfigError as exc:
            loader = str(exc).splitlines()[0]
        schema = next(iter(VALIDATOR.iter_errors(mutated)), None)
        if (loader is None) != (schema is None):
            disagree.append(f"{how} at {'.'.join(map(str, path)) or '(top)'}: loader {loader or 'accepts'}; "
                            f"schema {schema.message if schema else 'accepts'}")
    assert count > 50, count
    assert not disagree, "\n".join(disagree)


def _schema_keys(schema: dict[str, Any], where: str = "") -> Iterator[str]:
    for key, sub in schema.get("properties", {}).items():
        yield f"{where}.{key}"
        yield from _schema_keys(sub, f"{where}.{key}")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _schema_keys(schema["additionalProperties"], f"{where}.*")
    for branch in schema.get("oneOf", []):
        yield from _schema_keys(branch, where)


def _doc_keys(value: Any, schema: dict[str, Any], where: str = "") -> Iterator[str]:
    if not isinstance(value, dict):
        return
    props = schema.get("properties", {})
    for key, sub in value.items():
        if key in props:
            yield f"{where}.{key}"
            yield from _doc_keys(sub, props[key], f"{where}.{key}")
        elif isinstance(schema.get("additionalProperties"), dict):
            yield from _doc_keys(sub, schema["additionalProperties"], f"{where}.*")
    for branch in schema.get("oneOf", []):
        yield from _doc_keys(value, branch, where)


def test_the_mutations_reach_every_key_of_the_schema() -> None:
    schema = json_schema()
    reached = {k for doc in BASES.values() for k in _doc_keys(doc, schema)}
    assert set(_schema_keys(schema)) - reached == set()
