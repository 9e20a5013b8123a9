"""The ``evaluate`` metric ``ifcl/sts/metric/sts_spearman``: loaded offline from the package, the figures of
``STSEvaluator`` (the Trainer's evaluation), and hand-checked values on a 5-pair example."""

from __future__ import annotations

import ast
import math
import os
import subprocess
import sys
import warnings

import pytest
import torch
from conftest import ENGLISH, ROOT, write_sts_file
from torch.nn import functional as F

from ifcl.data import load_sts_file
from ifcl.sts.evaluator import STSEvaluator, sts_correlations

evaluate = pytest.importorskip("evaluate")

METRIC = ROOT / "ifcl" / "sts" / "metric" / "sts_spearman"

# 5 pairs; the references hold a tie (2.5 twice), so Spearman needs average ranks.
PREDICTIONS = [0.81, 0.12, 0.55, 0.93, 0.40]
REFERENCES = [4.2, 0.5, 2.5, 3.8, 2.5]
# scipy 1.17: spearmanr(PREDICTIONS, REFERENCES).statistic * 100, pearsonr(...).statistic * 100. By hand, Spearman
# is the Pearson correlation of the ranks (4, 1, 3, 5, 2) and (5, 1, 2.5, 4, 2.5): 8.5 / sqrt(10 · 9.5).
SPEARMAN = 87.2081599272381
PEARSON = 95.24270754767991


@pytest.fixture(scope="module")
def metric():
    return evaluate.load(str(METRIC), keep_in_memory=True)


def test_the_metric_is_a_real_file_of_the_package_that_imports_the_evaluators_code():
    import ifcl

    assert os.path.samefile(ifcl.STS_METRIC_PATH, METRIC)
    assert not any(path.is_symlink() for path in METRIC.iterdir())  # checkouts without symlinks load it too
    imports = [
        node
        for node in ast.walk(ast.parse((METRIC / "sts_spearman.py").read_text()))
        if isinstance(node, ast.ImportFrom)
    ]
    assert any(node.module == "ifcl.sts.evaluator" and node.names[0].name == "sts_correlations" for node in imports)


def test_five_pairs_by_hand(metric):
    results = metric.compute(predictions=PREDICTIONS, references=REFERENCES)
    assert set(results) == {"spearman", "pearson"}
    assert results["spearman"] == pytest.approx(SPEARMAN, abs=1e-9)
    assert results["spearman"] == pytest.approx(850 / math.sqrt(95), abs=1e-9)
    assert results["pearson"] == pytest.approx(PEARSON, abs=1e-9)
    assert results == sts_correlations(PREDICTIONS, REFERENCES)


def test_the_metric_gives_the_evaluators_figures_on_a_tiny_encoder(metric, tiny_model, tmp_path):
    write_sts_file(tmp_path / "sts.tsv")
    dataset = load_sts_file(tmp_path / "sts.tsv")  # what run_ifcl.py's --validation_file gives the Trainer
    evaluator = STSEvaluator.from_dataset(dataset, name="sts")
    expected = evaluator(tiny_model)  # what the Trainer logs as eval_sts_spearman / eval_sts_pearson
    assert math.isfinite(expected["spearman"]) and math.isfinite(expected["pearson"])

    similarities = evaluator.similarities(tiny_model)
    results = metric.compute(predictions=similarities, references=dataset["score"])
    assert results["spearman"] == pytest.approx(expected["spearman"], abs=1e-9)
    assert results["pearson"] == pytest.approx(expected["pearson"], abs=1e-9)

    # A user's own cosines (each column encoded on its own, other batches and padding): the same ranking.
    cosines = F.cosine_similarity(
        tiny_model.encode(dataset["sentence1"]), tiny_model.encode(dataset["sentence2"]), dim=-1
    )
    assert len(cosines) == len(ENGLISH)
    mine = metric.compute(predictions=cosines.tolist(), references=list(dataset["score"]))
    assert mine["spearman"] == pytest.approx(expected["spearman"], abs=1e-4)
    assert mine["pearson"] == pytest.approx(expected["pearson"], abs=1e-4)


class OneVector:
    """Embeds every sentence as the same vector: every cosine is the same."""

    def encode(self, sentences, batch_size=128, show_progress_bar=False, *, description=""):
        return torch.ones(len(sentences), 4)


@pytest.mark.parametrize(
    "predictions, references, encoder",
    [([0.5] * 5, REFERENCES, OneVector()), (PREDICTIONS, [3.0] * 5, None)],
    ids=["constant predictions", "constant references"],
)
def test_a_constant_input_gives_nan_as_the_evaluator_does(metric, tiny_model, predictions, references, encoder):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy's ConstantInputWarning
        results = metric.compute(predictions=predictions, references=references)
        evaluation = STSEvaluator(ENGLISH[:5], ENGLISH[5:10], references).evaluate(
            encoder or tiny_model, show_progress_bar=False
        )
    assert math.isnan(results["spearman"]) and math.isnan(results["pearson"])
    assert math.isnan(evaluation.spearman) and math.isnan(evaluation.pearson)


def test_fewer_than_two_pairs_or_unequal_numbers_are_refused(metric):
    with pytest.raises(ValueError, match="at least 2 pairs"):
        metric.compute(predictions=[0.5], references=[1.0])
    with pytest.raises(ValueError, match="Mismatch in the number of predictions"):
        metric.compute(predictions=[0.5, 0.2], references=[1.0])


def test_loads_offline_from_the_repository_and_from_anywhere(tmp_path):
    """A fresh interpreter, empty caches, HF offline switches on and a dead proxy: a network call would fail. The
    absolute path from another folder, the relative one from the repository root."""
    code = f"""
import os, sys, evaluate
os.chdir({str(tmp_path)!r})
metric = evaluate.load({str(METRIC)!r})
print(sys.modules[type(metric).__module__].sts_correlations.__module__)
print(metric.compute(predictions={PREDICTIONS}, references={REFERENCES}))
os.chdir({str(ROOT)!r})
print(evaluate.load("ifcl/sts/metric/sts_spearman").compute(predictions={PREDICTIONS}, references={REFERENCES}))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NO_PROXY", "no_proxy")}
    env.update(
        HF_HUB_OFFLINE="1",
        HF_EVALUATE_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf"),
        HF_MODULES_CACHE=str(tmp_path / "modules"),
        HF_METRICS_CACHE=str(tmp_path / "metrics"),
        HTTP_PROXY="http://127.0.0.1:9",
        HTTPS_PROXY="http://127.0.0.1:9",
        OMP_NUM_THREADS="1",
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300
    )
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    lines = loaded.stdout.splitlines()
    assert len(lines) == 3, loaded.stdout
    # The maths is the installed package's, the function STSEvaluator calls.
    assert lines[0] == "ifcl.sts.evaluator"
    for line in lines[1:]:
        assert ast.literal_eval(line) == pytest.approx({"spearman": SPEARMAN, "pearson": PEARSON}, abs=1e-9)
    assert (tmp_path / "modules" / "evaluate_modules" / "metrics" / "sts_spearman").is_dir()
