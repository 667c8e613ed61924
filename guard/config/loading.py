"""Loading a budget file: YAML -> validated, immutable budget records (guard.config.budgets).

The only reader of a budget file's YAML. The format is guard.config.schema's tables, read node by
node (guard.config.yamlread) so every error names the file, the line and the offending key
(``ConfigError``, exit 2); what ties a profile's budgets to its engine and statistics is checked
here, once the sections are read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from guard.config.budgets import (
    DEFAULT_THRESHOLDS, SCHEMA_VERSION, Profile, Statistics, Thresholds, Workload, min_samples_for_upper_bound,
)
from guard.config.schema import BUDGETS, MODE_BUDGETS, PROFILE, TOP
from guard.config.yamlread import Fields, YamlReader, compose
from guard.errors import ConfigError
from guard.files import read_input
from guard.model.records import TOKEN_METRICS


def load_thresholds(path: str | Path, text: str | None = None, *, require_decidable: bool = True) -> Thresholds:
    """Load and validate a thresholds file; ``text``: its content, already read (``path`` then
    only names it in errors, e.g. the pull request's version of the file read through the API).
    ``require_decidable=False`` admits TTFT budgets no run within the cap can decide: only for
    guard's pinned decision-rule test data, which predates the rule and exercises the runtime's
    point-estimate fallback."""
    if isinstance(path, str) and not path.strip():  # Path("") would name the working directory
        raise ConfigError("(empty path)", None, "(file)", "the thresholds path is empty",
                          hint=f"pass --thresholds PATH, e.g. {DEFAULT_THRESHOLDS}")
    path = packaged_default(Path(path))
    r = YamlReader(path)
    r.require_decidable = require_decidable
    root = compose(path, _read(path) if text is None else text, "thresholds file")
    top = r.fields(root, "", TOP.keys)
    if top["schema_version"] != SCHEMA_VERSION:
        raise r.error(top.nodes["schema_version"][1], "schema_version",
                      f"unsupported schema version {top['schema_version']}; this guard reads version {SCHEMA_VERSION}")
    profiles = {name: _profile(r, f"profiles.{name}", name, vnode)
                for name, (_, vnode) in r.mapping(top["profiles"], "profiles", None).items()}
    if not profiles:
        raise r.error(top["profiles"], "profiles", "at least one hardware profile is required")
    return Thresholds(path=path, schema_version=top["schema_version"], model=top["model"], profiles=profiles)


def _read(path: Path) -> bytes:
    try:
        return read_input(path)
    except FileNotFoundError:
        raise ConfigError(str(path), None, "(file)", "no such thresholds file",
                          hint=f"pass --thresholds PATH, e.g. {DEFAULT_THRESHOLDS}") from None
    except OSError as exc:
        raise ConfigError(str(path), None, "(file)", f"cannot read: {exc.strerror or exc}") from None


def _profile(r: YamlReader, key: str, name: str, node: yaml.Node) -> Profile:
    """One hardware profile: its sections by the schema, then what ties its budgets to its engine
    and statistics."""
    p = r.fields(node, key, PROFILE.keys)
    bkey = f"{key}.budgets"
    b = r.fields(p["budgets"], bkey, BUDGETS.keys)
    if not any(b[k] for k in ("ttft_ms", "tpot_ms", "itl_ms", "ops", "ttft_vs_baseline_pct", "tpot_vs_baseline_pct", "census")):
        raise r.error(b.node, bkey, "no budgets: give ttft_ms, tpot_ms, itl_ms, ttft_vs_baseline_pct, "
                      "tpot_vs_baseline_pct, ops and/or census")
    engine, statistics = p["engine"], p["statistics"]
    if engine.mode in b["modes"]:
        knode = r.mapping(b.nodes["modes"][1], f"{bkey}.modes", None)[engine.mode][0]
        raise r.error(knode, f"{bkey}.modes.{engine.mode}",
                      f"'{engine.mode}' is this profile's engine.mode: its budgets are budgets.ttft_ms")
    for where, per_request_node in _per_request_nodes(r, bkey, b):
        _check_decidable(r, where, per_request_node, statistics)
    _check_token_budgets_measurable(r, bkey, b, p["workload"])
    if "ttft_hardware" in b and not b["ttft_ms"]:
        raise r.error(b.nodes["ttft_hardware"][1], f"{bkey}.ttft_hardware", "binds TTFT budgets to a CPU, but there are none",
                      hint="add budgets.ttft_ms or remove ttft_hardware")
    workload = p["workload"]
    if b["census"] is None:  # the decode census is judged by the census rule: no mixes without one
        mixes = r.mapping(p.nodes["workload"][1], f"{key}.workload", None).get("profile_mixes")
        if mixes is not None:
            raise r.error(mixes[0], f"{key}.workload.profile_mixes", "only meaningful with budgets.census (the decode "
                          "census is judged by its rule)", hint="add a census rule or remove profile_mixes")
        workload = replace(workload, profile_mixes=())
    return Profile(
        name=name, match=p["match"], engine=engine, workload=workload, statistics=statistics,
        headroom_pct=p["headroom_pct"], ttft_ms=b["ttft_ms"], ops=b["ops"], census=b["census"],
        line=node.start_mark.line + 1, provenance=p["provenance"],
        ttft_ms_by_mode={mode: m["ttft_ms"] for mode, m in b["modes"].items()},
        token_ms=_token_budgets(b), token_ms_by_mode={mode: t for mode, m in b["modes"].items() if (t := _token_budgets(m))},
        thresholds_path=str(r.path), yaml_mode=engine.mode, ttft_vs_baseline_pct=b["ttft_vs_baseline_pct"],
        tpot_vs_baseline_pct=b["tpot_vs_baseline_pct"],
        ab=p["ab"], ttft_hardware=b["ttft_hardware"], validity=p["validity"],
    )


def _token_budgets(fields: Fields | Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """``tpot_ms`` and ``itl_ms`` of a budgets section (or of one mode's) as ``Profile.token_ms``."""
    return {m: fields[f"{m}_ms"] for m in TOKEN_METRICS if fields[f"{m}_ms"]}


def _latency_nodes(r: YamlReader, bkey: str, b: Fields, keys: tuple[str, ...]) -> list[tuple[str, yaml.Node]]:
    """Where each absolute latency budget of ``keys`` sits: ``budgets.<key>`` and every ``modes.<mode>.<key>``."""
    out = [(f"{bkey}.{k}", b.nodes[k][1]) for k in keys if k in b]
    if "modes" in b:
        for mode, (_, vnode) in r.mapping(b.nodes["modes"][1], f"{bkey}.modes", None).items():
            nodes = r.mapping(vnode, f"{bkey}.modes.{mode}", MODE_BUDGETS.keys)
            out += [(f"{bkey}.modes.{mode}.{k}", nodes[k][1]) for k in keys if k in nodes]
    return out


def _per_request_nodes(r: YamlReader, bkey: str, b: Fields) -> list[tuple[str, yaml.Node]]:
    """The budgets judged on one sample per request (TTFT, TPOT), which the request cap must decide.
    ITL's samples are every request's gaps, many per request: no cap on requests bounds them."""
    return _latency_nodes(r, bkey, b, ("ttft_ms", "tpot_ms"))


def _check_token_budgets_measurable(r: YamlReader, bkey: str, b: Fields, workload: Workload) -> None:
    """TPOT and ITL need a request's second token: a budget over one-token requests could never be
    judged."""
    given = _latency_nodes(r, bkey, b, (*(f"{m}_ms" for m in TOKEN_METRICS), "tpot_vs_baseline_pct"))
    if workload.max_tokens >= 2 or not given:
        return
    where, node = given[0]
    raise r.error(node, where, f"needs at least 2 output tokens per request, but workload.max_tokens is "
                  f"{workload.max_tokens}: there is no time between tokens to judge",
                  hint="set workload.max_tokens to 2 or more (16 gives each request 15 gaps)")


def _check_decidable(r: YamlReader, key: str, node: yaml.Node, statistics: Statistics) -> None:
    """Refuse a TTFT percentile budget that no run within ``statistics.max_requests`` can decide.

    Below ``min_samples_for_upper_bound`` samples a percentile's distribution-free interval has no
    upper end, so the budget could never be shown to hold: every run would end at the cap on the
    point estimate (p99 at 95 % needs 368 requests). Without ``max_requests`` nothing is capped
    and the run's own request count decides (guard.judge.rules explains it then, in the verdict).
    ``ttft_vs_baseline_pct`` is not checked here: A/B judges the per-pair ratio's median with
    ``ab`` statistics, whose interval exists from a handful of pairs."""
    if statistics.max_requests is None or not r.require_decidable:
        return
    for name, (knode, _) in r.mapping(node, key, None).items():
        need = min_samples_for_upper_bound(name, statistics.confidence)
        if need > statistics.max_requests:
            raise r.error(knode, f"{key}.{name}",
                          f"cannot be decided within statistics.max_requests {statistics.max_requests}: an upper bound "
                          f"for {name} at {statistics.confidence:g} confidence needs >= {need} samples",
                          hint=f"raise statistics.max_requests to {need} or more, or drop the {name} budget "
                               "(it is still measured and reported)")


def packaged_default(path: Path) -> Path:
    """The default thresholds path, when the working directory has no ``thresholds/`` (guard run
    outside a checkout): the copy the wheel carries in guard/_thresholds, else the checkout guard is
    installed from (as ``--model`` finds it)."""
    if path == Path(DEFAULT_THRESHOLDS) and not path.exists():
        for candidate in (Path(__file__).parents[1] / "_thresholds" / path.name,
                          Path(__file__).resolve().parents[2] / DEFAULT_THRESHOLDS):
            if candidate.is_file():
                return candidate
    return path
