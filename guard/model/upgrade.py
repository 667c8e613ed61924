"""A version 2 results.json or run.json, read as version 3 (``guard.model.jsonfiles.read_json``
upgrades it before the schema check): its invalid reasons were strings and are given their kinds."""

from __future__ import annotations

import re
from typing import Any

from guard.model.records import InvalidReason, ReasonKind
from guard.model.schema import RESULTS_SCHEMA, RESULTS_SCHEMA_VERSION

# A version 2 file's reasons are strings: each is given the kind its producer names today, by the
# text it begins with (or holds, for "census: ..."); the only place guard still reads reason text.
_V2_KINDS: tuple[tuple[str, ReasonKind], ...] = (
    ("engine ", ReasonKind.ENGINE), ("vllm serve ", ReasonKind.ENGINE), ("baseline worker", ReasonKind.ENGINE),
    ("candidate worker", ReasonKind.ENGINE),
    ("the perf suite ", ReasonKind.CRASH),
    ("the run did not finish", ReasonKind.UNFINISHED),
    ("perf test ", ReasonKind.TEST_FAILED),
    ("request ", ReasonKind.REQUEST_FAILED), ("warm-up request ", ReasonKind.REQUEST_FAILED),
    ("... and ", ReasonKind.REQUEST_FAILED),
    ("no TTFT samples", ReasonKind.TOO_FEW_SAMPLES), ("too few ", ReasonKind.TOO_FEW_SAMPLES),
    ("no A/B pairs", ReasonKind.TOO_FEW_SAMPLES),
    ("hardware d", ReasonKind.HARDWARE_MISMATCH),
    ("another process was using the GPU", ReasonKind.GPU_STATE), ("GPU clocks were throttled", ReasonKind.GPU_STATE),
    ("busy machine:", ReasonKind.BUSY_MACHINE), ("slow machine:", ReasonKind.SLOW_MACHINE),
    ("op-count scope ", ReasonKind.SCOPE_NEVER_ENTERED),  # refined below: "budgeted but not measured"
    ("op budget ", ReasonKind.VACUOUS_BUDGET),
    ("census: no census baseline", ReasonKind.CENSUS_BASELINE),
    ("census: baseline ", ReasonKind.CENSUS_BASELINE_MISMATCH),
    ("census: ", ReasonKind.CENSUS_MISSING),
)


def classify_v2_reason(text: str) -> InvalidReason:
    bare = text.removeprefix("baseline: ")  # A/B: the baseline side's own reason
    kind = next((k for prefix, k in _V2_KINDS if bare.startswith(prefix)), ReasonKind.UNKNOWN)
    if kind == ReasonKind.SCOPE_NEVER_ENTERED and bare.endswith("was budgeted but not measured"):
        kind = ReasonKind.SCOPE_NOT_MEASURED
    elif kind == ReasonKind.REQUEST_FAILED and " failed" not in bare:
        kind = ReasonKind.UNKNOWN
    elif kind == ReasonKind.UNKNOWN and bare.endswith(": the run was stopped before it finished"):
        kind = ReasonKind.INTERRUPTED  # "<how it was stopped>: ..."
    elif kind == ReasonKind.UNKNOWN and re.match(r"\d+ request\(s\) failed during ", bare):
        kind = ReasonKind.REQUEST_FAILED  # server mode
    return InvalidReason(kind, text)


def upgrade_v2(data: dict[str, Any], schema_name: str) -> dict[str, Any]:
    """A version 2 results.json or run.json as version 3: its reasons typed, nothing else differs."""
    def run(r: Any) -> Any:
        if not isinstance(r, dict) or not isinstance(r.get("invalid_reasons"), list):
            return r  # validation names what is wrong
        return {**r, "invalid_reasons": [classify_v2_reason(x).as_dict() if isinstance(x, str) else x
                                         for x in r["invalid_reasons"]]}

    out = {**data, "schema_version": RESULTS_SCHEMA_VERSION, "run": run(data.get("run"))}
    if schema_name == RESULTS_SCHEMA:
        if isinstance(data.get("judged_invalid_reasons"), list):
            out["judged_invalid_reasons"] = [classify_v2_reason(x).as_dict() if isinstance(x, str) else x
                                             for x in data["judged_invalid_reasons"]]
        if isinstance(data.get("ab"), dict):
            out["ab"] = {**data["ab"], "baseline": run(data["ab"].get("baseline"))}
    return out
