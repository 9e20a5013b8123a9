"""Every encoder family with a word-embedding table trains with IFCL, saves, and reloads with the same embeddings
through AutoModel (remote code) and sentence-transformers, a word table narrower than the hidden size included
(ELECTRA, ALBERT): tiny random encoders of nine families."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import ENGLISH, GERMAN, build_tokenizer
from datasets import Dataset
from transformers import AutoModel, TrainingArguments

SMALL = {"num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64}
# family: (config class name, its settings beyond SMALL, whether its tokenizer gives token type ids)
FAMILIES = {
    "bert": ("BertConfig", {"hidden_size": 32}, True),
    "roberta": ("RobertaConfig", {"hidden_size": 32, "type_vocab_size": 1}, False),
    "mpnet": ("MPNetConfig", {"hidden_size": 32}, False),
    "distilbert": ("DistilBertConfig", {"dim": 32, "hidden_dim": 64}, False),
    "xlm-roberta": ("XLMRobertaConfig", {"hidden_size": 32, "type_vocab_size": 1}, False),
    "deberta-v2": ("DebertaV2Config", {"hidden_size": 32, "type_vocab_size": 0}, False),
    "modernbert": ("ModernBertConfig", {"hidden_size": 32, "global_attn_every_n_layers": 2}, False),
    "electra": ("ElectraConfig", {"hidden_size": 32, "embedding_size": 16}, True),
    "albert": ("AlbertConfig", {"hidden_size": 32, "embedding_size": 16}, True),
}


def build_encoder(family: str, folder: Path) -> Path:
    """A random tiny encoder of ``family`` and a WordPiece tokenizer whose special ids its config uses."""
    import transformers

    config_class, settings, token_types = FAMILIES[family]
    tokenizer = build_tokenizer(ENGLISH + GERMAN)
    if not token_types:
        tokenizer.model_input_names = ["input_ids", "attention_mask"]
    special = {"pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.cls_token_id}
    special["eos_token_id"] = tokenizer.sep_token_id
    config = getattr(transformers, config_class)(vocab_size=len(tokenizer), **SMALL, **settings, **special)
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_trains_saves_and_reloads_alike(family, tmp_path):
    from ifcl.objectives.ifcl import WITHOUT_IFCL  # noqa: F401 (the registry must import)
    from modeling_ifcl import IFCLModel
    from trainer_ifcl import IFCLTrainer

    encoder = build_encoder(family, tmp_path / family)
    model = IFCLModel.from_encoder(str(encoder), queue_size=2, max_seq_length=16)
    assert model.hidden_size == 32  # the sentence embeddings' width, whatever the word table's
    data = Dataset.from_dict({"sentence": ENGLISH[:8], "fraternal": GERMAN[:8]})
    args = TrainingArguments(
        str(tmp_path / "run"),
        per_device_train_batch_size=4,
        max_steps=2,
        use_cpu=True,
        report_to=[],
        learning_rate=1e-3,
        save_strategy="no",
    )
    trainer = IFCLTrainer(model=model, args=args, train_dataset=data)
    before = model.encode(ENGLISH)
    trainer.train()
    losses = [entry["train_loss"] for entry in trainer.state.log_history if "train_loss" in entry]
    assert losses and torch.isfinite(torch.tensor(losses)).all()
    trained = model.encode(ENGLISH)
    assert (trained - before).abs().max() > 0  # it trained
    trainer.save_model()

    folder = str(tmp_path / "run")
    remote = AutoModel.from_pretrained(folder, trust_remote_code=True)
    assert (remote.encode(ENGLISH) - trained).abs().max() <= 1e-5
    sentence_transformers = pytest.importorskip("sentence_transformers")
    view = sentence_transformers.SentenceTransformer(folder, device="cpu")
    embeddings = view.encode(ENGLISH, convert_to_tensor=True)
    assert (embeddings - trained).abs().max() <= 1e-5
