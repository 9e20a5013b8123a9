"""The results tables of README.md and benchmarks/README.md are their JSON records: the text between each table's
markers is what its benchmark script's renderer (the function its ``--readme`` writes with) makes of the committed
record under benchmarks/results/, so a changed record or a hand edit of a figure fails here. Nothing trains or loads
a model: the renderers read the records only."""

from __future__ import annotations

import copy
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripts import each other as top-level modules (``import runs``)

import cached_step  # noqa: E402
import large_batches  # noqa: E402
import matryoshka  # noqa: E402
import objectives  # noqa: E402
import runs  # noqa: E402
import sweep  # noqa: E402


@dataclass(frozen=True)
class MarkedTable:
    """A table between two marker lines of a Markdown file, and what renders it from which record."""

    readme: str  # the Markdown file, relative to the repository
    start: str
    end: str
    record: str  # the record's name: benchmarks/results/<record>.json
    render: Callable[[dict], str]


TABLES = {
    "headline-table": MarkedTable(
        "README.md", objectives.HEADLINE_START, objectives.HEADLINE_END, "objectives", objectives.headline_text
    ),
    "large-batches-table": MarkedTable(
        "benchmarks/README.md",
        large_batches.README_START,
        large_batches.README_END,
        "large_batches",
        large_batches.readme_text,
    ),
    "cached-step-table": MarkedTable(
        "benchmarks/README.md",
        cached_step.README_START,
        cached_step.README_END,
        "cached_step",
        cached_step.readme_text,
    ),
    "matryoshka-table": MarkedTable(
        "benchmarks/README.md", matryoshka.README_START, matryoshka.README_END, "matryoshka", matryoshka.readme_text
    ),
    "objectives-table": MarkedTable(
        "benchmarks/README.md", objectives.README_START, objectives.README_END, "objectives", objectives.readme_text
    ),
    "equal-time-table": MarkedTable(
        "benchmarks/README.md",
        objectives.EQUAL_TIME_START,
        objectives.EQUAL_TIME_END,
        "objectives",
        objectives.equal_time_text,
    ),
    "sweep-table": MarkedTable(
        "benchmarks/README.md", sweep.README_START, sweep.README_END, "sweep", sweep.readme_text
    ),
}


def committed_readmes() -> dict[str, str]:
    """The committed text of each Markdown file that holds a table, by its path relative to the repository."""
    return {path: (ROOT / path).read_text(encoding="utf-8") for path in {table.readme for table in TABLES.values()}}


def committed_records() -> dict[str, dict]:
    """The committed JSON record of each table, by its name."""
    names = {table.record for table in TABLES.values()}
    return {name: json.loads((ROOT / "benchmarks" / "results" / f"{name}.json").read_text("utf-8")) for name in names}


def rendered_block(name: str, records: dict[str, dict]) -> str:
    """What lies between a table's markers when the table is its record: the rendered text on lines of its own, as
    ``runs.put_into_readme`` writes it."""
    table = TABLES[name]
    return f"\n{table.render(records[table.record])}\n"


def drifted_tables(readmes: dict[str, str], records: dict[str, dict]) -> list[str]:
    """The names of the tables whose text in ``readmes`` is not what their record in ``records`` renders."""
    return [
        name
        for name, table in TABLES.items()
        if runs.split_at_markers(readmes[table.readme], table.start, table.end)[1] != rendered_block(name, records)
    ]


def test_every_table_is_what_its_committed_record_renders():
    assert drifted_tables(committed_readmes(), committed_records()) == []


def edit_one_figure(readme: str, table: MarkedTable) -> str:
    """``readme`` with the last digit of a table's block changed (a figure of its last row)."""
    before, inside, after = runs.split_at_markers(readme, table.start, table.end)
    last = list(re.finditer(r"\d", inside))[-1]
    changed = inside[: last.start()] + str((int(last.group()) + 1) % 10) + inside[last.end() :]
    return f"{before}{table.start}{changed}{table.end}{after}"


@pytest.mark.parametrize("name", list(TABLES))
def test_a_hand_edit_of_one_figure_is_caught(name):
    table = TABLES[name]
    readmes = committed_readmes()
    readmes[table.readme] = edit_one_figure(readmes[table.readme], table)
    assert drifted_tables(readmes, committed_records()) == [name]


def test_a_changed_figure_of_a_record_is_caught():
    records = copy.deepcopy(committed_records())
    records["matryoshka"]["sizes"]["64"]["plain"]["dev"][0] += 0.01
    assert drifted_tables(committed_readmes(), records) == ["matryoshka-table"]
