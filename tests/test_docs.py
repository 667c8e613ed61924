"""The docs say what the tree holds.

docs/architecture.md: its module table names every module under guard/ in the folder it sits in,
and nothing that is not there; its list of modules with a test file of their own is exactly those
with a ``tests/test_<name>.py`` that imports them. README.md and docs/: every relative link reaches
a file, and every ``#anchor`` a heading of that file (docs/campaigns/ holds what moved out of
docs/ab.md, so a moved section must not leave a dead link behind).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GUARD = REPO / "guard"
ARCHITECTURE = REPO / "docs" / "architecture.md"


# ----------------------------------------------------------------------------- docs/architecture.md
def table_rows() -> dict[str, set[str]]:
    """The module table: folder (relative to guard/, '' for guard/ itself) -> the names its row lists."""
    rows: dict[str, set[str]] = {}
    for line in ARCHITECTURE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[1].startswith("`guard/"):
            continue
        folder = cells[1].strip("`").removeprefix("guard").strip("/")
        assert folder not in rows, f"two rows for guard/{folder}"
        rows[folder] = set(re.findall(r"`([^`]+)`", cells[2]))
    return rows


def tree() -> dict[str, set[str]]:
    """What the table must list: each folder's modules (no __init__.py), schemas and, for a folder
    without modules (guard/models/), its entries."""
    out: dict[str, set[str]] = {}
    for folder in [GUARD, *sorted(p for p in GUARD.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))]:
        key = folder.relative_to(GUARD).as_posix().replace(".", "")
        names = {p.name for p in folder.iterdir() if p.is_file() and p.name != "__init__.py"
                 and (p.suffix == ".py" or p.name.endswith(".schema.json"))}
        if not names:  # a data folder: its entries, folders with a slash
            names = {p.name + ("/" if p.is_dir() else "") for p in folder.iterdir()
                     if not p.name.startswith(".") and p.name != "__pycache__"}
        out[key] = names
    return out


def test_the_architecture_table_lists_every_module_in_its_folder_and_nothing_else():
    rows, actual = table_rows(), tree()
    assert set(rows) == set(actual), f"folders in the table {sorted(rows)}, under guard/ {sorted(actual)}"
    for folder, names in actual.items():
        where = f"guard/{folder}".rstrip("/")
        assert names - rows[folder] == set(), f"{where}: not in docs/architecture.md's table: {sorted(names - rows[folder])}"
        assert rows[folder] - names == set(), f"{where}: the table names what is not there: {sorted(rows[folder] - names)}"


def modules() -> list[tuple[str, str]]:
    """(folder relative to guard/, module name) for every module."""
    return sorted((p.parent.relative_to(GUARD).as_posix().replace(".", ""), p.stem)
                  for p in GUARD.rglob("*.py") if p.name != "__init__.py" and "_" != p.parent.name[:1])


def imports(test: str, folder: str, name: str) -> bool:
    package = "guard" + (f".{folder}" if folder else "")
    return bool(re.search(rf"\b{re.escape(package)}\.{name}\b", test)
                or re.search(rf"from {re.escape(package)} import \(?[^)\n]*\b{name}\b", test))


def own_test_files() -> set[str]:
    """The modules, as `folder/name` (or `name` in guard/), with a tests/test_<name>.py importing them."""
    out = set()
    for folder, name in modules():
        test = REPO / "tests" / f"test_{name}.py"
        if test.exists() and imports(test.read_text(encoding="utf-8"), folder, name):
            out.add(f"{folder}/{name}" if folder else name)
    return out


def listed_with_own_test_files() -> set[str]:
    text = " ".join(ARCHITECTURE.read_text(encoding="utf-8").split())
    listed = re.search(r"have a test file named after them that imports them \(`tests/test_<name>\.py`\): (.*?)\. The rest",
                       text)
    assert listed, "docs/architecture.md no longer lists the modules that have a test file of their own"
    return set(re.findall(r"`([^`]+)`", listed.group(1)))


def test_the_architecture_doc_names_exactly_the_modules_with_a_test_file_of_their_own():
    listed, actual = listed_with_own_test_files(), own_test_files()
    assert actual - listed == set(), f"add to docs/architecture.md's list: {sorted(actual - listed)}"
    assert listed - actual == set(), f"no tests/test_<name>.py imports these: {sorted(listed - actual)}"


def test_the_import_check_sees_both_import_forms():
    assert imports("from guard.judge.ab import x", "judge", "ab")
    assert imports("from guard.revisions import git, overlay", "revisions", "overlay")
    assert imports("from guard import cli", "", "cli")
    assert not imports("from guard.judge.abc import x", "judge", "ab")
    assert not imports("from guard.measure import run", "judge", "run")


# ----------------------------------------------------------------------------- links and anchors
def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#{1,6} (.*)", line)
        if heading:
            s = slug(heading.group(1))
            out.add(s if s not in seen else f"{s}-{seen[s]}")
            seen[s] = seen.get(s, 0) + 1
    return out


DOCS = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_reaches_its_file_and_heading(doc):
    text = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no such heading")
    assert not broken, broken


def test_the_anchor_rule_is_githubs():
    assert slug("Freed memory and the VM's host") == "freed-memory-and-the-vms-host"
    assert slug("Confidence per look (`ab.confidence`)") == "confidence-per-look-abconfidence"
    assert slug("Live campaigns before freed memory was kept (30 November – 1 December)") == \
        "live-campaigns-before-freed-memory-was-kept-30-november--1-december"
