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
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from guard.config.budgets import Thresholds, load_thresholds
from guard.errors import ConfigError, UsageError
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


def load_at(repo: Path, rev: git.Revision, path: str, side: str, flag: str = FLAG,
            into: Path | None = None) -> tuple[Thresholds, tuple[str, ...]]:
    """The budget file ``path`` as ``rev`` holds it, loaded from a copy under ``into`` (a new temporary
    folder by default) with the files it names beside it; and those files (repository-relative).
    UsageError (exit 2) naming the path and the revision when ``rev`` has no such file."""
    path = repo_path(path, flag)
    where = f"{side} {rev.rev} ({rev.sha[:12]})"
    hint = (f"the budget file must be committed in {side} (the trusted side: its copy judges both sides); check with "
            f"`git -C {repo} show {rev.sha[:12]}:{path}`, or pass --thresholds PATH for a file outside the repository")
    return load_from(lambda p: _in_revision(repo, rev, p), lambda p, root: _write(repo, rev, p, root),
                     path, where, flag, into, hint=hint)


def load_from(kind_of: Callable[[str], str | None], write: Callable[[str, Path], bool], path: str, where: str,
              flag: str = FLAG, into: Path | None = None, hint: str | None = None) -> tuple[Thresholds, tuple[str, ...]]:
    """``load_at`` over any reader of one revision: ``kind_of(path)`` says 'blob', 'tree' or None,
    ``write(path, root)`` writes it under ``root`` (False: not there). The poster reads through
    GitHub's contents API with it (guard.github.budgets)."""
    kind = kind_of(path)
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


def head_changes(repo: Path, base: git.Revision, head: git.Revision, path: str, base_files: tuple[str, ...],
                 changed: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What head does to the budgets base's copy judged it by: (the changed files among the budget
    file and those base's or head's copy names, one line per change). Never applied here."""
    from guard.github.trust import TrustPolicy, thresholds_change_lines

    names = set(base_files)
    head_text = git.file_at(repo, head, path)
    if head_text is not None:
        with tempfile.TemporaryDirectory(prefix="guard-budgets-head-") as tmp:
            try:
                names.update(load_at(repo, head, path, "head", into=Path(tmp))[1])
            except (ConfigError, UsageError):
                pass  # thresholds_change_lines says that head's copy does not load
    touched = sorted(f for f in changed if any(f == n or f.startswith(n.rstrip("/") + "/") for n in names))
    lines: list[str] = []
    if path in touched:
        base_text = git.file_at(repo, base, path)
        lines += thresholds_change_lines(TrustPolicy(thresholds_path=path, thresholds_text=base_text), head_text)
    lines += [f"{f} (named by the budget file) is {'deleted' if _in_revision(repo, head, f) is None else 'changed'} "
              "in this pull request" for f in touched if f != path]
    return tuple(touched), tuple(lines)


def budget_source(repo: Path, base: git.Revision, head: git.Revision, path: str, files: tuple[str, ...],
                  changed: list[str]) -> BudgetSource:
    touched, lines = head_changes(repo, base, head, path, files, changed)
    return BudgetSource(revision=base.sha, path=path, files=files, head_changed_files=touched, head_changes=lines)

