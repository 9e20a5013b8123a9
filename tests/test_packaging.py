"""``pip install .``: the modules side by side, the objectives package under a name of its own, the scripts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT


def test_every_module_of_the_repository_root_is_packaged():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    root_modules = {path.stem for path in ROOT.glob("*.py")}
    assert set(settings["py-modules"]) == root_modules
    assert settings["packages"] == ["ifcl", "ifcl_objectives"]
    assert not (ROOT / "objectives").exists()  # no package under a generic top-level name


@pytest.mark.slow
def test_pip_install_gives_the_modules_and_the_scripts(tmp_path):
    pytest.importorskip("setuptools")
    target = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target",
         str(target), str(ROOT)],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    for name in ("modeling_ifcl.py", "configuration_ifcl.py", "run_ifcl.py", "ifcl_objectives/__init__.py"):
        assert (target / name).is_file(), name
    assert not (target / "objectives").exists() and not (target / "tests").exists()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    script = Path(target) / "bin" / "ifcl-train"
    shown = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "--fusion_rate" in shown.stdout and "--freeze_word_embeddings" in shown.stdout
    for name in ("ifcl-evaluate-sts", "ifcl-prepare-fraternal"):
        assert (Path(target) / "bin" / name).is_file()
