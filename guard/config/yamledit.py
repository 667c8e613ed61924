"""Minimal-diff edits to YAML text: change scalars, add keys; every other character stays as it was.

A YAML round trip (load, change, dump) loses comments, key order, blank lines and quoting. Here
the text is composed once to learn where each node sits (``start_mark``/``end_mark`` character
indices), the edits are expressed as replacements of those ranges, and they are applied from the
end of the text backwards so earlier indices stay valid. ``verify`` then re-reads both texts and
checks that the data changed exactly as intended and nowhere else.

This module knows YAML syntax only, never guard's schema (that is ``guard.config.budgets``). Pure: text in,
text out; it raises ``YamlEditError`` and never prints.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import yaml

Scalar = str | int | float | bool | None
Value = Scalar | list[Scalar]  # a flat list is written as a flow sequence: [a, b]
Path = tuple[str, ...]  # keys from the document root down to a node

# Conservative charset for an unquoted string; anything else is single-quoted. "," and brackets are
# left out so the same text is also valid inside a flow mapping.
_PLAIN_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/()@+\- ]*")


class YamlEditError(ValueError):
    """An edit could not be made or did not come out as intended. ``line`` (1-based) and ``key``
    (dotted path) say where, when known."""

    def __init__(self, message: str, *, line: int | None = None, key: str | None = None) -> None:
        super().__init__(message)
        self.line, self.key = line, key


@dataclass(frozen=True)
class Edit:
    """Replace text[start:end] with ``text`` (start == end: insert)."""

    start: int
    end: int
    text: str


# ----------------------------------------------------------------------------- reading
def compose(text: str) -> yaml.Node:
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is None:
        raise YamlEditError("empty YAML document")
    return root


def lookup(root: yaml.Node, path: Sequence[str]) -> tuple[yaml.Node | None, yaml.Node]:
    """(key node, value node) at ``path``; the key node is None for the root. KeyError if absent."""
    key_node: yaml.Node | None = None
    node = root
    for i, key in enumerate(path):
        if not isinstance(node, yaml.MappingNode):
            raise KeyError(".".join(path[: i + 1]))
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == key:
                key_node, node = k, v
                break
        else:
            raise KeyError(".".join(path[: i + 1]))
    return key_node, node


def unshared(text: str, root: yaml.Node, path: Sequence[str]) -> None:
    """Refuse an edit at ``path`` when a node on the way carries a YAML anchor (``&name``): the same
    node is then read elsewhere through its aliases (``*name``), and changing it in place would
    change those too, or drop the anchor they point to. (Nodes do not keep their anchor; the
    parser's events do, and an anchored node starts where its event does.)"""
    anchored = {e.start_mark.index: e.anchor for e in yaml.parse(text, Loader=yaml.SafeLoader)
                if isinstance(e, yaml.NodeEvent) and not isinstance(e, yaml.AliasEvent) and e.anchor}
    if not anchored:
        return
    node: yaml.Node | None = root
    for depth in range(len(path) + 1):
        if depth:
            node = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == path[depth - 1]),
                        None) if isinstance(node, yaml.MappingNode) else None
            if node is None:
                return  # absent: set_mapping adds it
        anchor = anchored.get(node.start_mark.index)
        if anchor is not None:
            where = "this value" if depth == len(path) else (".".join(path[:depth]) or "the document")
            raise YamlEditError(f"{where} is shared through the YAML anchor &{anchor} (its aliases *{anchor} read the "
                                "same node), and guard edits one place at a time: write the values out in place of the "
                                "aliases, then update again", line=node.start_mark.line + 1, key=".".join(path))


def newline_of(text: str) -> str:
    return "\r\n" if "\r\n" in text else "\n"


# ----------------------------------------------------------------------------- formatting
def format_scalar(value: Scalar, style: str | None = None) -> str:
    """YAML text for ``value``; keeps a string's existing quote style ("'" or '"') when given."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise YamlEditError(f"cannot write a non-finite number: {value!r}")
        mantissa, e, exponent = repr(value).partition("e")
        # YAML 1.1 (PyYAML) reads "1e-05" as a string: the mantissa needs a dot.
        return mantissa + ("" if "." in mantissa or not e else ".0") + e + exponent
    if isinstance(value, str):
        if style == '"' or "\n" in value:
            return json.dumps(value, ensure_ascii=False)
        if style != "'" and _plain_ok(value):
            return value
        return "'" + value.replace("'", "''") + "'"
    raise YamlEditError(f"not a simple scalar: {value!r}")


def format_value(value: Value) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(format_scalar(v) for v in value) + "]"
    return format_scalar(value)


def _plain_ok(value: str) -> bool:
    if not _PLAIN_RE.fullmatch(value) or value.endswith(" ") or ": " in value or value.endswith(":"):
        return False
    try:
        return yaml.safe_load(value) == value  # "true", "1.0", "2025-01-01" would change type
    except yaml.YAMLError:
        return False


def format_block_mapping(key: str, values: dict[str, Value], indent: int, step: int, nl: str) -> str:
    pad, inner = " " * indent, " " * (indent + step)
    lines = [f"{pad}{format_scalar(key)}:"]
    lines += [f"{inner}{format_scalar(k)}: {format_value(v)}" for k, v in values.items()]
    return nl.join(lines) + nl


def format_flow_mapping(values: dict[str, Value]) -> str:
    return "{" + ", ".join(f"{format_scalar(k)}: {format_value(v)}" for k, v in values.items()) + "}"


# ----------------------------------------------------------------------------- edits
def set_scalar(text: str, root: yaml.Node, path: Sequence[str], value: Scalar) -> Edit | None:
    """Edit that sets the scalar at ``path`` to ``value``; None when it already holds that value."""
    key_node, node = lookup(root, path)
    unshared(text, root, path)
    if not isinstance(node, yaml.ScalarNode):
        raise YamlEditError(f"{'.'.join(path)}: expected a single value, found a collection")
    if _loaded(node) == value and type(_loaded(node)) is type(value):
        return None
    start, end = node.start_mark.index, node.end_mark.index
    if start == end:  # `key:` with nothing after the colon
        return Edit(start, end, " " + format_scalar(value))
    style = node.style if node.style in ("'", '"') else None
    if node.style in ("|", ">"):  # a block scalar's range runs to the next line: keep its line break
        return Edit(start, end, format_scalar(value) + newline_of(text))
    return Edit(start, end, format_scalar(value, style))


def set_list(text: str, root: yaml.Node, path: Sequence[str], value: list[Scalar]) -> Edit | None:
    """Edit that makes the value at ``path`` the flat list ``value`` (written as a flow sequence,
    whatever was there); None when it already holds it."""
    key_node, node = lookup(root, path)
    unshared(text, root, path)
    if isinstance(node, yaml.MappingNode):
        raise YamlEditError(f"{'.'.join(path)}: expected a list, found a mapping")
    if isinstance(node, yaml.SequenceNode) and _loaded(node) == value:
        return None
    start, end = node.start_mark.index, content_end(node)
    if isinstance(node, yaml.SequenceNode) and not node.flow_style and node.value and key_node is not None:
        # a block sequence starts on the next line: put the flow list right after `key:`
        start = text.index(":", key_node.end_mark.index) + 1
        return Edit(start, end, " " + format_value(value))
    if start == end:  # `key:` with nothing after the colon
        return Edit(start, end, " " + format_value(value))
    return Edit(start, end, format_value(value))


def set_mapping(text: str, root: yaml.Node, path: Sequence[str], values: dict[str, Value]) -> list[Edit]:
    """Edits that make the mapping at ``path`` hold ``values``: scalars updated in place, missing
    keys appended, the whole mapping appended to its parent when absent. Other keys are kept."""
    path = tuple(path)
    unshared(text, root, path)
    try:
        _, node = lookup(root, path)
    except KeyError:
        _, parent = lookup(root, path[:-1])
        return [_append_entry(text, root, parent, path[-1], values)]
    if not isinstance(node, yaml.MappingNode):
        raise YamlEditError(f"{'.'.join(path)}: expected a mapping")
    present = {k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)}
    edits = [e for k, v in values.items() if k in present
             if (e := (set_list if isinstance(v, list) else set_scalar)(text, root, path + (k,), v))]
    missing = {k: v for k, v in values.items() if k not in present}
    if missing:
        edits.append(_append_scalars(text, root, node, missing))
    return edits


def _append_entry(text: str, root: yaml.Node, parent: yaml.Node, key: str, values: dict[str, Value]) -> Edit:
    """Add ``key:`` holding a mapping of ``values`` at the end of mapping ``parent``."""
    if not isinstance(parent, yaml.MappingNode):
        raise YamlEditError(f"cannot add `{key}`: its parent is not a mapping")
    if parent.flow_style or not parent.value:
        return _flow_insert(text, parent, f"{format_scalar(key)}: {format_flow_mapping(values)}")
    indent = parent.value[0][0].start_mark.column
    step = indent_step(parent) or indent_step(root) or 2
    pos, prefix = _after_last_line(text, parent)
    return Edit(pos, pos, prefix + format_block_mapping(key, values, indent, step, newline_of(text)))


def _append_scalars(text: str, root: yaml.Node, node: yaml.MappingNode, values: dict[str, Value]) -> Edit:
    if node.flow_style or not node.value:
        return _flow_insert(text, node, ", ".join(f"{format_scalar(k)}: {format_value(v)}" for k, v in values.items()))
    nl, pad = newline_of(text), " " * node.value[0][0].start_mark.column
    pos, prefix = _after_last_line(text, node)
    return Edit(pos, pos, prefix + "".join(f"{pad}{format_scalar(k)}: {format_value(v)}{nl}" for k, v in values.items()))


def _flow_insert(text: str, node: yaml.MappingNode, entries: str) -> Edit:
    if not node.flow_style:
        raise YamlEditError("cannot add to an empty block mapping")
    if node.value:  # right after the last value, so `{ a: 1 }` becomes `{ a: 1, b: 2 }`
        pos = content_end(node.value[-1][1])
        return Edit(pos, pos, ", " + entries)
    close = text.rfind("}", node.start_mark.index, node.end_mark.index)
    return Edit(close, close, entries)


def _after_last_line(text: str, node: yaml.Node) -> tuple[int, str]:
    """Where a new line goes after ``node``'s last content line (past any trailing comment)."""
    pos = content_end(node)
    if pos > 0 and text[pos - 1] == "\n":
        return pos, ""
    nl = text.find("\n", pos)
    return (len(text), newline_of(text)) if nl < 0 else (nl + 1, "")


def content_end(node: yaml.Node) -> int:
    """End index of a node's own text. A block collection's end_mark lies at the next token, after
    the comments and blank lines that follow it, so descend to its last child instead."""
    if isinstance(node, yaml.ScalarNode) or node.flow_style or not node.value:
        return node.end_mark.index
    last = node.value[-1]
    return content_end(last[1] if isinstance(node, yaml.MappingNode) else last)


def indent_step(node: yaml.Node) -> int | None:
    """The indentation step used under ``node``: first block mapping nested in a block mapping."""
    if not isinstance(node, yaml.MappingNode) or node.flow_style or not node.value:
        return None
    for k, v in node.value:
        if isinstance(v, yaml.MappingNode) and not v.flow_style and v.value:
            step = v.value[0][0].start_mark.column - k.start_mark.column
            if step > 0:
                return step
        found = indent_step(v)
        if found:
            return found
    return None


def apply(text: str, edits: Iterable[Edit]) -> str:
    """Apply edits from the end backwards, so each one's indices still point at the original text."""
    ordered = sorted(edits, key=lambda e: (e.start, e.end), reverse=True)
    for later, earlier in zip(ordered, ordered[1:]):
        if earlier.end > later.start:
            raise YamlEditError(f"overlapping edits at {earlier.start}..{earlier.end} and {later.start}..{later.end}")
    for e in ordered:
        text = text[: e.start] + e.text + text[e.end :]
    return text


def verify(old_text: str, new_text: str, expected: dict[Path, Any]) -> None:
    """Check the edit at the data level: ``new_text`` loads to exactly ``old_text``'s data with each
    path in ``expected`` set to its value (a dict value is merged into the mapping there)."""
    want = copy.deepcopy(yaml.safe_load(old_text))
    for path, value in expected.items():
        parent = want
        for key in path[:-1]:
            parent = parent[key]
        if isinstance(value, dict) and isinstance(parent.get(path[-1]), dict):
            parent[path[-1]].update(value)
        else:
            parent[path[-1]] = value
    try:
        got = yaml.safe_load(new_text)
    except yaml.YAMLError as exc:
        raise YamlEditError(f"the edited YAML does not load: {exc}") from None
    if got != want:
        raise YamlEditError("the edited YAML does not hold the intended values")


def _loaded(node: yaml.ScalarNode) -> Any:
    value = yaml.constructor.SafeConstructor().construct_object(node, deep=True)
    return value.isoformat() if isinstance(value, (dt.date, dt.datetime)) else value
