"""Run the perf suite on this machine and judge it against the budgets.

Stages: budgets (validated here, before a minute is spent) -> run and verdict (guard.measure.harness: the
run stage in a child process, then guard.judge.evaluate) -> report (terminal, results.json, report.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import urllib.parse
from pathlib import Path

from guard import __version__
from guard.model import format as fmt
from guard.config.budgets import DEFAULT_THRESHOLDS, ENGINE_MODES
from guard.config.loading import load_thresholds
from guard.measure.canary import LEGACY_MASK
from guard.errors import ConfigError, UsageError
from guard.measure.mutants import INJECTABLE
from guard.judge.evaluate import DEFAULT_OUTPUT, evaluate
from guard.config.census import read_baseline
from guard.measure.harness import profile_to_run, record_suite
from guard.measure.hardware import detect
from guard.judge.opnames import check_op_names
from guard.model.records import Measures
from guard.files import prepare_output
from guard.report.output import write_report
from guard.report.terminal import render_terminal, say_dtype
from guard.measure.inprocess import SLOW_ENCODER, parse_inject
from guard.commands.matrix import add_model_argument, run_models


def measures_of(only: str | None, server_url: str | None) -> Measures:
    """What a run measures, decided here once: the run stage, results.json and re-judging read it."""
    if only == Measures.OPS:
        return Measures.OPS
    return Measures.TTFT if server_url else Measures.BOTH  # a server guard did not start cannot be profiled


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", default="auto", help="hardware profile: auto (default), cpu, a10, ...")
    parser.add_argument("--thresholds", default=DEFAULT_THRESHOLDS, help="budget YAML (default: %(default)s)")
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help="folder for results.json, report.md, traces (default: %(default)s)")
    parser.add_argument("--inject", default=None, metavar="CANARY",
                        help=f"`{LEGACY_MASK}`: run with the pre-#49531 mask re-injected (the check must then fail); "
                             f"`mutant:NAME`: a source-level test edit of vLLM's vision path ({', '.join(INJECTABLE)}; "
                             f"docs/census.md); `{SLOW_ENCODER}:P%%` (A/B only): the candidate's vision encoder slowed "
                             "by P %% of TTFT, for sensitivity measurements")
    parser.add_argument("--baseline", default=None, metavar="PYTHON",
                        help="A/B mode: the python of an environment holding the baseline vLLM (guard need not be "
                             "installed there). Both engines run here in alternation and TTFT is judged as the "
                             "candidate/baseline ratio (budgets.ttft_vs_baseline_pct); see docs/ab.md")
    parser.add_argument("--fresh-baseline", action="store_true",
                        help="A/B mode: profile the baseline side's op counts again even when guard's cache holds "
                             "them for this baseline environment (docs/ab.md, \"The baseline's op counts\")")
    parser.add_argument("--engine-mode", choices=list(ENGINE_MODES), default=None,
                        help="measure TTFT through a `vllm serve` that guard starts (server) or the in-process "
                             "engine; default: the profile's engine.mode (docs/server-mode.md)")
    parser.add_argument("--server-url", default=None, metavar="URL",
                        help="measure an already running vLLM server (TTFT only; op budgets are not measured)")
    parser.add_argument("--only", choices=[Measures.OPS.value], default=None,
                        help="ops: the op budgets and the census only, no TTFT (one engine start, one profiled request "
                             "per image size): the fast local check")
    parser.add_argument("--traces", choices=["on-failure", "always"], default="on-failure",
                        help="save Chrome traces of the profiled requests only when an op budget fails (default), or always")
    add_model_argument(parser)


def _server_url(text: str) -> str:
    """--server-url as the client joins paths to it: http(s)://HOST[:PORT] and nothing else. A path,
    a query or credentials would be sent somewhere else than meant (and credentials end up in the
    report); an empty value must not quietly mean "start an engine here"."""
    hint = "e.g. --server-url http://127.0.0.1:8000"
    try:
        parts = urllib.parse.urlsplit(text.strip())
        port = parts.port  # a port that is not a number raises here
    except ValueError as exc:
        raise UsageError(f"--server-url {text!r}: not a URL guard can use ({exc})", hint=hint) from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--server-url {text!r}: expected an http(s) URL, http(s)://HOST[:PORT]", hint=hint)
    if parts.username is not None or parts.password is not None:
        raise UsageError("--server-url: credentials in the URL are not used, and would be printed in the report",
                         hint="give the server's address alone")
    if parts.path not in ("", "/") or parts.query or parts.fragment or any(c.isspace() for c in text.strip()):
        raise UsageError(f"--server-url {text!r}: give the server's root; guard adds /v1/models and "
                         "/v1/chat/completions itself", hint=hint)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme.lower()}://{host}" + (f":{port}" if port is not None else "")


def check_arguments(args: argparse.Namespace) -> argparse.Namespace:
    """Usage errors (exit 2) before a minute is spent; the arguments back as the run uses them
    (--server-url normalised, --baseline absolute), ``args`` itself unchanged."""
    args = argparse.Namespace(**vars(args))
    if args.inject is not None and args.inject not in (LEGACY_MASK, *INJECTABLE):
        try:
            parse_inject(args.inject)
        except UsageError:
            raise UsageError(f"bad --inject value {args.inject!r}",
                             hint=f"one of: {LEGACY_MASK}, {', '.join(INJECTABLE)}, or {SLOW_ENCODER}:P% "
                                  "(0 < P <= 100, with --baseline)") from None
        if args.baseline is None:
            raise UsageError(f"--inject {args.inject} slows the candidate against a baseline: it needs --baseline PYTHON",
                             hint=f"guard check --baseline /path/to/baseline-venv/bin/python --inject {args.inject}")
    if getattr(args, "only", None) is not None and (args.baseline is not None or args.server_url or args.engine_mode == "server"):
        raise UsageError("--only ops counts the in-process engine's operators alone: it cannot be combined with "
                         "--baseline, --server-url or --engine-mode server",
                         hint="to compare two vLLM revisions' op counts, use `guard pr --only ops`")
    if args.server_url is not None:
        args.server_url = _server_url(args.server_url)
    if not str(args.output).strip():
        raise UsageError("--output is empty", hint="name a folder, e.g. --output guard-results")
    if args.fresh_baseline and args.baseline is None:
        raise UsageError("--fresh-baseline re-profiles the baseline side of an A/B check: it needs --baseline PYTHON")
    if args.baseline is not None:
        found = shutil.which(args.baseline)
        if found is None or not os.access(found, os.X_OK):
            raise UsageError(f"--baseline {args.baseline}: no such executable",
                             hint="give the python of an environment holding the baseline vLLM, "
                                  "e.g. /tmp/baseline-venv/bin/python (docs/ab.md)")
        # absolute, as found from here (the worker runs in the output folder); not resolved: a
        # venv's python is a symlink, and following it would leave the venv
        args.baseline = os.path.abspath(found)
    return args


def run(args: argparse.Namespace) -> int:
    args = check_arguments(args)  # usage errors once, before any model runs
    if getattr(args, "model", None) is not None:
        return run_models(args, _run_one, "check")
    return _run_one(args)


def _run_one(args: argparse.Namespace) -> int:
    thresholds = load_thresholds(args.thresholds)
    hw = detect(quick=True)  # the suite's own detection (with torch) is recorded and re-checked
    if args.baseline is not None and (args.server_url or args.engine_mode == "server"):
        raise UsageError("A/B mode (--baseline) runs both engines in-process; it cannot be combined with server mode")
    if args.server_url and args.engine_mode == "in-process":
        raise UsageError("--server-url measures a server; it cannot be combined with --engine-mode in-process")
    profile = profile_to_run(thresholds, args.profile, hw, engine_mode=args.engine_mode, server_url=args.server_url)
    if args.inject and profile.engine.mode == "server":
        raise UsageError("--inject changes the in-process engine; a server runs its own copy of vLLM",
                         hint="prove the canary with `guard selftest`, or run `guard check --engine-mode in-process --inject ...`")
    output = Path(args.output).resolve()
    prepare_output(output)
    check_op_names(thresholds, profile)  # before the engine: a misspelt op would pass forever
    if args.baseline is not None:
        return run_ab_check(args, thresholds, profile, output)
    print(f"guard check: {thresholds.model}, profile '{profile.name}' on {hw.describe()}", flush=True)
    say_dtype(profile, "guard check")
    how = {"in-process": "the in-process engine", "server": f"the server at {args.server_url}" if args.server_url
           else "a `vllm serve` started by guard"}[profile.engine.mode]
    if args.only == Measures.OPS:
        if not profile.has_op_count_pass:
            raise UsageError(f"profile '{profile.name}' has no op budgets and no census: --only ops would judge nothing")
        print(f"guard check: op counts only: one profiled request per image size "
              f"({', '.join(map(fmt.size, profile.workload.profile_image_sizes))}), no TTFT", flush=True)
    else:
        print(f"guard check: {profile.workload.warmup_requests} warm-up + {profile.workload.requests} measured "
              f"requests at concurrency {profile.workload.concurrency} through {how}, then "
              + ("no op-count pass (a remote server's frames cannot be profiled)" if args.server_url
                 else "the op-count profile pass"), flush=True)

    t0 = time.perf_counter()
    census_baseline = read_baseline(profile.census)  # a malformed baseline stops here, before a minute is spent
    record = record_suite(thresholds, profile, output, measures=measures_of(args.only, args.server_url),
                          inject=args.inject, traces=args.traces, engine_mode=args.engine_mode,
                          server_url=args.server_url)
    results = evaluate(profile, record, guard_version=__version__, output=output, census_baseline=census_baseline)
    write_report(results, output, args.thresholds)
    print()
    print(render_terminal(results))
    print(f"guard check: {time.perf_counter() - t0:.0f} s; wrote {output / 'results.json'} and {output / 'report.md'}")
    return results.exit_code


def run_ab_check(args: argparse.Namespace, thresholds, profile, output: Path) -> int:
    """A/B mode: both engines in alternation (guard.measure.ab_run, in the run stage's child), judged by guard.judge.evaluate.evaluate_ab."""
    from guard.judge.evaluate import evaluate_ab
    from guard.measure.harness import SidePython, record_ab

    if not profile.ttft_vs_baseline_pct and not profile.tpot_vs_baseline_pct and not profile.ops:
        raise ConfigError(str(thresholds.path), profile.line, f"profiles.{profile.name}.budgets.ttft_vs_baseline_pct",
                          "A/B mode has nothing to judge: the profile has no ratio budget and no op budgets",
                          hint="add e.g. `ttft_vs_baseline_pct: {p50: 3}` under the profile's budgets")
    w = profile.workload
    print(f"guard check (A/B): {thresholds.model}, profile '{profile.name}'; candidate {sys.executable}, "
          f"baseline {args.baseline}", flush=True)
    say_dtype(profile, "guard check (A/B)")
    print(f"guard check (A/B): both engines start together; {w.warmup_requests} warm-up + {w.requests} measured "
          f"requests per side in alternating blocks of {w.concurrency} (ABBA), then the op-count pass on both", flush=True)
    t0 = time.perf_counter()
    # the baseline's interpreter may hold only vLLM: a worker hosts each side's engine
    record = record_ab(thresholds, profile, output, baseline=SidePython(args.baseline, has_guard=False),
                       inject=args.inject, fresh_baseline=args.fresh_baseline)
    results = evaluate_ab(profile, record, guard_version=__version__, output=output)
    write_report(results, output, args.thresholds)
    print()
    print(render_terminal(results))
    print(f"guard check (A/B): {time.perf_counter() - t0:.0f} s; wrote {output / 'results.json'} and {output / 'report.md'}")
    return results.exit_code
