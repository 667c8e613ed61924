"""A model's float32 census counted on any CPU, by running its engine in float32 on purpose.

    uv run --extra cpu python benchmarks/float32_census.py deepseek-ocr-2            # check only
    uv run --extra cpu python benchmarks/float32_census.py --all --write             # and write

A `cpu` profile's engine runs float32 where the CPU has no native bf16
(`engine.dtype_without_native_bf16`), and its census is judged against
`census.baseline_without_native_bf16`, counted on such a machine (an AVX2-only EPYC). The census
counts Python-level operator calls, which follow the dtype, not the ISA: this script runs the same
profile with `engine.dtype: float32` on whatever CPU runs it and compares the image sizes' census
with the committed float32 file. Only when every function matches exactly (the file was counted
elsewhere, so that is the check that the counts do not depend on the machine) does `--write` let
`guard update-thresholds --only census` rewrite the file from this run: the prefill as it was, the
request mixes' decode steps (which the AVX2 machine never counted) added.

A new checkpoint (issue #58's real-structured ones) has no float32 file to match: ``--new-checkpoint``
writes the file from this run whatever the old one held. That rests on the matches above, counted in
all eight models on the previous checkpoints, not on a match of its own.

    uv run --extra cpu python benchmarks/float32_census.py --all --write --new-checkpoint
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from guard.config.loading import load_thresholds  # noqa: E402
from guard.config.models import canonical, names, resolve  # noqa: E402


def guard(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("guard", path=str(Path(sys.executable).parent)) or "guard"
    return subprocess.run([exe, *args], capture_output=True, text=True)


def float32_copy(shipped: Path, folder: Path) -> tuple[Path, str] | str:
    """The model's thresholds folder copied, its cpu profile forced to float32 and judged against its
    float32 census alone; or why it has none."""
    profile = load_thresholds(shipped).profiles["cpu"]
    census = profile.census
    if census is None or census.baseline_without_native_bf16 is None or profile.engine.requires_native_bf16:
        return "no float32 census: the profile runs bf16 or nothing (requires_native_bf16), or has no census"
    shutil.copytree(shipped.parent, folder)
    path = folder / shipped.name
    data = yaml.safe_load(path.read_text())
    cpu = data["profiles"]["cpu"]
    data["profiles"] = {"cpu": cpu}
    cpu["engine"]["dtype"] = "float32"
    cpu["engine"].pop("dtype_without_native_bf16", None)
    rule = cpu["budgets"]["census"]
    rule["baseline"] = rule.pop("baseline_without_native_bf16")
    rule.pop("baseline_with_amx", None)
    cpu["budgets"] = {k: v for k, v in cpu["budgets"].items() if k in ("ops", "census")}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, rule["baseline"]


def one(model: str, write: bool, new_checkpoint: bool = False) -> dict:
    (_, shipped), = resolve(model)
    with tempfile.TemporaryDirectory(prefix="guard-f32-") as tmp:
        made = float32_copy(Path(shipped), Path(tmp) / "thresholds")
        if isinstance(made, str):
            return {"model": model, "skipped": made}
        budgets, baseline = made
        out = Path(tmp) / "out"
        run = guard("check", "--thresholds", str(budgets), "--only", "ops", "--output", str(out))
        if not (out / "results.json").exists():
            return {"model": model, "exit": run.returncode, "error": (run.stdout + run.stderr)[-1500:]}
        results = json.loads((out / "results.json").read_text())
        prefill = [c["function"] + " [" + "x".join(map(str, c["image_size"])) + "]"
                   for c in results["checks"]["census"] if not c.get("mix")]
        found = {"model": model, "exit": run.returncode, "prefill_differs": prefill,
                 "decode_mixes": sorted(results["run"].get("decode_census", {}))}
        if write and (new_checkpoint or (not prefill and run.returncode in (0, 3))):
            done = guard("update-thresholds", "--from", str(out / "results.json"), "--profile", "cpu",
                         "--thresholds", str(budgets), "--only", "census", *(["--allow-increase"] * new_checkpoint))
            found["written"] = done.returncode == 0
            if done.returncode == 0:
                shutil.copyfile(budgets.parent / baseline, Path(shipped).parent / baseline)
            else:
                found["error"] = (done.stdout + done.stderr)[-1500:]
        return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", help="guarded model names")
    parser.add_argument("--all", action="store_true", help="every guarded model")
    parser.add_argument("--write", action="store_true", help="rewrite each float32 census whose prefill matched exactly")
    parser.add_argument("--new-checkpoint", action="store_true",
                        help="with --write: write each file from this run even where it differs (a new checkpoint)")
    args = parser.parse_args(argv)
    models = names() if args.all else [canonical(m) for m in args.models]
    if not models:
        parser.error("name a model or pass --all")
    rows = []
    for model in models:
        print(f"{model} ...", flush=True)
        rows.append(one(model, args.write, args.new_checkpoint))
        print(json.dumps(rows[-1], indent=2), flush=True)
    differs = [r for r in rows if r.get("prefill_differs") and not (args.new_checkpoint and r.get("written"))]
    return 1 if differs or any(r.get("error") for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
