"""No two sibling folders (or modules) import each other, at any depth; imports that exist only for
type checking aside; and every import of ours goes through the one namespace, ``kvgate.*``. The
layers themselves are the import-linter contract in pyproject.toml."""

from __future__ import annotations

import itertools
import re
import subprocess
from pathlib import Path

import grimp
import pytest

FOLDERS = ("gateway", "extproc", "policies", "simulator", "bench", "proto")
"""The root's folders, installed as ``kvgate.<folder>``."""
PACKAGES = (*(f"kvgate.{folder}" for folder in FOLDERS), "tests")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("kvgate", "tests", exclude_type_checking_imports=True)


def _imports(graph: grimp.ImportGraph, importer: str, imported: str) -> bool:
    """Whether ``importer`` or a module under it imports ``imported`` or a module under it."""
    sources = {importer} | graph.find_descendants(importer) if graph.find_children(importer) else {importer}
    targets = {imported} | graph.find_descendants(imported) if graph.find_children(imported) else {imported}
    return any(
        target in graph.find_modules_directly_imported_by(source) for source in sources for target in targets
    )


def _mutual_siblings(graph: grimp.ImportGraph, package: str) -> list[tuple[str, str]]:
    found = []
    children = sorted(graph.find_children(package))
    for first, second in itertools.combinations(children, 2):
        if _imports(graph, first, second) and _imports(graph, second, first):
            found.append((first, second))
    for child in children:
        if graph.find_children(child):
            found += _mutual_siblings(graph, child)
    return found


def test_no_two_siblings_import_each_other(graph: grimp.ImportGraph) -> None:
    cycles = [pair for package in PACKAGES for pair in _mutual_siblings(graph, package)]
    assert cycles == [], f"siblings importing each other: {cycles}"


def test_the_top_level_folders_form_no_cycle(graph: grimp.ImportGraph) -> None:
    pairs = [(a, b) for a, b in itertools.combinations(PACKAGES, 2)
             if _imports(graph, a, b) and _imports(graph, b, a)]
    assert pairs == []


def test_the_check_sees_a_cycle_when_there_is_one() -> None:
    graph = grimp.ImportGraph()
    for module in ("pkg", "pkg.a", "pkg.a.x", "pkg.b"):
        graph.add_module(module)
    graph.add_import(importer="pkg.a.x", imported="pkg.b", line_number=1, line_contents="import pkg.b")
    assert _mutual_siblings(graph, "pkg") == []
    graph.add_import(importer="pkg.b", imported="pkg.a", line_number=1, line_contents="import pkg.a")
    assert _mutual_siblings(graph, "pkg") == [("pkg.a", "pkg.b")]


def test_every_import_of_ours_names_the_kvgate_namespace() -> None:
    """``import gateway`` works only inside a checkout (its folder is on the path there): an
    installed kvgate has ``kvgate.gateway`` alone, so code that used the bare name would break."""
    bare = re.compile(rf"^\s*(from|import) ({'|'.join((*FOLDERS, 'kvgate_proto'))})(\.|\s|$)", re.MULTILINE)
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    found = [name for name in files if bare.search((ROOT / name).read_text(encoding="utf-8"))]
    assert found == []
