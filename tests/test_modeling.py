"""IFCLModel: fusion (Eq. 3), poolers, views, and save/load through remote code in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import ENGLISH, GERMAN

from modeling_ifcl import IFCLModel, mean_pool


@pytest.fixture(scope="module")
def model(tiny_encoder_dir, tiny_fraternal_dir) -> IFCLModel:
    return IFCLModel.from_encoder(
        str(tiny_encoder_dir), str(tiny_fraternal_dir), fusion_rate=0.3, queue_size=2, queue_batch_size=4
    )


def tokens(model: IFCLModel, english: list[str], german: list[str]):
    sentence = model.tokenizer(english, padding=True, return_tensors="pt")
    fraternal = model.fraternal_tokenizer(german, padding=True, return_tensors="pt")
    return sentence, fraternal


def test_fraternal_table_comes_from_the_fraternal_model(model, tiny_fraternal_dir):
    from transformers import AutoModel

    german = AutoModel.from_pretrained(tiny_fraternal_dir)
    assert torch.equal(model.fraternal_embeddings.weight, german.get_input_embeddings().weight)
    assert model.fraternal_projection.in_features == 24 and model.fraternal_projection.out_features == 32


def test_without_fraternal_model_bel_f_is_the_encoders_frozen_table(tiny_encoder_dir):
    """Both tables frozen (the default): a copy would never differ, so BEL_F is BEL_S itself, held once."""
    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0)
    assert model.fraternal_projection is None and model.fraternal_embeddings is None and model.shares_word_table
    ids = torch.tensor([[2, 5, 9, 3]])
    assert torch.equal(model.fraternal_word_embeddings(ids), model.get_input_embeddings()(ids))
    assert model.fraternal_tokenizer is model.tokenizer


def test_a_trained_table_gets_its_own_copy_also_when_loaded_from_a_shared_one(tiny_encoder_dir, tmp_path):
    trained = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0, freeze_word_embeddings=False)
    assert not trained.shares_word_table
    assert torch.equal(trained.fraternal_embeddings.weight, trained.get_input_embeddings().weight)
    assert trained.fraternal_embeddings.weight.data_ptr() != trained.get_input_embeddings().weight.data_ptr()

    IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0).save_pretrained(tmp_path / "shared")
    loaded = IFCLModel.from_pretrained(tmp_path / "shared", freeze_word_embeddings=False)
    assert torch.equal(loaded.fraternal_embeddings.weight, loaded.get_input_embeddings().weight)
    assert loaded.get_input_embeddings().weight.requires_grad
    with pytest.raises(ValueError, match="frozen word table"):
        shared = IFCLModel.from_pretrained(tmp_path / "shared")
        shared.config.freeze_fraternal_embeddings = False
        shared.freeze_word_tables()


def test_a_folder_without_the_queue_loads_with_an_empty_queue(tiny_encoder_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=2, queue_batch_size=4)
    model.queue.push(torch.randn(4, 32))
    model.save_pretrained(tmp_path / "saved")
    weights = load_file(tmp_path / "saved" / "model.safetensors")
    assert int(weights["queue.valid"].sum()) == 4
    save_file(
        {k: v for k, v in weights.items() if not k.startswith("queue.")}, tmp_path / "saved" / "model.safetensors"
    )
    loaded = IFCLModel.from_pretrained(tmp_path / "saved")
    assert len(loaded.queue) == 0 and int(loaded.queue.head) == -1


def test_fused_input_is_the_eq3_mix_padded_to_one_length(model):
    # Hand-made ids of different lengths: 3 real tokens + 1 pad, and 5 fraternal tokens.
    input_ids = torch.tensor([[2, 7, 3, 0]])
    attention_mask = torch.tensor([[1, 1, 1, 0]])
    fraternal_ids = torch.tensor([[2, 9, 11, 12, 3]])
    fraternal_mask = torch.tensor([[1, 1, 1, 1, 1]])
    words, fused, mask, union = model.fuse(input_ids, attention_mask, fraternal_ids, fraternal_mask)

    table = model.get_input_embeddings().weight
    fraternal_table = model.fraternal_embeddings.weight
    projection = model.fraternal_projection
    padded_ids = [2, 7, 3, 0, 0]  # right-padded with the encoder's pad id (0) to length 5
    for position in range(5):
        y = table[padded_ids[position]]
        y_minus = fraternal_table[fraternal_ids[0, position]] @ projection.weight.T + projection.bias
        expected = 0.3 * y + 0.7 * y_minus
        assert torch.allclose(fused[0, position], expected, atol=1e-6)
        assert torch.allclose(words[0, position], y)
    assert mask.tolist() == [[1, 1, 1, 0, 0]]
    assert union.tolist() == [[1, 1, 1, 1, 1]]  # the union of both masks


def test_union_mask_keeps_the_longer_side():
    from modeling_ifcl import pad_to_length

    a = pad_to_length(torch.tensor([[1, 1, 1, 1]]), 4, 0)
    b = pad_to_length(torch.tensor([[1, 1]]), 4, 0)
    assert (a.bool() | b.bool()).long().tolist() == [[1, 1, 1, 1]]


@pytest.mark.parametrize("pooler", ["cls", "cls_before_pooler", "avg", "avg_first_last", "avg_top2"])
def test_poolers_read_the_documented_hidden_states(tiny_encoder_dir, pooler):
    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0, eval_pooler_type=pooler).eval()
    batch = model.tokenizer(ENGLISH[:3], padding=True, return_tensors="pt")
    with torch.no_grad():
        states = model.encoder(**batch, output_hidden_states=True).hidden_states
        got = model(**batch).sentence_embedding
    mask = batch["attention_mask"]
    expected = {
        "cls": torch.tanh(states[-1][:, 0] @ model.mlp.dense.weight.T + model.mlp.dense.bias)
        if model.mlp is not None
        else None,
        "cls_before_pooler": states[-1][:, 0],
        "avg": mean_pool(states[-1], mask),
        "avg_first_last": mean_pool((states[1] + states[-1]) / 2, mask),
        "avg_top2": mean_pool((states[-2] + states[-1]) / 2, mask),
    }[pooler]
    assert torch.allclose(got, expected, atol=1e-6)


def test_mean_pool_ignores_padding():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    assert mean_pool(hidden, torch.tensor([[1, 1, 0]])).tolist() == [[2.0, 3.0]]


def test_stacked_and_separate_views_agree_without_dropout(model):
    sentence, fraternal = tokens(model, ENGLISH[:4], GERMAN[:4])
    model.eval()
    outputs = {}
    for stacked in (True, False):
        model.config.stack_views = stacked
        with torch.no_grad():
            outputs[stacked] = model(
                **sentence,
                fraternal_input_ids=fraternal["input_ids"],
                fraternal_attention_mask=fraternal["attention_mask"],
                return_twins=True,
            )
    model.config.stack_views = None
    for name in ("anchor", "identical", "fraternal", "anchor_embedding_output", "fraternal_embedding_output"):
        assert torch.allclose(outputs[True][name], outputs[False][name], atol=1e-5), name
    # Without dropout the identical twin is the anchor itself.
    assert torch.allclose(outputs[False].anchor, outputs[False].identical, atol=1e-6)


def test_dropout_makes_identical_twins_differ(model):
    sentence, _ = tokens(model, ENGLISH[:4], GERMAN[:4])
    model.train()
    twins = model(**sentence, return_twins=True)
    model.eval()
    assert twins.fraternal is None
    assert not torch.allclose(twins.anchor, twins.identical)


def test_encode_is_independent_of_batching_and_order(model):
    together = model.encode(ENGLISH, batch_size=5)
    alone = torch.stack([model.encode([sentence])[0] for sentence in ENGLISH])
    assert together.shape == (len(ENGLISH), 32)
    assert torch.allclose(together, alone, atol=1e-5)


def test_encode_restores_training_mode(model):
    model.train()
    model.encode(ENGLISH[:2])
    assert model.training
    model.eval()


def test_base_model_prefix_names_the_encoder_and_a_saved_model_loads_with_every_weight(model, tmp_path):
    assert model.base_model_prefix == "encoder" and model.base_model is model.encoder
    model.save_pretrained(tmp_path / "saved")
    loaded, info = IFCLModel.from_pretrained(tmp_path / "saved", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert loaded.base_model is loaded.encoder
    assert torch.allclose(loaded.encode(ENGLISH), model.encode(ENGLISH), atol=1e-6)


@pytest.mark.slow
def test_save_and_load_in_a_fresh_interpreter_gives_the_same_embeddings(model, tmp_path):
    folder = tmp_path / "saved"
    model.queue.push(torch.randn(4, 32))
    model.save_pretrained(folder)
    expected = model.encode(ENGLISH)
    torch.save(expected, tmp_path / "expected.pt")
    assert (folder / "modeling_ifcl.py").is_file() and (folder / "configuration_ifcl.py").is_file()
    assert (folder / "fraternal_tokenizer" / "tokenizer_config.json").is_file()

    script = textwrap.dedent(
        f"""
        import json, torch
        from transformers import AutoConfig, AutoModel
        model = AutoModel.from_pretrained({str(folder)!r}, trust_remote_code=True)
        embeddings = model.encode({ENGLISH!r})
        expected = torch.load({str(tmp_path / "expected.pt")!r})
        german = model.fraternal_tokenizer({GERMAN[:1]!r})["input_ids"]
        print(json.dumps({{
            "class": type(model).__name__,
            "module": type(model).__module__,
            "max_abs_diff": (embeddings - expected).abs().max().item(),
            "queue_entries": len(model.queue),
            "base_model_is_encoder": model.base_model is model.encoder,
            "fusion_rate": model.config.fusion_rate,
            "german_ids": german,
        }}))
        """
    )
    # A fresh interpreter that cannot import the project's files: only the saved folder's remote code.
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, env=_clean_env(), timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    import json

    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["class"] == "IFCLModel"
    assert report["module"].startswith("transformers_modules")
    assert report["max_abs_diff"] <= 1e-5
    assert report["queue_entries"] == 4
    assert report["base_model_is_encoder"]
    assert report["fusion_rate"] == 0.3
    assert report["german_ids"] == model.fraternal_tokenizer(GERMAN[:1])["input_ids"]


def _clean_env() -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"
    return env


@pytest.mark.parametrize("pooler", ["avg", "cls", "cls_before_pooler"])
def test_saved_folder_loads_with_sentence_transformers_and_embeds_the_same(tiny_encoder_dir, tmp_path, pooler):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0, pooler_type=pooler, eval_pooler_type=pooler)
    if model.mlp is not None:
        torch.nn.init.normal_(model.mlp.dense.weight)  # make the MLP matter
    model.save_pretrained(tmp_path / pooler)
    loaded = sentence_transformers.SentenceTransformer(str(tmp_path / pooler), device="cpu")
    ours = model.encode(ENGLISH)
    theirs = torch.as_tensor(loaded.encode(ENGLISH, batch_size=5))
    assert (ours - theirs).abs().max().item() <= 1e-5


def test_poolers_without_a_sentence_transformers_module_write_none(tiny_encoder_dir, tmp_path):
    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0, eval_pooler_type="avg_top2")
    model.save_pretrained(tmp_path / "top2")
    assert not (tmp_path / "top2" / "modules.json").exists()
    assert (tmp_path / "top2" / "modeling_ifcl.py").exists()


def test_a_folder_of_the_earlier_layout_loads_and_saves_in_this_one(tiny_encoder_dir, tmp_path):
    """Folders saved before config.json became the encoder's own: IFCL's config with the encoder's nested under
    encoder_config, the encoder's weights under ``encoder.``, a copy of the encoder's table as BEL_F."""
    import json

    from safetensors.torch import load_file, save_file

    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=2, queue_batch_size=4)
    model.save_pretrained(tmp_path / "new")
    flat = json.loads((tmp_path / "new" / "config.json").read_text())
    settings = {k: v for k, v in flat.pop("ifcl").items() if k != "encoder_prefix"}
    meta = {k: flat.pop(k) for k in ("architectures", "auto_map", "transformers_version")}
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "config.json").write_text(
        json.dumps({**meta, **settings, "model_type": "ifcl", "encoder_config": flat})
    )
    weights = {
        k.replace("bert.", "encoder.", 1): v for k, v in load_file(tmp_path / "new" / "model.safetensors").items()
    }
    weights["fraternal_embeddings.weight"] = weights["encoder.embeddings.word_embeddings.weight"].clone()
    save_file(weights, earlier / "model.safetensors", metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (earlier / name).write_bytes((tmp_path / "new" / name).read_bytes())

    loaded = IFCLModel.from_pretrained(earlier)
    assert loaded.encoder_prefix == "bert" and loaded.shares_word_table
    torch.testing.assert_close(loaded.encode(ENGLISH[:4]), model.encode(ENGLISH[:4]), atol=1e-6, rtol=0)
    loaded.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text())["model_type"] == "bert"
    again = load_file(tmp_path / "again" / "model.safetensors")
    assert "bert.embeddings.word_embeddings.weight" in again and not any(k.startswith("encoder.") for k in again)
