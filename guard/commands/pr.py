"""Judge a vLLM pull request: base and head of a vLLM git repository, measured side against side.

Stages: budgets and revisions (validated before a minute is spent) -> one environment per side
(guard.revisions.overlay: the revision's ``vllm/`` over the installed engine stack, cached by tree
hash) -> an import check per side, before anything is measured (``--only ops``: the first side
profiled checks its own, in its run) -> run (``--only ops``: each side's profile pass, one after the
other; else A/B, head as the candidate and base as the baseline) -> guard.judge.evaluate.evaluate_pr ->
the lines the pull request added inside each function that moved -> report (terminal,
results.json, report.md), as ``guard check`` writes them.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

from guard import __version__
from guard.model.records import ABRecord, Measures
from guard.config.budgets import DEFAULT_THRESHOLDS, Profile, Thresholds
from guard.config.loading import load_thresholds
from guard.config.census import read_baseline
from guard.files import prepare_output
from guard.report.output import write_report
from guard.commands.matrix import add_model_argument, run_models, write_summary
from guard.config import models
from guard.errors import InvalidRunError, UsageError
from guard.judge.evaluate import DEFAULT_OUTPUT, budget_notices, evaluate_pr, pr_notices
from guard.measure.hardware import Hardware, detect
from guard.measure.fit import select_profile
from guard.measure.harness import empty_record, record_ab
from guard.judge.opnames import check_op_names
from guard.model.records import InvalidReason, ReasonKind, Verdict
from guard.model.results import PullRequestDiff, Results, RevisionInfo
from guard.model.verdict import settled
from guard.revisions import git, inrepo, installed, overlay, scopes
from guard.revisions.sides import function_changes, profile_side, side_cache, side_modules, side_python
from guard.report.terminal import render_terminal, say_dtype

SIDES = ("base", "head")
AUTO = "auto"  # --model auto: the models the pull request's changed files concern
MODEL_FIELD = "{model}"  # in --thresholds-in-repo with --model: each model's own budget file


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vllm-repo", required=True, metavar="PATH", help="a git clone of vLLM holding both revisions")
    parser.add_argument("--base", required=True, metavar="REV",
                        help="the revision the pull request is judged against (on GitHub: the merge ref's first parent)")
    parser.add_argument("--head", required=True, metavar="REV", help="the pull request's revision (on GitHub: its merge ref)")
    parser.add_argument("--only", choices=["ops"], default=None,
                        help="ops: the op budgets and the census only, no TTFT; each side's profile pass runs alone, "
                             "one after the other (minutes on a CPU runner)")
    parser.add_argument("--profile", default="auto", help="hardware profile: auto (default), cpu, a10, ...")
    parser.add_argument("--thresholds", default=DEFAULT_THRESHOLDS, help="budget YAML (default: %(default)s)")
    parser.add_argument("--thresholds-in-repo", default=None, metavar="PATH",
                        help="read the budget YAML from the vLLM repository instead, at this repository-relative "
                             "path, as base has it (base's copy judges both sides; head's changes to it are reported, "
                             "never applied); files it names resolve in the same revision")
    parser.add_argument("--output", default=DEFAULT_OUTPUT,
                        help="folder for results.json, report.md and each side's run (default: %(default)s)")
    parser.add_argument("--cache-dir", default=None, metavar="DIR",
                        help="where each revision's environment and op counts are kept (default: $GUARD_CACHE_DIR/pr, "
                             "else ~/.cache/guard/pr)")
    parser.add_argument("--cache-max-gb", type=float, default=overlay.DEFAULT_MAX_BYTES / 1024**3,
                        help="keep the cache below this size, least recently used entries out first (default: %(default)g)")
    parser.add_argument("--base-python", default=None, metavar="PYTHON",
                        help="base's own environment: the python of a venv (or image) with base's vLLM and torch "
                             "installed; default: base's vllm/ over the compiled files of guard's vLLM wheel")
    parser.add_argument("--head-python", default=None, metavar="PYTHON",
                        help="head's own environment, likewise; with both, compiled code and dependency changes "
                             "are measured too (docs/pr.md, environments per side)")
    parser.add_argument("--stack-python", default=None, metavar="PYTHON",
                        help="the overlay borrows the compiled files of the vLLM installed for this python instead of "
                             "guard's wheel: e.g. a venv with vLLM's own CPU wheel of base's commit (docs/pr.md)")
    parser.add_argument("--fresh", action="store_true", help="profile both sides again even when their op counts are cached")
    add_model_argument(parser, auto="; `auto`: the models the changed files concern (shared code: all; a model's "
                                    "own files: that model; docs/pr.md)")


def unjudged(profile: Profile, thresholds: Thresholds, pr: PullRequestDiff,
             reasons: Sequence[InvalidReason] = ()) -> Results:
    """A pull request with nothing to measure (the same vllm/ Python on both sides) or whose
    sides could not run: no run record beyond why."""
    run = empty_record(profile, thresholds, invalid_reasons=list(reasons))
    return settled(Results(verdict=Verdict.INVALID, run=run, guard_version=__version__, notices=tuple(pr_notices(pr)),
                           pr=pr))


def run(args: argparse.Namespace) -> int:
    if getattr(args, "model", None) is not None:
        if args.thresholds_in_repo is not None and MODEL_FIELD not in args.thresholds_in_repo:
            raise UsageError(f"--model with --thresholds-in-repo needs {MODEL_FIELD} in the path, one budget file per "
                             "model", hint=f"e.g. --thresholds-in-repo .buildkite/guard/{MODEL_FIELD}.yaml")
        if models.canonical(args.model) == AUTO:
            return _run_auto(args)
        return run_models(args, _run_one, "pr")
    return _run_one(args)


def _run_one(args: argparse.Namespace) -> int:
    thresholds, budget_files, in_repo = _budgets(args)
    hw = detect(quick=True)
    profile = select_profile(thresholds, args.profile, hw)
    ops_only = args.only == Measures.OPS
    if not profile.has_op_count_pass and ops_only:
        raise UsageError(f"profile '{profile.name}' has no op budgets and no census: --only ops would judge nothing")
    cache_limit = overlay.cache_limit_bytes(args.cache_max_gb)
    check_op_names(thresholds, profile)
    repo, base, head = _revisions(args)
    output = Path(args.output).resolve()
    prepare_output(output)
    cache_dir = Path(args.cache_dir).expanduser().resolve() if args.cache_dir else overlay.default_cache_dir()

    plan = _plan(args, repo, base, head, cache_dir, budget_files, in_repo)
    pr = plan.pr
    _say_sides(thresholds, profile, hw, pr, base, head)
    if plan.broken is not None:
        return _unmeasurable_revision(plan.broken, profile, thresholds, pr, output, time.perf_counter(),
                                      _named(args, in_repo))
    say(f"{len(plan.changed)} file(s) changed, {len(git.runtime_files(plan.changed))} under {git.PACKAGE}/, "
        f"{len(pr.unmeasured_files)} not measurable here (compiled code, dependencies)")
    t0 = time.perf_counter()
    if not pr.measured:
        results = unjudged(profile, thresholds, pr)
        return finish(results, output, t0, thresholds=_named(args, in_repo))

    envs: dict = dict(plan.own)
    try:
        checks = _prepare_environments(envs, plan, repo, base, head, cache_dir, profile, args.fresh, ops_only)
    except InvalidRunError as exc:
        return _unmeasurable_revision(exc, profile, thresholds, pr, output, t0, _named(args, in_repo))
    finally:
        dropped = overlay.evict(cache_dir, cache_limit,
                                keep={e.root for n, e in envs.items() if n not in plan.own})
        if dropped:
            say(f"cache over {args.cache_max_gb:g} GB: dropped {len(dropped)} least recently used environment(s)")

    say_dtype(profile, "guard pr")
    if ops_only:
        try:
            rec = _profile_each_side(envs, checks, profile, thresholds, output, args.fresh)
        except InvalidRunError as exc:  # the self-checked side did not import: nothing was measured
            return _unmeasurable_revision(exc, profile, thresholds, pr, output, t0, _named(args, in_repo))
    else:
        rec = _run_ab(envs, profile, thresholds, output, args.fresh)
    results = evaluate_pr(profile, rec, pr, guard_version=__version__, output=output,
                          census_baseline=read_baseline(profile.census))
    results = _with_function_changes(results, repo, base, head)
    results = _with_gone_scopes(results, profile, rec, repo, base, head, plan.changed)
    return finish(results, output, t0, thresholds=_named(args, in_repo))


def _revisions(args: argparse.Namespace) -> tuple[Path, git.Revision, git.Revision]:
    """The vLLM repository and its two revisions, which must differ."""
    repo = git.open_repository(args.vllm_repo)
    base = git.resolve(repo, args.base, "--base")
    head = git.resolve(repo, args.head, "--head")
    git.require_vllm(repo, base, head)
    if base.sha == head.sha:
        raise UsageError(f"--base {args.base} and --head {args.head} are the same commit ({base.sha[:12]}): nothing to compare",
                         hint="--base is what the pull request merges into (e.g. its merge base with main), --head its last commit")
    return repo, base, head


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What guard pr knows before it builds or measures anything."""

    pr: PullRequestDiff  # the pull request as the report shows it
    changed: list[str]  # its changed files
    own: dict[str, installed.InstalledEnvironment]  # the sides run in an environment of their own
    broken: InvalidRunError | None  # why a side's own environment cannot run
    stack: overlay.EngineStack | None  # what the other sides' overlays borrow (None: both sides have their own)


def _plan(args: argparse.Namespace, repo: Path, base: git.Revision, head: git.Revision, cache_dir: Path,
          budget_files: tuple[str, ...], in_repo: str | None) -> _Plan:
    """The pull request's files and revisions, and where each side will run."""
    own, broken = _own_environments(args, repo, base, head, cache_dir)
    stack = overlay.engine_stack(args.stack_python and installed.resolve_python(args.stack_python, "--stack-python")) \
        if len(own) < len(SIDES) else None
    changed = git.changed_files(repo, base, head)
    # both sides built from their own revision: compiled code and dependencies are measured like Python
    unmeasured = () if len(own) == len(SIDES) else tuple(f for f in changed if git.unmeasurable(f))
    measured = base.package_tree != head.package_tree or (len(own) == len(SIDES) and own["base"].key != own["head"].key)
    revisions = {name: RevisionInfo(rev.rev, rev.sha, rev.subject, version=git.describe(repo, rev),
                                    environment=own[name].describe() if name in own
                                    else overlay.describe(stack, overlay.planned_shims(repo, rev, stack)),
                                    differs=len(own[name].differs) if name in own else 0)
                 for name, rev in (("base", base), ("head", head))}
    pr = PullRequestDiff(repository=str(repo), base=revisions["base"], head=revisions["head"],
                         changed_files=tuple(changed), unmeasured_files=unmeasured, measured=measured)
    pr = _with_budget_source(pr, in_repo, repo, base, head, budget_files, changed)
    return _Plan(pr=pr, changed=changed, own=own, broken=broken, stack=stack)


def _say_sides(thresholds: Thresholds, profile: Profile, hw: Hardware, pr: PullRequestDiff, base: git.Revision,
               head: git.Revision) -> None:
    say(f"{thresholds.model}, profile '{profile.name}' on {hw.describe()}")
    for name, rev, info in (("base", base, pr.base), ("head", head, pr.head)):
        say(f"{name} {rev.sha[:12]} {rev.subject[:70]}")
        say(f"     {info.version or 'no version tag'}; runs in {info.environment}")


@dataclasses.dataclass(frozen=True)
class _Prepared:
    """What ``--only ops`` profiles each side with, found while preparing the environments: its place
    in the op-count cache, the modules the import check imports, the side that checks its own in its run."""

    caches: dict  # side -> guard.revisions.sides.SideCache (--only ops; else empty)
    modules: list[str]
    self_checked: set[str]


def _prepare_environments(envs: dict, plan: _Plan, repo: Path, base: git.Revision, head: git.Revision,
                          cache_dir: Path, profile: Profile, fresh: bool, ops_only: bool) -> _Prepared:
    """Each overlay side's environment, built or reused, into ``envs`` as it goes (so the caller's cache
    eviction keeps what was built even when a later step fails), then the import check of the sides
    that need one. An InvalidRunError: a side's revision cannot be measured here."""
    for name, rev in (("base", base), ("head", head)):
        if name in plan.own:
            continue
        envs[name] = overlay.prepare(repo, rev, cache_dir, plan.stack, progress=say)
        state = "cached" if envs[name].reused else f"built ({envs[name].linked} files linked from {plan.stack.version})"
        say(f"{name} environment {envs[name].root} ({state})")
    # a side whose op counts are cached imported fine when they were counted: same tree, same stack;
    # a side in its own environment was imported by installed.inspect
    caches = {n: side_cache(envs[n], profile, fresh) for n in SIDES} if ops_only else {}
    to_check = [n for n in SIDES if n not in plan.own and (n not in caches or caches[n].entry is None)]
    # --only ops: the first side profiled imports its modules in its own run, before its engine
    # (one process, not two); a later side is checked here, so a broken head costs no pass of base
    self_checked = set(to_check[:1]) if ops_only else set()
    upfront = [envs[n] for n in to_check if n not in self_checked]
    modules = side_modules(profile)
    if upfront:
        say(f"checking that {' and '.join(e.revision.rev for e in upfront)} import against the engine stack ...")
        overlay.check_imports(upfront, modules)
    return _Prepared(caches=caches, modules=modules, self_checked=self_checked)


def _profile_each_side(envs: dict, checks: _Prepared, profile: Profile, thresholds: Thresholds, output: Path,
                       fresh: bool) -> ABRecord:
    """``--only ops``: each side's profile pass alone, one after the other. An InvalidRunError: the
    self-checked side did not import."""
    records = {name: profile_side(name, envs[name], profile, thresholds, output, fresh, say=say,
                                  imports=checks.modules if name in checks.self_checked else None,
                                  cache=checks.caches[name])[0]
               for name in SIDES}
    return ABRecord(candidate=records["head"], baseline=records["base"], baseline_python=str(envs["base"].python))


def _run_ab(envs: dict, profile: Profile, thresholds: Thresholds, output: Path, fresh: bool) -> ABRecord:
    """Both engines on this machine in alternation: head the candidate, base the baseline."""
    say("A/B: head is the candidate, base the baseline; both engines on this machine in alternation")
    return record_ab(thresholds, profile, output, candidate=side_python(envs["head"], "head"),
                     baseline=side_python(envs["base"], "base"),
                     fresh_baseline=fresh)


def _unmeasurable_revision(exc: InvalidRunError, profile: Profile, thresholds: Thresholds, pr: PullRequestDiff,
                           output: Path, t0: float, named: str) -> int:
    """A side's revision cannot be measured here (it does not import against the engine stack, or
    its environment cannot be built): an invalid run with the reason and its hint, nothing judged."""
    return finish(unjudged(profile, thresholds, pr, [InvalidReason(ReasonKind.REVISION, exc.args[0])]),
                  output, t0, hint=exc.hint, thresholds=named)


def _run_auto(args: argparse.Namespace) -> int:
    """``--model auto``: the models the changed files concern (guard.config.models.models_touched): all
    of them when shared code changed, else those whose census ran a changed model file."""
    if args.thresholds != DEFAULT_THRESHOLDS:
        raise UsageError("give --model or --thresholds, not both")
    repo = git.open_repository(args.vllm_repo)
    base, head = git.resolve(repo, args.base, "--base"), git.resolve(repo, args.head, "--head")
    git.require_vllm(repo, base, head)
    changed = git.changed_files(repo, base, head)
    chosen, why = models.chosen_for(changed)
    say(f"--model auto: {why}: {', '.join(chosen) if chosen else 'no model'} (docs/pr.md, \"Which models\")")
    if not chosen:
        print(f"guard pr: nothing to measure: no guarded model runs the Python this pull request changed "
              f"({len(changed)} file(s)); pass, exit 0")
        write_summary(Path(args.output), "pr", [], 0)  # the output folder says so too (a CI artifact keeps its shape)
        return 0
    return run_models(args, _run_one, "pr", chosen=chosen)


def _own_environments(args: argparse.Namespace, repo: Path, base: git.Revision, head: git.Revision,
                      cache_dir: Path) -> tuple[dict[str, installed.InstalledEnvironment], InvalidRunError | None]:
    """The sides given an interpreter of their own (--base-python/--head-python), as inspected; or
    why one cannot run (its vLLM does not import): an invalid run, not a usage error."""
    given = [(name, rev, installed.resolve_python(python, f"--{name}-python"))
             for name, rev, python in (("base", base, args.base_python), ("head", head, args.head_python)) if python]
    try:
        return {name: installed.inspect(python, repo, rev, name, cache_dir) for name, rev, python in given}, None
    except InvalidRunError as exc:
        return {}, exc


def say(message: str) -> None:
    print(f"guard pr: {message}", flush=True)


def _with_function_changes(results: Results, repo: Path, base: git.Revision, head: git.Revision) -> Results:
    changes = function_changes(repo, base, head, results)
    return dataclasses.replace(results, pr=dataclasses.replace(results.pr, function_changes=changes))


def _budgets(args: argparse.Namespace) -> tuple[Thresholds, tuple[str, ...], str | None]:
    """The budgets: ``--thresholds``, or ``--thresholds-in-repo`` as base has it (guard.revisions.inrepo),
    with the repository-relative files read for it (none for --thresholds) and the in-repo path (None:
    guard's own file judges)."""
    if args.thresholds_in_repo is None:
        return load_thresholds(args.thresholds), (), None
    repo = git.open_repository(args.vllm_repo)
    base = git.resolve(repo, args.base, "--base")
    path = args.thresholds_in_repo
    if MODEL_FIELD in path:  # one model of --model: its file in vLLM's tree, else guard's own
        path = path.replace(MODEL_FIELD, Path(args.thresholds).stem)
        if git.file_at(repo, base, inrepo.repo_path(path)) is None:
            say(f"{path} is not in base {base.sha[:12]}: guard's own {args.thresholds} judges")
            return load_thresholds(args.thresholds), (), None
    elif args.thresholds != DEFAULT_THRESHOLDS:
        raise UsageError("give --thresholds or --thresholds-in-repo, not both")
    thresholds, files = inrepo.load_at(repo, base, path, "base")
    return thresholds, files, inrepo.repo_path(path)


def _named(args: argparse.Namespace, in_repo: str | None) -> str:
    """The budget file as report.md's recipes name it."""
    return in_repo or args.thresholds


def _with_budget_source(pr: PullRequestDiff, in_repo: str | None, repo: Path, base: git.Revision,
                        head: git.Revision, files: tuple[str, ...], changed: list[str]) -> PullRequestDiff:
    """--thresholds-in-repo: where the budgets came from, and what head's copy would change (reported)."""
    if not in_repo:
        return pr
    source = inrepo.budget_source(repo, base, head, in_repo, files, changed)
    for line in budget_notices(source):
        say(line)
    return dataclasses.replace(pr, budgets=source)


def _with_gone_scopes(results: Results, profile: Profile, rec: ABRecord, repo: Path, base: git.Revision,
                      head: git.Revision, changed: list[str]) -> Results:
    """A budgeted scope whose function head no longer has: one reason naming the budget and where its
    code went (guard.revisions.scopes), in place of "was never entered" per image size."""
    gone = scopes.gone_scopes(profile, rec, repo, base, head, changed)
    if not gone:
        return results
    kept = [r for r in results.judged_invalid_reasons
            if not (r.kind == ReasonKind.SCOPE_NEVER_ENTERED and any(f"scope '{n}'" in r.text for n in gone))]
    return dataclasses.replace(results, judged_invalid_reasons=(*gone.values(), *kept))


def finish(results: Results, output: Path, t0: float, hint: str | None = None, thresholds: str | None = None) -> int:
    if results.pr is not None and results.pr.budgets is not None:  # not the temporary copy it was read from
        results = _budget_paths(results, results.pr.budgets.path)
    write_report(results, output, thresholds)
    print()
    print(render_terminal(results))
    if hint:
        print(f"hint: {hint}")
    print(f"guard pr: {time.perf_counter() - t0:.0f} s; wrote {output / 'results.json'} and {output / 'report.md'}")
    return results.exit_code


def _budget_paths(results: Results, path: str) -> Results:
    """Each side's recorded thresholds path as the repository names it."""
    run = dataclasses.replace(results.run, thresholds_path=path)
    ab = results.ab
    if ab is not None:
        ab = dataclasses.replace(ab, baseline=dataclasses.replace(ab.baseline, thresholds_path=path))
    return dataclasses.replace(results, run=run, ab=ab)
