"""The gradient cache (``IFCLTrainer(cache_mini_batch_size=...)``, ``--cache_mini_batch_size``): one cached step has
the loss and gradients of the uncached one, replays its dropout masks, leaves the same weights after an SGD step, and
composes with Matryoshka sizes; bad sizes are refused in one line; a tiny run of ``run_ifcl.py`` with it."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from conftest import (
    ENGLISH,
    GERMAN,
    cpu_training_args,
    objective_run_args,
    one_training_step,
    run_script,
    without_dropout,
)
from datasets import Dataset

from ifcl import queue as ring
from ifcl.model import IFCLModel
from trainer_ifcl import IFCLTrainer

# The model settings of each objective: IFCL with its queue and fraternal twins (BEL_F is BEL_S), miCSE with its
# attention term on the tiny encoder's 2 layers and a momentum queue.
SETTINGS = {
    "ifcl": {"queue_size": 2},
    "simcse": {"objective": "simcse"},
    "micse": {
        "objective": "micse",
        "objective_settings": {"micse_attention_layers": "top2", "micse_queue_size": 4},
    },
    "conisi": {"objective": "conisi", "objective_settings": {"conisi_strategy": "o1"}},
    "pcl": {"objective": "pcl", "objective_settings": {"pcl_untied_peer": True}},
}


def build(
    tmp_path,
    encoder,
    name: str,
    batch: int = 4,
    dropout: bool = False,
    cache=None,
    model_settings=None,
    dtype: torch.dtype = torch.float32,
    **args,
):
    """A trainer of ``name`` on 24 sentence pairs, dropout off unless ``dropout``, its queues holding random rows."""
    torch.manual_seed(0)
    model = IFCLModel.from_encoder(str(encoder), **SETTINGS[name], **(model_settings or {})).to(dtype)
    columns = {"sentence": ENGLISH + GERMAN} | ({"fraternal": GERMAN + ENGLISH} if name == "ifcl" else {})
    args = cpu_training_args(tmp_path, per_device_train_batch_size=batch, **args)
    trainer = IFCLTrainer(model, args, train_dataset=Dataset.from_dict(columns), cache_mini_batch_size=cache)
    trainer.objective.to(dtype)  # ConIsI's and PCL's heads, miCSE's momentum encoder
    if not dropout:
        without_dropout(model)
    for queue in (model.queue, getattr(trainer.objective, "queue", None)):
        if queue is not None:
            ring.push(queue, torch.randn(queue.valid.numel(), model.hidden_size))
    return trainer


def assert_same_step(trainer: IFCLTrainer, batch: dict, cache: int) -> None:
    """The cached step equals the uncached one. The models are float64: the cache adds the same terms in another
    order, and float32 rounding of a sum over every token (the token-type table's gradient) reaches 1e-5."""
    loss, terms, gradients, queued = one_training_step(trainer, batch, None)
    cached_loss, cached_terms, cached_gradients, cached_queued = one_training_step(trainer, batch, cache)
    assert loss.dtype == torch.float64
    torch.testing.assert_close(cached_loss, loss, rtol=0, atol=1e-10)
    assert terms.keys() == cached_terms.keys()
    for term in terms:
        torch.testing.assert_close(cached_terms[term], terms[term], rtol=0, atol=1e-10, msg=term)
    assert gradients and gradients.keys() == cached_gradients.keys()
    for name, gradient in gradients.items():
        torch.testing.assert_close(cached_gradients[name], gradient, rtol=0, atol=1e-10, msg=name)
    # The queue takes the micro-batch's rows once, from the embedding pass.
    assert len(cached_queued) == len(queued)
    for rows, cached_rows in zip(queued, cached_queued):
        torch.testing.assert_close(cached_rows, rows, rtol=0, atol=1e-10)


def first_batch(trainer: IFCLTrainer, size: int) -> dict:
    torch.manual_seed(1)
    return trainer.data_collator([trainer.train_dataset[i] for i in range(size)])


@pytest.mark.parametrize("name", list(SETTINGS))
def test_a_cached_step_has_the_loss_and_gradients_of_the_uncached_one(tiny_encoder_dir, tmp_path, name):
    """Dropout off, float64: loss, logged terms, every parameter's gradient and the queued rows, mini-batches of 3
    rows over a batch of 8 (the last one shorter)."""
    trainer = build(tmp_path, tiny_encoder_dir, name, batch=8, dtype=torch.float64)
    assert_same_step(trainer, first_batch(trainer, 8), cache=3)


def test_the_cache_composes_with_matryoshka_sizes(tiny_encoder_dir, tmp_path):
    sizes = {"matryoshka_dims": [32, 16, 8], "matryoshka_weights": [1.0, 0.5, 0.25]}
    trainer = build(tmp_path, tiny_encoder_dir, "ifcl", batch=8, model_settings=sizes, dtype=torch.float64)
    assert_same_step(trainer, first_batch(trainer, 8), cache=2)


@pytest.mark.parametrize("name", ["ifcl", "simcse"])
def test_each_mini_batch_goes_through_the_encoder_at_its_own_length(tiny_encoder_dir, tmp_path, name):
    """The padding that all rows of a mini-batch share is not encoded, as in sentence-transformers' cached losses:
    in the embedding pass and the re-forward alike, the twins' call is as long as the mini-batch's longest sentence,
    the fraternal call as its longest sentence or translation (on the CPU the views take two calls)."""
    trainer = build(tmp_path, tiny_encoder_dir, name, batch=8)
    batch = first_batch(trainer, 8)
    calls = []

    def counted(module, args, kwargs):
        calls.append(tuple(kwargs["inputs_embeds"].shape[:2]))

    hook = trainer.model.encoder.embeddings.register_forward_pre_hook(counted, with_kwargs=True)
    one_training_step(trainer, batch, cache=3)
    hook.remove()
    expected = []
    for start in range(0, 8, 3):
        rows = slice(start, start + 3)
        sentences = int(batch["attention_mask"][rows].sum(dim=1).max())
        expected.append((2 * len(batch["input_ids"][rows]), sentences))
        if name == "ifcl":
            translations = int(batch["fraternal_attention_mask"][rows].sum(dim=1).max())
            expected.append((len(batch["input_ids"][rows]), max(sentences, translations)))
    assert calls == expected + expected
    assert min(length for _, length in expected) < batch["input_ids"].shape[1], "no mini-batch is shorter"


@pytest.mark.parametrize("name", ["ifcl", "simcse", "micse"])
def test_the_gradient_pass_replays_the_dropout_masks(tiny_encoder_dir, tmp_path, name, monkeypatch):
    """Dropout on: the re-forward's rows are those of the embedding pass, and so is the loss computed from them."""
    trainer = build(tmp_path, tiny_encoder_dir, name, batch=8, dropout=True)
    objective, embed = trainer.objective, trainer.objective.embed
    passes: dict[bool, list] = {False: [], True: []}

    def recorded(model, inputs, replay=False):
        rows = embed(model, inputs, replay)
        passes[replay].append({key: value.detach().clone() for key, value in rows.items()})
        return rows

    monkeypatch.setattr(objective, "embed", recorded)
    batch = first_batch(trainer, 8)
    loss, _, gradients, _ = one_training_step(trainer, batch, cache=3)
    assert len(passes[False]) == len(passes[True]) == 3 and gradients
    replayed = {key: torch.cat([rows[key] for rows in passes[True]]) for key in passes[True][0]}
    for key, rows in replayed.items():
        torch.testing.assert_close(rows, torch.cat([first[key] for first in passes[False]]), rtol=0, atol=1e-6)
    with torch.no_grad():
        again = objective.loss_from(trainer.model, replayed, batch).loss
    torch.testing.assert_close(again, loss, rtol=0, atol=1e-6)
    # Dropout draws other masks in the uncached step, so the cache is no replay of it.
    uncached, _, _, _ = one_training_step(trainer, batch, cache=None)
    assert uncached.item() != pytest.approx(loss.item(), abs=1e-6)


def test_the_gradient_pass_runs_under_the_autocast_of_the_embedding_pass(tiny_encoder_dir, tmp_path, monkeypatch):
    """bf16 autocast around ``compute_loss`` only, as the Trainer's context: the backward's re-forward takes it too
    (its rows are the embedding pass's, which autocast changed)."""
    trainer = build(tmp_path, tiny_encoder_dir, "simcse", batch=8, dropout=True, cache=4)
    objective, embed = trainer.objective, trainer.objective.embed
    batch = first_batch(trainer, 8)
    trainer.model.train()

    def passes_under(autocast: torch.autocast | nullcontext) -> dict[bool, list[torch.Tensor]]:
        passes: dict[bool, list[torch.Tensor]] = {False: [], True: []}

        def recorded(model, inputs, replay=False):
            rows = embed(model, inputs, replay)
            passes[replay].append(rows["anchor"].detach().clone())
            return rows

        monkeypatch.setattr(objective, "embed", recorded)
        torch.manual_seed(5)
        with autocast:
            loss = trainer.compute_loss(trainer.model, batch)
        loss.backward()
        return passes

    bf16, float32 = passes_under(torch.autocast("cpu", dtype=torch.bfloat16)), passes_under(nullcontext())
    assert len(bf16[True]) == 2
    for first, again in zip(bf16[False], bf16[True]):
        torch.testing.assert_close(again, first, rtol=0, atol=0)
    assert not torch.equal(bf16[False][0].float(), float32[False][0])


@pytest.mark.parametrize("name", ["ifcl", "micse"])
def test_an_sgd_step_leaves_the_same_weights(tiny_encoder_dir, tmp_path, name):
    weights = []
    for cache in (None, 4):
        args = {"optim": "sgd", "learning_rate": 0.5, "max_steps": 1, "seed": 3}
        trainer = build(tmp_path / str(cache), tiny_encoder_dir, name, batch=16, cache=cache, **args)
        trainer.train()
        weights.append({key: value.clone() for key, value in trainer.model.state_dict().items()})
    before = IFCLModel.from_encoder(str(tiny_encoder_dir), **SETTINGS[name]).state_dict()
    assert any(not torch.equal(weights[0][key], before[key]) for key in before), "the step changed nothing"
    for key, value in weights[0].items():
        torch.testing.assert_close(weights[1][key], value, rtol=0, atol=1e-5, msg=key)


@pytest.mark.parametrize("size", [0, 5])
def test_a_mini_batch_outside_the_batch_is_refused_in_one_line(tiny_encoder_dir, tmp_path, size):
    with pytest.raises(ValueError, match="--cache_mini_batch_size") as error:
        build(tmp_path, tiny_encoder_dir, "simcse", batch=4, cache=size)
    assert "\n" not in str(error.value)


def test_conisi_is_refused_with_several_processes(tiny_encoder_dir, tmp_path):
    """Its heads train in the loss's backward, which data parallelism would not reduce."""
    objective = build(tmp_path, tiny_encoder_dir, "conisi").objective
    assert objective.gradient_cache_refusal(1) is None
    reason = objective.gradient_cache_refusal(2)
    assert reason and "\n" not in reason
    assert all(
        build(tmp_path, tiny_encoder_dir, name).objective.gradient_cache_refusal(2) is None
        for name in SETTINGS
        if name != "conisi"
    )


@pytest.mark.slow
def test_run_ifcl_trains_with_the_cache(tiny_encoder_dir, pairs_data, tmp_path):
    args = objective_run_args(tiny_encoder_dir, pairs_data, tmp_path / "out", "ifcl", "--cache_mini_batch_size", "2")
    result = run_script("run_ifcl.py", *args, "--queue_size", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "out" / "all_results.json").exists()
