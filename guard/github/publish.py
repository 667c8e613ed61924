"""Results -> the pull request: the comment and the commit status, through GitHub's API.

The last stage of the pipeline. It never changes the perf verdict: publishing either works, warns
(a read-only token), or fails with its own error (``GitHubSideError``, exit 4). Library code: it
returns what happened; ``guard comment`` prints. The pull request is read first and its head
verified as the measured commit (``verify_head``); guard's own comment is found by its marker line
and author, and edited in place. What the comment and status say is guard.github.rendering; the
client, its retries and error mapping are guard.github.client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import github3
from github3 import exceptions as gh_exc

from guard.errors import UsageError
from guard.github.client import Forbidden, GitHubSideError, call, cannot_read
from guard.github.inputs import EventTarget
from guard.github.rendering import STATUS_DESCRIPTION_LIMIT, CommitStatus, clip, is_resolved, resolved_body, trim_body
from guard.github.trust import (ChangedFile, Review, TrustPolicy, approver, notice_markdown, protected_changes,
                                thresholds_change_lines)

DEFAULT_AUTHOR = "github-actions[bot]"  # whom GITHUB_TOKEN posts as

READ_ONLY_EXPLANATION = (
    "The token may not write here. That is what a workflow triggered by a pull request from a fork gets, "
    "and why the comment and status are posted by the separate perf-guard-comment workflow (workflow_run), "
    "which has a write token. Publishing is best-effort and never changes the perf verdict, so this exits 0.")


@dataclass
class PublishReport:
    """What ``publish`` did, for the command to print. ``errors`` non-empty means exit 4."""

    pr_url: str | None = None
    # "created" | "updated" | "unchanged" (a finding); "resolved" (edited once: no finding now) |
    # "left resolved" | None (no finding, no comment of ours: nothing posted)
    comment: str | None = None
    comment_url: str | None = None
    deleted: list[int] = field(default_factory=list)  # stale duplicates removed
    status: CommitStatus | None = None
    status_sha: str | None = None
    forbidden: list[str] = field(default_factory=list)  # 403s: what GitHub refused (read-only token)
    errors: list[str] = field(default_factory=list)
    retries: list[str] = field(default_factory=list)
    protected: list[str] = field(default_factory=list)  # changed files in places guard trusts
    approved: bool = False  # ... and a maintainer approved the head commit in a review


def verify_head(pr: Any, sha: str, expected_head_repo: str | None) -> None:
    """Refuse unless the PR's head is exactly the commit (and repository) that was measured."""
    head_sha = (pr.head.sha or "").lower()
    if head_sha != sha.lower():
        raise UsageError(
            f"pull request #{pr.number} has head {head_sha}, not {sha}: refusing to post. Either the PR "
            "moved on since the run (a newer run will post) or the artifact names another PR.")
    if expected_head_repo is not None:
        repo = getattr(pr.head, "repository", None)
        actual = getattr(repo, "full_name", None)
        if actual is None or actual.lower() != expected_head_repo.lower():
            raise UsageError(f"pull request #{pr.number} comes from {actual or '(a deleted repository)'}, "
                             f"not {expected_head_repo}: refusing to post")


def _is_ours(comment: Any, mark: str, author: str) -> bool:
    """Ours: written by the token's identity AND starting with the marker line. Another comment by
    the same bot that merely quotes the marker further down (an older tool, a reply) is not ours."""
    login = getattr(comment.user, "login", "") or ""
    body = (comment.body or "").lstrip("\ufeff")
    first = body.split("\n", 1)[0].rstrip("\r")
    return login.lower() == author.lower() and first == mark


def _same(a: str, b: str) -> bool:
    return a.replace("\r\n", "\n").rstrip() == b.replace("\r\n", "\n").rstrip()


def _ours(pr: Any, mark: str, author: str) -> list[Any]:
    listed = call("list the PR's comments", lambda: [c for c in pr.issue_comments() if _is_ours(c, mark, author)])
    return sorted(listed, key=lambda c: c.id)


def _resolve_comment(pr: Any, mark: str, body: str, author: str, report: PublishReport) -> None:
    """No finding: post nothing; but a comment of ours that still reports findings is edited once
    to say they are resolved. One already saying so is left alone by every later clean run."""
    ours = _ours(pr, mark, author)
    if not ours:
        return
    keep = ours[0]
    if is_resolved(keep.body or ""):
        report.comment = "left resolved"
    else:
        call("edit the comment", lambda: keep.edit(body))
        report.comment = "resolved"
    report.comment_url = keep.html_url
    for c in ours[1:]:
        call(f"delete duplicate comment {c.id}", c.delete)
        report.deleted.append(c.id)


def _upsert_comment(pr: Any, mark: str, body: str, author: str, report: PublishReport) -> None:
    """Edit our comment in place (the oldest, so it keeps its place), create it if absent,
    delete our stale duplicates. Other authors' comments are never touched, whatever they say."""
    ours = _ours(pr, mark, author)
    if not ours:
        created = call("create the comment", lambda: pr.create_comment(body))
        report.comment, report.comment_url = "created", getattr(created, "html_url", None)
        return
    keep, stale = ours[0], ours[1:]
    if _same(keep.body or "", body):
        report.comment = "unchanged"
    else:
        call("edit the comment", lambda: keep.edit(body))
        report.comment = "updated"
    report.comment_url = keep.html_url
    for c in stale:
        call(f"delete duplicate comment {c.id}", c.delete)
        report.deleted.append(c.id)


def pr_changed_files(pr: Any) -> list[ChangedFile]:
    """The pull request's changed files, through the API (all pages)."""
    def read() -> list[ChangedFile]:
        out = []
        for f in pr.files():
            raw = f.as_dict()
            prev = raw.get("previous_filename")
            out.append(ChangedFile(str(f.filename), str(f.status), prev if isinstance(prev, str) else None))
        return out

    return call("list the pull request's files", read)


def file_at(repo: Any, path: str, ref: str) -> str | None:
    """A file's text at a commit (None when it does not exist there)."""
    try:
        contents = repo.file_contents(path, ref=ref)
    except gh_exc.NotFoundError:
        return None
    except gh_exc.GitHubError as err:
        raise GitHubSideError(f"read {path} at {ref[:12]}: GitHub answered {err.code} {err.msg}") from None
    if contents is None or contents.decoded is None:
        return None
    data = contents.decoded if isinstance(contents.decoded, bytes) else str(contents.decoded).encode()
    return data.decode("utf-8", errors="replace")


def pr_reviews(pr: Any) -> list[Review]:
    return call("list the pull request's reviews", lambda: [
        Review(login=str(getattr(r.user, "login", "") or ""), state=str(r.state), commit_id=r.commit_id,
               association=str(r.author_association)) for r in pr.reviews()])


def apply_trust(pr: Any, head: str, body: str, status: CommitStatus, policy: TrustPolicy,
                report: PublishReport, *, files: list[ChangedFile] | None = None,
                reviews: list[Review] | None = None) -> tuple[str, CommitStatus]:
    """When the PR changes what guard trusts, say so in the comment (right under the marker line)
    and make the status ``error`` unless a maintainer approved the head commit in a review.
    ``files``/``reviews``: the PR's, when the caller has read them already."""
    changed = protected_changes(pr_changed_files(pr) if files is None else files, policy)
    report.protected = [f.filename for f in changed]
    if not changed:
        return body, status
    lines: list[str] = []
    if any(policy.thresholds_path in (f.filename, f.previous_filename) for f in changed):
        new_text = call("read the pull request's thresholds file",
                         lambda: file_at(pr.base.repository, policy.thresholds_path, head))
        lines = thresholds_change_lines(policy, new_text)
    approved_by = approver(pr_reviews(pr) if reviews is None else reviews, head, policy)
    report.approved = approved_by is not None
    notice = notice_markdown(changed, lines, approved_by, head)
    first, _, rest = body.partition("\n")
    new_body = trim_body(f"{first}\n{notice}\n{rest}")
    if approved_by:
        return new_body, status
    names = ", ".join(f.filename for f in changed[:3]) + (" ..." if len(changed) > 3 else "")
    return new_body, CommitStatus(state="error", context=status.context, target_url=status.target_url,
                                  description=clip(f"needs a run approved by a maintainer: this PR changes {names}",
                                                    STATUS_DESCRIPTION_LIMIT))


def open_pull_request(gh: github3.GitHub, *, owner: str, repo: str, number: int, sha: str | None = None,
                      verify: bool = False, expected_head_repo: str | None = None) -> Any:
    """The pull request, read through the API, its head verified as the measured commit when asked.
    UsageError (exit 2) for a PR that does not exist or does not match what was measured."""
    try:
        pr = call(f"read pull request #{number} of {owner}/{repo}", lambda: gh.pull_request(owner, repo, number),
                   not_found=f"{owner}/{repo} has no pull request #{number} (or the token cannot see it)")
    except Forbidden as f:
        raise cannot_read(f) from None
    if pr is None:
        raise UsageError(f"{owner}/{repo} has no pull request #{number}")
    if verify or expected_head_repo is not None:
        if sha is None:
            raise UsageError("verifying the PR needs the SHA that was measured (--sha or --sha-file)")
        verify_head(pr, sha, expected_head_repo)
    return pr


def publish(gh: github3.GitHub, *, owner: str, repo: str, number: int, mark: str, body: str,
            status: CommitStatus, sha: str | None = None, author: str = DEFAULT_AUTHOR, verify: bool = False,
            expected_head_repo: str | None = None, trust: TrustPolicy | None = None,
            finding: bool = True, summary: str = "") -> PublishReport:
    """Fetch the PR, (verify its head,) then set the comment and the status on the head SHA.

    ``finding`` (findings.has_finding): the comment is created or edited in place. Without one
    nothing is posted but the status, except that a comment of ours still showing findings is
    edited once to say they are resolved (``summary``: the run's one line). A PR that changes what
    guard trusts, unapproved, is a finding whatever the results say: its comment lists the files.

    Raises UsageError (exit 2) for a PR that does not exist or does not match what was measured.
    GitHub failures of the comment and of the status are collected in ``errors`` (both are tried),
    403s in ``forbidden``.
    """
    report = PublishReport()
    pr = open_pull_request(gh, owner=owner, repo=repo, number=number, sha=sha, verify=verify,
                           expected_head_repo=expected_head_repo)
    head = (sha or pr.head.sha).lower()  # the PR's head commit, never the merge commit
    if trust is not None:  # before anything is posted: a PR that edits guard cannot vouch for itself
        body, status = apply_trust(pr, head, body, status, trust, report)
        finding = finding or (bool(report.protected) and not report.approved)
    return post(gh, pr, head=head, mark=mark, body=body, status=status, author=author, finding=finding,
                summary=summary, report=report)


def post(gh: github3.GitHub, pr: Any, *, head: str, mark: str, body: str, status: CommitStatus,
         author: str = DEFAULT_AUTHOR, finding: bool = True, summary: str = "",
         report: PublishReport | None = None) -> PublishReport:
    """The comment (or its resolution) and the status on ``head`` of an opened pull request."""
    report = report or PublishReport()
    report.pr_url = pr.html_url

    def comment() -> None:
        if finding:
            _upsert_comment(pr, mark, body, author, report)
        else:
            _resolve_comment(pr, mark, resolved_body(mark, head, summary), author, report)

    def set_status() -> None:
        base = pr.base.repository
        call(f"set the commit status on {head[:12]}", lambda: base.create_status(
            head, status.state, target_url=status.target_url, description=status.description,
            context=status.context))
        report.status, report.status_sha = status, head

    for step in (comment, set_status):  # one failing must not keep the other from being tried
        try:
            step()
        except Forbidden as f:
            report.forbidden.append(str(f))
        except GitHubSideError as err:
            report.errors.append(str(err))
    return _with_retries(report, gh)


def publish_status(gh: github3.GitHub, *, owner: str, repo: str, sha: str, status: CommitStatus) -> PublishReport:
    """Only the commit status, on ``sha`` (a trusted SHA: the triggering run's head), for a
    measuring run that left no results, so there is no PR number from an artifact and no comment."""
    report = PublishReport()
    try:
        repository = call(f"read {owner}/{repo}", lambda: gh.repository(owner, repo),
                           not_found=f"{owner}/{repo} does not exist (or the token cannot see it)")
    except Forbidden as f:
        raise cannot_read(f) from None
    except GitHubSideError as err:
        report.errors.append(str(err))
        return _with_retries(report, gh)
    try:
        call(f"set the commit status on {sha[:12]}", lambda: repository.create_status(
            sha, status.state, target_url=status.target_url, description=status.description, context=status.context))
        report.status, report.status_sha = status, sha
    except Forbidden as f:
        report.forbidden.append(str(f))
    except GitHubSideError as err:
        report.errors.append(str(err))
    return _with_retries(report, gh)


def superseded(gh: github3.GitHub, *, owner: str, repo: str, run: EventTarget) -> tuple[str | None, str | None]:
    """(why the cancelled run needs no status, or None; what kept guard from telling, or None).
    A lookup GitHub refused or failed means "not known to be superseded": the error is posted."""
    try:
        return _superseded(gh, owner=owner, repo=repo, run=run), None
    except (Forbidden, GitHubSideError, UsageError) as err:
        return None, str(err)


def _superseded(gh: github3.GitHub, *, owner: str, repo: str, run: EventTarget) -> str | None:
    """Why a cancelled measuring run needs no status (a newer run will post), or None.

    Only for ``conclusion == "cancelled"``, and only from what GitHub wrote in the workflow_run
    event (never the artifact): superseded when the pull request(s) of the run's head branch have
    moved on to another head commit, or when a newer run of the same measuring workflow exists for
    the same head commit (a label added to the PR starts one, and the concurrency group cancels the
    older). It can only withhold an ``error`` the newer run replaces; anything unclear posts it.
    """
    if run.conclusion != "cancelled" or run.sha is None:
        return None
    sha = run.sha.lower()
    repository = call(f"read {owner}/{repo}", lambda: gh.repository(owner, repo),
                       not_found=f"{owner}/{repo} does not exist (or the token cannot see it)")
    if run.head_repo and run.head_branch:
        head_owner = run.head_repo.split("/")[0]
        prs = call("list the run's pull requests", lambda: [
            p for p in repository.pull_requests(state="open", head=f"{head_owner}:{run.head_branch}")
            if (getattr(getattr(p.head, "repository", None), "full_name", "") or "").lower() == run.head_repo.lower()])
        heads = {(p.head.sha or "").lower() for p in prs}
        if prs and sha not in heads:
            numbers = ", ".join(f"#{p.number}" for p in prs)
            return (f"pull request {numbers} moved on to {', '.join(sorted(h[:12] for h in heads))}; "
                    "the run of its new head posts")
    if run.workflow_id is not None and run.run_number is not None:
        def newer() -> list[dict[str, Any]]:
            url = repository._build_url("actions", "workflows", str(run.workflow_id), "runs", base_url=repository._api)
            data = repository._json(repository._get(url, params={"head_sha": sha, "per_page": 100}), 200) or {}
            return [r for r in data.get("workflow_runs") or [] if isinstance(r, dict)
                    and isinstance(r.get("run_number"), int) and r["run_number"] > run.run_number
                    and r.get("event") == "pull_request" and (r.get("head_sha") or "").lower() == sha]
        later = call("list the measuring workflow's runs", newer)
        if later:
            return f"run #{max(r['run_number'] for r in later)} of the same commit replaced it and posts"
    return None


def _with_retries(report: PublishReport, gh: github3.GitHub) -> PublishReport:
    report.retries = list(getattr(gh.session, "retries", []))
    return report
