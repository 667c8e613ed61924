"""The operator census: per Python function, how many operator calls it issued itself.

Named scopes (guard/measure/probes.py) budget the code paths someone already knows to watch. The census
watches everything under its roots (default: the vLLM package): for one profiled request, every
operator call is charged to the *innermost* frame on its Python stack whose file lies under a
root ("self" counts: a call made by a helper under the root is the helper's, not its caller's),
broken down by op name. A host-side loop of small tensor ops anywhere in the model shows up as
one function whose counts grew, wherever it was written.

A function is named ``file:qualname`` (``vllm/model_executor/models/deepencoder2.py:
Qwen2Decoder2Encoder.forward``): the file relative to its package's parent folder, and the
qualified name, never a line number (lines move with every edit). torch.profiler records
``file(first line): co_name``; ``QualnameResolver`` turns that into the qualified name by compiling
the module's source (through ``linecache``, so a source-level mutant resolves against the source
that actually ran) and looking the code object up by first line and name.

Everything here is pure over ``guard.measure.probes.ProfEvent`` records except the resolver, which reads
source files; tests pass recorded events and a resolver over the installed vLLM.

The baseline file (``*.census.json``, written by ``guard update-thresholds``) holds one census per
profiled image size, one line per function, sorted, so a review diff shows exactly the functions
that changed.
"""

from __future__ import annotations

import json
import linecache
import os
import sys
import types
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guard.config.budgets import DEFAULT_ROOTS, CensusRule
from guard.errors import ConfigError
from guard.model.results import CensusCheck, CensusOpDelta, InvalidReason, ReasonKind, Status
from guard.measure.probes import FRAME_RE, HTOD_PREFIX, MEMCPY_HTOD, SYNC_CALLS, CUDA_SYNC, ProfEvent

CENSUS_SCHEMA = "guard/census"
CENSUS_SCHEMA_VERSION = 1

# Profiler events that ProfEvent.is_op lets through but that are Python calls, not operators:
# nn.Module forward calls ("nn.Module: Linear_3", numbered per instance) and optimizer steps.
NOT_OPS = ("nn.Module:", "Optimizer.")

# function "file:qualname" -> op -> calls, for one profiled request
FunctionCounts = dict[str, dict[str, int]]
# "WxH" -> FunctionCounts
Census = dict[str, FunctionCounts]


def size_key(size: tuple[int, int]) -> str:
    return f"{size[0]}x{size[1]}"


# ----------------------------------------------------------------------------- qualified names
class QualnameResolver:
    """``(file relative to sys.path, first line, co_name) -> co_qualname``, by compiling the source.

    Relative profiler paths are found under ``sys.path``; the source comes from ``linecache`` (a
    mutant registers its patched source there). Unresolvable frames keep their bare name.
    """

    def __init__(self, search_path: Iterable[str] | None = None) -> None:
        self._search = [p for p in (search_path if search_path is not None else sys.path) if p]
        self._files: dict[str, dict[tuple[int, str], str]] = {}

    def _absolute(self, rel: str) -> str | None:
        if os.path.isabs(rel):
            return rel
        for base in self._search:
            candidate = os.path.join(base, rel)
            if os.path.isfile(candidate):
                return candidate
        return None

    def _table(self, rel: str) -> dict[tuple[int, str], str]:
        table = self._files.get(rel)
        if table is None:
            table = {}
            path = self._absolute(rel)
            lines = linecache.getlines(path) if path else []
            if lines:
                try:
                    code = compile("".join(lines), path, "exec", dont_inherit=True)
                except (SyntaxError, ValueError):
                    code = None
                stack = [code] if code is not None else []
                while stack:
                    c = stack.pop()
                    table.setdefault((c.co_firstlineno, c.co_name), getattr(c, "co_qualname", c.co_name))
                    stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
            self._files[rel] = table
        return table

    def __call__(self, file: str, line: int, name: str) -> str:
        return self._table(file).get((line, name), name)


def bare_name(file: str, line: int, name: str) -> str:
    """A resolver that keeps the profiler's bare function name (for tests without sources)."""
    return name


# ----------------------------------------------------------------------------- counting
def _under(file: str, roots: tuple[str, ...]) -> bool:
    file = file.replace("\\", "/")
    return any(file == r or file.startswith(r.rstrip("/") + "/") for r in roots)


COMPREHENSIONS = (".<locals>.<listcomp>", ".<locals>.<setcomp>", ".<locals>.<dictcomp>", ".<locals>.<genexpr>")


def fold(qualname: str) -> str:
    """A comprehension's ops belong to the function that wrote it (Python 3.12 inlines them anyway,
    PEP 709): ``Encoder.forward.<locals>.<listcomp>`` -> ``Encoder.forward``."""
    while qualname.endswith(COMPREHENSIONS):
        qualname = qualname.rsplit(".<locals>.", 1)[0]
    return qualname


def folded(census: FunctionCounts) -> FunctionCounts:
    """The census with comprehension frames merged into their functions (idempotent)."""
    out: dict[str, Counter[str]] = {}
    for fn, ops in census.items():
        out.setdefault(fold(fn), Counter()).update(ops)
    return {fn: dict(sorted(c.items())) for fn, c in sorted(out.items())}


def function_of(stack: tuple[str, ...], roots: tuple[str, ...],
                resolve: Callable[[str, int, str], str]) -> str | None:
    """The innermost frame under a root, as ``file:qualname``; None when no frame is under one."""
    for frame in stack:
        m = FRAME_RE.match(frame)
        if m and _under(m.group("file"), roots):
            file = m.group("file").replace("\\", "/")
            return f"{file}:{fold(resolve(file, int(m.group('line')), m.group('func')))}"
    return None


def count_functions(events: Iterable[ProfEvent], roots: tuple[str, ...] = DEFAULT_ROOTS,
                    resolve: Callable[[str, int, str], str] = bare_name) -> FunctionCounts:
    """One profiled request's census: function -> op -> calls, sorted by function then op.

    CUDA runtime calls are not operators; the blocking ones count as ``cuda::sync``, and a device
    "Memcpy HtoD" an operator launched counts once more as ``cuda::memcpy_htod`` on its function.
    """
    counts: dict[str, Counter[str]] = {}
    memo: dict[tuple[str, ...], str | None] = {}
    for e in events:
        if not e.is_op or e.name.startswith(NOT_OPS):
            continue
        if e.name.startswith("cuda"):
            if e.name not in SYNC_CALLS:
                continue
            label = CUDA_SYNC
        else:
            label = e.name
        fn = memo.get(e.stack, "?")
        if fn == "?":
            fn = memo[e.stack] = function_of(e.stack, roots, resolve)
        if fn is None:
            continue
        c = counts.setdefault(fn, Counter())
        c[label] += 1
        htod = sum(1 for k in e.device_activity if k.startswith(HTOD_PREFIX))
        if htod:
            c[MEMCPY_HTOD] += htod
    return {fn: dict(sorted(c.items())) for fn, c in sorted(counts.items())}


def total_calls(ops: Mapping[str, int]) -> int:
    """Operator calls of one function; pseudo-ops (CUDA activity) are not operator calls."""
    return sum(n for op, n in ops.items() if not op.startswith("cuda::"))


def without(census: FunctionCounts, excluded: Iterable[str]) -> FunctionCounts:
    drop = set(excluded)
    return {fn: ops for fn, ops in census.items() if fn not in drop}


def unstable_functions(runs: list[FunctionCounts]) -> dict[str, list[int]]:
    """Functions whose counts differ between runs of the same request: name -> totals per run."""
    names = sorted(set().union(*runs)) if runs else []
    return {fn: [total_calls(r.get(fn, {})) for r in runs] for fn in names
            if any(r.get(fn) != runs[0].get(fn) for r in runs[1:])}


# ----------------------------------------------------------------------------- rule and diff
def _op_deltas(base: Mapping[str, int], got: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    deltas = [(op, got.get(op, 0) - base.get(op, 0)) for op in set(base) | set(got)]
    return tuple(sorted(((op, d) for op, d in deltas if d), key=lambda od: (-od[1], od[0])))


def request_deltas(baseline: FunctionCounts, measured: FunctionCounts) -> dict[str, int]:
    """Per op, how much the whole request's calls changed (summed over every judged function)."""
    total: Counter[str] = Counter()
    for fn, ops in measured.items():
        total.update(ops)
    for fn, ops in baseline.items():
        total.subtract(ops)
    return {op: d for op, d in total.items() if d}


def _moved_in(deltas: tuple[tuple[str, int], ...], request: Mapping[str, int]) -> dict[str, int]:
    """Of a function's growth per op, the part the rest of the request gave up: the request's
    total of that op grew by less than this function did, so the difference moved here."""
    return {op: d - min(d, max(request.get(op, 0), 0)) for op, d in deltas if d > 0 and request.get(op, 0) < d}


def _donors(op_moves: Mapping[str, int], baseline: FunctionCounts, measured: FunctionCounts) -> tuple[str, ...]:
    """The functions that gave up the moved calls: the one whose losses match them best first, then
    each next one only while calls are left unexplained (ops like ``aten::view`` shrink in many)."""
    lost: dict[str, dict[str, int]] = {}
    for fn in set(baseline) | set(measured):
        before, after = baseline.get(fn, {}), measured.get(fn, {})
        gave = {op: before.get(op, 0) - after.get(op, 0) for op in op_moves}
        gave = {op: n for op, n in gave.items() if n > 0}
        if gave:
            lost[fn] = gave
    overlap = {fn: sum(min(n, op_moves[op]) for op, n in gave.items()) for fn, gave in lost.items()}
    need = dict(op_moves)
    out = []
    for fn in sorted(lost, key=lambda f: (-overlap[f], f)):
        if sum(min(n, need[op]) for op, n in lost[fn].items()) <= 0:
            continue
        out.append(fn)
        for op, n in lost[fn].items():
            need[op] = max(0, need[op] - n)
    return tuple(out)


def compare(rule: CensusRule, image_size: tuple[int, int], baseline: FunctionCounts,
            measured: FunctionCounts) -> list[CensusCheck]:
    """A check per function whose counts differ, failures first, by growth. Excluded functions are skipped.

    Growth is judged after taking out what merely moved: calls of an op that this function gained
    while the request as a whole did not (a refactor moved them into a new helper, or renamed the
    function) are ``moved_calls``, a notice, never a failure. What is left:

    - in both, grown: fails when the growth exceeds both ``max_growth_pct`` of the baseline and
      ``min_growth_calls``; or when a watched op grew here and in the whole request;
    - new: fails above ``new_function_max_calls``, or with any watched op that grew in the request;
    - shrunk or vanished: passes (a notice: the baseline can be ratcheted down).
    """
    watch = set(rule.watch)
    judged_base = {fn: ops for fn, ops in baseline.items() if fn not in rule.exclude}
    judged_got = {fn: ops for fn, ops in measured.items() if fn not in rule.exclude}
    request = request_deltas(judged_base, judged_got)
    out = []
    for fn in sorted(set(judged_base) | set(judged_got)):
        base, got = judged_base.get(fn), judged_got.get(fn)
        if base == got:
            continue
        deltas = _op_deltas(base or {}, got or {})
        if not deltas:
            continue
        moved_ops = _moved_in(deltas, request)
        moved = total_calls(moved_ops)
        grew_watched = tuple(op for op, d in deltas if d > 0 and op in watch and request.get(op, 0) > 0)
        b = total_calls(base) if base is not None else None
        m = total_calls(got) if got is not None else None
        reason = ""
        if b is None:
            if m - moved > rule.new_function_max_calls:
                reason = (f"new function with {m} op calls > new_function_max_calls {rule.new_function_max_calls}"
                          + (f" ({moved} of them moved from elsewhere in the request)" if moved else ""))
        elif m is not None and m - moved > b:
            growth = m - moved - b
            if growth > b * rule.max_growth_pct / 100.0 and growth > rule.min_growth_calls:
                reason = (f"+{growth} op calls: more than {rule.max_growth_pct:g} % of {b} and more than "
                          f"min_growth_calls {rule.min_growth_calls}"
                          + (f" (besides {moved} that moved here from elsewhere in the request)" if moved else ""))
        if grew_watched:
            why = "watched op(s) grew in the request: " + ", ".join(f"{dict(deltas)[op]:+d} {op}" for op in grew_watched)
            reason = f"{reason}; {why}" if reason else why
        out.append(CensusCheck(function=fn, image_size=tuple(image_size), baseline_calls=b, measured_calls=m,
                               op_deltas=tuple(CensusOpDelta(op, d) for op, d in deltas),
                               status=Status.FAIL if reason else Status.PASS, reason=reason, watched_ops=grew_watched,
                               moved_calls=moved,
                               moved_from=_donors(moved_ops, judged_base, judged_got) if moved else ()))
    out.sort(key=_check_order)
    return out


def _check_order(c: CensusCheck):
    return (c.status != Status.FAIL, -c.growth_calls, c.function, c.image_size)


# ----------------------------------------------------------------------------- baseline file
@dataclass(frozen=True)
class Baseline:
    path: Path
    model: str
    profile: str
    roots: tuple[str, ...]
    census: Census  # "WxH" -> function -> op -> calls
    provenance: Mapping[str, Any] = field(default_factory=dict)
    excluded: Mapping[str, str] = field(default_factory=dict)  # as stated when it was written


def render_baseline(model: str, profile: str, roots: tuple[str, ...], census: Census,
                    provenance: Mapping[str, Any], excluded: Mapping[str, str]) -> str:
    """JSON with one line per function, sorted: a review diff names exactly the functions that moved."""
    dump = lambda v: json.dumps(v, sort_keys=True, ensure_ascii=False)  # noqa: E731
    lines = ["{",
             f'  "schema": {dump(CENSUS_SCHEMA)},',
             f'  "schema_version": {CENSUS_SCHEMA_VERSION},',
             f'  "model": {dump(model)},',
             f'  "profile": {dump(profile)},',
             f'  "roots": {dump(list(roots))},',
             f'  "provenance": {dump(dict(provenance))},',
             '  "excluded": {']
    ex = sorted(excluded.items())
    lines += [f"    {dump(fn)}: {dump(why)}{',' if i < len(ex) - 1 else ''}" for i, (fn, why) in enumerate(ex)]
    lines += ["  },", '  "census": {']
    sizes = sorted(census, key=lambda s: tuple(int(x) for x in s.split("x")))
    for si, size in enumerate(sizes):
        lines.append(f"    {dump(size)}: {{")
        fns = sorted(census[size].items())
        lines += [f"      {dump(fn)}: {dump(ops)}{',' if i < len(fns) - 1 else ''}" for i, (fn, ops) in enumerate(fns)]
        lines.append("    }" + ("," if si < len(sizes) - 1 else ""))
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def read_baseline(rule: CensusRule | None) -> Baseline | None:
    """The rule's committed baseline; None when there is no rule or the file does not exist yet
    (evaluation then says how to write it). A malformed file is a ConfigError (exit 2)."""
    if rule is None or not Path(rule.baseline).exists():
        return None
    return load_baseline(rule.baseline)


def load_baseline(path: Path) -> Baseline:
    """Read and validate a census baseline file (ConfigError naming the file, line and key)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(str(path), None, "(file)", "no such census baseline",
                          hint="write it with `guard check` then `guard update-thresholds --from "
                               "guard-results/results.json`") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), None, "(file)", f"cannot read: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(str(path), exc.lineno, "(syntax)", f"not valid JSON: {exc.msg}") from None

    def bad(key: str, problem: str) -> ConfigError:
        needle = f'"{key.rsplit(".", 1)[-1]}"'
        line = next((i + 1 for i, t in enumerate(text.splitlines()) if needle in t), None)
        return ConfigError(str(path), line, key, problem)

    if not isinstance(data, dict) or data.get("schema") != CENSUS_SCHEMA:
        raise bad("schema", f"not a {CENSUS_SCHEMA} file")
    if data.get("schema_version") != CENSUS_SCHEMA_VERSION:
        raise bad("schema_version", f"unknown schema version {data.get('schema_version')!r}; "
                                    f"this guard reads {CENSUS_SCHEMA_VERSION}")
    for key, kind in (("model", str), ("profile", str), ("roots", list), ("census", dict),
                      ("provenance", dict), ("excluded", dict)):
        if not isinstance(data.get(key), kind):
            raise bad(key, f"expected {'a string' if kind is str else 'a list' if kind is list else 'a mapping'}")
    census: Census = {}
    for size, fns in data["census"].items():
        parts = size.split("x")
        if len(parts) != 2 or not all(p.isdigit() for p in parts) or not isinstance(fns, dict):
            raise bad(f"census.{size}", "expected \"WxH\": {function: {op: calls}}")
        for fn, ops in fns.items():
            if not isinstance(ops, dict) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                                    for n in ops.values()):
                raise bad(f"census.{size}.{fn}", "expected {op: calls} with calls a non-negative integer")
        census[size] = {fn: dict(ops) for fn, ops in fns.items()}
    return Baseline(path=Path(path), model=data["model"], profile=data["profile"], roots=tuple(data["roots"]),
                    census=census, provenance=data["provenance"], excluded=data["excluded"])


# ----------------------------------------------------------------------------- judging a run
NO_BASELINE = "no census baseline"  # its text; update-thresholds writes a baseline past its kind, CENSUS_BASELINE


@dataclass(frozen=True)
class CensusJudgement:
    """The census of one run against its baseline: every differing function, and why the
    comparison could not be made (``invalid``: the run cannot be judged)."""

    checks: tuple[CensusCheck, ...] = ()
    invalid: tuple[InvalidReason, ...] = ()
    functions: int = 0  # (function, image size) pairs judged

    @property
    def failed(self) -> tuple[CensusCheck, ...]:
        return tuple(c for c in self.checks if c.status == Status.FAIL)


def parse_size(key: str) -> tuple[int, int]:
    w, h = key.split("x")
    return int(w), int(h)


def judge(rule: CensusRule, baseline: Baseline | None, measured: Census,
          sizes: Iterable[tuple[int, int]], *, model: str, profile: str, update_command: str) -> CensusJudgement:
    """Compare every profiled image size's census with the baseline. Pure."""
    invalid: list[InvalidReason] = []
    missing, stale = ReasonKind.CENSUS_MISSING, ReasonKind.CENSUS_BASELINE_MISMATCH
    sizes = [size_key(s) for s in sizes]
    for s in sizes:
        if s not in measured:
            invalid.append(InvalidReason(missing, f"census: no census was measured for a {s} image"))
        elif not measured[s]:
            invalid.append(InvalidReason(missing, f"census: no operator call of the {s} request was under {', '.join(rule.roots)}: "
                           "the profiler recorded no Python frames there, so the census proves nothing"))
    if baseline is None:
        invalid.append(InvalidReason(ReasonKind.CENSUS_BASELINE,
                                     f"census: {NO_BASELINE} at {rule.baseline}; write it from this run with `{update_command}`"))
        return CensusJudgement(invalid=tuple(invalid))
    if (baseline.model, baseline.profile) != (model, profile):
        invalid.append(InvalidReason(stale, f"census: baseline {baseline.path} is for model '{baseline.model}', profile "
                       f"'{baseline.profile}', not '{model}', '{profile}'"))
    if tuple(baseline.roots) != tuple(rule.roots):
        invalid.append(InvalidReason(stale, f"census: baseline {baseline.path} counted under roots {list(baseline.roots)}, the rule says "
                       f"{list(rule.roots)}; rewrite it with `{update_command}`"))
    for s in sizes:
        if s in measured and s not in baseline.census:
            invalid.append(InvalidReason(stale, f"census: baseline {baseline.path} has no {s} census (a new profile image size?); "
                           f"write it with `{update_command}`"))
    if invalid:
        return CensusJudgement(invalid=tuple(invalid))
    checks: list[CensusCheck] = []
    judged = 0
    for s in sizes:
        judged += len((set(folded(measured[s])) | set(folded(baseline.census[s]))) - set(rule.exclude))
        checks += compare(rule, parse_size(s), without(folded(baseline.census[s]), rule.exclude), folded(measured[s]))
    checks.sort(key=_check_order)
    return CensusJudgement(checks=tuple(checks), functions=judged)


# ----------------------------------------------------------------------------- update-thresholds
@dataclass(frozen=True)
class CensusPlan:
    """A new census baseline for ``guard update-thresholds``: the text, and what moved."""

    path: Path
    old_text: str | None  # None: no baseline yet
    new_text: str
    functions: int
    decreases: tuple[str, ...] = ()
    increases: tuple[str, ...] = ()  # "640x480 file:fn: 10 -> 522 op calls (+256 aten::copy_, ...)"

    def summary(self) -> list[str]:
        if self.old_text is None:
            return [f"census: writing the first baseline {self.path} ({self.functions} functions)"]
        return [f"census: {self.path}: {len(self.decreases)} function(s) down (accepted), "
                f"{len(self.increases)} up" + (" (need --allow-increase)" if self.increases else "")]


def plan_census(profile, model: str, run_census: Census, *, provenance: Mapping[str, Any],
                allow_increase: bool, results_path: Path) -> CensusPlan:
    """The baseline this run's census gives (excluded functions left out). Decreases are always
    accepted; any function whose op calls grew, or a new one, needs ``allow_increase``."""
    from guard.errors import UsageError

    rule: CensusRule = profile.census
    sizes = [size_key(s) for s in profile.workload.profile_image_sizes]
    missing = [s for s in sizes if not run_census.get(s)]
    if missing:
        raise ConfigError(str(results_path), None, "run.census",
                          f"this run has no census for {', '.join(missing)}",
                          hint=f"run `guard check --profile {profile.name}` with the census rule in place")
    census = {s: without(folded(run_census[s]), rule.exclude) for s in sizes}
    old: Baseline | None = load_baseline(rule.baseline) if rule.baseline.exists() else None
    old_text = rule.baseline.read_text(encoding="utf-8") if old is not None else None
    ups: list[tuple[int, str]] = []
    downs: list[str] = []
    if old is not None:
        for s in sizes:
            before = old.census.get(s, {})
            for fn in sorted(set(before) | set(census[s])):
                b, m = before.get(fn, {}), census[s].get(fn, {})
                if b == m:
                    continue
                deltas = _op_deltas(b, m)
                line = (f"{s} {fn}: {total_calls(b) if fn in before else 'new'} -> {total_calls(m)} op calls ("
                        + ", ".join(f"{d:+d} {op}" for op, d in deltas[:4]) + (", ..." if len(deltas) > 4 else "") + ")")
                if any(d > 0 for _, d in deltas):
                    ups.append((total_calls(m) - total_calls(b), line))
                else:
                    downs.append(line)
    increases = tuple(line for _, line in sorted(ups, key=lambda x: -x[0]))
    if increases and not allow_increase:
        shown = "; ".join(increases[:5]) + (f"; ... {len(increases) - 5} more" if len(increases) > 5 else "")
        raise UsageError(f"refusing to raise the census of {len(increases)} function(s): {shown}. More operator "
                         "calls per request is the regression the census exists to catch",
                         hint="if the new calls are intended, re-run with --allow-increase and say why in the pull request")
    unchanged = (old is not None and {s: old.census.get(s) for s in sizes} == census
                 and tuple(old.roots) == tuple(rule.roots) and dict(old.excluded) == dict(rule.exclude))
    new_text = old_text if unchanged else render_baseline(model, profile.name, rule.roots, census, provenance, rule.exclude)
    return CensusPlan(path=rule.baseline, old_text=old_text, new_text=new_text,
                      functions=sum(len(c) for c in census.values()), decreases=tuple(downs), increases=increases)


def write_census_atomic(path: Path, text: str) -> None:
    """The baseline, atomically (guard.files), never in a form that guard itself would reject."""
    from guard.files import write_text_atomic

    write_text_atomic(path, text, check=load_baseline)
