"""Text from outside guard (a results.json artifact, a pull request's file names, GitHub's replies)
made safe to print in a workflow log.

The Actions runner reads any stdout/stderr line that starts with ``::`` as a workflow command
(``::error``, ``::add-mask``, ``::stop-commands``...). A string from a pull request's artifact that
carries ``"\\n::error title=x::y"`` would, printed raw, become a command in the privileged job. So:

- ``one_line``: newlines and other control characters shown as escapes; one line in, one out
  (``clipped``: the same, cut to a length with what was cut said);
- ``no_workflow_commands``: every line that would start a workflow command (after the leading
  whitespace the runner skips) is prefixed with ``| ``, so it is printed, never executed.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029]")
_COMMAND_LINE = re.compile(r"^(\s*)(::)", re.MULTILINE)


def one_line(value: object, limit: int | None = 500) -> str:
    text = _CONTROL.sub(lambda m: {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(m.group(), f"\\x{ord(m.group()):02x}"),
                        str(value))
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text.replace("::", ":\u200b:") if text.lstrip().startswith("::") else text


def clipped(value: object, limit: int = 600) -> str:
    """``one_line`` that says how much it cut: an exception from vLLM can quote a whole prompt, and a
    reason is read in a terminal line, a comment and results.json."""
    text = one_line(value, None)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def no_workflow_commands(text: str) -> str:
    """Each line that the runner would parse as a command, defused; other lines unchanged."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _COMMAND_LINE.sub(r"\1| \2", text)
