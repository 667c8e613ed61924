"""Reading a JSON-lines store line by line, as main's history (store.py) and shadow mode's findings
(findings.py) both keep one: each line strict JSON, one object, nothing guard cannot read, checked
against the store's schema; every problem a ConfigError naming the file, the line and the field."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from guard.errors import ConfigError
from guard.files import read_input
from guard.model.strictjson import first_refused, parse_strict_json


@lru_cache(maxsize=None)
def validator(schema_file: Path):
    import jsonschema

    return jsonschema.Draft202012Validator(json.loads(schema_file.read_text(encoding="utf-8")))


def field_path(parts: Iterable[Any], whole: str) -> str:
    """``census[0].calls``: a JSON path as the errors name it; ``whole`` when it is the line itself."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or whole


def schema_problem(schema_file: Path, d: Any, path: str, line: int | None, what: str, whole: str, hint: str) -> None:
    """ConfigError for the first schema violation of ``d`` (the best match jsonschema finds)."""
    import jsonschema

    error = jsonschema.exceptions.best_match(validator(schema_file).iter_errors(d))
    if error is not None:
        raise ConfigError(path, line, field_path(error.absolute_path, whole), f"not a {what}: {error.message}",
                          hint=hint)


def objects(text: str, path: str, *, noun: str, store: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each line of ``text``; ``noun`` is what a line is called in the
    messages ("record", "line"), ``store`` what the file is ("a history file")."""
    whole = f"({noun})"
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            raise ConfigError(path, n, "(line)", "an empty line", hint=f"each line of {store} is one record")
        try:
            d = parse_strict_json(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(path, n, "(syntax)", f"not valid JSON: {exc.msg} at column {exc.colno}") from None
        except (ValueError, RecursionError) as exc:
            raise ConfigError(path, n, "(content)", f"not a {noun} guard can read: {exc}") from None
        if (refused := first_refused(d)) is not None:
            raise ConfigError(path, n, field_path(refused[0], whole), f"not a {noun} guard can read: {refused[1]}")
        if not isinstance(d, dict):
            raise ConfigError(path, n, whole, "not a JSON object")
        yield n, d


def read_text(path: Path, missing_hint: str) -> str:
    """The store's text; ConfigError (naming the file) when it is missing, unreadable or not UTF-8."""
    try:
        raw = read_input(path)
    except FileNotFoundError:
        raise ConfigError(str(path), None, "(file)", "no such file", hint=missing_hint) from None
    except OSError as exc:
        raise ConfigError(str(path), None, "(file)", f"cannot read: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(str(path), None, "(file)", "not UTF-8 text") from None
