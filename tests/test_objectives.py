"""The objective framework: batch padding, the SimCSE objective's loss, published models without the objective's
own modules, and ``run_ifcl.py --objective``."""

from __future__ import annotations

import json
import math
import re
from dataclasses import fields
from types import SimpleNamespace

import pytest
import torch
from conftest import ENGLISH, cpu_training_args, launch, objective_run_args, saved_weight_names, train_and_resume
from torch import nn

from ifcl import queue as ring
from ifcl.model import IFCLModel
from ifcl.objectives import OBJECTIVES, build_objective, objective_class, pad_features
from ifcl.objectives.base import WITHOUT_IFCL, fit_model
from ifcl.objectives.ifcl import IFCLObjective
from ifcl.objectives.simcse import SimCSEObjective
from modeling_ifcl import IFCLTwinsOutput
from trainer_ifcl import IFCLTrainer, ObjectiveDataCollator


def test_pad_features_pads_each_group_to_its_own_longest_with_its_own_pad_id():
    first = {
        "input_ids": [2, 5, 3],
        "attention_mask": [1, 1, 1],
        "pair_input_ids": [2, 5, 3, 5, 3],
        "pair_token_type_ids": [0, 0, 0, 1, 1],
        "fraternal_input_ids": [7, 8],
        "other_row": 4,
        "marks": [1],
    }
    second = {
        "input_ids": [2, 3],
        "attention_mask": [1, 1],
        "pair_input_ids": [2, 3, 3],
        "pair_token_type_ids": [0, 0, 1],
        "fraternal_input_ids": [7, 8, 8, 6],
        "other_row": 0,
        "marks": [0, 1, 1],
    }
    # The sentences' pad id is 1; "fraternal_" has its own; "pair_", not listed, takes the sentences'.
    batch = pad_features([first, second], {"": 1, "fraternal_": 9})
    assert batch["input_ids"].tolist() == [[2, 5, 3], [2, 3, 1]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["pair_input_ids"].tolist() == [[2, 5, 3, 5, 3], [2, 3, 3, 1, 1]]
    assert batch["pair_token_type_ids"].tolist() == [[0, 0, 0, 1, 1], [0, 0, 1, 0, 0]]
    assert batch["fraternal_input_ids"].tolist() == [[7, 8, 9, 9], [7, 8, 8, 6]]
    assert batch["other_row"].tolist() == [4, 0]
    assert batch["marks"].tolist() == [[1, 0, 0], [0, 1, 1]]


class GivenTwins(nn.Module):
    """Stands in for the model: returns fixed anchors and identical twins."""

    def __init__(self, anchor: torch.Tensor, identical: torch.Tensor) -> None:
        super().__init__()
        self.anchor, self.identical = anchor, identical

    def forward(self, return_twins: bool = False, **inputs) -> IFCLTwinsOutput:
        assert return_twins and not any(key.startswith("fraternal_") for key in inputs)
        return IFCLTwinsOutput(anchor=self.anchor, identical=self.identical)


def simcse_loss_by_hand(anchor, candidates, temperature, offset=0) -> float:
    """SimCSE's Eq. 1 written out: −log e^{cos(h_i,h_i⁺)/τ} / Σ_j e^{cos(h_i,h_j⁺)/τ}, averaged over i."""
    total = 0.0
    for i, h in enumerate(anchor.tolist()):
        cosines = []
        for c in candidates.tolist():
            dot = sum(a * b for a, b in zip(h, c))
            cosines.append(dot / (math.sqrt(sum(a * a for a in h)) * math.sqrt(sum(b * b for b in c))))
        denominator = sum(math.exp(cos / temperature) for cos in cosines)
        total += -math.log(math.exp(cosines[offset + i] / temperature) / denominator)
    return total / anchor.shape[0]


def test_simcse_objective_is_in_batch_info_nce_over_dropout_twins():
    anchor = torch.tensor([[1.0, 0.0, 0.5], [0.2, 1.0, -0.3], [-0.5, 0.4, 1.0]])
    identical = torch.tensor([[0.9, 0.1, 0.4], [0.0, 1.0, 0.0], [-0.4, 0.6, 0.8]])
    objective = SimCSEObjective(SimpleNamespace(config=SimpleNamespace(contrastive_temperature=0.1)))
    inputs = {"input_ids": torch.zeros(3, 4, dtype=torch.long), "fraternal_input_ids": torch.zeros(3, 2)}
    output = objective(GivenTwins(anchor, identical), inputs)
    assert output.loss.item() == pytest.approx(simcse_loss_by_hand(anchor, identical, 0.1), rel=1e-4, abs=1e-7)
    assert output.components["loss_contrastive"].item() == pytest.approx(output.loss.item())
    assert not objective.pending_rows

    # Candidates of another process come first: this process's positives start at the offset.
    others = torch.tensor([[0.3, -1.0, 0.2], [1.0, 1.0, 1.0]])
    gathered = lambda local: (torch.cat([others, local]), 2)  # noqa: E731
    output = objective(GivenTwins(anchor, identical), inputs, gathered)
    expected = simcse_loss_by_hand(anchor, torch.cat([others, identical]), 0.1, offset=2)
    assert output.loss.item() == pytest.approx(expected, rel=1e-4, abs=1e-7)


def test_every_registered_objective_is_importable_with_its_name():
    for name in OBJECTIVES:
        assert objective_class(name).name == name
    with pytest.raises(ValueError, match="Unknown objective 'moco'"):
        objective_class("moco")


def test_objective_names_are_checked_where_training_starts_from_the_registry():
    from types import SimpleNamespace

    import run_ifcl
    from configuration_ifcl import IFCLConfig

    assert tuple(OBJECTIVES) == ("ifcl", "simcse", "conisi", "pcl", "micse")
    choices = next(f for f in fields(run_ifcl.RunArguments) if f.name == "objective").metadata["choices"]
    assert choices == list(OBJECTIVES)
    config = IFCLConfig(objective="moco")  # the config a saved model carries reads no registry ...
    with pytest.raises(ValueError, match="Unknown objective 'moco'; choose one of ifcl, simcse, conisi, pcl, micse"):
        build_objective(SimpleNamespace(config=config))  # ... training does, when it starts
    for name, cls in OBJECTIVES.items():
        assert cls.paper.title and "@" in cls.paper.citation and cls.loss_terms
        assert IFCLConfig(objective=name).objective == name


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_each_objective_logs_the_loss_terms_it_declares(tiny_encoder_dir, name):
    """The plot and the logs rely on ``loss_terms``: one step of each objective logs exactly those terms."""
    from conftest import GERMAN

    from trainer_ifcl import ObjectiveDataCollator

    settings = {"micse": {"micse_attention_layers": "top2", "micse_num_samples": 20}}.get(name)
    model = IFCLModel.from_encoder(
        str(tiny_encoder_dir), objective=name, objective_settings=settings, queue_size=2, queue_batch_size=6
    )
    objective = build_objective(model)
    model.training_objective = objective
    text = {"sentence": ENGLISH[:6], "fraternal": GERMAN[:6]}
    features = objective.tokenize({column: text[column] for column in objective.text_columns}, model.tokenizer, 16)
    rows = [dict(zip(features, values)) for values in zip(*features.values())]
    batch = ObjectiveDataCollator(objective, model.tokenizer)(rows)
    torch.manual_seed(0)
    output = objective(model.train(), batch)
    assert set(output.components) == set(objective.loss_terms)


def test_training_curves_draw_the_objectives_own_loss_terms(tmp_path):
    from ifcl.reports import plot_training_curves

    history = [{"step": s, "loss": 1.0 / s, "loss_contrastive": 1.0 / s} for s in (1, 2, 3)]
    history.append({"step": 3, "eval_stsb_spearman": 70.0})
    drawn = plot_training_curves(history, str(tmp_path / "curves.png"), objective_class("simcse").loss_terms)
    assert drawn == ["loss", "loss_contrastive"]
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


class ProjectedSimCSE(SimCSEObjective):
    """SimCSE through a trainable head of the objective's own (like ConIsI's heads): it must train and checkpoint
    with the model, and stay out of the published model."""

    def __init__(self, model, settings=None) -> None:
        super().__init__(model, settings)
        self.head = nn.Linear(model.hidden_size, 8)

    def forward(self, model, inputs, gather=None):
        twins = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], return_twins=True)
        from ifcl.losses import info_nce
        from ifcl.objectives import ObjectiveOutput

        loss = info_nce(self.head(twins.anchor), self.head(twins.identical), self.temperature)
        return ObjectiveOutput(loss, {"loss_contrastive": loss.detach()})


def test_published_model_leaves_out_the_objective_modules_that_checkpoints_keep(tiny_encoder_dir, tmp_path):
    from datasets import Dataset
    from transformers import AutoModel

    model = IFCLModel.from_encoder(str(tiny_encoder_dir), objective="simcse", **WITHOUT_IFCL)
    objective = ProjectedSimCSE(model)
    head_before = objective.head.weight.detach().clone()
    dataset = Dataset.from_dict(dict(model.tokenizer(ENGLISH[:8])))
    args = cpu_training_args(
        tmp_path / "out",
        max_steps=2,
        per_device_train_batch_size=4,
        save_steps=2,
        save_strategy="steps",
        learning_rate=1e-2,
    )
    trainer = IFCLTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        data_collator=ObjectiveDataCollator(objective, model.tokenizer),
        objective=objective,
    )
    trainer.train()
    assert not torch.equal(objective.head.weight, head_before), "the objective's head was not optimized"

    assert "training_objective.head.weight" in saved_weight_names(tmp_path / "out" / "checkpoint-2")
    published = tmp_path / "published"
    trainer.save_model(str(published))
    assert not [key for key in saved_weight_names(published) if key.startswith("training_objective.")]
    assert model.training_objective is objective  # restored for further training
    assert json.loads((published / "config.json").read_text())["ifcl"]["objective"] == "simcse"
    assert (published / "modules.json").is_file() and (published / "tokenizer.json").is_file()

    loaded = AutoModel.from_pretrained(str(published), trust_remote_code=True)
    torch.testing.assert_close(loaded.encode(ENGLISH[:4]), model.encode(ENGLISH[:4]), atol=1e-5, rtol=0)


def test_build_objective_reads_the_objective_from_the_config(tiny_encoder_dir):
    """A peer objective trains the encoder alone: once the run is prepared, the model has given up its queue and its
    fraternal table."""
    model = IFCLModel.from_encoder(str(tiny_encoder_dir), objective="simcse", freeze_word_embeddings=False)
    assert model.queue is not None and model.fraternal_embeddings is not None  # IFCL's queue and BEL_F
    objective = build_objective(model)
    assert isinstance(objective, SimCSEObjective)
    objective.prepare(model, global_batch=4)
    assert model.queue is None and model.fraternal_embeddings is None
    assert model.config.queue_size == 0 and not model.config.uses_fraternal_twins
    assert model.config.objective == "simcse" and isinstance(build_objective(model), SimCSEObjective)  # again
    ifcl = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0)  # no objective named: IFCL
    assert ifcl.config.objective is None and isinstance(build_objective(ifcl), IFCLObjective)


def test_ifcl_settings_have_one_source_the_configs_own_fields(tiny_encoder_dir):
    """IFCL's settings are the config's own fields, whatever ``objective_settings`` holds (a config from a peer's
    run), and its loss weights are those settings' (given ones too)."""
    from configuration_ifcl import IFCLSettings

    model = IFCLModel.from_encoder(
        str(tiny_encoder_dir),
        objective="ifcl",
        objective_settings={"micse_queue_size": 4},
        queue_size=2,
        forgetting_rate=0.3,
        fraternal_loss_weight=0.4,
        twins_loss_weight=0.0,
    )
    objective = build_objective(model)
    assert objective.settings == IFCLObjective.stored_settings(model.config)
    assert objective.settings.forgetting_rate == 0.3 and objective.settings.fraternal_loss_weight == 0.4
    assert objective.terms.fraternal_loss_weight == 0.4 and objective.terms.twins_loss_weight == 0.0

    given = IFCLObjective(model, IFCLSettings(queue_size=2, fraternal_loss_weight=0.7, twins_loss_weight=0.2))
    assert (given.terms.fraternal_loss_weight, given.terms.twins_loss_weight) == (0.7, 0.2)


def test_a_peer_objective_given_to_the_trainer_trains_without_ifcls_parts(
    tiny_encoder_dir, tiny_fraternal_dir, tmp_path
):
    """The Trainer's ``prepare`` applies the objective's ``run_settings``: a model built
    with IFCL's queue, BEL_F and a frozen BEL_S trains a peer objective with none of them, and publishes no queue."""
    from datasets import Dataset

    model = IFCLModel.from_encoder(str(tiny_encoder_dir), str(tiny_fraternal_dir), queue_size=2)
    fit_model(model)  # as IFCL trains it
    assert model.config.freeze_word_embeddings and not model.get_input_embeddings().weight.requires_grad
    assert model.queue is not None and model.fraternal_embeddings is not None
    objective = SimCSEObjective(model)
    args = cpu_training_args(tmp_path / "out", max_steps=1, per_device_train_batch_size=4)
    trainer = IFCLTrainer(
        model=model, args=args, train_dataset=Dataset.from_dict({"sentence": ENGLISH[:8]}), objective=objective
    )
    assert model.queue is None and model.fraternal_embeddings is None
    assert {name: getattr(model.config, name) for name in WITHOUT_IFCL} == WITHOUT_IFCL
    assert model.get_input_embeddings().weight.requires_grad  # BEL_S trains, as the config now says
    trainer.save_model(str(tmp_path / "published"))
    assert not [key for key in saved_weight_names(tmp_path / "published") if key.startswith("queue.")]


def test_save_published_leaves_out_what_a_trainer_attached(tiny_encoder_dir, tmp_path):
    """``save_published`` leaves out the same training-only modules as ``IFCLTrainer.save_model``: the objective a
    Trainer attached (its own weights) and the queue; the model keeps both, in their order."""
    from ifcl.publishing import TRAINING_ONLY, save_published

    model = IFCLModel.from_encoder(str(tiny_encoder_dir), objective="simcse", **WITHOUT_IFCL)
    model.training_objective = ProjectedSimCSE(model)
    order = list(model._modules)
    save_published(model, tmp_path / "published")
    assert not [key for key in saved_weight_names(tmp_path / "published") if key.split(".")[0] in TRAINING_ONLY]
    assert list(model._modules) == order and isinstance(model.training_objective, ProjectedSimCSE)


def test_simcse_objective_end_to_end(tiny_encoder_dir, english_sts_data, tmp_path):
    import run_ifcl

    output = tmp_path / "simcse"
    trainer, metrics = run_ifcl.main(objective_run_args(tiny_encoder_dir, english_sts_data, output, "simcse"))
    assert math.isfinite(metrics["test_stsb_spearman"])
    assert any("loss_contrastive" in entry for entry in trainer.state.log_history)
    config = json.loads((output / "config.json").read_text())["ifcl"]
    assert config["objective"] == "simcse" and config["queue_size"] == 0
    keys = saved_weight_names(output)
    assert not [key for key in keys if key.startswith(("fraternal_", "queue.", "training_objective."))]
    card = (output / "README.md").read_text()
    assert "**SimCSE**" in card and "gao2021simcse" in card and "| `objective` | `simcse` |" in card


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--objective", "simcse", "--pcl_beta", "2"], "--pcl_beta (--objective pcl)"),
        (["--objective", "pcl", "--fusion_rate=0.3"], "--fusion_rate (--objective ifcl)"),
        (["--objective", "micse", "--no-freeze-word-embeddings"], "--freeze_word_embeddings (--objective ifcl)"),
        (["--conisi_lambda", "0.5"], "--conisi_lambda (--objective conisi)"),
    ],
)
def test_settings_of_another_objective_are_refused(tmp_path, argv, named):
    import run_ifcl

    with pytest.raises(ValueError, match=re.escape(named)):
        run_ifcl.parse_arguments([*argv, "--output_dir", str(tmp_path)])


def test_settings_of_the_chosen_objective_and_shared_ones_pass(tmp_path):
    import run_ifcl

    for argv in (
        ["--objective", "pcl", "--pcl_beta", "2", "--temperature", "0.1"],
        ["--fusion_rate", "0.3", "--queue_size", "0", "--pooler_type", "cls"],
        ["--objective", "simcse", "--learning_rate", "3e-5"],
    ):
        run_ifcl.parse_arguments([*argv, "--output_dir", str(tmp_path)])
    arguments = tmp_path / "args.json"
    arguments.write_text(json.dumps({"objective": "simcse", "queue_size": 2, "output_dir": str(tmp_path)}))
    with pytest.raises(ValueError, match=re.escape("--queue_size (--objective ifcl)")):
        run_ifcl.parse_arguments([str(arguments)])


def test_unknown_objective_is_refused_before_anything_is_loaded(tmp_path):
    import run_ifcl

    with pytest.raises(ValueError, match="argument --objective: invalid choice: 'moco'"):
        run_ifcl.parse_arguments(["--objective", "moco", "--output_dir", str(tmp_path)])


@pytest.mark.slow
def test_help_lists_every_objective_setting():
    """``run_ifcl.py --help`` works (argparse formats every help text) and shows each objective's flags."""
    import subprocess
    import sys

    from conftest import ROOT

    shown = subprocess.run(
        [sys.executable, str(ROOT / "run_ifcl.py"), "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    for flag in ("--objective", "--conisi_strategy", "--pcl_num_positives", "--micse_attention_weight"):
        assert flag in shown.stdout


def test_resumed_micse_run_restores_its_momentum_encoder_and_queue(tiny_encoder_dir, tmp_path):
    """The objective's own state (miCSE's momentum encoder and its queue of negatives) lives in the checkpoint:
    stopping after 3 steps and resuming gives the losses of the uninterrupted run, and the same queue."""
    from datasets import Dataset

    def fresh_trainer(output: str) -> IFCLTrainer:
        settings = {"micse_attention_layers": "top2", "micse_num_samples": 20, "micse_queue_size": 6}
        model = IFCLModel.from_encoder(
            str(tiny_encoder_dir), objective="micse", objective_settings=settings, queue_size=0
        )
        args = cpu_training_args(
            output,
            max_steps=6,
            per_device_train_batch_size=2,
            learning_rate=1e-3,
            logging_steps=1,
            save_strategy="steps",
            save_steps=3,
            seed=0,
        )
        dataset = Dataset.from_dict(dict(model.tokenizer(ENGLISH)))
        return IFCLTrainer(model=model, args=args, train_dataset=dataset)

    expected, got, uninterrupted, resumed = train_and_resume(fresh_trainer, tmp_path, "checkpoint-3")
    for step in (4, 5, 6):
        assert got[step] == pytest.approx(expected[step], abs=1e-6), step
    queue_a, queue_b = uninterrupted.objective.queue, resumed.objective.queue
    assert ring.size(queue_a) == 6
    torch.testing.assert_close(queue_a.embeddings, queue_b.embeddings, atol=1e-6, rtol=0)
    momentum_a = dict(uninterrupted.objective.momentum_encoder.named_parameters())
    for name, value in resumed.objective.momentum_encoder.named_parameters():
        torch.testing.assert_close(value, momentum_a[name], atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "objective, extra",
    [
        ("conisi", ["--max_seq_length", "16"]),  # heads outside the encoder
        ("pcl", ["--pcl_num_positives", "2", "--pcl_untied_peer"]),  # a second trainable network
        ("micse", ["--micse_attention_layers", "top2", "--micse_num_samples", "20", "--micse_queue_size", "8"]),
    ],
)
@pytest.mark.slow
def test_two_processes_keep_the_objective_modules_in_sync(
    objective, extra, tiny_encoder_dir, english_sts_data, tmp_path
):
    """Under DDP every rank ends with the same weights, the objective's own modules included (their gradients are
    averaged although they run outside the encoder's forward), and the same momentum queue."""
    output = tmp_path / objective
    args = objective_run_args(tiny_encoder_dir, english_sts_data, output, objective, *extra)
    args = [a for a in args if a != "--use_cpu"]  # launch adds it for several processes
    args += ["--per_device_train_batch_size", "2", "--eval_strategy", "no", "--save_strategy", "no"]
    args += ["--load_best_model_at_end", "false", "--max_steps", "3", "--learning_rate", "1e-3"]
    result = launch(args, processes=2, script="tests/distributed_run.py")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    states = [torch.load(output / f"state_rank{rank}.pt") for rank in (0, 1)]
    own = [name for name in states[0] if name.startswith("training_objective.")]
    assert own, "the objective's modules are not in the model's state"
    initial = IFCLModel.from_encoder(str(tiny_encoder_dir), objective=objective, queue_size=0).state_dict()
    word_table = "bert.embeddings.word_embeddings.weight"  # the encoder under its own base_model_prefix
    assert not torch.equal(states[0][word_table], initial[word_table])  # it trained
    # BatchNorm's running statistics (ConIsI's heads) follow each process's own batches (decision in conisi.py);
    # they are not used to embed.
    batchnorm_statistics = ("running_mean", "running_var", "num_batches_tracked")
    for name, value in states[0].items():
        if name.endswith(batchnorm_statistics):
            continue
        torch.testing.assert_close(states[1][name], value, atol=1e-6, rtol=0, msg=lambda m, n=name: f"{n}: {m}")
