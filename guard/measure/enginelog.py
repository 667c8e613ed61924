"""What the engine test suite costs, counted: with ``$GUARD_ENGINE_LOG`` naming a file, every engine
start and every request guard sends appends one JSON line to it (benchmarks/engine_budget.py adds
them up per test). ``$GUARD_ENGINE_LOG_TEST`` labels the lines; tests/conftest.py sets it to the
running test's id. Unset (always, outside that measurement): nothing is written. No imports beyond
the standard library: a worker beside a foreign vLLM imports it."""

from __future__ import annotations

import json
import os
import time

ENV = "GUARD_ENGINE_LOG"
TEST_ENV = "GUARD_ENGINE_LOG_TEST"


def note(event: str, **fields: object) -> None:
    """One line: ``event`` is "start" (an engine or `vllm serve` came up, or failed to) or
    "request" (one request answered; ``label`` "profiled" for the profile pass)."""
    path = os.environ.get(ENV)
    if not path:
        return
    line = {"event": event, "t": round(time.time(), 3), "pid": os.getpid(), "test": os.environ.get(TEST_ENV, ""),
            **fields}
    try:
        with open(path, "a", encoding="utf-8") as f:  # one short append per line: whole lines across processes
            f.write(json.dumps(line) + "\n")
    except OSError:
        pass  # a counting aid never breaks a run
