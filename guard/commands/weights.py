"""Download a profile's model weights, resolving a moving revision (``main``) to its commit.

The workflow's download step: ``guard weights --profile a10`` fetches the snapshot into the Hugging
Face cache (``HF_HOME``) and prints the commit it resolved; the measuring step then runs offline
and loads that same commit (guard.config.weights.pin reads it from the cache's ref). With
``--github-output`` the commit is also written as ``commit=<sha>`` to ``$GITHUB_OUTPUT``.
Exit 0 with nothing to do for an embedded or local model; 2 when the revision cannot be resolved.
"""

from __future__ import annotations

import argparse
import os

from guard.config.budgets import DEFAULT_THRESHOLDS
from guard.config.loading import load_thresholds
from guard.errors import ExitCode
from guard.config.weights import Resolver, hub_resolver, is_hub_model, pin, resolve
from guard.files import writing


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", required=True, help="the hardware profile whose weights to fetch")
    parser.add_argument("--thresholds", default=DEFAULT_THRESHOLDS, help="budget YAML (default: %(default)s)")
    parser.add_argument("--github-output", action="store_true",
                        help="also write commit=<sha> to the file $GITHUB_OUTPUT names (a workflow step's outputs)")


def run(args: argparse.Namespace) -> int:
    return fetch(thresholds=args.thresholds, profile=args.profile, github_output=args.github_output,
                 resolver=hub_resolver(download=True))


def fetch(*, thresholds: str, profile: str, github_output: bool, resolver: Resolver) -> int:
    prof = load_thresholds(thresholds).profile(profile)
    engine = prof.engine
    if not is_hub_model(engine.model):
        print(f"guard weights: {engine.model} is embedded or local: nothing to download")
        return ExitCode.PASS
    pinned = pin(prof, resolver)
    if pinned is prof:  # already a commit: download it as named
        resolve(resolver, engine.model, engine.revision)
    commit = pinned.engine.revision
    print(f"guard weights: {engine.model}@{engine.revision or 'main'} -> {commit}")
    if github_output and os.environ.get("GITHUB_OUTPUT"):
        with writing(os.environ["GITHUB_OUTPUT"], "GITHUB_OUTPUT"), open(os.environ["GITHUB_OUTPUT"], "a",
                                                                         encoding="utf-8") as out:
            out.write(f"commit={commit}\n")
    return ExitCode.PASS
