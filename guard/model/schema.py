"""results.json's schema, run.json's and ab-run.json's: their names and versions, the JSON Schema shipped beside
this module (``results.schema.json``), and the check of a parsed file against it, whose first error
names the JSON path of the bad value."""

from __future__ import annotations

import json
from dataclasses import fields
from functools import lru_cache
from pathlib import Path
from typing import Any

from guard.errors import ConfigError
from guard.model.strictjson import json_path

RESULTS_SCHEMA = "guard/results"
RUN_SCHEMA = "guard/run"  # the run stage's hand-off file (run.json)
AB_RUN_SCHEMA = "guard/ab-run"  # an A/B run stage's hand-off file (ab-run.json): both sides' records
RESULTS_SCHEMA_VERSION = 3  # 3: invalid reasons are {"kind", "text"} objects (2: strings)
READABLE_SCHEMA_VERSIONS = (2, RESULTS_SCHEMA_VERSION)  # a v2 file is upgraded on reading (guard.model.upgrade)
SCHEMA_FILE = Path(__file__).with_name("results.schema.json")


@lru_cache(maxsize=1)
def results_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))


def validate(data: Any, path: Path, schema_name: str) -> None:
    """Check a parsed file against the shipped JSON Schema; the first error names the JSON path."""
    import jsonschema

    schema = results_schema()
    if schema_name == RUN_SCHEMA:  # run.json holds the ``run`` object of results.json
        schema = {"$schema": schema["$schema"], "$defs": schema["$defs"], "type": "object",
                  "required": ["schema", "schema_version", "run"],
                  "properties": {"schema": {"const": RUN_SCHEMA}, "schema_version": {"const": RESULTS_SCHEMA_VERSION},
                                 "run": {"$ref": "#/$defs/run"}}, "additionalProperties": False}
    elif schema_name == AB_RUN_SCHEMA:  # ab-run.json holds a ``run`` object per side
        schema = {"$schema": schema["$schema"], "$defs": schema["$defs"], "type": "object",
                  "required": ["schema", "schema_version", "candidate", "baseline", "baseline_python", "order"],
                  "properties": {"schema": {"const": AB_RUN_SCHEMA}, "schema_version": {"const": RESULTS_SCHEMA_VERSION},
                                 "candidate": {"$ref": "#/$defs/run"}, "baseline": {"$ref": "#/$defs/run"},
                                 "baseline_python": {"type": "string"},
                                 "order": {"type": "array", "items": {"enum": ["candidate", "baseline"]}},
                                 "duration_s": {"type": ["number", "null"]}},
                  "additionalProperties": False}
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is not None:
        raise ConfigError(str(path), None, json_path(error.absolute_path), f"not a valid {schema_name} file: {error.message}",
                          hint="results files are written by `guard check`; re-run it rather than editing one")


def field_names(cls: type) -> list[str]:
    """A record's field names, for the schema test."""
    return [f.name for f in fields(cls)]
