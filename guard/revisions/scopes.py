"""A budgeted scope whose function head no longer has: name the budget and say where its code went.

An op budget names a function (``scope: {file, function}``); a pull request that renames or
removes it leaves the budget counting nothing in head. The run cannot judge that budget, and the
reason is the budget's, not the engine's: the budget needs its author's update. So instead of
"op-count scope 'mask_path' was never entered", ``guard pr`` says which budget (profile and scope)
lost its function and where its code went, from two sources:

- the census (runtime): the functions head's request charges with calls the vanished function issued
  itself at base — guard.judge.census.compare's ``moved_calls``/``moved_from``, the rule that
  already tells a move from growth;
- the source (git): the functions head added, in the scope's file or in another changed file,
  whose body is the vanished one's, or close to it (a rename changes only the ``def`` line).

It also says whether head's request still issues every op call the scope counted at base (its
code still runs, under another name) or fewer (code was removed).

The verdict stays invalid (exit 3): the budget is neither held nor exceeded (docs/pr.md).
"""

from __future__ import annotations

import difflib
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from guard.config.budgets import CensusRule, Profile, ScopeBudget, ScopeKind
from guard.judge.census import compare, request_deltas
from guard.model.readings import folded, parse_size, size
from guard.model.records import ABRecord, InvalidReason, ReasonKind, RunRecord, ScopeCounts
from guard.revisions import git
from guard.revisions.functions import function_spans

MIN_SIMILARITY = 0.6  # of the body, the def line's name left out: a rename is 1.0
MAX_CANDIDATES = 3


@dataclass(frozen=True)
class Candidate:
    function: str  # "file:qualname", as the census names functions
    why: str  # the evidence, e.g. "same body but the name" or "2 op calls moved there"
    score: float  # for ordering: census evidence and identical bodies first


def _last(qualname: str) -> str:
    return qualname.rsplit(".", 1)[-1]


def _is_scope_function(function: str, sb: ScopeBudget) -> bool:
    """Whether census function ``file:qualname`` is the scope's function, or nested in it."""
    file, _, qualname = function.partition(":")
    parts = qualname.replace(".<locals>.", ".").split(".")
    return file.endswith(sb.scope.file) and sb.scope.function in parts


def _body(source: str, span: tuple[int, int], name: str) -> str:
    """A function's source without its indentation, its own name replaced (what a rename keeps)."""
    first, last = span
    text = textwrap.dedent("\n".join(source.splitlines()[first - 1:last]))
    return text.replace(f"def {name}(", "def _(", 1)


def source_candidates(repo: Path, base: git.Revision, head: git.Revision, sb: ScopeBudget,
                      changed: Sequence[str]) -> list[Candidate]:
    """Functions head added (in the scope's file or another changed vllm/ file) whose body is the
    vanished function's or close to it, most alike first."""
    file, name = sb.scope.file, sb.scope.function
    base_source = git.file_at(repo, base, file) or ""
    base_spans = function_spans(base_source)
    old = [_body(base_source, span, name) for q, span in base_spans.items() if _last(q) == name]
    if not old:
        return []
    out = []
    files = dict.fromkeys([file, *(f for f in changed if f.endswith(".py") and f.startswith(git.PACKAGE + "/"))])
    for f in files:
        source = git.file_at(repo, head, f)
        if source is None:
            continue
        before = base_spans if f == file else function_spans(git.file_at(repo, base, f) or "")
        for q, span in function_spans(source).items():
            if q in before:
                continue
            body = _body(source, span, _last(q))
            ratio = max(difflib.SequenceMatcher(None, o, body, autojunk=False).ratio() for o in old)
            if ratio >= MIN_SIMILARITY:
                where = "same file" if f == file else f
                why = f"{where}, its body unchanged but for the name" if ratio == 1.0 else \
                    f"{where}, {ratio:.0%} of its body alike"
                out.append(Candidate(f"{f}:{q}", why, ratio))
    return sorted(out, key=lambda c: (-c.score, c.function))


def census_candidates(rule: CensusRule | None, sb: ScopeBudget, base: RunRecord, head: RunRecord) -> list[Candidate]:
    """Functions of head's census that took calls the scope's own function issued at base."""
    rule = rule or CensusRule(baseline=Path())
    moved: dict[str, int] = {}
    for key in sorted(set(base.census) & set(head.census)):
        checks = compare(rule, parse_size(key), folded(base.census[key]), folded(head.census[key]))
        for c in checks:
            if c.moved_calls and c.baseline_calls is None and any(_is_scope_function(d, sb) for d in c.moved_from):
                moved[c.function] = max(moved.get(c.function, 0), c.moved_calls)
    return [Candidate(fn, f"{n} op calls per request moved there from it", 2.0 + n)
            for fn, n in sorted(moved.items(), key=lambda kv: -kv[1])]


def still_issued(counts: Sequence[ScopeCounts], base: RunRecord, head: RunRecord) -> str:
    """Whether head's request still issues the op calls the scope counted at base."""
    fewer = []
    total = 0
    for c in counts:
        key = size(c.image_size)
        if key not in base.census or key not in head.census:
            return ""
        deltas = request_deltas(folded(base.census[key]), folded(head.census[key]))
        total = max(total, c.total_calls)
        fewer += [f"{-deltas[op]} {op} [{key}]" for op in c.calls_by_op if deltas.get(op, 0) < 0]
    if fewer:
        return f"head's request issues fewer of the ops it counted at base ({', '.join(fewer[:3])}): code was removed"
    return (f"head's census still has every op call it counted at base (up to {total} per request), so its code "
            "still runs, under another name")


def gone_scopes(profile: Profile, rec: ABRecord, repo: Path, base: git.Revision, head: git.Revision,
                changed: Sequence[str]) -> dict[str, InvalidReason]:
    """Scope budget name -> why it cannot be judged, for each function scope that base entered and
    whose function head's source no longer has."""
    entered = {c.scope for c in rec.baseline.op_counts if c.entries > 0}
    never = {c.scope for c in rec.candidate.op_counts if c.entries == 0}
    out = {}
    for sb in profile.ops:
        if sb.scope.kind != ScopeKind.FUNCTION or sb.name not in never or sb.name not in entered:
            continue
        head_source = git.file_at(repo, head, sb.scope.file)
        if head_source is not None and any(_last(q) == sb.scope.function for q in function_spans(head_source)):
            continue  # still there, just not called: the usual "never entered"
        found = census_candidates(profile.census, sb, rec.baseline, rec.candidate)
        seen = {c.function for c in found}
        found += [c for c in source_candidates(repo, base, head, sb, changed) if c.function not in seen]
        base_counts = [c for c in rec.baseline.op_counts if c.scope == sb.name and c.entries > 0]
        out[sb.name] = InvalidReason(ReasonKind.SCOPE_GONE, describe(profile, sb, head, found[:MAX_CANDIDATES],
                                                                     still_issued(base_counts, rec.baseline, rec.candidate)))
    return out


def describe(profile: Profile, sb: ScopeBudget, head: git.Revision, found: Sequence[Candidate], issued: str) -> str:
    scope = sb.scope.describe()
    gone = "no longer exists in head" + ("" if head is None else f" {head.sha[:12]}")
    if found:
        where = "; or ".join(f"renamed to {c.function}? ({c.why})" for c in found)
    else:
        where = "no function head added looks like it: removed, or moved into a function that already existed?"
    text = (f"op budget '{sb.name}' of profile '{profile.name}': its scope {scope} {gone}: {where}")
    if issued:
        text += f"; {issued}"
    key = f"profiles.{profile.name}.budgets.ops.{sb.name}.scope"
    fix = (f"set {key}.function to {_last(found[0].function.partition(':')[2])}"
           + (f" and {key}.file to {found[0].function.partition(':')[0]}"
              if found[0].function.partition(":")[0] != sb.scope.file else "")) if found else f"update {key}"
    return f"{text}. The budget is not judged: it needs its author's update in the budget file ({fix})"
