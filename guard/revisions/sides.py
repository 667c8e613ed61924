"""Measuring one revision of vLLM: its environment, its import check, its op-count pass (cached).

``guard pr`` measures two revisions side against side, ``guard bisect`` a handful on a line of
commits; both go through here, so a revision measured by one is a cache hit for the other.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from guard.config.budgets import Profile, Thresholds
from guard.measure.harness import record_suite
from guard.errors import InvalidRunError
from guard.model.results import (FunctionChange, Measures, ReasonKind, Results, RunRecord, Status, load_run, run_file_dict,
                                 write_json_atomic)
from guard.revisions import git, overlay
from guard.revisions.functions import lines_inside
from guard.revisions.installed import InstalledEnvironment

MAX_LINES_PER_FUNCTION = 40


def side_modules(profile: Profile) -> list[str]:
    """What the import check imports: the compiled ops' wrapper (it loads the extensions, so ABI
    drift shows) and each budgeted scope's module (the model's own code, which imports most of vLLM)."""
    modules = ["vllm._custom_ops"]
    for sb in profile.ops:
        file = getattr(sb.scope, "file", None)
        if file and file.endswith(".py") and file.startswith(git.PACKAGE + "/"):
            modules.append(file[:-3].replace("/", "."))
    return list(dict.fromkeys(modules))


def _guard_code_hash() -> str:
    """guard's own code and perf suite: they decide what is counted and how."""
    root = Path(__file__).resolve().parents[1]
    suite = root.parent / "tests" / "perf"
    files = [*root.rglob("*.py"), *(suite.glob("*") if suite.is_dir() else ())]
    h = hashlib.sha256()
    for p in sorted(files):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(root.parent)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def ops_cache_key(env: overlay.SideEnvironment, profile: Profile, thresholds: Thresholds) -> str:
    """What an ops-only pass of this side depends on: its vLLM and engine stack, the profile as
    written (engine, workload, scopes, census roots; dtype as this machine runs it), guard's code."""
    material = {"env": env.key, "profile": profile.name, "thresholds": thresholds.path.read_text(encoding="utf-8"),
                "dtype": profile.engine.dtype, "python": sys.version, "guard": _guard_code_hash()}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:24]


def cached_pass(env: overlay.SideEnvironment, profile: Profile, thresholds: Thresholds) -> Path:
    """Where this side's op-count pass is kept once it ran (it may not exist yet)."""
    return env.root / "runs" / f"{ops_cache_key(env, profile, thresholds)}.json"


def profile_side(name: str, env: overlay.SideEnvironment, profile: Profile, thresholds: Thresholds, output: Path,
                 fresh: bool = False, say: Callable[[str], None] = print,
                 imports: list[str] | None = None) -> tuple[RunRecord, bool]:
    """One side's op-count pass in a child process (guard.child) with the side's python, into ``output/name``; from
    the side's cache entry when the same pass ran before (op counts are exact: the same inputs give
    the same counts). Returns (the record, whether it came from the cache). ``imports``: the
    child imports these first and stops before its engine when they do not import (InvalidRunError,
    as ``overlay.check_imports`` raises it): the import check without a process of its own."""
    cached = cached_pass(env, profile, thresholds)
    rev = env.revision
    if cached.is_file() and not fresh:
        say(f"{name} {rev.sha[:12]}: op counts from the cache ({cached})")
        return load_run(cached), True
    say(f"{name} {rev.sha[:12]} ({rev.subject[:60]}): profiling one request per image size ...")
    side_out = output / name
    side_out.mkdir(parents=True, exist_ok=True)
    (side_out / "run.json").unlink(missing_ok=True)
    t0 = time.perf_counter()
    if isinstance(env, InstalledEnvironment):
        record = own_environment_pass(name, env, profile, thresholds, side_out, say)
    else:
        record = record_suite(thresholds, profile, side_out, measures=Measures.OPS, python=str(env.python),
                              imports=tuple(imports or ()), vllm_under=str(env.root) if imports else None)
        broken = [r.text for r in record.invalid_reasons if r.kind == ReasonKind.REVISION]
        if broken:
            raise InvalidRunError(f"{rev.rev} ({rev.sha[:12]}): {broken[0]}", hint=overlay.IMPORT_HINT)
    say(f"{name} {rev.sha[:12]}: profiled in {time.perf_counter() - t0:.0f} s")
    if not record.invalid_reasons:  # a stopped or broken run says why there, and is never kept
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(cached, run_file_dict(record))
    return record, False


def own_environment_pass(name: str, env: InstalledEnvironment, profile: Profile, thresholds: Thresholds,
                         output: Path, say: Callable[[str], None]) -> RunRecord:
    """The op-count pass in the side's own interpreter: the run stage over one worker side, which
    imports guard from here and needs nothing installed there but vLLM (guard.measure.worker)."""
    from guard.measure.hardware import detect, fingerprint
    from guard.measure.run import GuardRun, run_side
    from guard.measure.worker import WORKER_REPORTED, WorkerSide

    side = WorkerSide(name, env.python, output, thresholds=thresholds.path.resolve(), profile=profile,
                      progress=lambda m: say(f"{name} {m}"))
    hw = detect()
    environment = fingerprint(hw, profile)  # this machine's; the versions are the worker's to say
    environment.update(dict.fromkeys((*WORKER_REPORTED, "git_commit")))
    stage = GuardRun(thresholds, profile, hw, output, side=side, environment=environment,
                     progress=lambda m: say(f"{name} {m}"))
    record = run_side(stage, Measures.OPS)  # the same sequence as a child's, in a worker
    write_json_atomic(output / "run.json", run_file_dict(record))
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
