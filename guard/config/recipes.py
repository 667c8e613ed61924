"""The commands guard prints for a person to run, one builder each.

Every printed command carries the flags it needs (``--profile``, ``--thresholds``, ``--only``) and
names files as a person at the repository's root does (``guard.files.person_path``), so that it
works where it is pasted: in another checkout, with a CI run's artifact unpacked into
``guard-results/`` at the root. Callers pass paths already in that form.
"""

from __future__ import annotations

ARTIFACT_RESULTS = "guard-results/results.json"  # where the comment tells people to unpack the artifact


def update_thresholds(results: str, thresholds: str, profile: str, only: str | None = None,
                      allow_increase: bool = False) -> str:
    return (f"guard update-thresholds --from {results} --profile {profile} --thresholds {thresholds}"
            + (f" --only {only}" if only else "") + (" --allow-increase" if allow_increase else ""))


def check(thresholds: str, profile: str, *, only: str | None = None, baseline: bool = False) -> str:
    return (f"guard check --profile {profile} --thresholds {thresholds}"
            + (f" --only {only}" if only else "") + (" --baseline /path/to/baseline-venv/bin/python" if baseline else ""))


def pr(base: str, head: str, thresholds: str, profile: str, *, only: str | None = None) -> str:
    return (f"guard pr --vllm-repo PATH --base {base} --head {head} --profile {profile} --thresholds {thresholds}"
            + (f" --only {only}" if only else ""))


def local_thresholds(thresholds: str) -> str:
    """Where the local-budget recipe puts its copy: beside the original, so the census baselines
    and anything else the file names by a relative path resolve for the copy too."""
    head, sep, _ = thresholds.rpartition("/")
    return f"{head}{sep}local.yaml"


def local_budget(results: str, thresholds: str, profile: str) -> list[str]:
    """A TTFT budget for this machine, made from this run: copy, update the copy, check against it."""
    local = local_thresholds(thresholds)
    return [f"cp {thresholds} {local}", update_thresholds(results, local, profile, only="ttft"),
            check(local, profile)]
