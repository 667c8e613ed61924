"""The census rule's floors re-examined on recorded data (issue #58 item 2), without an engine.

The census fails a function that grows by more than ``max_growth_pct`` AND more than
``min_growth_calls`` (shipped: 2 %, 16), a new function above ``new_function_max_calls`` (8), and
any watched op that grew (no slack). This script re-judges every changed function that the recorded
release replays and holdouts hold, under a grid of floors, with guard's own rule
(guard.judge.census.compare; the rule is not re-implemented here), and prints per setting the false
alarms, the catches and the rows that newly fail against today's floors.

    .venv/bin/python benchmarks/rule_floors.py
    .venv/bin/python benchmarks/rule_floors.py --min-growth-calls 1 2 4 --new-function-max-calls 0 8 --max-growth-pct 2
    .venv/bin/python benchmarks/rule_floors.py --real-structure   # the records re-run on the real-structured checkpoints

What the rule needs of a changed function, and what the rows hold: its baseline and measured calls,
the calls that merely moved in from elsewhere in the request, and whether a watched op made it fail.
The first three are fields of every row (a holdout's failed function keeps its moved calls only in
its reason, a function within the rule only in its notice line; both are parsed). The watched part
has no floor, so it is taken from the recorded reason as it is. Rows keep at most 6 op deltas
(release_replay.py cuts them), so the request's census cannot be rebuilt; it is not needed: the moved
calls were recorded, and no floor changes them. Each row is judged on a census pair built to have
exactly those numbers (``census_pair``), which ``compare`` judges as it judged the run.

Which changes are regressions: docs/replay.md classifies every function the replays reported.
Three are regressions (``REPLAY_REGRESSIONS``), one is real growth a maintainer would accept, and
every other one is a refactor, a move, new code, an improvement or a dependency's change, so a
flag on it is a false alarm. A holdout's slow head should fail (expect 1), its refactor not (0).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from guard.config.budgets import CensusRule  # noqa: E402
from guard.config.loading import load_thresholds  # noqa: E402
from guard.judge.census import compare  # noqa: E402
from guard.model.records import Status  # noqa: E402

BENCH = REPO / "benchmarks"
REPLAY_FILES = ("replay-models-cpu.json", "replay-decode-cpu.json", "replay-upstream-cpu.json")
HOLDOUTS_FILE = "holdouts-cpu.json"
# The same questions asked again on the checkpoints real in structure (issue #58): --real-structure
REAL_REPLAY_FILES = ("replay-real-structure-cpu.json", "replay-real-structure-deepseek-cpu.json")
REAL_HOLDOUTS_FILE = "holdouts-real-structure-cpu.json"
GRID = {"min_growth_calls": (4, 8, 12, 16), "new_function_max_calls": (0, 2, 4, 8), "max_growth_pct": (1, 2, 5)}

# What a row is, as docs/replay.md and docs/model-findings.md class it.
BENIGN = "benign"  # refactor, move, new code, improvement, dependency change: a flag is a false alarm
REGRESSION = "regression"  # a flag is a catch
REAL_GROWTH = "real growth"  # real host work a maintainer would accept: guard's to ask, so a flag is no false alarm
SLOW_HEAD = "holdout slow"  # the head must fail
REFACTOR_HEAD = "holdout refactor"  # the head must pass: any flag is a false alarm

# docs/replay.md's regressions and real growth, by (pair, model, function ending, where starting);
# every other function the replays reported is classified there as benign.
REPLAY_REGRESSIONS = {
    ("0.31.0 -> 0.32.0", "deepseek-ocr-2", "TopKTopPSampler.forward_cpu", "decode seeded"): REGRESSION,
    ("0.27.0 -> 0.26.0", "deepseek-ocr-2", "CustomQwen2ModelInner._create_custom_4d_mask", ""): REGRESSION,
    # "a small real slowdown that passes": the KV-cache write per layer done twice again
    ("0.27.0 -> 0.26.0", "deepseek-ocr-2", "cpu_attn_reshape_and_cache", ""): REGRESSION,
    ("0.30.0 -> 0.31.0", "minicpm-v", "GDNAttentionMetadataBuilder.build", ""): REAL_GROWTH,
}

# At real depth (issue #58), per-layer helpers of two refactors add host work once per layer: 0.30's
# modular CPU MoE kernel (buffers allocated and resized, the router's extra ops, per MoE layer) and
# 0.32's LayerNorm custom op (a dtype promotion per layer norm). Intended, small, and the census's to
# ask about: real growth, not false alarms. Applied to the real-structure records only, so the 2-layer
# analysis stays as docs/census.md gives it.
REAL_DEPTH_GROWTH = {
    ("0.29.0 -> 0.30.0", "deepseek-ocr-2", "FusedMoEKernelModularImpl._allocate_buffers", ""): REAL_GROWTH,
    ("0.29.0 -> 0.30.0", "deepseek-ocr-2", "fused_moe/utils.py:_resize_cache", ""): REAL_GROWTH,
    ("0.29.0 -> 0.30.0", "deepseek-ocr-2", "cpu_router.py:_grouped_topk", ""): REAL_GROWTH,
    ("0.31.0 -> 0.32.0", "gemma3", "LayerNorm._compute_dtype", ""): REAL_GROWTH,
    ("0.31.0 -> 0.32.0", "llava-onevision", "LayerNorm._compute_dtype", ""): REAL_GROWTH,
}

_DE2 = "vllm/model_executor/models/deepencoder2.py:CustomQwen2Decoder._create_custom_model.<locals>.CustomQwen2ModelInner."
# DeepSeek-OCR-2's replays 0.24 -> 0.31 and the revert kept no JSON rows: these are docs/replay.md's
# classification table, 640x480 only (it says 800x400 "alike"), own mode. 0.31 -> 0.32 is left out
# here: replay-decode-cpu.json holds that pair's rows.
# (pair, function, baseline, measured, moved, watched that failed it, recorded status)
DOCUMENTED_DEEPSEEK = (
    ("0.24.0 -> 0.25.0", "vllm/model_executor/models/deepseek_v2.py:DeepseekV2DecoderLayer.forward", 3, None, 0, (), "pass"),
    ("0.26.0 -> 0.27.0", _DE2 + "_create_custom_4d_mask", 6188, 2, 0, (), "pass"),
    ("0.26.0 -> 0.27.0", "vllm/model_executor/layers/attention/attention.py:unified_kv_cache_update", 2, 4, 0, (), "pass"),
    ("0.26.0 -> 0.27.0", "vllm/_custom_ops.py:cpu_attn_reshape_and_cache", 4, 2, 0, (), "pass"),
    ("0.28.0 -> 0.29.0", "vllm/multimodal/processing/processor.py:BaseMultiModalProcessor._apply_hf_processor_text_mm",
     2, None, 0, (), "pass"),
    ("0.29.0 -> 0.30.0", "vllm/multimodal/inputs.py:_nested_tensors_h2d.<locals>._h2d", None, 3, 3, (), "pass"),
    ("0.29.0 -> 0.30.0", "vllm/multimodal/inputs.py:_nested_tensors_h2d.<locals>.<lambda>", 3, None, 0, (), "pass"),
    ("0.30.0 -> 0.31.0", "vllm/v1/worker/gpu_model_runner.py:GPUModelRunner._prepare_padding_mask", None, 8, 0, (), "pass"),
    ("0.30.0 -> 0.31.0", _DE2 + "forward", 5946, 5921, 0, (), "pass"),
    ("0.27.0 -> 0.26.0", _DE2 + "_create_custom_4d_mask", 2, 6188, 0,
     (("aten::_index_put_impl_", 513), ("aten::_local_scalar_dense", 512), ("aten::nonzero", 2)), "fail"),
    ("0.27.0 -> 0.26.0", "vllm/model_executor/layers/attention/attention.py:unified_kv_cache_update", 4, 2, 0, (), "pass"),
    ("0.27.0 -> 0.26.0", "vllm/_custom_ops.py:cpu_attn_reshape_and_cache", 2, 4, 0, (), "pass"),
)


@dataclass(frozen=True)
class Row:
    """One changed function of one recorded run, as the rule needs it."""

    source: str  # the file it was read from
    run: str  # "0.30.0 -> 0.31.0 overlay", "holdout slow"
    model: str
    function: str
    where: str  # "640x480" or "decode seeded, per step"
    baseline_calls: int | None  # None: a new function
    measured_calls: int | None  # None: gone
    moved_calls: int
    watched: tuple[tuple[str, int], ...]  # the watched ops whose growth failed it (no floor applies)
    recorded_status: str
    recorded_reason: str | None  # None: the source keeps no reason (a notice line, the docs)
    kind: str
    committed_baseline_accepted: bool = False  # guard pr passed it: within the committed census file

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.run, self.model, self.function, self.where)

    def label(self) -> str:
        b = "new" if self.baseline_calls is None else self.baseline_calls
        m = "gone" if self.measured_calls is None else self.measured_calls
        moved = f", {self.moved_calls} moved in" if self.moved_calls else ""
        return f"{self.model} {self.run}: {short(self.function)} [{self.where}] {b} -> {m}{moved}"


@dataclass
class Data:
    rows: list[Row]  # what the floors are judged on: one row per run, function and image size or mix
    limits: list[str]  # what the recorded data could not say, or rows left out, and why
    replaced: list[Row] = dataclasses.field(default_factory=list)  # rows a later run of the same pair judged again


def short(function: str) -> str:
    path, _, qual = function.partition(":")
    return f"{path.rsplit('/', 1)[-1]}:{qual}"


WATCHED_IN_REASON = re.compile(r"watched op\(s\) grew in the request: (.*)$")
MOVED_IN_REASON = re.compile(r"\((?:besides (\d+) that moved here|(\d+) of them moved from elsewhere)")


def watched_of(reason: str) -> tuple[tuple[str, int], ...]:
    """``+2 aten::_local_scalar_dense, +1 aten::nonzero`` at the end of a recorded reason."""
    found = WATCHED_IN_REASON.search(reason or "")
    if not found:
        return ()
    return tuple((op, int(n)) for n, op in (part.split(" ", 1) for part in found.group(1).split(", ")))


def moved_of(reason: str) -> int:
    found = MOVED_IN_REASON.search(reason or "")
    return int(found.group(1) or found.group(2)) if found else 0


def replay_kind(pair: str, model: str, function: str, where: str, real_depth: bool = False) -> str:
    for (p, m, ending, place), kind in (REPLAY_REGRESSIONS | (REAL_DEPTH_GROWTH if real_depth else {})).items():
        if (p, m) == (pair, model) and function.endswith(ending) and where.startswith(place):
            return kind
    return BENIGN


# ----------------------------------------------------------------------------- reading the records
def _replay_runs(name: str, data) -> list[tuple[str, list[dict]]]:
    """(run label, rows) of one replay file, whichever of its three shapes it has."""
    if isinstance(data, list):
        return [(name, data)]
    if "runs" in data:
        return [(f"{name}: {run['run']}", run["rows"]) for run in data["runs"]]
    # the decode replay: one run per census file that judged it, each row saying which
    return [(f"{name}: {budgets}", [r for r in data["rows"] if r.get("budgets") == budgets])
            for budgets in dict.fromkeys(r.get("budgets") for r in data["rows"])]


def replay_data(files: Sequence[str] = REPLAY_FILES, documented: bool = True) -> Data:
    """Every census row of the recorded replays (``documented``: with docs/replay.md's transcribed
    DeepSeek-OCR-2 rows, counted on the 2-layer checkpoint). A later run of the same model, mode and pair
    replaces an earlier one (the model matrix ran 0.30 -> 0.31 again after the input-processing
    rule; the decode replay judged 0.31 -> 0.32 against two census files, side against side alike)."""
    latest: dict[tuple, tuple[str, str, dict]] = {}
    earlier: list[tuple[str, str, dict]] = []
    limits: list[str] = []
    for name in files:
        for label, runs in _replay_runs(name, json.loads((BENCH / name).read_text(encoding="utf-8"))):
            for r in runs:
                pair = f"{r['base'].lstrip('v')} -> {r['head'].lstrip('v')}"
                key = (r["model"], r["mode"], pair)
                if key in latest:
                    limits.append(f"{r['model']} {pair} {r['mode']}: judged again by '{label}'; the earlier run's rows "
                                  f"('{latest[key][1]}') are cross-checked only")
                    earlier.append(latest[key])
                latest[key] = (name, label, r)
    replaced = [row for name, _, r in earlier for row in _census_rows(name, r)]
    rows: list[Row] = []
    for (model, mode, pair), (name, label, r) in latest.items():
        if r.get("skipped") or r.get("exit") == 3:
            why = r.get("skipped") or "; ".join(r.get("invalid", []))[:160]
            limits.append(f"{model} {pair} {mode}: nothing to judge (exit {r.get('exit', '-')}: {why})")
            continue
        if not r.get("census"):
            limits.append(f"{model} {pair} {mode}: exit {r['exit']} ({r.get('verdict')}), no function changed: "
                          "no floor can flag anything")
            continue
        rows += _census_rows(name, r)
    if not documented:
        return Data(rows, limits, replaced)
    for pair, fn, b, m, moved, watched, status in DOCUMENTED_DEEPSEEK:
        rows.append(Row("docs/replay.md", f"{pair} own", "deepseek-ocr-2", fn, "640x480", b, m, moved, watched, status,
                        None, replay_kind(pair, "deepseek-ocr-2", fn, "640x480")))
    limits.append(f"deepseek-ocr-2 0.24.0 -> 0.31.0 and 0.27.0 -> 0.26.0: no JSON rows were kept; "
                  f"{len(DOCUMENTED_DEEPSEEK)} rows transcribed from docs/replay.md's classification table "
                  "(640x480 only, own mode; its reasons were not recorded, only its verdicts)")
    return Data(rows, limits, replaced)


def _census_rows(name: str, r: dict) -> list[Row]:
    """The census rows of one recorded replay run."""
    pair, mode = f"{r['base'].lstrip('v')} -> {r['head'].lstrip('v')}", r["mode"]
    accepted = [n for n in r.get("notices", []) if "within the committed census baseline" in n]
    return [Row(name, f"{pair} {mode}", r["model"], c["function"], c["size"], c["baseline_calls"], c["measured_calls"],
                c["moved_calls"], watched_of(c["reason"]), c["status"], c["reason"],
                replay_kind(pair, r["model"], c["function"], c["size"], real_depth=name in REAL_REPLAY_FILES),
                committed_baseline_accepted=any(f"{c['function']} [{c['size']}]" in n for n in accepted))
            for c in r.get("census", [])]


NOTICE = re.compile(r"^census: (?:moved: (?P<moved>\d+) op calls from .*? to )?(?:improvement: )?"
                    r"(?P<fn>\S+) \[(?P<where>[^\]]+)\]: (?P<b>new|\d+) → (?P<m>gone|\d+) op calls")


def holdout_data(file: str = HOLDOUTS_FILE) -> Data:
    """The holdouts' changed functions: a failed one from ``failed`` (with its reason), one within
    the rule from its notice line (``moved`` holds no counts; the notice has them)."""
    rows: list[Row] = []
    limits: list[str] = []
    for r in json.loads((BENCH / file).read_text(encoding="utf-8")):
        run, kind = f"holdout {r['head']}", SLOW_HEAD if r["head"] == "slow" else REFACTOR_HEAD
        for f in r["failed"]:
            rows.append(Row(file, run, r["model"], f["function"], f["image_size"], f["baseline"], f["measured"],
                            moved_of(f["reason"]), watched_of(f["reason"]), "fail", f["reason"], kind))
        for n in r["notices"]:
            found = NOTICE.match(n)
            if found:
                rows.append(Row(file, run, r["model"], found["fn"], found["where"],
                                None if found["b"] == "new" else int(found["b"]),
                                None if found["m"] == "gone" else int(found["m"]), int(found["moved"] or 0), (),
                                "pass", None, kind))
            elif "more changed function(s)" in n:  # guard prints the first ten changes within the rule
                limits.append(f"{r['model']} {run}: {n}: those rows are not recorded")
    return Data(rows, limits)


# ----------------------------------------------------------------------------- judging
@cache
def shipped_rule(model: str) -> CensusRule:
    """The census rule of the model's shipped ``cpu`` profile (thresholds/MODEL.yaml)."""
    return load_thresholds(REPO / "thresholds" / f"{model}.yaml").profile("cpu").census


def with_floors(rule: CensusRule, floors: dict[str, float]) -> CensusRule:
    return dataclasses.replace(rule, **floors)


DONOR = "rule_floors.py:the_rest_of_the_request"  # gave up the moved calls
OTHER_OP, MOVED_OP = "rule_floors::calls", "rule_floors::moved_in"  # ops no rule watches: only their number counts


def census_pair(row: Row) -> tuple[dict, dict]:
    """A baseline and a measured census on which guard's rule sees exactly the row: its baseline and
    measured calls, its moved calls (given up by another function, so the request did not grow by
    them) and the watched ops that failed it. ValueError when the numbers contradict each other."""
    base: dict[str, dict[str, int]] = {}
    got: dict[str, dict[str, int]] = {}
    if row.baseline_calls is not None:
        base[row.function] = {OTHER_OP: row.baseline_calls}
    if row.measured_calls is not None:
        rest = row.measured_calls - row.moved_calls - sum(n for _, n in row.watched)
        if rest < 0:
            raise ValueError(f"{row.label()}: fewer measured calls than moved and watched ones")
        got[row.function] = {op: n for op, n in ((OTHER_OP, rest), (MOVED_OP, row.moved_calls), *row.watched) if n}
    if row.moved_calls:
        base[DONOR] = {MOVED_OP: row.moved_calls}
    return base, got


def judged(row: Row, rule: CensusRule) -> tuple[str, str]:
    """(status, reason) that guard's compare() gives the row under ``rule``."""
    base, got = census_pair(row)
    checks = [c for c in compare(rule, (0, 0), base, got) if c.function == row.function]
    if not checks:  # the same calls on both sides: nothing for any rule to judge
        return str(Status.PASS), ""
    return str(checks[0].status), checks[0].reason


def rule_status(row: Row) -> str:
    """What the rule itself said of the row: guard pr passes a failure the committed census file
    already holds, a verdict no floor takes part in."""
    return str(Status.FAIL) if row.committed_baseline_accepted else row.recorded_status


def cross_check(rows: Iterable[Row]) -> list[str]:
    """Every row judged under its model's shipped rule against what was recorded: the status and,
    where one was kept, the reason word for word. Each line a disagreement; none: faithful."""
    wrong = []
    for row in rows:
        status, reason = judged(row, shipped_rule(row.model))
        if status != rule_status(row):
            wrong.append(f"{row.label()}: recorded {row.recorded_status}, re-judged {status} ({reason})")
        elif row.recorded_reason is not None and reason != row.recorded_reason:
            wrong.append(f"{row.label()}: recorded reason '{row.recorded_reason}', re-judged '{reason}'")
    return wrong


@dataclass(frozen=True)
class Outcome:
    """One setting of the floors over every row."""

    floors: dict[str, float]
    failing: frozenset[tuple]  # Row.key of every row that fails

    def failed(self, rows: Iterable[Row], *kinds: str) -> list[Row]:
        return [r for r in rows if r.kind in kinds and r.key in self.failing]


def outcome(rows: Sequence[Row], floors: dict[str, float]) -> Outcome:
    failing = frozenset(r.key for r in rows if judged(r, with_floors(shipped_rule(r.model), floors))[0] == Status.FAIL)
    return Outcome(floors, failing)


def settings(grid: dict[str, Sequence[float]]) -> list[dict[str, float]]:
    names = list(grid)
    return [dict(zip(names, values)) for values in itertools.product(*(grid[n] for n in names))]


# ----------------------------------------------------------------------------- reporting
SHIPPED = {"min_growth_calls": 16, "new_function_max_calls": 8, "max_growth_pct": 2}
# One floor at a time around the shipped ones, below the grid too: where each starts to cost.
# Looser values too: how much room the shipped floors leave below what the slow heads add.
SWEEP = {"min_growth_calls": (0, 1, 2, 3, 4, 8, 12, 24, 32), "new_function_max_calls": (0, 2, 4, 5, 6, 7, 9, 10, 16),
         "max_growth_pct": (0, 1, 5, 10)}
SHORT = {"min_growth_calls": "min", "new_function_max_calls": "new", "max_growth_pct": "pct"}


def floors_text(floors: dict[str, Sequence[float] | float]) -> str:
    """``min 16, new 8, pct 2``; a group of settings: ``min 4/8/12/16, new 8, pct 1/2/5``."""
    def values(v):
        return "/".join(f"{x:g}" for x in v) if isinstance(v, (list, tuple)) else f"{v:g}"
    return ", ".join(f"{SHORT[name]} {values(floors[name])}" for name in SHORT)


def grouped(outcomes: Sequence[Outcome]) -> list[tuple[str, Outcome]]:
    """Settings that fail exactly the same rows, as one line each: ``min 4/8/12/16, new 8, pct 1/2/5``
    where the group is every combination of those values, else each setting named."""
    groups: dict[frozenset, list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault(o.failing, []).append(o)
    out = []
    for members in groups.values():
        spans = {name: sorted({o.floors[name] for o in members}) for name in SHORT}
        product = len(list(itertools.product(*spans.values()))) == len(members)
        label = floors_text(spans) if product else "; ".join(floors_text(o.floors) for o in members)
        out.append((label, members[0]))
    return out


def counted(found: Iterable[Row]) -> str:
    """Rows (function x image size or mix) and, in brackets, distinct functions of a run."""
    found = list(found)
    return f"{len(found)} ({len({(r.run, r.model, r.function) for r in found})})"


def summary_line(setting: str, rows: Sequence[Row], o: Outcome, today: Outcome) -> dict[str, str]:
    """The table's cells for one setting (or group of settings with the same outcome)."""
    regressions = [r for r in rows if r.kind in (REGRESSION, REAL_GROWTH)]
    slow_today = {(r.model, r.function) for r in today.failed(rows, SLOW_HEAD)}
    slow_kept = {(r.model, r.function) for r in o.failed(rows, SLOW_HEAD)} & slow_today
    return {
        "floors": setting,
        "replay false alarms": counted(o.failed(rows, BENIGN)),
        "replay regressions flagged": f"{len(o.failed(regressions, REGRESSION, REAL_GROWTH))} of {len(regressions)}",
        "holdout refactors failing": f"{len({r.model for r in o.failed(rows, REFACTOR_HEAD)})} of "
                                     f"{len({r.model for r in rows if r.kind == REFACTOR_HEAD})}",
        "holdout slow heads caught": f"{len({r.model for r in o.failed(rows, SLOW_HEAD)})} of "
                                     f"{len({r.model for r in rows if r.kind == SLOW_HEAD})}",
        "slow-head functions still named": f"{len(slow_kept)} of {len(slow_today)}",
        "newly failing": counted(r for r in rows if r.key in o.failing - today.failing),
        "newly passing": counted(r for r in rows if r.key in today.failing - o.failing),
    }


def table(lines: list[dict[str, str]]) -> str:
    """A markdown table, the first line's keys as its header."""
    head = list(lines[0])
    out = ["| " + " | ".join(head) + " |", "|---|" + "|".join("---:" for _ in head[1:]) + "|"]
    out += ["| " + " | ".join(line[h] for h in head) + " |" for line in lines]
    return "\n".join(out)


def changed_rows(rows: Sequence[Row], groups: Sequence[tuple[str, Outcome]], today: Outcome) -> list[str]:
    """Per group of settings, the functions it fails and today's floors pass (and the other way
    round), each change once with the runs it was seen in (image sizes and modes folded)."""
    out = []
    for label, o in groups:
        lines = []
        for verb, keys in (("newly FAILS", o.failing - today.failing), ("newly passes", today.failing - o.failing)):
            seen: dict[tuple, list[Row]] = {}
            for r in rows:
                if r.key in keys:
                    seen.setdefault((r.kind, short(r.function), r.label().split("] ", 1)[1]), []).append(r)
            for (kind, fn, change), found in seen.items():
                runs = ", ".join(dict.fromkeys(f"{r.model} {r.run}" for r in found))
                lines.append(f"    {verb} [{kind}] {fn} {change}: {len(found)} row(s): {runs}")
        if lines:
            out += [f"- {label}:", *lines]
    return out


def sweep_settings() -> list[dict[str, float]]:
    """Each floor over SWEEP's values, the other two as shipped."""
    return [dict(SHIPPED, **{name: v}) for name, values in SWEEP.items() for v in values if v != SHIPPED[name]]


def report(rows: Sequence[Row], title: str, settings_: Sequence[dict[str, float]], today: Outcome,
           group: bool) -> None:
    outcomes = [outcome(rows, floors) for floors in settings_]
    groups = grouped(outcomes) if group else [(floors_text(o.floors), o) for o in outcomes]
    print(f"\n{title}\n")
    print(table([summary_line(label, rows, o, today) for label, o in groups]))
    print("\nagainst today's floors:")
    print("\n".join(changed_rows(rows, groups, today)) or "  no setting changes any row")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, values in GRID.items():
        ap.add_argument("--" + name.replace("_", "-"), nargs="+", type=float, default=list(values),
                        help=f"the grid's values (default: {' '.join(map(str, values))})")
    ap.add_argument("--real-structure", action="store_true",
                    help="the replay and holdouts re-run on the checkpoints real in structure (issue #58)")
    args = ap.parse_args(argv)
    grid = {name: [int(v) if name != "max_growth_pct" else v for v in getattr(args, name)] for name in GRID}
    if args.real_structure:
        replay, holdouts = replay_data(REAL_REPLAY_FILES, documented=False), holdout_data(REAL_HOLDOUTS_FILE)
    else:
        replay, holdouts = replay_data(), holdout_data()
    rows = replay.rows + holdouts.rows
    print(f"rows judged: {len(replay.rows)} replay, {len(holdouts.rows)} holdout (a changed function at one image "
          f"size or request mix); {len(replay.replaced)} more from runs judged again, cross-checked only")
    print("\nwhat the recorded data leave out:")
    print("\n".join(f"- {line}" for line in replay.limits + holdouts.limits + [
        "functions whose counts did not change are not stored (guard reports changed functions only); "
        "no floor can fail them: they neither grew nor are new",
        "op deltas are cut to 6 per row: the request's census cannot be rebuilt, so moves are taken as "
        "recorded (the floors do not change what moved)"]))
    wrong = cross_check(rows + replay.replaced)
    print(f"\ncross-check, shipped floors ({floors_text(SHIPPED)}): {len(rows) + len(replay.replaced) - len(wrong)} "
          f"of {len(rows) + len(replay.replaced)} rows re-judged as recorded")
    print("\n".join(f"  MISMATCH {w}" for w in wrong))
    today = outcome(rows, SHIPPED)
    print("\nrows (functions); replay false alarms: flags on functions docs/replay.md classes as benign; regressions: "
          "its 3 regressions and 1 real growth (rows); slow-head functions: those today's floors fail")
    report(rows, "the grid (settings with the same outcome share a line):", settings(grid), today, group=True)
    report(rows, "one floor at a time, the others as shipped:", sweep_settings(), today, group=False)
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
