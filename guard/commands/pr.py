"""Judge a vLLM pull request: base and head of a vLLM git repository, measured side against side.

Stages: budgets and revisions (validated before a minute is spent) -> one environment per side
(guard.revisions.overlay: the revision's ``vllm/`` over the installed engine stack, cached by tree
hash) -> an import check per side -> run (``--only ops``: each side's profile pass, one after the
other; else A/B, head as the candidate and base as the baseline) -> guard.evaluate.evaluate_pr ->
the lines the pull request added inside each function that moved -> report (terminal,
results.json, report.md), as ``guard check`` writes them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

from guard import __version__
from guard.abrunner import ABRecord
from guard.budgets import DEFAULT_THRESHOLDS, Profile, Thresholds, load_thresholds
from guard.commands.check import prepare_output, say_dtype, write_report
from guard.errors import InvalidRunError, UsageError
from guard.evaluate import DEFAULT_OUTPUT, evaluate_pr
from guard.hardware import detect, select_profile
from guard.harness import OPS_ONLY, read_record, run_suite
from guard.opnames import check_op_names, vacuous_budgets
from guard.results import (FunctionChange, PullRequestDiff, Results, RevisionInfo, RunRecord, Status, Verdict,
                           load_run, run_file_dict, write_json_atomic)
from guard.revisions import git, overlay
from guard.revisions.functions import lines_inside
from guard.terminal import render_terminal

MAX_LINES_PER_FUNCTION = 40
SIDES = ("base", "head")


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
    parser.add_argument("--output", default=DEFAULT_OUTPUT,
                        help="folder for results.json, report.md and each side's run (default: %(default)s)")
    parser.add_argument("--cache-dir", default=None, metavar="DIR",
                        help="where each revision's environment and op counts are kept (default: $GUARD_CACHE_DIR/pr, "
                             "else ~/.cache/guard/pr)")
    parser.add_argument("--cache-max-gb", type=float, default=overlay.DEFAULT_MAX_BYTES / 1024**3,
                        help="keep the cache below this size, least recently used entries out first (default: %(default)g)")
    parser.add_argument("--fresh", action="store_true", help="profile both sides again even when their op counts are cached")


def side_modules(profile: Profile) -> list[str]:
    """What the import check imports: the compiled ops' wrapper, the engine, and each budgeted scope's module."""
    modules = ["vllm._custom_ops", "vllm.v1.engine.llm_engine"]
    for sb in profile.ops:
        file = getattr(sb.scope, "file", None)
        if file and file.endswith(".py") and file.startswith(git.PACKAGE + "/"):
            modules.append(file[:-3].replace("/", "."))
    return list(dict.fromkeys(modules))


def _guard_code_hash() -> str:
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    suite = root.parent / "tests" / "perf"
    for p in sorted([*root.rglob("*.py"), *suite.glob("*")] if suite.is_dir() else root.rglob("*.py")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(root.parent)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def ops_cache_key(env: overlay.SideEnvironment, profile: Profile, thresholds: Thresholds) -> str:
    """What an ops-only pass of this side depends on: its vLLM and engine stack, the profile as
    written (engine, workload, scopes, census roots; dtype as this machine runs it), guard's code."""
    material = {"env": env.key, "profile": profile.name, "thresholds": thresholds.path.read_text(encoding="utf-8"),
                "dtype": profile.engine.dtype, "python": sys.version, "guard": _guard_code_hash()}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:24]


def profile_side(name: str, env: overlay.SideEnvironment, profile: Profile, thresholds: Thresholds, output: Path,
                 fresh: bool) -> RunRecord:
    """One side's op-count pass in a child pytest with the side's python; from the side's cache
    entry when the same pass ran before (op counts are exact: the same inputs give the same counts)."""
    key = ops_cache_key(env, profile, thresholds)
    cached = env.root / "runs" / f"{key}.json"
    rev = env.revision
    if cached.is_file() and not fresh:
        print(f"guard pr: {name} {rev.sha[:12]}: op counts from the cache ({cached})", flush=True)
        return load_run(cached)
    print(f"guard pr: {name} {rev.sha[:12]} ({rev.subject[:60]}): profiling one request per image size ...", flush=True)
    side_out = output / name
    side_out.mkdir(parents=True, exist_ok=True)
    (side_out / "run.json").unlink(missing_ok=True)
    t0 = time.perf_counter()
    code, interrupted = run_suite(profile.name, thresholds.path.resolve(), side_out, only=OPS_ONLY,
                                  python=str(env.python))
    fallback = RunRecord(profile=profile.name, thresholds_path=str(thresholds.path.resolve()), model=thresholds.model,
                         environment={})
    record = read_record(side_out / "run.json", code, interrupted, fallback)
    record.invalid_reasons.extend(r for r in vacuous_budgets(profile, record.op_counts) if r not in record.invalid_reasons)
    print(f"guard pr: {name} {rev.sha[:12]}: profiled in {time.perf_counter() - t0:.0f} s", flush=True)
    if not record.invalid_reasons and not interrupted:
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(cached, run_file_dict(record))
    return record


def function_changes(repo: Path, base: git.Revision, head: git.Revision, results: Results) -> tuple[FunctionChange, ...]:
    """For each census function that failed or took calls from elsewhere: the lines head added inside it."""
    out: dict[str, FunctionChange] = {}
    for c in results.census_checks:
        if c.function in out or not (c.status == Status.FAIL or c.moved_calls) or c.measured_calls is None:
            continue
        file, _, qualname = c.function.partition(":")
        source = git.file_at(repo, head, file)
        if source is None:
            continue
        lines = lines_inside(source, qualname, git.added_lines(repo, base, head, file))
        if lines:
            out[c.function] = FunctionChange(c.function, tuple(lines[:MAX_LINES_PER_FUNCTION]))
    return tuple(out.values())


def unjudged(profile: Profile, thresholds: Thresholds, pr: PullRequestDiff, verdict: Verdict,
             reasons: list[str] = ()) -> Results:
    """A pull request with nothing to measure (the same vllm/ Python on both sides) or whose
    sides could not run: no run record beyond why."""
    run = RunRecord(profile=profile.name, thresholds_path=str(thresholds.path.resolve()), model=thresholds.model,
                    environment={}, invalid_reasons=list(reasons))
    notices = []
    if not pr.measured:
        notices.append("not measured: base and head have the same vllm/ Python sources")
    if pr.unmeasured_files:
        notices.append(f"not measurable on this engine stack: {len(pr.unmeasured_files)} changed file(s) of compiled code "
                       f"or dependencies ({', '.join(pr.unmeasured_files[:5])}{', ...' if len(pr.unmeasured_files) > 5 else ''})")
    return Results(verdict=verdict, run=run, guard_version=__version__, notices=tuple(notices), pr=pr)


def run(args: argparse.Namespace) -> int:
    thresholds = load_thresholds(args.thresholds)
    hw = detect(quick=True)
    profile = select_profile(thresholds, args.profile, hw)
    ops_only = args.only == OPS_ONLY
    if not profile.has_op_count_pass and ops_only:
        raise UsageError(f"profile '{profile.name}' has no op budgets and no census: --only ops would judge nothing")
    if args.cache_max_gb <= 0:
        raise UsageError("--cache-max-gb must be positive")
    check_op_names(thresholds, profile)
    repo = git.open_repository(args.vllm_repo)
    base = git.resolve(repo, args.base, "--base")
    head = git.resolve(repo, args.head, "--head")
    output = Path(args.output).resolve()
    prepare_output(output)
    for stale in ("results.json", "report.md"):
        (output / stale).unlink(missing_ok=True)
    cache_dir = Path(args.cache_dir).expanduser().resolve() if args.cache_dir else overlay.default_cache_dir()

    changed = git.changed_files(repo, base, head)
    unmeasured = tuple(f for f in changed if git.unmeasurable(f))
    measured = base.package_tree != head.package_tree
    pr = PullRequestDiff(repository=str(repo), base=RevisionInfo(base.rev, base.sha, base.subject),
                         head=RevisionInfo(head.rev, head.sha, head.subject), changed_files=tuple(changed),
                         unmeasured_files=unmeasured, measured=measured)
    print(f"guard pr: {thresholds.model}, profile '{profile.name}' on {hw.describe()}", flush=True)
    print(f"guard pr: base {base.sha[:12]} {base.subject[:70]}", flush=True)
    print(f"guard pr: head {head.sha[:12]} {head.subject[:70]}", flush=True)
    print(f"guard pr: {len(changed)} file(s) changed, {len(git.runtime_files(changed))} under {git.PACKAGE}/, "
          f"{len(unmeasured)} not measurable here (compiled code, dependencies)", flush=True)
    t0 = time.perf_counter()
    if not measured:
        results = unjudged(profile, thresholds, pr, Verdict.NOT_MEASURABLE if unmeasured else Verdict.PASS)
        return finish(results, output, t0)

    stack = overlay.engine_stack()
    envs = {}
    try:
        for name, rev in (("base", base), ("head", head)):
            envs[name] = overlay.prepare(repo, rev, cache_dir, stack, progress=lambda m: print(f"guard pr: {m}", flush=True))
            state = "cached" if envs[name].reused else f"built ({envs[name].linked} files linked from {stack.version})"
            print(f"guard pr: {name} environment {envs[name].root} ({state})", flush=True)
        print("guard pr: checking that both sides' vLLM import against the engine stack ...", flush=True)
        overlay.check_imports([envs[name] for name in SIDES], side_modules(profile))
    except InvalidRunError as exc:
        return finish(unjudged(profile, thresholds, pr, Verdict.INVALID, [exc.args[0]]), output, t0,
                      hint=exc.hint)
    finally:
        dropped = overlay.evict(cache_dir, int(args.cache_max_gb * 1024**3), keep={e.root for e in envs.values()})
        if dropped:
            print(f"guard pr: cache over {args.cache_max_gb:g} GB: dropped {len(dropped)} least recently used "
                  "environment(s)", flush=True)

    say_dtype(profile, "guard pr")
    if ops_only:
        records = {name: profile_side(name, envs[name], profile, thresholds, output, args.fresh) for name in SIDES}
        rec = ABRecord(candidate=records["head"], baseline=records["base"], baseline_python=str(envs["base"].python))
    else:
        from guard.abrunner import run_ab

        print("guard pr: A/B: head is the candidate, base the baseline; both engines on this machine in alternation",
              flush=True)
        rec = run_ab(thresholds, profile, detect(), output, str(envs["base"].python),
                     progress=lambda m: print(f"[guard] {m}", flush=True), fresh_baseline=args.fresh,
                     candidate_python=str(envs["head"].python))
    results = evaluate_pr(profile, rec, pr, ops_only=ops_only, guard_version=__version__, output=output)
    results = _with_function_changes(results, repo, base, head)
    return finish(results, output, t0)


def _with_function_changes(results: Results, repo: Path, base: git.Revision, head: git.Revision) -> Results:
    import dataclasses

    changes = function_changes(repo, base, head, results)
    return dataclasses.replace(results, pr=dataclasses.replace(results.pr, function_changes=changes))


def finish(results: Results, output: Path, t0: float, hint: str | None = None) -> int:
    write_report(results, output)
    print()
    print(render_terminal(results))
    if hint:
        print(f"hint: {hint}")
    print(f"guard pr: {time.perf_counter() - t0:.0f} s; wrote {output / 'results.json'} and {output / 'report.md'}")
    return results.exit_code
