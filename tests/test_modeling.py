"""IFCLModel: fusion (Eq. 3), poolers, views, narrow word tables, and save/load (through remote code in a fresh
interpreter: test_sentence_transformers_view.py)."""

from __future__ import annotations

import importlib.util
import re

import pytest
import torch
from conftest import ENGLISH, GERMAN, build_tiny_encoder

from ifcl import queue as ring
from ifcl.model import IFCLModel
from ifcl.objectives import fit_model
from ifcl.publishing import save_published
from modeling_ifcl import mean_pool


def tokens(model: IFCLModel, english: list[str], german: list[str]):
    sentence = model.tokenizer(english, padding=True, return_tensors="pt")
    fraternal = model.fraternal_tokenizer(german, padding=True, return_tensors="pt")
    return sentence, fraternal


def test_the_projection_of_a_narrower_fraternal_table_starts_at_bel_s_scale(
    model, tiny_encoder_dir, tiny_fraternal_dir
):
    """BEL_F's projection (24 → 32 wide) starts orthogonal and scaled so that the projected table has BEL_S's mean and
    mean variance per dimension, in IFCLModel and IFCLLoss alike: the fraternal twins are not a fraction of the
    anchors' scale at the first step."""
    words = model.get_input_embeddings().weight.detach()
    losses = [model]
    if importlib.util.find_spec("sentence_transformers") is not None:
        from sentence_transformers import SentenceTransformer

        from ifcl import IFCLLoss

        loss = IFCLLoss(
            SentenceTransformer(str(tiny_encoder_dir), device="cpu"),
            fraternal_model_name_or_path=str(tiny_fraternal_dir),
        )
        losses.append(loss)
    for owner in losses:
        projected = owner.fraternal_projection(owner.fraternal_embeddings.weight).detach()
        torch.testing.assert_close(projected.mean(dim=0), words.mean(dim=0), atol=1e-4, rtol=0)
        torch.testing.assert_close(projected.var(dim=0).mean(), words.var(dim=0).mean(), atol=0, rtol=1e-3)
        weight = owner.fraternal_projection.weight.detach()
        gram = weight.T @ weight  # an orthogonal map, scaled: Wᵀ W is a multiple of the identity
        torch.testing.assert_close(gram, torch.eye(24) * gram.diagonal().mean(), atol=1e-4, rtol=0)


def test_fraternal_table_comes_from_the_fraternal_model(model, tiny_fraternal_dir):
    from transformers import AutoModel, AutoTokenizer

    german = AutoModel.from_pretrained(tiny_fraternal_dir)
    assert torch.equal(model.fraternal_embeddings.weight, german.get_input_embeddings().weight)
    assert model.fraternal_projection.in_features == 24 and model.fraternal_projection.out_features == 32
    # The fraternal model's tokenizer reads the fraternal text, and its pad id pads it.
    german_tokenizer = AutoTokenizer.from_pretrained(tiny_fraternal_dir)
    assert model.fraternal_tokenizer(GERMAN)["input_ids"] == german_tokenizer(GERMAN)["input_ids"]
    assert model.config.fraternal_pad_token_id == german_tokenizer.pad_token_id


def test_without_fraternal_model_bel_f_is_the_encoders_own_table(tiny_model):
    """Both tables frozen (the default): a copy would never differ, so BEL_F is BEL_S itself, held once."""
    assert tiny_model.config.shares_word_table
    assert tiny_model.fraternal_projection is None and tiny_model.fraternal_embeddings is None
    ids = torch.tensor([[2, 5, 9, 3]])
    assert torch.equal(tiny_model.fraternal_word_embeddings(ids), tiny_model.get_input_embeddings()(ids))
    assert tiny_model.fraternal_tokenizer is tiny_model.tokenizer


def test_a_trained_table_gets_its_own_copy_also_when_loaded_from_a_shared_one(tiny_encoder_dir, tmp_path):
    trained = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0, freeze_word_embeddings=False)
    assert not trained.config.shares_word_table
    assert torch.equal(trained.fraternal_embeddings.weight, trained.get_input_embeddings().weight)
    assert trained.fraternal_embeddings.weight.data_ptr() != trained.get_input_embeddings().weight.data_ptr()

    IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0).save_pretrained(tmp_path / "shared")
    loaded = IFCLModel.from_pretrained(tmp_path / "shared", freeze_word_embeddings=False)
    assert torch.equal(loaded.fraternal_embeddings.weight, loaded.get_input_embeddings().weight)
    fit_model(loaded)
    assert loaded.get_input_embeddings().weight.requires_grad
    assert not loaded.fraternal_embeddings.weight.requires_grad

    # A shared table whose settings change later gets its own copy too, trained as the settings now say.
    shared = IFCLModel.from_pretrained(tmp_path / "shared")
    fit_model(shared, freeze_fraternal_embeddings=False)
    assert shared.fraternal_embeddings is not None, "BEL_F is still BEL_S, which stays frozen"
    assert torch.equal(shared.fraternal_embeddings.weight, shared.get_input_embeddings().weight)
    assert shared.fraternal_embeddings.weight.requires_grad
    assert not shared.get_input_embeddings().weight.requires_grad


@pytest.mark.parametrize("fraternal", [False, True], ids=["BEL_F a trained copy of BEL_S", "fraternal model"])
def test_from_encoder_builds_the_model_around_the_loaded_encoder_with_one_fraternal_table(
    tiny_encoder_dir, tiny_fraternal_dir, monkeypatch, fraternal
):
    """No random encoder is built beside the loaded one, and BEL_F is built once, with its own values: the
    encoder's weights are the base's, BEL_F the fraternal model's table (or BEL_S's)."""
    from transformers import AutoModel

    import modeling_ifcl

    built = []
    table_of = modeling_ifcl.fraternal_word_table
    monkeypatch.setattr(modeling_ifcl, "fraternal_word_table", lambda *a, **k: built.append(a) or table_of(*a, **k))
    monkeypatch.setattr(AutoModel, "from_config", lambda *a, **k: pytest.fail("a random encoder was built"))
    fraternal_dir = str(tiny_fraternal_dir) if fraternal else None
    model = IFCLModel.from_encoder(str(tiny_encoder_dir), fraternal_dir, freeze_fraternal_embeddings=False)
    assert len(built) == 1
    monkeypatch.undo()
    base = AutoModel.from_pretrained(tiny_encoder_dir)
    for name, weight in base.state_dict().items():
        if not name.startswith("pooler."):
            assert torch.equal(model.encoder.state_dict()[name], weight), name
    source = AutoModel.from_pretrained(tiny_fraternal_dir) if fraternal else base
    assert torch.equal(model.fraternal_embeddings.weight, source.get_input_embeddings().weight)
    assert model.fraternal_embeddings.weight.requires_grad


def test_a_tokenizer_with_more_ids_than_the_word_table_is_one_line_before_any_weights_load(
    tiny_encoder_dir, tmp_path, monkeypatch
):
    """Tokens added without resizing the table, in the encoder's folder or the fraternal model's: run_ifcl.py's
    reader, from_encoder and the sentence-transformers loss name the folder and both sizes, before the first step
    would fail in the embedding lookup."""
    import shutil

    from transformers import AutoModel, AutoTokenizer

    from ifcl.model import StartingModel

    folder = tmp_path / "grown"
    shutil.copytree(tiny_encoder_dir, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_tokens(["<domain-term-1>", "<domain-term-2>"])
    tokenizer.save_pretrained(folder)
    message = f"{folder}: its tokenizer has {len(tokenizer)} ids, more than the {len(tokenizer) - 2} rows"
    monkeypatch.setattr(AutoModel, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    for load in (
        lambda: StartingModel.read(str(folder)),
        lambda: IFCLModel.from_encoder(str(folder)),
        lambda: IFCLModel.from_encoder(str(tiny_encoder_dir), str(folder)),
    ):
        with pytest.raises(ValueError, match=re.escape(message)) as error:
            load()
        assert "resize_token_embeddings" in str(error.value) and "\n" not in str(error.value)


def test_the_last_pooler_on_a_bert_tokenizer_reads_its_closing_sep_in_every_view(tiny_encoder_dir, tmp_path):
    """BERT's tokenizer ends every sentence with [SEP] and has no end-of-sequence token: the last pooler takes that
    [SEP], as sentence-transformers' lasttoken pooling does, the tokenizer left as it is."""
    import sentence_transformers

    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0, pooler_type="last", eval_pooler_type="last")
    ids = model.tokenizer(ENGLISH[:1])["input_ids"][0]
    assert model.tokenizer.convert_ids_to_tokens(ids)[-1] == "[SEP]" and ids.count(model.tokenizer.sep_token_id) == 1
    encoded = model.tokenizer(ENGLISH[:2], padding=True, return_tensors="pt")
    with torch.no_grad():
        states = model.encoder(**encoded).last_hidden_state
    last = encoded["attention_mask"].sum(dim=1) - 1
    torch.testing.assert_close(model.encode(ENGLISH[:2]), states[torch.arange(2), last], atol=1e-5, rtol=0)
    save_published(model, tmp_path / "published")
    view = sentence_transformers.SentenceTransformer(str(tmp_path / "published"), device="cpu")
    torch.testing.assert_close(view.encode(ENGLISH, convert_to_tensor=True), model.encode(ENGLISH), atol=1e-5, rtol=0)


def test_the_queue_is_saved_and_a_folder_without_it_loads_with_an_empty_queue(tiny_encoder_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=2, queue_batch_size=4)
    rows = torch.randn(4, 32)
    ring.push(model.queue, rows)
    model.save_pretrained(tmp_path / "saved")
    loaded = IFCLModel.from_pretrained(tmp_path / "saved")
    assert ring.size(loaded.queue) == 4 and torch.equal(ring.newest_first(loaded.queue)[0], rows)

    weights = load_file(tmp_path / "saved" / "model.safetensors")
    without_queue = {k: v for k, v in weights.items() if not k.startswith("queue.")}
    assert len(without_queue) == len(weights) - 3
    save_file(without_queue, tmp_path / "saved" / "model.safetensors")
    loaded = IFCLModel.from_pretrained(tmp_path / "saved")
    assert ring.size(loaded.queue) == 0 and int(loaded.queue.head) == -1


@pytest.mark.parametrize("stack", [True, False], ids=["stacked", "separate"])
def test_fused_input_is_the_eq3_mix_padded_to_one_length_with_the_union_of_the_masks(model, monkeypatch, stack):
    """What the encoder receives: the anchors' and identical twins' word embeddings BEL_S(x) and the fused
    ε·BEL_S(x) + (1−ε)·BEL_F(x⁻) (ε = 0.3), both right-padded to the longer side, attending to the union of the
    masks; in one call when stacked, else the twins at the sentences' own length and the fused view apart."""
    pad, fraternal_pad = model.encoder.config.pad_token_id, model.config.fraternal_pad_token_id
    # Row 0: 3 real tokens and a pad, against 5 fraternal tokens; row 1: 4 tokens, against 2 and 3 pads.
    input_ids = torch.tensor([[2, 7, 3, pad], [2, 7, 8, 3]])
    attention_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    fraternal_ids = torch.tensor([[2, 9, 11, 12, 3], [2, 3] + [fraternal_pad] * 3])
    fraternal_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    calls = []
    hook = model.encoder.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append((kwargs["inputs_embeds"], kwargs["attention_mask"])),
        with_kwargs=True,
    )
    monkeypatch.setattr(model.config, "stack_views", stack)
    try:
        with torch.no_grad():
            model(input_ids, attention_mask, None, fraternal_ids, fraternal_mask, return_twins=True)
    finally:
        hook.remove()

    table, fraternal_table = model.get_input_embeddings().weight, model.fraternal_embeddings.weight
    projection = model.fraternal_projection
    padded_ids = [[2, 7, 3, pad, pad], [2, 7, 8, 3, pad]]  # right-padded with the encoder's pad id to length 5
    words = table[torch.tensor(padded_ids)]
    y_minus = fraternal_table[fraternal_ids] @ projection.weight.T + projection.bias  # BEL_F(x⁻), projected
    fused = 0.3 * words + 0.7 * y_minus
    padded_mask = [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]]
    union = [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]  # the longer side of each row
    if stack:
        assert len(calls) == 1
        (embeds, mask), fused_embeds, fused_mask = calls[0], calls[0][0][4:], calls[0][1][4:]
        torch.testing.assert_close(embeds[:4], torch.cat([words, words]))
        assert mask[:4].tolist() == padded_mask * 2
    else:
        assert len(calls) == 2
        (embeds, mask), (fused_embeds, fused_mask) = calls
        torch.testing.assert_close(embeds, torch.cat([words[:, :4], words[:, :4]]))
        assert mask.tolist() == attention_mask.tolist() * 2
    torch.testing.assert_close(fused_embeds, fused, atol=1e-6, rtol=0)
    assert fused_mask.tolist() == union


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


def test_stacked_and_separate_views_agree_without_dropout(model, monkeypatch):
    sentence, fraternal = tokens(model, ENGLISH[:4], GERMAN[:4])
    model.eval()
    outputs = {}
    for stacked in (True, False):
        monkeypatch.setattr(model.config, "stack_views", stacked)
        with torch.no_grad():
            outputs[stacked] = model(
                **sentence,
                fraternal_input_ids=fraternal["input_ids"],
                fraternal_attention_mask=fraternal["attention_mask"],
                return_twins=True,
            )
    for name in ("anchor", "identical", "fraternal", "anchor_embedding_output", "fraternal_embedding_output"):
        assert torch.allclose(outputs[True][name], outputs[False][name], atol=1e-5), name
    # Without dropout the identical twin is the anchor itself.
    assert torch.allclose(outputs[False].anchor, outputs[False].identical, atol=1e-6)


def test_dropout_makes_identical_twins_differ(model):
    sentence, _ = tokens(model, ENGLISH[:4], GERMAN[:4])
    model.train()
    with torch.no_grad():
        twins = model(**sentence, return_twins=True)
    model.eval()
    assert twins.fraternal is None and twins.fraternal_embedding_output is None
    assert not torch.allclose(twins.anchor, twins.identical)


def test_encode_is_independent_of_batching_and_order(model):
    together = model.encode(ENGLISH, batch_size=5)
    alone = torch.stack([model.encode([sentence])[0] for sentence in ENGLISH])
    assert together.shape == (len(ENGLISH), 32)
    assert torch.allclose(together, alone, atol=1e-5)
    assert model.encode([]).shape == (0, 32) and model.encode([], convert_to_numpy=True).shape == (0, 32)


@pytest.mark.parametrize("training", [True, False])
def test_encode_restores_the_training_mode(model, training):
    model.train(training)
    model.encode(ENGLISH[:2])
    assert model.training is training
    model.eval()


def test_a_narrow_word_table_electra_style(tiny_fraternal_dir, tmp_path):
    """ELECTRA and ALBERT embed words narrower than their hidden states: the sentence embeddings have the encoder's
    width, and BEL_F (or its projection) the word table's."""
    folder = str(build_tiny_encoder("electra", tmp_path / "electra"))

    for settings, fraternal_width in (
        ({}, None),  # BEL_F is BEL_S itself
        ({"freeze_word_embeddings": False}, 16),  # a copy of BEL_S, no projection
        ({"fraternal_model_name_or_path": str(tiny_fraternal_dir)}, 24),  # projected to the word table's width
    ):
        model = IFCLModel.from_encoder(folder, queue_size=2, queue_batch_size=4, **settings).eval()
        assert model.hidden_size == 32 and model.queue.embeddings.shape == (2, 4, 32)
        table = model.fraternal_embeddings
        assert (table.embedding_dim if table is not None else None) == fraternal_width
        assert (model.fraternal_projection is not None) == (fraternal_width == 24)
        sentence, fraternal = tokens(model, ENGLISH[:3], GERMAN[:3])
        assert model.fraternal_word_embeddings(fraternal["input_ids"]).shape[-1] == 16
        with torch.no_grad():
            twins = model(
                **sentence,
                fraternal_input_ids=fraternal["input_ids"],
                fraternal_attention_mask=fraternal["attention_mask"],
                return_twins=True,
            )
        assert twins.anchor.shape == twins.fraternal.shape == (3, 32)
        assert twins.fraternal_embedding_output.shape == (3, 32)  # the embedding layer projects to the hidden width
        assert model.encode(ENGLISH[:3]).shape == (3, 32)


def test_base_model_prefix_names_the_encoder_and_a_saved_model_loads_with_every_weight(model, tmp_path):
    assert model.base_model_prefix == "encoder" and model.base_model is model.encoder
    save_published(model, tmp_path / "saved")
    loaded, info = IFCLModel.from_pretrained(tmp_path / "saved", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert loaded.base_model is loaded.encoder
    assert torch.allclose(loaded.encode(ENGLISH), model.encode(ENGLISH), atol=1e-6)


def test_save_pretrained_saves_the_tokenizers_and_every_loader_embeds_the_same(model, tmp_path):
    """Weights, config, remote code and the tokenizers (the fraternal one in ``fraternal_tokenizer/``), as
    sentence-transformers' ``save`` does; the sentence-transformers view belongs to the published folder
    (``save_published``). ``SentenceTransformer`` reads the plain folder as a Transformer and mean pooling: the avg
    pooler's embeddings."""
    from transformers import AutoModel

    from modeling_ifcl import FRATERNAL_TOKENIZER

    folder = tmp_path / "saved"
    model.save_pretrained(folder)
    files = sorted(path.name for path in folder.iterdir())
    assert files == [
        "config.json",
        "configuration_ifcl.py",
        FRATERNAL_TOKENIZER,
        "model.safetensors",
        "modeling_ifcl.py",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    expected = model.encode(ENGLISH)
    loaded = IFCLModel.from_pretrained(folder)
    assert loaded.fraternal_tokenizer(GERMAN)["input_ids"] == model.fraternal_tokenizer(GERMAN)["input_ids"]
    remote = AutoModel.from_pretrained(folder, trust_remote_code=True)
    assert type(remote).__module__ != IFCLModel.__module__  # the folder's own code
    embeddings = [loaded.encode(ENGLISH), remote.encode(ENGLISH)]
    sentence_transformers = pytest.importorskip("sentence_transformers")
    embeddings.append(
        torch.as_tensor(sentence_transformers.SentenceTransformer(str(folder), device="cpu").encode(ENGLISH))
    )
    for found in embeddings:
        assert (found - expected).abs().max().item() <= 1e-5

    other_ranks = tmp_path / "other_ranks"
    model.save_pretrained(other_ranks, is_main_process=False)  # transformers' other processes: nothing written
    assert not [path.name for path in other_ranks.iterdir()]


def test_the_attention_implementation_asked_for_is_the_encoders(tiny_encoder_dir, published_dir):
    """``attn_implementation`` reaches the encoder (the rest of the model has no attention), through
    ``from_encoder``, the package's loader and the folder's own code (where ``AutoModel`` hands it to the config);
    an unknown one is refused by transformers' own check, naming it."""
    from transformers import AutoModel

    expected = IFCLModel.from_pretrained(published_dir).encode(ENGLISH)
    assert IFCLModel.from_pretrained(published_dir).encoder.config._attn_implementation == "sdpa"  # BERT's default
    built = IFCLModel.from_encoder(str(tiny_encoder_dir), attn_implementation="eager")
    assert built.encoder.config._attn_implementation == "eager"
    for loader, options in ((IFCLModel, {}), (AutoModel, {"trust_remote_code": True})):
        model = loader.from_pretrained(published_dir, attn_implementation="eager", **options)
        assert model.encoder.config._attn_implementation == "eager"
        assert torch.allclose(model.encode(ENGLISH), expected, atol=1e-5)
    with pytest.raises(ValueError, match='attn_implementation="no_such_attention"'):
        IFCLModel.from_pretrained(published_dir, attn_implementation="no_such_attention")


def test_save_pretrained_pushes_the_folder_with_its_tokenizer(tiny_model, tmp_path, monkeypatch):
    """transformers would upload the folder before the tokenizer is in it: ``push_to_hub`` saves and pushes both."""
    pushed = []
    monkeypatch.setattr(IFCLModel, "push_to_hub", lambda self, repo_id, **options: pushed.append((repo_id, options)))
    tiny_model.save_pretrained(tmp_path / "saved", push_to_hub=True, commit_message="first", private=True)
    assert pushed == [("saved", {"commit_message": "first", "private": True})]
    assert (tmp_path / "saved" / "tokenizer.json").is_file()


def test_a_folder_without_its_tokenizer_is_refused_by_every_loader(tiny_model, tiny_encoder_dir, tmp_path):
    """transformers would build a tokenizer from nothing, which reads every word as [UNK]: each loader names the
    folder instead, in one line, and a tokenizer.json that is not JSON by its path."""
    import shutil

    from transformers import AutoModel

    folder, plain = tmp_path / "saved", tmp_path / "plain"
    tiny_model.save_pretrained(folder)
    shutil.copytree(tiny_encoder_dir, plain)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
        (plain / name).unlink()
    for load, where in (
        (lambda: IFCLModel.from_pretrained(folder).tokenizer, folder),
        (lambda: AutoModel.from_pretrained(folder, trust_remote_code=True).encode(ENGLISH), folder),
        (lambda: IFCLModel.from_encoder(str(plain)), plain),
    ):
        with pytest.raises(OSError, match="holds no tokenizer files") as error:
            load()
        assert str(error.value).startswith(f"{where} holds") and "\n" not in str(error.value)

    shutil.copy(tiny_encoder_dir / "tokenizer_config.json", folder)
    (folder / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(OSError) as error:
        IFCLModel.from_pretrained(folder).encode(ENGLISH)
    assert str(error.value).startswith(f"{folder / 'tokenizer.json'} is not valid JSON")


@pytest.mark.parametrize("pooler", ["avg", "cls", "cls_before_pooler"])
def test_published_folder_loads_with_sentence_transformers_and_embeds_the_same(tiny_encoder_dir, tmp_path, pooler):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0, pooler_type=pooler, eval_pooler_type=pooler)
    if model.mlp is not None:
        torch.nn.init.normal_(model.mlp.dense.weight)  # make the MLP matter
    save_published(model, tmp_path / pooler)
    loaded = sentence_transformers.SentenceTransformer(str(tmp_path / pooler), device="cpu")
    ours = model.encode(ENGLISH)
    theirs = torch.as_tensor(loaded.encode(ENGLISH, batch_size=5))
    assert (ours - theirs).abs().max().item() <= 1e-5


def test_poolers_without_a_sentence_transformers_module_write_none(tiny_encoder_dir, tmp_path):
    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0, eval_pooler_type="avg_top2")
    save_published(model, tmp_path / "top2")
    assert not (tmp_path / "top2" / "modules.json").exists()
    assert (tmp_path / "top2" / "modeling_ifcl.py").exists() and (tmp_path / "top2" / "tokenizer.json").exists()
    loaded = IFCLModel.from_pretrained(tmp_path / "top2")
    assert torch.allclose(loaded.encode(ENGLISH[:4]), model.encode(ENGLISH[:4]), atol=1e-6)
