"""``ifcl.IFCLLoss``: IFCL as a sentence-transformers loss, equal to the trainer's objective."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from conftest import ENGLISH, GERMAN, build_tiny_bert, cpu_training_args, launch, st_training_args, without_dropout
from datasets import Dataset
from torch import nn

pytest.importorskip("sentence_transformers")
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Pooling, Transformer  # noqa: E402

from ifcl import queue as ring  # noqa: E402
from ifcl.sentence_transformers_loss import CachedIFCLLoss, IFCLLoss  # noqa: E402
from modeling_ifcl import IFCLModel, IFCLTwinsOutput  # noqa: E402
from trainer_ifcl import IFCLTrainer  # noqa: E402

SETTINGS = dict(
    fusion_rate=0.4,
    queue_size=3,
    forgetting_rate=0.2,
    temperature=0.05,
    fraternal_loss_weight=0.7,
    twins_loss_weight=1.3,
)


def sentence_transformer_of(encoder_dir, ifcl_model: IFCLModel | None = None) -> SentenceTransformer:
    """The tiny encoder as a sentence-transformers model (mean pooling, 16 tokens), with the IFCL model's encoder
    weights when one is given."""
    transformer = Transformer(str(encoder_dir), max_seq_length=16)
    if ifcl_model is not None:
        missing, unexpected = transformer.auto_model.load_state_dict(ifcl_model.encoder.state_dict(), strict=False)
        assert not unexpected and all(name.startswith("pooler.") for name in missing)
    return SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")])


@pytest.mark.parametrize("with_fraternal_model", [False, True], ids=["BEL_F a copy of BEL_S", "fraternal model"])
def test_the_loss_equals_the_ifcl_objective_in_ifcl_trainer(
    tiny_encoder_dir, tiny_fraternal_dir, tmp_path, with_fraternal_model
):
    """Same weights, same batches, dropout off: each term and the total within 1e-5, over two steps (the second
    with the queue holding the first step's anchors)."""
    fraternal_dir = str(tiny_fraternal_dir) if with_fraternal_model else None
    torch.manual_seed(0)
    settings = {("contrastive_" if name == "temperature" else "") + name: value for name, value in SETTINGS.items()}
    model = IFCLModel.from_encoder(str(tiny_encoder_dir), fraternal_dir, max_seq_length=16, **settings)
    pairs = Dataset.from_dict({"sentence": ENGLISH[:8], "fraternal": GERMAN[:8]})
    args = cpu_training_args(tmp_path / "ifcl", per_device_train_batch_size=4)
    trainer = IFCLTrainer(model=model, args=args, train_dataset=pairs)

    st_model = sentence_transformer_of(tiny_encoder_dir, model)
    loss = IFCLLoss(st_model, fraternal_model_name_or_path=fraternal_dir, **SETTINGS)
    if with_fraternal_model:
        assert loss.fraternal_projection is not None
        loss.fraternal_projection.load_state_dict(model.fraternal_projection.state_dict())
    fraternal_table = loss.fraternal_embeddings or st_model[0].auto_model.get_input_embeddings()
    assert torch.equal(fraternal_table.weight, (model.fraternal_embeddings or model.get_input_embeddings()).weight)
    collator = loss.data_collator(pairs)
    for part in (model, st_model):
        without_dropout(part)
        part.train()
    loss.train()

    for step in range(2):
        rows = [trainer.train_dataset[i] for i in range(4 * step, 4 * step + 4)]
        ifcl_total, output = trainer.compute_loss(model, trainer.data_collator(rows), return_outputs=True)
        ifcl_terms = {name: value.item() for name, value in output.components.items()}
        trainer.objective.on_step_end(model)  # the step's anchors enter the model's queue

        batch = collator([pairs[i] for i in range(4 * step, 4 * step + 4)])
        features = [
            {key[len(column) + 1 :]: value for key, value in batch.items() if key.startswith(column + "_")}
            for column in ("sentence", "fraternal")
        ]
        terms = loss(features, None)
        assert set(terms) == {"loss_identical", "loss_fraternal", "loss_twins"}
        for name, value in terms.items():
            assert value.item() / loss.terms.weight(name) == pytest.approx(ifcl_terms[name], abs=1e-5), name
        assert sum(terms.values()).item() == pytest.approx(ifcl_total.item(), abs=1e-5)
    # The last batch's anchors enter with the next batch.
    assert ring.size(loss.queue) == 4 and ring.size(model.queue) == 8
    assert torch.equal(loss.pending_anchors, ring.newest_first(model.queue)[0][:4])


def test_the_loss_trains_with_sentence_transformers_trainer_and_logs_its_terms(tiny_encoder_dir, tmp_path):

    st_model = sentence_transformer_of(tiny_encoder_dir)
    table = st_model[0].auto_model.get_input_embeddings().weight
    before = table.detach().clone()
    loss = IFCLLoss(st_model, queue_size=2)
    assert not table.requires_grad  # BEL_S frozen by default, as in the trainer
    args = st_training_args(tmp_path / "st", per_device_train_batch_size=4, max_steps=3, logging_steps=1)
    pairs = Dataset.from_dict({"sentence": ENGLISH * 2, "fraternal": GERMAN * 2})
    trainer = SentenceTransformerTrainer(model=st_model, args=args, train_dataset=pairs, loss=loss)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss_identical" in entry]
    assert logged and all({"loss_identical", "loss_fraternal", "loss_twins"} <= set(entry) for entry in logged)
    assert ring.size(loss.queue) == 8  # two slots of four: the batches before the last one
    assert torch.equal(table, before)


def test_settings_are_checked_and_a_single_column_is_refused(tiny_encoder_dir):
    st_model = sentence_transformer_of(tiny_encoder_dir)
    with pytest.raises(ValueError, match="fusion_rate"):
        IFCLLoss(st_model, fusion_rate=1.5)
    loss = IFCLLoss(st_model)
    features = st_model.tokenize(ENGLISH[:2])
    with pytest.raises(ValueError, match="two text columns"):
        loss([features], None)
    simcse = IFCLLoss(st_model, fraternal_loss_weight=0, twins_loss_weight=0, queue_size=0)
    assert set(simcse([features], None)) == {"loss_identical"}
    assert simcse.fraternal_embeddings is None and simcse.text_columns == ("sentence",)  # no BEL_F, as IFCLModel


def test_without_fraternal_twins_the_fraternal_model_is_not_loaded(tiny_encoder_dir, tiny_fraternal_dir, monkeypatch):
    import ifcl.sentence_transformers_loss

    monkeypatch.setattr(ifcl.sentence_transformers_loss, "load_fraternal", lambda name: pytest.fail(f"{name} loaded"))
    settings = {"fraternal_loss_weight": 0, "twins_loss_weight": 0, "freeze_word_embeddings": False}
    loss = IFCLLoss(sentence_transformer_of(tiny_encoder_dir), str(tiny_fraternal_dir), **settings)
    assert loss.fraternal_embeddings is None and loss.fraternal_tokenizer is None


def test_its_collator_takes_the_columns_by_name_and_a_missing_fraternal_model_is_named(tiny_encoder_dir, tmp_path):
    st_model = sentence_transformer_of(tiny_encoder_dir)
    loss = IFCLLoss(st_model)
    swapped = [{"fraternal": german, "sentence": english} for english, german in zip(ENGLISH[:3], GERMAN[:3])]
    batch = loss.data_collator(Dataset.from_list(swapped))(swapped)
    first = next(key for key in batch if key.endswith("_input_ids"))
    assert first == "sentence_input_ids" and loss.collated_by_name
    assert torch.equal(batch["sentence_input_ids"], st_model.tokenize(ENGLISH[:3])["input_ids"])
    missing = str(tmp_path / "no" / "such" / "model")
    with pytest.raises(FileNotFoundError, match=f"fraternal_model_name_or_path {missing}: no such folder"):
        IFCLLoss(st_model, fraternal_model_name_or_path=missing)


def test_with_a_fraternal_model_the_twins_stay_second_read_by_its_tokenizer(tiny_encoder_dir, tiny_fraternal_dir):
    """An extra column is left out, so it never takes the fraternal twins' place (sentence-transformers orders the
    features by the batch's keys), and the twins are tokenized by the fraternal model's tokenizer, not the
    encoder's."""
    from transformers import AutoTokenizer

    loss = IFCLLoss(sentence_transformer_of(tiny_encoder_dir), fraternal_model_name_or_path=str(tiny_fraternal_dir))
    rows = [{"sentence": en, "source": "web", "fraternal": de} for en, de in zip(ENGLISH[:3], GERMAN[:3])]
    batch = loss.data_collator(Dataset.from_list(rows))(rows)
    columns = [key.removesuffix("_input_ids") for key in batch if key.endswith("_input_ids")]
    assert columns == ["sentence", "fraternal"]
    expected = AutoTokenizer.from_pretrained(str(tiny_fraternal_dir))(GERMAN[:3], padding=True, return_tensors="pt")
    assert torch.equal(batch["fraternal_input_ids"], expected["input_ids"])
    assert torch.equal(batch["fraternal_attention_mask"], expected["attention_mask"])


def test_its_collator_names_a_missing_fraternal_column(tiny_encoder_dir):
    loss = IFCLLoss(sentence_transformer_of(tiny_encoder_dir))
    with pytest.raises(ValueError, match="it lacks fraternal"):
        loss.data_collator(Dataset.from_dict({"sentence": ENGLISH[:3]}))  # no translations at all


def test_its_settings_reach_sentence_transformers_cards(tiny_encoder_dir):
    st_model = sentence_transformer_of(tiny_encoder_dir)
    config = IFCLLoss(st_model, **SETTINGS).get_config_dict()
    frozen = {"freeze_word_embeddings": True, "freeze_fraternal_embeddings": True}  # IFCLSettings' defaults
    assert config == {**SETTINGS, **frozen, "gather_across_devices": False, "fraternal_model": None}


def test_sentence_transformers_trainer_writes_the_ifcl_settings_and_citation_into_its_card(
    tiny_encoder_dir, tiny_fraternal_dir, tmp_path
):
    """The card that ``SentenceTransformer.save`` writes after training shows the loss's settings
    (``get_config_dict``) and cites the IFCL paper; a local fraternal model is named by its folder's base name."""

    st_model = sentence_transformer_of(tiny_encoder_dir)
    loss = IFCLLoss(st_model, fraternal_model_name_or_path=str(tiny_fraternal_dir), **SETTINGS)
    args = st_training_args(tmp_path / "run", per_device_train_batch_size=4, max_steps=1)
    pairs = Dataset.from_dict({"sentence": ENGLISH[:4], "fraternal": GERMAN[:4]})
    trainer = SentenceTransformerTrainer(
        model=st_model, args=args, train_dataset=pairs, loss=loss, data_collator=loss.data_collator(pairs)
    )
    trainer.train()
    st_model.save(str(tmp_path / "saved"))
    card = (tmp_path / "saved" / "README.md").read_text(encoding="utf-8")
    assert "ifcl.sentence_transformers_loss.IFCLLoss" in card
    for name, value in SETTINGS.items():
        assert f'"{name}": {value}' in card, name
    assert f'"fraternal_model": "{tiny_fraternal_dir.name}"' in card
    assert str(tiny_fraternal_dir) not in card and "xiao2023ifcl" in card


DATA_CASES = [
    # (training columns, loss settings, the one error, the warning at the first batch)
    ({"sentence": [], "fraternal": []}, {}, "The training set is empty", None),
    ({"sentence": ENGLISH[:3] + [None], "fraternal": GERMAN[:4]}, {}, "column 'sentence' has None in row 3", None),
    ({"sentence": ENGLISH[:8], "fraternal": GERMAN[:5] + [""] + GERMAN[6:8]}, {}, "'fraternal' has '' in row 5", None),
    ({"sentence": list(range(4)), "fraternal": GERMAN[:4]}, {}, "column 'sentence' holds", None),
    (
        {"sentence": ENGLISH[:4], "fraternal": GERMAN[:4]},
        {"queue_size": 9, "forgetting_rate": 0.1},
        None,
        "fewer than the hippocampus queue holds (k·N = 9 × 2)",
    ),
    ({"sentence": ENGLISH[:4], "fraternal": GERMAN[:4], "count": [1, 2, 3, 4]}, {}, None, None),  # left out
]
CASE_IDS = ["empty set", "None text", "empty fraternal twin", "numbers for sentences", "queue", "extra int column"]


@pytest.mark.parametrize("handed", [True, False], ids=["dataset handed", "no dataset"])
@pytest.mark.parametrize("columns, settings, error, warning", DATA_CASES, ids=CASE_IDS)
def test_under_sentence_transformers_trainer_bad_data_is_named_in_one_error_or_warning(
    tiny_encoder_dir, tmp_path, caplog, columns, settings, error, warning, handed
):
    """As IFCLTrainer checks its text: the collator checks the training set it is handed before the trainer is
    made, naming a row by its index in the set, and warns of a queue larger than the data at the first batch; an
    extra column is left out. The set is required: without it sentence-transformers would stop first, in its own
    card statistics (a None) or its sampler (an empty set), and no batch knows its rows' indices."""

    model = sentence_transformer_of(tiny_encoder_dir)
    loss = IFCLLoss(model, **{"queue_size": 0, **settings})
    data = Dataset.from_dict(columns)
    if not handed:
        with pytest.raises(TypeError, match="train_dataset"):
            loss.data_collator()
        return
    if error is not None:
        with pytest.raises(ValueError, match=re.escape(error)):
            loss.data_collator(data)
        return
    args = st_training_args(tmp_path / "st", per_device_train_batch_size=2, max_steps=1)
    trainer = SentenceTransformerTrainer(
        model=model, args=args, train_dataset=data, loss=loss, data_collator=loss.data_collator(data)
    )
    with caplog.at_level("WARNING", logger="ifcl"):
        trainer.train()
    ifcl_warnings = [record.getMessage() for record in caplog.records if record.name.startswith("ifcl")]
    assert len(ifcl_warnings) == (warning is not None) and all(warning in message for message in ifcl_warnings)


def test_inside_sentence_transformers_matryoshka_loss_it_sums_its_terms_over_the_sizes(tiny_encoder_dir, tmp_path):
    """``MatryoshkaLoss(model, IFCLLoss(model), dims)``: with dropout off, its loss is Σ_d w_d·(ℓ^I_d + w_F·ℓ^F_d +
    w_T·ℓ^T), as ``IFCLTerms`` with the same sizes gives it (ℓ^T at the full size at each); it trains with one queue
    push per step, saves, and the folder loads with ``truncate_dim``."""
    from sentence_transformers.sentence_transformer.losses import MatryoshkaLoss

    from ifcl.losses import IFCLTerms, Matryoshka

    st_model = sentence_transformer_of(tiny_encoder_dir)
    width = st_model.get_embedding_dimension()
    dims, weights = (width, 16, 8), (1.0, 0.5, 2.0)
    loss = IFCLLoss(st_model, queue_size=4, forgetting_rate=0.2, fraternal_loss_weight=0.7, twins_loss_weight=1.3)
    matryoshka = MatryoshkaLoss(st_model, loss, list(dims), list(weights))
    pairs = Dataset.from_dict({"sentence": ENGLISH * 2, "fraternal": GERMAN * 2})
    batch = loss.data_collator(pairs)([pairs[i] for i in range(4)])
    features = [
        {key[len(column) + 1 :]: value for key, value in batch.items() if key.startswith(column + "_")}
        for column in ("sentence", "fraternal")
    ]
    without_dropout(st_model)
    st_model.eval(), loss.eval()
    twins, _, _ = loss.views(features)
    expected, _ = IFCLTerms(0.05, 0.7, 1.3, Matryoshka(dims, weights))(twins)
    assert matryoshka(features, None).item() == pytest.approx(expected.item(), rel=1e-5)

    args = st_training_args(tmp_path / "st", per_device_train_batch_size=4, max_steps=3)
    loss.train()
    SentenceTransformerTrainer(model=st_model, args=args, train_dataset=pairs, loss=matryoshka).train()
    # One push of four rows per step, not one per size: the two steps before the last, in 4 slots.
    assert ring.size(loss.queue) == 8 and loss.queue.head.item() == 1
    st_model.save(str(tmp_path / "saved"))
    loaded = SentenceTransformer(str(tmp_path / "saved"), truncate_dim=8)
    cut = loaded.encode(ENGLISH[:2], convert_to_tensor=True)
    assert cut.shape == (2, 8)
    torch.testing.assert_close(cut, st_model.encode(ENGLISH[:2], convert_to_tensor=True)[:, :8], atol=1e-5, rtol=0)


# The sentence-transformers versions whose MatryoshkaLoss ifcl.sentence_transformers_matryoshka was checked against
# (their ForwardDecorator, CachedLossDecorator and MatryoshkaLoss.__init__ read alike in what the adapter relies on).
MATRYOSHKA_ADAPTER_HOLDS_FOR = ("6.0.0", "6.0.1", "6.1.0", "6.2.0")


def test_the_matryoshka_adapter_holds_for_sentence_transformers_6(tiny_encoder_dir):
    """What ``ifcl.sentence_transformers_matryoshka`` relies on of MatryoshkaLoss, which no public API promises, as
    the installed sentence-transformers does it; a version outside :data:`MATRYOSHKA_ADAPTER_HOLDS_FOR` (those read
    against the adapter) is warned about at the end, to be read and added. (1) Around a loss without gradient cache: one call per size, the
    largest first, the size read from its forward decorator; the model runs in the first call only, and the later
    ones get its outputs back, ``sentence_embedding`` cut and normalised as ``cut`` does, the full-size copy kept.
    (2) Around a gradient-cache loss: the sizes taken from the decorator set as its ``calculate_loss``; that
    decorator, around a loss of one size, draws ``n_dims_per_step`` sizes, cuts and weights each and carries the
    gradients back through the cuts."""
    import sentence_transformers
    from sentence_transformers.base.losses import CachedLossMixin
    from sentence_transformers.sentence_transformer.losses import MatryoshkaLoss
    from torch.nn import functional as F

    from ifcl.losses import Matryoshka
    from ifcl.sentence_transformers_matryoshka import (
        FULL_SIZE_EMBEDDING,
        ModelRuns,
        cut,
        full_size_kept,
        matryoshka_size,
        matryoshka_sizes,
        over_drawn_sizes,
    )

    st_model = sentence_transformer_of(tiny_encoder_dir)
    features = st_model.preprocess(ENGLISH[:3])

    class Probe(nn.Module):
        def __init__(self, model: SentenceTransformer) -> None:
            super().__init__()
            self.model, self.calls = model, []

        def forward(self, sentence_features, labels):
            runs = ModelRuns()
            with full_size_kept(self.model, runs):
                outputs = self.model(dict(sentence_features[0]))
            cut = outputs["sentence_embedding"]
            self.calls.append((matryoshka_size(self.model), runs.ran, outputs[FULL_SIZE_EMBEDDING], cut))
            return outputs["sentence_embedding"].sum()

    probe = Probe(st_model)
    MatryoshkaLoss(st_model, probe, [8, 32, 16])([features], None)
    assert [(size, ran) for size, ran, _, _ in probe.calls] == [(32, True), (16, False), (8, False)]
    full = probe.calls[0][2]
    assert full.shape == (3, 32)
    for size, _, kept, handed_back in probe.calls:
        assert kept is full
        torch.testing.assert_close(handed_back, F.normalize(full[:, :size], dim=-1))
        torch.testing.assert_close(cut(full, size), handed_back)  # the adapter cuts as MatryoshkaLoss does
    assert matryoshka_size(st_model) is None  # outside MatryoshkaLoss

    class CachedProbe(CachedLossMixin, nn.Module):
        def __init__(self, model: SentenceTransformer) -> None:
            super().__init__()
            self.model, self.mini_batch_size = model, 2

    cached = CachedProbe(st_model)
    MatryoshkaLoss(st_model, cached, [32, 16, 8], [1.0, 0.5, 2.0], n_dims_per_step=2)
    sizes, n_dims_per_step = matryoshka_sizes(cached.calculate_loss)
    assert sizes == Matryoshka((32, 16, 8), (1.0, 0.5, 2.0)) and n_dims_per_step == 2
    with pytest.raises(TypeError, match="Only a MatryoshkaLoss"):
        matryoshka_sizes(cached.embed_minibatch)

    seen = []

    def loss_at_size(reps, label, *, with_backward=False):
        cut = torch.cat(reps[0])
        seen.append((label, cut.detach()))
        loss = (cut * torch.arange(cut.shape[-1])).sum()
        if with_backward:
            loss.backward()
        return loss.detach()

    rows = torch.randn(4, 32, requires_grad=True)
    total = over_drawn_sizes(loss_at_size, sizes, n_dims_per_step)([[rows[:2], rows[2:]]], "step", with_backward=True)
    drawn = [cut.shape[-1] for _, cut in seen]
    assert len(drawn) == 2 and set(drawn) <= {32, 16, 8} and {label for label, _ in seen} == {"step"}
    weight = dict(zip(sizes.dims, sizes.weights))
    expected = sum(
        weight[d] * (F.normalize(rows[:, :d], dim=-1) * torch.arange(d)).sum() for d in drawn
    )  # the same loss, through autograd at once
    assert total.item() == pytest.approx(expected.item(), rel=1e-5)
    (gradient,) = torch.autograd.grad(expected, rows)
    torch.testing.assert_close(rows.grad, gradient, atol=1e-5, rtol=1e-5)
    version = sentence_transformers.__version__
    if version not in MATRYOSHKA_ADAPTER_HOLDS_FOR:  # the checks above hold on it: say so, without failing
        warnings.warn(
            f"sentence-transformers {version}: what ifcl/sentence_transformers_matryoshka.py relies on holds; read "
            "its MatryoshkaLoss against the adapter's docstring, then add the version to MATRYOSHKA_ADAPTER_HOLDS_FOR",
            stacklevel=1,
        )


def features_of(batch: dict) -> list[dict[str, torch.Tensor]]:
    """A collated batch as sentence-transformers hands it to a loss: one dict per column."""
    return [
        {key[len(column) + 1 :]: value for key, value in batch.items() if key.startswith(column + "_")}
        for column in ("sentence", "fraternal")
    ]


def total_of(loss_output) -> torch.Tensor:
    """The loss the trainer back-propagates: the sum of the terms when a loss returns them by name."""
    return torch.stack(list(loss_output.values())).sum() if isinstance(loss_output, dict) else loss_output


@pytest.mark.parametrize("matryoshka", [False, True], ids=["one size", "MatryoshkaLoss"])
@pytest.mark.parametrize("with_fraternal_model", [False, True], ids=["BEL_F a copy of BEL_S", "fraternal model"])
def test_the_cached_loss_and_its_gradients_equal_the_loss_without_cache(
    tiny_encoder_dir, tiny_fraternal_dir, with_fraternal_model, matryoshka
):
    """Dropout off, float64 (float32's rounding of a sum split into mini-batches is not what is compared), both word
    tables trained: over two steps of 6 rows (the second with the queue holding the first's anchors), mini-batches of
    4 and 2 rows give IFCLLoss's terms on the whole batch and the gradient of every trainable parameter within 1e-5,
    alone and inside sentence-transformers' MatryoshkaLoss."""
    from sentence_transformers.sentence_transformer.losses import MatryoshkaLoss

    fraternal_dir = str(tiny_fraternal_dir) if with_fraternal_model else None
    torch.manual_seed(0)
    st_model = sentence_transformer_of(tiny_encoder_dir).double()
    without_dropout(st_model)
    unfrozen = {"freeze_word_embeddings": False, "freeze_fraternal_embeddings": False}
    plain = IFCLLoss(st_model, fraternal_dir, **SETTINGS, **unfrozen).double()
    cached = CachedIFCLLoss(st_model, fraternal_dir, mini_batch_size=4, **SETTINGS, **unfrozen).double()
    cached.load_state_dict(plain.state_dict())  # the same BEL_F and projection
    pairs = Dataset.from_dict({"sentence": ENGLISH, "fraternal": GERMAN})
    runs = [(plain, plain.data_collator(pairs)), (cached, cached.data_collator(pairs))]
    if matryoshka:
        dims, weights = [st_model.get_embedding_dimension(), 16, 8], [1.0, 0.5, 2.0]
        runs = [(MatryoshkaLoss(st_model, loss, dims, weights), collator) for loss, collator in runs]

    for step in range(2):
        rows = [pairs[i] for i in range(6 * step, 6 * step + 6)]
        results = []
        for loss, collator in runs:
            loss.train()
            loss.zero_grad(set_to_none=True)
            output = loss(features_of(collator(rows)), None)
            total_of(output).backward()
            grads = {name: p.grad.clone() for name, p in loss.named_parameters() if p.grad is not None}
            results.append((output, grads))
        (plain_output, plain_grads), (cached_output, cached_grads) = results
        if matryoshka:
            assert total_of(cached_output).item() == pytest.approx(plain_output.item(), abs=1e-5)
        else:
            assert {name: value.item() for name, value in cached_output.items()} == pytest.approx(
                {name: value.item() for name, value in plain_output.items()}, abs=1e-5
            )
        assert plain_grads.keys() == cached_grads.keys()
        assert any("fraternal_embeddings" in name for name in plain_grads)
        assert any("word_embeddings" in name for name in plain_grads)
        for name, grad in plain_grads.items():
            torch.testing.assert_close(cached_grads[name], grad, atol=1e-5, rtol=1e-5, msg=lambda m: f"{name}: {m}")
    assert ring.size(cached.queue) == 6
    torch.testing.assert_close(cached.queue.embeddings, plain.queue.embeddings, atol=1e-5, rtol=0)


def test_with_dropout_the_gradient_pass_replays_the_embedding_pass(tiny_encoder_dir, monkeypatch):
    """Dropout on: each mini-batch's views, embedded again with gradients in the backward pass, are those of the
    embedding pass exactly (each identical twin its own dropout mask, replayed), and so is the loss, over two steps
    (the second with the queue); embedded again without the recorded random state they differ."""
    st_model = sentence_transformer_of(tiny_encoder_dir)
    assert any(isinstance(m, nn.Dropout) and m.p > 0 for m in st_model.modules())
    loss = CachedIFCLLoss(st_model, mini_batch_size=4, **SETTINGS)
    loss.train()
    pairs = Dataset.from_dict({"sentence": ENGLISH, "fraternal": GERMAN})
    collator = loss.data_collator(pairs)
    recorded: dict[bool, list] = {}
    embed_twins = loss.embed_twins

    def recording(columns):  # the embedding pass runs without gradients, the gradient pass with them
        twins = embed_twins(columns)
        recorded[torch.is_grad_enabled()].append({name: value.detach().clone() for name, value in twins.items()})
        return twins

    monkeypatch.setattr(loss, "embed_twins", recording)
    for step in range(2):
        recorded.update({False: [], True: []})
        features = features_of(collator([pairs[i] for i in range(6 * step, 6 * step + 6)]))
        terms = loss(features, None)
        total_of(terms).backward()
        assert len(recorded[False]) == len(recorded[True]) == 2  # rows 0-3 and 4-5
        for first, second in zip(recorded[False], recorded[True]):
            assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
        twins = {
            grad: IFCLTwinsOutput(**{name: torch.cat([part[name] for part in parts]) for name in parts[0]})
            for grad, parts in recorded.items()
        }
        assert not torch.allclose(twins[False].anchor, twins[False].identical, atol=1e-3)  # two dropout masks
        losses = [
            sum(
                loss.terms.weight(name) * term
                for name, term in loss.terms.terms(twins[grad], *loss.queue_negatives()).items()
            )
            for grad in (False, True)
        ]
        assert losses[0].item() == losses[1].item() == pytest.approx(total_of(terms).item(), abs=1e-6)
    assert ring.size(loss.queue) == 6
    merged = {**features[0], **{"fraternal_" + key: value for key, value in features[1].items()}}
    again, _ = loss.embed_minibatch(merged, 0, 4, with_grad=True, copy_random_state=False)
    assert not torch.allclose(again[:, 0], recorded[True][0]["anchor"], atol=1e-3)


def test_the_cached_loss_trains_with_sentence_transformers_trainer(tiny_encoder_dir, tmp_path):
    """Three steps of 4 rows in mini-batches of 3 and 1: the model learns, the terms are logged, the queue takes one
    push per step, and the card's settings name the mini-batch size."""

    st_model = sentence_transformer_of(tiny_encoder_dir)
    with pytest.raises(ValueError, match="mini_batch_size must be a positive integer"):
        CachedIFCLLoss(st_model, mini_batch_size=0)
    loss = CachedIFCLLoss(st_model, mini_batch_size=3, queue_size=4)
    assert loss.get_config_dict()["mini_batch_size"] == 3 and "gao2021scaling" in loss.citation
    before = {name: p.detach().clone() for name, p in st_model.named_parameters() if p.requires_grad}
    args = st_training_args(tmp_path / "st", per_device_train_batch_size=4, max_steps=3, logging_steps=1)
    pairs = Dataset.from_dict({"sentence": ENGLISH * 2, "fraternal": GERMAN * 2})
    trainer = SentenceTransformerTrainer(
        model=st_model, args=args, train_dataset=pairs, loss=loss, data_collator=loss.data_collator(pairs)
    )
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss_identical" in entry]
    assert len(logged) == 3 and all(
        {"loss_identical", "loss_fraternal", "loss_twins"} <= set(entry) for entry in logged
    )
    assert ring.size(loss.queue) == 8 and loss.queue.head.item() == 1  # the two steps before the last, 4 slots
    changed = [name for name, p in st_model.named_parameters() if name in before and not torch.equal(p, before[name])]
    assert any(name.endswith("encoder.layer.0.attention.self.query.weight") for name in changed)


def test_inside_sentence_transformers_matryoshka_loss_the_cached_loss_trains(tiny_encoder_dir, tmp_path):
    """``MatryoshkaLoss(model, CachedIFCLLoss(model), dims)``: the loss takes MatryoshkaLoss's sizes (not its
    CachedLossDecorator, which would put ℓ^T at every size); dropout off its loss is Σ_d w_d·(ℓ^I_d + w_F·ℓ^F_d) +
    w_T·ℓ^T as ``IFCLTerms`` gives it; it trains with one queue push per step, sampling sizes with
    ``n_dims_per_step``; a second MatryoshkaLoss around it is refused."""
    from sentence_transformers.sentence_transformer.losses import MatryoshkaLoss

    from ifcl.losses import IFCLTerms, Matryoshka

    st_model = sentence_transformer_of(tiny_encoder_dir)
    dims, weights = (st_model.get_embedding_dimension(), 16, 8), (1.0, 0.5, 2.0)
    settings = {"queue_size": 4, "forgetting_rate": 0.2, "fraternal_loss_weight": 0.7, "twins_loss_weight": 1.3}
    loss = CachedIFCLLoss(st_model, mini_batch_size=3, **settings)
    matryoshka = MatryoshkaLoss(st_model, loss, list(dims), list(weights), n_dims_per_step=2)
    assert matryoshka.uses_gradient_cache and loss.matryoshka == Matryoshka(dims, weights)
    with pytest.raises(ValueError, match="inside a MatryoshkaLoss already"):
        MatryoshkaLoss(st_model, loss, [8])
    pairs = Dataset.from_dict({"sentence": ENGLISH * 2, "fraternal": GERMAN * 2})
    features = features_of(loss.data_collator(pairs)([pairs[i] for i in range(4)]))
    without_dropout(st_model)
    loss.eval()
    loss.n_dims_per_step = -1  # every size, to compare
    twins, _, _ = loss.views(features)
    expected, _ = IFCLTerms(0.05, 0.7, 1.3, Matryoshka(dims, weights))(twins)
    assert total_of(matryoshka(features, None)).item() == pytest.approx(expected.item(), rel=1e-5)

    loss.n_dims_per_step = 2
    args = st_training_args(tmp_path / "st", per_device_train_batch_size=4, max_steps=3)
    loss.train()
    SentenceTransformerTrainer(
        model=st_model, args=args, train_dataset=pairs, loss=matryoshka, data_collator=loss.data_collator(pairs)
    ).train()
    assert ring.size(loss.queue) == 8 and loss.queue.head.item() == 1


# ---------------------------------------------------------------- several processes (DDP through the trainer)

ST_RUNS = ["IFCLLoss", "CachedIFCLLoss", "IFCLLoss in MatryoshkaLoss", "CachedIFCLLoss in MatryoshkaLoss"]


@pytest.fixture(scope="module")
def distributed_runs(tmp_path_factory) -> dict[str, tuple]:
    """``tests/distributed_st_loss.py`` under ``accelerate launch`` (gloo on the CPU), dropout off, so that the
    only randomness is the data order: the four losses of its ``RUNS`` trained three steps in one process with
    batch 4 (``one``), and in two processes with batch 2 each, with ``gather_across_devices`` (``gathered``) and
    without (``own``). Each run: the finished process and what each rank saved."""
    folder = tmp_path_factory.mktemp("st_ddp")
    encoder = build_tiny_bert(folder / "encoder", ENGLISH + GERMAN, dropout=0.0)
    fraternal = build_tiny_bert(folder / "fraternal", GERMAN, hidden_size=24, seed=1, dropout=0.0)
    runs = {}
    for run, processes, batch_size, gather in (("one", 1, 4, 1), ("gathered", 2, 2, 1), ("own", 2, 2, 0)):
        output = folder / run
        output.mkdir()
        args = [str(output), str(encoder), str(fraternal), str(batch_size), str(gather)]
        result = launch(args, processes=processes, script="tests/distributed_st_loss.py")
        saved = [torch.load(output / f"st_rank{rank}.pt") for rank in range(processes) if result.returncode == 0]
        runs[run] = (result, saved)
    return runs


def finished(run: tuple) -> list[dict]:
    """What each rank of a finished run saved; the run's output when it failed."""
    result, saved = run
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return saved


@pytest.mark.slow
@pytest.mark.parametrize("name", ST_RUNS)
def test_two_processes_gathering_across_devices_train_exactly_like_one_process_with_the_global_batch(
    distributed_runs, name
):
    """Batch 2 on each of 2 processes with ``gather_across_devices=True`` = batch 4 on one: at each of 3 steps the
    mean of the processes' losses, and of each term, is the one process's within 1e-5 (the candidates of both
    processes in rank order, gradients flowing back to both, the loss's own projection averaged), and every
    process's queue holds the same rows as the one process's (all processes' anchors, pushed on each)."""
    (one,) = [rank[name] for rank in finished(distributed_runs["one"])]
    two = [rank[name] for rank in finished(distributed_runs["gathered"])]
    assert len(one["losses"]) == len(two[0]["losses"]) == len(two[1]["losses"]) == 3
    for step, expected in enumerate(one["losses"]):
        assert (two[0]["losses"][step] + two[1]["losses"][step]) / 2 == pytest.approx(expected, abs=1e-5), step
    assert len(one["terms"]) == len(two[0]["terms"]) == (0 if name == "IFCLLoss in MatryoshkaLoss" else 3)
    for step, expected in enumerate(one["terms"]):
        for term, value in expected.items():
            mean = (two[0]["terms"][step][term] + two[1]["terms"][step][term]) / 2
            assert mean == pytest.approx(value, abs=1e-5), (step, term)
    for rank in two:
        for buffer in ("valid", "head"):
            assert torch.equal(rank["queue"][buffer], one["queue"][buffer]), buffer
        torch.testing.assert_close(rank["queue"]["embeddings"], one["queue"]["embeddings"], atol=1e-5, rtol=0)
    assert one["queue"]["embeddings"].shape == (2, 4, 32)  # slots of the global batch
    # The learning rate is large enough that training moves: equal losses at later steps mean equal gradients.
    assert abs(one["losses"][-1] - one["losses"][0]) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("name", ST_RUNS)
def test_without_gathering_each_process_keeps_its_own_negatives_and_queue_and_the_weights_stay_equal(
    distributed_runs, name
):
    """``gather_across_devices=False``, the default: both processes train (exit 0), each on its own batch of 2 (its
    losses its own, its queue's slots of 2 rows its own anchors), and end with the same weights, the model's (DDP)
    and the loss's own trained projection (averaged over the processes) alike."""
    ranks = [rank[name] for rank in finished(distributed_runs["own"])]
    assert len(ranks[0]["losses"]) == len(ranks[1]["losses"]) == 3
    assert ranks[0]["losses"][0] != pytest.approx(ranks[1]["losses"][0], abs=1e-4)
    assert ranks[0]["queue"]["embeddings"].shape == (2, 2, 32)
    assert not torch.allclose(ranks[0]["queue"]["embeddings"], ranks[1]["queue"]["embeddings"])
    assert ranks[0]["loss_weights"].keys() == {
        "fraternal_embeddings.weight",
        "fraternal_projection.weight",
        "fraternal_projection.bias",
    }
    for weights in ("weights", "loss_weights"):
        for key, value in ranks[0][weights].items():
            assert torch.equal(value, ranks[1][weights][key]), key
    trained = ranks[0]["loss_weights"]["fraternal_projection.weight"]
    assert not torch.allclose(trained, ranks[0]["loss_weights_before"]["fraternal_projection.weight"])


BAD_SIZES = [
    ([32, 16.5], None, ValueError, "matryoshka_dims must be distinct whole numbers ≥ 1, got ["),
    ([32, 16, 16], None, ValueError, "matryoshka_dims must be distinct whole numbers ≥ 1, got [32, 16, 16]"),
]
BAD_WEIGHTS = [([32, 16], [1.0, -1.0], ValueError, "matryoshka_weights must be one number > 0 per size")]


@pytest.mark.parametrize(
    "cached, dims, weights, error, named",
    [(False, *case) for case in BAD_SIZES] + [(True, *case) for case in BAD_SIZES + BAD_WEIGHTS],
    ids=lambda value: {False: "IFCLLoss", True: "CachedIFCLLoss"}.get(value) if isinstance(value, bool) else None,
)
def test_bad_sizes_of_a_matryoshka_loss_around_an_ifcl_loss_are_one_line(
    tiny_encoder_dir, cached, dims, weights, error, named
):
    """MatryoshkaLoss takes these as they come; the IFCL loss inside it names them in run_ifcl.py's words, before
    torch would trace back. Its weights only a gradient-cache loss sees: MatryoshkaLoss hands a loss without one none."""
    from sentence_transformers.sentence_transformer.losses import MatryoshkaLoss

    st_model = sentence_transformer_of(tiny_encoder_dir)
    loss = (CachedIFCLLoss(st_model, mini_batch_size=2) if cached else IFCLLoss(st_model)).train()
    pairs = Dataset.from_dict({"sentence": ENGLISH[:4], "fraternal": GERMAN[:4]})
    with pytest.raises(error, match=re.escape(f"MatryoshkaLoss around an IFCL loss: {named}")) as raised:
        sizes = MatryoshkaLoss(st_model, loss, dims, weights)
        sizes(features_of(loss.data_collator(pairs)([pairs[i] for i in range(4)])), None)
    assert str(dims[-1] if weights is None else weights[-1]) in str(raised.value)
