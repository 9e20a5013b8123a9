"""``IFCLTrainer``: the ``transformers`` Trainer with a training objective (IFCL or a peer method), its queue and
STS evaluation."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase, Trainer, TrainerCallback
from transformers.trainer_utils import get_last_checkpoint, speed_metrics

from ifcl.data import check_text_dataset, is_text_dataset
from ifcl.evaluation import STSEvaluator
from ifcl.objectives import Objective, build_objective, unwrap_model
from ifcl.objectives.base import tokenizer_fingerprint
from ifcl.publishing import adopt_base, without_training_state

logger = logging.getLogger(__name__)


@dataclass
class ObjectiveDataCollator:
    """The data collator of an objective: its :meth:`~ifcl.objectives.Objective.collate` hook (padding, and the
    augmentations some objectives make per batch)."""

    objective: Objective
    tokenizer: PreTrainedTokenizerBase

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return self.objective.collate(features, self.tokenizer)


def tokenize_training_text(
    dataset, objective: Objective, tokenizer: PreTrainedTokenizerBase, max_length: int, num_proc=None, on_the_fly=False
):
    """The training features of a text ``datasets.Dataset`` (the objective's ``text_columns``), made by the
    objective's :meth:`~ifcl.objectives.Objective.tokenize` hook.

    Once, with ``map``: a file-backed dataset gets its features cached beside it (datasets' ``cache-*.arrow``), read
    again by later runs and by the other processes. The fingerprint is made from what the features depend on (the
    objective's name and :meth:`~ifcl.objectives.Objective.feature_key`, the tokenizer and ``max_length``): datasets
    would otherwise pickle the objective's modules to make it, and a setting the tokens do not depend on (IFCL's
    queue, forgetting rate, loss weights) keeps the cache. With ``on_the_fly`` nothing is written: each row is
    tokenized when the data loader reads it (``with_transform``), for corpora whose token cache would not fit on
    disk; the features are the same.
    """
    from datasets.fingerprint import Hasher

    def tokenize(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
        return objective.tokenize(batch, tokenizer, max_length)

    if on_the_fly:
        return dataset.with_transform(tokenize)
    fingerprint = Hasher.hash(
        [dataset._fingerprint, objective.name, objective.feature_key(), tokenizer_fingerprint(tokenizer), max_length]
    )
    return dataset.map(
        tokenize,
        batched=True,
        remove_columns=dataset.column_names,
        num_proc=num_proc,
        desc="Tokenizing",
        new_fingerprint=fingerprint,
    )


def global_batch_size(args) -> int:
    """Sentences per optimizer step over all processes: per-device batch × processes × gradient accumulation."""
    return args.per_device_train_batch_size * args.world_size * args.gradient_accumulation_steps


def gather_rows_in_one_collective(accelerator, rows: torch.Tensor, capacity: int) -> torch.Tensor:
    """The ``rows`` [n, d] of all processes in rank order, n ≤ ``capacity`` and possibly different per process, with
    one collective: each process sends ``capacity`` rows with a last column that marks the real ones (1) from the
    padding (0), and the marked rows of the gathered tensor are kept."""
    if rows.shape[0] > capacity:
        raise ValueError(f"{rows.shape[0]} rows to gather, more than the {capacity} a process holds in a step.")
    packed = rows.new_zeros((capacity, rows.shape[1] + 1))
    packed[: rows.shape[0], :-1] = rows
    packed[: rows.shape[0], -1] = 1
    gathered = accelerator.gather(packed)
    return gathered[gathered[:, -1] > 0, :-1]


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite."""


class ObjectiveStepCallback(TrainerCallback):
    """After each optimizer step: pushes the step's rows into the objective's queue (once per step, not per
    micro-batch) and runs the objective's own step-end work (momentum updates); before a checkpoint is written,
    makes sure no loss term went NaN or infinite since the last check (the step's log does, when one comes first)."""

    def __init__(self, trainer: IFCLTrainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        self.trainer.objective.on_step_end(unwrap_model(self.trainer.model), self.trainer.gather_rows)
        if control.should_save and not control.should_log:  # else the step's log, before the save, checks
            self.trainer.check_finite_loss(state.global_step)


class IFCLTrainer(Trainer):
    """The ``transformers`` Trainer for IFCL (Eq. 9), its ablations and the peer objectives, with STS evaluation.

    Args:
        model: an ``IFCLModel`` (``IFCLModel.from_encoder`` or ``from_pretrained``).
        args: ``TrainingArguments`` (``remove_unused_columns`` is turned off: objectives read more columns than
            the model's ``forward`` takes).
        train_dataset: a text ``datasets.Dataset`` with the objective's columns (``sentence``, and ``fraternal`` for
            IFCL's fraternal twins), checked and tokenized by the objective, or features already tokenized.
        eval_dataset: STS sets (``datasets.Dataset`` with sentence1, sentence2, score, or ``STSEvaluator``); a dict
            of them gives ``eval_<name>_spearman`` (× 100), usable as ``metric_for_best_model``.
        objective: the training objective; default the one the model's config names (``build_objective``). It is
            the model's sub-module ``training_objective`` while training, so that its own weights are optimized and
            checkpointed.
        kwargs: the Trainer's other arguments; the default data collator is the objective's.

    ``compute_loss`` is the objective's loss, whose terms are logged (``loss_identical``, ``loss_fraternal``,
    ``loss_twins`` for IFCL). After each optimizer step the objective's ``on_step_end`` runs (IFCL pushes the anchors
    of all processes into the queue). :meth:`save_model` writes the published model (the objective's modules and its
    training state left out) with its sentence-transformers view; checkpoints keep everything for exact resume.
    """

    def __init__(self, model=None, args=None, *rest, objective: Objective | None = None, **kwargs) -> None:
        if model is None:
            raise ValueError("IFCLTrainer needs a model (an IFCLModel); model_init is not supported.")
        if not hasattr(model, "sentence_transformers_base"):  # from_encoder and run_ifcl.py adopt it as they build
            adopt_base(model)  # the base's truncation and lowercasing, and the facts of the view save_model writes
        kwargs.setdefault("processing_class", model.tokenizer)  # saved with checkpoints and the published model
        self.objective = objective if objective is not None else build_objective(model)
        model.training_objective = self.objective  # optimizer, data parallelism and checkpoints take its weights
        if args is not None and args.remove_unused_columns:
            args.remove_unused_columns = False
        if not rest:
            tokenizer = kwargs.get("processing_class") or model.tokenizer
            if kwargs.get("data_collator") is None:
                kwargs["data_collator"] = ObjectiveDataCollator(self.objective, tokenizer)
            if is_text_dataset(kwargs.get("train_dataset")):
                kwargs["train_dataset"] = self.tokenize_text(kwargs["train_dataset"], tokenizer, model)
        super().__init__(model, args, *rest, **kwargs)
        self.objective.prepare(unwrap_model(self.model), global_batch_size(self.args))
        if self.train_dataset is not None and hasattr(self.train_dataset, "__len__"):
            try:
                config = unwrap_model(self.model).config
                self.objective.check_data_size(config, len(self.train_dataset), global_batch_size(self.args))
            except ValueError as problem:  # run_ifcl.py refuses such data; the Python API warns
                logger.warning(str(problem))
        # compute_loss returns a per-micro-batch mean: the Trainer divides it by the accumulation steps.
        self.loss_is_scaled_for_ga = False
        self._loss_sums: dict[str, torch.Tensor] = {}
        self._loss_count = 0
        self._last_checked_step = 0
        # CPU seconds this process spent in STS evaluations, so that training time can be told without them.
        self.evaluation_cpu_seconds = 0.0
        self.add_callback(ObjectiveStepCallback(self))

    def tokenize_text(self, dataset, tokenizer: PreTrainedTokenizerBase, model):
        """Check a text training set (the objective's columns: strings, none empty) and tokenize it with the
        objective's own hook at ``model.config.max_seq_length``; columns the objective does not read are dropped."""
        columns = self.objective.text_columns
        check_text_dataset(dataset, columns, reader=f"--objective {self.objective.name}")
        dataset = dataset.select_columns(list(columns))
        return tokenize_training_text(dataset, self.objective, tokenizer, model.config.max_seq_length)

    # ---------------------------------------------------------------- training

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        output = self.objective(model, inputs, self.gather_candidates)
        if model.training:
            for name, value in output.components.items():
                self._loss_sums[name] = self._loss_sums.get(name, 0.0) + value
            self._loss_count += 1
        return (output.loss, output) if return_outputs else output.loss

    def gather_candidates(self, local: torch.Tensor | None) -> tuple[torch.Tensor | None, int]:
        """The in-batch candidates of all processes, and where this process's rows start among them.

        The gather keeps the autograd graph (``all_gather_single_autograd``): each process's loss
        sends gradient back to every process's candidates, so P processes of batch N train exactly like one
        process of batch P·N. Each column (identical, fraternal) is gathered on its own, in rank order; batches are
        equal in size across processes (accelerate's ``even_batches``).
        """
        if local is None or self.accelerator.num_processes == 1:
            return local, 0
        from torch.distributed import group
        from torch.distributed._functional_collectives import all_gather_single_autograd

        gathered = all_gather_single_autograd(local.contiguous(), gather_dim=0, group=group.WORLD)
        return gathered, self.accelerator.process_index * local.shape[0]

    @torch.no_grad()
    def gather_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """The rows of all processes in rank order, without gradient (what an objective pushes into its queue);
        processes may hold different numbers of rows, at most one step's (per-device batch × accumulation)."""
        if self.accelerator.num_processes == 1:
            return rows
        capacity = self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps
        return gather_rows_in_one_collective(self.accelerator, rows, capacity)

    def reduced_loss_sums(self) -> tuple[list[str], torch.Tensor]:
        """The loss terms' names and their sums since the last training log, summed over processes (one
        collective)."""
        names = sorted(self._loss_sums)
        sums = torch.stack([self._loss_sums[name] for name in names])
        return names, self.accelerator.reduce(sums, reduction="sum")

    def check_finite_loss(self, step: int, sums: dict[str, float] | None = None) -> None:
        """Stop with a message naming the step and the loss term when a term went NaN or infinite.

        Called at logging and before checkpoints no log precedes (one collective and host sync there, none per
        step), so the newest checkpoint on disk is always one trained on finite losses. ``sums``: the terms' sums
        over processes when the caller has them (:meth:`log`), else reduced here.
        """
        if not self._loss_count:
            return
        first_unchecked, self._last_checked_step = self._last_checked_step + 1, step
        if sums is None:
            names, reduced = self.reduced_loss_sums()
            sums = dict(zip(names, reduced.tolist()))
        bad = [f"{name} = {value}" for name, value in sums.items() if not math.isfinite(value)]
        if bad:
            checkpoint = get_last_checkpoint(self.args.output_dir) if os.path.isdir(self.args.output_dir) else None
            kept = (
                f"the newest checkpoint, {checkpoint}, was saved before step {first_unchecked}"
                if checkpoint
                else "no checkpoint was written yet"
            )
            raise NonFiniteLossError(
                f"Training stopped: the loss became NaN or infinite between step {first_unchecked} and step {step} "
                f"({', '.join(bad)}); {kept}. The weights were finite when loaded, so the cause lies in training: "
                "lower the learning rate, use bf16 rather than fp16, or look for broken training text."
            )

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Adds the mean of each loss term since the last training log, averaged over processes."""
        if "loss" in logs and self._loss_count:
            # One collective and one host sync: every process runs as many micro-batches, so the mean over
            # processes of each one's mean is the summed total over count × processes.
            names, sums = self.reduced_loss_sums()
            means = sums / (self._loss_count * self.accelerator.num_processes)
            sums_list, means_list = torch.stack([sums, means]).tolist()
            self.check_finite_loss(self.state.global_step, dict(zip(names, sums_list)))
            logs.update(dict(zip(names, means_list)))
            self._loss_sums.clear()
            self._loss_count = 0
        super().log(logs, start_time)

    # ---------------------------------------------------------------- evaluation

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """STS Spearman × 100 of the evaluation embeddings (``<prefix>_spearman``, ``<prefix>_pearson``).

        A dict of STS sets is handled by the Trainer itself, which calls back here once per set with the name
        added to the prefix. Every process computes the same figures, so no gathering is needed.
        """
        dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        if isinstance(dataset, dict):
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        if isinstance(dataset, str):
            dataset = self.eval_dataset[dataset]
        if not isinstance(dataset, STSEvaluator):  # named for its progress bar: "STS eval_stsb", "STS init_test_stsb"
            dataset = STSEvaluator.from_dataset(dataset, name=metric_key_prefix)
        start, cpu_start = time.time(), time.process_time()
        # The evaluator's own batch, not the Trainer's eval batch for classification; one progress bar, the main's.
        show_progress_bar = self.is_local_process_zero() and not self.args.disable_tqdm
        scores = dataset(unwrap_model(self.model), show_progress_bar=show_progress_bar)
        self.evaluation_cpu_seconds += time.process_time() - cpu_start
        metrics = {f"{metric_key_prefix}_{name}": value for name, value in scores.items()}
        metrics.update(speed_metrics(metric_key_prefix, start, num_samples=len(dataset)))
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    # ---------------------------------------------------------------- publishing

    def published_model(self) -> AbstractContextManager[torch.nn.Module]:
        """The model without what only training needs (``ifcl.publishing.TRAINING_ONLY``), restored after: the
        objective's own modules (heads, peer network, momentum encoder) and IFCL's queue (a loaded model starts it
        empty). Checkpoints keep both, for exact resume."""
        return without_training_state(unwrap_model(self.model))

    def finish_from_checkpoint(self, checkpoint: str) -> None:
        """Take up a run whose training had ended when it stopped (before its results were written): the Trainer's
        state from ``checkpoint`` and the model training ended with (the best checkpoint when
        ``load_best_model_at_end`` kept one, else ``checkpoint``), without training a step."""
        from transformers.trainer_callback import TrainerState

        self.state = TrainerState.load_from_json(os.path.join(checkpoint, "trainer_state.json"))
        best = self.state.best_model_checkpoint
        final = best if self.args.load_best_model_at_end and best and os.path.isdir(best) else checkpoint
        logger.info(f"Training had ended at step {self.state.global_step}; the final model is {final}.")
        self._load_from_checkpoint(final)

    def train_measured(self, resume_from_checkpoint: str | None = None) -> dict[str, float]:
        """``train``, and its metrics with the steps and the CPU time per step: the process's CPU time (all its
        threads), which other processes sharing the cores do not lengthen, less the STS evaluations' own."""
        cpu_started, evaluation_started = time.process_time(), self.evaluation_cpu_seconds
        metrics = dict(self.train(resume_from_checkpoint=resume_from_checkpoint).metrics)
        steps = max(self.state.global_step, 1)
        metrics["train_steps"] = self.state.global_step
        metrics["train_seconds_per_step"] = metrics["train_runtime"] / steps
        metrics["train_cpu_seconds"] = time.process_time() - cpu_started
        metrics["train_evaluation_cpu_seconds"] = self.evaluation_cpu_seconds - evaluation_started
        spent = metrics["train_cpu_seconds"] - metrics["train_evaluation_cpu_seconds"]
        metrics["train_cpu_seconds_per_step"] = spent / steps
        return metrics

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Checkpoints keep the objective's modules (exact resume); the published model leaves them out, so that
        every published model loads alike whatever it was trained with, and gets its sentence-transformers view."""
        if _internal_call:
            return super().save_model(output_dir, _internal_call)
        with self.published_model() as model:
            super().save_model(output_dir, _internal_call)
            if self.args.should_save:
                from ifcl.publishing import save_extras

                save_extras(model, output_dir or self.args.output_dir)

    def save_state(self) -> None:
        """The Trainer's ``trainer_state.json`` in the output folder, published with the model: its best checkpoint
        named relative to that folder (``checkpoint-200``), never by a path of the training machine. Checkpoints keep
        their own copy as the Trainer writes it, for resuming."""
        super().save_state()
        if not self.is_world_process_zero() or not self.state.best_model_checkpoint:
            return
        path = os.path.join(self.args.output_dir, "trainer_state.json")
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
        best = os.path.abspath(state["best_model_checkpoint"])
        state["best_model_checkpoint"] = os.path.relpath(best, os.path.abspath(self.args.output_dir))
        with open(path, "w", encoding="utf-8") as f:
            json.dump(state, f, indent=2, sort_keys=True)
            f.write("\n")

    def create_model_card(self, model_name: str | None = None, **kwargs) -> None:
        """Write README.md in the output folder: STS results, IFCL settings, how to load (see ``ifcl.model_card``)."""
        if not self.is_world_process_zero():
            return
        from ifcl.model_card import write_model_card

        results_path = os.path.join(self.args.output_dir, "all_results.json")
        results = {}
        if os.path.isfile(results_path):
            with open(results_path, encoding="utf-8") as f:
                results = json.load(f)
        kwargs.setdefault("log_history", self.state.log_history)
        if self.train_dataset is not None and hasattr(self.train_dataset, "__len__"):
            kwargs.setdefault("train_size", len(self.train_dataset))
        write_model_card(
            self.args.output_dir,
            unwrap_model(self.model).config,
            results,
            training_args=self.args,
            model_name=model_name or self.args.hub_model_id or os.path.basename(os.path.abspath(self.args.output_dir)),
            **kwargs,
        )
