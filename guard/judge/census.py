"""The census judged: a run's operator census against a baseline, function by function.

The census itself is counted by guard.measure.census and stored on the run record
(``RunRecord.census``, a ``guard.model.readings.Census``); the baseline is the committed file
(guard.config.census) or, in A/B mode and ``guard pr``, the other side's census. Pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from guard.config.budgets import CensusRule, RequestMix
from guard.config.census import Baseline
from guard.judge.pricing import CostTable, counted_on_gpu, price, shipped_costs
from guard.model.readings import (Census, DecodeCensus, FunctionCounts, comparable, folded, input_processing_only,
                                  op_deltas, parse_size, size, total_calls, without)
from guard.model.records import InvalidReason, ReasonKind, Status
from guard.model.checks import CensusCheck, CensusOpDelta


# ----------------------------------------------------------------------------- rule and diff
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
            measured: FunctionCounts, *, costs: CostTable | None = None, on_gpu: bool = False) -> list[CensusCheck]:
    """A check per function whose counts differ, failures first, by growth. Excluded functions are skipped.

    Growth is judged after taking out what merely moved: calls of an op that this function gained
    while the request as a whole did not (a refactor moved them into a new helper, or renamed the
    function) are ``moved_calls``, a notice, never a failure. What is left:

    - in both, grown: fails when the growth exceeds both ``max_growth_pct`` of the baseline and
      ``min_growth_calls``; or when a watched op grew here and in the whole request;
    - new: fails above ``new_function_max_calls``, or with any watched op that grew in the request;
    - shrunk or vanished: passes (a notice: the baseline can be ratcheted down).

    A function whose every call ran in vLLM's input processing (``input_processing_only``, as the
    measured side saw it) is held to the growth rules only: its watched ops act on the processor's
    host tensors and wait for no device. The request's watched ops are summed over the other
    functions, so a sync that moves from the processor into the model still fails.

    ``costs``: each check also says what its change would cost on each GPU the table names
    (guard.judge.pricing), calls that merely moved left out; a function on host tensors is not priced.
    """
    watch = set(rule.watch)
    judged_base = {fn: ops for fn, ops in baseline.items() if fn not in rule.exclude}
    judged_got = {fn: ops for fn, ops in measured.items() if fn not in rule.exclude}
    request = request_deltas(judged_base, judged_got)
    host = ({fn for fn, ops in judged_got.items() if input_processing_only(ops)}
            | {fn for fn, ops in judged_base.items() if fn not in judged_got and input_processing_only(ops)})
    on_device = request_deltas({fn: ops for fn, ops in judged_base.items() if fn not in host},
                               {fn: ops for fn, ops in judged_got.items() if fn not in host})
    out = []
    for fn in sorted(set(judged_base) | set(judged_got)):
        base, got = judged_base.get(fn), judged_got.get(fn)
        if base == got:
            continue
        deltas = op_deltas(base or {}, got or {})
        if not deltas:
            continue
        moved_ops = _moved_in(deltas, request)
        moved = total_calls(moved_ops)
        grew_watched = () if fn in host else tuple(op for op, d in deltas
                                                   if d > 0 and op in watch and on_device.get(op, 0) > 0)
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
        priced = () if costs is None or fn in host else price(
            {op: d - moved_ops.get(op, 0) for op, d in deltas}, costs, on_gpu=on_gpu)
        out.append(CensusCheck(function=fn, image_size=tuple(image_size), baseline_calls=b, measured_calls=m,
                               op_deltas=tuple(CensusOpDelta(op, d) for op, d in deltas),
                               status=Status.FAIL if reason else Status.PASS, reason=reason, watched_ops=grew_watched,
                               input_processing=fn in host, moved_calls=moved,
                               moved_from=_donors(moved_ops, judged_base, judged_got) if moved else (),
                               gpu_costs=priced))
    out.sort(key=_check_order)
    return out


def _check_order(c: CensusCheck):
    return (c.status != Status.FAIL, -c.growth_calls, c.function, c.image_size, c.mix or "")



# ----------------------------------------------------------------------------- judging a run
NO_BASELINE = "no census baseline"  # its text; update-thresholds writes a baseline past its kind, CENSUS_BASELINE


@dataclass(frozen=True)
class CensusJudgement:
    """The census of one run against its baseline: every differing function, and why the
    comparison could not be made (``invalid``: the run cannot be judged)."""

    checks: tuple[CensusCheck, ...] = ()
    invalid: tuple[InvalidReason, ...] = ()
    functions: int = 0  # (function, image size or mix) pairs judged
    not_judged: tuple[str, ...] = ()  # what was counted and could not be judged (a decode census without a baseline)

    @property
    def failed(self) -> tuple[CensusCheck, ...]:
        return tuple(c for c in self.checks if c.status == Status.FAIL)


def judge(rule: CensusRule, baseline: Baseline | None, measured: Census,
          sizes: Iterable[tuple[int, int]], *, model: str, profile: str, update_command: str,
          decode: Mapping[str, DecodeCensus] | None = None, mixes: Sequence[RequestMix] = (),
          costs: CostTable | None = None) -> CensusJudgement:
    """Compare every profiled image size's census with the baseline, each change priced by ``costs``
    (guard's shipped constants unless given), then each request mix's decode steps (``decode``,
    ``mixes``: judge_decode; not priced: a price is per request, a decode change per step). Pure,
    but for reading those constants once."""
    sizes = list(sizes)
    prefill = judge_prefill(rule, baseline, measured, sizes, model=model, profile=profile, update_command=update_command,
                            costs=costs)
    if baseline is None or prefill.invalid or not mixes:
        return prefill
    steps = judge_decode(rule, baseline.decode, decode or {}, mixes, sizes[0], where=str(baseline.path),
                         update_command=update_command)
    return CensusJudgement(checks=tuple(sorted(prefill.checks + steps.checks, key=_check_order)), invalid=steps.invalid,
                           functions=prefill.functions + steps.functions, not_judged=steps.not_judged)


def judge_decode(rule: CensusRule, baseline: Mapping[str, DecodeCensus], measured: Mapping[str, DecodeCensus],
                 mixes: Sequence[RequestMix], image_size: tuple[int, int], *, where: str,
                 update_command: str) -> CensusJudgement:
    """Each mix's decode census against its baseline, by the same rule as a prefill's, in one unit
    (per step where both sides' steps were alike, else over all steps). A mix the baseline does not
    have, or counted over another number of steps, is counted and shown, not judged: a new mix has
    no baseline yet, and a float32 or AMX census file written before decode steps were counted
    has none either. A run that measured no decode census at all (recorded by an older guard) is
    said so; one that lost some of its mixes is invalid."""
    missing = ReasonKind.CENSUS_MISSING
    if not measured:
        return CensusJudgement(not_judged=("decode census: not measured in this run (recorded before guard counted "
                                           "decode steps)",))
    invalid, not_judged, checks, judged = [], [], [], 0
    for mix in mixes:
        got = measured.get(mix.name)
        if got is None or not got.steps or not got.census:
            why = "was measured" if got is None else "was counted under the roots"
            invalid.append(InvalidReason(missing, f"census: no decode step of request mix {mix.name} {why}"))
            continue
        base = baseline.get(mix.name)
        pair = comparable(base, got) if base is not None else None
        if pair is None:
            why = ("no baseline yet" if base is None else
                   f"the baseline counted {base.steps} decode steps, this run {got.steps} (its output length changed)")
            not_judged.append(f"decode census [{mix.name}]: {why} in {where}: counted, not judged; write it with "
                              f"`{update_command}`")
            continue
        b, m = folded(pair[0]), folded(pair[1])
        judged += len((set(b) | set(m)) - set(rule.exclude))
        unit = "per step" if base.per_step and got.per_step else f"over {got.steps} steps"
        checks += [replace(c, mix=mix.name, unit=unit)
                   for c in compare(rule, image_size if mix.images else (0, 0), without(b, rule.exclude), m)]
    return CensusJudgement(checks=tuple(sorted(checks, key=_check_order)), invalid=tuple(invalid), functions=judged,
                           not_judged=tuple(not_judged))


def judge_prefill(rule: CensusRule, baseline: Baseline | None, measured: Census, sizes: Sequence[tuple[int, int]], *,
                  model: str, profile: str, update_command: str, costs: CostTable | None = None) -> CensusJudgement:
    """Compare every profiled image size's census with the baseline, each change priced by ``costs``."""
    invalid: list[InvalidReason] = []
    missing, stale = ReasonKind.CENSUS_MISSING, ReasonKind.CENSUS_BASELINE_MISMATCH
    sizes = [size(s) for s in sizes]
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
    costs, on_gpu = (costs or shipped_costs()), counted_on_gpu(measured)
    for s in sizes:
        judged += len((set(folded(measured[s])) | set(folded(baseline.census[s]))) - set(rule.exclude))
        checks += compare(rule, parse_size(s), without(folded(baseline.census[s]), rule.exclude), folded(measured[s]),
                          costs=costs, on_gpu=on_gpu)
    checks.sort(key=_check_order)
    return CensusJudgement(checks=tuple(checks), functions=judged)
