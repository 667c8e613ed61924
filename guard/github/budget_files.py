"""Which budgets judge a pull request at post time, when vLLM keeps them in its own tree.

``guard comment --thresholds-in-repo PATH`` reads the budget file, and the census baselines it
names, through GitHub's contents API at two commits GitHub itself reports for the pull request:
its base (``pull_request.base.sha``) and its head. Never from the artifact, which is the pull
request's claim:

- **base's copy judges**, unless an entitled person accepted head's change (guard.github.approval);
  then **head's copy judges** and the status and the comment say who accepted;
- where base has no such file, **guard's own** (``--trusted-thresholds``, in the poster's checkout)
  judges and the status says so;
- a pull request that changes the budget file (or a file it names) and is not accepted is judged by
  base's copy; the comment lists the changes, the approval that would accept them and the command that
  writes the accepting change.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guard.config.budgets import Thresholds
from guard.errors import UsageError
from guard.github.approval import Acceptance, GitHubReads, Refused, codeowner_approval, label_acceptance, owners_of
from guard.github.trust import TrustPolicy
from guard.revisions import inrepo

FLAG = "--thresholds-in-repo"


@dataclass(frozen=True)
class BudgetChoice:
    """The budgets a pull request is judged by, and what the comment says about them."""

    thresholds: Thresholds
    source: str  # "vLLM's .buildkite/guard/x.yaml at base abc123" | "guard's own thresholds/x.yaml" | ...
    owner: str  # "vllm" | "guard": whose budgets judged (the status says it)
    files: tuple[str, ...] = ()  # the budget file and what base's or head's copy names (not "protected": accepted)
    changed: tuple[str, ...] = ()  # budget files head changes
    changes: tuple[str, ...] = ()  # one line per changed budget
    accepted: Acceptance | None = None
    refused: tuple[Refused, ...] = field(default_factory=tuple)
    label: str = ""
    base: Thresholds | None = None  # base's copy, when head's judged: what was accepted is what base's would fail

    @property
    def short(self) -> str:
        """A few words for the status description."""
        if self.accepted is not None:
            return f"head's budgets, accepted by @{self.accepted.login}"
        return "vLLM's budgets" if self.owner == "vllm" else "guard's budgets (vLLM has none)"


class _Commit:
    """One commit of the repository through the contents API, each file read once."""

    def __init__(self, repository: Any, sha: str, side: str) -> None:
        self.repository, self.sha = repository, sha
        self.where = f"{side} ({sha[:12]})"
        self.read: dict[str, str | None] = {}

    def text(self, path: str) -> str | None:
        from guard.github.publish import file_at

        if path not in self.read:
            self.read[path] = file_at(self.repository, path, self.sha)
        return self.read[path]

    def kind(self, path: str) -> str | None:
        return "blob" if self.text(path) is not None else None

    def write(self, path: str, root: Path) -> bool:
        text = self.text(path)
        if text is None:
            return False
        dst = root / path
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(text, encoding="utf-8")
        return True


def load(commit: _Commit, path: str) -> tuple[Thresholds, tuple[str, ...]]:
    return inrepo.load_from(commit, path, FLAG, Path(tempfile.mkdtemp(prefix="guard-budgets-")))


def choose(repository: Any, reads: GitHubReads, number: int, base_sha: str, head_sha: str, path: str,
           changed_files: list[str], reviews: list, fallback: TrustPolicy | None, label: str,
           model: str) -> BudgetChoice:
    """The budgets for pull request ``number`` (see the module's docstring)."""
    path = inrepo.repo_path(path, FLAG)
    base, head = _Commit(repository, base_sha, "base"), _Commit(repository, head_sha, "head")
    if base.text(path) is None:
        if fallback is None or fallback.thresholds_text is None:
            raise UsageError(f"{FLAG} {path}: not in the pull request's base ({base_sha[:12]}), and no "
                             "--trusted-thresholds file to fall back on; nothing is posted")
        from guard.config.loading import load_thresholds

        return BudgetChoice(load_thresholds(fallback.thresholds_path, text=fallback.thresholds_text),
                            source=f"guard's own {fallback.thresholds_path} ({path} is not in vLLM's base)",
                            owner="guard", label=label)
    thresholds, files = load(base, path)
    changes = inrepo.head_changes(base, head, path, files, changed_files, FLAG)
    names, touched = tuple(sorted(changes.names)), changes.touched
    source = f"vLLM's {path} at base {base_sha[:12]}"
    if not touched:
        return BudgetChoice(thresholds, source=source, owner="vllm", files=names, label=label)
    accepted, refused = label_acceptance(reads, number, label)
    if accepted is None:
        codeowners = next((t for p in ("/.github/CODEOWNERS", "/CODEOWNERS", "/docs/CODEOWNERS")
                           if (t := base.text(p[1:])) is not None), None)
        owners = owners_of(codeowners, path) if codeowners else ()
        accepted = codeowner_approval(reviews, head_sha, owners, path, reads.in_team) if owners else None
    common = dict(owner="vllm", files=names, changed=touched, changes=changes.lines,
                  refused=(refused,) if refused else (), label=label)
    if accepted is None:
        return BudgetChoice(thresholds, source=source, **common)
    if changes.head_error is not None:  # a head copy that does not load is an error (exit 2)
        raise changes.head_error
    if changes.head is None:
        raise UsageError(f"{FLAG} {path}: accepted by @{accepted.login}, but head deletes the budget file: "
                         "nothing would judge the pull request; nothing is posted")
    accepted_thresholds = changes.head
    if accepted_thresholds.model != model:
        raise UsageError(f"{FLAG} {path}: head's copy is for model '{accepted_thresholds.model}', the run measured "
                         f"'{model}'; nothing is posted")
    return BudgetChoice(accepted_thresholds, source=f"vLLM's {path} at head {head_sha[:12]}, accepted by "
                        f"{accepted.describe()}", accepted=accepted, base=thresholds, **common)


def notice_markdown(choice: BudgetChoice, path: str) -> str:
    """What the comment says about budgets a pull request changes (nothing when it changes none)."""
    if not choice.changed:
        return ""
    lines = "".join(f"\n> - `{ln.replace('`', chr(39))}`" for ln in choice.changes[:30])
    if choice.accepted is not None:
        return (f"> [!NOTE]\n> **Budget change accepted** by {choice.accepted.describe()}: head's copy of `{path}` "
                f"judged this run.{lines}\n")
    refused = "".join(f"\n>\n> Not counted: {r.why}." for r in choice.refused)
    return (f"> [!IMPORTANT]\n> **This pull request changes guard's budgets in vLLM's tree**; base's copy judged "
            f"it.{lines}{refused}\n>\n> To accept the change, someone with write permission adds the label "
            f"`{choice.label}`, or a code owner of `{path}` approves the head commit; the next post then judges "
            f"with head's copy. The report below says how to write the accepting change.\n")

