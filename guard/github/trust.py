"""A pull request cannot vouch for itself.

perf-guard measures a pull request with the pull request's own code: its workflow file, its
guard, its perf suite and its thresholds file. A PR that edits any of those could make its own
run say "pass". So before guard comment posts a verdict, it reads the PR's changed files through
the API; when one of them is in a protected place the commit status is ``error`` ("needs a run
approved by a maintainer") and the comment says what changed, down to the budgets
(``profiles.cpu ttft_ms.p50 budget 7000 -> 9000 ms``).

A maintainer approves by submitting an approving review of the pull request's head commit; a new
push makes the approval stale, because it is bound to the commit it reviewed. See docs/github.md,
"Approving a run". Pure functions here; the API calls are in guard.github.publish.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from guard.config.budgets import Profile, Thresholds
from guard.config.loading import load_thresholds
from guard.errors import ConfigError
from guard.sanitize import one_line

PROTECTED_PATTERNS = (".github/workflows/*", "guard/*", "tests/perf/*")
APPROVER_ASSOCIATIONS = ("OWNER", "MEMBER", "COLLABORATOR")  # GitHub's author_association of a review


@dataclass(frozen=True)
class Review:
    login: str
    state: str  # APPROVED | CHANGES_REQUESTED | COMMENTED | DISMISSED | PENDING
    commit_id: str | None
    association: str  # OWNER | MEMBER | COLLABORATOR | CONTRIBUTOR | NONE ...


@dataclass(frozen=True)
class ChangedFile:
    filename: str
    status: str  # added | modified | removed | renamed | ...
    previous_filename: str | None = None


@dataclass(frozen=True)
class TrustPolicy:
    """What guard comment needs to judge a PR's changes (from the default branch's checkout)."""

    thresholds_path: str  # repository-relative path of the thresholds file, e.g. thresholds/deepseek-ocr-2.yaml
    thresholds_text: str | None  # its content on the default branch (None: not there)
    approver_associations: tuple[str, ...] = APPROVER_ASSOCIATIONS
    patterns: tuple[str, ...] = PROTECTED_PATTERNS
    # budgets kept in the measured repository: judged by base's copy until accepted (guard.github.budget_files)
    budget_files: tuple[str, ...] = ()


def is_protected(path: str, policy: TrustPolicy) -> bool:
    path = path.lstrip("/")
    if path in policy.budget_files:
        return False
    budgets = policy.thresholds_path.replace("{model}", "*")  # every model's file, for a per-model template
    return fnmatch.fnmatchcase(path, budgets) or any(fnmatch.fnmatchcase(path, p) for p in policy.patterns)


def protected_changes(files: list[ChangedFile], policy: TrustPolicy) -> list[ChangedFile]:
    """Changed files in protected places; a rename counts when either side is protected."""
    return [f for f in files if is_protected(f.filename, policy)
            or (f.previous_filename is not None and is_protected(f.previous_filename, policy))]


def approver(reviews: list[Review], head: str, policy: TrustPolicy) -> str | None:
    """The maintainer whose latest review approves exactly ``head``, if any. A later
    "changes requested" by the same person, or a review of an older commit, is no approval."""
    latest: dict[str, Review] = {}
    for r in reviews:  # the API lists reviews oldest first
        if r.state in ("APPROVED", "CHANGES_REQUESTED", "DISMISSED"):
            latest[r.login.lower()] = r
    for r in latest.values():
        if r.state == "APPROVED" and (r.commit_id or "").lower() == head.lower() \
                and r.association in policy.approver_associations:
            return r.login
    return None


def _num(x: float) -> str:
    return f"{int(x)}" if float(x).is_integer() else f"{x:g}"


def _op_budgets(p: Profile) -> dict[str, str]:
    out = {}
    for sb in p.ops:
        for op, b in sb.ops.items():
            out[f"{sb.name} {op}"] = f"{b.rule} {b.count}"
        if sb.total_ops is not None:
            out[f"{sb.name} total_ops"] = f"{sb.total_ops.rule} {sb.total_ops.count}"
    return out


def describe_thresholds_change(old: Thresholds | None, new: Thresholds) -> list[str]:
    """What a PR does to the budgets, one line per change, e.g. "profile cpu: ttft_ms.p50 budget 7000 → 9000 ms"."""
    lines: list[str] = []
    old_profiles = old.profiles if old is not None else {}
    for name in sorted(set(old_profiles) | set(new.profiles)):
        a, b = old_profiles.get(name), new.profiles.get(name)
        if a is None:
            lines.append(f"profile {name}: added")
            continue
        if b is None:
            lines.append(f"profile {name}: removed")
            continue
        for key in sorted(set(a.ttft_ms) | set(b.ttft_ms)):
            x, y = a.ttft_ms.get(key), b.ttft_ms.get(key)
            if x != y:
                lines.append(f"profile {name}: ttft_ms.{key} budget "
                             f"{'(none)' if x is None else _num(x) + ' ms'} → {'(none)' if y is None else _num(y) + ' ms'}")
        oa, ob = _op_budgets(a), _op_budgets(b)
        for key in sorted(set(oa) | set(ob)):
            if oa.get(key) != ob.get(key):
                lines.append(f"profile {name}: op budget {key}: {oa.get(key, '(none)')} → {ob.get(key, '(none)')} calls")
        if a.headroom_pct != b.headroom_pct:
            lines.append(f"profile {name}: headroom_pct {_num(a.headroom_pct)} → {_num(b.headroom_pct)}")
        for section in ("match", "engine", "workload", "statistics"):
            if getattr(a, section) != getattr(b, section):
                lines.append(f"profile {name}: {section} changed")
    if old is not None and old.model != new.model:
        lines.append(f"model {old.model} → {new.model}")
    return [one_line(ln, limit=200) for ln in lines]


def thresholds_change_lines(policy: TrustPolicy, new_text: str | None) -> list[str]:
    """Parse the default branch's and the PR's thresholds file and describe the difference."""
    if new_text is None:
        return ["the thresholds file is deleted in this pull request"]
    old = None
    if policy.thresholds_text is not None:
        try:
            old = load_thresholds(policy.thresholds_path, text=policy.thresholds_text)
        except ConfigError:
            old = None  # the default branch's own file is broken: describe the new one alone
    try:
        new = load_thresholds(policy.thresholds_path, text=new_text)
    except ConfigError as exc:
        return [one_line(f"the pull request's thresholds file does not load: {exc}", limit=300)]
    lines = describe_thresholds_change(old, new)
    return lines or ["the thresholds file changed, but no budget, profile or setting in it did (comments or layout)"]


def md_code(text: str) -> str:
    """A PR-controlled string as inline Markdown code: one line, no backticks to break out of."""
    return "`" + one_line(text, limit=200).replace("`", "'") + "`"


def notice_markdown(changed: list[ChangedFile], threshold_lines: list[str], approved_by: str | None,
                    head: str) -> str:
    files = "\n".join(f"> - {md_code(f.filename)} ({one_line(f.status, 20)}"
                      + (f", was {md_code(f.previous_filename)}" if f.previous_filename else "") + ")"
                      for f in changed[:30])
    if len(changed) > 30:
        files += f"\n> - … and {len(changed) - 30} more"
    budget = "".join(f"\n> - {md_code(line)}" for line in threshold_lines)
    budget_part = f"\n>\n> **Budget changes in this pull request:**{budget}" if threshold_lines else ""
    if approved_by:
        top = (f"> [!NOTE]\n> **Approved by a maintainer:** {md_code(approved_by)} approved commit `{head[:12]}`, "
               "which changes what guard trusts (listed below). The verdict below stands.")
    else:
        top = ("> [!CAUTION]\n> **This pull request needs a run approved by a maintainer.** It changes what guard "
               "trusts (its workflow, its code, the perf suite or the budgets), so its own run cannot vouch for it: "
               "the numbers below were measured and judged by the pull request's own code. The commit status is "
               f"`error` until a maintainer reviews these changes and approves commit `{head[:12]}` "
               "(docs/github.md, \"Approving a run\").")
    return f"{top}\n>\n> **Changed files:**\n{files}{budget_part}\n"
