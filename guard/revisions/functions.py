"""Where a census function lives in a revision's source, and what a pull request added inside it.

The census names a function ``file:qualname`` (guard.measure.census); the source's syntax tree gives the
same qualified names Python gives code objects (``Outer.method``, ``f.<locals>.inner``), with the
lines each one spans, decorators included.
"""

from __future__ import annotations

import ast


def function_spans(source: str) -> dict[str, tuple[int, int]]:
    """qualname -> (first line, last line) for every function and class in ``source``; {} when it
    does not parse (or nests deeper than the parser goes: a pull request's source is its author's)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    spans: dict[str, tuple[int, int]] = {}
    # iteratively, children in source order: a 1500-term expression is as deep as the tree gets
    stack: list[tuple[ast.AST, str]] = [(tree, "")]
    while stack:
        node, prefix = stack.pop()
        later: list[tuple[ast.AST, str]] = []
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                first = min([d.lineno for d in child.decorator_list] + [child.lineno])
                spans.setdefault(name, (first, child.end_lineno or child.lineno))
                later.append((child, name + (".<locals>." if not isinstance(child, ast.ClassDef) else ".")))
            else:
                later.append((child, prefix))
        stack.extend(reversed(later))
    return spans


def lines_inside(source: str, qualname: str, added: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The added lines (head's numbering) that fall inside ``qualname``'s span in ``source``."""
    span = function_spans(source).get(qualname)
    if span is None:
        return []
    first, last = span
    return [(n, text) for n, text in added if first <= n <= last]
