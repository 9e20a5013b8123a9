"""Every Python block of the README and docs/ runs as written, as a user's own file in a folder of its own (the
installed package, no checkout on the path), offline. A block whose first line is ``# needs: hub`` or
``# needs: gpu`` is skipped here. Where a block reads the default run's folder, a tiny published model stands in."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import DEFAULT_RUN, ROOT

DOCUMENTS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "ifcl/sts/metric/sts_spearman/README.md",
]


def python_blocks() -> list[tuple[str, str]]:
    """(document:line, code) of every ```python block."""
    blocks = []
    for document in DOCUMENTS:
        text = document.read_text(encoding="utf-8")
        for match in re.finditer(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
            line = text.count("\n", 0, match.start()) + 1
            blocks.append((f"{document.relative_to(ROOT)}:{line}", match.group(1)))
    return blocks


BLOCKS = python_blocks()


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory, published_dir):
    """A folder of the user's own, holding a tiny published model where the default run would have saved one."""
    folder = tmp_path_factory.mktemp("user")
    shutil.copytree(published_dir, folder / DEFAULT_RUN)
    return folder


def test_the_documents_have_python_blocks():
    assert len(BLOCKS) >= 6 and any(name.startswith("README.md") for name, _ in BLOCKS)


@pytest.mark.slow
@pytest.mark.parametrize("name, code", BLOCKS, ids=[name for name, _ in BLOCKS])
def test_each_python_block_runs_as_written(name, code, user_folder):
    needs = re.match(r"# needs: (\w+)", code)
    if needs:
        pytest.skip(f"{name} needs the {needs.group(1)}")
    path = user_folder / "block.py"
    path.write_text(code, encoding="utf-8")
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, str(path)],
        cwd=user_folder,
        env={**environment, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"{name}\n{code}\n{result.stdout[-1500:]}{result.stderr[-3000:]}"
    for output_dir in re.findall(r'output_dir="([^"]+)"', code):  # a block that trains leaves its model there
        assert (user_folder / output_dir / "config.json").is_file(), f"{name}: nothing saved in {output_dir}"
