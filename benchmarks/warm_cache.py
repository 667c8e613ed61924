"""Cold against warm: the steps of guard-cpu.yml's job that run off GitHub, timed on this machine.

What a pull request's job does after the checkouts, with nothing cached and with what guard-main.yml
saves on vLLM's main (docs/github.md, "Warm caches"):

  uv-cold        `uv sync --locked --extra cpu --no-dev` (CI's install line) into an empty
                 environment with an empty UV_CACHE_DIR: every wheel downloaded
  uv-pack        the filled uv cache packed as actions/cache packs it (tar + zstd -T0 --long=30):
                 its size is what the entry would take of the repository's cache limit
  uv-unpack      that archive unpacked again (the local half of a cache restore; the download of
                 the archive from GitHub's cache service is not measured here)
  uv-warm        the same sync into an empty environment from the unpacked cache
  pr-cold        `guard pr --only ops` with an empty --cache-dir: both environments built, both
                 sides profiled (tests/vllm_repo.py's repository, head tests/pr_heads.py item-loop)
  pr-pack        base's entry only (its environment and op counts: what main's job leaves), packed
  pr-unpack      and unpacked into the same --cache-dir path (entries hold absolute paths; on a
                 runner ~/.cache/guard/pr is the same path on main and on the pull request)
  pr-warm        `guard pr --only ops` again: base's op counts from the cache, head profiled (a
                 pull request never saves, so a re-run of it is this row again)

guard's other caches ($GUARD_CACHE_DIR beside pr/: the operator names of the torch build) are not
in the workflow's cache, so each guard pr row starts with only pr/ there.

Every row is wall time of a fresh process; the load average before and after each is printed, since
2 cores shared with other work make the profiled rows slower. Run it from the repository root:

    uv run --extra cpu python benchmarks/warm_cache.py [--skip-uv] [--skip-pr] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
ZSTD_PACK = "zstd -T0 --long=30"  # what actions/cache runs on Linux when zstd is there
ZSTD_UNPACK = "zstd -d --long=30"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def timed(rows: dict, label: str, cmd: list[str], expect: int = 0, env: dict | None = None) -> float:
    before = load()
    print(f"[warm_cache] {label}: {' '.join(cmd)} (load {before})", flush=True)
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, **(env or {})})
    wall = time.perf_counter() - t
    after = load()
    print(f"[warm_cache] {label}: exit {done.returncode} (expected {expect}) in {wall:.1f} s (load {after})",
          flush=True)
    if done.returncode != expect:
        print(done.stdout[-3000:], done.stderr[-3000:])
        raise SystemExit(f"{label}: unexpected exit {done.returncode}")
    rows[label] = {"wall_s": round(wall, 1), "exit": done.returncode, "load_before": before, "load_after": after}
    return wall


def du(path: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def pack(rows: dict, label: str, root: Path, name: str, archive: Path) -> None:
    """tar + zstd of root/name, as actions/cache does (paths relative to root)."""
    timed(rows, label, ["tar", "--posix", "-cf", str(archive), "-C", str(root), "--use-compress-program",
                        ZSTD_PACK, name])
    rows[label]["archive_bytes"] = archive.stat().st_size
    rows[label]["tree_bytes"] = du(root / name)
    print(f"[warm_cache] {label}: {rows[label]['tree_bytes'] / 1e9:.2f} GB on disk -> "
          f"{archive.stat().st_size / 1e9:.3f} GB archive", flush=True)


def unpack(rows: dict, label: str, root: Path, archive: Path) -> None:
    timed(rows, label, ["tar", "-xf", str(archive), "-C", str(root), "--use-compress-program", ZSTD_UNPACK])


def uv_rows(rows: dict, tmp: Path) -> None:
    uv = shutil.which("uv")
    assert uv, "uv is not on PATH"
    cache = tmp / "uv-cache"
    cache.mkdir()
    venv = tmp / "venv"
    sync = [uv, "sync", "--locked", "--extra", "cpu", "--no-dev", "--project", str(REPO)]
    env = {"UV_CACHE_DIR": str(cache), "UV_PROJECT_ENVIRONMENT": str(venv)}
    timed(rows, "uv-cold", sync, env=env)
    archive = tmp / "uv-cache.tzst"
    pack(rows, "uv-pack", tmp, "uv-cache", archive)
    shutil.rmtree(cache)
    shutil.rmtree(venv)
    unpack(rows, "uv-unpack", tmp, archive)
    archive.unlink()
    timed(rows, "uv-warm", sync, env=env)
    rows["uv-warm"]["venv_bytes"] = du(venv)
    shutil.rmtree(venv)
    shutil.rmtree(cache)


def pr_rows(rows: dict, tmp: Path) -> None:
    from tests.pr_heads import HEADS
    from tests.vllm_repo import build, commit

    repo = build(tmp)
    h = HEADS["item-loop"]
    head = commit(repo, h.message, edits=h.edits)
    base = subprocess.run(["git", "-C", str(repo), "rev-parse", "main"], capture_output=True, text=True,
                          check=True).stdout.strip()
    guard = str(Path(sys.executable).parent / "guard")
    root = tmp / "guard-cache"
    cache = root / "pr"
    env = {"GUARD_CACHE_DIR": str(root)}

    def only_pr() -> None:  # what a runner holds: the restored pr/ and nothing else of guard's
        for p in root.iterdir() if root.is_dir() else ():
            if p != cache:
                shutil.rmtree(p) if p.is_dir() else p.unlink()
    pr = [guard, "pr", "--vllm-repo", str(repo), "--base", "main", "--head", head, "--only", "ops",
          "--cache-dir", str(cache), "--output", str(tmp / "pr")]
    timed(rows, "pr-cold", pr, h.expect, env)
    entries = {json.loads((e / "guard-env.json").read_text())["sha"]: e for e in cache.iterdir()
               if (e / "guard-env.json").is_file()}
    assert set(entries) == {base, head}, entries
    shutil.rmtree(entries[head])  # main's job leaves base's side: the pull request's base is main's tip
    rows["pr-cold"]["entry_bytes"] = du(entries[base])
    archive = tmp / "guard-pr.tzst"
    pack(rows, "pr-pack", cache.parent, "pr", archive)
    shutil.rmtree(cache)
    unpack(rows, "pr-unpack", cache.parent, archive)
    only_pr()
    timed(rows, "pr-warm", pr, h.expect, env)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-uv", action="store_true")
    ap.add_argument("--skip-pr", action="store_true")
    ap.add_argument("--json", type=Path, help="write the rows here as well")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="warm-cache-"))
    rows: dict = {}
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    try:
        if not args.skip_uv:
            uv_rows(rows, tmp)
        if not args.skip_pr:
            pr_rows(rows, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    meta = {"started": started, "ended": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "cpus": os.cpu_count(), "machine": platform.processor() or platform.machine(),
            "uv": subprocess.run(["uv", "--version"], capture_output=True, text=True).stdout.strip()}
    print(f"\n{meta}")
    print(f"{'row':<10} {'wall (s)':>9}  load before -> after    size")
    for k, v in rows.items():
        size = next((f"{v[s] / 1e9:.3f} GB {s}" for s in ("archive_bytes", "entry_bytes", "venv_bytes") if s in v), "")
        print(f"{k:<10} {v['wall_s']:>9.1f}  {v['load_before']} -> {v['load_after']}  {size}")
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
