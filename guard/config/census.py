"""The census baseline file (``*.census.json``), the budgets file's companion: read, written, planned.

It holds one census per profiled image size, one line per function, sorted, so a review diff
shows exactly the functions that changed. ``guard update-thresholds`` writes it (``plan_census``:
decreases accepted, growth only with ``--allow-increase``); ``guard check`` and ``guard comment``
read it (``read_baseline``) and judge a run against it (guard.judge.census).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guard.config.budgets import CensusRule
from guard.errors import ConfigError
from guard.files import read_input
from guard.model.readings import (Census, DecodeCensus, FunctionCounts, comparable, counts_only, folded, op_deltas, parse_size, size,
                                  total_calls, without)
from guard.model.strictjson import first_refused, parse_strict_json

CENSUS_SCHEMA = "guard/census"
CENSUS_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Baseline:
    path: Path
    model: str
    profile: str
    roots: tuple[str, ...]
    census: Census  # "WxH" -> function -> op -> calls
    provenance: Mapping[str, Any] = field(default_factory=dict)
    excluded: Mapping[str, str] = field(default_factory=dict)  # as stated when it was written
    decode: Mapping[str, DecodeCensus] = field(default_factory=dict)  # request mix -> its decode steps' census


def _function_lines(fns: FunctionCounts, indent: str) -> list[str]:
    dump = lambda v: json.dumps(v, sort_keys=True, ensure_ascii=False)  # noqa: E731
    items = sorted(fns.items())
    return [f"{indent}{dump(fn)}: {dump(ops)}{',' if i < len(items) - 1 else ''}" for i, (fn, ops) in enumerate(items)]


def _decode_lines(decode: Mapping[str, DecodeCensus]) -> list[str]:
    """``"decode": {mix: {"steps", "per_step", "census": {function: ops}}}``, one line per function."""
    lines = ['  "decode": {']
    mixes = sorted(decode)
    for mi, mix in enumerate(mixes):
        d = decode[mix]
        lines.append(f'    {json.dumps(mix)}: {{"steps": {d.steps}, "per_step": {json.dumps(d.per_step)}, "census": {{')
        lines += _function_lines(d.census, "      ")
        lines.append("    }}" + ("," if mi < len(mixes) - 1 else ""))
    return lines + ["  }"]


def render_baseline(model: str, profile: str, roots: tuple[str, ...], census: Census,
                    provenance: Mapping[str, Any], excluded: Mapping[str, str],
                    decode: Mapping[str, DecodeCensus] | None = None) -> str:
    """JSON with one line per function, sorted: a review diff names exactly the functions that moved.
    ``decode`` (the request mixes' decode steps) is written only when there is one, so a file
    without it reads as before."""
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
    sizes = sorted(census, key=parse_size)
    for si, wxh in enumerate(sizes):
        lines.append(f"    {dump(wxh)}: {{")
        lines += _function_lines(census[wxh], "      ")
        lines.append("    }" + ("," if si < len(sizes) - 1 else ""))
    lines += ["  }" + ("," if decode else "")] + (_decode_lines(decode) if decode else []) + ["}"]
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
        text = read_input(path).decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(str(path), None, "(file)", "no such census baseline",
                          hint="write it with `guard check` then `guard update-thresholds --from "
                               "guard-results/results.json`") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), None, "(file)", f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None

    def bad(key: str, problem: str) -> ConfigError:
        needle = f'"{key.rsplit(".", 1)[-1]}"'
        line = next((i + 1 for i, t in enumerate(text.splitlines()) if needle in t), None)
        return ConfigError(str(path), line, key, problem)

    try:
        data = parse_strict_json(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(str(path), exc.lineno, "(syntax)", f"not valid JSON: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:
        raise ConfigError(str(path), None, "(content)", f"not a census baseline guard can read: {exc}") from None
    refused = first_refused(data)
    if refused is not None:
        where, problem = refused
        raise bad(".".join(map(str, where)) or "(content)", f"not a census baseline guard can read: {problem}")

    if not isinstance(data, dict) or data.get("schema") != CENSUS_SCHEMA:
        raise bad("schema", f"not a {CENSUS_SCHEMA} file")
    if data.get("schema_version") != CENSUS_SCHEMA_VERSION:
        raise bad("schema_version", f"unknown schema version {data.get('schema_version')!r}; "
                                    f"this guard reads {CENSUS_SCHEMA_VERSION}")
    for key, kind in (("model", str), ("profile", str), ("roots", list), ("census", dict),
                      ("provenance", dict), ("excluded", dict)):
        if not isinstance(data.get(key), kind):
            raise bad(key, f"expected {'a string' if kind is str else 'a list' if kind is list else 'a mapping'}")
    if not all(isinstance(r, str) and r for r in data["roots"]):
        raise bad("roots", "expected a list of folder names, e.g. [\"vllm\"]")
    if not all(isinstance(why, str) for why in data["excluded"].values()):
        raise bad("excluded", "expected {function: why it is left out}")
    census: Census = {}
    for wxh, fns in data["census"].items():
        parts = wxh.split("x")
        if len(parts) != 2 or not all(p.isdigit() and len(p) <= 6 for p in parts) or not isinstance(fns, dict):
            raise bad(f"census.{wxh}", "expected \"WxH\": {function: {op: calls}}")
        _check_functions(bad, f"census.{wxh}", fns)
        census[wxh] = {fn: dict(ops) for fn, ops in fns.items()}
    return Baseline(path=Path(path), model=data["model"], profile=data["profile"], roots=tuple(data["roots"]),
                    census=census, provenance=data["provenance"], excluded=data["excluded"],
                    decode=_read_decode(bad, data.get("decode", {})))


def _check_functions(bad, key: str, fns: Any) -> None:
    for fn, ops in fns.items():
        if not isinstance(ops, dict) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                                for n in ops.values()):
            raise bad(f"{key}.{fn}", "expected {op: calls} with calls a non-negative integer")


def _read_decode(bad, decode: Any) -> dict[str, DecodeCensus]:
    """The file's ``decode`` section (absent: {}), validated."""
    if not isinstance(decode, dict):
        raise bad("decode", "expected {mix: {\"steps\", \"per_step\", \"census\"}}")
    out = {}
    for mix, d in decode.items():
        shape = (isinstance(d, dict) and set(d) == {"steps", "per_step", "census"} and isinstance(d["steps"], int)
                 and not isinstance(d["steps"], bool) and d["steps"] > 0 and isinstance(d["per_step"], bool)
                 and isinstance(d["census"], dict))
        if not shape:
            raise bad(f"decode.{mix}", "expected {\"steps\": N > 0, \"per_step\": true|false, \"census\": "
                                       "{function: {op: calls}}}")
        _check_functions(bad, f"decode.{mix}.census", d["census"])
        out[mix] = DecodeCensus.from_dict(d)
    return out



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


def _moves(label: str, before: FunctionCounts, after: FunctionCounts, ups: list[tuple[int, str]], downs: list[str]) -> None:
    """Each function that differs, as a line: into ``ups`` when any op grew, else ``downs``."""
    for fn in sorted(set(before) | set(after)):
        b, m = before.get(fn, {}), after.get(fn, {})
        if b == m:
            continue
        deltas = op_deltas(b, m)
        line = (f"{label} {fn}: {total_calls(b) if fn in before else 'new'} -> {total_calls(m)} op calls ("
                + ", ".join(f"{d:+d} {op}" for op, d in deltas[:4]) + (", ..." if len(deltas) > 4 else "") + ")")
        if any(d > 0 for _, d in deltas):
            ups.append((total_calls(m) - total_calls(b), line))
        else:
            downs.append(line)


def _planned_decode(profile, run_decode: Mapping[str, DecodeCensus], old: Baseline | None) -> dict[str, DecodeCensus]:
    """The decode census to write: each of the profile's mixes as this run counted it (excluded
    functions left out), else as the old file has it."""
    rule: CensusRule = profile.census
    out = {}
    for mix in profile.workload.profile_mixes:
        got = run_decode.get(mix.name)
        if got is not None:
            out[mix.name] = DecodeCensus(got.steps, got.per_step, counts_only(without(folded(got.census), rule.exclude)))
        elif old is not None and mix.name in old.decode:
            out[mix.name] = old.decode[mix.name]
    return out


def plan_census(profile, model: str, run_census: Census, *, provenance: Mapping[str, Any],
                allow_increase: bool, results_path: Path,
                run_decode: Mapping[str, DecodeCensus] | None = None) -> CensusPlan:
    """The baseline this run's census gives (excluded functions left out), with the request mixes'
    decode census (``run_decode``). Decreases are always accepted; any function whose op calls grew,
    or a new one, needs ``allow_increase``."""
    from guard.errors import UsageError

    rule: CensusRule = profile.census
    sizes = [size(s) for s in profile.workload.profile_image_sizes]
    missing = [s for s in sizes if not run_census.get(s)]
    if missing:
        raise ConfigError(str(results_path), None, "run.census",
                          f"this run has no census for {', '.join(missing)}",
                          hint=f"run `guard check --profile {profile.name}` with the census rule in place")
    census = {s: counts_only(without(folded(run_census[s]), rule.exclude)) for s in sizes}  # a baseline holds counts
    old: Baseline | None = load_baseline(rule.baseline) if rule.baseline.exists() else None
    old_text = rule.baseline.read_text(encoding="utf-8") if old is not None else None
    decode = _planned_decode(profile, run_decode or {}, old)
    ups: list[tuple[int, str]] = []
    downs: list[str] = []
    if old is not None:
        for s in sizes:
            _moves(s, old.census.get(s, {}), census[s], ups, downs)
        for mix, d in decode.items():
            # a mix the file does not hold yet is its first baseline; None: another output length, nothing to compare
            pair = comparable(old.decode[mix], d) if mix in old.decode else None
            if pair is not None:
                _moves(f"decode {mix}", pair[0], pair[1], ups, downs)
    increases = tuple(line for _, line in sorted(ups, key=lambda x: -x[0]))
    if increases and not allow_increase:
        shown = "; ".join(increases[:5]) + (f"; ... {len(increases) - 5} more" if len(increases) > 5 else "")
        raise UsageError(f"refusing to raise the census of {len(increases)} function(s): {shown}. More operator "
                         "calls per request is the regression the census exists to catch",
                         hint="if the new calls are intended, re-run with --allow-increase and say why in the pull request")
    unchanged = (old is not None and {s: old.census.get(s) for s in sizes} == census and dict(old.decode) == decode
                 and tuple(old.roots) == tuple(rule.roots) and dict(old.excluded) == dict(rule.exclude))
    new_text = old_text if unchanged else render_baseline(model, profile.name, rule.roots, census, provenance,
                                                          rule.exclude, decode)
    return CensusPlan(path=rule.baseline, old_text=old_text, new_text=new_text,
                      functions=sum(len(c) for c in census.values()) + sum(len(d.census) for d in decode.values()),
                      decreases=tuple(downs), increases=increases)


def write_census_atomic(path: Path, text: str) -> None:
    """The baseline, atomically (guard.files), never in a form that guard itself would reject."""
    from guard.files import write_text_atomic

    write_text_atomic(path, text, check=load_baseline)
