"""No vacuous op budget: every budgeted op name must be something the profiler can record.

A misspelt name counts 0 forever and passes forever. So, before the engine starts, each name in
``budgets.ops.<scope>.ops`` is checked (``check_op_names``):

- guard's pseudo-ops ``cuda::memcpy_htod`` and ``cuda::sync`` are known names, on profiles that
  need a CUDA device only (on a CPU profile they can never count anything);
- every other name must be a registered operator of the torch dispatcher (``ns::name``, no
  overload suffix), vLLM's compiled ops included; unknown names get close matches;
- ``total_ops`` is not an op: it sits beside ``ops:`` in the scope.

A registered name can still be the wrong one: ``aten::_index_put_impl`` (functional) is
registered, but eager code calls ``aten::_index_put_impl_``. ``vacuous_budgets`` catches that
after the run: a budgeted op that counted 0 while its in-place/functional twin was recorded in
the same scope makes the run invalid, naming the twin.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from guard.config.budgets import Profile, Thresholds
from guard.errors import ConfigError, UsageError
from guard.model import format as fmt
from guard.model.readings import CUDA_SYNC, MEMCPY_HTOD
from guard.model.records import TOTAL_OPS, ScopeCounts

PSEUDO_OPS = frozenset({MEMCPY_HTOD, CUDA_SYNC})


def problems(profile: Profile, registry: frozenset[str]) -> list[tuple[str, int | None, str, str]]:
    """(key, line, problem, hint) for each budgeted op name that cannot be recorded on this profile."""
    out = []
    for sb in profile.ops:
        for op, budget in sb.ops.items():
            key = f"profiles.{profile.name}.budgets.ops.{sb.name}.ops.{op}"
            if op == TOTAL_OPS:
                out.append((key, budget.line, "`total_ops` is not an operator",
                            f"put `total_ops: {{{budget.rule}: {budget.count}}}` beside `ops:` in scope '{sb.name}'"))
            elif op in PSEUDO_OPS:
                if not profile.match.cuda:
                    out.append((key, budget.line, f"{op} is counted from CUDA activity; on a profile without "
                                "CUDA it is always 0, so this budget can never fail",
                                "budget it on a `cuda: true` profile only"))
            elif op not in registry:
                close = difflib.get_close_matches(op, sorted(registry | PSEUDO_OPS), n=3, cutoff=0.75)
                hint = (f"did you mean {', '.join(f'`{c}`' for c in close)}?" if close else
                        "op names are the profiler's: `namespace::name` without overload, e.g. aten::_index_put_impl_")
                out.append((key, budget.line, "not a registered operator: it would count 0 and pass forever", hint))
    return out


def needs_vllm_ops(profile: Profile, registry: frozenset[str]) -> bool:
    """Whether some name's namespace is absent from the registry (vLLM's libraries not loaded yet)."""
    namespaces = {n.split("::", 1)[0] for n in registry}
    return any("::" in op and op.split("::", 1)[0] not in namespaces and op not in PSEUDO_OPS
               for sb in profile.ops for op in sb.ops)


def check_op_name(op: str, flag: str, registry_loader=None) -> None:
    """UsageError (exit 2) when ``op``, named on the command line, is not an operator the profiler
    can record: a search for its changes would run every commit and find none."""
    if registry_loader is None:
        from guard.compat import registered_op_names as registry_loader
    registry = registry_loader(load_vllm_ops=False)
    if "::" in op and op.split("::", 1)[0] not in {n.split("::", 1)[0] for n in registry}:
        registry = registry_loader(load_vllm_ops=True)
    if op not in registry and op not in PSEUDO_OPS:
        close = difflib.get_close_matches(op, sorted(registry | PSEUDO_OPS), n=3, cutoff=0.75)
        raise UsageError(f"{flag} {op!r}: not a registered operator, so no commit could change its count",
                         hint=f"did you mean {', '.join(f'`{c}`' for c in close)}?" if close else
                         "op names are the profiler's: `namespace::name` without overload, e.g. aten::_index_put_impl_")


def check_op_names(thresholds: Thresholds, profile: Profile, registry_loader=None) -> None:
    """Raise ConfigError (exit 2, file:line:key) for the first unrecordable op name of ``profile``."""
    if not any(sb.ops for sb in profile.ops):
        return
    if registry_loader is None:
        from guard.compat import registered_op_names as registry_loader
    registry = registry_loader(load_vllm_ops=False)
    if needs_vllm_ops(profile, registry):
        registry = registry_loader(load_vllm_ops=True)
    found = problems(profile, registry)
    if found:
        key, line, problem, hint = found[0]
        more = f" (and {len(found) - 1} more: {', '.join(k.rsplit('.ops.', 1)[-1] for k, *_ in found[1:])})" if len(found) > 1 else ""
        raise ConfigError(str(thresholds.path), line, key, problem + more, hint=hint)


def _twins(op: str) -> Iterable[str]:
    """The in-place / functional variants of an op name: x <-> x_."""
    yield op[:-1] if op.endswith("_") else op + "_"


def vacuous_budgets(profile: Profile, op_counts: list[ScopeCounts]) -> list[str]:
    """Invalid-run reasons: a budgeted op counted 0 where its twin variant was called."""
    out = []
    by_scope: dict[str, list[ScopeCounts]] = {}
    for c in op_counts:
        by_scope.setdefault(c.scope, []).append(c)
    for sb in profile.ops:
        for op in sb.ops:
            if op in PSEUDO_OPS:
                continue
            for c in by_scope.get(sb.name, []):
                if c.calls_by_op.get(op, 0):
                    continue
                for twin in _twins(op):
                    n = c.calls_by_op.get(twin, 0)
                    if n:
                        size = fmt.size(c.image_size)
                        out.append(f"op budget {sb.name}.{op} counted 0 calls, but {twin} was called {n} times in "
                                   f"the same scope [{size}]: the budget names the wrong variant and can never fail; "
                                   f"budget {twin} instead")
                        break
    return list(dict.fromkeys(out))
