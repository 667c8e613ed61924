"""How far each guarded tiny checkpoint is from its real model: every code-path-deciding field where
they differ, and why (guard.config.structure, issue #58). Reads files only; starts no engine.

    uv run python benchmarks/structure_gap.py            # every model
    uv run python benchmarks/structure_gap.py gemma3     # one or more models
    uv run python benchmarks/structure_gap.py --kind "kept for cost"

The shipped checkpoints are real in structure: what differs is "kept for cost" (image and tile sizes
that keep one image within max_model_len 2048), "same code path" (width-only or unread fields) and
"real value not found" (awaiting a source). A "not yet real" line is a gap make_real_structured closes.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from guard.config import structure  # noqa: E402
from guard.config.models import canonical, names  # noqa: E402


def show(value: object, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", help="guarded model names (default: all)")
    parser.add_argument("--kind", help="only differences explained as this kind")
    args = parser.parse_args(argv)
    models = [canonical(m) for m in args.models] or names()
    kinds: Counter[str] = Counter()
    unexplained = 0
    for model in models:
        real = structure.real_record(model)
        found = [d for d in structure.differences(model)
                 if args.kind is None or (d.explanation and d.explanation.kind == args.kind)]
        print(f"\n{model}  (tiny: guard/models/{structure.tiny_folder(model).name}, real: {real['checkpoint']}, "
              f"read {real['read_on']})")
        print(f"  source: {real['source']}")
        if not found:
            print("  no difference")
        for d in found:
            kind = d.explanation.kind if d.explanation else "UNEXPLAINED"
            kinds[kind] += 1
            unexplained += d.explanation is None
            print(f"  {d.field}: tiny {show(d.tiny)}, real {show(d.real)}")
            print(f"      {kind}: {d.explanation.why if d.explanation else '-'}")
    print("\n" + ", ".join(f"{n} {k}" for k, n in kinds.most_common()) + f" across {len(models)} model(s)")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
