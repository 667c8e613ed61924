"""The GitHub client: github3.py with bounded retries, and what a failed call means for guard.

Every call goes through ``call``: a 401 is a usage error (exit 2), a 403 that is not a rate limit
is ``Forbidden`` (the caller decides: a warning for a post, exit 2 for a read), and anything else
GitHub keeps failing at is ``GitHubSideError`` (exit 4), never a change to the perf verdict.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import github3
import requests
from github3 import exceptions as gh_exc
from github3.session import GitHubSession

from guard.errors import ExitCode, GuardError, UsageError
from guard.sanitize import one_line

DEFAULT_API_URL = "https://api.github.com"
API_VERSION = "2022-11-28"

T = TypeVar("T")


class GitHubSideError(GuardError):
    """GitHub failed (after retries): nothing to do with the perf verdict."""

    exit_code = ExitCode.GITHUB


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


class Forbidden(Exception):
    """A 403 that is not a rate limit: the token may not write here (a fork PR's read-only token)."""

    def __init__(self, what: str, err: gh_exc.GitHubError) -> None:
        super().__init__(f"GitHub refused to {what} (403 {err.msg})")
        self.what, self.err = what, err


def call(what: str, fn: Callable[[], T], *, not_found: str | None = None) -> T:
    """Run one GitHub call, turning github3's exceptions into guard's (or into Forbidden)."""
    try:
        return fn()
    except gh_exc.AuthenticationFailed as err:
        raise UsageError(f"{what}: GitHub rejected the token (401 {err.msg})",
                         hint="check GITHUB_TOKEN; it may be expired or for another host than GITHUB_API_URL") from None
    except gh_exc.ForbiddenError as err:
        if _rate_limited(err.response):
            raise GitHubSideError(f"{what}: still rate limited after retries (403 {err.msg})") from None
        raise Forbidden(what, err) from None
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


def cannot_read(f: Forbidden) -> UsageError:
    """A 403 on a read: even a fork PR's read-only token reads the repository and its pull requests,
    so this token lacks what the workflow must grant; nothing could be posted (exit 2, not a warning)."""
    return UsageError(f"{f}: the token may not even read here, so nothing was posted",
                      hint="grant the workflow `permissions: pull-requests: write, statuses: write` (reads come with "
                           "them), or give a token with access to this repository")


def read(what: str, fn: Callable[[], T]) -> T:
    """A read the post depends on (files, reviews, budgets): a refusal means nothing can be posted."""
    try:
        return call(what, fn)
    except Forbidden as f:
        raise cannot_read(f) from None
