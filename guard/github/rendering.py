"""What guard posts on a pull request, as text: the comment and the commit status.

The comment is the report under a hidden marker line (which model and profile it is for, so a later
run finds and edits it), trimmed to GitHub's size limit, or the short note it becomes once its
findings are gone. The status is one line per model and profile. No API calls here: posting them is
guard.github.publish.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from guard.model import format as fmt
from guard.model.records import Verdict
from guard.model.results import Results
from guard.report.markdown import render_markdown, text

MARKER_VERSION = 1  # bump only with a migration: old comments are found by this exact text
COMMENT_LIMIT = 65536  # GitHub rejects a longer issue-comment body ("body is too long")
STATUS_DESCRIPTION_LIMIT = 140  # GitHub's limit for a commit status description
ALL_MODELS = ("auto", "all")  # a run of every model the pull request concerns: one status, guard/<profile>

_SLUG = re.compile(r"[^A-Za-z0-9._-]")


def slug(value: str) -> str:
    return _SLUG.sub("_", str(value)) or "_"


def marker(model: str, profile: str) -> str:
    """The hidden first line that identifies guard's comment for one model and profile.

    Versioned on its own (not with guard's version), so an upgraded guard still finds and edits the
    comment an older one wrote. Values are slugged: they come from results.json and must not be able
    to close the HTML comment.
    """
    return f"<!-- guard:v{MARKER_VERSION} model={slug(model)} profile={slug(profile)} -->"


def trim_body(body: str, limit: int = COMMENT_LIMIT) -> str:
    """Cut a too-long body at a line, close what the cut left open, and say so (never reject it)."""
    if len(body) <= limit:
        return body
    note = (f"\n\n> [!NOTE]\n> **Report trimmed:** it was {len(body)} characters, over GitHub's {limit}-character "
            "limit for a comment. The full report is in the workflow run's job summary and in the `guard-results` "
            "artifact (report.md).\n")
    room = limit - len(note) - 64  # 64: the closing fence and </details> tags added below
    cut = body.rfind("\n", 0, room)
    kept = body[: cut if cut > 0 else room]
    closers = []
    lines = kept.splitlines()
    if sum(1 for ln in lines if ln.startswith("```")) % 2:
        closers.append("```")
    open_details = sum(ln.startswith("<details") for ln in lines) - sum(ln.startswith("</details>") for ln in lines)
    # a run of unclosed <details> is bounded by the renderer's nesting (never more than one)
    closers += ["", "</details>"] * max(0, min(open_details, 3))
    trimmed = kept + "\n" + "\n".join(closers) + note
    return trimmed if len(trimmed) <= limit else trimmed[:limit]


def comment_body(results: Results, *, run_url: str | None = None, report: str | None = None) -> str:
    """The marker line, then the report (rendered from results.json unless one is given)."""
    text = report if report is not None else render_markdown(results, run_url=run_url)
    return trim_body(f"{marker(results.run.model, results.run.profile)}\n{text}")


RESOLVED_HEADING = "## ✅ guard: findings resolved"  # a comment whose second line starts so says nothing more


def resolved_body(mark: str, sha: str, summary: str) -> str:
    """What the comment becomes, once, when a later run of the pull request has no finding: short,
    so the thread does not keep a stale regression report; the verdict lives on in the status."""
    return (f"{mark}\n{RESOLVED_HEADING} in `{sha[:12]}`\n\nThe findings this comment reported are gone in the run "
            f"of `{sha[:12]}`: {text(summary)}.\n")


def is_resolved(body: str) -> bool:
    lines = body.replace("\r\n", "\n").split("\n", 2)
    return len(lines) > 1 and lines[1].startswith(RESOLVED_HEADING)


@dataclass(frozen=True)
class CommitStatus:
    state: str  # "success" | "failure" | "error"
    context: str  # "guard/<model>/<profile>": one status per model and profile
    description: str
    target_url: str | None = None


def clip(s: str, limit: int) -> str:
    s = " ".join(s.split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def commit_status(results: Results, run_url: str | None = None) -> CommitStatus:
    n = len(results.judged)
    if results.verdict == Verdict.PASS and results.pr is not None and not results.pr.measured:
        state, desc = "success", "not measured: the pull request changes nothing under vllm/"
    elif results.verdict == Verdict.PASS:
        state, desc = "success", f"all {n} budgets held"
    elif results.verdict == Verdict.REGRESSION:
        names = ", ".join(fmt.label(c) for c in results.failed)
        state, desc = "failure", f"{len(results.failed)} of {n} budgets exceeded: {names}"
    elif results.verdict == Verdict.NOT_MEASURABLE:  # neutral: the GPU job, not this runner, judges compiled code
        files = len(results.pr.unmeasured_files) if results.pr else 0
        state, desc = "success", f"not measurable here: {files} file(s) of compiled code or dependencies changed; {n} measured budgets held"
    else:  # invalid, or a verdict this guard does not know: never report it as a pass
        first = results.invalid_reasons[0].text if results.invalid_reasons else f"verdict {results.verdict!r}"
        state, desc = "error", f"invalid run: {first}"
    return CommitStatus(state=state, context=f"guard/{slug(results.run.model)}/{slug(results.run.profile)}",
                        description=clip(desc, STATUS_DESCRIPTION_LIMIT), target_url=run_url)


def no_results_status(model: str, profile: str, reason: str, run_url: str | None = None, *,
                      requested: bool = True) -> CommitStatus:
    """The status of a model x profile with no results. ``requested``: its measuring run was asked
    for and left nothing (cancelled, timed out, failed before writing results.json): ``error``,
    never a missing status a branch rule waits on. Not requested (the A10 run without its label):
    ``success`` saying it did not run."""
    state, desc = ("error", f"no results: {reason}") if requested else ("success", f"not run: {reason}")
    context = f"guard/{slug(profile)}" if model in ALL_MODELS else f"guard/{slug(model)}/{slug(profile)}"
    return CommitStatus(state=state, context=context,
                        description=clip(desc, STATUS_DESCRIPTION_LIMIT), target_url=run_url)
