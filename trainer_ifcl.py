"""``IFCLTrainer``: the ``transformers`` Trainer with a training objective (IFCL or a peer method), its queue and
STS evaluation."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase, Trainer, TrainerCallback
from transformers.trainer_utils import get_last_checkpoint, speed_metrics

from ifcl.evaluation import STSEvaluator
from ifcl.objectives import Objective, build_objective, unwrap_model

logger = logging.getLogger(__name__)


@dataclass
class ObjectiveDataCollator:
    """The data collator of an objective: its :meth:`~ifcl.objectives.Objective.collate` hook (padding, and the
    augmentations some objectives make per batch)."""

    objective: Objective
    tokenizer: PreTrainedTokenizerBase
    fraternal_pad_token_id: int | None = None

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return self.objective.collate(features, self.tokenizer, self.fraternal_pad_token_id)


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase | None) -> Any:
    """What a tokenizer's output depends on, for cache fingerprints: its vocabulary and rules (a fast tokenizer's
    JSON without the truncation and padding a call sets), special tokens and class, so a tokenizer rewritten in the
    same folder gives new caches."""
    if tokenizer is None:
        return None
    if getattr(tokenizer, "is_fast", False):
        rules = json.loads(tokenizer.backend_tokenizer.to_str())
        rules.pop("truncation", None)
        rules.pop("padding", None)
    else:
        rules = sorted(tokenizer.get_vocab().items())
    return [type(tokenizer).__name__, tokenizer.name_or_path, len(tokenizer), rules, tokenizer.all_special_tokens]


def training_features_hook(
    objective: Objective,
    tokenizer: PreTrainedTokenizerBase,
    fraternal_tokenizer: PreTrainedTokenizerBase | None,
    max_length: int,
):
    """The objective's :meth:`~ifcl.objectives.Objective.tokenize` hook as a function of a batch of text rows."""

    def tokenize(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
        return objective.tokenize(batch, tokenizer, max_length, fraternal_tokenizer)

    return tokenize


def tokenize_training_text(
    dataset,
    objective: Objective,
    tokenizer: PreTrainedTokenizerBase,
    fraternal_tokenizer: PreTrainedTokenizerBase | None,
    max_length: int,
    num_proc: int | None = None,
    on_the_fly: bool = False,
):
    """The training features of a text ``datasets.Dataset`` (columns sentence[, fraternal]), made by the objective's
    :meth:`~ifcl.objectives.Objective.tokenize` hook.

    Once, with ``map``: a file-backed dataset gets its features cached beside it (datasets' ``cache-*.arrow``), read
    again by later runs and by the other processes. The hook holds the objective, whose modules (a peer network, a
    momentum encoder) datasets would otherwise pickle to fingerprint the map: the fingerprint is made from what the
    features depend on instead. With ``on_the_fly``, nothing is written: each row is tokenized when the data loader
    reads it (``with_transform``), for corpora whose token cache would not fit on disk; the features are the same.
    """
    from datasets.fingerprint import Hasher

    from ifcl.objectives import settings_as_dict

    tokenize = training_features_hook(objective, tokenizer, fraternal_tokenizer, max_length)
    if on_the_fly:
        return dataset.with_transform(tokenize)
    fingerprint = Hasher.hash(
        [
            dataset._fingerprint,
            objective.name,
            settings_as_dict(objective.settings),
            [tokenizer_fingerprint(t) for t in (tokenizer, fraternal_tokenizer or tokenizer)],
            max_length,
        ]
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


def check_training_data_size(num_rows: int, global_batch: int, queue_size: int) -> None:
    """Refuse training data smaller than one global batch, or than the k·N rows the hippocampus queue holds when it
    is on (its negatives would repeat the batch's own sentences). Shared by ``run_ifcl.py`` and the Python API."""
    if num_rows < global_batch:
        raise ValueError(
            f"{num_rows} training sentences are fewer than one global batch of {global_batch} (per-device batch × "
            "processes × gradient accumulation): lower per_device_train_batch_size or give more data."
        )
    if queue_size > 0 and num_rows < queue_size * global_batch:
        raise ValueError(
            f"{num_rows} training sentences are fewer than the hippocampus queue holds (k·N = {queue_size} × "
            f"{global_batch}): its negatives would repeat the batch's own sentences. Lower queue_size or give more "
            "data."
        )


def check_text_dataset(dataset, columns: tuple[str, ...] = ("sentence", "fraternal")) -> None:
    """Refuse an empty training set, and text columns that hold anything but non-empty strings, naming the column
    and the first bad row (read with Arrow: no row becomes a Python object)."""
    import pyarrow.compute as pc
    from datasets import Value

    if len(dataset) == 0:
        raise ValueError("The training set is empty: give at least one global batch of sentences.")
    for column in columns:
        if column not in dataset.column_names:
            continue
        feature = dataset.features[column]
        if not (isinstance(feature, Value) and feature.dtype in ("string", "large_string")):
            raise ValueError(
                f"The training set's column {column!r} holds {feature}, not text: every row must be a sentence "
                "(a non-empty string)."
            )
        values = dataset.with_format("arrow")[column]
        blank = pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(values)), 0)
        bad = pc.fill_null(pc.or_kleene(pc.is_null(values), blank), True)
        row = pc.index(bad, True).as_py()
        if row >= 0:
            raise ValueError(
                f"The training set's column {column!r} has {values[row].as_py()!r} in row {row}: every row must be "
                "a sentence (a non-empty string). Drop or fill such rows first (dataset.filter)."
            )


def is_text_dataset(dataset) -> bool:
    """A ``datasets.Dataset`` of training text (a ``sentence`` column, no token ids yet, and no transform that
    tokenizes it on the fly)."""
    columns = getattr(dataset, "column_names", None)
    on_the_fly = getattr(dataset, "format", {}).get("type") == "custom"
    return isinstance(columns, list) and "sentence" in columns and "input_ids" not in columns and not on_the_fly


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
    makes sure no loss term went NaN or infinite since the last check."""

    def __init__(self, trainer: IFCLTrainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        self.trainer.objective.on_step_end(unwrap_model(self.trainer.model), self.trainer.gather_rows)
        if control.should_save:
            self.trainer.check_finite_loss(state.global_step)


class IFCLTrainer(Trainer):
    """Trainer for IFCL (Eq. 9), its ablations and the peer objectives, with STS Spearman evaluation.

    - ``objective``: the training objective (``ifcl/objectives/``); by default the one the model's config names
      (``IFCLConfig.objective``). It becomes the model's sub-module ``training_objective`` while training, so its own
      weights are optimized and checkpointed; :meth:`save_model` leaves it (and the queue) out of the published model.
    - ``compute_loss``: the objective's loss; its terms are logged (``loss_identical``, ``loss_fraternal``,
      ``loss_twins`` for IFCL).
    - After every optimizer step the objective's ``on_step_end`` gets the unwrapped model and :meth:`gather_rows`
      (IFCL pushes the anchors of all processes into its queue, miCSE its momentum embeddings).
    - ``eval_dataset``: STS sets (``datasets.Dataset`` with sentence1, sentence2, score, or :class:`STSEvaluator`),
      a dict of them gives ``eval_<name>_spearman`` (× 100), usable as ``metric_for_best_model``.
    """

    def __init__(self, model=None, args=None, *rest, objective: Objective | None = None, **kwargs) -> None:
        if model is None:
            raise ValueError("IFCLTrainer needs a model (an IFCLModel); model_init is not supported.")
        self.objective = objective if objective is not None else build_objective(model)
        # A sub-module of the model: optimizer, data parallelism, device moves and checkpoints take its weights.
        model.training_objective = self.objective
        if args is not None and args.remove_unused_columns:
            # Objectives read features that are not arguments of the model's forward (pair inputs, ...).
            args.remove_unused_columns = False
        if not rest:
            tokenizer = kwargs.get("processing_class") or model.tokenizer
            if kwargs.get("data_collator") is None:
                # The objective's own collator (padding each feature group, per-batch augmentations).
                kwargs["data_collator"] = ObjectiveDataCollator(
                    self.objective, tokenizer, model.config.fraternal_pad_token_id
                )
            if is_text_dataset(kwargs.get("train_dataset")):
                check_text_dataset(kwargs["train_dataset"])
                kwargs["train_dataset"] = self.tokenize_text(kwargs["train_dataset"], model, tokenizer)
        super().__init__(model, args, *rest, **kwargs)
        self.size_queue_for_global_batch()
        self.check_training_data_size()
        # compute_loss returns a per-micro-batch mean: the Trainer divides it by the accumulation steps.
        self.loss_is_scaled_for_ga = False
        self._loss_sums: dict[str, torch.Tensor] = {}
        self._loss_count = 0
        self._last_checked_step = 0
        # CPU seconds this process spent in STS evaluations, so that training time can be told without them.
        self.evaluation_cpu_seconds = 0.0
        self.add_callback(ObjectiveStepCallback(self))

    def tokenize_text(self, dataset, model, tokenizer: PreTrainedTokenizerBase):
        """Tokenize a text training set with the objective's own hook (``model.config.max_seq_length``)."""
        needs_fraternal = self.objective.uses_fraternal_twins
        if needs_fraternal and "fraternal" not in dataset.column_names:
            raise ValueError(
                f"The training set has columns {dataset.column_names}, but IFCL with fraternal twins needs a "
                f"'fraternal' column (the translations) beside 'sentence'. Add one, or build the model with "
                f"fraternal_loss_weight=0 and twins_loss_weight=0."
            )
        if not needs_fraternal and "fraternal" in dataset.column_names:
            dataset = dataset.remove_columns("fraternal")
        fraternal_tokenizer = model.fraternal_tokenizer if needs_fraternal else None
        return tokenize_training_text(
            dataset, self.objective, tokenizer, fraternal_tokenizer, model.config.max_seq_length
        )

    def check_training_data_size(self) -> None:
        """Warn when the training set holds less than one global batch, or than the k·N rows of the queue: the
        queue's negatives would repeat the batch's own sentences (``run_ifcl.py`` refuses such data; the Python API
        warns, for experiments on small data)."""
        dataset = self.train_dataset
        if dataset is None or not hasattr(dataset, "__len__"):
            return
        queue = getattr(unwrap_model(self.model), "queue", None)
        try:
            check_training_data_size(
                len(dataset), global_batch_size(self.args), 0 if queue is None else queue.num_slots
            )
        except ValueError as problem:
            logger.warning(str(problem))

    def size_queue_for_global_batch(self) -> None:
        """Give the hippocampus queue one slot of N rows per optimizer step, N the global batch (per-device batch
        × processes × gradient accumulation), when the model was built for another N."""
        model = unwrap_model(self.model)
        queue = getattr(model, "queue", None)
        global_batch = global_batch_size(self.args)
        if queue is None or queue.slot_size == global_batch:
            return
        if len(queue):
            logger.warning(f"The hippocampus queue held {len(queue)} rows of N = {queue.slot_size}; it starts empty.")
        logger.info(f"Hippocampus queue: {queue.num_slots} slots of the global batch N = {global_batch}.")
        model.queue = type(queue)(queue.num_slots, global_batch, model.hidden_size, queue.forgetting_rate).to(
            queue.embeddings.device
        )
        model.config.queue_batch_size = global_batch

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

        The gather keeps the autograd graph (``torch.distributed.nn.functional.all_gather``): each process's loss
        sends gradient back to every process's candidates, so P processes of batch N train exactly like one
        process of batch P·N. Each column (identical, fraternal) is gathered on its own, in rank order; batches are
        equal in size across processes (accelerate's ``even_batches``).
        """
        if local is None or self.accelerator.num_processes == 1:
            return local, 0
        from torch.distributed.nn.functional import all_gather

        return torch.cat(all_gather(local.contiguous())), self.accelerator.process_index * local.shape[0]

    @torch.no_grad()
    def gather_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """The rows of all processes in rank order, without gradient (what an objective pushes into its queue);
        processes may hold different numbers of rows, at most one step's (per-device batch × accumulation)."""
        if self.accelerator.num_processes == 1:
            return rows
        capacity = self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps
        return gather_rows_in_one_collective(self.accelerator, rows, capacity)

    def check_finite_loss(self, step: int) -> None:
        """Stop with a message naming the step and the loss term when a term went NaN or infinite.

        Called at logging and before checkpoints (one host sync there, none per step), so the newest checkpoint
        on disk is always one trained on finite losses.
        """
        if not self._loss_count:
            return
        first_unchecked, self._last_checked_step = self._last_checked_step + 1, step
        names = sorted(self._loss_sums)
        sums = self.accelerator.reduce(torch.stack([self._loss_sums[name] for name in names]), reduction="sum")
        bad = [f"{name} = {value}" for name, value in zip(names, sums.tolist()) if not math.isfinite(value)]
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
            self.check_finite_loss(self.state.global_step)
            names = sorted(self._loss_sums)
            means = torch.stack([self._loss_sums[name] for name in names]) / self._loss_count
            means = self.accelerator.reduce(means, reduction="mean")
            logs.update(dict(zip(names, means.tolist())))
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
        evaluator = dataset if isinstance(dataset, STSEvaluator) else STSEvaluator.from_dataset(dataset)
        start, cpu_start = time.time(), time.process_time()
        model = unwrap_model(self.model)
        scores = evaluator(model, batch_size=self.args.per_device_eval_batch_size)
        self.evaluation_cpu_seconds += time.process_time() - cpu_start
        metrics = {f"{metric_key_prefix}_{name}": value for name, value in scores.items()}
        metrics.update(speed_metrics(metric_key_prefix, start, num_samples=len(evaluator)))
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    # ---------------------------------------------------------------- publishing

    @contextmanager
    def published_model(self) -> Iterator[torch.nn.Module]:
        """The model without what only training needs, restored after: the objective's own modules (heads, peer
        network, momentum encoder) and the hippocampus queue (past anchors of this run's batches; a loaded model
        starts it empty). Checkpoints keep both, for exact resume."""
        model = unwrap_model(self.model)
        modules = dict(model._modules)
        for name in ("training_objective", "queue"):
            model._modules.pop(name, None)
        try:
            yield model
        finally:
            model._modules.clear()
            model._modules.update(modules)  # in their order

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

    def train_or_finish(self, resume) -> dict[str, float]:
        """Train (from the checkpoint of ``resume``, a :class:`~ifcl.checkpoints.ResumePoint`, when resuming), or, when that checkpoint already ends the planned
        training, take up its state and final model without a step. Returns the train metrics."""
        if resume is not None and resume.finished:
            self.finish_from_checkpoint(resume.checkpoint)
            return {"train_steps": self.state.global_step}
        cpu_started, evaluation_started = time.process_time(), self.evaluation_cpu_seconds
        train_result = self.train(resume_from_checkpoint=resume.checkpoint if resume is not None else None)
        metrics = dict(train_result.metrics)
        steps = max(self.state.global_step, 1)
        metrics["train_steps"] = self.state.global_step
        metrics["train_seconds_per_step"] = metrics["train_runtime"] / steps
        # CPU time of the process (all its threads): unlike the wall time, not lengthened by other processes that share
        # the cores; the STS evaluations during training are counted apart, so steps compare without them.
        metrics["train_cpu_seconds"] = time.process_time() - cpu_started
        metrics["train_evaluation_cpu_seconds"] = self.evaluation_cpu_seconds - evaluation_started
        spent = metrics["train_cpu_seconds"] - metrics["train_evaluation_cpu_seconds"]
        metrics["train_cpu_seconds_per_step"] = spent / steps
        return metrics

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Checkpoints keep the objective's modules (exact resume); the model saved at the end leaves them out, so
        every published model loads with ``AutoModel`` and embeds the same way whatever it was trained with."""
        if _internal_call:
            return super().save_model(output_dir, _internal_call)
        with self.published_model():
            super().save_model(output_dir, _internal_call)

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
        write_model_card(
            self.args.output_dir,
            unwrap_model(self.model).config,
            results,
            training_args=self.args,
            model_name=model_name or self.args.hub_model_id or os.path.basename(os.path.abspath(self.args.output_dir)),
            **kwargs,
        )
