"""Post the verdict on the pull request: commit status, job summary, annotations, and a comment
only when there is a finding (guard.report.findings; docs/github.md says what is posted when).

Reads results.json only (never the engine). Exit 0 when it published, whatever the perf verdict
was; 0 with a warning when GitHub refused a read-only token (fork PR); 2 for bad input (no token,
bad results file, bad PR number, a PR whose head is not the measured commit); 4 when GitHub kept
failing after retries. ``--dry-run`` prints what it would post and needs neither token nor network.
"""

from __future__ import annotations

import argparse
import math
import os
import secrets
import tempfile
from pathlib import Path

from guard.github import approval, buildkite, client, gate, inputs, publish, rendering, workflow_commands
from guard.config.budgets import DEFAULT_THRESHOLDS
from guard.config.loading import load_thresholds
from guard.errors import UsageError
from guard.files import read_input
from guard.history.analysis import pr_standing
from guard.history.store import commit_flag, load_history
from guard.report.findings import has_finding, summary_line
from guard.report.markdown import render_markdown, text
from guard.judge.rejudge import rejudge
from guard.model.jsonfiles import load_results
from guard.model.results import Results
from guard.model.verdict import self_contradiction
from guard.sanitize import no_workflow_commands, one_line
from guard.github.trust import PROTECTED_PATTERNS, TrustPolicy

DEFAULT_RESULTS = "guard-results/results.json"
# a vLLM pull request that changes these changes how it is measured: its own run cannot vouch for it
VLLM_PROTECTED = (".buildkite/*", ".github/*")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", default=DEFAULT_RESULTS, help="results.json to publish (default: %(default)s)")
    parser.add_argument("--results-dir", default=None, metavar="DIR",
                        help="every model's results under DIR (DIR/<model>/results.json, what `guard pr --model auto` "
                             "writes): one status guard/<profile> and at most one comment for all of them; the models "
                             "the pull request concerns are worked out here from its files, so a missing one is an error")
    parser.add_argument("--report", default=None,
                        help="post this Markdown instead of rendering results.json (only for reports you trust: "
                             "the rendered one escapes everything that came from the run)")
    parser.add_argument("--pr", default=None, help="pull-request number (default: from the Actions event payload)")
    parser.add_argument("--sha", default=None,
                        help="head commit that was measured (default: from the event payload, else the PR's head)")
    parser.add_argument("--pr-file", default=None,
                        help="read the PR number from this file (an artifact: untrusted, so the PR is verified)")
    parser.add_argument("--sha-file", default=None,
                        help="read the head SHA from this file (an artifact: must equal --sha when both are given)")
    parser.add_argument("--expected-head-repo", default=None, metavar="OWNER/NAME",
                        help="refuse unless the PR's head branch lives in this repository")
    parser.add_argument("--run-url", default=None, help="link to the workflow run, shown in the comment and status")
    parser.add_argument("--author", default=publish.DEFAULT_AUTHOR,
                        help="login the token posts as; only its comments are edited (default: %(default)s)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the comment body and the status instead of posting; no token, no network")
    parser.add_argument("--trusted-thresholds", default=DEFAULT_THRESHOLDS, metavar="PATH",
                        help="the thresholds file as the default branch has it, repository-relative; a PR that "
                             "changes it (or .github/workflows/, guard/, tests/perf/) needs a maintainer's approval "
                             "(default: %(default)s)")
    parser.add_argument("--thresholds-in-repo", default=None, metavar="PATH",
                        help="the budgets live in the vLLM repository at this path ({model}: the run's model): "
                             "base's copy, read through the API at the pull request's base, judges; head's copy when "
                             "the change is accepted (--accept-label, or a code owner's approving review); guard's "
                             "--trusted-thresholds only where base has none (docs/github.md, \"Budgets in vLLM's tree\")")
    parser.add_argument("--accept-label", default=approval.DEFAULT_LABEL, metavar="NAME",
                        help="with --thresholds-in-repo: the label that accepts head's budget change when applied by "
                             "someone with write permission (default: %(default)s)")
    parser.add_argument("--protected", action="append", default=None, metavar="PATTERN",
                        help="a changed path matching this (fnmatch, repository-relative) needs a maintainer's "
                             "approved run; repeat for more (default: guard's own layout, or with "
                             f"--thresholds-in-repo vLLM's: {' '.join(VLLM_PROTECTED)})")
    parser.add_argument("--buildkite-measuring-pipeline", default=None, metavar="SLUG",
                        help="post for the Buildkite build of this pipeline that triggered this job: the PR, commit, "
                             "head repository and artifacts come from Buildkite's API (BUILDKITE_API_TOKEN), never "
                             "from what the measured build set (docs/github.md, \"Buildkite\")")
    parser.add_argument("--findings", default=None, metavar="PATH",
                        help="shadow mode: also append each model's run, as judged here (who accepted head's budgets "
                             "included), to this findings store (guard record --findings; docs/history.md)")
    parser.add_argument("--check-pr-files", choices=("auto", "on", "off"), default="auto",
                        help="treat results.json as the PR's claim: re-judge its run record against "
                             "--trusted-thresholds and check the PR's changed files before posting. auto = when "
                             "the PR comes from an artifact (--pr-file/--sha-file/--expected-head-repo), i.e. in "
                             "perf-guard-comment")
    parser.add_argument("--history", default=None, metavar="PATH",
                        help="main's history (guard record): when the PR's base is in it, the comment says where "
                             "this run sits in main's recent range")
    parser.add_argument("--history-base", default=None, metavar="SHA",
                        help="the PR's base commit to look up in --history (default: the base `guard pr` measured)")
    parser.add_argument("--no-results", default=None, metavar="REASON",
                        help="the measuring run left no results.json (cancelled, timed out, failed first): post only "
                             "an `error` commit status with this reason on --sha, for --model and --profile")
    parser.add_argument("--not-run", default=None, metavar="REASON",
                        help="the measuring run was not requested (e.g. the A10 run without its label): post only a "
                             "`success` status 'not run: REASON' on --sha, for --model and --profile")
    parser.add_argument("--model", default=None, help="with --no-results: the model of the missing results")
    parser.add_argument("--profile", default=None, help="with --no-results: the hardware profile of the missing results")
    parser.add_argument("--max-attempts", type=_attempts, default=client.RetryPolicy.attempts,
                        help="tries per GitHub request for 5xx/429/rate limits (default: %(default)s)")
    parser.add_argument("--backoff-base", type=_seconds, default=client.RetryPolicy.base_s,
                        help="seconds before the first retry, doubled after each (default: %(default)s)")


def _attempts(text: str) -> int:
    """--max-attempts: a whole number, at least 1 (the first try counts)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of tries, at least 1")
    return n


def _seconds(text: str) -> float:
    """--backoff-base: seconds; NaN or infinity would reach time.sleep and the retry clock."""
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not math.isfinite(x) or x < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite, non-negative number of seconds")
    return x


def _target(args: argparse.Namespace, env: dict[str, str]) -> tuple[int | None, str | None, str | None, bool]:
    """(PR number, head SHA, expected head repository, verify?) from flags, files, or the event payload.

    Flags and the event payload (written by the runner) are trusted; files are the PR run's artifact,
    so reading one switches verification on, against the trusted SHA and head repository when known.
    """
    event_path = env.get("GITHUB_EVENT_PATH")
    event = inputs.target_from_event(event_path) if event_path else inputs.EventTarget()
    verify = bool(args.pr_file or args.sha_file or args.expected_head_repo)

    if args.pr is not None and args.pr_file is not None:
        raise UsageError("give --pr or --pr-file, not both")
    if args.pr_file is not None:
        pr = inputs.parse_pr_number(inputs.read_small_file(args.pr_file, what="--pr-file"), source=args.pr_file)
    elif args.pr is not None:
        pr = inputs.parse_pr_number(args.pr, source="--pr")
    else:
        pr = event.pr if isinstance(event.pr, int) and event.pr > 0 else None

    if args.sha is not None:
        sha = inputs.parse_sha(args.sha, source="--sha")
    elif isinstance(event.sha, str):
        sha = inputs.parse_sha(event.sha, source="GITHUB_EVENT_PATH head SHA")
    else:
        sha = None
    if args.sha_file is not None:
        from_file = inputs.parse_sha(inputs.read_small_file(args.sha_file, what="--sha-file"), source=args.sha_file)
        if sha is not None and from_file != sha:
            raise UsageError(f"{args.sha_file} says {from_file} but the run measured {sha}: the artifact does not "
                             "belong to the run that triggered this; refusing to post")
        sha = from_file

    head_repo = args.expected_head_repo or (event.head_repo if verify and isinstance(event.head_repo, str) else None)
    if head_repo is not None:
        inputs.parse_repository(head_repo, source="--expected-head-repo")
    return pr, sha, head_repo, verify


def _token(env: dict[str, str], needed_for: str) -> str:
    """GITHUB_TOKEN, without the line break a secret pasted from a file often ends with (it would be
    an invalid HTTP header); one with whitespace or control characters inside is refused."""
    token = (env.get("GITHUB_TOKEN") or "").strip()
    if not token:
        raise UsageError(f"GITHUB_TOKEN is not set: cannot post {needed_for}",
                         hint="in a workflow, pass `env: GITHUB_TOKEN: ${{ github.token }}`; "
                              "or run `guard comment --dry-run` to see what would be posted")
    if not token.isprintable() or any(c.isspace() for c in token):
        raise UsageError("GITHUB_TOKEN holds whitespace or control characters inside: not a token",
                         hint="set it to the token alone")
    return token


def say(text: str) -> None:
    """Print a line that may carry text from the artifact or GitHub: never as a workflow command."""
    print(no_workflow_commands(text))


def _trust_policy(args: argparse.Namespace, verify: bool) -> TrustPolicy | None:
    if args.check_pr_files == "off" or (args.check_pr_files == "auto" and not verify):
        return None
    rel = Path(args.trusted_thresholds)
    if rel.is_absolute() or ".." in rel.parts:
        raise UsageError(f"--trusted-thresholds {rel}: give the path relative to the repository root")
    patterns = tuple(args.protected) if args.protected else (VLLM_PROTECTED if args.thresholds_in_repo else PROTECTED_PATTERNS)
    if gate.MODEL_FIELD in args.trusted_thresholds:  # read per model (guard.github.gate.for_model)
        return TrustPolicy(thresholds_path=rel.as_posix(), thresholds_text=None, patterns=patterns)
    try:
        text = rel.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--trusted-thresholds {rel}: cannot read: {exc}") from None
    return TrustPolicy(thresholds_path=rel.as_posix(), thresholds_text=text, patterns=patterns)


def _print_dry_run(body: str, status: rendering.CommitStatus, pr: int | None, sha: str | None,
                   env: dict[str, str], finding: bool = True) -> None:
    where = f"pull request #{pr}" if pr else "the pull request (none given)"
    if finding:
        say(f"guard comment: dry run: would post this comment on {where}:")
    else:
        say(f"guard comment: dry run: no finding, so no comment on {where} (one of guard's that still shows "
            "findings would be marked resolved); the report it would not post:")
    # inside Actions, keep text from the run from being read as workflow commands
    stop = secrets.token_hex(16) if env.get("GITHUB_ACTIONS") == "true" else None
    if stop:
        print(f"::stop-commands::{stop}")
    print(body, end="" if body.endswith("\n") else "\n")
    if stop:
        print(f"::{stop}::")
    say(f"guard comment: dry run: would set the commit status on {sha or 'the PR head'}:")
    say(f"  state: {status.state}")
    say(f"  context: {one_line(status.context)}")
    say(f"  description: {one_line(status.description)}")
    say(f"  target_url: {one_line(status.target_url or '(none)')}")
    if env.get("GITHUB_STEP_SUMMARY"):
        print("guard comment: dry run: would append the report to $GITHUB_STEP_SUMMARY")


def _job_summary(env: dict[str, str], markdown: str) -> None:
    """Append to $GITHUB_STEP_SUMMARY when set; best effort, like the rest of publishing."""
    if not env.get("GITHUB_STEP_SUMMARY"):
        return
    try:
        workflow_commands.append_step_summary(env["GITHUB_STEP_SUMMARY"], markdown)
    except OSError as exc:
        print(workflow_commands.workflow_command(
            "warning", f"cannot append to GITHUB_STEP_SUMMARY {env['GITHUB_STEP_SUMMARY']}: {exc.strerror or exc}",
            title="guard comment: no job summary"))


def run_without_results(args: argparse.Namespace, env: dict[str, str]) -> int:
    """--no-results: an ``error`` status for the model x profile whose run left nothing to judge."""
    if args.no_results is not None and args.not_run is not None:
        raise UsageError("give --no-results or --not-run, not both")
    flag = "--no-results" if args.no_results is not None else "--not-run"
    if not (args.model and args.profile and args.sha):
        raise UsageError(f"{flag} needs --model, --profile and --sha (the triggering run's head commit)")
    if args.pr_file or args.sha_file or args.pr:
        raise UsageError(f"{flag} posts only a status on --sha: give no PR number or artifact files")
    sha = inputs.parse_sha(args.sha, source="--sha")
    status = rendering.no_results_status(args.model, args.profile, args.no_results or args.not_run,
                                         args.run_url or None, requested=args.no_results is not None)
    if args.dry_run:
        say(f"guard comment: dry run: would set the commit status on {sha}:")
        say(f"  state: {status.state}")
        say(f"  context: {one_line(status.context)}")
        say(f"  description: {one_line(status.description)}")
        return 0
    token = _token(env, "the status")
    owner, name = inputs.parse_repository(env.get("GITHUB_REPOSITORY", ""), source="GITHUB_REPOSITORY")
    gh = client.github_client(token, env.get("GITHUB_API_URL") or client.DEFAULT_API_URL,
                              retry=client.RetryPolicy(attempts=args.max_attempts, base_s=args.backoff_base))
    if args.no_results is not None and env.get("GITHUB_EVENT_PATH"):
        # a cancelled run a newer one replaced: the newer run posts, so this one posts nothing
        event = inputs.target_from_event(env["GITHUB_EVENT_PATH"])
        if event.sha is not None and event.sha.lower() == sha:
            why, problem = publish.superseded(gh, owner=owner, repo=name, run=event)
            if why:
                say(f"guard comment: {one_line(status.context)}: the measuring run was cancelled and superseded: "
                    f"{one_line(why)}; nothing posted")
                _job_summary(env, f"{status.context}: cancelled, superseded ({text(why)}): nothing posted")
                return 0
            if problem:
                say(f"guard comment: cannot tell whether a newer run superseded this one ({one_line(problem)}); "
                    "posting the error status")
    _job_summary(env, f"{status.context}: {status.state}: {text(status.description)}")
    report = publish.publish_status(gh, owner=owner, repo=name, sha=sha, status=status)
    if report.status:
        say(f"guard comment: status {status.state} '{one_line(status.context)}' on {sha}: {one_line(status.description)}")
    for refused in report.forbidden:
        print(workflow_commands.workflow_command("warning", refused, title="guard comment: not published"))
    if report.errors:
        raise client.GitHubSideError("; ".join(report.errors), hint="GitHub's side failed; re-run this job")
    return 0


def run(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    if args.buildkite_measuring_pipeline is not None:
        return run_for_buildkite(args, env)
    if args.no_results is not None or args.not_run is not None:
        return run_without_results(args, env)
    pr, sha, head_repo, verify = _target(args, env)
    policy = _trust_policy(args, verify)
    if args.results_dir is not None:
        if policy is None or args.dry_run:
            raise UsageError("--results-dir posts one verdict for every model the pull request concerns, judged "
                             "again against GitHub's view of it: give the artifact's --pr-file/--sha-file (or "
                             "--check-pr-files on), and no --dry-run")
        runs = [(str(p), r) for p, r in gate.results_in(Path(args.results_dir))]
        return _post_judged(args, env, runs, policy, pr, sha, head_repo, verify, folder=True)
    results = load_results(Path(args.results))
    if policy is not None and not args.dry_run:  # the artifact's verdict is a claim: judged again at post time
        return _post_judged(args, env, [(args.results, results)], policy, pr, sha, head_repo, verify, folder=False)
    if policy is not None:
        if args.thresholds_in_repo:
            raise UsageError("--dry-run cannot read the budgets from vLLM's tree (that needs GitHub's API)",
                             hint="give --trusted-thresholds alone for an offline re-judge")
        results = rejudge(results, _trusted(gate.for_model(policy, results.run.model)), source=args.results)
    elif contradiction := self_contradiction(results):  # trusted, yet damaged: its verdict is not its checks'
        raise UsageError(f"{args.results}: verdict: {contradiction}; refusing to post",
                         hint="results files are written by `guard check`; re-run it rather than editing one")
    shown = _rendered(args, results)
    for line in workflow_commands.annotations(results):
        print(line)
    if args.dry_run:
        _print_dry_run(shown.body, shown.status, pr, sha, env, shown.finding)
        return 0
    _summarise(env, shown)
    gh, owner, name = _client(args, env)
    if pr is None:
        raise UsageError("no pull-request number: pass --pr or --pr-file, or run inside a pull_request workflow")
    mark = rendering.marker(results.run.model, results.run.profile)
    report = publish.publish(gh, owner=owner, repo=name, number=pr, mark=mark, body=shown.body, status=shown.status,
                             sha=sha, author=args.author, verify=verify, expected_head_repo=head_repo,
                             finding=shown.finding, summary=shown.summary)
    return _said(report)


def _trusted(policy: TrustPolicy):
    if policy.thresholds_text is None:
        raise UsageError(f"--trusted-thresholds {policy.thresholds_path}: not found in this checkout; the "
                         "results cannot be re-judged against the default branch's budgets, so nothing is posted")
    return load_thresholds(policy.thresholds_path, text=policy.thresholds_text)


def _client(args: argparse.Namespace, env: dict[str, str]):
    token = _token(env, "the comment or the status")
    owner, name = inputs.parse_repository(env.get("GITHUB_REPOSITORY", ""), source="GITHUB_REPOSITORY")
    gh = client.github_client(token, _api_url(env),
                              retry=client.RetryPolicy(attempts=args.max_attempts, base_s=args.backoff_base))
    return gh, owner, name


def _api_url(env: dict[str, str]) -> str:
    return env.get("GITHUB_API_URL") or client.DEFAULT_API_URL


def _rendered(args: argparse.Namespace, results: Results, budgets: str | None = None, extra: str = "") -> gate.Rendered:
    """A judged result as posted: comment body, status, finding?, one-line summary, the whole report."""
    report_md = None
    if args.report is not None:
        try:
            report_md = read_input(args.report).decode("utf-8")
        except OSError as exc:
            raise UsageError(f"--report: cannot read {args.report}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise UsageError(f"--report: {args.report} is not UTF-8 text") from None
    run_url = args.run_url or None
    if args.history_base is not None:
        commit_flag("--history-base", args.history_base)
    history = pr_standing(results, load_history(args.history), args.history_base) if args.history else None
    report_text = report_md if report_md is not None else render_markdown(
        results, run_url=run_url, thresholds=budgets or args.trusted_thresholds, history=history)
    if extra:
        report_text = f"{extra}\n{report_text}"
    body = rendering.comment_body(results, run_url=run_url, report=report_text)
    return gate.Rendered(body, rendering.commit_status(results, run_url), has_finding(results), summary_line(results),
                         report_text)


def _post_judged(args: argparse.Namespace, env: dict[str, str], runs: list[tuple[str, Results]], policy: TrustPolicy,
                 pr: int | None, sha: str | None, head_repo: str | None, verify: bool, folder: bool) -> int:
    """The privileged post (guard.github.gate): read the pull request, judge each run again, post once."""
    if not args.thresholds_in_repo:  # guard's own budgets judge offline: the job summary has the verdict even if GitHub fails
        for source, results in runs:
            try:
                trusted = _trusted(gate.for_model(policy, results.run.model))
                _summarise(env, _rendered(args, rejudge(results, trusted, source=source)))
            except UsageError:
                pass  # decided below, once the pull request's changes are known
    gh, owner, name = _client(args, env)
    if pr is None:
        raise UsageError("no pull-request number: pass --pr or --pr-file, or run inside a pull_request workflow")
    ctx = gate.open_context(gh, owner, name, _api_url(env), pr, sha, head_repo, verify)
    render = lambda judged, path, notice: _rendered(args, judged, budgets=path, extra=notice)  # noqa: E731
    posts = []
    for source, results in runs:
        post, policy = gate.judge_one(ctx, results, source, args.thresholds_in_repo, policy, args.accept_label,
                                      render, say)
        posts.append(post)
    profile = runs[0][1].run.profile if runs else (args.profile or "cpu")
    why_none = ""
    if folder:
        missing, why = gate.missing_models(ctx, [p.model for p in posts])
        skipped = gate.not_run_in(Path(args.results_dir))
        posts += [gate.ModelPost(m, None, f"not run on this runner: {skipped[m]}", not_run=True) if m in skipped
                  else gate.ModelPost(m, None, "the pull request concerns this model, but its run left no results")
                  for m in missing]
        why_none = f"nothing guard measures changed ({why})"
        mark = rendering.marker(gate.ALL_MODELS, profile)
        status = gate.combined_status(profile, posts, args.run_url or None, why_none)
        body = gate.combined_body(mark, posts, why_none)
    else:
        mark = rendering.marker(runs[0][1].run.model, profile)
        only = posts[0]
        status = only.rendered.status if only.rendered else rendering.no_results_status(
            only.model, profile, "results not re-judged")
        body = only.rendered.body if only.rendered else (
            f"{mark}\n## guard: not judged\n\nThe run's results could not be judged again here: {text(only.problem)}\n")
    finding = any(p.rendered is None or p.rendered.finding for p in posts)
    if folder:
        _summarise(env, gate.Rendered(body, status, finding, status.description, body))
    elif args.thresholds_in_repo and posts[0].rendered:
        _summarise(env, posts[0].rendered)
    report = publish.PublishReport()
    body, status = publish.apply_trust(ctx.pull, ctx.head, body, status, policy, report, files=ctx.files,
                                       reviews=ctx.reviews)
    refused = [p for p in posts if p.refused]
    if refused and (not report.protected or report.approved):
        raise UsageError(refused[0].problem)
    if refused:  # judged by code the pull request changes: its status says that, not "inconsistent"
        say("guard comment: the artifact does not re-judge; the pull request changes what judges it, so it gets the "
            "status that asks for a maintainer's approved run")
    for p in posts:
        for line in workflow_commands.annotations(p.judged) if p.judged else ():
            print(line)
    finding = finding or (bool(report.protected) and not report.approved)
    code = _said(publish.post(gh, ctx.pull, head=ctx.head, mark=mark, body=body, status=status, author=args.author,
                              finding=finding, summary=status.description, report=report))
    if args.findings is not None:
        _record_findings(args.findings, posts, pr, ctx.head, args.run_url or "")
    return code


def _record_findings(path: str, posts: list[gate.ModelPost], pr: int, head: str, note: str) -> None:
    """Shadow mode: each judged model's run, as posted, into the findings store."""
    from guard.files import writing
    from guard.history.findings import record_run, run_from_results

    with writing(path, "--findings"):
        for p in posts:
            if p.recorded is None:
                continue
            done = record_run(path, run_from_results(p.recorded, pr=pr, head=head, accepted_by=p.accepted_by, note=note))
            say(f"guard comment: {p.model}: findings {'recorded' if done.appended else 'already recorded'} "
                f"on line {done.line} of {path}")


def _summarise(env: dict[str, str], shown: gate.Rendered) -> None:
    """The job summary: one line always, the report with a finding."""
    report = "\n\n" + rendering.trim_body(shown.report, workflow_commands.SUMMARY_LIMIT) if shown.finding else ""
    _job_summary(env, text(shown.summary) + report)


def run_for_buildkite(args: argparse.Namespace, env: dict[str, str]) -> int:
    """--buildkite-measuring-pipeline: the target and the artifacts from Buildkite's own records."""
    if args.pr or args.pr_file or args.sha or args.sha_file or args.expected_head_repo:
        raise UsageError("--buildkite-measuring-pipeline takes the PR, the commit and the head repository from "
                         "Buildkite's records: give none of --pr, --pr-file, --sha, --sha-file, --expected-head-repo")
    measuring = buildkite.slug(args.buildkite_measuring_pipeline, "--buildkite-measuring-pipeline")
    token = (env.get("BUILDKITE_API_TOKEN") or "").strip()
    if not token:
        raise UsageError("BUILDKITE_API_TOKEN is not set: the poster reads the measured build from Buildkite's API",
                         hint="a token with read_builds and read_artifacts, in the poster pipeline's environment")
    api = buildkite.BuildkiteAPI(token, buildkite.slug(env.get("BUILDKITE_ORGANIZATION_SLUG", ""),
                                                       "BUILDKITE_ORGANIZATION_SLUG"),
                                 env.get("BUILDKITE_API_URL") or buildkite.DEFAULT_API_URL)
    try:
        build = buildkite.measured_build(api, env, measuring)
    except buildkite.ForgedTarget as exc:
        say(f"guard comment: nothing posted: {one_line(str(exc), 300)}")
        raise
    say(f"guard comment: measured by {build.describe()}")
    art = Path(tempfile.mkdtemp(prefix="guard-buildkite-"))
    got = buildkite.download_artifacts(api, build, art, ("guard-results/", "guard-pr/"))
    args.sha, args.expected_head_repo = build.commit, build.head_repo
    args.run_url = args.run_url or build.web_url
    if args.results_dir is not None:  # every model (guard pr --model auto): the folder as the build uploaded it
        folder = Path(args.results_dir)
        if folder.is_absolute() or ".." in folder.parts:
            raise UsageError(f"--results-dir {args.results_dir}: with --buildkite-measuring-pipeline, give the folder's "
                             "path inside the measured build's artifacts, e.g. guard-results")
        args.results_dir = str(art / folder)
    elif "guard-results/results.json" not in got:
        args.no_results = args.no_results or f"the Buildkite build {build.number} ended before writing results"
        args.model, args.profile = args.model or "deepseek-ocr-2", args.profile or "cpu"
        return run_without_results(args, env)
    for name, flag in (("pr_number.txt", "pr_file"), ("head_sha.txt", "sha_file")):
        if f"guard-pr/{name}" not in got:
            raise buildkite.ForgedTarget(f"build {build.number} of {measuring} uploaded no guard-pr/{name}; refusing to post")
        setattr(args, flag, str(art / "guard-pr" / name))
    claimed = inputs.parse_pr_number(inputs.read_small_file(args.pr_file, what="guard-pr/pr_number.txt"),
                                     source="guard-pr/pr_number.txt")
    if claimed != build.pr:
        raise buildkite.ForgedTarget(f"the artifact names pull request #{claimed}, but Buildkite built #{build.pr}; "
                                     "refusing to post")
    args.results = str(art / "guard-results" / "results.json")
    args.buildkite_measuring_pipeline = None  # the target is settled: post as for an Actions artifact
    return run(args)


def _said(report: publish.PublishReport) -> int:
    """Print what was posted; exit 4 when GitHub kept failing."""
    for line in report.retries:
        say(f"guard comment: retried {one_line(line)}")
    if report.comment:
        extra = f", deleted {len(report.deleted)} stale duplicate(s)" if report.deleted else ""
        say(f"guard comment: comment {report.comment}: {one_line(report.comment_url or report.pr_url)}{extra}")
    elif report.pr_url and not report.forbidden and not report.errors:
        say("guard comment: no finding: no comment posted (the status says it)")
    if report.status:
        say(f"guard comment: status {report.status.state} '{one_line(report.status.context)}' on {report.status_sha}")
    if report.protected:
        how = "approved by a maintainer's review" if report.approved else "needs a run approved by a maintainer"
        say(f"guard comment: this PR changes {len(report.protected)} protected file(s): "
            f"{one_line(', '.join(report.protected[:10]))}; {how}")
    for refused in report.forbidden:
        print(workflow_commands.workflow_command("warning", refused, title="guard comment: not published"))
    if report.forbidden:
        say(f"guard comment: warning: GitHub refused {len(report.forbidden)} step(s), see above. "
              f"{publish.READ_ONLY_EXPLANATION}")
    if report.errors:
        raise client.GitHubSideError("; ".join(report.errors),
                                     hint="GitHub's side failed; the perf verdict above still stands. Re-run this job")
    return 0
