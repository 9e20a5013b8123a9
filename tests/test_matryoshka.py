"""Matryoshka sizes (``matryoshka_dims``) in the trainer route: every objective's contrastive terms summed over the cut
embeddings (the maths by hand is in test_losses.py), ConIsI refused, the STS figures of each size, and a run of
``run_ifcl.py --matryoshka_dims`` whose folder loads cut by sentence-transformers."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import ENGLISH, GERMAN, cpu_training_args, objective_run_args, without_dropout
from datasets import Dataset
from torch import nn

from ifcl.model import IFCLModel
from ifcl.objectives import objective_class
from trainer_ifcl import IFCLTrainer

PEER_SETTINGS = {"micse": {"micse_queue_size": 4, "micse_attention_layers": "top2"}, "pcl": {}, "simcse": {}}


# The terms summed over the sizes. ℓ^T and miCSE's attention term do not read the sentence embeddings' sizes: they
# are the same at each size, and counted at each, which keeps the objective's balance.
SIZE_FREE_TERMS = {"ifcl": {"loss_twins"}, "micse": {"loss_attention"}}
SIZED_TERMS = {
    "ifcl": {"loss_identical", "loss_fraternal"},
    "simcse": {"loss_contrastive"},
    "micse": {"loss_contrastive"},
    "pcl": {"loss_kl_peer_peer", "loss_kl_peer_main", "loss_contrastive_main", "loss_contrastive_peer"},
}


@pytest.mark.parametrize("name", list(SIZED_TERMS))
def test_each_objective_sums_its_terms_over_the_sizes(tiny_encoder_dir, tmp_path, name):
    """With dropout off, each sized term with sizes (W, 8) weighted (1, w) is the term at W plus w times the term at
    8 alone, on the same views; ℓ^T and miCSE's attention term are (1 + w) times their full-size value; the
    others (miCSE's mutual information, logged) are the full size's."""
    settings = {"objective": name, "objective_settings": PEER_SETTINGS.get(name, {}), "queue_size": 2}
    model = without_dropout(IFCLModel.from_encoder(str(tiny_encoder_dir), **settings))
    columns = {"sentence": ENGLISH[:8]} | ({"fraternal": GERMAN[:8]} if name == "ifcl" else {})
    args = cpu_training_args(tmp_path, per_device_train_batch_size=4)
    trainer = IFCLTrainer(model, args, train_dataset=Dataset.from_dict(columns))
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    width, cls = model.hidden_size, objective_class(name)

    def terms(dims, weights):
        model.config.matryoshka_dims, model.config.matryoshka_weights = list(dims), list(weights)
        torch.manual_seed(0)
        output = cls(model, trainer.objective.settings)(model, batch)
        return {term: value.item() for term, value in output.components.items()}

    both, full, cut = terms((width, 8), (1.0, 0.5)), terms((width,), (1.0,)), terms((8,), (1.0,))
    assert set(both) >= SIZED_TERMS[name] | SIZE_FREE_TERMS.get(name, set())
    for term, value in both.items():
        expected = full[term] + 0.5 * cut[term] if term in SIZED_TERMS[name] else full[term]
        if term in SIZE_FREE_TERMS.get(name, ()):
            expected = 1.5 * full[term]
        assert value == pytest.approx(expected, rel=1e-5, abs=1e-7), term
    assert any(cut[term] != pytest.approx(full[term], rel=1e-3) for term in SIZED_TERMS[name])


def test_conisi_refuses_sizes_naming_why(tiny_encoder_dir):
    model = IFCLModel.from_encoder(str(tiny_encoder_dir), objective="conisi", matryoshka_dims=[8])
    with pytest.raises(ValueError, match="--matryoshka_dims with --objective conisi: its InfoNCE compares"):
        objective_class("conisi")(model)


@pytest.mark.slow
def test_a_run_with_sizes_scores_each_and_its_folder_loads_cut(tiny_encoder_dir, pairs_data, tmp_path):
    from sentence_transformers import SentenceTransformer

    import run_ifcl

    output = tmp_path / "run"
    args = objective_run_args(tiny_encoder_dir, pairs_data, output, "ifcl", "--matryoshka_dims", "32", "16", "8")
    _, metrics = run_ifcl.main(args)
    for key in ("eval_stsb_spearman", "eval_stsb_spearman_16", "test_stsb_spearman_8", "init_test_stsb_spearman_8"):
        assert key in metrics
    assert json.loads((output / "config.json").read_text())["ifcl"]["matryoshka_dims"] == [32, 16, 8]
    card = (output / "README.md").read_text()
    assert "Matryoshka sizes" in card and f"| 8 | {metrics['eval_stsb_spearman_8']:.2f} |" in card
    model = IFCLModel.from_pretrained(output)
    full = model.encode(ENGLISH[:3], normalize_embeddings=False)
    torch.testing.assert_close(model.encode(ENGLISH[:3], truncate_dim=8), full[:, :8])
    st = SentenceTransformer(str(output), truncate_dim=8)
    torch.testing.assert_close(
        st.encode(ENGLISH[:3], convert_to_tensor=True, normalize_embeddings=True),
        nn.functional.normalize(full[:, :8], dim=-1),
        atol=1e-5,
        rtol=0,
    )


def test_truncate_dim_at_load_time_embeds_at_that_size_as_sentence_transformers_does(published_dir):
    """``from_pretrained(folder, truncate_dim=16)``, the package's class and the remote code alike, as
    ``SentenceTransformer(folder, truncate_dim=16)``: ``encode`` keeps the first 16 dimensions of the full embedding,
    normalised after the cut when asked; a size given to ``encode`` wins; bad sizes are one line."""
    from transformers import AutoModel

    from ifcl.model import IFCLModel

    full = IFCLModel.from_pretrained(str(published_dir)).encode(ENGLISH)
    for model in (
        IFCLModel.from_pretrained(str(published_dir), truncate_dim=16),
        AutoModel.from_pretrained(str(published_dir), trust_remote_code=True, truncate_dim=16),
    ):
        torch.testing.assert_close(model.encode(ENGLISH), full[:, :16], atol=1e-6, rtol=0)
        unit = model.encode(ENGLISH, normalize_embeddings=True)
        torch.testing.assert_close(unit, torch.nn.functional.normalize(full[:, :16], dim=1), atol=1e-6, rtol=0)
        assert model.encode(ENGLISH, truncate_dim=8).shape == (len(ENGLISH), 8)
    for bad, error, words in [
        (64.5, TypeError, "truncate_dim must be a whole number of dimensions, got 64.5"),
        ("64", TypeError, "truncate_dim must be a whole number of dimensions, got '64'"),
        (True, TypeError, "truncate_dim must be a whole number of dimensions, got True"),
        (4096, ValueError, r"truncate_dim must lie in \[1, 32\], the embeddings' size; got 4096"),
    ]:
        with pytest.raises(error, match=words):
            IFCLModel.from_pretrained(str(published_dir), truncate_dim=bad)
        with pytest.raises(error, match=words):
            model.encode(ENGLISH, truncate_dim=bad)
