"""The git side of ``guard pr``: revisions, changed files, added lines. Read-only on the repository."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from guard.errors import UsageError
from guard.model.changes import unmeasurable  # noqa: F401 - where guard pr and bisect look it up

PACKAGE = "vllm"  # the folder of a vLLM checkout whose Python sources are measured

@dataclass(frozen=True)
class Revision:
    """One side of a pull request."""

    rev: str  # as the user named it
    sha: str
    subject: str
    package_tree: str | None  # git's hash of the vllm/ tree: the content hash of the side's Python; None: no vllm/


def git(repo: Path, *args: str, check: bool = True, text: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
    """git in ``repo``. Paths come out as they are named (core.quotePath=false: no "csrc/kern\\303\\251l.cu"
    that matches no rule), and text as UTF-8, a byte that is not shown as U+FFFD: a file of a pull
    request is the author's to make, and never a crash."""
    try:
        done = subprocess.run(["git", "-c", "core.quotePath=false", "-C", str(repo), *args], capture_output=True,
                              check=False, input=stdin, **({"encoding": "utf-8", "errors": "replace"} if text else {}))
    except FileNotFoundError:
        raise UsageError("git is not installed: guard pr reads the vLLM repository with git") from None
    if check and done.returncode != 0:
        err = done.stderr if text else done.stderr.decode("utf-8", "replace")
        raise UsageError(f"git -C {repo} {' '.join(args)}: {err.strip() or f'exit {done.returncode}'}")
    return done


def open_repository(path: str | Path) -> Path:
    """The repository's top folder; UsageError when ``path`` is not a git repository with vllm/."""
    repo = Path(path).expanduser()
    if not repo.is_dir():
        raise UsageError(f"--vllm-repo {path}: no such folder", hint="give a clone of vLLM, e.g. --vllm-repo ~/src/vllm")
    done = git(repo, "rev-parse", "--show-toplevel", check=False)
    if done.returncode != 0:
        raise UsageError(f"--vllm-repo {path}: not a git repository", hint="git clone https://github.com/vllm-project/vllm")
    return Path(done.stdout.strip())


def resolve(repo: Path, rev: str, flag: str) -> Revision:
    done = git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
    if done.returncode != 0 or not done.stdout.strip():
        raise UsageError(f"{flag} {rev}: no such commit in {repo}",
                         hint="fetch it first, e.g. `git fetch origin pull/NUMBER/head`")
    sha = done.stdout.strip()
    subject = git(repo, "log", "-1", "--format=%s", sha).stdout.strip()
    tree = git(repo, "rev-parse", "--verify", "--quiet", f"{sha}:{PACKAGE}", check=False).stdout.strip() or None
    return Revision(rev=rev, sha=sha, subject=subject, package_tree=tree)


def require_vllm(repo: Path, *revisions: Revision) -> None:
    """UsageError when none of ``revisions`` has a vllm/ folder: the repository is not vLLM (a
    revision without one, beside one with it, is a pull request that adds or removes the package)."""
    if revisions and all(r.package_tree is None for r in revisions):
        named = " nor ".join(f"{r.rev} ({r.sha[:12]})" for r in revisions)
        raise UsageError(f"--vllm-repo {repo}: neither {named} has a {PACKAGE}/ folder: not a vLLM repository",
                         hint="give a clone of vLLM, e.g. --vllm-repo ~/src/vllm")


def changed_files(repo: Path, base: Revision, head: Revision) -> list[str]:
    """What head changed against base (both sides' trees, not their history: ``git diff base head``)."""
    return diff_names(repo, base.sha, head.sha)


def diff_names(repo: Path, old: str, new: str) -> list[str]:
    """The paths that differ between two commits, NUL-separated on the way: a name may hold spaces."""
    out = git(repo, "diff", "--name-only", "-z", "--no-renames", old, new).stdout
    return sorted(name for name in out.split("\0") if name)


def runtime_files(paths: list[str]) -> list[str]:
    """The changed files that run in vLLM: those under vllm/."""
    return [p for p in paths if p.startswith(PACKAGE + "/")]


_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(?P<start>\d+)(?:,(?P<count>\d+))? @@")


def added_lines(repo: Path, base: Revision, head: Revision, path: str) -> list[tuple[int, str]]:
    """(line number in head, text) of every line head added or changed in ``path``."""
    out = git(repo, "diff", "--unified=0", "--no-color", "--no-renames", base.sha, head.sha, "--", path).stdout
    lines: list[tuple[int, str]] = []
    number = 0
    for raw in out.splitlines():
        m = _HUNK.match(raw)
        if m:
            number = int(m.group("start"))
            continue
        if raw.startswith("+") and not raw.startswith("+++"):
            lines.append((number, raw[1:]))
            number += 1
    return lines


def describe(repo: Path, rev: Revision) -> str | None:
    """The revision's vLLM version as its tags say (``v0.31.0``, ``v0.32.0-12-gabc1234``); None untagged.
    This, not a ``_version.py`` borrowed from a wheel, is what a side is labelled with."""
    done = git(repo, "describe", "--tags", "--match", "v[0-9]*", rev.sha, check=False)
    return done.stdout.strip() or None if done.returncode == 0 else None


def file_at(repo: Path, rev: Revision, path: str) -> str | None:
    done = git(repo, "show", f"{rev.sha}:{path}", check=False)
    return done.stdout if done.returncode == 0 else None


def blob_at(repo: Path, rev: Revision, path: str) -> str | None:
    """git's object id of ``path`` as ``rev`` holds it (None: not a file there)."""
    done = git(repo, "rev-parse", "--verify", "--quiet", f"{rev.sha}:{path}", check=False)
    return done.stdout.strip() or None if done.returncode == 0 else None
