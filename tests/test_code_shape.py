"""The shape the project promises its readers: an examples-sized script, short functions, a README that fits a
screen and whose links resolve, and no file that cites what its users do not have."""

from __future__ import annotations

import ast
import re

import pytest
from conftest import ROOT

SOURCE_FILES = sorted(
    path
    for path in [*ROOT.glob("*.py"), *ROOT.glob("ifcl/**/*.py")]
    if ".venv" not in path.parts and "tests" not in path.parts and "benchmarks" not in path.parts
)
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]


def function_lengths(path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]


def test_run_ifcl_is_an_examples_sized_script():
    assert len((ROOT / "run_ifcl.py").read_text(encoding="utf-8").splitlines()) <= 500


@pytest.mark.parametrize("path", SOURCE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_function_is_longer_than_100_lines(path):
    long = [(name, length) for name, length in function_lengths(path) if length > 100]
    assert not long, f"{path.name}: {long}"


def test_the_readme_fits_a_screen_and_has_a_table_of_contents():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    assert "## Contents" in text


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(document):
    text = document.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    missing = [
        target
        for target in targets
        if "://" not in target and not target.startswith("mailto:") and not (document.parent / target).exists()
    ]
    assert not missing, f"{document.name} links to {missing}"


def test_nothing_cites_files_its_users_do_not_have():
    tracked = [*SOURCE_FILES, *DOCUMENTS, *ROOT.glob("tests/*.py"), *ROOT.glob("benchmarks/*.py")]
    forbidden = ("SPEC" + ".md", "../" + "shared")
    citing = [
        str(p.relative_to(ROOT)) for p in tracked if any(word in p.read_text(encoding="utf-8") for word in forbidden)
    ]
    assert not citing
