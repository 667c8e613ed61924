"""Which pull request and commit to post on, read strictly.

Inputs that come from a pull request's run (the artifact: results.json, the PR number and head SHA
files) are data to check, never trusted: ``parse_pr_number``/``parse_sha`` are strict, and
guard.github.publish.verify_head refuses a PR whose head is not the commit that was measured. The
Actions event payload is written by the runner; its fields are still checked for type.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from guard.errors import UsageError
from guard.files import read_input

_PR_NUMBER = re.compile(r"[1-9][0-9]{0,9}")
_SHA = re.compile(r"[0-9a-fA-F]{40}")
_REPO = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")
_MAX_PR_NUMBER = 2**31 - 1


def parse_pr_number(raw: str, *, source: str = "PR number") -> int:
    """Digits only, positive, at most 10 digits; one trailing newline allowed (a file written by echo)."""
    s = raw[:-1] if raw.endswith("\n") else raw
    if not _PR_NUMBER.fullmatch(s) or int(s) > _MAX_PR_NUMBER:
        raise UsageError(f"{source}: {raw[:40]!r} is not a pull-request number "
                         "(ASCII digits only, no sign, no spaces, no leading zero, at most 10 digits)")
    return int(s)


def parse_sha(raw: str, *, source: str = "commit SHA") -> str:
    """A full 40-hex commit SHA; one trailing newline allowed. Returned lower-case."""
    s = raw[:-1] if raw.endswith("\n") else raw
    if not _SHA.fullmatch(s):
        raise UsageError(f"{source}: {raw[:60]!r} is not a full 40-character hexadecimal commit SHA")
    return s.lower()


def parse_repository(raw: str, *, source: str = "repository") -> tuple[str, str]:
    if not _REPO.fullmatch(raw or ""):
        raise UsageError(f"{source}: {raw!r} is not OWNER/NAME")
    owner, name = raw.split("/")
    return owner, name


def read_small_file(path: str | Path, *, what: str, limit: int = 128) -> str:
    """The artifact's tiny text files: bounded size, ASCII, or a clear error."""
    try:
        data = read_input(path, limit)
    except OSError as exc:
        raise UsageError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise UsageError(f"{what}: {path} is longer than {limit} bytes; refusing it")
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        raise UsageError(f"{what}: {path} is not ASCII text; refusing it") from None


@dataclass(frozen=True)
class EventTarget:
    """What the Actions event payload says about the PR, all optional."""

    pr: int | None = None
    sha: str | None = None
    head_repo: str | None = None
    # workflow_run only: the measuring run that finished, to tell a cancelled run superseded by a newer one
    conclusion: str | None = None
    run_id: int | None = None
    run_number: int | None = None
    workflow_id: int | None = None
    head_branch: str | None = None


def target_from_event(path: str | Path) -> EventTarget:
    """PR number, head SHA and head repository from $GITHUB_EVENT_PATH (written by the runner).

    pull_request(_target): the PR itself. workflow_run: the run's head SHA and head repository;
    its ``pull_requests`` list is empty for fork PRs, so the number may have to come from the artifact.
    """
    try:
        event = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"GITHUB_EVENT_PATH: cannot read the event payload {path}: {exc}") from None
    except RecursionError:
        raise UsageError(f"GITHUB_EVENT_PATH: the event payload {path} is nested too deeply") from None
    if not isinstance(event, dict):
        raise UsageError(f"GITHUB_EVENT_PATH: the event payload {path} is not a JSON object")

    def obj(d: Any, key: str) -> dict[str, Any]:
        v = d.get(key) if isinstance(d, dict) else None
        return v if isinstance(v, dict) else {}

    def typed(v: Any, t: type) -> Any:
        return v if isinstance(v, t) and not isinstance(v, bool) else None

    pr = event.get("pull_request")
    if isinstance(pr, dict):
        head = obj(pr, "head")
        return EventTarget(pr=typed(pr.get("number"), int), sha=typed(head.get("sha"), str),
                           head_repo=typed(obj(head, "repo").get("full_name"), str))
    run = event.get("workflow_run")
    if isinstance(run, dict):
        prs = [p for p in run.get("pull_requests") or [] if isinstance(p, dict)] \
            if isinstance(run.get("pull_requests"), list) else []
        return EventTarget(pr=typed(prs[0].get("number"), int) if len(prs) == 1 else None,
                           sha=typed(run.get("head_sha"), str),
                           head_repo=typed(obj(run, "head_repository").get("full_name"), str),
                           conclusion=typed(run.get("conclusion"), str), run_id=typed(run.get("id"), int),
                           run_number=typed(run.get("run_number"), int),
                           workflow_id=typed(run.get("workflow_id"), int),
                           head_branch=typed(run.get("head_branch"), str))
    return EventTarget()
