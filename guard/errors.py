"""Exit codes and the one exception family for expected failures.

Library code raises; only ``guard.cli`` turns an exception into a message and an exit code.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    PASS = 0  # every budget held
    REGRESSION = 1  # the run was valid and a budget was exceeded
    CONFIG = 2  # bad usage, bad thresholds YAML, bad results file, GitHub token missing
    INVALID = 3  # the run itself cannot be trusted: engine died, request errored, no samples
    GITHUB = 4  # guard comment: GitHub kept failing after retries; says nothing about performance
    INTERNAL = 5  # a bug in guard or a library it drives: an unexpected exception, never a verdict
    NOT_MEASURABLE = 6  # guard pr: the pull request changed compiled code or dependencies, which this runner cannot measure


class GuardError(Exception):
    """An expected failure with a message for people and an exit code."""

    exit_code: ExitCode = ExitCode.CONFIG

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        text = super().__str__()
        return f"{text}\nhint: {self.hint}" if self.hint else text


class UsageError(GuardError):
    exit_code = ExitCode.CONFIG


class ConfigError(GuardError):
    """A thresholds file (or other input file) is wrong; the message names file, line and key."""

    exit_code = ExitCode.CONFIG

    def __init__(self, path: str, line: int | None, key: str, problem: str, *, hint: str | None = None) -> None:
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {key}: {problem}", hint=hint)
        self.path, self.line, self.key, self.problem = path, line, key, problem


class InvalidRunError(GuardError):
    """The measurement broke or cannot be trusted; never reported as pass or regression."""

    exit_code = ExitCode.INVALID
