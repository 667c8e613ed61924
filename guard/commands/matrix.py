"""``--model NAME|all`` for ``guard check`` and ``guard pr``: the command's own flow, once per model.

NAME picks ``thresholds/<NAME>.yaml`` (guard.config.models). ``all`` runs every model in turn, each into
``OUTPUT/<name>/``, and prints one line per model. Every budget file is loaded before the first engine
starts, so a bad one is a configuration error (exit 2) before a minute is spent.

A model whose profile needs hardware this machine lacks (``engine.requires_native_bf16`` on a CPU
without native bf16), or, in ``all``, that has no profile of the name ``--profile`` gives, is **not
run**: said so on its line, exit 6 ("not measurable here"), never a pass and never a regression.

The exit code of ``all`` is the worst model's, in this order: internal error (5) > usage or
configuration error (2) > invalid run (3) > regression (1) > not run here (6) > pass (0). A crash or
an invalid run is never hidden behind another model's pass, and never reads as a regression.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from guard.config import models
from guard.config.budgets import DEFAULT_THRESHOLDS
from guard.config.loading import load_thresholds
from guard.edge import exit_code_for
from guard.errors import ExitCode, GuardError, UsageError
from guard.files import write_text_atomic
from guard.measure.hardware import detect
from guard.measure.fit import not_runnable_here

# worst first: the code `all` exits with is the first one any model had
PRECEDENCE = (ExitCode.INTERNAL, ExitCode.CONFIG, ExitCode.INVALID, ExitCode.REGRESSION,
              ExitCode.NOT_MEASURABLE, ExitCode.PASS)
WORDS = {ExitCode.PASS: "PASS", ExitCode.REGRESSION: "FAIL", ExitCode.CONFIG: "ERROR (usage or configuration)",
         ExitCode.INVALID: "INVALID", ExitCode.NOT_MEASURABLE: "NOT RUN", ExitCode.INTERNAL: "CRASH (internal error)"}


def add_model_argument(parser: argparse.ArgumentParser, auto: str = "") -> None:
    known = ", ".join(models.names())
    parser.add_argument("--model", default=None, metavar="NAME|all" + ("|auto" if auto else ""),
                        help=f"the model to guard: thresholds/NAME.yaml ({known}), or `all`: each in turn into "
                             f"OUTPUT/NAME/, one line per model{auto} (docs/model-matrix.md). Not with --thresholds")


@dataclasses.dataclass(frozen=True)
class Outcome:
    model: str
    code: int
    seconds: float
    output: Path
    note: str = ""


def combined_exit(codes: list[int]) -> int:
    """The worst code by PRECEDENCE; an unknown code counts as an internal error."""
    order = [int(c) for c in PRECEDENCE]
    return min((c if c in order else int(ExitCode.INTERNAL) for c in codes), key=order.index,
               default=int(ExitCode.PASS))


def run_models(args: argparse.Namespace, run_one: Callable[[argparse.Namespace], int], command: str,
               chosen: list[str] | None = None) -> int:
    """``guard <command> --model NAME|all``: ``run_one`` (the command's own flow) per model; ``chosen``:
    the models ``guard pr --model auto`` picked (each into its own folder, as ``all``)."""
    if args.thresholds != DEFAULT_THRESHOLDS:
        raise UsageError("give --model or --thresholds, not both",
                         hint=f"--model NAME reads thresholds/NAME.yaml; known models: {', '.join(models.names())}")
    selected = models.resolve(models.ALL if chosen is not None else args.model)
    if chosen is not None:
        selected = [(n, p) for n, p in selected if n in chosen]
    loaded = {name: load_thresholds(path) for name, path in selected}  # exit 2 here, before any engine
    hw = detect(quick=True)
    many = chosen is not None or models.canonical(args.model) == models.ALL
    if many and args.profile != "auto" and not any(args.profile in t.profiles for t in loaded.values()):
        raise UsageError(f"--profile {args.profile}: no model has a profile of that name",
                         hint="profiles: " + ", ".join(sorted({p for t in loaded.values() for p in t.profiles})))
    root = Path(args.output)
    outcomes: list[Outcome] = []
    for name, path in selected:
        output = root / name if many else root
        sub = argparse.Namespace(**{**vars(args), "model": None, "thresholds": str(path), "output": str(output)})
        if many:
            print(f"\n===== guard {command} --model {name} ({len(outcomes) + 1}/{len(selected)}) =====", flush=True)
        t0 = time.perf_counter()
        if many and args.profile != "auto" and args.profile not in loaded[name].profiles:
            skip = f"{path} has no profile '{args.profile}'"  # one model's line, not the end of the matrix
        else:
            skip = not_runnable_here(loaded[name], args.profile, hw)
        if skip:
            print(f"guard {command}: {name}: NOT RUN: {skip}; a model that cannot run here is never a pass (exit 6)",
                  flush=True)
            if not many:
                return int(ExitCode.NOT_MEASURABLE)
            outcomes.append(Outcome(name, int(ExitCode.NOT_MEASURABLE), 0.0, output, skip))
            _not_run(output, skip)
            continue
        if not many:
            return run_one(sub)
        outcomes.append(_run_guarded(name, sub, run_one, command, output, t0))
    code = combined_exit([o.code for o in outcomes])
    print()
    print(render_summary(command, outcomes, code))
    write_summary(root, command, outcomes, code)
    return code


def _run_guarded(name: str, sub: argparse.Namespace, run_one: Callable[[argparse.Namespace], int], command: str,
                 output: Path, t0: float) -> Outcome:
    """One model of `all`: its error is its own line, through the CLI's one edge (guard.edge), with a
    crash's traceback in the model's output folder; Ctrl-C still ends the matrix."""
    try:
        code, note = int(run_one(sub)), ""
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # noqa: BLE001 - mapped to its exit code by the one edge, not here
        crash_log = output / "crash.log"
        if not isinstance(exc, GuardError):
            output.mkdir(parents=True, exist_ok=True)
        code = exit_code_for(f"{command}: {name}", exc, [command, "--model", name], debug=False, crash_log=crash_log)
        note = str(exc).splitlines()[0][:200] if isinstance(exc, GuardError) else f"{type(exc).__name__}: {str(exc)[:160]}"
    return Outcome(name, code, time.perf_counter() - t0, output, note)


def render_summary(command: str, outcomes: list[Outcome], code: int) -> str:
    width = max((len(o.model) for o in outcomes), default=5)
    lines = [f"guard {command}: {len(outcomes)} model(s)"]
    for o in outcomes:
        word = WORDS.get(ExitCode(o.code), f"exit {o.code}") if o.code in {int(c) for c in ExitCode} else f"exit {o.code}"
        took = f"{o.seconds:5.0f} s" if o.seconds else "     -"
        lines.append(f"  {o.model:<{width}}  {word:<8}  exit {o.code}  {took}  {o.output}"
                     + (f"  ({o.note})" if o.note else ""))
    lines.append(f"exit {code}: the worst model's, by crash 5 > usage 2 > invalid 3 > regression 1 > not run 6 > pass 0")
    return "\n".join(lines)


def write_summary(root: Path, command: str, outcomes: list[Outcome], code: int) -> None:
    """OUTPUT/matrix.md: the summary as a table, for a job summary."""
    rows = [f"| `{o.model}` | {WORDS.get(ExitCode(o.code), o.code) if o.code in {int(c) for c in ExitCode} else o.code} "
            f"| {o.code} | {o.note.replace('|', '/')} |" for o in outcomes]
    text = "\n".join([f"## guard {command}, {len(outcomes)} model(s): exit {code}", "",
                      "| model | verdict | exit | note |", "|---|---|---|---|", *rows, ""])
    try:
        root.mkdir(parents=True, exist_ok=True)
        write_text_atomic(root / "matrix.md", text)
    except OSError as exc:
        raise UsageError(f"cannot write {root / 'matrix.md'}: {exc.strerror or exc}") from None


NOT_RUN = "not-run.txt"  # OUTPUT/<model>/: why this machine could not run the model (read by guard comment)


def _not_run(output: Path, why: str) -> None:
    try:
        output.mkdir(parents=True, exist_ok=True)
        write_text_atomic(output / NOT_RUN, why + "\n")
    except OSError as exc:
        raise UsageError(f"cannot write {output / NOT_RUN}: {exc.strerror or exc}") from None
