"""A small Buildkite REST API for tests: builds (with ``triggered_from`` and ``pull_request`` as
Buildkite records them), their artifacts and the downloads, served over real HTTP by
pytest-httpserver, so `guard comment --buildkite-measuring-pipeline` talks to it with its real
client. Shapes follow Buildkite's builds and artifacts APIs (docs: buildkite.com/docs/apis/rest-api;
the field names as buildkite/go-buildkite's Build, PullRequest and TriggeredFrom types declare them)."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from werkzeug import Request, Response

ORG = "vllm"
TOKEN = "bkua_test_token"


class FakeBuildkite:
    def __init__(self, server) -> None:
        self.base = server.url_for("/").rstrip("/")
        self.builds: dict[tuple[str, int], dict[str, Any]] = {}
        self.artifacts: dict[tuple[str, int], list[dict[str, Any]]] = {}
        self.blobs: dict[str, bytes] = {}
        self.log: list[str] = []
        server.expect_request(re.compile(".*")).respond_with_handler(self.handle)

    def build(self, pipeline: str, number: int, commit: str, *, pr: int | None = None,
              pr_repo: str = "https://github.com/contrib/guarded.git", triggered_from: tuple[str, int] | None = None,
              source: str = "webhook") -> dict[str, Any]:
        b = {"id": str(uuid.uuid4()), "number": number, "commit": commit, "branch": "x", "state": "passed",
             "source": source, "web_url": f"https://buildkite.example/{ORG}/{pipeline}/builds/{number}",
             "pipeline": {"slug": pipeline}}
        if pr is not None:
            b["pull_request"] = {"id": str(pr), "base": "main", "repository": pr_repo}
        if triggered_from is not None:
            origin = self.builds[triggered_from]
            b["triggered_from"] = {"build_id": origin["id"], "build_number": origin["number"],
                                   "build_pipeline_slug": triggered_from[0]}
            b["source"] = "trigger_job"
        self.builds[(pipeline, number)] = b
        return b

    def upload(self, pipeline: str, number: int, path: str, data: bytes | str) -> None:
        art_id = str(uuid.uuid4())
        self.blobs[art_id] = data.encode() if isinstance(data, str) else data
        url = f"{self.base}/v2/organizations/{ORG}/pipelines/{pipeline}/builds/{number}/jobs/j/artifacts/{art_id}"
        self.artifacts.setdefault((pipeline, number), []).append(
            {"id": art_id, "job_id": "j", "url": url, "download_url": f"{url}/download", "state": "finished",
             "path": path, "dirname": path.rpartition("/")[0], "filename": path.rpartition("/")[2],
             "file_size": len(self.blobs[art_id]), "glob_path": "guard-*/*"})

    def handle(self, req: Request) -> Response:
        self.log.append(f"{req.method} {req.path}")
        if req.path.startswith("/storage/"):  # the signed URL a download redirects to: no Buildkite token
            if "Authorization" in req.headers:
                return Response("the token must not follow the redirect", status=400)
            return Response(self.blobs[req.path.rsplit("/", 1)[1]], content_type="application/octet-stream")
        if req.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self.reply({"message": "Authentication required"}, 401)
        prefix = f"/v2/organizations/{ORG}/pipelines/"
        if not req.path.startswith(prefix):
            return self.reply({"message": "Not Found"}, 404)
        rest = req.path[len(prefix):]
        if m := re.fullmatch(r"([a-z0-9-]+)/builds/(\d+)", rest):
            b = self.builds.get((m[1], int(m[2])))
            return self.reply(b) if b else self.reply({"message": "No build found"}, 404)
        if m := re.fullmatch(r"([a-z0-9-]+)/builds/(\d+)/artifacts", rest):
            return self.reply(self.artifacts.get((m[1], int(m[2])), []))
        if m := re.fullmatch(r"[a-z0-9-]+/builds/\d+/jobs/j/artifacts/([0-9a-f-]+)/download", rest):
            # another host, as S3's signed URLs are: the client must drop the token there
            other = self.base.replace("localhost", "127.0.0.1") if "localhost" in self.base \
                else self.base.replace("127.0.0.1", "localhost")
            return Response(status=302, headers={"Location": f"{other}/storage/{m[1]}"})
        return self.reply({"message": "Not Found"}, 404)

    @staticmethod
    def reply(data: Any, status: int = 200) -> Response:
        return Response(json.dumps(data), status=status, content_type="application/json")
