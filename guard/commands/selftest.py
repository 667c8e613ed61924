"""Prove on this machine that the op-count probe still sees the regression it guards.

One engine, three profile passes: clean (budgets must hold), the pre-#49531 mask injected
(the mask-path budget must fail with exactly 513 index_put calls per S=512 image and 289 per
S=288 tile), then restored (budgets hold again, counts identical to the clean pass).
Exit 0 when the canary is caught and the clean code passes; 1 when it is not; 3 invalid run.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from guard.budgets import DEFAULT_THRESHOLDS, Profile, load_thresholds
from guard.canary import expected_index_puts, inject_legacy_mask
from guard.commands.check import DEFAULT_OUTPUT
from guard.errors import ExitCode, InvalidRunError
from guard.evaluate import invalid_reasons, op_checks
from guard.hardware import detect, select_profile
from guard.results import RunRecord, ScopeCounts, Status, write_json_atomic
from guard.runner import GuardRun

INDEX_PUT = "aten::_index_put_impl_"
GLOBAL_VIEW_S, TILE_S = 512, 288  # encoder sequence lengths: 1024 px global view, 768 px tiles


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", default="auto", help="hardware profile (default: auto)")
    parser.add_argument("--thresholds", default=DEFAULT_THRESHOLDS, help="budget YAML (default: %(default)s)")
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help="folder for selftest.json and traces")


def tiles_for(size: tuple[int, int]) -> int:
    """How many 768 px tiles vLLM's DeepSeek-OCR-2 processor cuts this image into (0: global view only)."""
    from vllm.model_executor.models.deepseek_ocr2 import IMAGE_SIZE
    from vllm.transformers_utils.processors.deepseek_ocr import count_tiles

    w, h = size
    if w <= IMAGE_SIZE and h <= IMAGE_SIZE:
        return 0
    tw, th = count_tiles(w, h, image_size=IMAGE_SIZE)
    return tw * th


def expected_legacy(size: tuple[int, int]) -> int:
    return expected_index_puts(GLOBAL_VIEW_S) + tiles_for(size) * expected_index_puts(TILE_S)


def mask_scopes(profile: Profile) -> list[str]:
    return [sb.name for sb in profile.ops if INDEX_PUT in sb.ops and sb.scope.kind == "function"]


def run(args: argparse.Namespace) -> int:
    thresholds = load_thresholds(args.thresholds)
    hw = detect()
    profile = select_profile(thresholds, args.profile, hw)
    scopes = mask_scopes(profile)
    if not scopes:
        raise InvalidRunError(f"profile '{profile.name}' budgets no {INDEX_PUT} in a function scope: nothing to selftest")
    output = Path(args.output).resolve()
    guard_run = GuardRun(thresholds, profile, hw, output, progress=lambda m: print(f"[guard] {m}", flush=True))

    ops_only = dataclasses.replace(profile, ttft_ms={})  # the selftest measures no TTFT

    def phase(label: str) -> tuple[list[ScopeCounts], list]:
        counts = guard_run.profile_ops(label=label)
        reasons = invalid_reasons(ops_only, RunRecord(profile=profile.name, thresholds_path=str(thresholds.path),
                                                      model=thresholds.model, environment=guard_run.record.environment,
                                                      op_counts=counts))
        if reasons:  # e.g. the mask function was renamed: the selftest proves nothing
            raise InvalidRunError("; ".join(reasons))
        return counts, op_checks(profile, counts)

    clean_counts, clean_checks = phase("-clean")
    with inject_legacy_mask(guard_run.llm):
        canary_counts, canary_checks = phase("-canary")
    restored_counts, restored_checks = phase("-restored")

    rows, ok = [], True
    for c in canary_counts:
        if c.scope not in scopes:
            continue
        want = expected_legacy(c.image_size)
        got = c.counts.get(INDEX_PUT, 0)
        caught = any(k.status == Status.FAIL and k.scope == c.scope and k.image_size == c.image_size for k in canary_checks)
        good = caught and got == want
        ok &= good
        rows.append((f"canary {c.scope} [{c.image_size[0]}x{c.image_size[1]}]", f"{got} (expected {want})",
                     "caught" if good else ("counted wrong" if caught else "NOT CAUGHT")))
    for label, checks in (("clean", clean_checks), ("restored", restored_checks)):
        failed = [k.name for k in checks if k.status == Status.FAIL]
        ok &= not failed
        rows.append((f"{label}: all op budgets", f"{len(checks) - len(failed)}/{len(checks)} held",
                     "ok" if not failed else "FAIL: " + ", ".join(failed)))
    same = [(c.scope, c.image_size, c.counts, c.total) for c in clean_counts] == \
           [(c.scope, c.image_size, c.counts, c.total) for c in restored_counts]
    ok &= same
    rows.append(("clean == restored counts", "identical" if same else "DIFFER", "ok" if same else "FAIL"))

    width = max(len(r[0]) for r in rows)
    print()
    for name, value, status in rows:
        print(f"{name.ljust(width)}  {value:<22}  {status}")
    for c in canary_counts:
        if c.scope in scopes and c.sites:
            print(f"\ncanary calls in {c.scope} [{c.image_size[0]}x{c.image_size[1]}] came from:")
            for s in c.sites[:4]:
                print(f"  {s.count:>6}  {s.op:<28} {s.function} ({s.location})")
    write_json_atomic(output / "selftest.json", {
        "schema": "guard/selftest", "schema_version": 1, "caught": ok, "profile": profile.name,
        "rows": [list(r) for r in rows],
        "counts": {label: [{"scope": c.scope, "image_size": list(c.image_size), "entered": c.entered,
                            "counts": c.counts, "total": c.total} for c in counts]
                   for label, counts in (("clean", clean_counts), ("canary", canary_counts), ("restored", restored_counts))},
    })
    print("\nSELFTEST PASS: the probe catches the pre-#49531 mask and the current code holds its budgets"
          if ok else "\nSELFTEST FAIL: the probe no longer proves what it guards")
    return int(ExitCode.PASS if ok else ExitCode.REGRESSION)
