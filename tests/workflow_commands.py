"""The `guard ...` commands the GitHub workflows run, as argument lists a test can run.

Tests that drive a command the way a workflow does build its arguments here, from the workflow
file itself, so the test runs what the workflow runs, flag for flag, and a flag added to the
workflow reaches the test without anyone copying it. tests/test_workflows.py checks that every
`guard` invocation in .github/workflows/ is driven that way by at least one test (issue #30: the
comment workflow's flags switch guard comment's trust policy on, and no test ran with them).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

WORKFLOWS = Path(__file__).resolve().parent.parent / ".github" / "workflows"
_CONDITIONAL = re.compile(r"\$\{(\w+):\+([^}]*)\}")  # ${VAR:+words}: the words when VAR is set and not empty
_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


@dataclass(frozen=True)
class Invocation:
    workflow: str  # file name under .github/workflows/
    step: str  # the step's name
    command: str  # guard's subcommand: check, comment, ...
    script: str  # the shell text from `guard <command>` to the end of its command line

    @property
    def variables(self) -> set[str]:
        return {a or b for a, b in _VARIABLE.findall(self.script)} | {v for v, _ in _CONDITIONAL.findall(self.script)}

    def argv(self, env: Mapping[str, str]) -> list[str]:
        """The arguments guard gets (from the subcommand on), as the step's shell expands them with
        ``env``; every variable the command uses must be given (a missing one is a KeyError)."""
        missing = self.variables - set(env)
        if missing:
            raise KeyError(f"{self.workflow} '{self.step}' uses {sorted(missing)}: give them")
        text = _CONDITIONAL.sub(lambda m: m.group(2) if env[m.group(1)] else "", self.script)
        words = shlex.split(text)
        assert words[0] == "guard", words
        return [_VARIABLE.sub(lambda m: env[m.group(1) or m.group(2)], w) for w in words[1:]]


def _commands(script: str) -> list[str]:
    """The shell commands of a step's script that run guard (a folded `>-` script is one line)."""
    out = []
    for line in script.replace("\\\n", " ").splitlines():
        m = re.search(r"(?:^|[\s;&|])(guard\s+[a-z][a-z-]*\b.*)$", line)
        if m:
            out.append(m.group(1).strip())
    return out


def guard_invocations() -> list[Invocation]:
    """Every `guard <command>` a workflow step runs, in file order."""
    found = []
    for path in sorted(WORKFLOWS.glob("*.yml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        for job in data.get("jobs", {}).values():
            for step in job.get("steps", []):
                for script in _commands(step.get("run", "")):
                    command = script.split()[1]
                    found.append(Invocation(path.name, step.get("name", ""), command, script))
    return found


def workflow_argv(workflow: str, command: str, env: Mapping[str, str], nth: int | None = None) -> list[str]:
    """``guard <command>``'s arguments as ``workflow`` runs them, expanded with ``env``. ``nth``: which
    of several invocations of that command, in file order (required when there is more than one)."""
    found = [i for i in guard_invocations() if i.workflow == workflow and i.command == command]
    if nth is None:
        [inv] = found
    else:
        inv = found[nth]
    return inv.argv(env)
