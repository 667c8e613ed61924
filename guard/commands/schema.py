"""Print the budget file's JSON Schema, or write the copy guard ships.

The schema is generated from the tables guard reads budget files by (guard.config.schema), so an
editor that validates a budget file with it agrees with guard on every key and type.
``guard schema --write`` rewrites guard/config/budgets.schema.json (a test keeps that copy current);
``guard schema --output FILE`` writes it elsewhere. Point an editor at it with a first line such as
``# yaml-language-server: $schema=<path or URL of budgets.schema.json>`` (docs/budgets.md).
Checks a value's relations to other keys (a fallback dtype only beside bfloat16, the decidability of
a percentile within ``max_requests``) are guard's own: ``guard check`` and ``guard pr`` refuse a file
the schema admits when those fail, naming file, line and key.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from guard.config.schema import SCHEMA_FILE, render
from guard.errors import ExitCode
from guard.files import write_text_atomic, writing


def add_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--write", action="store_true", help=f"rewrite the shipped copy ({SCHEMA_FILE.name} in guard/config)")
    where.add_argument("--output", metavar="FILE", default=None, help="write the schema to FILE instead of printing it")


def run(args: argparse.Namespace) -> int:
    text = render()
    target = SCHEMA_FILE if args.write else Path(args.output) if args.output else None
    if target is None:
        sys.stdout.write(text)
        return ExitCode.PASS
    with writing(target, "--output" if args.output else ""):
        write_text_atomic(target, text)
    print(f"guard schema: wrote {target}")
    return ExitCode.PASS
