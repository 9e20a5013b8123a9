"""``IFCLTrainer``: the ``transformers`` Trainer with the IFCL loss, the hippocampus queue and STS evaluation."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import get_last_checkpoint, speed_metrics

from evaluation_ifcl import STSEvaluator
from losses_ifcl import IFCLLoss


@dataclass
class IFCLDataCollator:
    """Pads the sentence fields and the fraternal fields of a batch, each to their own longest sequence.

    The model pads the shorter of the two to the other's length when it fuses them (Eq. 3), so the anchors are
    not padded to the (often longer) translations when the views are encoded separately.
    """

    pad_token_id: int
    fraternal_pad_token_id: int | None = None

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        fraternal_pad = self.fraternal_pad_token_id if self.fraternal_pad_token_id is not None else self.pad_token_id
        groups = {
            "input_ids": {"input_ids": self.pad_token_id, "attention_mask": 0, "token_type_ids": 0},
            "fraternal_input_ids": {"fraternal_input_ids": fraternal_pad, "fraternal_attention_mask": 0},
        }
        batch = {}
        for lead, fields in groups.items():
            if lead not in features[0]:
                continue
            length = max(len(feature[lead]) for feature in features)
            for key, pad in fields.items():
                if key in features[0]:
                    rows = [list(f[key]) + [pad] * (length - len(f[key])) for f in features]
                    batch[key] = torch.tensor(rows, dtype=torch.long)
        return batch


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite."""


class HippocampusQueueCallback(TrainerCallback):
    """After each optimizer step: pushes the step's anchors into the queue (once per step, not per micro-batch),
    and before a checkpoint is written, makes sure no loss term went NaN or infinite since the last check."""

    def __init__(self, trainer: IFCLTrainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        self.trainer.update_queue()
        if control.should_save:
            self.trainer.check_finite_loss(state.global_step)


class IFCLTrainer(Trainer):
    """Trainer for IFCL (Eq. 9) and its ablations, with STS Spearman evaluation.

    - ``compute_loss``: ℓ^I with the queue's weighted negatives, ℓ^F and ℓ^T, as set in the model's config; the
      terms are logged as ``loss_identical``, ``loss_fraternal``, ``loss_twins``.
    - The queue takes the anchors of all processes after every optimizer step.
    - ``eval_dataset``: STS sets (``datasets.Dataset`` with sentence1, sentence2, score, or :class:`STSEvaluator`),
      a dict of them gives ``eval_<name>_spearman`` (× 100), usable as ``metric_for_best_model``.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        config = self.model.config
        self.ifcl_loss = IFCLLoss.from_config(config)
        # compute_loss returns a per-micro-batch mean: the Trainer divides it by the accumulation steps.
        self.loss_is_scaled_for_ga = False
        self._pending_anchors: list[torch.Tensor] = []
        self._loss_sums: dict[str, torch.Tensor] = {}
        self._loss_count = 0
        self._last_checked_step = 0
        self.add_callback(HippocampusQueueCallback(self))

    # ---------------------------------------------------------------- training

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        ifcl_model = self.accelerator.unwrap_model(model)
        if ifcl_model.config.uses_fraternal_twins and "fraternal_input_ids" not in inputs:
            raise ValueError(
                "The batch has no fraternal_input_ids, but fraternal_loss_weight or twins_loss_weight is > 0: "
                "give a fraternal (translation) column, or set both weights to 0."
            )
        twins = model(**inputs, return_twins=True)
        queue = ifcl_model.queue
        queue_embeddings, queue_log_coefficients = queue.entries() if queue is not None else (None, None)
        identical_candidates, label_offset = self.gather_candidates(twins.identical)
        fraternal_candidates, _ = self.gather_candidates(twins.fraternal)
        loss, components = self.ifcl_loss(
            twins, queue_embeddings, queue_log_coefficients, identical_candidates, fraternal_candidates, label_offset
        )
        if model.training:
            if queue is not None:
                self._pending_anchors.append(twins.anchor.detach().float())
            for name, value in components.items():
                self._loss_sums[name] = self._loss_sums.get(name, 0.0) + value
            self._loss_count += 1
        return (loss, twins) if return_outputs else loss

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
    def update_queue(self) -> None:
        """Push the anchors of the step just finished, gathered from all processes, into the queue."""
        if not self._pending_anchors:
            return
        anchors = torch.cat(self._pending_anchors)
        self._pending_anchors.clear()
        if self.accelerator.num_processes > 1:
            count = torch.tensor([anchors.shape[0]], device=anchors.device)
            counts = self.accelerator.gather(count)
            padded = self.accelerator.pad_across_processes(anchors, dim=0)
            gathered = self.accelerator.gather(padded).view(len(counts), padded.shape[0], -1)
            keep = torch.arange(padded.shape[0], device=anchors.device) < counts.unsqueeze(1)
            anchors = gathered[keep]
        self.accelerator.unwrap_model(self.model).queue.push(anchors)

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
            kept = f"the last good checkpoint is {checkpoint}" if checkpoint else "no checkpoint was written yet"
            raise NonFiniteLossError(
                f"Training stopped: the loss became NaN or infinite between step {first_unchecked} and step {step} "
                f"({', '.join(bad)}); {kept}. Lower the learning rate, or use bf16 rather than fp16."
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
        start = time.time()
        model = self.accelerator.unwrap_model(self.model)
        scores = evaluator(model, batch_size=self.args.per_device_eval_batch_size)
        metrics = {f"{metric_key_prefix}_{name}": value for name, value in scores.items()}
        metrics.update(speed_metrics(metric_key_prefix, start, num_samples=len(evaluator)))
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    # ---------------------------------------------------------------- publishing

    def create_model_card(self, model_name: str | None = None, **kwargs) -> None:
        """Write README.md in the output folder: STS results, IFCL settings, how to load (see ``model_card_ifcl``)."""
        if not self.is_world_process_zero():
            return
        from model_card_ifcl import write_model_card

        results_path = os.path.join(self.args.output_dir, "all_results.json")
        results = {}
        if os.path.isfile(results_path):
            with open(results_path, encoding="utf-8") as f:
                results = json.load(f)
        write_model_card(
            self.args.output_dir,
            self.accelerator.unwrap_model(self.model).config,
            results,
            training_args=self.args,
            model_name=model_name or self.args.hub_model_id or os.path.basename(os.path.abspath(self.args.output_dir)),
            **kwargs,
        )
