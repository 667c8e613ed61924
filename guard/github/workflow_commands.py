"""The workflow run's own outputs: workflow commands (annotations) in the log, and the job summary."""

from __future__ import annotations

from pathlib import Path

from guard.model import format as fmt
from guard.model.results import Results

SUMMARY_LIMIT = 250_000  # characters; GitHub takes 1 MiB per step summary, and a character is up to 4 bytes


def escape_data(s: str) -> str:
    """Workflow-command message escaping, as the Actions runner decodes it."""
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(s: str) -> str:
    """Workflow-command property escaping (title=...): also ':' and ','."""
    return escape_data(s).replace(":", "%3A").replace(",", "%2C")


def workflow_command(kind: str, message: str, **props: str) -> str:
    attrs = ",".join(f"{k}={escape_property(v)}" for k, v in props.items())
    return f"::{kind}{' ' + attrs if attrs else ''}::{escape_data(message)}"


def annotations(results: Results) -> list[str]:
    """One ::error per failed check and per invalid reason; notices as ::notice."""
    where = f"{results.run.model} / {results.run.profile}"
    out = []
    for c in results.failed:
        out.append(workflow_command("error", f"{fmt.failure(c)} ({where})", title=f"guard: {fmt.label(c)} over budget"))
    out += [workflow_command("error", f"{r} ({where})", title="guard: invalid run") for r in results.invalid_reasons]
    out += [workflow_command("notice", n, title="guard notice") for n in results.notices]
    return out


def append_step_summary(path: str | Path, markdown: str) -> None:
    """Append to $GITHUB_STEP_SUMMARY (other steps may have written there first)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(markdown if markdown.endswith("\n") else markdown + "\n")
