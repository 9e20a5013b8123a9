"""Every encoder family with a word-embedding table trains with IFCL, saves, and reloads with the same embeddings
through AutoModel (remote code) and sentence-transformers, a word table narrower than the hidden size included
(ELECTRA, ALBERT): tiny random encoders of nine families."""

from __future__ import annotations

import pytest
import torch
from conftest import ENGLISH, FAMILIES, GERMAN, build_tiny_encoder, cpu_training_args
from datasets import Dataset
from transformers import AutoModel


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_trains_saves_and_reloads_alike(family, tmp_path):
    from ifcl.model import IFCLModel
    from ifcl.objectives.base import WITHOUT_IFCL  # noqa: F401 (the registry must import)
    from trainer_ifcl import IFCLTrainer

    encoder = build_tiny_encoder(family, tmp_path / family)
    model = IFCLModel.from_encoder(str(encoder), queue_size=2, max_seq_length=16)
    assert model.hidden_size == 32  # the sentence embeddings' width, whatever the word table's
    data = Dataset.from_dict({"sentence": ENGLISH[:8], "fraternal": GERMAN[:8]})
    args = cpu_training_args(tmp_path / "run", per_device_train_batch_size=4, max_steps=2, learning_rate=1e-3)
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
