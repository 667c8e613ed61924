"""results.json, run.json and ab-run.json, the records' file form: each record as a JSON object and back,
written atomically as strict JSON, and read back checked (strict JSON, the schema header and version,
a version 2 file upgraded, then the JSON Schema), every problem a ConfigError naming the file and
the field (exit 2)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from guard.errors import ConfigError
from guard.files import read_input
from guard.model.records import TOKEN_METRICS, TPOT, TTFT, TTFT_DEFINITION, ABRecord, InvalidReason, Measures, OpSite, RequestOutcome, Rule, RunRecord, ScopeCounts, Status, Verdict
from guard.model.results import BudgetSource, FunctionChange, PullRequestDiff, Results, RevisionInfo
from guard.model.checks import (ABComparison, CensusCheck, CensusOpDelta, CostStatus, GpuCost, OpCheck, OpClass, OpDelta, Pair,
                                PricedClass, LatencyCheck, RatioCheck, UnmeasuredOpCheck)
from guard.model.schema import AB_RUN_SCHEMA, READABLE_SCHEMA_VERSIONS, RESULTS_SCHEMA, RESULTS_SCHEMA_VERSION, RUN_SCHEMA, validate
from guard.model.strictjson import first_refused, json_path, parse_strict_json
from guard.model.upgrade import upgrade_v2


def _finite_or_null(x: float) -> float | None:
    """Strict JSON has no Infinity: an interval side that does not exist is written as null."""
    return None if math.isinf(x) else x


def run_to_dict(run: RunRecord) -> dict[str, Any]:
    return {**asdict(run), "environment": run.environment.as_dict(),
            "invalid_reasons": [r.as_dict() for r in run.invalid_reasons]}


def run_file_dict(run: RunRecord) -> dict[str, Any]:
    """run.json: the run record under a schema header."""
    return {"schema": RUN_SCHEMA, "schema_version": RESULTS_SCHEMA_VERSION, "run": run_to_dict(run)}


def ab_run_file_dict(rec: ABRecord) -> dict[str, Any]:
    """ab-run.json: both sides' run records, the baseline's python and the block order."""
    return {"schema": AB_RUN_SCHEMA, "schema_version": RESULTS_SCHEMA_VERSION, "candidate": run_to_dict(rec.candidate),
            "baseline": run_to_dict(rec.baseline), "baseline_python": rec.baseline_python, "order": list(rec.order),
            "duration_s": rec.duration_s}


def outcome_from_dict(d: dict[str, Any]) -> RequestOutcome:
    return RequestOutcome(**{**d, "image_size": tuple(d["image_size"])})


def scope_counts_from_dict(d: dict[str, Any]) -> ScopeCounts:
    """One scope's counts as run.json, a worker's message and the op-count cache store them."""
    return ScopeCounts(**{**d, "image_size": tuple(d["image_size"]), "sites": tuple(OpSite(**s) for s in d.get("sites", ()))})


def run_from_dict(d: dict[str, Any]) -> RunRecord:
    d = dict(d)
    if d.get("measures") is None:  # written before the field: an ops-only run timed no request
        d["measures"] = Measures.BOTH if any(not o.get("warmup") for o in d.get("outcomes", [])) else Measures.OPS
    d["invalid_reasons"] = [InvalidReason.from_dict(r) for r in d.get("invalid_reasons", [])]
    d["outcomes"] = [outcome_from_dict(o) for o in d.get("outcomes", [])]
    d["op_counts"] = [scope_counts_from_dict(c) for c in d.get("op_counts", [])]
    return RunRecord(**d)


def _latency_to_dict(c: LatencyCheck) -> dict[str, Any]:
    """Without its metric: the list it is written in (checks.ttft, checks.tpot, checks.itl) says it."""
    d = {**asdict(c), "interval_ms": [_finite_or_null(x) for x in c.interval_ms]}
    del d["metric"]
    return d


def _latency_from_dict(d: dict[str, Any], metric: str) -> LatencyCheck:
    lo, hi = d["interval_ms"]
    return LatencyCheck(**{**d, "status": Status(d["status"]), "metric": metric,
                           "interval_ms": (-math.inf if lo is None else lo, math.inf if hi is None else hi)})


def _token_checks_to_dict(checks: tuple[LatencyCheck, ...]) -> dict[str, Any]:
    """checks.tpot and checks.itl, written only where the run judged them (older readers never see them)."""
    return {m: [_latency_to_dict(c) for c in checks if c.metric == m] for m in TOKEN_METRICS
            if any(c.metric == m for c in checks)}


def _ratio_to_dict(c: RatioCheck) -> dict[str, Any]:
    """Without its metric: the list it is written in (checks.ttft_vs_baseline, checks.tpot_vs_baseline) says it."""
    d = {**asdict(c), "interval_pct": [_finite_or_null(x) for x in c.interval_pct]}
    del d["metric"]
    return d


def _ratio_from_dict(d: dict[str, Any], metric: str = TTFT) -> RatioCheck:
    lo, hi = d["interval_pct"]
    return RatioCheck(**{**d, "status": Status(d["status"]), "metric": metric,
                         "interval_pct": (-math.inf if lo is None else lo, math.inf if hi is None else hi)})


def _ab_to_dict(ab: ABComparison | None) -> dict[str, Any] | None:
    if ab is None:
        return None
    return {"baseline_python": ab.baseline_python, "baseline": run_to_dict(ab.baseline), "order": list(ab.order),
            "pairs": [asdict(p) for p in ab.pairs], "op_diff": [asdict(d) for d in ab.op_diff]}


def _ab_from_dict(d: dict[str, Any] | None) -> ABComparison | None:
    if d is None:
        return None
    return ABComparison(baseline_python=d["baseline_python"], baseline=run_from_dict(d["baseline"]),
                        order=tuple(d.get("order", ())), pairs=tuple(Pair(**p) for p in d.get("pairs", ())),
                        op_diff=tuple(OpDelta(**{**o, "image_size": tuple(o["image_size"])}) for o in d.get("op_diff", ())))


def _op_from_dict(d: dict[str, Any]) -> OpCheck:
    return OpCheck(**{**d, "image_size": tuple(d["image_size"]), "rule": Rule(d["rule"]), "status": Status(d["status"])})


def _gpu_cost_from_dict(d: dict[str, Any]) -> GpuCost:
    return GpuCost(gpu=d["gpu"], ms_per_request=d["ms_per_request"],
                   classes=tuple(PricedClass(OpClass(c["op_class"]), c["calls"], c["us_per_call"], CostStatus(c["status"]))
                                 for c in d["classes"]))


def _census_from_dict(d: dict[str, Any]) -> CensusCheck:
    return CensusCheck(**{**d, "image_size": tuple(d["image_size"]), "status": Status(d["status"]),
                          "op_deltas": tuple(CensusOpDelta(**o) for o in d["op_deltas"]),
                          "watched_ops": tuple(d.get("watched_ops", ())),
                          "moved_from": tuple(d.get("moved_from", ())),
                          # absent in files written before guard priced a change (guard.judge.pricing)
                          "gpu_costs": tuple(_gpu_cost_from_dict(g) for g in d.get("gpu_costs", ()))})


def results_to_dict(res: Results) -> dict[str, Any]:
    return {
        "schema": RESULTS_SCHEMA,
        "schema_version": RESULTS_SCHEMA_VERSION,
        "guard_version": res.guard_version,
        "verdict": str(res.verdict),
        "checks": {"ttft": [_latency_to_dict(c) for c in res.ttft_checks], **_token_checks_to_dict(res.token_checks),
                   "ops": [asdict(c) for c in res.op_checks],
                   "ops_not_measured": [asdict(c) for c in res.unmeasured_op_checks],
                   "ttft_vs_baseline": [_ratio_to_dict(c) for c in res.ab_checks if c.metric == TTFT],
                   **({"tpot_vs_baseline": [_ratio_to_dict(c) for c in res.ab_checks if c.metric == TPOT]}
                      if any(c.metric == TPOT for c in res.ab_checks) else {}),
                   "census": [asdict(c) for c in res.census_checks]},
        "ab": _ab_to_dict(res.ab),
        "judged_invalid_reasons": [r.as_dict() for r in res.judged_invalid_reasons],
        "notices": list(res.notices),
        "profile_config": res.profile_config,
        "ttft_definition": res.ttft_definition,
        "run": run_to_dict(res.run),
        **({"pr": _pr_to_dict(res.pr)} if res.pr is not None else {}),
    }


def _pr_to_dict(pr: PullRequestDiff) -> dict[str, Any]:
    d = asdict(pr)
    for side in ("base", "head"):  # not recorded (an older guard, an overlay side's count) is not written
        d[side] = {k: v for k, v in d[side].items() if not (k in ("version", "environment", "differs") and not v)}
    d["changed_files"], d["unmeasured_files"] = list(pr.changed_files), list(pr.unmeasured_files)
    d["function_changes"] = [{"function": f.function, "lines": [{"line": n, "text": t} for n, t in f.lines]}
                             for f in pr.function_changes]
    if pr.budgets is None:
        del d["budgets"]  # written only when the budgets came from the vLLM tree
    return d


def _pr_from_dict(d: dict[str, Any] | None) -> PullRequestDiff | None:
    if d is None:
        return None
    return PullRequestDiff(
        repository=d["repository"], base=RevisionInfo(**d["base"]), head=RevisionInfo(**d["head"]),
        changed_files=tuple(d["changed_files"]), unmeasured_files=tuple(d["unmeasured_files"]), measured=d["measured"],
        function_changes=tuple(FunctionChange(f["function"], tuple((x["line"], x["text"]) for x in f["lines"]))
                               for f in d["function_changes"]),
        budgets=None if d.get("budgets") is None else BudgetSource(**{
            k: tuple(v) if isinstance(v, list) else v for k, v in d["budgets"].items()}))


def results_from_dict(d: dict[str, Any]) -> Results:
    checks = d["checks"]
    return Results(
        verdict=Verdict(d["verdict"]),
        run=run_from_dict(d["run"]),
        ttft_checks=tuple(_latency_from_dict(c, TTFT) for c in checks.get("ttft", [])),
        token_checks=tuple(_latency_from_dict(c, m) for m in TOKEN_METRICS for c in checks.get(m, [])),
        op_checks=tuple(_op_from_dict(c) for c in checks.get("ops", [])),
        unmeasured_op_checks=tuple(UnmeasuredOpCheck(**{**c, "rule": Rule(c["rule"]), "status": Status(c["status"])})
                                   for c in checks.get("ops_not_measured", [])),
        ab_checks=tuple(_ratio_from_dict(c, m) for m in (TTFT, TPOT) for c in checks.get(f"{m}_vs_baseline", [])),
        ab=_ab_from_dict(d.get("ab")),
        census_checks=tuple(_census_from_dict(c) for c in checks.get("census", [])),
        judged_invalid_reasons=tuple(InvalidReason.from_dict(r) for r in d.get("judged_invalid_reasons", ())),
        notices=tuple(d.get("notices", ())),
        guard_version=d.get("guard_version", ""),
        ttft_definition=d.get("ttft_definition", TTFT_DEFINITION),
        profile_config=d.get("profile_config", {}),
        pr=_pr_from_dict(d.get("pr")),
    )


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Strict JSON (no NaN/Infinity), atomically (guard.files): a reader never sees half a file."""
    from guard.files import write_text_atomic

    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False, allow_nan=False) + "\n")


def read_json(path: Path, schema_name: str) -> dict[str, Any]:
    """Read a guard JSON file and validate it (ConfigError, exit 2)."""
    try:
        raw = read_input(path)
    except FileNotFoundError:
        raise ConfigError(str(path), None, "(file)", "no such file", hint="run `guard check` first") from None
    except OSError as exc:  # a folder, no permission, ...
        raise ConfigError(str(path), None, "(file)", f"cannot read: {exc.strerror or exc}") from None
    try:
        data = parse_strict_json(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(str(path), None, "(file)", "not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(str(path), exc.lineno, "(syntax)", f"not valid JSON: {exc.msg}") from None
    except RecursionError:
        raise ConfigError(str(path), None, "(content)", "nested too deeply to be a guard file") from None
    except ValueError as exc:
        raise ConfigError(str(path), None, "(content)", f"not a results file guard can read: {exc}") from None
    bad = first_refused(data)
    if bad is not None:
        where, problem = bad
        raise ConfigError(str(path), None, json_path(where), f"not a results file guard can read: {problem}",
                          hint="results files are written by `guard check`; re-run it rather than editing one")
    if not isinstance(data, dict) or data.get("schema") != schema_name:
        raise ConfigError(str(path), None, "schema", f"not a {schema_name} file")
    version = data.get("schema_version")
    if version not in READABLE_SCHEMA_VERSIONS:
        raise ConfigError(str(path), None, "schema_version",
                          f"schema version {version!r}; this guard reads versions "
                          f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS))}",
                          hint="results files from an older guard cannot be judged again: re-run `guard check`")
    if version == 2:
        data = upgrade_v2(data, schema_name)
    try:
        validate(data, path, schema_name)
    except RecursionError:
        raise ConfigError(str(path), None, "(content)", "nested too deeply to be a guard file") from None
    return data


def load_results(path: Path) -> Results:
    return results_from_dict(read_json(path, RESULTS_SCHEMA))


def load_run(path: Path) -> RunRecord:
    return run_from_dict(read_json(path, RUN_SCHEMA)["run"])


def load_ab_run(path: Path) -> ABRecord:
    d = read_json(path, AB_RUN_SCHEMA)
    return ABRecord(candidate=run_from_dict(d["candidate"]), baseline=run_from_dict(d["baseline"]),
                    baseline_python=d["baseline_python"], order=list(d["order"]), duration_s=d.get("duration_s"))
