"""Find the commit that changed the census: a binary search between a good and a bad vLLM revision.

Stages: budgets and the line of commits (validated before a minute is spent) -> good measured
(guard.revisions.sides, the same environments and cache as ``guard pr``) -> guard.revisions.bisect
probes commits, each judged against good by guard.judge.evaluate.evaluate_pr (or only in the named
function or op) -> the culprit against its parent, with the lines it added inside the grown
function -> terminal, and ``bisect.json`` in the output folder.

Exit 0: a culprit (or, beside skipped commits, a range of them) was named; 3: none could be (bad
does not differ from good, or good itself cannot be measured); 2: bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from guard import __version__
from guard.model import format as fmt
from guard.model.records import ABRecord
from guard.config.budgets import DEFAULT_THRESHOLDS, Profile, Thresholds
from guard.config.loading import load_thresholds
from guard.model.readings import folded
from guard.files import prepare_output
from guard.report.terminal import added_lines
from guard.errors import ExitCode, InvalidRunError, UsageError
from guard.judge.evaluate import DEFAULT_OUTPUT, evaluate_pr
from guard.measure.hardware import detect
from guard.measure.fit import select_profile
from guard.judge.opnames import check_op_name, check_op_names
from guard.model.jsonfiles import write_json_atomic
from guard.model.records import RunRecord, Status, Verdict, reasons_text
from guard.model.results import PullRequestDiff, Results, RevisionInfo
from guard.revisions import bisect, git, inrepo, installed, overlay
from guard.revisions.sides import function_changes, profile_side, side_modules


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vllm-repo", required=True, metavar="PATH", help="a git clone of vLLM holding both revisions")
    parser.add_argument("--good", required=True, metavar="REV", help="a revision whose census is as it should be")
    parser.add_argument("--bad", required=True, metavar="REV", help="a later revision whose census differs")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--function", default=None, metavar="FILE:QUALNAME",
                       help="look for the first commit that changed this census function's counts (any change)")
    which.add_argument("--op", default=None, metavar="OP",
                       help="look for the first commit that changed this op's calls per request (any change)")
    parser.add_argument("--profile", default="auto", help="hardware profile: auto (default), cpu, a10, ...")
    parser.add_argument("--thresholds", default=DEFAULT_THRESHOLDS, help="budget YAML (default: %(default)s)")
    parser.add_argument("--thresholds-in-repo", default=None, metavar="PATH",
                        help="read the budget YAML from the vLLM repository instead, at this repository-relative path, "
                             "as good has it (good's copy judges every commit, as base's does in guard pr)")
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help="folder for bisect.json and the runs (default: %(default)s)")
    parser.add_argument("--cache-dir", default=None, metavar="DIR",
                        help="the same cache as guard pr (default: $GUARD_CACHE_DIR/pr, else ~/.cache/guard/pr)")
    parser.add_argument("--cache-max-gb", type=float, default=overlay.DEFAULT_MAX_BYTES / 1024**3,
                        help="keep the cache below this size (default: %(default)g)")
    parser.add_argument("--stack-python", default=None, metavar="PYTHON",
                        help="borrow the compiled files of the vLLM installed for this python, as guard pr does")


def say(message: str) -> None:
    print(f"guard bisect: {message}", flush=True)


def _budgets(args: argparse.Namespace):
    """``--thresholds``, or ``--thresholds-in-repo`` as good has it (guard.revisions.inrepo)."""
    if args.thresholds_in_repo is None:
        return load_thresholds(args.thresholds)
    if args.thresholds != DEFAULT_THRESHOLDS:
        raise UsageError("give --thresholds or --thresholds-in-repo, not both")
    repo = git.open_repository(args.vllm_repo)
    return inrepo.load_at(repo, git.resolve(repo, args.good, "--good"), args.thresholds_in_repo, "good")[0]


def line_of_commits(repo: Path, good: git.Revision, bad: git.Revision) -> list[bisect.Commit]:
    """The first-parent commits after good up to bad, oldest first, each with what it changed."""
    if git.git(repo, "merge-base", "--is-ancestor", good.sha, bad.sha, check=False).returncode != 0:
        raise UsageError(f"--good {good.rev} is not an ancestor of --bad {bad.rev}",
                         hint="give an older good revision on bad's first-parent line")
    out = git.git(repo, "log", "--first-parent", "--reverse", "--format=%H%x00%aI%x00%s", f"{good.sha}..{bad.sha}").stdout
    commits = []
    for line in out.splitlines():
        sha, date, subject = line.split("\0", 2)
        files = git.diff_names(repo, f"{sha}^", sha)
        trees = {git.git(repo, "rev-parse", "--verify", "--quiet", f"{r}:{git.PACKAGE}", check=False).stdout.strip()
                 for r in (sha, f"{sha}^")}
        commits.append(bisect.Commit(sha=sha, subject=subject, author_date=date,
                                     unmeasurable=tuple(f for f in files if git.unmeasurable(f)),
                                     python_changed=len(trees) > 1))
    if not commits:
        raise UsageError(f"no commits between --good {good.rev} and --bad {bad.rev}")
    return commits


def differs(results: Results, function: str | None, op: str | None) -> str | None:
    """Why this revision differs from good (None: it does not), by the chosen test."""
    if function is not None:
        moved = [c for c in results.census_checks if c.function == function]
        return f"{function}: {fmt.census_calls(moved[0])} op calls ({fmt.census_ops(moved[0])})" if moved else None
    if op is not None:
        total = {}
        for side, run in (("good", results.ab.baseline), ("this", results.run)):
            total[side] = {size: sum(ops.get(op, 0) for ops in folded(fns).values()) for size, fns in run.census.items()}
        changed = [f"{size} {total['good'].get(size, 0)} → {n}" for size, n in sorted(total["this"].items())
                   if n != total["good"].get(size, 0)]
        return f"{op} per request: {', '.join(changed)}" if changed else None
    if results.verdict == Verdict.REGRESSION:
        first = results.failed[0]
        more = f" (and {len(results.failed) - 1} more)" if len(results.failed) > 1 else ""
        return fmt.failure(first) + more
    return None


def judge(profile: Profile, candidate: RunRecord, baseline: RunRecord, base: RevisionInfo, head: RevisionInfo,
          repo: Path) -> Results:
    pr = PullRequestDiff(repository=str(repo), base=base, head=head)
    rec = ABRecord(candidate=candidate, baseline=baseline, baseline_python="")
    return evaluate_pr(profile, rec, pr, guard_version=__version__)


def run(args: argparse.Namespace) -> int:
    thresholds = _budgets(args)
    cache_limit = overlay.cache_limit_bytes(args.cache_max_gb)
    profile = select_profile(thresholds, args.profile, detect(quick=True))
    _check_chosen_test(args, profile)
    check_op_names(thresholds, profile)
    repo = git.open_repository(args.vllm_repo)
    good = git.resolve(repo, args.good, "--good")
    bad = git.resolve(repo, args.bad, "--bad")
    git.require_vllm(repo, good, bad)
    commits = line_of_commits(repo, good, bad)
    output = Path(args.output).resolve()
    prepare_output(output)
    cache_dir = Path(args.cache_dir).expanduser().resolve() if args.cache_dir else overlay.default_cache_dir()
    stack = overlay.engine_stack(args.stack_python and installed.resolve_python(args.stack_python, "--stack-python"))
    modules = side_modules(profile)
    expected = max(1, (len(commits) - 1).bit_length())
    say(f"{len(commits)} commits from {good.sha[:12]} (good) to {bad.sha[:12]} (bad); about {expected} to measure "
        f"after good, one profile pass each")

    t0 = time.perf_counter()
    try:  # each revision imports its modules in its own run before its engine (a cached one did)
        good_env = overlay.prepare(repo, good, cache_dir, stack, progress=say)
        good_record, cached = profile_side("good", good_env, profile, thresholds, output, say=say, imports=modules)
    except InvalidRunError as exc:
        say(f"good {good.sha[:12]} cannot be measured: {exc}")
        return int(ExitCode.INVALID)
    if good_record.invalid_reasons:
        say(f"good {good.sha[:12]} cannot be measured: {reasons_text(good_record.invalid_reasons)}")
        return int(ExitCode.INVALID)
    probe = _Probe(repo=repo, commits=commits, cache_dir=cache_dir, stack=stack, profile=profile, thresholds=thresholds,
                  output=output, modules=modules, function=args.function, op=args.op,
                  good=RevisionInfo(good.rev, good.sha, good.subject), records={-1: good_record}, envs=[good_env],
                  measured=0 if cached else 1)
    try:
        steps, lo, hi = bisect.search(commits, probe)
    finally:
        overlay.evict(cache_dir, cache_limit, keep={e.root for e in probe.envs})
    named = bisect.culprits(commits, steps, lo, hi)
    outcome = bisect.Outcome(steps=tuple(steps), culprits=named, first_bad=hi if hi >= 0 else None, last_good=lo,
                             measured=probe.measured, skipped=tuple(s for s in steps if s.state == bisect.State.SKIP))
    detail = culprit_detail(profile, repo, commits, probe.records, good, outcome)
    write_json_atomic(output / "bisect.json", outcome_dict(outcome, good, bad, detail))
    print()
    return report(outcome, detail, good, time.perf_counter() - t0, output)


def _check_chosen_test(args: argparse.Namespace, profile: Profile) -> None:
    """The test that tells a commit from good (--function, --op, else the op budgets and the census
    rule) is one this profile can run."""
    if profile.census is None and args.op is None and not profile.ops:
        raise UsageError(f"profile '{profile.name}' has no census rule and no op budgets: nothing to bisect on")
    if (args.op is not None or args.function is not None) and profile.census is None:
        raise UsageError(f"{'--op' if args.op is not None else '--function'} reads the census, and profile "
                         f"'{profile.name}' has no census rule", hint="bisect on its op budgets (no --op/--function)")
    if args.function is not None:
        file, _, qualname = args.function.partition(":")
        if not file.endswith(".py") or not qualname.strip():
            raise UsageError(f"--function {args.function!r}: expected FILE:QUALNAME as the census names it",
                             hint="e.g. vllm/model_executor/models/deepseek_ocr2.py:DeepseekOCR2ForCausalLM._encode_global_features")
    if args.op is not None:
        check_op_name(args.op, "--op")


@dataclasses.dataclass
class _Probe:
    """What ``bisect.search`` asks of a commit: profiled in its own environment and judged against
    good by the chosen test. Keeps what comes after the search: each judged commit's record (good's
    at -1), every environment prepared (the cache eviction keeps them) and how many revisions were
    profiled rather than read from the cache."""

    repo: Path
    commits: list[bisect.Commit]
    cache_dir: Path
    stack: overlay.EngineStack
    profile: Profile
    thresholds: Thresholds
    output: Path
    modules: list[str]
    function: str | None  # --function
    op: str | None  # --op
    good: RevisionInfo
    records: dict[int, RunRecord]
    envs: list[overlay.SideEnvironment]
    measured: int

    def __call__(self, i: int) -> bisect.Step:
        c = self.commits[i]
        t = time.perf_counter()
        label = f"[{i + 1}/{len(self.commits)}] {c.sha[:12]} {c.subject[:50]}"
        step = dataclasses.replace(self._measure_and_judge(i, c), seconds=time.perf_counter() - t)
        say(f"{label}: {step.state}{'' if step.measured else ' (not profiled)'} in {step.seconds:.0f} s: {step.why}")
        return step

    def _measure_and_judge(self, i: int, c: bisect.Commit) -> bisect.Step:
        if c.unmeasurable:
            return bisect.Step(i, c, bisect.State.SKIP, f"changes compiled code or dependencies ({', '.join(c.unmeasurable[:3])})",
                               measured=False)
        rev = git.resolve(self.repo, c.sha, "commit")
        try:
            env = overlay.prepare(self.repo, rev, self.cache_dir, self.stack, progress=say)
            self.envs.append(env)
            record, hit = profile_side(f"commit-{i + 1}", env, self.profile, self.thresholds, self.output, say=say,
                                       imports=self.modules)
        except InvalidRunError as exc:
            return bisect.Step(i, c, bisect.State.SKIP, f"does not import: {exc.args[0]}", measured=False)
        self.measured += 0 if hit else 1
        if record.invalid_reasons:
            return bisect.Step(i, c, bisect.State.SKIP, f"invalid run: {record.invalid_reasons[0]}", measured=not hit)
        self.records[i] = record
        res = judge(self.profile, record, self.records[-1], self.good, RevisionInfo(c.sha, c.sha, c.subject), self.repo)
        why = differs(res, self.function, self.op)
        return bisect.Step(i, c, bisect.State.BAD if why else bisect.State.GOOD, why or "same as good", measured=not hit)


def culprit_detail(profile: Profile, repo: Path, commits: list[bisect.Commit], records: dict[int, RunRecord],
                   good: git.Revision, outcome: bisect.Outcome) -> Results | None:
    """The culprit against its parent (when the parent was measured, else against good), with the
    lines it added inside each function that grew."""
    if len(outcome.culprits) != 1 or outcome.first_bad is None or outcome.first_bad not in records:
        return None
    i = outcome.first_bad
    parent_i = i - 1 if (i - 1) in records else -1
    parent = git.resolve(repo, good.sha if parent_i < 0 else commits[parent_i].sha, "parent")
    culprit = git.resolve(repo, commits[i].sha, "culprit")
    res = judge(profile, records[i], records[parent_i], RevisionInfo(parent.sha, parent.sha, parent.subject),
                RevisionInfo(culprit.sha, culprit.sha, culprit.subject), repo)
    changes = function_changes(repo, parent, culprit, res)
    return dataclasses.replace(res, pr=dataclasses.replace(res.pr, function_changes=changes))


def outcome_dict(outcome: bisect.Outcome, good: git.Revision, bad: git.Revision, detail: Results | None) -> dict:
    return {
        "schema": "guard/bisect", "schema_version": 1, "good": good.sha, "bad": bad.sha,
        "measured_revisions": outcome.measured,
        "steps": [{"sha": s.commit.sha, "subject": s.commit.subject, "state": str(s.state), "why": s.why,
                   "seconds": round(s.seconds, 1), "profiled": s.measured} for s in outcome.steps],
        "culprits": [{"sha": c.sha, "subject": c.subject, "author_date": c.author_date} for c in outcome.culprits],
        "census_diff": [{"function": c.function, "image_size": list(c.image_size), "baseline_calls": c.baseline_calls,
                         "measured_calls": c.measured_calls, "status": str(c.status),
                         "op_deltas": [{"op": d.op, "delta_calls": d.delta_calls} for d in c.op_deltas]}
                        for c in (detail.census_checks if detail else ())],
        "added_lines": [{"function": f.function, "lines": [{"line": n, "text": t} for n, t in f.lines]}
                        for f in (detail.pr.function_changes if detail else ())],
    }


def report(outcome: bisect.Outcome, detail: Results | None, good: git.Revision, seconds: float, output: Path) -> int:
    say(f"{outcome.measured} revision(s) profiled (good included), {len(outcome.skipped)} skipped, {seconds:.0f} s; "
        f"wrote {output / 'bisect.json'}")
    if not outcome.culprits:
        say(f"bad does not differ from good {good.sha[:12]} by this test: no culprit")
        return int(ExitCode.INVALID)
    if len(outcome.culprits) > 1:
        print("The first commit that differs is one of these (the others could not be measured here):")
        for c in outcome.culprits:
            print(f"  {c.sha} {c.author_date} {c.subject}")
        return int(ExitCode.PASS)
    (c,) = outcome.culprits
    print(f"culprit: {c.sha} {c.subject}")
    print(f"  author date: {c.author_date}")
    for s in outcome.skipped:
        print(f"  skipped: {s.commit.sha[:12]} {s.commit.subject[:60]}: {s.why}")
    if detail is not None:
        grown = [ch for ch in detail.census_checks if ch.status == Status.FAIL] or list(detail.census_checks)
        if grown:
            print("  census, against its parent:")
            for ch in grown[:10]:
                print(f"    {ch.function} [{fmt.size(ch.image_size)}]: {fmt.census_calls(ch)} ({fmt.census_ops(ch)})")
        for line in added_lines(detail.pr.function_changes):
            print(line)
    return int(ExitCode.PASS)
