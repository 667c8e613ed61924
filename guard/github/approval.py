"""Who accepted a pull request's budget change, read from GitHub at post time, never from the run.

A pull request that grows a function on purpose changes the budget file in vLLM's tree in the same
pull request (``guard update-thresholds --thresholds-in-repo``). Base's copy judges it until someone
entitled accepts the change; then head's copy judges and the status names who accepted. Two ways count:

- a **label** (``--accept-label``, default ``guard: accept``) on the pull request whose latest
  ``labeled`` event was made by someone with write permission on the repository (admin, maintain or
  write; GitHub's collaborator permission API). Anyone else's label is ignored and the comment says so;
- an **approving review of the head commit** by a **code owner** of the budget file: a user named on
  the last CODEOWNERS rule matching it (as the base branch has CODEOWNERS), or an active member of a
  team named there. A review of an older commit is stale.

Pure rules here (CODEOWNERS matching, the latest review per reviewer); the reads go through the
github3 client's session, so they share its token and retries (guard.github.client).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from guard.github.trust import Review
from guard.sanitize import one_line

DEFAULT_LABEL = "guard: accept"
WRITE_PERMISSIONS = ("admin", "maintain", "write")
CODEOWNERS_PATHS = (".github/CODEOWNERS", "CODEOWNERS", "docs/CODEOWNERS")  # where GitHub looks, in its order


@dataclass(frozen=True)
class Acceptance:
    """Head's budget copy judges: who said so, and how."""

    login: str
    how: str  # e.g. "label `guard: accept`, applied with write permission"

    def describe(self) -> str:
        return f"@{self.login} ({self.how})"


@dataclass(frozen=True)
class Refused:
    """An acceptance that did not count, and why (shown in the comment)."""

    login: str
    why: str


# ----------------------------------------------------------------------------- CODEOWNERS
def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A CODEOWNERS pattern (gitignore rules as GitHub documents them for CODEOWNERS) as a regex
    over a repository-relative path."""
    anchored = pattern.startswith("/") or "/" in pattern.rstrip("/")
    body = pattern.strip("/")
    directory = pattern.endswith("/")
    out = []
    i = 0
    while i < len(body):
        if body.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif body.startswith("**", i):
            out.append(".*")
            i += 2
        elif body[i] == "*":
            out.append("[^/]*")
            i += 1
        elif body[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(body[i]))
            i += 1
    core = "".join(out)
    prefix = "" if anchored else "(?:.*/)?"
    # a pattern names the path itself or, as a folder, everything under it
    tail = "/.*" if directory else "(?:/.*)?"
    return re.compile(f"^{prefix}{core}{tail}$")


def owners_of(codeowners: str, path: str) -> tuple[str, ...]:
    """The owners CODEOWNERS gives ``path``: those of the last rule that matches it."""
    owners: tuple[str, ...] = ()
    for raw in codeowners.splitlines():
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        pattern, *names = line.split()
        if _pattern_regex(pattern).match(path):
            owners = tuple(n for n in names if n.startswith("@"))
    return owners


# ----------------------------------------------------------------------------- reviews
def latest_reviews(reviews: list[Review]) -> dict[str, Review]:
    """Each reviewer's latest deciding review (approve, request changes, dismissed)."""
    latest: dict[str, Review] = {}
    for r in reviews:  # the API lists them oldest first
        if r.state in ("APPROVED", "CHANGES_REQUESTED", "DISMISSED"):
            latest[r.login.lower()] = r
    return latest


def codeowner_approval(reviews: list[Review], head: str, owners: tuple[str, ...], path: str,
                       in_team: Callable[[str, str], bool]) -> Acceptance | None:
    """An approving review of ``head`` by a code owner of ``path`` (``in_team(team, login)``: an
    active member of ``@org/team``)."""
    users = {o[1:].lower() for o in owners if "/" not in o}
    teams = [o[1:] for o in owners if "/" in o]
    for r in latest_reviews(reviews).values():
        if r.state != "APPROVED" or (r.commit_id or "").lower() != head.lower():
            continue
        if r.login.lower() in users:
            return Acceptance(r.login, f"approving review of {head[:12]}, code owner of {path}")
        for team in teams:
            if in_team(team, r.login):
                return Acceptance(r.login, f"approving review of {head[:12]}, member of @{team}, code owner of {path}")
    return None


# ----------------------------------------------------------------------------- the reads
class GitHubReads:
    """The few reads github3 has no public call for, through its session (token, retries)."""

    def __init__(self, gh: Any, api_url: str, owner: str, repo: str) -> None:
        self.session = gh.session
        self.api = api_url.rstrip("/")
        self.owner, self.repo = owner, repo

    def _get(self, path: str, **params: Any) -> Any:
        from guard.github.client import GitHubSideError

        resp = self.session.get(f"{self.api}{path}", params=params or None)
        if resp.status_code == 404:
            return None
        if resp.status_code >= 400:
            raise GitHubSideError(f"read {path}: GitHub answered {resp.status_code}")
        return resp

    def _pages(self, path: str) -> list[Any]:
        from guard.github.client import GitHubSideError

        out: list[Any] = []
        resp = self._get(path, per_page=100)
        while resp is not None:
            page = resp.json()
            if not isinstance(page, list):
                raise GitHubSideError(f"read {path}: not a list")
            out += page
            nxt = resp.links.get("next", {}).get("url")
            if not nxt:
                break
            resp = self.session.get(nxt)
            if resp.status_code >= 400:
                raise GitHubSideError(f"read {path}: GitHub answered {resp.status_code}")
        return out

    def labels(self, number: int) -> list[str]:
        return [str(x.get("name")) for x in self._pages(f"/repos/{self.owner}/{self.repo}/issues/{number}/labels")
                if isinstance(x, dict)]

    def label_events(self, number: int, label: str) -> list[tuple[str, str]]:
        """(event, actor) of each labeled/unlabeled event of ``label``, oldest first."""
        out = []
        for e in self._pages(f"/repos/{self.owner}/{self.repo}/issues/{number}/events"):
            if not isinstance(e, dict) or e.get("event") not in ("labeled", "unlabeled"):
                continue
            if (e.get("label") or {}).get("name") != label:
                continue
            out.append((str(e["event"]), str((e.get("actor") or {}).get("login") or "")))
        return out

    def permission(self, login: str) -> str:
        resp = self._get(f"/repos/{self.owner}/{self.repo}/collaborators/{login}/permission")
        data = resp.json() if resp is not None else {}
        return str(data.get("permission") or "none") if isinstance(data, dict) else "none"

    def in_team(self, team: str, login: str) -> bool:
        org, _, slug = team.partition("/")
        resp = self._get(f"/orgs/{org}/teams/{slug}/memberships/{login}")
        data = resp.json() if resp is not None else {}
        return isinstance(data, dict) and data.get("state") == "active"


def label_acceptance(reads: GitHubReads, number: int, label: str) -> tuple[Acceptance | None, Refused | None]:
    """The label, when it is on the pull request and whoever applied it last may write."""
    if label not in reads.labels(number):
        return None, None
    applied = [actor for event, actor in reads.label_events(number, label) if event == "labeled"]
    if not applied:
        return None, Refused("", f"label `{label}` is on the pull request but GitHub lists no event applying it")
    actor = applied[-1]
    permission = reads.permission(actor)
    if permission not in WRITE_PERMISSIONS:
        return None, Refused(actor, f"label `{label}` was applied by @{one_line(actor, 40)}, whose permission is "
                                    f"{one_line(permission, 20)}: only someone who may write to the repository accepts")
    return Acceptance(actor, f"label `{label}`, applied with {permission} permission"), None
