"""``scripts/setup.sh``'s Debian assets (``scripts/debian_assets.sh``): installed when missing, and when they cannot
be, a non-zero exit with one line naming them, never a quiet "setup done"."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from conftest import ROOT


def assets(tmp_path: Path, apt_get_exit: int, **files: str) -> subprocess.CompletedProcess:
    """Run the assets script with a stand-in ``apt-get`` (which records its calls and exits ``apt_get_exit``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    apt_get = bin_dir / "apt-get"
    apt_get.write_text(
        f'#!/bin/sh\necho "$@" >> {tmp_path}/calls\necho "E: Unable to locate package"\nexit {apt_get_exit}\n'
    )
    apt_get.chmod(0o755)
    (bin_dir / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
    (bin_dir / "sudo").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", **files}
    script = ROOT / "scripts" / "debian_assets.sh"
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)


def test_a_failing_apt_get_stops_the_setup_naming_what_is_missing(tmp_path):
    present = tmp_path / "data.adj"
    present.write_text("")
    done = assets(tmp_path, 100, TRANS_DE_EN=str(tmp_path / "no-de-en"), WORDNET_ADJ=str(present))
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "trans-de-en" in lines[0] and "wordnet-base" not in lines[0], done.stderr
    assert "sudo apt-get update && sudo apt-get install -y trans-de-en" in lines[0]
    assert "install -y -qq trans-de-en" in (tmp_path / "calls").read_text()  # it tried, then said so


def test_present_assets_install_nothing(tmp_path):
    present = tmp_path / "present"
    present.write_text("")
    done = assets(tmp_path, 100, TRANS_DE_EN=str(present), WORDNET_ADJ=str(present))
    assert done.returncode == 0 and not done.stderr and not (tmp_path / "calls").exists()


def test_the_setup_runs_the_assets_script_under_set_e():
    setup = (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
    assert "set -euo pipefail" in setup and "\nbash scripts/debian_assets.sh" in setup
