"""Prove on this machine that the op-count probe still sees the regression it guards.

Two op-count runs through the same harness and verdict path as ``guard check`` (guard.measure.harness):
the current code (every op budget must hold), then ``--inject legacy-mask`` (the pre-#49531 mask
in the live engine: the mask-path budget must fail with exactly 513 index_put calls per S=512
image and 289 per S=288 tile). Exit 0 when the canary is caught and the clean code passes; 1 when
it is not; 3 when either run is invalid.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from guard import __version__
from guard.model import format as fmt
from guard.config.budgets import DEFAULT_THRESHOLDS, Profile
from guard.config.loading import load_thresholds
from guard.measure.canary import LEGACY_MASK, expected_index_puts
from guard.compat import deepseek_ocr2_tiles
from guard.errors import ExitCode, InvalidRunError, UsageError
from guard.files import prepare_output
from guard.judge.evaluate import DEFAULT_OUTPUT, evaluate
from guard.measure.harness import record_suite
from guard.config.census import read_baseline
from guard.report.output import write_report
from guard.measure.hardware import detect
from guard.measure.fit import select_profile
from guard.model.records import Measures, Status, Verdict, reasons_text
from guard.model.results import Results
from guard.report.terminal import render_terminal, sites_lines

INDEX_PUT = "aten::_index_put_impl_"
GLOBAL_VIEW_S, TILE_S = 512, 288  # encoder sequence lengths: 1024 px global view, 768 px tiles


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", default="auto", help="hardware profile (default: auto)")
    parser.add_argument("--thresholds", default=DEFAULT_THRESHOLDS, help="budget YAML (default: %(default)s)")
    parser.add_argument("--output", default=DEFAULT_OUTPUT,
                        help="folder for the two runs' results (clean/, canary/) (default: %(default)s)")


def expected_legacy(size: tuple[int, int]) -> int:
    return expected_index_puts(GLOBAL_VIEW_S) + deepseek_ocr2_tiles(size) * expected_index_puts(TILE_S)


def mask_scopes(profile: Profile) -> list[str]:
    return [sb.name for sb in profile.ops if INDEX_PUT in sb.ops and sb.scope.kind == "function"]


@dataclass(frozen=True)
class Finding:
    what: str
    value: str
    ok: bool


def findings(clean: Results, canary: Results, scopes: list[str]) -> list[Finding]:
    """What the two judged runs must show for the probe to be trusted."""
    out = [Finding("clean: verdict", f"{clean.verdict} ({sum(c.status == Status.PASS for c in clean.op_checks)}/"
                   f"{len(clean.op_checks)} op budgets held)", clean.verdict == Verdict.PASS)]
    out.append(Finding("canary: verdict", str(canary.verdict), canary.verdict == Verdict.REGRESSION))
    for counts in canary.run.op_counts:
        if counts.scope not in scopes:
            continue
        want = expected_legacy(counts.image_size)
        got = counts.calls_by_op.get(INDEX_PUT, 0)
        caught = any(c.status == Status.FAIL and c.scope == counts.scope and c.image_size == counts.image_size
                     and c.op == INDEX_PUT for c in canary.op_checks)
        out.append(Finding(f"canary {counts.scope} [{fmt.size(counts.image_size)}] {INDEX_PUT}",
                           f"{got} (expected {want}){'' if caught else ', budget NOT failed'}", caught and got == want))
    return out


def run(args: argparse.Namespace) -> int:
    thresholds = load_thresholds(args.thresholds)
    profile = select_profile(thresholds, args.profile, detect(quick=True))
    scopes = mask_scopes(profile)
    if not scopes:
        raise UsageError(f"profile '{profile.name}' budgets no {INDEX_PUT} in a function scope: nothing to selftest",
                         hint="the selftest injects the pre-#49531 mask loop: give DeepSeek-OCR-2's budgets "
                              "(the default --thresholds)")
    output = Path(args.output).resolve()
    prepare_output(output)
    census_baseline = read_baseline(profile.census)  # a malformed baseline stops here, before a minute is spent

    judged = {}
    for label, inject in (("clean", None), ("canary", LEGACY_MASK)):
        print(f"guard selftest: {label} run (op counts only){' with the pre-#49531 mask injected' if inject else ''}",
              flush=True)
        record = record_suite(thresholds, profile, output / label, measures=Measures.OPS, inject=inject)
        res = evaluate(profile, record, guard_version=__version__, output=output / label, census_baseline=census_baseline)
        write_report(res, output / label, thresholds=args.thresholds)  # the canary's: what a caught regression reads like
        if res.verdict == Verdict.INVALID:  # e.g. the mask function was renamed: the selftest proves nothing
            print(render_terminal(res))
            raise InvalidRunError(f"the {label} run is invalid: " + reasons_text(res.invalid_reasons))
        judged[label] = res

    rows = findings(judged["clean"], judged["canary"], scopes)
    width = max(len(r.what) for r in rows)
    print()
    for r in rows:
        print(f"{r.what.ljust(width)}  {r.value:<34}  {'ok' if r.ok else 'FAIL'}")
    print(*sites_lines(judged["canary"]), sep="\n")
    ok = all(r.ok for r in rows)
    print("\nSELFTEST PASS: the probe catches the pre-#49531 mask and the current code holds its budgets"
          if ok else "\nSELFTEST FAIL: the probe no longer proves what it guards")
    return int(ExitCode.PASS if ok else ExitCode.REGRESSION)
