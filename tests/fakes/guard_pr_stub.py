"""`guard pr` where it would start the engine: writes a recorded real run's results.json instead.

Used by tests/test_reusable_workflows.py through its `uv` stub, only for the cases that would
profile vLLM (a pull request that changes vllm/). ``GUARD_PR_RECORDED`` names the recorded file
(tests/fixtures/runs/ or tests/fixtures/pr/); ``none`` means the run broke before writing results.
Exit codes are guard pr's own for the recorded verdict."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

EXIT = {"pass": 0, "regression": 1, "invalid": 3, "not_measurable": 6}


def main(argv: list[str]) -> int:
    assert argv[0] == "pr", argv
    p = argparse.ArgumentParser()
    for flag in ("--vllm-repo", "--base", "--head", "--profile", "--thresholds", "--output", "--only", "--model",
                 "--thresholds-in-repo"):
        p.add_argument(flag)
    args = p.parse_args(argv[1:])
    for rev in (args.base, args.head):  # the workflow must hand over revisions the checkout holds
        assert os.system(f"git -C {args.vllm_repo} cat-file -e {rev}^{{commit}}") == 0, rev
    recorded = os.environ["GUARD_PR_RECORDED"]
    if recorded == "none":
        print("guard pr stub: the engine died before results were written", file=sys.stderr)
        return 3
    out = Path(args.output)
    if args.model in ("auto", "all"):  # guard pr --model auto|all: each model it judged into OUTPUT/<model>/
        out = out / json.loads(Path(recorded).read_text(encoding="utf-8"))["run"]["model"]
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(recorded, out / "results.json")
    verdict = json.loads(Path(recorded).read_text(encoding="utf-8"))["verdict"]
    (out / "report.md").write_text(f"guard pr stub: recorded {Path(recorded).name} ({verdict})\n", encoding="utf-8")
    return EXIT[verdict]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
