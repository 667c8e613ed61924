"""Measuring one revision of vLLM: its environment, its import check, its op-count pass (cached).

``guard pr`` measures two revisions side against side, ``guard bisect`` a handful on a line of
commits; both go through here, so a revision measured by one is a cache hit for the other.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from guard.config.budgets import Profile, Thresholds
from guard.measure import opcache
from guard.measure.harness import SidePython, record_suite
from guard.errors import GuardError, InvalidRunError
from guard.model.records import Measures, ReasonKind, RunRecord, Status
from guard.model.results import FunctionChange, Results
from guard.revisions import git, overlay
from guard.revisions.functions import lines_inside
from guard.revisions.installed import InstalledEnvironment

MAX_LINES_PER_FUNCTION = 40
CACHE_FOLDER = "runs"  # inside the side's environment: restored, kept and evicted with it


def side_modules(profile: Profile) -> list[str]:
    """What the import check imports: the compiled ops' wrapper (it loads the extensions, so ABI
    drift shows) and each budgeted scope's module (the model's own code, which imports most of vLLM)."""
    modules = ["vllm._custom_ops"]
    for sb in profile.ops:
        file = getattr(sb.scope, "file", None)
        if file and file.endswith(".py") and file.startswith(git.PACKAGE + "/"):
            modules.append(file[:-3].replace("/", "."))
    return list(dict.fromkeys(modules))


def op_pass_key(env: overlay.SideEnvironment, profile: Profile) -> tuple[str | None, str]:
    """This side's key in the op-count cache (guard.measure.opcache): its environment's own key
    names its vLLM and engine stack. ``profile``: as the side runs it (dtype resolved for this
    machine)."""
    from guard.config.weights import hub_resolver, needs_resolution, pin

    if needs_resolution(profile):  # the side's run loads the commit a moving revision points to now
        try:
            profile = pin(profile, hub_resolver(download=False))
        except GuardError as exc:
            return None, f"the model's revision could not be pinned ({exc})"
    # the environment's key names its vLLM tree and engine stack; the side runs guard's interpreter
    stack = {"side environment": env.key, "distributions": opcache.distributions()}
    return opcache.pass_key(stack, f"the side's environment {env.key}, guard's installed distributions", profile)


@dataclass(frozen=True)
class SideCache:
    """Where a side's op-count pass is kept (``folder``, ``key``; no key: not cached, ``covers`` says
    why) and the pass kept there now (``entry``; None with ``fresh``)."""
    folder: Path
    key: str | None
    covers: str
    entry: RunRecord | None


def side_cache(env: overlay.SideEnvironment, profile: Profile, fresh: bool = False) -> SideCache:
    """This side's place in the op-count cache, read once: ``guard pr`` decides with it which sides
    need the import check, then profiles with it."""
    key, covers = op_pass_key(env, profile)
    folder = env.root / CACHE_FOLDER
    return SideCache(folder, key, covers, None if fresh else opcache.load(folder, key))


def profile_side(name: str, env: overlay.SideEnvironment, profile: Profile, thresholds: Thresholds, output: Path,
                 fresh: bool = False, say: Callable[[str], None] = print,
                 imports: list[str] | None = None, cache: SideCache | None = None) -> tuple[RunRecord, bool]:
    """One side's op-count pass in a child process (guard.child) with the side's python, into ``output/name``; from
    the side's cache entry when the same pass ran before (op counts are exact: the same inputs give
    the same counts). Returns (the record, whether it came from the cache). ``imports``: the
    child imports these first and stops before its engine when they do not import (InvalidRunError,
    as ``overlay.check_imports`` raises it): the import check without a process of its own.
    ``cache``: this side's ``side_cache``, when the caller read it already."""
    cache = cache or side_cache(env, profile, fresh)
    cached, rev = cache.entry, env.revision
    if cached is not None:
        say(f"{name} {rev.sha[:12]}: op counts from the cache ({opcache.entry_path(cache.folder, cache.key)})")
        cached.profile, cached.thresholds_path = profile.name, thresholds.recorded_path  # as named here
        return cached, True
    if cache.key is None:
        say(f"{name} {rev.sha[:12]}: op counts not cached: {cache.covers}")
    say(f"{name} {rev.sha[:12]} ({rev.subject[:60]}): profiling one request per image size ...")
    t0 = time.perf_counter()
    # a side whose interpreter runs guard checks its imports in its own run, before the engine; one
    # that runs a worker asks a process of its own first
    checks_itself = bool(imports) and not env.as_worker
    if imports and env.as_worker and isinstance(env, overlay.SideEnvironment):
        overlay.check_imports([env], list(imports))
    record = record_suite(thresholds, profile, output / name, measures=Measures.OPS, side=side_python(env, name),
                          imports=tuple(imports or ()) if checks_itself else (),
                          vllm_under=str(env.root) if checks_itself else None)
    broken = [r.text for r in record.invalid_reasons if r.kind == ReasonKind.REVISION]
    if broken:
        raise InvalidRunError(f"{rev.rev} ({rev.sha[:12]}): {broken[0]}", hint=overlay.IMPORT_HINT)
    took = f"{time.perf_counter() - t0:.0f} s"
    if record.invalid_reasons:  # a stopped or broken run says why, and is never kept
        say(f"{name} {rev.sha[:12]}: not profiled ({took}): {record.invalid_reasons[0].text}")
    else:
        say(f"{name} {rev.sha[:12]}: profiled in {took}")
        opcache.store(cache.folder, cache.key, record)
    return record, False


def side_python(env: InstalledEnvironment | overlay.SideEnvironment, name: str) -> SidePython:
    """The interpreter a revision's side (``name``: head, base) runs: guard's own stack with the
    revision's vLLM over it (it holds guard), or another environment's (only vLLM there: its engine
    runs in a worker)."""
    return SidePython(str(env.python), has_guard=not env.as_worker, name=name)


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
