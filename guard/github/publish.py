"""Results -> the pull request: sticky comment, commit status, job summary, workflow annotations.

The last stage of the pipeline and the only one that talks to GitHub (through github3.py). It never
changes the perf verdict: publishing either works, warns (a read-only token), or fails with its own
error (``GitHubSideError``, exit 4). Library code: it returns what happened; ``guard comment`` prints.

Inputs that come from a pull request's run (the artifact: results.json, the PR number and head SHA
files) are data to check, never trusted: ``parse_pr_number``/``parse_sha`` are strict, and
``verify_head`` refuses a PR whose head is not the commit that was measured.
"""

from __future__ import annotations

import email.utils
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import github3
import requests
from github3 import exceptions as gh_exc
from github3.session import GitHubSession

from guard.model import format as fmt
from guard.errors import ExitCode, GuardError, UsageError
from guard.files import read_input
from guard.sanitize import one_line
from guard.report.markdown import render_markdown, text
from guard.model.records import Results, Verdict
from guard.github.trust import (ChangedFile, Review, TrustPolicy, approver, notice_markdown, protected_changes,
                         thresholds_change_lines)

MARKER_VERSION = 1  # bump only with a migration: old comments are found by this exact text
COMMENT_LIMIT = 65536  # GitHub rejects a longer issue-comment body ("body is too long")
SUMMARY_LIMIT = 250_000  # characters; GitHub takes 1 MiB per step summary, and a character is up to 4 bytes
STATUS_DESCRIPTION_LIMIT = 140  # GitHub's limit for a commit status description
DEFAULT_API_URL = "https://api.github.com"
ALL_MODELS = ("auto", "all")  # a run of every model the pull request concerns: one status, guard/<profile>
DEFAULT_AUTHOR = "github-actions[bot]"  # whom GITHUB_TOKEN posts as
API_VERSION = "2022-11-28"

_SLUG = re.compile(r"[^A-Za-z0-9._-]")
_PR_NUMBER = re.compile(r"[1-9][0-9]{0,9}")
_SHA = re.compile(r"[0-9a-fA-F]{40}")
_REPO = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")
_MAX_PR_NUMBER = 2**31 - 1

T = TypeVar("T")


class GitHubSideError(GuardError):
    """GitHub failed (after retries): nothing to do with the perf verdict."""

    exit_code = ExitCode.GITHUB


# ----------------------------------------------------------------------------- what to post
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


# ----------------------------------------------------------------------------- job summary, annotations
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


# ----------------------------------------------------------------------------- strict inputs
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


# ----------------------------------------------------------------------------- the client
@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries for 5xx, 429 and rate-limited 403 replies and dropped connections."""

    attempts: int = 4  # tries per request, the first included
    base_s: float = 1.0  # backoff: base, 2 x base, 4 x base, ...
    max_wait_s: float = 60.0  # a Retry-After longer than this is not sat out in CI: give up instead
    sleep: Callable[[float], None] = time.sleep  # injectable, so tests neither wait nor guess

    def backoff(self, attempt: int) -> float:
        return self.base_s * 2 ** (attempt - 1)


def _retry_reason(resp: requests.Response) -> str | None:
    if resp.status_code == 429:
        return "429 rate limited"
    if resp.status_code in (500, 502, 503, 504):
        return f"{resp.status_code} server error"
    if resp.status_code == 403 and _rate_limited(resp):
        return "403 rate limited"
    return None


def _rate_limited(resp: requests.Response) -> bool:
    # GitHub answers 403 for both "not allowed" and secondary rate limits; only the latter say when to retry
    return "Retry-After" in resp.headers or resp.headers.get("X-RateLimit-Remaining") == "0"


def _retry_after(resp: requests.Response) -> float | None:
    value = resp.headers.get("Retry-After")
    if value is not None:
        try:
            return max(0.0, float(value))
        except ValueError:
            try:
                return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
            except (TypeError, ValueError):
                return None
    reset = resp.headers.get("X-RateLimit-Reset")
    if resp.headers.get("X-RateLimit-Remaining") == "0" and reset and reset.isdigit():
        return max(0.0, int(reset) - time.time())
    return None


class RetryingSession(GitHubSession):
    """github3's session with bounded retries; what was retried is kept in ``retries`` for the report.

    A retried POST can in rare cases create a comment twice (the first try landed, its reply did
    not); the next run's duplicate clean-up removes the extra one.
    """

    def __init__(self, policy: RetryPolicy) -> None:
        super().__init__()
        self.policy = policy
        self.retries: list[str] = []

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        for attempt in range(1, self.policy.attempts + 1):
            last = attempt == self.policy.attempts
            try:
                resp = super().request(method, url, *args, **kwargs)
            except (requests.ConnectionError, requests.Timeout) as exc:
                if last:
                    raise
                why, wait = type(exc).__name__, self.policy.backoff(attempt)
            else:
                why = _retry_reason(resp)
                if why is None or last:
                    return resp
                wait = _retry_after(resp)
                if wait is None:
                    wait = self.policy.backoff(attempt)
                elif wait > self.policy.max_wait_s:
                    self.retries.append(f"{method} {url}: {why}; Retry-After {wait:.0f} s is too long, giving up")
                    return resp
            self.retries.append(f"{method} {url}: {why}; retry {attempt} of {self.policy.attempts - 1} "
                                f"in {wait:.2f} s")
            self.policy.sleep(wait)
        raise AssertionError("unreachable")  # the loop returns or raises on its last attempt


def github_client(token: str, api_url: str = DEFAULT_API_URL, *, retry: RetryPolicy | None = None) -> github3.GitHub:
    """A github3 client for github.com or GitHub Enterprise Server, with retries.

    GITHUB_API_URL is already the API root on both (``https://api.github.com``,
    ``https://HOST/api/v3``), while ``github3.GitHubEnterprise(url)`` appends ``/api/v3`` itself; so
    the plain client is used and its session's ``base_url`` set to the API root as given. That also
    lets tests point it at a local server.
    """
    session = RetryingSession(retry or RetryPolicy())
    gh = github3.GitHub(token=token, session=session, api_version=API_VERSION)
    session.base_url = api_url.rstrip("/")
    return gh


# ----------------------------------------------------------------------------- publishing
class _Forbidden(Exception):
    """A 403 that is not a rate limit: the token may not write here (a fork PR's read-only token)."""

    def __init__(self, what: str, err: gh_exc.GitHubError) -> None:
        super().__init__(f"GitHub refused to {what} (403 {err.msg})")
        self.what, self.err = what, err


def _call(what: str, fn: Callable[[], T], *, not_found: str | None = None) -> T:
    """Run one GitHub call, turning github3's exceptions into guard's (or into _Forbidden)."""
    try:
        return fn()
    except gh_exc.AuthenticationFailed as err:
        raise UsageError(f"{what}: GitHub rejected the token (401 {err.msg})",
                         hint="check GITHUB_TOKEN; it may be expired or for another host than GITHUB_API_URL") from None
    except gh_exc.ForbiddenError as err:
        if _rate_limited(err.response):
            raise GitHubSideError(f"{what}: still rate limited after retries (403 {err.msg})") from None
        raise _Forbidden(what, err) from None
    except gh_exc.NotFoundError as err:
        if not_found:
            raise UsageError(not_found) from None
        raise GitHubSideError(f"{what}: GitHub answered {err.code} {err.msg}") from None
    except gh_exc.UnprocessableResponseBody as err:  # a reply of the wrong shape (it has no status code)
        raise GitHubSideError(f"{what}: GitHub's answer had an unexpected shape: {one_line(str(err.msg))[:200]}") from None
    except gh_exc.GitHubError as err:
        raise GitHubSideError(f"{what}: GitHub answered {getattr(err, 'code', '?')} {err.msg}") from None
    except gh_exc.GitHubException as err:  # connection errors, malformed replies
        raise GitHubSideError(f"{what}: {type(err).__name__}: {err}") from None
    except (KeyError, TypeError) as err:  # github3 reading a reply that lacks what it expects
        raise GitHubSideError(f"{what}: GitHub's answer had an unexpected shape ({type(err).__name__}: {err})") from None


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
    listed = _call("list the PR's comments", lambda: [c for c in pr.issue_comments() if _is_ours(c, mark, author)])
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
        _call("edit the comment", lambda: keep.edit(body))
        report.comment = "resolved"
    report.comment_url = keep.html_url
    for c in ours[1:]:
        _call(f"delete duplicate comment {c.id}", c.delete)
        report.deleted.append(c.id)


def _upsert_comment(pr: Any, mark: str, body: str, author: str, report: PublishReport) -> None:
    """Edit our comment in place (the oldest, so it keeps its place), create it if absent,
    delete our stale duplicates. Other authors' comments are never touched, whatever they say."""
    ours = _ours(pr, mark, author)
    if not ours:
        created = _call("create the comment", lambda: pr.create_comment(body))
        report.comment, report.comment_url = "created", getattr(created, "html_url", None)
        return
    keep, stale = ours[0], ours[1:]
    if _same(keep.body or "", body):
        report.comment = "unchanged"
    else:
        _call("edit the comment", lambda: keep.edit(body))
        report.comment = "updated"
    report.comment_url = keep.html_url
    for c in stale:
        _call(f"delete duplicate comment {c.id}", c.delete)
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

    return _call("list the pull request's files", read)


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
    return _call("list the pull request's reviews", lambda: [
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
        new_text = _call("read the pull request's thresholds file",
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


def _cannot_read(f: _Forbidden) -> UsageError:
    """A 403 on a read: even a fork PR's read-only token reads the repository and its pull requests,
    so this token lacks what the workflow must grant; nothing could be posted (exit 2, not a warning)."""
    return UsageError(f"{f}: the token may not even read here, so nothing was posted",
                      hint="grant the workflow `permissions: pull-requests: write, statuses: write` (reads come with "
                           "them), or give a token with access to this repository")


def open_pull_request(gh: github3.GitHub, *, owner: str, repo: str, number: int, sha: str | None = None,
                      verify: bool = False, expected_head_repo: str | None = None) -> Any:
    """The pull request, read through the API, its head verified as the measured commit when asked.
    UsageError (exit 2) for a PR that does not exist or does not match what was measured."""
    try:
        pr = _call(f"read pull request #{number} of {owner}/{repo}", lambda: gh.pull_request(owner, repo, number),
                   not_found=f"{owner}/{repo} has no pull request #{number} (or the token cannot see it)")
    except _Forbidden as f:
        raise _cannot_read(f) from None
    if pr is None:
        raise UsageError(f"{owner}/{repo} has no pull request #{number}")
    if verify or expected_head_repo is not None:
        if sha is None:
            raise UsageError("verifying the PR needs the SHA that was measured (--sha or --sha-file)")
        verify_head(pr, sha, expected_head_repo)
    return pr


def read(what: str, fn: Callable[[], T]) -> T:
    """A read the post depends on (files, reviews, budgets): a refusal means nothing can be posted."""
    try:
        return _call(what, fn)
    except _Forbidden as f:
        raise _cannot_read(f) from None


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
        _call(f"set the commit status on {head[:12]}", lambda: base.create_status(
            head, status.state, target_url=status.target_url, description=status.description,
            context=status.context))
        report.status, report.status_sha = status, head

    for step in (comment, set_status):  # one failing must not keep the other from being tried
        try:
            step()
        except _Forbidden as f:
            report.forbidden.append(str(f))
        except GitHubSideError as err:
            report.errors.append(str(err))
    return _with_retries(report, gh)


def publish_status(gh: github3.GitHub, *, owner: str, repo: str, sha: str, status: CommitStatus) -> PublishReport:
    """Only the commit status, on ``sha`` (a trusted SHA: the triggering run's head), for a
    measuring run that left no results, so there is no PR number from an artifact and no comment."""
    report = PublishReport()
    try:
        repository = _call(f"read {owner}/{repo}", lambda: gh.repository(owner, repo),
                           not_found=f"{owner}/{repo} does not exist (or the token cannot see it)")
    except _Forbidden as f:
        raise _cannot_read(f) from None
    except GitHubSideError as err:
        report.errors.append(str(err))
        return _with_retries(report, gh)
    try:
        _call(f"set the commit status on {sha[:12]}", lambda: repository.create_status(
            sha, status.state, target_url=status.target_url, description=status.description, context=status.context))
        report.status, report.status_sha = status, sha
    except _Forbidden as f:
        report.forbidden.append(str(f))
    except GitHubSideError as err:
        report.errors.append(str(err))
    return _with_retries(report, gh)


def superseded(gh: github3.GitHub, *, owner: str, repo: str, run: EventTarget) -> tuple[str | None, str | None]:
    """(why the cancelled run needs no status, or None; what kept guard from telling, or None).
    A lookup GitHub refused or failed means "not known to be superseded": the error is posted."""
    try:
        return _superseded(gh, owner=owner, repo=repo, run=run), None
    except (_Forbidden, GitHubSideError, UsageError) as err:
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
    repository = _call(f"read {owner}/{repo}", lambda: gh.repository(owner, repo),
                       not_found=f"{owner}/{repo} does not exist (or the token cannot see it)")
    if run.head_repo and run.head_branch:
        head_owner = run.head_repo.split("/")[0]
        prs = _call("list the run's pull requests", lambda: [
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
        later = _call("list the measuring workflow's runs", newer)
        if later:
            return f"run #{max(r['run_number'] for r in later)} of the same commit replaced it and posts"
    return None


def _with_retries(report: PublishReport, gh: github3.GitHub) -> PublishReport:
    report.retries = list(getattr(gh.session, "retries", []))
    return report
