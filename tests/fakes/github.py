"""A small GitHub for tests: the REST endpoints `guard comment` uses, with state, served over real
HTTP by pytest-httpserver, so the real github3.py client talks to it and tests assert what ended up
on the "pull request", not which functions were called."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from werkzeug import Request, Response

from guard.github import rendering

OWNER, REPO = "acme", "guarded"
TOKEN = "ghs_test_token"
HEAD = "a" * 40  # PR #7's head commit: where the status must go
MERGE = "b" * 40  # PR #7's test merge commit: where it must not
OTHER = "c" * 40  # PR #8's head
FORK = "contrib/guarded"
MARK = "<!-- guard:v1 model=deepseek-ocr-2 profile=a10 -->"
BOT = "github-actions[bot]"
WRITES = {"POST", "PATCH", "DELETE", "PUT"}


# ----------------------------------------------------------------------------- a small GitHub
@dataclasses.dataclass
class Call:
    method: str
    path: str
    query: dict[str, str]
    body: Any


class FakeGitHub:
    """The REST endpoints guard comment uses, with state. Replies carry absolute URLs back to this
    server, as GitHub's do, because github3 follows them. Like GitHub it rejects bodies over 65536
    characters and status descriptions over 140."""

    def __init__(self, server, prefix: str = "") -> None:
        self.prefix = prefix
        self.base = server.url_for("/").rstrip("/") + prefix
        self.pulls = {7: (HEAD, FORK, MERGE), 8: (OTHER, FORK, "d" * 40)}
        self.comments: dict[int, list[dict]] = {7: [], 8: []}
        self.statuses: list[tuple[str, dict]] = []
        self.log: list[Call] = []
        self.faults: list[tuple[str, str, int, dict[str, str]]] = []  # consumed first-match, in order
        self.read_only = False
        self.next_id = 1000
        self.files: dict[int, list[dict]] = {7: [], 8: []}  # the PR's changed files (GitHub's shape, below)
        self.reviews: dict[int, list[dict]] = {7: [], 8: []}
        self.contents: dict[tuple[str, str], str] = {}  # (path, ref) -> text, for the contents API
        self.runs: dict[int, list[dict]] = {}  # workflow id -> its runs (Actions API), as add_run makes them
        self.labels: dict[int, list[str]] = {7: [], 8: []}  # the labels on each pull request now
        self.events: dict[int, list[dict]] = {7: [], 8: []}  # its issue events (labeled / unlabeled)
        self.permissions: dict[str, str] = {}  # login -> admin | write | read | none (collaborator permission API)
        self.teams: dict[str, set[str]] = {}  # "org/slug" -> its active members
        server.expect_request(re.compile(".*")).respond_with_handler(self.handle)

    # --- state helpers
    def add_comment(self, number: int, login: str, body: str) -> int:
        self.next_id += 1
        self.comments[number].append({"id": self.next_id, "login": login, "body": body})
        return self.next_id

    def change(self, number: int, filename: str, status: str = "modified", previous: str | None = None) -> None:
        u = f"{self.base}/repos/{OWNER}/{REPO}"
        f = {"sha": "f" * 40, "filename": filename, "status": status, "additions": 1, "deletions": 1, "changes": 2,
             "blob_url": f"{u}/blob/x/{filename}", "raw_url": f"{u}/raw/x/{filename}",
             "contents_url": f"{u}/contents/{filename}?ref=x", "patch": "@@ -1 +1 @@"}
        if previous is not None:
            f["previous_filename"] = previous
        self.files[number].append(f)

    def review(self, number: int, login: str, state: str, commit: str, association: str) -> None:
        u = f"{self.base}/repos/{OWNER}/{REPO}/pulls/{number}"
        self.next_id += 1
        self.reviews[number].append({"id": self.next_id, "node_id": "PRR", "user": self.user(login), "body": "",
                                     "body_html": "", "body_text": "", "state": state, "commit_id": commit,
                                     "author_association": association, "html_url": f"{u}#review",
                                     "pull_request_url": u, "submitted_at": "2025-01-01T00:00:00Z"})

    def label(self, number: int, name: str, actor: str, event: str = "labeled") -> None:
        """``actor`` applies (or removes) label ``name``, as GitHub records it in the issue's events."""
        self.next_id += 1
        self.events[number].append({"id": self.next_id, "event": event, "actor": self.user(actor),
                                    "label": {"name": name, "color": "ededed"}, "commit_id": None,
                                    "created_at": "2026-12-01T00:00:00Z"})
        if event == "labeled" and name not in self.labels[number]:
            self.labels[number].append(name)
        elif event == "unlabeled" and name in self.labels[number]:
            self.labels[number].remove(name)

    def add_run(self, workflow_id: int, run_number: int, head_sha: str, conclusion: str | None = None,
                head_repo: str = FORK, event: str = "pull_request") -> dict:
        """A workflow run of the measuring workflow, in the shape of GET .../actions/workflows/N/runs."""
        self.next_id += 1
        run = {"id": self.next_id, "run_number": run_number, "workflow_id": workflow_id, "head_sha": head_sha,
               "head_branch": "x", "event": event, "status": "completed" if conclusion else "in_progress",
               "conclusion": conclusion, "head_repository": {"full_name": head_repo}}
        self.runs.setdefault(workflow_id, []).append(run)
        return run

    def fail(self, method: str, path: str, status: int, times: int = 1, **headers: str) -> None:
        self.faults += [(method, path, status, headers, None)] * times

    def misshape(self, method: str, path: str, body: Any, status: int = 200) -> None:
        """Answer the next matching request with ``body``, whatever shape GitHub's would have."""
        self.faults.append((method, path, status, {}, body))

    def writes(self) -> list[Call]:
        return [c for c in self.log if c.method in WRITES]

    # --- JSON in GitHub's shapes (every key github3 reads)
    def user(self, login: str) -> dict:
        u = f"{self.base}/users/{login}"
        return {"login": login, "id": abs(hash(login)) % 10**6, "node_id": "U", "avatar_url": f"{u}/avatar",
                "gravatar_id": "", "url": u, "html_url": u, "followers_url": f"{u}/followers",
                "following_url": f"{u}/following{{/other_user}}", "gists_url": f"{u}/gists{{/gist_id}}",
                "starred_url": f"{u}/starred{{/owner}}{{/repo}}", "subscriptions_url": f"{u}/subscriptions",
                "organizations_url": f"{u}/orgs", "repos_url": f"{u}/repos", "events_url": f"{u}/events{{/privacy}}",
                "received_events_url": f"{u}/received_events", "type": "Bot" if login.endswith("[bot]") else "User",
                "site_admin": False}

    def repo(self, full_name: str) -> dict:
        owner, name = full_name.split("/")
        u = f"{self.base}/repos/{full_name}"
        tmpl = {k: f"{u}/{k.removesuffix('_url')}{{/x}}" for k in (
            "archive_url", "assignees_url", "blobs_url", "branches_url", "collaborators_url", "comments_url",
            "commits_url", "compare_url", "contents_url", "contributors_url", "deployments_url", "downloads_url",
            "events_url", "forks_url", "git_commits_url", "git_refs_url", "git_tags_url", "hooks_url",
            "issue_comment_url", "issue_events_url", "issues_url", "keys_url", "labels_url", "languages_url",
            "merges_url", "milestones_url", "notifications_url", "pulls_url", "releases_url", "stargazers_url",
            "subscribers_url", "subscription_url", "tags_url", "teams_url", "trees_url")}
        tmpl["statuses_url"] = f"{u}/statuses/{{sha}}"
        return {**tmpl, "id": abs(hash(full_name)) % 10**6, "node_id": "R", "name": name, "full_name": full_name,
                "owner": self.user(owner), "private": False, "fork": full_name != f"{OWNER}/{REPO}",
                "description": None, "url": u, "html_url": f"https://github.example/{full_name}"}

    def full_repo(self, full_name: str) -> dict:
        """GET /repos/{owner}/{repo}: the short form plus the fields of GitHub's full repository."""
        u = f"https://github.example/{full_name}"
        return {**self.repo(full_name), "archived": False, "clone_url": f"{u}.git", "created_at": "2026-01-01T00:00:00Z",
                "default_branch": "main", "forks_count": 0, "git_url": f"git://github.example/{full_name}.git",
                "has_downloads": True, "has_issues": True, "has_pages": False, "has_projects": False, "has_wiki": False,
                "homepage": None, "language": "Python", "mirror_url": None, "network_count": 0, "open_issues_count": 2,
                "pushed_at": "2026-12-01T00:00:00Z", "size": 1, "ssh_url": f"git@github.example:{full_name}.git",
                "stargazers_count": 0, "subscribers_count": 0, "svn_url": u, "updated_at": "2026-12-01T00:00:00Z",
                "watchers_count": 0}

    def pull(self, number: int) -> dict:
        head_sha, head_repo, merge_sha = self.pulls[number]
        u = f"{self.base}/repos/{OWNER}/{REPO}"
        comments = f"{u}/issues/{number}/comments"
        ref = {"label": "x", "ref": "x", "user": self.user("contrib")}
        return {
            "url": f"{u}/pulls/{number}", "id": number, "number": number, "state": "open", "locked": False,
            "title": "Speed up the mask", "user": self.user("contrib"), "body": None, "body_html": None,
            "body_text": None, "created_at": "2025-01-01T00:00:00Z", "updated_at": "2025-01-01T00:00:00Z",
            "closed_at": None, "merged_at": None, "merge_commit_sha": merge_sha, "assignee": None,
            "assignees": [], "requested_reviewers": [], "requested_teams": [], "active_lock_reason": None,
            "html_url": f"https://github.example/{OWNER}/{REPO}/pull/{number}", "diff_url": "d", "patch_url": "p",
            "issue_url": f"{u}/issues/{number}", "commits_url": f"{u}/pulls/{number}/commits",
            "review_comments_url": f"{u}/pulls/{number}/comments", "review_comment_url": f"{u}/pulls/comments{{/number}}",
            "comments_url": comments, "statuses_url": f"{u}/statuses/{head_sha}",
            "head": {**ref, "sha": head_sha, "repo": self.repo(head_repo)},
            "base": {**ref, "sha": "e" * 40, "repo": self.repo(f"{OWNER}/{REPO}")},
            "_links": {"comments": {"href": comments}, "self": {"href": f"{u}/pulls/{number}"}},
            "author_association": "CONTRIBUTOR", "draft": False, "merged": False, "mergeable": True,
            "mergeable_state": "clean", "merged_by": None, "comments": len(self.comments[number]),
            "review_comments": 0, "commits": 1, "additions": 1, "deletions": 1,
        }

    def comment(self, number: int, c: dict) -> dict:
        u = f"{self.base}/repos/{OWNER}/{REPO}/issues"
        return {"id": c["id"], "node_id": "C", "url": f"{u}/comments/{c['id']}", "body": c["body"],
                "body_html": "", "body_text": c["body"], "user": self.user(c["login"]),
                "html_url": f"https://github.example/{OWNER}/{REPO}/pull/{number}#issuecomment-{c['id']}",
                "issue_url": f"{u}/{number}", "author_association": "NONE",
                "created_at": "2025-01-01T00:00:00Z", "updated_at": "2025-01-01T00:00:00Z"}

    # --- routing
    def handle(self, req: Request) -> Response:
        if not req.path.startswith(self.prefix):
            return self.reply({"message": "Not Found"}, 404)
        path = req.path[len(self.prefix):]
        body = req.get_json(silent=True)
        self.log.append(Call(req.method, path, dict(req.args), body))
        for i, (method, pattern, status, headers, reply) in enumerate(self.faults):
            if method == req.method and re.fullmatch(pattern, path):
                del self.faults[i]
                return self.reply({"message": f"injected {status}"} if reply is None else reply, status, headers)
        if req.headers.get("Authorization") != f"token {TOKEN}":
            return self.reply({"message": "Bad credentials"}, 401)
        if self.read_only and req.method in WRITES:
            return self.reply({"message": "Resource not accessible by integration"}, 403)
        repo = f"/repos/{OWNER}/{REPO}"
        if path == repo and req.method == "GET":  # guard comment --no-results reaches the status API through it
            return self.reply(self.full_repo(f"{OWNER}/{REPO}"))
        if path == f"{repo}/pulls" and req.method == "GET":  # open PRs, filtered by head "owner:branch"
            want = req.args.get("head")
            found = [self.pull(n) for n in sorted(self.pulls)
                     if want is None or want == f"{self.pulls[n][1].split('/')[0]}:x"]
            return self.reply(found)
        if (m := re.fullmatch(rf"{repo}/actions/workflows/(\d+)/runs", path)) and req.method == "GET":
            runs = [r for r in self.runs.get(int(m[1]), []) if req.args.get("head_sha") in (None, r["head_sha"])]
            return self.reply({"total_count": len(runs), "workflow_runs": runs})
        if m := re.fullmatch(rf"{repo}/pulls/(\d+)", path):
            n = int(m[1])
            return self.reply(self.pull(n)) if req.method == "GET" and n in self.pulls else self.reply({}, 404)
        if (m := re.fullmatch(rf"{repo}/pulls/(\d+)/files", path)) and req.method == "GET":
            per_page, page = int(req.args.get("per_page", 30)), int(req.args.get("page", 1))
            items = self.files[int(m[1])]
            last = max(1, -(-len(items) // per_page))
            url = f"{self.base}{path}?per_page={per_page}&page="
            links = [f'<{url}{page + 1}>; rel="next"', f'<{url}{last}>; rel="last"'] if page < last else []
            return self.reply(items[(page - 1) * per_page: page * per_page],
                              headers={"Link": ", ".join(links)} if links else {})
        if (m := re.fullmatch(rf"{repo}/pulls/(\d+)/reviews", path)) and req.method == "GET":
            return self.reply(self.reviews[int(m[1])])
        if (m := re.fullmatch(rf"{repo}/contents/(.+)", path)) and req.method == "GET":
            text = self.contents.get((m[1], req.args.get("ref", "")))
            if text is None:
                return self.reply({"message": "Not Found"}, 404)
            import base64
            u = f"{self.base}{path}"
            return self.reply({"type": "file", "encoding": "base64", "size": len(text), "name": m[1].rsplit("/", 1)[-1],
                               "path": m[1], "content": base64.b64encode(text.encode()).decode(), "sha": "0" * 40,
                               "url": u, "git_url": u, "html_url": u, "download_url": u,
                               "_links": {"self": u, "git": u, "html": u}})
        if (m := re.fullmatch(rf"{repo}/issues/(\d+)/labels", path)) and req.method == "GET":
            return self.reply([{"id": i, "name": n, "color": "ededed"} for i, n in enumerate(self.labels[int(m[1])])])
        if (m := re.fullmatch(rf"{repo}/issues/(\d+)/events", path)) and req.method == "GET":
            return self.reply(self.events[int(m[1])])
        if (m := re.fullmatch(rf"{repo}/collaborators/([^/]+)/permission", path)) and req.method == "GET":
            if m[1] not in self.permissions:
                return self.reply({"message": "Not Found"}, 404)
            return self.reply({"permission": self.permissions[m[1]], "user": self.user(m[1])})
        if (m := re.fullmatch(r"/orgs/([^/]+)/teams/([^/]+)/memberships/([^/]+)", path)) and req.method == "GET":
            if m[3] not in self.teams.get(f"{m[1]}/{m[2]}", set()):
                return self.reply({"message": "Not Found"}, 404)
            return self.reply({"state": "active", "role": "member"})
        if m := re.fullmatch(rf"{repo}/issues/(\d+)/comments", path):
            n = int(m[1])
            if req.method == "GET":
                return self.page(req, n)
            if req.method == "POST":
                if len(body["body"]) > rendering.COMMENT_LIMIT:
                    return self.reply({"message": "Validation Failed", "errors": [{"message": "body is too long"}]}, 422)
                cid = self.add_comment(n, BOT, body["body"])
                return self.reply(self.comment(n, self.comments[n][-1] | {"id": cid}), 201)
        if m := re.fullmatch(rf"{repo}/issues/comments/(\d+)", path):
            for n, cs in self.comments.items():
                for c in cs:
                    if c["id"] == int(m[1]):
                        if req.method == "PATCH":
                            if len(body["body"]) > rendering.COMMENT_LIMIT:
                                return self.reply({"message": "Validation Failed"}, 422)
                            c["body"] = body["body"]
                            return self.reply(self.comment(n, c))
                        if req.method == "DELETE":
                            cs.remove(c)
                            return Response(status=204)
            return self.reply({"message": "Not Found"}, 404)
        if (m := re.fullmatch(rf"{repo}/statuses/([0-9a-f]{{40}})", path)) and req.method == "POST":
            if body.get("state") not in ("error", "failure", "pending", "success") or \
                    len(body.get("description") or "") > rendering.STATUS_DESCRIPTION_LIMIT:
                return self.reply({"message": "Validation Failed"}, 422)
            self.statuses.append((m[1], body))
            return self.reply({"url": f"{self.base}{path}", "id": len(self.statuses), "node_id": "S",
                               "state": body["state"], "description": body.get("description"),
                               "target_url": body.get("target_url"), "context": body.get("context", "default"),
                               "created_at": "2025-01-01T00:00:00Z", "updated_at": "2025-01-01T00:00:00Z",
                               "creator": self.user(BOT)}, 201)
        return self.reply({"message": "Not Found"}, 404)

    def page(self, req: Request, n: int) -> Response:
        per_page, page = int(req.args.get("per_page", 30)), int(req.args.get("page", 1))
        items = self.comments[n]
        last = max(1, -(-len(items) // per_page))
        chunk = items[(page - 1) * per_page: page * per_page]
        url = f"{self.base}/repos/{OWNER}/{REPO}/issues/{n}/comments?per_page={per_page}&page="
        links = [f'<{url}{page + 1}>; rel="next"', f'<{url}{last}>; rel="last"'] if page < last else []
        return self.reply([self.comment(n, c) for c in chunk], headers={"Link": ", ".join(links)} if links else {})

    @staticmethod
    def reply(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
        return Response(json.dumps(data), status=status, headers=headers or {}, content_type="application/json")
