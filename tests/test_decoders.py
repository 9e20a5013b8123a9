"""Decoder-based embedders (Qwen2, Qwen3, Llama, Mistral, Gemma3) as IFCL encoders: the ``last`` pooler, an
end-of-sequence token appended where their tokenizer adds none, left-padded batches taken as right-padded ones, and a
training dropout where their config has none."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import (
    DECODER_TOKENIZERS,
    DECODERS,
    ENGLISH,
    GERMAN,
    LAST,
    build_tiny_decoder,
    cpu_training_args,
    saved_weight_names,
    st_training_args,
    without_dropout,
)
from datasets import Dataset

SENTENCE = "A man plays the guitar in the quiet library."


@pytest.mark.parametrize(
    "family, padding_side, lora",
    [(family, side, False) for family in DECODERS for side in ("left", "right")]
    + [(family, "left", True) for family in DECODERS],
    ids=lambda value: {False: "full", True: "lora"}.get(value, value) if isinstance(value, bool) else value,
)
def test_each_decoder_reads_bos_tokens_eos_trains_with_last_and_reloads_alike(
    family, padding_side, lora, tmp_path, caplog
):
    """A decoder whose tokenizer is shaped like its family's (BOS templates, byte-level, no pad token) reads a
    sentence as its base tokens plus one EOS, BOS first where the family has one, in training, in ``encode`` and
    through the published folder's tokenizer, ``AutoModel`` and ``SentenceTransformer`` views; two IFCL steps train
    every weight or the LoRA adapters alone (peft's q_proj and v_proj), and the folder (adapters merged) reloads
    embedding alike."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    from ifcl.lora import add_lora
    from ifcl.model import IFCLModel
    from trainer_ifcl import IFCLTrainer

    decoder = build_tiny_decoder(family, tmp_path / family, padding_side)
    base = AutoTokenizer.from_pretrained(decoder)
    expected = [*base(SENTENCE)["input_ids"], base.eos_token_id]
    bos = DECODER_TOKENIZERS[family][1]["bos"]
    assert (expected[0] == base.bos_token_id) == (bos is not None)
    assert expected.count(base.eos_token_id) == 1 + (base.eos_token_id == base.bos_token_id)

    model = IFCLModel.from_encoder(str(decoder), queue_size=2, **LAST)
    assert model.tokenizer(SENTENCE)["input_ids"] == expected
    assert model.tokenizer.pad_token is not None
    if lora:
        add_lora(model, r=4)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    data = Dataset.from_dict({"sentence": [SENTENCE, *ENGLISH[:7]], "fraternal": GERMAN[:8]})
    args = cpu_training_args(tmp_path / "run", per_device_train_batch_size=4, max_steps=2, learning_rate=1e-3)
    trainer = IFCLTrainer(model=model, args=args, train_dataset=data)
    assert "its dropout is 0.1 while training (--training_dropout)" in caplog.text
    assert trainer.train_dataset[0]["input_ids"] == expected[: LAST["max_seq_length"] - 1] + [expected[-1]]
    assert trainer.train_dataset[1]["input_ids"][-1] == base.eos_token_id
    trainer.train()
    changed = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    if lora:
        assert changed and all(".lora_B." in name or ".lora_A." in name for name in changed), changed
        assert {name.split(".")[-4] for name in changed} == {"q_proj", "v_proj"}
    else:
        assert any("layers.1.mlp" in name for name in changed)
    trained = model.encode(ENGLISH)
    trainer.save_model()

    folder = str(tmp_path / "run")
    assert AutoTokenizer.from_pretrained(folder)(SENTENCE)["input_ids"] == expected
    assert not {"adapter", "adapter_config.json", "adapter_model.safetensors"} & set(os.listdir(folder))
    assert not [name for name in saved_weight_names(tmp_path / "run") if "lora_" in name or "base_layer" in name]
    remote = AutoModel.from_pretrained(folder, trust_remote_code=True)
    assert remote.tokenizer(SENTENCE)["input_ids"] == expected
    assert (remote.encode(ENGLISH) - trained).abs().max() <= 1e-5
    # Gemma 3's tokenizer names a multimodal processor, which sentence-transformers would load: the folder of this
    # text model leaves it out.
    assert "processor_class" not in json.loads((tmp_path / "run" / "tokenizer_config.json").read_text())
    view = SentenceTransformer(folder, device="cpu")  # its own lasttoken pooling, the tokenizer as saved
    assert view.tokenize([SENTENCE])["input_ids"][0].tolist() == expected
    assert (view.encode(ENGLISH, convert_to_tensor=True) - trained).abs().max() <= 1e-5


def test_left_and_right_padded_batches_give_the_same_losses(tmp_path):
    """Fusion pairs token i of a sentence with token i of its translation, counted from each one's first token: a
    left-padded batch is moved to right padding first, so both give the same views and losses."""
    from ifcl.losses import IFCLTerms
    from ifcl.model import IFCLModel

    model = IFCLModel.from_encoder(str(build_tiny_decoder("qwen2", tmp_path / "qwen2")), queue_size=0, **LAST)
    without_dropout(model).eval()
    tokenizer, sentences, translations = model.tokenizer, ENGLISH[:4], GERMAN[:4]
    views = {}
    for side in ("left", "right"):
        tokenizer.padding_side = side
        batch = tokenizer(sentences, padding=True, return_tensors="pt")
        fraternal = tokenizer(translations, padding=True, return_tensors="pt")
        assert side == "right" or not bool(batch["attention_mask"][:, 0].all())  # really padded on the left
        views[side] = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            fraternal_input_ids=fraternal["input_ids"],
            fraternal_attention_mask=fraternal["attention_mask"],
            return_twins=True,
        )
    losses = {side: IFCLTerms()(twins)[0].item() for side, twins in views.items()}
    assert losses["left"] == pytest.approx(losses["right"], abs=1e-5)
    torch.testing.assert_close(views["left"].fraternal, views["right"].fraternal, atol=1e-5, rtol=0)


def test_a_decoder_trained_with_training_dropout_0_is_said_to_have_copied_twins(tmp_path, caplog):
    from datasets import Dataset as TextData

    from ifcl.model import IFCLModel
    from trainer_ifcl import IFCLTrainer

    model = IFCLModel.from_encoder(str(build_tiny_decoder("llama", tmp_path / "llama")), training_dropout=0.0, **LAST)
    args = cpu_training_args(tmp_path / "run", per_device_train_batch_size=4)
    data = TextData.from_dict({"sentence": ENGLISH[:8], "fraternal": GERMAN[:8]})
    IFCLTrainer(model=model, args=args, train_dataset=data)  # knowingly: the log says so
    assert "--training_dropout is 0: identical twins are exact copies of the anchors" in caplog.text


def decoder_sentence_transformer(family: str, folder: Path, padding_side: str = "left"):
    """A SentenceTransformer of a tiny decoder with sentence-transformers' own ``lasttoken`` pooling, its tokenizer
    padding on ``padding_side`` (left, as Qwen's and Llama's do)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    build_tiny_decoder(family, folder)
    if family == "gemma3":  # sentence-transformers loads a processor it names, which a text model has not
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        del config["processor_class"]
        (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    transformer = Transformer(str(folder), max_seq_length=16)
    transformer.tokenizer.padding_side = padding_side
    pooling = Pooling(transformer.get_embedding_dimension(), "lasttoken")
    return SentenceTransformer(modules=[transformer, pooling], device="cpu")


@pytest.mark.parametrize("family", list(DECODERS))
def test_each_decoder_trains_with_ifcl_loss_in_sentence_transformers(family, tmp_path, caplog):
    """The sentence-transformers route: IFCLLoss sets the training dropout the decoder lacks, a pad token where the
    tokenizer has none (Llama's, Mistral's) and, for its lasttoken pooling, the EOS once at the end of each sentence,
    and says so; it trains two steps, and the saved model reads and embeds as the trained one."""
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
    )
    from transformers import AutoTokenizer

    from ifcl.sentence_transformers_loss import IFCLLoss

    model = decoder_sentence_transformer(family, tmp_path / family)
    base = AutoTokenizer.from_pretrained(tmp_path / family)
    expected = [*base(SENTENCE)["input_ids"][: model.max_seq_length - 1], base.eos_token_id]  # truncated at 16
    loss = IFCLLoss(model, queue_size=2)
    assert "has no dropout: its dropout is 0.1 while training (training_dropout)" in caplog.text
    assert f"its tokenizer ends each sentence with {base.eos_token}" in caplog.text
    assert ("its tokenizer has no pad token" in caplog.text) == (base.pad_token is None)
    assert model.tokenize([SENTENCE])["input_ids"][0].tolist() == expected
    args = st_training_args(tmp_path / "st", per_device_train_batch_size=4, max_steps=2, learning_rate=1e-3)
    data = Dataset.from_dict(PAIRS := {"sentence": ENGLISH[:8], "fraternal": GERMAN[:8]})
    trainer = SentenceTransformerTrainer(
        model=model, args=args, train_dataset=data, loss=loss, data_collator=loss.data_collator(data)
    )
    before = model.encode(PAIRS["sentence"], convert_to_tensor=True)
    trainer.train()
    trained = model.encode(ENGLISH, convert_to_tensor=True)
    assert (model.encode(PAIRS["sentence"], convert_to_tensor=True) - before).abs().max() > 0
    model.save(str(tmp_path / "saved"))
    loaded = SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    assert loaded.tokenize([SENTENCE])["input_ids"][0].tolist() == expected
    assert (loaded.encode(ENGLISH, convert_to_tensor=True) - trained).abs().max() <= 1e-5


def test_ifcl_loss_gives_left_and_right_padded_batches_the_same_losses(tmp_path):
    from ifcl.sentence_transformers_loss import IFCLLoss

    losses = {}
    for side in ("left", "right"):
        model = decoder_sentence_transformer("llama", tmp_path / side, padding_side=side)
        loss = IFCLLoss(model, queue_size=0, training_dropout=0.0)
        features = [model.preprocess(ENGLISH[:4]), model.preprocess(GERMAN[:4])]
        assert side == "right" or not bool(features[0]["attention_mask"][:, 0].all())  # really padded on the left
        losses[side] = {name: term.item() for name, term in loss(features).items()}
    assert losses["left"] == pytest.approx(losses["right"], abs=1e-5)


def test_a_bert_template_takes_the_eos_once_at_the_end_even_truncated(tiny_encoder_dir):
    """A BERT-style template with an end-of-sequence token of its own: the EOS joins the template once, after
    [SEP], also when a sentence is truncated (a second template chained after it made the Rust library panic)."""
    from transformers import AutoTokenizer

    from ifcl.tokenization import fit_tokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_encoder_dir)
    tokenizer.eos_token = "[MASK]"  # a token of the vocabulary, standing in for an EOS of its own
    before = tokenizer(SENTENCE)["input_ids"]
    assert fit_tokenizer(tokenizer, end_with_eos=True) == [
        "its tokenizer ends each sentence with [MASK], which the last pooler reads"
    ]
    assert tokenizer(SENTENCE)["input_ids"] == [*before, tokenizer.eos_token_id]
    truncated = tokenizer(SENTENCE, truncation=True, max_length=6)["input_ids"]
    assert truncated == [*before[:4], tokenizer.sep_token_id, tokenizer.eos_token_id]
    assert fit_tokenizer(tokenizer, end_with_eos=True) == []  # once: it already ends with it
