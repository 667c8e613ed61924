"""Reading YAML so that every value keeps its line: the part of a budget file's checks that no
schema language can say.

A JSON Schema (guard/config/schema.py) sees a file only once it is parsed: by then a duplicate key
has been dropped, `1:56:40` has become 6,040, a `!!python/name` tag has run, and no value knows its
line. Here the file is composed into YAML nodes and read node by node, so an error names file, line
and key path. The schema's tables say which reader each key takes.
"""

from __future__ import annotations

import copy
import difflib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from guard.errors import ConfigError

MAX_DEPTH = 32  # the schema nests 7 levels; anything far deeper is a mistake or an attack
MAX_INT = 2**63 - 1  # integers go to C code (vLLM, torch): keep them in int64
_DECIMAL = re.compile(r"[-+]?(0|[1-9][0-9]*)(\.[0-9]*)?([eE][-+]?[0-9]+)?|[-+]?\.[0-9]+([eE][-+]?[0-9]+)?")
# The only tags a budget file may carry (explicit or implied): plain YAML data. Anything else
# (`!!python/name:os.system`, `!env HOME`, `!!binary`, `!!set`, merge keys) is refused by name.
YAML_TAG = "tag:yaml.org,2002:"
ALLOWED_TAGS = frozenset(YAML_TAG + t for t in ("str", "int", "float", "bool", "null", "timestamp", "map", "seq"))


class Key(Protocol):
    """What the reader needs of a schema key (guard.config.declarations.Key): how to read its value,
    whether the file must give it, its value where absent."""

    @property
    def type(self) -> Any: ...  # a guard.config.declarations.ValueType: .read(reader, node, key path)
    @property
    def required(self) -> bool: ...
    @property
    def default(self) -> Any: ...


def kind_of(node: yaml.Node) -> str:
    return {yaml.MappingNode: "a mapping", yaml.SequenceNode: "a list"}.get(type(node), "a single value")


@dataclass(frozen=True)
class Fields:
    """A section as read: every key's value (its default where absent) and the nodes of the keys
    the file gives, for errors that name their line."""

    node: yaml.Node
    values: dict[str, Any]
    nodes: dict[str, tuple[yaml.Node, yaml.Node]]

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def __contains__(self, name: str) -> bool:
        return name in self.nodes

    def line(self) -> int:
        return self.node.start_mark.line + 1


class YamlReader:
    """Walks a composed YAML node tree. Its methods read one plain value each; the schema's value
    types (guard.config.schema) build the budget file's own kinds of value on them."""

    require_decidable = True  # see guard.config.loading.load_thresholds

    def __init__(self, path: Path) -> None:
        self.path = path

    def error(self, node: yaml.Node | None, key: str, problem: str, hint: str | None = None) -> ConfigError:
        line = node.start_mark.line + 1 if node is not None else None
        return ConfigError(str(self.path), line, key, problem, hint=hint)

    def mapping(self, node: yaml.Node, key: str, keys: Mapping[str, Key] | None) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """The mapping's (key node, value node) by name; with ``keys``, only those names and every
        required one."""
        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, key, f"expected a mapping, got {kind_of(node)}")
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for knode, vnode in node.value:
            name = knode.value if isinstance(knode, yaml.ScalarNode) else None
            if not isinstance(name, str) or name == "":
                raise self.error(knode, key, "keys must be non-empty strings")
            full = f"{key}.{name}" if key else name
            if name in out:
                raise self.error(knode, full, "duplicate key")
            if keys is not None and name not in keys:
                close = difflib.get_close_matches(name, list(keys), n=1)
                hint = f"did you mean `{close[0]}`?" if close else f"allowed keys: {', '.join(keys)}"
                raise self.error(knode, full, "unknown key", hint)
            out[name] = (knode, vnode)
        for name, spec in (keys or {}).items():
            if spec.required and name not in out:
                raise self.error(node, f"{key}.{name}" if key else name, "missing required key")
        return out

    def fields(self, node: yaml.Node, key: str, keys: Mapping[str, Key]) -> Fields:
        """A section read key by key: each key's value, or its default where it is absent."""
        present = self.mapping(node, key, keys)
        values = {name: spec.type.read(self, present[name][1], f"{key}.{name}" if key else name)
                  if name in present else copy.copy(spec.default) for name, spec in keys.items()}
        return Fields(node=node, values=values, nodes=present)

    def node(self, node: yaml.Node, key: str) -> yaml.Node:
        """The node itself: its section reads it once it knows what it needs (``profiles``)."""
        return node

    def scalar(self, node: yaml.Node, key: str) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.error(node, key, f"expected a single value, got {kind_of(node)}")
        # Construct the node directly: re-serialising an empty value (`revision:`) does not parse.
        try:
            return yaml.constructor.SafeConstructor().construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, OverflowError) as exc:  # e.g. `2025-13-45` read as a date
            raise self.error(node, key, f"cannot read {node.value!r}: {exc}") from None

    def decimal(self, node: yaml.Node, key: str, v: Any) -> None:
        """A number written as people read it: YAML 1.1 also reads `1:56:40` (base 60), `015530`
        (octal) and `0x1b58` as numbers, each a budget nobody meant."""
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not _DECIMAL.fullmatch(node.value.strip()):
            raise self.error(node, key, f"{node.value!r} is not a decimal number (YAML reads it as {v!r})",
                             "write it in decimal, e.g. 7000 or 0.5")

    def integer(self, node: yaml.Node, key: str, minimum: int | None = None) -> int:
        v = self.scalar(node, key)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.error(node, key, f"expected an integer, got {v!r}")
        self.decimal(node, key, v)
        if abs(v) > MAX_INT:
            raise self.error(node, key, f"out of range: {node.value!r} does not fit in 64 bits")
        if minimum is not None and v < minimum:
            raise self.error(node, key, f"must be >= {minimum}, got {v}")
        return v

    def number(self, node: yaml.Node, key: str, positive: bool = False, minimum: float | None = None) -> float:
        v = self.scalar(node, key)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.error(node, key, f"expected a number, got {v!r}")
        if math.isfinite(v):
            self.decimal(node, key, v)
        if isinstance(v, int) and abs(v) > MAX_INT or not math.isfinite(v):
            raise self.error(node, key, f"must be a finite number, got {node.value!r}",
                             "`.inf`, `.nan` and numbers beyond 1e308 can never fail or pass a budget")
        if positive and not v > 0:
            raise self.error(node, key, f"must be greater than 0, got {v}")
        if minimum is not None and v < minimum:
            raise self.error(node, key, f"must be >= {minimum}, got {v}")
        return float(v)

    def boolean(self, node: yaml.Node, key: str) -> bool:
        v = self.scalar(node, key)
        if not isinstance(v, bool):
            raise self.error(node, key, f"expected true or false, got {v!r}")
        return v

    def string(self, node: yaml.Node, key: str) -> str:
        """The text as written: `revision: 0755` is "0755", not YAML 1.1's octal 493."""
        v = self.raw(node, key)
        if v is None or not v:
            raise self.error(node, key, f"expected a non-empty string, got {v!r}")
        return v

    def raw(self, node: yaml.Node, key: str) -> str | None:
        """A scalar's source text (None for an empty value or `null`/`~`), never re-typed by YAML."""
        if not isinstance(node, yaml.ScalarNode):
            raise self.error(node, key, f"expected a single value, got {kind_of(node)}")
        if node.tag == YAML_TAG + "null":
            return None
        return node.value

    def strings(self, node: yaml.Node, key: str, allow_empty: bool = False) -> tuple[str, ...]:
        if not isinstance(node, yaml.SequenceNode) or not (node.value or allow_empty):
            raise self.error(node, key, f"expected a {'' if allow_empty else 'non-empty '}list of strings")
        return tuple(self.string(item, f"{key}[{i}]") for i, item in enumerate(node.value))

    def regex(self, node: yaml.Node, key: str) -> str:
        """A non-empty string that compiles as a regular expression."""
        regex = self.string(node, key)
        try:
            re.compile(regex)
        except re.error as exc:
            raise self.error(node, key, f"not a valid regular expression: {exc}") from None
        return regex

    def choice(self, node: yaml.Node, key: str, choices: tuple[str, ...], what: str) -> str:
        v = self.string(node, key)
        if v not in choices:
            close = difflib.get_close_matches(v, choices, n=1)
            raise self.error(node, key, f"unknown {what} {v!r}",
                             f"did you mean `{close[0]}`?" if close else f"use one of: {', '.join(choices)}")
        return v


def compose(path: Path, data: bytes | str, what: str) -> yaml.Node:
    """The file's node tree, checked to be UTF-8, plain YAML data nested at most ``MAX_DEPTH``
    levels; ``path`` names the file in errors, ``what`` the kind of file ("thresholds file")."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise ConfigError(str(path), line, "(file)", f"not UTF-8 text: byte {exc.object[exc.start]:#04x}",
                          hint="save the file as UTF-8") from None
    try:
        _check_depth(path, text)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise ConfigError(str(path), line, "(syntax)", f"not valid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), None, "(syntax)", f"not valid YAML: {exc}") from None
    except RecursionError:
        raise ConfigError(str(path), None, "(structure)", f"nested far deeper than {MAX_DEPTH} levels") from None
    if root is None:
        raise ConfigError(str(path), None, "(file)", f"empty {what}")
    _check_tree(YamlReader(path), root, what)
    return root


def _check_tree(r: YamlReader, root: yaml.Node, what: str) -> None:
    """Every node plain YAML data, nesting bounded; errors name the key path. Iterative, and each
    node once (aliases share nodes, so `&a [*a, *a, ...]` bombs cost nothing)."""
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, int, str]] = [(root, 1, "")]
    while stack:
        node, depth, key = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if depth > MAX_DEPTH:
            raise r.error(node, key or "(structure)", f"nested deeper than {MAX_DEPTH} levels")
        if node.tag not in ALLOWED_TAGS:
            raise r.error(node, key or "(document)", f"YAML tag {node.tag!r} is not allowed in a {what}",
                          "only plain strings, numbers, true/false, null, lists and mappings")
        if isinstance(node, yaml.SequenceNode):
            stack += [(n, depth + 1, f"{key}[{i}]") for i, n in enumerate(node.value)]
        elif isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                name = k.value if isinstance(k, yaml.ScalarNode) else "?"
                stack += [(k, depth + 1, key or "(key)"), (v, depth + 1, f"{key}.{name}" if key else name)]


def _check_depth(path: Path, text: str) -> None:
    """Nesting bounded before the tree is built, naming the line and key path of the first node
    past ``MAX_DEPTH``. yaml.compose recurses once per level, so a file thousands of levels deep
    would exhaust Python's stack, which names nothing; the event stream is flat."""
    frames: list[list[Any]] = []  # per open container: [key path, is a mapping, next index | key expected, key name]
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionEndEvent):
            frames.pop()
            continue
        if not isinstance(event, yaml.NodeEvent):
            continue  # stream and document boundaries
        key = ""
        if frames:
            frame = frames[-1]
            if not frame[1]:  # a list item
                key, frame[2] = f"{frame[0]}[{frame[2]}]", frame[2] + 1
            elif frame[2]:  # a mapping's key
                key, frame[2] = frame[0] or "(key)", False
                frame[3] = event.value if isinstance(event, yaml.ScalarEvent) else "?"
            else:  # its value
                key, frame[2] = f"{frame[0]}.{frame[3]}" if frame[0] else frame[3], True
        if len(frames) + 1 > MAX_DEPTH:
            raise ConfigError(str(path), event.start_mark.line + 1, key or "(structure)",
                              f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(event, yaml.MappingStartEvent):
            frames.append([key, True, True, ""])
        elif isinstance(event, yaml.SequenceStartEvent):
            frames.append([key, False, 0, ""])
