"""The files a judged run leaves for people and for the later commands: results.json and report.md."""

from __future__ import annotations

from pathlib import Path

from guard.errors import UsageError
from guard.files import write_text_atomic
from guard.model.jsonfiles import results_to_dict, write_json_atomic
from guard.model.results import Results
from guard.report.markdown import render_markdown


def write_report(results: Results, output: Path, thresholds: str | None = None) -> None:
    """results.json and report.md; ``thresholds``: the budget file as the user named it, for report.md's recipes."""
    for name, write in (("results.json", lambda p: write_json_atomic(p, results_to_dict(results))),
                        ("report.md", lambda p: write_text_atomic(p, render_markdown(results, thresholds=thresholds)))):
        try:
            write(output / name)
        except OSError as exc:  # the disk filled up during the run
            raise UsageError(f"cannot write {output / name}: {exc.strerror or exc}",
                             hint="free some space or pass another --output folder") from None
