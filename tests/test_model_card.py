"""The model card says what the run did: STS sets named as the run read them, library and tags that hold, the base
model's license and language, framework versions and the scale of the figures; it parses on the Hub's terms."""

from __future__ import annotations

import transformers
from huggingface_hub import ModelCard

from configuration_ifcl import IFCLConfig
from ifcl.model_card import BUILTIN_STSB, write_model_card

RESULTS = {"eval_stsb_spearman": 87.31, "test_stsb_spearman": 82.74, "init_test_stsb_spearman": 82.03}


def write(folder, **kwargs) -> ModelCard:
    path = write_model_card(str(folder), IFCLConfig(), RESULTS, model_name="you/ifcl-tiny", **kwargs)
    return ModelCard.load(path)


def test_a_users_own_sts_file_is_not_labelled_as_the_hubs_stsb(tmp_path):
    card = write(tmp_path, sts_sources={"eval": "/data/my_dev.tsv", "test": "/data/my_150_pairs.tsv"})
    assert "sentence-transformers/stsb" not in card.content
    assert not card.data.eval_results  # a user's file has no Hub id: it stays in the card's table only
    assert "`stsb`: dev from my_dev.tsv, test from my_150_pairs.tsv." in card.text


def test_the_built_in_stsb_is_named_as_the_hubs_dataset(tmp_path):
    card = write(tmp_path, sts_sources={"eval": BUILTIN_STSB, "test": BUILTIN_STSB})
    assert {r.dataset_type for r in card.data.eval_results} == {"sentence-transformers/stsb"}
    test_result = next(r for r in card.data.eval_results if r.dataset_split == "test")
    assert test_result.metric_type == "spearman_cosine" and test_result.metric_value == 0.8274  # the 0–1 scale
    assert "82.74 is a correlation of 0.8274" in card.text and "| stsb | test | 82.03 | 82.74 |" in card.text


def test_unknown_sts_sources_give_no_hub_results(tmp_path):
    card = write(tmp_path)
    assert card.data.eval_results is None and "| stsb | dev |" in card.text


def test_library_and_tags_say_where_the_folder_loads(tmp_path):
    plain = write(tmp_path / "plain")
    assert plain.data.library_name == "transformers" and "sentence-transformers" not in plain.data.tags
    (tmp_path / "st").mkdir()
    (tmp_path / "st" / "modules.json").write_text("[]")
    with_view = write(tmp_path / "st")
    assert with_view.data.library_name == "sentence-transformers" and "sentence-transformers" in with_view.data.tags
    assert "from sentence_transformers import SentenceTransformer" in with_view.text


def test_license_and_language_come_from_the_base_models_card(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "README.md").write_text("---\nlicense: apache-2.0\nlanguage: en\n---\n# base\n", encoding="utf-8")
    card = write(tmp_path / "out", base_model="sentence-transformers/all-MiniLM-L6-v2", base_model_path=str(base),
                 dataset="trans-de-en")  # fmt: skip
    assert card.data.license == "apache-2.0" and card.data.language == "en"
    assert card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert "Debian's `trans-de-en` dictionary" in card.text and "GPL-2+ license" in card.text
    assert "(apache-2.0 license)" in card.text
    assert f"- transformers: {transformers.__version__}" in card.text
    unknown = write(tmp_path / "unknown", base_model=str(tmp_path / "missing"))
    assert unknown.data.license is None and "not stated by the base model" in unknown.text


def test_the_card_gives_the_steps_and_how_the_checkpoint_was_chosen(tmp_path):
    from transformers import TrainingArguments

    args = TrainingArguments(str(tmp_path), load_best_model_at_end=True, eval_strategy="steps", save_strategy="steps",
                             eval_steps=50, save_steps=50, metric_for_best_model="eval_stsb_spearman", report_to=[])  # fmt: skip
    path = write_model_card(str(tmp_path), IFCLConfig(), {**RESULTS, "train_steps": 200}, training_args=args)
    text = ModelCard.load(path).text
    assert "200 optimizer steps" in text
    assert "the checkpoint with the best `eval_stsb_spearman` on the dev set (evaluated every 50 steps)" in text
