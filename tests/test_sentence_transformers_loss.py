"""``ifcl.IFCLLoss``: IFCL as a sentence-transformers loss, equal to the trainer's objective."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from conftest import ENGLISH, GERMAN, build_tiny_bert, cpu_training_args, launch, st_training_args, without_dropout
from datasets import Dataset
from torch import nn

pytest.importorskip("sentence_transformers")
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Pooling, Transformer  # noqa: E402

from ifcl import queue as ring  # noqa: E402
from ifcl.model import IFCLModel  # noqa: E402
from ifcl.sentence_transformers_loss import CachedIFCLLoss, IFCLLoss  # noqa: E402
from modeling_ifcl import IFCLTwinsOutput
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


@pytest.fixture(scope="module")
def wide_encoder_dir(tmp_path_factory) -> Path:
    """A tiny BERT of width 128, so that Matryoshka sizes of 128, 64 and 32 can be taken."""
    return build_tiny_bert(tmp_path_factory.mktemp("wide_encoder"), ENGLISH + GERMAN, hidden_size=128, seed=2)


def features_of(batch: dict) -> list[dict[str, torch.Tensor]]:
    """A collated batch as sentence-transformers hands it to a loss: one dict per column."""
    return [
        {key[len(column) + 1 :]: value for key, value in batch.items() if key.startswith(column + "_")}
        for column in ("sentence", "fraternal")
    ]


def total_of(loss_output) -> torch.Tensor:
    """The loss the trainer back-propagates: the sum of the terms when a loss returns them by name."""
    return torch.stack(list(loss_output.values())).sum() if isinstance(loss_output, dict) else loss_output


def optimizer_step(loss: nn.Module) -> None:
    """An optimizer step that changes nothing (learning rate 0), after which the loss's queue takes the step's
    anchors, as after a training step."""
    torch.optim.SGD(loss.parameters(), lr=0.0).step()


def gradients(module: nn.Module, names: dict[str, str] | None = None) -> dict[str, torch.Tensor]:
    """Every gradient of ``module``'s parameters, by their names (renamed by ``names``' prefixes), then cleared."""
    result = {}
    for name, parameter in module.named_parameters():
        if parameter.grad is not None:
            for old, new in (names or {}).items():
                name = new + name.removeprefix(old) if name.startswith(old) else name
            result[name] = parameter.grad.clone()
    module.zero_grad(set_to_none=True)
    return result


SIZES = {"one size": None, "sizes 128 64 32": ([128, 64, 32], [1.0, 0.5, 2.0])}


@pytest.mark.parametrize("cached", [False, True], ids=["IFCLLoss", "CachedIFCLLoss"])
@pytest.mark.parametrize("sizes", SIZES.values(), ids=SIZES.keys())
@pytest.mark.parametrize("with_fraternal_model", [False, True], ids=["BEL_F a copy of BEL_S", "fraternal model"])
def test_the_losses_equal_the_ifcl_objective_in_ifcl_trainer(
    wide_encoder_dir, tiny_fraternal_dir, tmp_path, with_fraternal_model, sizes, cached
):
    """Same weights, same batches, dropout off, float64, both word tables trained: over two steps (the second with
    the queue holding the first step's anchors), each term (by name, from IFCLLoss), the total and the gradient of
    every parameter within 1e-6 of IFCLTrainer's IFCL objective, with and without Matryoshka sizes; CachedIFCLLoss in
    mini-batches of 3 and 1 rows. Each queue takes one push per optimizer step."""
    fraternal_dir = str(tiny_fraternal_dir) if with_fraternal_model else None
    dims, weights = sizes or (None, None)
    unfrozen = {"freeze_word_embeddings": False, "freeze_fraternal_embeddings": False}
    torch.manual_seed(0)
    settings = {("contrastive_" if name == "temperature" else "") + name: value for name, value in SETTINGS.items()}
    trainer_sizes = {"matryoshka_dims": dims, "matryoshka_weights": weights} if sizes else {}
    model = IFCLModel.from_encoder(
        str(wide_encoder_dir), fraternal_dir, max_seq_length=16, **settings, **unfrozen, **trainer_sizes
    ).double()
    pairs = Dataset.from_dict({"sentence": ENGLISH[:8], "fraternal": GERMAN[:8]})
    args = cpu_training_args(tmp_path / "ifcl", per_device_train_batch_size=4)
    trainer = IFCLTrainer(model=model, args=args, train_dataset=pairs)

    st_model = sentence_transformer_of(wide_encoder_dir, model).double()
    route = {"matryoshka_dims": dims, "matryoshka_weights": weights, **unfrozen, **SETTINGS}
    loss_class, extra = (CachedIFCLLoss, {"mini_batch_size": 3}) if cached else (IFCLLoss, {})
    loss = loss_class(st_model, fraternal_model_name_or_path=fraternal_dir, **route, **extra).double()
    assert loss.fraternal_embeddings is not None  # a table that trains, in the loss as in the model
    assert (loss.fraternal_projection is not None) == with_fraternal_model
    loss.load_state_dict({**loss.state_dict(), **model.state_dict()}, strict=False)  # BEL_F and its projection
    torch.testing.assert_close(loss.fraternal_embeddings.weight, model.fraternal_embeddings.weight, rtol=0, atol=0)
    collator = loss.data_collator(pairs)
    for part in (model, st_model):
        without_dropout(part)
        part.train()
    loss.train()

    names = {"model.0.model.": f"{model.encoder_prefix}."}
    for step in range(2):
        rows = [trainer.train_dataset[i] for i in range(4 * step, 4 * step + 4)]
        ifcl_total, output = trainer.compute_loss(model, trainer.data_collator(rows), return_outputs=True)
        ifcl_total.backward()
        expected = gradients(model)
        trainer.objective.on_step_end(model)  # the step's anchors enter the model's queue

        result = loss(features_of(collator([pairs[i] for i in range(4 * step, 4 * step + 4)])), None)
        if not cached:
            assert set(result) == {"loss_identical", "loss_fraternal", "loss_twins"}
            for name, value in result.items():
                assert value.item() / loss.terms.weight(name) == pytest.approx(
                    output.components[name].item(), abs=1e-6
                )
        assert total_of(result).item() == pytest.approx(ifcl_total.item(), abs=1e-6)
        total_of(result).backward()
        got = gradients(loss, names)
        assert {"fraternal_embeddings.weight", f"{model.encoder_prefix}.embeddings.word_embeddings.weight"} <= set(got)
        assert got.keys() == expected.keys()
        for name, gradient in expected.items():
            torch.testing.assert_close(got[name], gradient, atol=1e-6, rtol=0, msg=lambda m: f"{name}: {m}")
        assert ring.size(loss.queue) == 4 * step  # the queue has not yet taken this step's anchors
        optimizer_step(loss)
        assert ring.size(loss.queue) == ring.size(model.queue) == 4 * (step + 1)
    torch.testing.assert_close(loss.queue.embeddings, model.queue.embeddings.to(torch.float32), atol=1e-6, rtol=0)


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


def test_a_tokenizer_with_more_ids_than_the_word_table_is_one_line(tiny_encoder_dir):
    st_model = sentence_transformer_of(tiny_encoder_dir)
    st_model.tokenizer.add_tokens(["<domain-term>"])
    with pytest.raises(ValueError, match=re.escape("its tokenizer has 201 ids, more than the 200 rows")):
        IFCLLoss(st_model)


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
    assert first == "sentence_input_ids" and loss.collator_made
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


@pytest.mark.parametrize("cached", [False, True], ids=["IFCLLoss", "CachedIFCLLoss"])
def test_with_sizes_it_trains_with_one_push_per_optimizer_step_and_the_saved_model_loads_at_a_size(
    tiny_encoder_dir, tmp_path, monkeypatch, cached
):
    """``IFCLLoss(model, matryoshka_dims=[32, 16, 8])`` under SentenceTransformerTrainer, 3 optimizer steps of 2
    batches of 2 (gradient accumulation): the queue takes exactly one push per optimizer step, of the step's 4
    anchors, whatever the sizes and the batches; the card names the sizes, and the saved folder loads with
    ``truncate_dim``."""
    pushes = []
    push = ring.push
    monkeypatch.setattr(ring, "push", lambda queue, rows: (pushes.append(rows.shape[0]), push(queue, rows)))
    st_model = sentence_transformer_of(tiny_encoder_dir)
    options = {"mini_batch_size": 1} if cached else {}
    loss = (CachedIFCLLoss if cached else IFCLLoss)(st_model, queue_size=4, matryoshka_dims=[32, 16, 8], **options)
    pairs = Dataset.from_dict({"sentence": ENGLISH * 2, "fraternal": GERMAN * 2})
    args = st_training_args(tmp_path / "st", per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=3)
    trainer = SentenceTransformerTrainer(
        model=st_model, args=args, train_dataset=pairs, loss=loss, data_collator=loss.data_collator(pairs)
    )
    trainer.train()
    assert trainer.state.global_step == 3 and pushes == [4, 4, 4]
    assert ring.size(loss.queue) == 12 and loss.queue.embeddings.shape == (4, 4, 32) and not loss.step_anchors
    st_model.save(str(tmp_path / "saved"))
    card = (tmp_path / "saved" / "README.md").read_text(encoding="utf-8")
    assert '"matryoshka_dims":[32,16,8],"matryoshka_weights":[1.0,1.0,1.0]' in "".join(card.split())
    loaded = SentenceTransformer(str(tmp_path / "saved"), truncate_dim=8)
    cut = loaded.encode(ENGLISH[:2], convert_to_tensor=True)
    assert cut.shape == (2, 8)
    torch.testing.assert_close(cut, st_model.encode(ENGLISH[:2], convert_to_tensor=True)[:, :8], atol=1e-5, rtol=0)


@pytest.mark.parametrize("cached", [False, True], ids=["IFCLLoss", "CachedIFCLLoss"])
def test_a_loss_modifier_around_an_ifcl_loss_is_refused_in_one_line_that_gives_the_parameter(tiny_encoder_dir, cached):
    from sentence_transformers.sentence_transformer.losses import AdaptiveLayerLoss, MatryoshkaLoss

    st_model = sentence_transformer_of(tiny_encoder_dir)
    loss = CachedIFCLLoss(st_model, mini_batch_size=2) if cached else IFCLLoss(st_model)
    name = type(loss).__name__
    with pytest.raises(TypeError, match=re.escape(f"{name}(model, matryoshka_dims=[...]")) as refused:
        MatryoshkaLoss(st_model, loss, [32, 16])
    assert "\n" not in str(refused.value)
    with pytest.raises(
        TypeError, match=f"{name} is not wrapped by AdaptiveLayerLoss: it embeds its three views"
    ) as refused:
        AdaptiveLayerLoss(st_model, loss)
    assert "\n" not in str(refused.value) and "sizes itself" not in str(refused.value)


BAD_SETTINGS = [
    ({"matryoshka_dims": [32, 32]}, ValueError, "matryoshka_dims must be distinct whole numbers ≥ 1, got [32, 32]."),
    (
        {"matryoshka_dims": [32, 16.5]},
        ValueError,
        "matryoshka_dims must be distinct whole numbers ≥ 1, got [32, 16.5]",
    ),
    ({"matryoshka_dims": 32}, TypeError, "matryoshka_dims must be a list of whole numbers, got 32 (int)."),
    ({"matryoshka_dims": [64, 32]}, ValueError, "matryoshka_dims [64, 32]: the embeddings have 32 dimensions."),
    (
        {"matryoshka_dims": [32, 16], "matryoshka_weights": [1.0, -1.0]},
        ValueError,
        "matryoshka_weights must be one number > 0 per size of matryoshka_dims [32, 16], got [1.0, -1.0].",
    ),
    ({"gather_across_devices": "no"}, TypeError, "gather_across_devices must be True or False, got 'no' (str)."),
    ({"gather_across_devices": 1}, TypeError, "gather_across_devices must be True or False, got 1 (int)."),
    ({"freeze_word_embeddings": "false"}, TypeError, "freeze_word_embeddings must be True or False, got 'false'"),
]
CACHED_BAD_SETTINGS = [
    ({"show_progress_bar": "yes"}, TypeError, "show_progress_bar must be True or False, got 'yes' (str)."),
    ({"mini_batch_size": 0}, ValueError, "mini_batch_size must be a positive integer, got 0."),
    ({"mini_batch_size": True}, TypeError, "mini_batch_size must be an integer, got True (bool)."),
]


@pytest.mark.parametrize(
    "cached, settings, error, message",
    [(False, *case) for case in BAD_SETTINGS] + [(True, *case) for case in BAD_SETTINGS + CACHED_BAD_SETTINGS],
    ids=lambda value: {False: "IFCLLoss", True: "CachedIFCLLoss"}.get(value) if isinstance(value, bool) else None,
)
def test_bad_settings_of_the_losses_are_one_line_in_the_trainer_routes_words(
    tiny_encoder_dir, cached, settings, error, message
):
    """Sizes and weights in ``run_ifcl.py --matryoshka_dims``' words, booleans that are not True or False (a
    string's truthiness would otherwise decide), before any batch."""
    st_model = sentence_transformer_of(tiny_encoder_dir)
    with pytest.raises(error, match=re.escape(message)) as refused:
        (CachedIFCLLoss if cached else IFCLLoss)(st_model, **settings)
    assert "\n" not in str(refused.value)


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
        queue = () if loss.queue is None else ring.negatives(loss.queue, SETTINGS["forgetting_rate"])
        total = loss(features, None)
        total.backward()
        assert len(recorded[False]) == len(recorded[True]) == 2  # rows 0-3 and 4-5
        for first, second in zip(recorded[False], recorded[True]):
            assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
        twins = {
            grad: IFCLTwinsOutput(**{name: torch.cat([part[name] for part in parts]) for name in parts[0]})
            for grad, parts in recorded.items()
        }
        assert not torch.allclose(twins[False].anchor, twins[False].identical, atol=1e-3)  # two dropout masks
        losses = [
            sum(loss.terms.weight(name) * term for name, term in loss.terms.terms(twins[grad], *queue).items())
            for grad in (False, True)
        ]
        assert losses[0].item() == losses[1].item() == pytest.approx(total.item(), abs=1e-6)
        optimizer_step(loss)
    assert ring.size(loss.queue) == 12
    merged = {**features[0], **{"fraternal_" + key: value for key, value in features[1].items()}}
    again, _ = loss.embed_minibatch(merged, 0, 4, with_grad=True, copy_random_state=False)
    assert not torch.allclose(again[:, :32], recorded[True][0]["anchor"], atol=1e-3)


def test_the_cached_loss_trains_with_sentence_transformers_trainer(tiny_encoder_dir, tmp_path):
    """Three steps of 4 rows in mini-batches of 3 and 1: the model learns, the total is logged, the queue takes one
    push per step, and the card's settings name the mini-batch size."""

    st_model = sentence_transformer_of(tiny_encoder_dir)
    loss = CachedIFCLLoss(st_model, mini_batch_size=3, queue_size=4)
    assert loss.get_config_dict()["mini_batch_size"] == 3 and "gao2021scaling" in loss.citation
    before = {name: p.detach().clone() for name, p in st_model.named_parameters() if p.requires_grad}
    args = st_training_args(tmp_path / "st", per_device_train_batch_size=4, max_steps=3, logging_steps=1)
    pairs = Dataset.from_dict({"sentence": ENGLISH * 2, "fraternal": GERMAN * 2})
    trainer = SentenceTransformerTrainer(
        model=st_model, args=args, train_dataset=pairs, loss=loss, data_collator=loss.data_collator(pairs)
    )
    trainer.train()
    assert len([entry for entry in trainer.state.log_history if "loss" in entry]) == 3
    assert ring.size(loss.queue) == 12 and loss.queue.head.item() == 2  # a push after each of the 3 steps, 4 slots
    changed = [name for name, p in st_model.named_parameters() if name in before and not torch.equal(p, before[name])]
    assert any(name.endswith("encoder.layer.0.attention.self.query.weight") for name in changed)


# ---------------------------------------------------------------- several processes (DDP through the trainer)

ST_RUNS = ["IFCLLoss", "CachedIFCLLoss", "IFCLLoss with sizes", "CachedIFCLLoss with sizes", "IFCLLoss on a stream"]


@pytest.fixture(scope="module")
def distributed_runs(tmp_path_factory) -> dict[str, tuple]:
    """``tests/distributed_st_loss.py`` under ``accelerate launch`` (gloo on the CPU), dropout off, so that the
    only randomness is the data order: the five runs of its ``RUNS`` trained three steps in one process with
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
    assert len(one["terms"]) == len(two[0]["terms"]) == (3 if name.startswith("IFCLLoss") else 0)  # by name
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
