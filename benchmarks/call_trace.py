"""How far a command's arguments travel: guard's static call graph from one entry function.

Follows ``args`` (or another parameter) of the entry function (default
``guard.commands.check:run``) through every call one of whose arguments is computed from it, depth
first in reading order, and prints:
- stops: the guard functions it reaches (each counted once);
- modules: the guard modules those live in;
- climbs: steps in that reading order from a module to one on a higher import layer (a module's
  layer is the length of the longest chain of guard imports below it, late imports included):
  the reader goes back up against the direction of the imports;
- the modules entered most often from another module;
- where ``args`` itself goes (the object passed on by name, not values computed from it), and
  whether any of those functions lies below the commands.

Static and approximate by design: calls are resolved through imports, ``module.attr`` calls,
same-module names and ``self.method``; calls through variables, callbacks and subprocesses (the
run stage in its child process, guard.child) are not followed. The same reading applied before and after a
change compares like with like.

    uv run --extra cpu python benchmarks/call_trace.py [module:function [parameter]]
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "guard"
EDGE = ("guard.commands", "guard.cli")  # where an argparse Namespace belongs


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def load() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text(), str(p)) for p in PACKAGE.rglob("*.py")
            if "_suite" not in p.parts}


def resolve_from(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    is_package = (PACKAGE / Path(*base[1:]) / "__init__.py").exists() if len(base) > 1 else True
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


class Module:
    """One module's imports (every one, late imports included) and its functions."""

    def __init__(self, name: str, tree: ast.Module, modules: set[str]) -> None:
        self.name = name
        self.aliases: dict[str, str] = {}  # local name -> module
        self.names: dict[str, tuple[str, str]] = {}  # local name -> (module, attribute)
        self.imports: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in modules:
                        self.imports.add(a.name)
                        self.aliases[a.asname or a.name] = a.name
            elif isinstance(node, ast.ImportFrom):
                source = resolve_from(name, node)
                for a in node.names:
                    full = f"{source}.{a.name}"
                    if full in modules:
                        self.imports.add(full)
                        self.aliases[a.asname or a.name] = full
                    elif source in modules:
                        self.imports.add(source)
                        self.names[a.asname or a.name] = (source, a.name)
        self.functions: dict[str, ast.AST] = {}
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                self.functions[node.name] = node  # calling a class runs its __init__
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self.functions[f"{node.name}.{item.name}"] = item


def graph(trees: dict[str, ast.Module]) -> dict[str, Module]:
    return {n: Module(n, t, set(trees)) for n, t in trees.items()}


def layers(modules: dict[str, Module]) -> dict[str, int]:
    @lru_cache(maxsize=None)
    def layer(name: str, seen: frozenset = frozenset()) -> int:
        below = [m for m in modules[name].imports if m in modules and m != name and m not in seen]
        return 1 + max((layer(m, seen | {name}) for m in below), default=-1)

    return {name: layer(name) for name in modules}


def params(node) -> list[str]:
    a = node.args
    return [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]


def tainted_names(node, seeds: set[str]) -> set[str]:
    """The names in a function that hold the argument or a value computed from it."""
    names = set(seeds)
    changed = True
    while changed:
        changed = False
        for n in ast.walk(node):
            if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and n.value is not None:
                if any(isinstance(x, ast.Name) and x.id in names for x in ast.walk(n.value)):
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                    for t in targets:
                        for x in ast.walk(t):
                            if isinstance(x, ast.Name) and x.id not in names:
                                names.add(x.id)
                                changed = True
    return names


def follow(modules, entry: tuple[str, str], seed: str, itself: bool = False) -> list[tuple[str, str]]:
    """The functions the argument ``seed`` of ``entry`` reaches, in reading order (depth first):
    a call is followed when one of its arguments is computed from a tainted name. ``itself``: only
    when an argument is the object itself, passed on by name (where the Namespace goes, not the
    values read from it)."""
    order: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()

    def visit(node_id: tuple[str, str], seeds: set[str]) -> None:
        if node_id in seen:
            return
        seen.add(node_id)
        order.append(node_id)
        mod = modules[node_id[0]]
        fn = mod.functions[node_id[1]]
        names = set(seeds) if itself else tainted_names(fn, seeds)
        cls = node_id[1].split(".")[0] if "." in node_id[1] else None
        for call in sorted((n for n in ast.walk(fn) if isinstance(n, ast.Call)), key=lambda c: (c.lineno, c.col_offset)):
            def carries(a) -> bool:
                if itself:
                    return isinstance(a, ast.Name) and a.id in names
                return any(isinstance(x, ast.Name) and x.id in names for x in ast.walk(a))

            hits = [i for i, a in enumerate(call.args) if carries(a)]
            kw = [k.arg for k in call.keywords if k.arg and carries(k.value)]
            if not hits and not kw:
                continue
            target = resolve(modules, mod, cls, call.func)
            if target is None:
                continue
            tnode = modules[target[0]].functions[target[1]]
            ps = params(tnode)
            if ps and ps[0] in ("self", "cls"):
                ps = ps[1:]
            visit(target, {ps[i] for i in hits if i < len(ps)} | {k for k in kw if k in ps})

    visit(entry, {seed})
    return order


def resolve(modules, mod: Module, cls: str | None, f) -> tuple[str, str] | None:
    found = None
    if isinstance(f, ast.Name):
        if f.id in mod.functions:
            found = (mod.name, f.id)
        elif f.id in mod.names:
            found = mod.names[f.id]
    elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        if f.value.id == "self" and cls and f"{cls}.{f.attr}" in mod.functions:
            found = (mod.name, f"{cls}.{f.attr}")
        elif f.value.id in mod.aliases:
            found = (mod.aliases[f.value.id], f.attr)
    if found is None or found[0] not in modules or found[1] not in modules[found[0]].functions:
        return None
    node = modules[found[0]].functions[found[1]]
    if isinstance(node, ast.ClassDef):
        init = f"{found[1]}.__init__"
        return (found[0], init) if init in modules[found[0]].functions else None
    return found


def main(entry: str = "guard.commands.check:run", seed: str = "args") -> int:
    modules = graph(load())
    layer = layers(modules)
    order = follow(modules, tuple(entry.split(":")), seed)
    mods = {m for m, _ in order}
    climbs = sum(1 for a, b in zip(order, order[1:]) if layer[b[0]] > layer[a[0]])
    entered: dict[str, int] = defaultdict(int)
    for a, b in zip(order, order[1:]):
        if a[0] != b[0]:
            entered[b[0]] += 1
    print(f"`{seed}` from {entry}: {len(order)} stops in {len(mods)} modules, "
          f"{climbs} climbs back up a layer (reading order)")
    stages: dict[str, int] = defaultdict(int)
    for m, _ in order:
        stages[m.split(".")[1] if m.count(".") > 1 else m.split(".")[-1]] += 1
    print("stops by stage folder: " + ", ".join(f"{s} {n}" for s, n in
                                               sorted(stages.items(), key=lambda kv: (-kv[1], kv[0]))))
    print("modules entered most often: " + ", ".join(f"{m} {n}" for m, n in
                                                 sorted(entered.items(), key=lambda kv: (-kv[1], kv[0]))[:6]))
    itself = follow(modules, tuple(entry.split(":")), seed, itself=True)
    below = sorted({f"{m}:{fn}" for m, fn in itself if not m.startswith(EDGE)})
    print(f"`{seed}` itself, passed on by name: {len(itself)} functions, "
          + (f"{len(below)} below the commands: {', '.join(below)}" if below else "none below the commands"))
    for m, fn in order:
        print(f"  L{layer[m]:<2} {m}:{fn}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
