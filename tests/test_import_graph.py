"""guard's modules import each other one way only.

A cycle works until someone moves an import, then fails at import time in whichever order the
entry point happens to load things; cycles hide in late (function-level) imports, so those count
here too, as do imports under ``if TYPE_CHECKING:`` (a layering arrow all the same).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

GUARD = Path(__file__).resolve().parent.parent / "guard"

# Cycles that are known and not yet broken, each as the sorted tuple of its modules, with why.
# Empty is the goal; the test fails on any cycle not named here.
KNOWN_CYCLES: dict[tuple[str, ...], str] = {}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(GUARD.rglob("*.py")):
        parts = list(path.relative_to(GUARD.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the guard modules it imports anywhere in its text (module level or in functions)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                # `from guard import format` imports the module guard.model.format; `from guard.x import y` imports guard.x
                targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in mods else module for a in node.names]
            graph[name] |= {t for t in targets if t in mods and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path a -> ... -> a) per strongly connected component of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan; guard is small enough for recursion
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_path_through(graph, comp) for comp in components]


def _path_through(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A shortest cycle from the component's first module back to itself, to name in the failure."""
    start = min(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & comp):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return path[::-1] + [start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(comp)


def test_no_import_cycle_among_guard_modules():
    found = {tuple(sorted(set(c))): " -> ".join(c) for c in cycles(import_graph())}
    new = {k: v for k, v in found.items() if k not in KNOWN_CYCLES}
    assert not new, "import cycles among guard's modules:\n  " + "\n  ".join(new.values())
    stale = set(KNOWN_CYCLES) - set(found)
    assert not stale, f"broken since, drop them from KNOWN_CYCLES: {sorted(stale)}"


def test_the_cycle_finder_finds_a_late_import_cycle():
    # the shape this test exists for: a -> b at module level, b -> a inside a function
    graph = {"guard.a": {"guard.b"}, "guard.b": {"guard.a"}, "guard.c": {"guard.a"}}
    assert cycles(graph) == [["guard.a", "guard.b", "guard.a"]]
    assert cycles({"guard.a": {"guard.b"}, "guard.b": set()}) == []


def test_the_graph_sees_late_and_from_package_imports():
    graph = import_graph()
    assert "guard.model.format" in graph["guard.judge.rules"]  # `from guard import format as fmt`
    assert "guard.model.environment" in graph["guard.model.format"]
    assert "guard.model.jsonfiles" in graph["guard.measure.worker"]  # imported inside functions only


def test_every_guard_module_imports_in_a_fresh_interpreter():
    names = sorted(_modules())
    code = "import importlib, sys\nfor n in sys.argv[1:]:\n    importlib.import_module(n)\n"
    done = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def test_measure_never_imports_judge():
    """The run stage measures until the verdict's own rule has decided, and is given that rule
    (guard.measure.stopping.StoppingRule, built from guard.judge by whoever starts the run: a
    command, guard.child, the pytest plugin) rather than importing it: not even a late import."""
    graph = import_graph()
    edges = {(m, t) for m, targets in graph.items() if m.startswith("guard.measure.")
             for t in targets if t.startswith("guard.judge.")}
    assert edges == set()


# The stages' order: config -> measure -> judge -> report -> publish (github), on the data model
# (guard.model) below them all. A stage imports only stages before it; the model imports none.
# Late imports count (import_graph sees them). Each edge still against the order is named here with
# why, and the test fails on a new one and on one that is gone (so this list only shrinks).
FORBIDDEN = {"model": ("config", "measure", "judge", "report", "history", "github", "commands", "revisions"),
             "config": ("measure", "judge", "report", "history", "github", "commands"),
             "measure": ("judge", "report", "history", "github", "commands"),
             "judge": ("report", "history", "github", "commands"),
             "report": ("measure", "history", "commands")}
KNOWN_BACK_IMPORTS: dict[tuple[str, str], str] = {}


def test_imports_follow_the_stage_order():
    graph = import_graph()
    stage = lambda m: m.split(".")[1] if m.count(".") >= 2 else None  # noqa: E731 - guard.<stage>.<module>
    edges = {(m, t) for m, targets in graph.items() for t in targets
             if stage(m) in FORBIDDEN and stage(t) in FORBIDDEN[stage(m)]}
    new = sorted(edges - set(KNOWN_BACK_IMPORTS))
    assert not new, "imports against config -> measure -> judge -> report -> publish:\n  " + "\n  ".join(map(str, new))
    gone = sorted(set(KNOWN_BACK_IMPORTS) - edges)
    assert not gone, f"no longer imported, drop them from KNOWN_BACK_IMPORTS: {gone}"


@pytest.mark.parametrize("command", ["bisect", "check", "comment", "history", "judge_finding", "pr", "record", "selftest",
                                     "schema", "update_thresholds", "weights"])
def test_an_argparse_namespace_stops_at_the_commands(command):
    """Each command turns its Namespace into typed values: the Namespace itself, passed on by name,
    reaches no function below guard/commands (benchmarks/call_trace.py reads the same)."""
    from tests.conftest import benchmark_script

    with benchmark_script("call_trace") as trace:
        modules = trace.graph(trace.load())
        reached = trace.follow(modules, (f"guard.commands.{command}", "run"), "args", itself=True)
    assert reached[0] == (f"guard.commands.{command}", "run")
    below = [f"{m}:{fn}" for m, fn in reached if not m.startswith(trace.EDGE)]
    assert below == [], below


# How a measured side is hosted (in the child's own process, in a worker, two workers for A/B) is
# decided by the harness and the child alone; a command or a revision's side says what to run in a
# RunSpec (guard.measure.harness) and never builds the hosts itself.
HOSTS = ("guard.measure.single_run", "guard.measure.ab_run", "guard.measure.worker")
HOSTED_BY = ("guard.child", "guard.measure.", "guard.pytest_plugin")  # the child, the run stage, the pytest suite


def test_only_the_harness_and_the_child_choose_how_a_side_is_hosted():
    graph = import_graph()
    edges = sorted((m, t) for m, targets in graph.items() for t in targets
                   if t in HOSTS and not m.startswith(HOSTED_BY))
    assert edges == [], "these build a side's host themselves; say what to run in a RunSpec instead:\n  " + \
        "\n  ".join(map(str, edges))
