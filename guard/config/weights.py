"""Which commit of a Hugging Face model a run measures: a moving revision resolved once.

A profile may name its weights by a moving revision (``main``, a branch or a tag). The engine
would load whatever that name points to on the day, so guard resolves it to the commit, runs the
engine on that commit, and records both (results.json's ``environment.model_revision`` is the
commit, ``model_revision_requested`` the name as written); ``guard update-thresholds`` carries the
commit into the profile's provenance. ``guard weights`` does the same at download time.

The Hub is reached only through a *resolver*, ``(model, revision) -> commit``: ``hub_resolver``
asks huggingface_hub (``snapshot_download``: it returns ``.../snapshots/<commit>``; with
``local_files_only`` it reads the cache's ``refs/<revision>``, so an offline run resolves what was
downloaded). Tests pass a stub resolver; nothing here opens a connection by itself.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from pathlib import Path

from guard.config.budgets import EMBEDDED_PREFIX, Profile
from guard.errors import GuardError

COMMIT = re.compile(r"^[0-9a-f]{40}$")
Resolver = Callable[[str, str], str]  # (model, revision) -> 40-hex commit


def is_hub_model(model: str) -> bool:
    """A Hub repository id, not guard's embedded checkpoint or a local folder."""
    return not (model.startswith(EMBEDDED_PREFIX) or os.path.isabs(model) or os.path.isdir(model))


def needs_resolution(profile: Profile) -> bool:
    e = profile.engine
    return is_hub_model(e.model) and not (e.revision and COMMIT.match(e.revision))


def resolve(resolver: Resolver, model: str, revision: str) -> str:
    """``resolver(model, revision)``, its failure a GuardError (exit 2) naming the model: offline, a
    gated repository, a revision that does not exist, a full disk."""
    try:
        return resolver(model, revision)
    except GuardError:
        raise
    except Exception as exc:  # noqa: BLE001 - the Hub client's errors are many; each is "cannot resolve"
        raise GuardError(f"cannot resolve {model}@{revision} to a commit: {exc}",
                         hint="check the network and HF_TOKEN (a gated model needs one); where the Hub is off, "
                              "download the weights first (`guard weights --profile NAME` where it is on), "
                              "or pin engine.revision to a commit in the thresholds file") from None


def pin(profile: Profile, resolver: Resolver) -> Profile:
    """``profile`` with engine.revision the commit its moving revision points to now (unchanged when
    the model is embedded, local or already pinned by commit)."""
    if not needs_resolution(profile):
        return profile
    requested = profile.engine.revision or "main"
    commit = resolve(resolver, profile.engine.model, requested)
    if not COMMIT.match(commit or ""):
        raise GuardError(f"{profile.engine.model}@{requested} resolved to {commit!r}, not a 40-hex commit")
    engine = dataclasses.replace(profile.engine, revision=commit, requested_revision=requested)
    return dataclasses.replace(profile, engine=engine)


def hub_resolver(*, download: bool) -> Resolver:
    """The real resolver. ``download``: fetch the snapshot (the workflow's download step); otherwise
    only the local cache is read when the Hub is switched off (HF_HUB_OFFLINE=1), and the engine's
    own download happens as it would anyway."""

    def resolve(model: str, revision: str) -> str:
        from huggingface_hub import constants, snapshot_download

        offline = not download and bool(constants.HF_HUB_OFFLINE)
        return Path(snapshot_download(repo_id=model, revision=revision, local_files_only=offline)).name

    return resolve
