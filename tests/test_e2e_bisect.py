"""End to end: `guard bisect` on the real engine, over an 8-commit history built at test time.

After good: commits that only touch comments (their census equals good's), a compiled-only commit
right where the search starts (skipped, never blamed), and one commit that adds a per-token
`.item()` loop (tests/pr_heads.py). The culprit must be named with its lines in at most
ceil(log2 8) + 1 = 4 profiled revisions, good included. Good is the
same `vllm/` tree as test_e2e_pr's base and both use the session's cache (conftest.engine_cache),
so whichever runs second reads its op counts from the cache.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.conftest import run_guard
from tests.pr_heads import HEADS, ITEM_FN, SAM
from tests.test_e2e import small_cpu_yaml
from tests.vllm_repo import build, commit, git

pytestmark = pytest.mark.engine

COMMITS = 8
CSRC_AT = 4  # 1-based: the first commit the search probes
LOOP_AT = 6


def history(root: Path) -> tuple[Path, str, str, str]:
    repo = build(root)
    good = git(repo, "rev-parse", "HEAD")
    culprit = ""
    for n in range(1, COMMITS + 1):
        if n == CSRC_AT:
            sha = commit(repo, "csrc: tune a kernel", files={"csrc/cache_kernels.cu": f"// tuned {n}\n"}, parent="HEAD")
        elif n == LOOP_AT:
            h = HEADS["item-loop"]
            sha = culprit = commit(repo, h.message, edits=h.edits, parent="HEAD")
        else:  # a Python change that changes no work: a comment
            text = (repo / SAM).read_text() + f"# note {n}\n"
            sha = commit(repo, f"deepencoder: note {n}", files={SAM: text}, parent="HEAD")
    return repo, good, sha, culprit


def test_bisect_names_the_loop_commit_in_log2_n_plus_one_profiled_revisions(tmp_path: Path, engine_cache: Path) -> None:
    repo, good, bad, culprit = history(tmp_path)
    out = tmp_path / "out"
    done = run_guard("bisect", "--vllm-repo", str(repo), "--good", good, "--bad", bad,
                     "--thresholds", str(small_cpu_yaml(tmp_path)), "--output", str(out),
                     "--cache-dir", str(engine_cache), timeout=2400)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    result = json.loads((out / "bisect.json").read_text())
    assert [c["sha"] for c in result["culprits"]] == [culprit]
    assert result["measured_revisions"] <= math.ceil(math.log2(COMMITS)) + 1
    skipped = [s for s in result["steps"] if s["state"] == "skip"]
    assert [s["subject"] for s in skipped] == ["csrc: tune a kernel"] and not skipped[0]["profiled"]
    assert any(f["function"] == ITEM_FN and any(".item()" in x["text"] for x in f["lines"]) for f in result["added_lines"])
    assert f"culprit: {culprit}" in done.stdout and ".item()" in done.stdout
    assert f"[{CSRC_AT}/{COMMITS}]" in done.stdout and "skip" in done.stdout  # each step is printed as it is decided
