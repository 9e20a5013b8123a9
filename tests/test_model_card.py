"""The model card says what the run did: STS sets named as the run read them, library and tags that hold, the base
model's license and language, framework versions and the scale of the figures; it parses on the Hub's terms."""

from __future__ import annotations

import transformers
from huggingface_hub import ModelCard

from configuration_ifcl import IFCLConfig
from model_card_ifcl import BUILTIN_STSB, write_model_card

RESULTS = {"eval_stsb_spearman": 87.31, "test_stsb_spearman": 82.74, "init_test_stsb_spearman": 82.03}


def write(folder, **kwargs) -> ModelCard:
    path = write_model_card(str(folder), IFCLConfig(), RESULTS, model_name="you/ifcl-tiny", **kwargs)
    return ModelCard.load(path)


def test_a_users_own_sts_file_is_not_labelled_as_the_hubs_stsb(tmp_path):
    card = write(tmp_path, sts_sources={"eval": "/data/my_dev.tsv", "test": "/data/my_150_pairs.tsv"})
    assert "sentence-transformers/stsb" not in card.content
    results = {(r.dataset_split, r.dataset_type, r.dataset_name) for r in card.data.eval_results}
    assert results == {("validation", "stsb", "my_dev.tsv"), ("test", "stsb", "my_150_pairs.tsv")}
    assert "`stsb`: dev from my_dev.tsv, test from my_150_pairs.tsv." in card.text


def test_the_built_in_stsb_is_named_as_the_hubs_dataset(tmp_path):
    card = write(tmp_path, sts_sources={"eval": BUILTIN_STSB, "test": BUILTIN_STSB})
    assert {r.dataset_type for r in card.data.eval_results} == {"sentence-transformers/stsb"}
    test_result = next(r for r in card.data.eval_results if r.dataset_split == "test")
    assert test_result.metric_value == 82.74 and "× 100" in test_result.metric_name
    assert "so 82.74 is a correlation of 0.8274" in card.text


def test_unknown_sts_sources_use_the_task_name(tmp_path):
    card = write(tmp_path)
    assert {r.dataset_type for r in card.data.eval_results} == {"stsb"}


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
    assert "**Training data:** `trans-de-en`" in card.text
    assert "(apache-2.0 license)" in card.text
    assert f"- transformers: {transformers.__version__}" in card.text
    unknown = write(tmp_path / "unknown", base_model=str(tmp_path / "missing"))
    assert unknown.data.license is None and "not stated by the base model" in unknown.text
