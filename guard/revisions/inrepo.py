"""Budgets kept in the vLLM tree: ``guard pr --thresholds-in-repo PATH`` (and ``guard bisect``).

The budget file is read from a revision of the vLLM repository, never from the working tree: base's
copy for ``guard pr`` (good's for ``guard bisect``), the trusted side. It is written, with the files
it names by a relative path (census baselines, a local model folder) as that same revision holds
them, into a folder of its own at the same repository-relative places, so relative names resolve
exactly as they would in a checkout of that revision.

Head's copy never judges the pull request that changes it (a pull request cannot vouch for itself,
guard.github.trust): what head changes in the budget file or in a file it names is reported, one
line per budget, as a change that needs a maintainer's approval, and base's copy judges both sides.
"""

from __future__ import annotations

import io
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Protocol

from guard.config.budgets import Thresholds
from guard.config.loading import load_thresholds
from guard.errors import ConfigError, GuardError, UsageError
from guard.model.results import BudgetSource
from guard.revisions import git

FLAG = "--thresholds-in-repo"


def repo_path(path: str, flag: str = FLAG) -> str:
    """``path`` as a repository-relative POSIX path; UsageError when it leaves the repository."""
    p = PurePosixPath(path.replace("\\", "/"))
    if p.is_absolute() or ".." in p.parts or not p.parts or str(p) == ".":
        raise UsageError(f"{flag} {path}: give the budget file's path inside the vLLM repository, relative to its "
                         "top folder", hint=f"e.g. {flag} .buildkite/guard/deepseek-ocr-2.yaml")
    return str(p)


def _in_revision(repo: Path, rev: git.Revision, path: str) -> str | None:
    """'blob', 'tree' or None: what ``path`` is at ``rev``."""
    done = git.git(repo, "cat-file", "-t", f"{rev.sha}:{path}", check=False)
    kind = done.stdout.strip() if done.returncode == 0 else ""
    return kind if kind in ("blob", "tree") else None


def _write(repo: Path, rev: git.Revision, path: str, root: Path) -> bool:
    """``path`` (a file or a folder) as ``rev`` holds it, under ``root``; False when ``rev`` has no such path."""
    kind = _in_revision(repo, rev, path)
    if kind == "blob":
        dst = root / path
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(git.git(repo, "show", f"{rev.sha}:{path}", text=False).stdout)
        return True
    if kind == "tree":
        data = git.git(repo, "archive", "--format=tar", rev.sha, path, text=False).stdout
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(root, filter="data")
        return True
    return False


def named_files(thresholds: Thresholds, root: Path) -> list[str]:
    """The files a budget file names by a path inside ``root`` (census baselines; an engine model given as
    a folder), repository-relative, sorted. Absolute paths elsewhere on this machine are not the
    revision's and are left out."""
    out = set()
    for profile in thresholds.profiles.values():
        paths = [Path(profile.engine.model)]
        if profile.census is not None:
            paths += profile.census.baselines
        for p in paths:
            if not p.is_absolute():
                continue
            try:
                out.add(p.resolve().relative_to(root.resolve()).as_posix())
            except ValueError:
                continue
    return sorted(out)


def _leaves_repository(thresholds: Thresholds, root: Path) -> str | None:
    """A relative path in the budget file that points outside the repository (``../..``), if any."""
    for profile in thresholds.profiles.values():
        if profile.census is None:
            continue
        for p in profile.census.baselines:
            if not p.resolve().is_relative_to(root.resolve()) and ".." in p.parts:
                return str(p)
    return None


class Side(Protocol):
    """One revision's files, however they are read: ``kind`` ('blob', 'tree' or None), ``text`` (None:
    not a file there), ``write`` (under a root; False: not there). GitSide reads a clone; the poster
    reads GitHub's contents API (guard.github.budget_files)."""

    where: str

    def kind(self, path: str) -> str | None: ...
    def text(self, path: str) -> str | None: ...
    def write(self, path: str, root: Path) -> bool: ...


class GitSide:
    def __init__(self, repo: Path, rev: git.Revision, side: str) -> None:
        self.repo, self.rev, self.where = repo, rev, f"{side} {rev.rev} ({rev.sha[:12]})"

    def kind(self, path: str) -> str | None:
        return _in_revision(self.repo, self.rev, path)

    def text(self, path: str) -> str | None:
        return git.file_at(self.repo, self.rev, path)

    def write(self, path: str, root: Path) -> bool:
        return _write(self.repo, self.rev, path, root)


def load_at(repo: Path, rev: git.Revision, path: str, side: str, flag: str = FLAG,
            into: Path | None = None) -> tuple[Thresholds, tuple[str, ...]]:
    """The budget file ``path`` as ``rev`` holds it, loaded from a copy under ``into`` (a new temporary
    folder by default) with the files it names beside it; and those files (repository-relative).
    UsageError (exit 2) naming the path and the revision when ``rev`` has no such file."""
    path = repo_path(path, flag)
    hint = (f"the budget file must be committed in {side} (the trusted side: its copy judges both sides); check with "
            f"`git -C {repo} show {rev.sha[:12]}:{path}`, or pass --thresholds PATH for a file outside the repository")
    return load_from(GitSide(repo, rev, side), path, flag, into, hint=hint)


def load_from(side: Side, path: str, flag: str = FLAG, into: Path | None = None,
              hint: str | None = None) -> tuple[Thresholds, tuple[str, ...]]:
    """``load_at`` over any reader of one revision (a Side): a clone, or GitHub's contents API for the
    poster (guard.github.budget_files)."""
    where, write = side.where, side.write
    kind = side.kind(path)
    if kind != "blob":
        what = "is a folder, not a file" if kind == "tree" else "does not exist"
        raise UsageError(f"{flag} {path}: {what} in {where}", hint=hint)
    root = Path(into) if into is not None else Path(tempfile.mkdtemp(prefix="guard-budgets-"))
    write(path, root)
    try:
        thresholds = load_thresholds(root / path)
    except ConfigError as exc:  # name the file as the repository has it, not the temporary copy
        raise ConfigError(f"{path} (in {where})", exc.line, exc.key, exc.problem, hint=exc.hint) from None
    outside = _leaves_repository(thresholds, root)
    if outside:
        raise UsageError(f"{flag} {path} (in {where}) names {outside}, outside the repository: a budget file in the "
                         "vLLM tree may name only files of the same revision")
    files = [path] + [f for f in named_files(thresholds, root) if write(f, root)]
    return thresholds, tuple(files)


@dataclass(frozen=True)
class HeadChanges:
    """What head does to the budgets base's copy judges by (never applied by guard pr)."""

    names: frozenset[str]  # the budget file and what base's or head's copy names
    touched: tuple[str, ...]  # of those, what the pull request changes
    lines: tuple[str, ...]  # one line per change, e.g. "profile cpu: op budget ...: max 0 → max 100 calls"
    head: Thresholds | None = None  # head's copy, loaded (None: deleted, or it does not load)
    head_error: GuardError | None = None  # why head's copy does not load


def head_changes(base: Side, head: Side, path: str, base_files: tuple[str, ...], changed: list[str],
                 flag: str = FLAG) -> HeadChanges:
    """What head does to the budgets: the changed files among the budget file and those base's or
    head's copy names, one line per change, and head's copy as loaded (for when it is accepted)."""
    from guard.github.trust import TrustPolicy, thresholds_change_lines

    names = set(base_files)
    head_text = head.text(path)
    loaded, error = None, None
    if head_text is not None:
        try:
            loaded, files = load_from(head, path, flag, Path(tempfile.mkdtemp(prefix="guard-budgets-head-")))
            names.update(files)
        except (ConfigError, UsageError) as exc:
            error = exc  # thresholds_change_lines says that head's copy does not load
    touched = sorted(f for f in changed if any(f == n or f.startswith(n.rstrip("/") + "/") for n in names))
    lines: list[str] = []
    if path in touched:
        lines += thresholds_change_lines(TrustPolicy(thresholds_path=path, thresholds_text=base.text(path)), head_text)
    lines += [f"{f} (named by the budget file) is {'deleted' if head.kind(f) is None else 'changed'} "
              "in this pull request" for f in touched if f != path]
    return HeadChanges(frozenset(names), tuple(touched), tuple(lines), loaded, error)


def budget_source(repo: Path, base: git.Revision, head: git.Revision, path: str, files: tuple[str, ...],
                  changed: list[str]) -> BudgetSource:
    changes = head_changes(GitSide(repo, base, "base"), GitSide(repo, head, "head"), path, files, changed)
    return BudgetSource(revision=base.sha, path=path, files=files, head_changed_files=changes.touched,
                        head_changes=changes.lines)

