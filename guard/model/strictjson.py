"""JSON as guard writes it, read strictly: results.json and run.json, the census baseline and each
line of the history and findings stores are parsed here. What guard never writes (NaN, Infinity, a
number beyond ``MAX_MAGNITUDE``, a key given twice) is kept in place while parsing and refused by
the reader after (``first_refused`` says where), so that its error can name the field's JSON path."""

from __future__ import annotations

import json
import math
from typing import Any

# Larger than any count, time, size or seed guard records; numbers beyond it are damage, and near
# the float limit they overflow the arithmetic and charts that read them.
MAX_MAGNITUDE = 10**18


class _Refused:
    """Where the text had NaN, Infinity, a number beyond MAX_MAGNITUDE or a key given twice: kept
    while parsing, so the error can name the field's JSON path, then refused (guard writes strict
    JSON only)."""

    def __init__(self, text: str, problem: str) -> None:
        self.text, self.problem = text, problem


def _constant(name: str) -> _Refused:
    return _Refused(name, f"{name} is not a number guard writes")


def _finite_float(text: str) -> float | _Refused:
    value = float(text)
    if math.isfinite(value) and abs(value) < MAX_MAGNITUDE:
        return value
    return _Refused(text, f"{text[:40]} is out of range")


def _bounded_int(text: str) -> int | _Refused:
    if len(text.lstrip("-")) > len(str(MAX_MAGNITUDE)):  # before int(): 5000 digits cost, then refuse
        return _Refused(text, f"{text[:40]}... ({len(text)} digits) is out of range")
    value = int(text)
    return value if abs(value) < MAX_MAGNITUDE else _Refused(text, f"{text} is out of range")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each given once: json would keep the last of two silently."""
    d: dict[str, Any] = {}
    for k, v in pairs:
        d[k] = _Refused(k, f"the key {k!r} is given twice in one object") if k in d else v
    return d


def parse_strict_json(text: str) -> Any:
    """JSON as guard writes it; what guard never writes (NaN, Infinity, numbers beyond
    MAX_MAGNITUDE, a key given twice) is marked in place: ``first_refused`` says where."""
    return json.loads(text, parse_constant=_constant, parse_float=_finite_float, parse_int=_bounded_int,
                      object_pairs_hook=_unique_keys)


def first_refused(data: Any) -> tuple[list[str | int], str] | None:
    """The JSON path of the first value ``parse_strict_json`` marked, in document order, and why
    (iterative: a deep file is no recursion)."""
    stack: list[tuple[list[str | int], Any]] = [([], data)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, _Refused):
            return where, node.problem
        if isinstance(node, dict):
            stack += [([*where, k], v) for k, v in reversed(node.items())]
        elif isinstance(node, list):
            stack += [([*where, i], v) for i, v in reversed(list(enumerate(node)))]
    return None


def json_path(parts: Any) -> str:
    """``run.outcomes[3].index``: a JSON path as guard's errors name it."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"
