"""IFCLTrainer: the queue takes each optimizer step's anchors once, and every loss term is logged."""

from __future__ import annotations

import datasets
import pytest
import torch
from conftest import ENGLISH, GERMAN, cpu_training_args, train_and_resume
from torch import nn

from ifcl import queue as ring
from ifcl.losses import forgetting_coefficients
from ifcl.model import IFCLModel
from ifcl.objectives import pad_features
from trainer_ifcl import IFCLTrainer


def tokenized(model: IFCLModel, with_fraternal: bool) -> datasets.Dataset:
    features = dict(model.tokenizer(ENGLISH))
    if with_fraternal:
        fraternal = model.fraternal_tokenizer(GERMAN)
        features["fraternal_input_ids"] = fraternal["input_ids"]
        features["fraternal_attention_mask"] = fraternal["attention_mask"]
    return datasets.Dataset.from_dict(features)


def make_trainer(model, dataset, tmp_path, **overrides) -> IFCLTrainer:
    """A trainer of 3 steps of 2 rows × 2 accumulated at learning rate 0, logging each step, unless ``overrides`` (other
    ``TrainingArguments``) say otherwise. No data collator is given: the trainer uses the objective's own."""
    settings = {
        "output_dir": tmp_path / "out",
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 2,
        "max_steps": 3,
        "learning_rate": 0.0,
        "logging_steps": 1,
        "seed": 0,
        **overrides,
    }
    return IFCLTrainer(model=model, args=cpu_training_args(**settings), train_dataset=dataset)


def test_queue_takes_all_anchors_of_each_optimizer_step_once(tiny_encoder_dir, tmp_path):
    # N = 2 per micro-batch × 2 accumulation steps = 4 anchors per optimizer step; 3 steps cover the 12 sentences.
    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=4, queue_batch_size=4, forgetting_rate=0.1)
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0  # with no dropout and lr 0 every anchor can be recomputed exactly
    dataset = tokenized(model, with_fraternal=True)
    make_trainer(model, dataset, tmp_path).train()

    # One push per optimizer step, each of N = 4 rows (per micro-batch pushes would give 2-row slots).
    assert sorted(model.queue.valid.sum(dim=1).tolist()) == [0, 4, 4, 4]
    entries, ages = ring.newest_first(model.queue)
    assert forgetting_coefficients(ages, 0.1).tolist() == pytest.approx([0.9] * 4 + [0.8] * 4 + [0.7] * 4)

    model.eval()
    with torch.no_grad():
        batch = pad_features([dict(model.tokenizer(s)) for s in ENGLISH], {"": model.tokenizer.pad_token_id})
        reference = model(**batch, return_twins=True).anchor
    distances = torch.cdist(entries, reference)
    nearest = distances.argmin(dim=1)
    assert distances.min(dim=1).values.max() < 1e-4
    assert sorted(nearest.tolist()) == list(range(12))  # each training sentence once


def test_loss_terms_are_logged(tiny_encoder_dir, tmp_path):
    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=2, queue_batch_size=4)
    trainer = make_trainer(model, tokenized(model, with_fraternal=True), tmp_path, learning_rate=1e-4)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 3
    for entry in logged:
        assert {"loss_identical", "loss_fraternal", "loss_twins"} <= set(entry)
        total = entry["loss_identical"] + entry["loss_fraternal"] + entry["loss_twins"]
        assert entry["loss"] == pytest.approx(total, rel=2e-3, abs=2e-3)


def test_simcse_ablation_skips_the_fraternal_pass(tiny_encoder_dir, tmp_path):
    model = IFCLModel.from_encoder(
        str(tiny_encoder_dir), queue_size=0, fraternal_loss_weight=0.0, twins_loss_weight=0.0
    )
    assert model.fraternal_embeddings is None and model.queue is None
    calls = []
    model.encoder.register_forward_hook(lambda module, args, kwargs_out: calls.append(1))
    trainer = make_trainer(model, tokenized(model, with_fraternal=True), tmp_path, gradient_accumulation_steps=1)
    trainer.train()
    assert len(calls) == 3  # one encoder call per step: [anchors; identical twins], no fraternal call
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert all("loss_fraternal" not in entry and "loss_twins" not in entry for entry in logged)


def test_fraternal_weights_without_fraternal_data_is_a_clear_error(tiny_encoder_dir, tmp_path):
    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0)
    trainer = make_trainer(model, tokenized(model, with_fraternal=False), tmp_path)
    with pytest.raises(ValueError, match="fraternal"):
        trainer.train()


def test_resumed_run_repeats_the_uninterrupted_losses_exactly(tiny_encoder_dir, tmp_path):
    """Stop after 3 steps, resume from the checkpoint: queue, data order and random state (dropout is on) come
    back, so steps 4-6 give the losses of the uninterrupted run."""
    settings = dict(
        gradient_accumulation_steps=1, max_steps=6, learning_rate=1e-3, save_strategy="steps", save_steps=3
    )

    def fresh_trainer(output: str) -> IFCLTrainer:
        model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=3, queue_batch_size=2)
        return make_trainer(model, tokenized(model, with_fraternal=True), tmp_path, output_dir=output, **settings)

    expected, got, uninterrupted, resumed = train_and_resume(fresh_trainer, tmp_path, "checkpoint-3")
    assert sorted(got) == [1, 2, 3, 4, 5, 6]  # 1-3 come with the checkpoint's state, 4-6 are trained again
    for step in (4, 5, 6):
        assert got[step] == pytest.approx(expected[step], abs=1e-6), step
    final_a = ring.newest_first(uninterrupted.model.queue)[0]
    final_b = ring.newest_first(resumed.model.queue)[0]
    assert final_a.shape == (6, 32) and torch.allclose(final_a, final_b, atol=1e-6)


def test_non_finite_loss_stops_naming_step_and_term_and_keeps_the_last_good_checkpoint(tiny_encoder_dir, tmp_path):
    from trainer_ifcl import NonFiniteLossError

    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0)
    trainer = make_trainer(
        model,
        tokenized(model, with_fraternal=True),
        tmp_path,
        gradient_accumulation_steps=1,
        max_steps=8,
        save_strategy="steps",
        save_steps=2,
        logging_steps=4,
    )
    twins_loss = trainer.objective.terms.twins_loss
    original, calls = twins_loss.forward, []

    def poisoned(*args):
        calls.append(1)
        value = original(*args)
        return value * float("nan") if len(calls) == 3 else value  # step 3 goes NaN

    twins_loss.forward = poisoned
    with pytest.raises(NonFiniteLossError, match=r"between step 3 and step 4.*loss_twins = nan.*checkpoint-2"):
        trainer.train()
    out = tmp_path / "out"
    assert (out / "checkpoint-2").is_dir() and not (out / "checkpoint-4").exists()


def test_a_step_that_logs_and_saves_reduces_the_loss_sums_once_and_logs_their_means(tiny_encoder_dir, tmp_path):
    """One collective (and one host sync) per log, not one for the check, one for the means and one more before the
    checkpoint; the logged terms are still each term's mean over the step's micro-batches."""
    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0)
    dataset = tokenized(model, with_fraternal=True)
    trainer = make_trainer(model, dataset, tmp_path, max_steps=2, save_strategy="steps", save_steps=1)
    reduce, reductions = trainer.accelerator.reduce, []

    def counted(*args, **kwargs):
        reductions.append(kwargs.get("reduction"))
        return reduce(*args, **kwargs)

    trainer.accelerator.reduce = counted
    forward, components = trainer.objective.forward, []

    def recorded(*args, **kwargs):
        output = forward(*args, **kwargs)
        components.append({name: value.item() for name, value in output.components.items()})
        return output

    trainer.objective.forward = recorded
    trainer.train()
    assert reductions == ["sum", "sum"]  # steps 1 and 2, each logged and checkpointed
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    for step, entry in enumerate(logged):
        micro_batches = components[2 * step : 2 * step + 2]  # 2 accumulated micro-batches per step
        for name in ("loss_identical", "loss_fraternal", "loss_twins"):
            expected = sum(batch[name] for batch in micro_batches) / 2
            assert entry[name] == pytest.approx(expected, rel=1e-6), (step, name)


@pytest.mark.parametrize("objective", ["ifcl", "simcse", "pcl"])
def test_trainer_takes_a_text_dataset_as_it_is(tiny_encoder_dir, tiny_fraternal_dir, tmp_path, objective):
    """The Python API: a text Dataset, TrainingArguments and the model; the trainer tokenizes with the objective's
    hook, builds its collator and sizes the queue from the global batch (here 2 × 2 accumulation steps)."""
    from conftest import write_sts_file
    from datasets import Dataset

    model = IFCLModel.from_encoder(
        str(tiny_encoder_dir),
        str(tiny_fraternal_dir) if objective == "ifcl" else None,
        objective=objective,
        queue_size=3,
        queue_batch_size=64,
        max_seq_length=16,
    )
    text = Dataset.from_dict({"sentence": ENGLISH, "fraternal": GERMAN})
    args = cpu_training_args(
        tmp_path / "out", per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=3, logging_steps=1
    )
    trainer = IFCLTrainer(model=model, args=args, train_dataset=text)
    trainer.train()
    assert any("loss" in entry for entry in trainer.state.log_history)
    if objective == "ifcl":
        assert model.queue.valid.shape == (3, 4) and model.config.queue_batch_size == 4
        assert ring.size(model.queue) == 12
        assert any("loss_twins" in entry for entry in trainer.state.log_history)
    else:
        assert model.queue is None and model.fraternal_embeddings is None
    write_sts_file(tmp_path / "sts.tsv")
    from ifcl.data import load_sts_file

    metrics = trainer.evaluate({"mine": load_sts_file(str(tmp_path / "sts.tsv"))})
    assert "eval_mine_spearman" in metrics


def test_save_model_writes_the_published_folder_without_the_queue(tiny_encoder_dir, tiny_fraternal_dir, tmp_path):
    """The published folder: weights without the training state (IFCL's queue), the tokenizers and the
    sentence-transformers view; it loads with the trained model's embeddings, its queue empty."""
    from conftest import saved_weight_names
    from datasets import Dataset

    model = IFCLModel.from_encoder(str(tiny_encoder_dir), str(tiny_fraternal_dir), queue_size=2)
    text = Dataset.from_dict({"sentence": ENGLISH, "fraternal": GERMAN})
    trainer = make_trainer(model, text, tmp_path, gradient_accumulation_steps=1, max_steps=2, learning_rate=1e-3)
    trainer.train()
    assert ring.size(model.queue) == 4
    published = tmp_path / "published"
    trainer.save_model(str(published))
    assert not [name for name in saved_weight_names(published) if name.startswith(("queue.", "training_objective."))]
    for name in ("modules.json", "tokenizer.json", "fraternal_tokenizer/tokenizer.json", "modeling_ifcl.py"):
        assert (published / name).is_file(), name
    assert ring.size(model.queue) == 4 and model.training_objective is trainer.objective  # restored for training
    loaded = IFCLModel.from_pretrained(published)
    assert ring.size(loaded.queue) == 0
    torch.testing.assert_close(loaded.encode(ENGLISH), model.encode(ENGLISH), atol=1e-6, rtol=0)


def test_text_dataset_without_translations_names_the_missing_column(tiny_encoder_dir, tmp_path):
    from datasets import Dataset

    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0)
    args = cpu_training_args(tmp_path / "out")
    with pytest.raises(ValueError, match="'fraternal' column"):
        IFCLTrainer(model=model, args=args, train_dataset=Dataset.from_dict({"sentence": ENGLISH}))
