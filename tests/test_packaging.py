"""``pip install .``: the wheel holds the package ``ifcl`` and the four top-level modules, nothing else; one dependency
list (``evaluate`` in it); the STS metric inside the package; the library imports from outside the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT

TOP_LEVEL_MODULES = {"run_ifcl.py", "modeling_ifcl.py", "configuration_ifcl.py", "trainer_ifcl.py"}


def test_one_dependency_list():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["dynamic"] == ["dependencies", "version"]  # version: ifcl.__version__
    assert project["tool"]["setuptools"]["dynamic"]["dependencies"] == {"file": ["requirements.txt"]}
    assert not (ROOT / "requirements-dev.txt").exists()
    requirements = (ROOT / "requirements.txt").read_text(encoding="utf-8")
    assert any(line.startswith("evaluate") for line in requirements.splitlines())


def test_the_oldest_versions_pinned_are_the_floors():
    """Each package .ci/oldest.txt pins (the oldest versions the suite is run with) has that version as its floor, in
    requirements.txt and in pyproject.toml's extras wherever they name it."""
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    pinned = {}
    for line in (ROOT / ".ci" / "oldest.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            pinned[canonicalize_name(requirement.name)] = next(iter(requirement.specifier)).version
    lines = (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    lines += [line for extra in extras.values() for line in extra]
    floors = {}
    for line in lines:
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            name = canonicalize_name(requirement.name)
            if name in pinned:
                floors.setdefault(name, set()).update(s.version for s in requirement.specifier if s.operator == ">=")
    for name, version in pinned.items():
        assert floors.get(name), f"{name} is pinned in .ci/oldest.txt but has no floor"
        assert {Version(floor) for floor in floors[name]} == {Version(version)}, name


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("setuptools")
    folder = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(folder),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        cwd=folder,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    return next(folder.glob("ifcl-*.whl"))


@pytest.mark.slow
def test_the_wheel_holds_the_package_and_the_four_modules_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/", 1)[0] for name in names if not name.split("/", 1)[0].endswith(".dist-info")}
    assert top == {"ifcl", *TOP_LEVEL_MODULES}
    assert "ifcl/sts/metric/sts_spearman/sts_spearman.py" in names
    assert "ifcl/templates/model_card.md" in names
    metadata = next(name for name in names if name.endswith(".dist-info/METADATA"))
    requires = [
        line for line in zipfile.ZipFile(wheel).read(metadata).decode().splitlines() if "Requires-Dist" in line
    ]
    assert any(line.startswith("Requires-Dist: evaluate") for line in requires)
    assert any("sentence-transformers<7,>=6.0" in line and "extra ==" in line for line in requires), requires


@pytest.mark.slow
def test_the_installed_library_imports_and_registers_from_outside_the_checkout(wheel, tmp_path):
    target = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    code = f"""
import evaluate
from transformers import AutoConfig
import ifcl
from ifcl import IFCLConfig, IFCLModel, IFCLTrainer, STSEvaluator
assert ifcl.__file__.startswith({str(target)!r}), ifcl.__file__
assert type(AutoConfig.for_model("ifcl")) is IFCLConfig
metric = evaluate.load(ifcl.STS_METRIC_PATH)
print(metric.compute(predictions=[0.1, 0.5, 0.9], references=[1.0, 2.0, 4.0])["spearman"])
"""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH",)}
    env.update(PYTHONPATH=str(target), HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert shown.stdout.strip().endswith("100.0")
    for name in ("ifcl-train", "ifcl-evaluate-sts", "ifcl-prepare-fraternal"):
        assert (target / "bin" / name).is_file()


@pytest.mark.slow
def test_the_installed_commands_end_as_the_scripts_do(tiny_encoder_dir, pairs_data, tmp_path):
    """``ifcl-train`` (the set-up's editable install beside this Python): exit code 0 once done, and a bad setting's
    one line with exit code 2, as ``python run_ifcl.py``."""
    command = Path(sys.executable).parent / "ifcl-train"
    assert command.is_file(), "scripts/setup.sh installs the project's commands"
    sts = str(pairs_data / "sts.tsv")
    data = ["--train_file", str(pairs_data / "train.txt"), "--validation_file", sts, "--test_file", sts]
    args = [str(command), "--model_name_or_path", str(tiny_encoder_dir), *data]
    args += ["--per_device_train_batch_size", "4", "--max_seq_length", "16", "--queue_size", "0", "--use_cpu"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    bad = subprocess.run([*args, "--fusion_rate", "2"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("run_ifcl.py: error: fusion_rate"), bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    done = [*args, "--max_steps", "2", "--output_dir", str(tmp_path / "out")]
    finished = subprocess.run(done, capture_output=True, text=True, cwd=tmp_path, env=env)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert (tmp_path / "out" / "all_results.json").is_file() and "(<" not in finished.stdout  # no tuple printed
