"""Which pull request a Buildkite poster may post on: Buildkite's own record, never the measured build's word.

The measuring pipeline runs a pull request's own pipeline YAML, so everything it sets (its trigger
step's ``build.env``, its artifacts) is the pull request's claim. The poster pipeline (steps kept in
Buildkite's settings, a queue that runs no pull request) asks Buildkite's REST API instead:

1. its own build, by the number the agent gave it; the record's id must be the agent's build id;
2. that build's ``triggered_from``: the build that started it, which must belong to the measuring
   pipeline named on the poster's command line (``--buildkite-measuring-pipeline``);
3. that build's record: its commit and its ``pull_request`` (number and head repository), as
   Buildkite took them from GitHub's webhook. Its artifacts are downloaded from it by the API.

A pull request's pipeline can start the poster, but only about itself: the artifact's PR number and
head SHA must equal the record's, and ``guard comment`` then checks the record against GitHub (the
PR's head must be that commit, from that repository). Anything else refuses, posts nothing and says why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import requests

from guard.errors import ExitCode, GuardError, UsageError
from guard.sanitize import one_line

DEFAULT_API_URL = "https://api.buildkite.com"
ARTIFACT_LIMIT = 64 * 1024 * 1024  # results.json of nine models stays far below this
_SLUG = re.compile(r"[a-z0-9][a-z0-9-]{0,99}")
_SHA = re.compile(r"[0-9a-f]{40}")
_NUMBER = re.compile(r"[1-9][0-9]{0,9}")
_GITHUB_REPO = re.compile(r"^(?:https?://|git://|ssh://git@|git@)github\.com[:/]([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+?)(?:\.git)?/?$")
# the poster's environment, as the Buildkite agent sets it for the job (docs/github.md, "Buildkite")
AGENT_VARIABLES = ("BUILDKITE_ORGANIZATION_SLUG", "BUILDKITE_PIPELINE_SLUG", "BUILDKITE_BUILD_NUMBER", "BUILDKITE_BUILD_ID")


class BuildkiteSideError(GuardError):
    """Buildkite's API failed or could not be reached: nothing to do with the perf verdict."""

    exit_code = ExitCode.GITHUB


class ForgedTarget(UsageError):
    """What the measured build says about itself is not what Buildkite recorded: nothing is posted."""


@dataclass(frozen=True)
class MeasuredBuild:
    """The measuring build that started this poster, as Buildkite recorded it."""

    pipeline: str
    number: int
    build_id: str
    commit: str  # the pull request's head commit that was built
    pr: int
    head_repo: str  # OWNER/NAME the pull request comes from
    web_url: str | None = None

    def describe(self) -> str:
        return f"{self.pipeline} build {self.number} (pull request #{self.pr} from {self.head_repo}, commit {self.commit[:12]})"


class BuildkiteAPI:
    """The few REST calls the poster makes, with the token in a header and bounded replies."""

    def __init__(self, token: str, organization: str, api_url: str = DEFAULT_API_URL, timeout_s: float = 30.0) -> None:
        self.base = api_url.rstrip("/") + "/v2"
        self.organization = organization
        self.timeout_s = timeout_s
        self.session = requests.Session()
        self.session.headers.update({"Authorization": f"Bearer {token}", "Accept": "application/json"})

    def _get(self, url: str, what: str, **kwargs: Any) -> requests.Response:
        try:
            resp = self.session.get(url, timeout=self.timeout_s, **kwargs)
        except requests.RequestException as exc:
            raise BuildkiteSideError(f"Buildkite: {what}: {one_line(str(exc), limit=200)}",
                                     hint="Buildkite's API could not be reached; re-run this job") from None
        if resp.status_code == 404:
            raise ForgedTarget(f"Buildkite: {what}: not found (404); refusing to post")
        if resp.status_code in (401, 403):
            raise UsageError(f"Buildkite: {what}: the token was refused ({resp.status_code})",
                             hint="BUILDKITE_API_TOKEN needs the read_builds and read_artifacts scopes")
        if resp.status_code >= 400:
            raise BuildkiteSideError(f"Buildkite: {what}: HTTP {resp.status_code}", hint="re-run this job")
        return resp

    def build(self, pipeline: str, number: int) -> dict[str, Any]:
        url = f"{self.base}/organizations/{self.organization}/pipelines/{pipeline}/builds/{number}"
        data = self._json(self._get(url, f"read build {number} of {pipeline}"), f"build {number} of {pipeline}")
        if not isinstance(data, dict):
            raise ForgedTarget(f"Buildkite: build {number} of {pipeline}: the reply is not a build; refusing to post")
        return data

    def artifacts(self, pipeline: str, number: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        url: str | None = f"{self.base}/organizations/{self.organization}/pipelines/{pipeline}/builds/{number}/artifacts"
        params: dict[str, Any] | None = {"per_page": 100}
        while url:
            resp = self._get(url, f"list the artifacts of build {number} of {pipeline}", params=params)
            page = self._json(resp, "artifact list")
            if not isinstance(page, list):
                raise ForgedTarget("Buildkite: the artifact list is not a list; refusing to post")
            out += [a for a in page if isinstance(a, dict)]
            url, params = resp.links.get("next", {}).get("url"), None
        return out

    def download(self, artifact: dict[str, Any], dest: Path) -> None:
        url = artifact.get("download_url")
        if not isinstance(url, str) or not url.startswith(self.base):
            raise ForgedTarget(f"Buildkite: artifact {one_line(str(artifact.get('path')), 80)} has no download URL "
                               "on this API; refusing to post")
        resp = self._get(url, f"download {one_line(str(artifact.get('path')), 80)}", stream=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        size = 0
        with dest.open("wb") as f:
            for chunk in resp.iter_content(1 << 16):
                size += len(chunk)
                if size > ARTIFACT_LIMIT:
                    raise ForgedTarget(f"Buildkite: artifact {dest.name} is over {ARTIFACT_LIMIT >> 20} MiB; refusing it")
                f.write(chunk)

    @staticmethod
    def _json(resp: requests.Response, what: str) -> Any:
        try:
            return resp.json()
        except ValueError:
            raise BuildkiteSideError(f"Buildkite: {what}: the reply is not JSON", hint="re-run this job") from None


def slug(value: str, source: str) -> str:
    if not _SLUG.fullmatch(value or ""):
        raise UsageError(f"{source} {value!r} is not a Buildkite slug (lower-case letters, digits, dashes)")
    return value


def github_repository(url: str) -> str | None:
    """OWNER/NAME of a GitHub repository URL as Buildkite records a pull request's (https, git@, git://)."""
    m = _GITHUB_REPO.match(url or "")
    return m[1] if m else None


def measured_build(api: BuildkiteAPI, env: dict[str, str], measuring_pipeline: str) -> MeasuredBuild:
    """The build of ``measuring_pipeline`` that triggered this job's build, from Buildkite's records."""
    missing = [v for v in AGENT_VARIABLES if not env.get(v)]
    if missing:
        raise UsageError(f"--buildkite-measuring-pipeline: {', '.join(missing)} not set: run this as a step of the "
                         "poster pipeline, where the Buildkite agent sets them")
    own_pipeline = slug(env["BUILDKITE_PIPELINE_SLUG"], "BUILDKITE_PIPELINE_SLUG")
    if not _NUMBER.fullmatch(env["BUILDKITE_BUILD_NUMBER"]):
        raise UsageError(f"BUILDKITE_BUILD_NUMBER {env['BUILDKITE_BUILD_NUMBER']!r} is not a build number")
    own = api.build(own_pipeline, int(env["BUILDKITE_BUILD_NUMBER"]))
    if own.get("id") != env["BUILDKITE_BUILD_ID"]:
        raise ForgedTarget(f"build {env['BUILDKITE_BUILD_NUMBER']} of {own_pipeline} is {one_line(str(own.get('id')), 60)} "
                           f"in Buildkite's records, not this job's BUILDKITE_BUILD_ID; refusing to post")
    origin = own.get("triggered_from")
    if not isinstance(origin, dict) or not origin.get("build_id"):
        raise ForgedTarget(f"build {env['BUILDKITE_BUILD_NUMBER']} of {own_pipeline} was not started by a trigger step "
                           f"(source: {one_line(str(own.get('source')), 30)}): there is no measured build to post for")
    if origin.get("build_pipeline_slug") != measuring_pipeline:
        raise ForgedTarget(f"this build was triggered from pipeline {one_line(str(origin.get('build_pipeline_slug')), 60)}, "
                           f"not the measuring pipeline {measuring_pipeline}; refusing to post")
    number = origin.get("build_number")
    if not isinstance(number, int) or number < 1:
        raise ForgedTarget("triggered_from has no build number; refusing to post")
    measured = api.build(measuring_pipeline, number)
    if measured.get("id") != origin["build_id"]:
        raise ForgedTarget(f"build {number} of {measuring_pipeline} is not the build that triggered this one; refusing to post")
    commit = str(measured.get("commit") or "").lower()
    if not _SHA.fullmatch(commit):
        raise ForgedTarget(f"build {number} of {measuring_pipeline} built {one_line(commit, 60)!r}, not a full commit SHA")
    pull = measured.get("pull_request")
    if not isinstance(pull, dict) or not _NUMBER.fullmatch(str(pull.get("id") or "")):
        raise ForgedTarget(f"build {number} of {measuring_pipeline} is not a pull request's build; nothing to post on")
    head_repo = github_repository(str(pull.get("repository") or ""))
    if head_repo is None:
        raise ForgedTarget(f"build {number} of {measuring_pipeline}: pull request repository "
                           f"{one_line(str(pull.get('repository')), 100)!r} is not a GitHub repository")
    web = measured.get("web_url")
    return MeasuredBuild(pipeline=measuring_pipeline, number=number, build_id=origin["build_id"], commit=commit,
                         pr=int(pull["id"]), head_repo=head_repo, web_url=web if isinstance(web, str) else None)


def download_artifacts(api: BuildkiteAPI, build: MeasuredBuild, dest: Path, prefixes: tuple[str, ...]) -> list[str]:
    """The measured build's artifacts under ``prefixes`` (e.g. guard-results/, guard-pr/), into ``dest``
    at their recorded paths; the paths downloaded. A path that would leave ``dest`` is refused."""
    got = []
    for artifact in api.artifacts(build.pipeline, build.number):
        path = str(artifact.get("path") or "")
        p = PurePosixPath(path)
        if not path or p.is_absolute() or ".." in p.parts or not any(path.startswith(x) for x in prefixes):
            continue
        if artifact.get("state") not in (None, "finished"):
            continue
        api.download(artifact, dest / p)
        got.append(path)
    return sorted(got)
