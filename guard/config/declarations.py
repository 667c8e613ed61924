"""The table machinery the budget file's schema (guard.config.schema) is declared in: a value type
pairs the reader of one kind of value with its JSON Schema, a key says whether it is required, its
default and what it means, and a section is a mapping of known keys that reads itself and writes
its own JSON Schema, so reading a file and the schema an editor checks it by come from one table."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from guard.config.yamlread import MAX_INT, Fields, YamlReader

Reader = Callable[[YamlReader, yaml.Node, str], Any]


# ----------------------------------------------------------------------------- declarations
@dataclass(frozen=True)
class ValueType:
    """One kind of value: how it is read from a YAML node, and its JSON Schema."""

    read: Reader
    json: Mapping[str, Any]


@dataclass(frozen=True)
class Key:
    type: ValueType
    required: bool = False
    default: Any = None
    doc: str = ""  # what the key means, as an editor shows it


@dataclass(frozen=True)
class Section:
    """A mapping of known keys, read into ``record(**values)`` or, where keys constrain each
    other, by ``build(reader, key path, fields)``. ``json_extra``: what JSON Schema can say of how
    the keys combine (the rest is ``build``'s)."""

    keys: Mapping[str, Key]
    record: Callable[..., Any] | None = None
    build: Callable[[YamlReader, str, Fields], Any] | None = None
    json_extra: Mapping[str, Any] = field(default_factory=dict)

    def read(self, r: YamlReader, node: yaml.Node, key: str) -> Any:
        f = r.fields(node, key, self.keys)
        if self.build is not None:
            return self.build(r, key, f)
        return self.record(**f.values) if self.record is not None else f

    @property
    def type(self) -> ValueType:
        return ValueType(self.read, self.json())

    def json(self) -> dict[str, Any]:
        props = {}
        for name, k in self.keys.items():
            props[name] = dict(k.type.json)
            if k.doc:
                props[name]["description"] = k.doc
            default = _json_default(k.default)
            if not k.required and default is not None:
                props[name]["default"] = default
        out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
        required = [name for name, k in self.keys.items() if k.required]
        if required:
            out["required"] = required
        return {**out, **self.json_extra}


def _json_default(value: Any) -> Any:
    """A default as the file would write it; None where it is not a plain value."""
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def required(t: ValueType, doc: str = "") -> Key:
    return Key(t, required=True, doc=doc)


def optional(t: ValueType, default: Any = None, doc: str = "") -> Key:
    return Key(t, default=default, doc=doc)


def integer(minimum: int | None = None) -> ValueType:
    bounds = {"minimum": minimum} if minimum is not None else {"minimum": -MAX_INT}
    return ValueType(lambda r, n, k: r.integer(n, k, minimum=minimum), {"type": "integer", **bounds, "maximum": MAX_INT})


def number(minimum: float | None = None, positive: bool = False) -> ValueType:
    bounds: dict[str, Any] = {"maximum": sys.float_info.max}  # a finite number: `.inf` can never pass or fail
    if positive:
        bounds["exclusiveMinimum"] = 0
    if minimum is not None:
        bounds["minimum"] = minimum
    return ValueType(lambda r, n, k: r.number(n, k, positive=positive, minimum=minimum), {"type": "number", **bounds})


def later(section: Section) -> ValueType:
    """A section the loader reads once it knows what it needs (``budgets``, after the engine and
    statistics): the node, kept; the section's JSON Schema."""
    return ValueType(YamlReader.node, section.json())


def map_of(t: ValueType, minimum: int = 0) -> ValueType:
    """A mapping of names the file chooses (profiles, scopes, ops) to values of one type."""
    return ValueType(lambda r, n, k: {name: t.read(r, v, f"{k}.{name}") for name, (_, v) in r.mapping(n, k, None).items()},
                     {"type": "object", "additionalProperties": dict(t.json),
                      **({"minProperties": minimum} if minimum else {})})
