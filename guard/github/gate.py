"""The privileged post: what a pull request's run claims, judged again with what GitHub says now.

Order matters. The pull request is read first (its head, changed files, reviews), because what it
changes decides what may judge it; then the budgets (guard's own, or vLLM's in-repo copy at base, or
head's copy once accepted: guard.github.budget_files); then each model's run record is judged again
(guard.judge.rejudge); then one comment and one status are posted. A run that does not re-judge is
refused (nothing posted, exit 2) unless the pull request changes protected paths, in which case it
gets the status that asks for a maintainer's approved run: a changed judge legitimately writes
results another judge would not.

One model (``--results``) posts under its own context, ``guard/<model>/<profile>``. A folder of models
(``--results-dir``, what ``guard pr --model auto`` writes) posts one status, ``guard/<profile>``, and at
most one comment with a section per model; the poster works out itself which models the pull request
concerns (guard.config.models.chosen_for, from the files GitHub lists), so a model whose results are
missing is an error, never a silent pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from guard.config.budgets import Thresholds
from guard.config.loading import load_thresholds
from guard.errors import UsageError
from guard.github import approval, budget_files, client, publish
from guard.github.rendering import STATUS_DESCRIPTION_LIMIT, CommitStatus, clip, slug, trim_body
from guard.github.trust import TrustPolicy
from guard.judge.rejudge import rejudge
from guard.model.results import Results
from guard.report.markdown import text
from guard.sanitize import one_line

ALL_MODELS = "all"  # the marker's model for a comment that covers every model judged
MODEL_FIELD = "{model}"  # in a budget path: each model's own file
STATE_ORDER = ("error", "failure", "success")  # worst first


@dataclasses.dataclass(frozen=True)
class Rendered:
    """A judged run as the command renders it (its report, status, whether it is a finding)."""

    body: str
    status: CommitStatus
    finding: bool
    summary: str
    report: str


Render = Callable[[Results, "str | None", str], Rendered]  # (judged results, budget file named, notice) -> Rendered


@dataclasses.dataclass(frozen=True)
class ModelPost:
    """One model's part of the post."""

    model: str
    rendered: Rendered | None  # None: nothing to judge (missing results, or results that do not re-judge)
    problem: str = ""  # why there is nothing
    refused: bool = False  # its results do not re-judge here: nothing is posted unless protected paths explain it
    judged: Results | None = None
    not_run: bool = False  # the runner could not run it (a hardware need, e.g. native bf16): neutral, like exit 6
    accepted_by: str | None = None  # head's budgets judged it, accepted by this login
    recorded: Results | None = None  # what shadow mode records: as judged, or as base's budgets judge it when accepted

    @property
    def state(self) -> str:
        if self.rendered is not None:
            return self.rendered.status.state
        return "success" if self.not_run else "error"

    @property
    def says(self) -> str:
        return self.rendered.status.description if self.rendered is not None else self.problem


@dataclasses.dataclass(frozen=True)
class Context:
    """What the post reads from GitHub once, for every model."""

    gh: Any
    pull: Any
    head: str
    owner: str
    name: str
    api_url: str
    files: list
    reviews: list


def open_context(gh: Any, owner: str, name: str, api_url: str, pr: int, sha: str | None, head_repo: str | None,
                 verify: bool) -> Context:
    pull = publish.open_pull_request(gh, owner=owner, repo=name, number=pr, sha=sha, verify=verify,
                                     expected_head_repo=head_repo)
    files = client.read("list the pull request's files", lambda: publish.pr_changed_files(pull))
    reviews = client.read("list the pull request's reviews", lambda: publish.pr_reviews(pull))
    return Context(gh, pull, (sha or pull.head.sha).lower(), owner, name, api_url, files, reviews)


def for_model(policy: TrustPolicy, model: str) -> TrustPolicy:
    """The policy with guard's own budget file of ``model`` (``{model}`` in --trusted-thresholds), as
    the poster's checkout holds it (text None: not there)."""
    if MODEL_FIELD not in policy.thresholds_path:
        return policy
    path = policy.thresholds_path.replace(MODEL_FIELD, model)
    try:
        text_ = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        text_ = None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--trusted-thresholds {path}: cannot read: {exc}") from None
    return dataclasses.replace(policy, thresholds_path=path, thresholds_text=text_)


def budgets_for(ctx: Context, model: str, in_repo: str | None, policy: TrustPolicy, label: str,
                say: Callable[[str], None]) -> tuple[Thresholds, budget_files.BudgetChoice | None, TrustPolicy]:
    """The budgets that judge ``model``: guard's own file, or vLLM's in-repo copy (base's, or head's
    when accepted); and the trust policy with the in-repo budget files exempt from "protected"."""
    own = for_model(policy, model)  # the policy handed back keeps --trusted-thresholds' {model} for the next model
    if not in_repo:
        if own.thresholds_text is None:
            raise UsageError(f"--trusted-thresholds {own.thresholds_path}: not found in this checkout; the "
                             "results cannot be re-judged against the default branch's budgets, so nothing is posted")
        return load_thresholds(own.thresholds_path, text=own.thresholds_text), None, policy
    path = in_repo.replace("{model}", model)
    reads = approval.GitHubReads(ctx.gh, ctx.api_url, ctx.owner, ctx.name)
    choice = client.read("read the budgets in the repository", lambda: budget_files.choose(
        ctx.pull.base.repository, reads, ctx.pull.number, str(ctx.pull.base.sha).lower(), ctx.head, path,
        [f.filename for f in ctx.files], ctx.reviews, own, label, model))
    say(f"guard comment: {model}: budgets: {one_line(choice.source)}")
    exempt = tuple(sorted(set(policy.budget_files) | set(choice.files)))
    return choice.thresholds, choice, dataclasses.replace(policy, budget_files=exempt)


def judge_one(ctx: Context, results: Results, source: str, in_repo: str | None, policy: TrustPolicy, label: str,
              render: Render, say: Callable[[str], None]) -> tuple[ModelPost, TrustPolicy]:
    model = results.run.model
    thresholds, choice, policy = budgets_for(ctx, model, in_repo, policy, label, say)
    try:
        judged = rejudge(results, thresholds, source=source)
    except UsageError as exc:
        return ModelPost(model, None, str(exc), refused=True), policy
    path = in_repo.replace("{model}", model) if in_repo else None
    notice = budget_files.notice_markdown(choice, path) if choice is not None else ""
    rendered = render(judged, path, notice)
    if choice is not None:
        status = dataclasses.replace(rendered.status, description=clip(
            f"{choice.short}: {rendered.status.description}", STATUS_DESCRIPTION_LIMIT))
        rendered = dataclasses.replace(rendered, status=status,
                                       finding=rendered.finding or (bool(choice.changed) and choice.accepted is None))
    accepted_by, recorded = None, judged
    if choice is not None and choice.accepted is not None and choice.base is not None:
        accepted_by = choice.accepted.login
        try:  # shadow mode records what was accepted: the findings base's copy gives
            recorded = rejudge(results, choice.base, source=source)
        except UsageError:
            recorded = judged
    return ModelPost(model, rendered, judged=judged, accepted_by=accepted_by, recorded=recorded), policy


def combined_status(profile: str, posts: list[ModelPost], run_url: str | None, why_none: str) -> CommitStatus:
    """One status for every model: the worst state, the models that are not success named first."""
    context = f"guard/{slug(profile)}"
    if not posts:
        return CommitStatus("success", context, clip(why_none, STATUS_DESCRIPTION_LIMIT), run_url)
    worst = min((p.state for p in posts), key=STATE_ORDER.index)
    bad = [p for p in posts if p.state != "success"]
    named = "; ".join(f"{p.model}: {p.says}" for p in bad)
    held = len(posts) - len(bad)
    desc = f"{len(posts)} model(s), {held} fine" + (f"; {named}" if named else "")
    return CommitStatus(worst, context, clip(desc, STATUS_DESCRIPTION_LIMIT), run_url)


def combined_body(mark: str, posts: list[ModelPost], why_none: str) -> str:
    """One comment: a table of the models, then each model's report folded (open when it is a finding)."""
    if not posts:
        return f"{mark}\n## ✅ guard: nothing to judge\n\n{text(why_none)}.\n"
    rows = [f"| `{p.model}` | {p.state} | {text(p.says).replace('|', '/')} |" for p in posts]
    parts = [mark, f"## guard: {len(posts)} model(s) judged", "", "| model | status | says |", "|---|---|---|", *rows]
    for p in posts:
        if p.rendered is None:
            parts += ["", f"### {p.model}: {'not run here' if p.not_run else 'not judged'}", "", text(p.problem)]
            continue
        report = p.rendered.report
        opened = " open" if p.rendered.finding else ""
        parts += ["", f"<details{opened}><summary><b>{p.model}</b>: {text(p.rendered.summary)}</summary>", "",
                  report.strip(), "", "</details>"]
    return trim_body("\n".join(parts) + "\n")


def missing_models(ctx: Context, found: list[str]) -> tuple[list[str], str]:
    """The models this pull request concerns by the files GitHub lists (not by the artifact), and why."""
    from guard.config import models

    chosen, why = models.chosen_for([f.filename for f in ctx.files])
    return [m for m in chosen if m not in found], why


def not_run_in(folder: Path) -> dict[str, str]:
    """The models the measuring runner could not run (``guard pr --model auto``'s OUTPUT/<model>/not-run.txt)."""
    from guard.commands.matrix import NOT_RUN

    return {p.parent.name: p.read_text(encoding="utf-8", errors="replace").strip()[:300]
            for p in sorted(folder.glob(f"*/{NOT_RUN}"))}


def results_in(folder: Path) -> list[tuple[Path, Results]]:
    """Each model's results.json under ``folder`` (``guard pr --model auto``'s OUTPUT/<model>/)."""
    from guard.model.jsonfiles import load_results

    paths = sorted(folder.glob("*/results.json"))
    if (folder / "results.json").is_file():
        paths.insert(0, folder / "results.json")
    return [(p, load_results(p)) for p in paths]
