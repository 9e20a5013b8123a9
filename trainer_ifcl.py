"""``IFCLTrainer``: the ``transformers`` Trainer with a training objective (IFCL or a peer method), its queue and
STS evaluation."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass, fields
from typing import Any

import datasets
import torch
from torch.distributed import group
from torch.distributed._functional_collectives import all_gather_single_autograd
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import get_device_states, set_device_states
from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer, TrainerCallback
from transformers.trainer_callback import ExportableState, TrainerState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint, has_length, speed_metrics

from ifcl.data import ShuffledRows
from ifcl.files import read_json, write_json_atomically
from ifcl.lora import save_adapters
from ifcl.model import dtype_name
from ifcl.model_card import CardFacts, write_model_card
from ifcl.objectives import Objective, build_objective, unwrap_model
from ifcl.objectives.base import TOKEN_FIELDS, Embeddings
from ifcl.publishing import save_view, without_training_state
from ifcl.streaming import StreamBatches, TrainingStream
from ifcl.sts.evaluator import STSEvaluator
from ifcl.tokenization import without_processor_class

logger = logging.getLogger(__name__)


@dataclass
class ObjectiveDataCollator:
    """The data collator of an objective: its :meth:`~ifcl.objectives.Objective.collate` hook (padding, and the
    augmentations some objectives make per batch)."""

    objective: Objective
    tokenizer: PreTrainedTokenizerBase

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return self.objective.collate(features, self.tokenizer)


def global_batch_size(args) -> int:
    """Sentences per optimizer step over all processes: per-device batch × processes × gradient accumulation."""
    return args.per_device_train_batch_size * args.world_size * args.gradient_accumulation_steps


def check_cache_mini_batch_size(size: Any, args, objective: type[Objective] | Objective) -> None:
    """The one check of a gradient cache's mini-batch (``run_ifcl.py`` makes it before any model loads,
    ``IFCLTrainer`` for the Python API): ``TypeError`` or ``ValueError``, in one line, for a size that is not a whole
    number between 1 and the per-device batch, or one the objective cannot take on the run's processes."""
    if isinstance(size, bool) or not isinstance(size, int):
        raise TypeError(f"--cache_mini_batch_size must be a whole number of sentences, got {size!r}.")
    if not 1 <= size <= args.per_device_train_batch_size:
        raise ValueError(
            f"--cache_mini_batch_size {size} must lie between 1 and the per-device batch, "
            f"--per_device_train_batch_size {args.per_device_train_batch_size}."
        )
    reason = objective.gradient_cache_refusal(args.world_size)
    if reason:
        raise ValueError(f"--cache_mini_batch_size with --objective {objective.name}: {reason}")


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


class RandomState:
    """The CPU and accelerator random states before a mini-batch's first forward (its dropout masks), replayed for
    its second: GradCache's ``RandContext``."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        self.cpu = torch.get_rng_state()
        self.devices, self.device_states = get_device_states(*tensors)

    @contextmanager
    def replayed(self) -> Iterator[None]:
        """The recorded states for the block; the states of before it after."""
        with torch.random.fork_rng(devices=self.devices):
            torch.set_rng_state(self.cpu)
            set_device_states(self.devices, self.device_states)
            yield


def lengths_in_use(attention_mask: torch.Tensor, starts: range, size: int) -> list[int]:
    """For each mini-batch of ``size`` rows from ``starts``, the columns of ``attention_mask`` [B, L] up to the last one
    that any of its rows uses (L for rows padded on the left), read from the device once for all of them."""
    positions = torch.arange(1, attention_mask.shape[1] + 1, device=attention_mask.device)
    row_ends = (positions * attention_mask.bool()).amax(dim=1).tolist()
    return [max(1, *row_ends[start : start + size]) for start in starts]


def token_group_of(key: str) -> str | None:
    """The token group a batch's key belongs to (its prefix before a ``TOKEN_FIELDS`` name; "" the sentences), None
    for a key of no group."""
    return next((key.removesuffix(name) for name in TOKEN_FIELDS if key.endswith(name)), None)


def mini_batches(inputs: dict[str, Any], size: int, groups_at_own_length: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The batch cut into consecutive mini-batches of ``size`` rows: every tensor whose first dimension is the
    batch's is cut, anything else kept whole. The token groups of ``groups_at_own_length`` (an objective's
    ``token_groups_at_own_length``) lose, in each mini-batch, the padding columns at the end that all its rows share,
    so that a mini-batch of short sentences goes through the encoder at its own length, as in sentence-transformers'
    cached losses, and not at the longest of the whole batch."""
    rows = inputs["input_ids"].shape[0]
    starts = range(0, rows, size)
    masks = {group: inputs.get(f"{group}attention_mask") for group in groups_at_own_length}
    lengths = {  # each group's length in the batch, and in each mini-batch
        group: (mask.shape[1], lengths_in_use(mask, starts, size))
        for group, mask in masks.items()
        if isinstance(mask, torch.Tensor) and mask.dim() == 2
    }

    def cut(key: str, value: Any, index: int) -> Any:
        if not (isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == rows):
            return value
        value = value[starts[index] : starts[index] + size]
        batch_length, used = lengths.get(token_group_of(key), (None, None))
        return value[:, : used[index]] if value.dim() == 2 and value.shape[1] == batch_length else value

    return [{key: cut(key, value, index) for key, value in inputs.items()} for index in range(len(starts))]


class GradientCache(torch.autograd.Function):
    """GradCache (Gao et al., 2021) as one autograd node whose outputs are a batch's embeddings (the objective's
    :meth:`~ifcl.objectives.Objective.embed` rows), so that the Trainer's own backward drives it.

    forward embeds the batch mini-batch by mini-batch without gradients, recording each one's random state and the
    autocast in force. The loss over the whole batch is computed on those embeddings; its backward (scaled for
    gradient accumulation and fp16 like any loss) reaches this node with each embedding's gradient, and backward
    embeds each mini-batch again, with gradients, under its replayed random state (the same dropout masks, so the same
    twins) and the same autocast, and back-propagates Σ embeddings · gradient: one mini-batch's activations at a time.
    """

    @staticmethod
    def forward(ctx, embed: Callable, batches: list, names: list, no_sync: Callable, _: torch.Tensor):
        ctx.set_materialize_grads(False)
        device_type = batches[0]["input_ids"].device.type
        ctx.autocast = {
            "device_type": device_type,
            "enabled": torch.is_autocast_enabled(device_type),
            "dtype": torch.get_autocast_dtype(device_type),
        }
        ctx.embed, ctx.batches, ctx.no_sync, ctx.states, parts = embed, batches, no_sync, [], []
        for batch in batches:
            ctx.states.append(RandomState(*(value for value in batch.values() if isinstance(value, torch.Tensor))))
            parts.append(embed(batch, False))
        names.extend(parts[0])
        ctx.names, ctx.sizes = list(names), [len(part[names[0]]) for part in parts]
        return tuple(torch.cat([part[name] for part in parts]) for name in names)

    @staticmethod
    def backward(ctx, *gradients: torch.Tensor | None):
        start = 0
        for index, (batch, state, size) in enumerate(zip(ctx.batches, ctx.states, ctx.sizes)):
            # Data parallelism reduces the gradients once, in the last mini-batch's backward.
            last = index == len(ctx.batches) - 1
            with torch.enable_grad(), state.replayed(), torch.autocast(**ctx.autocast):
                with nullcontext() if last else ctx.no_sync():
                    embeddings = ctx.embed(batch, True)
                    pairs = [
                        (embeddings[name], gradient[start : start + size])
                        for name, gradient in zip(ctx.names, gradients)
                        if gradient is not None and name in embeddings and embeddings[name].requires_grad
                    ]
                    if pairs:
                        torch.autograd.backward(*zip(*pairs))
            start += size
        return None, None, None, None, None


def embed_with_gradient_cache(
    objective: Objective, model: torch.nn.Module, inputs: dict[str, Any], mini_batch_size: int
) -> Embeddings:
    """The objective's :meth:`~ifcl.objectives.Objective.embed` rows of a batch through a :class:`GradientCache` of
    ``mini_batch_size`` rows: tensors whose backward runs the cache's re-forward."""
    names: list[str] = []
    no_sync = model.no_sync if isinstance(model, DistributedDataParallel) else nullcontext
    rows = GradientCache.apply(
        lambda batch, replay: objective.embed(model, batch, replay),
        mini_batches(inputs, mini_batch_size, objective.token_groups_at_own_length),
        names,
        no_sync,
        torch.empty(0, requires_grad=True),
    )
    return dict(zip(names, rows))


def parameter_counts(model: PreTrainedModel) -> tuple[int, int]:
    """(parameters that train, all parameters) of ``model``, by transformers' ``num_parameters`` (parameters shared
    between modules counted once)."""
    return model.num_parameters(only_trainable=True), model.num_parameters()


def trainable_parameters(model: PreTrainedModel) -> str:
    """How many of ``model``'s parameters train, for the log: ``trainable: 73,728 of 2,100,000 parameters (3.51%)``."""
    trained, total = parameter_counts(model)
    return f"trainable: {trained:,} of {total:,} parameters ({100 * trained / max(total, 1):.2f}%)"


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite."""


class ObjectiveStepCallback(TrainerCallback):
    """After each optimizer step: pushes the step's rows into the objective's queue (once per step, not per
    micro-batch) and runs the objective's own step-end work (momentum updates)."""

    def __init__(self, trainer: IFCLTrainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        self.trainer.objective.on_step_end(unwrap_model(self.trainer.model), self.trainer.gather_rows)


class StreamStateCallback(TrainerCallback):
    """Saves where this process's training stream is with each checkpoint (``TrainingStream.save``)."""

    def __init__(self, trainer: IFCLTrainer) -> None:
        self.trainer = trainer

    def on_save(self, args, state, control, **kwargs):
        checkpoint = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if os.path.isdir(checkpoint):
            self.trainer.train_dataset.save(checkpoint, args.process_index)


@dataclass
class RunTotals:
    """What a training run has done up to a step, over all its sessions (a resumed run's earlier ones up to the
    checkpoint it resumed from): each checkpoint's ``trainer_state.json`` keeps them, so that a resumed run reports
    the whole run."""

    steps: int = 0
    loss_sum: float = 0.0  # the Trainer's step losses (each the mean over processes), summed
    seconds: float = 0.0  # wall-clock seconds of training
    cpu_seconds: float = 0.0  # the main process's CPU seconds (all its threads), its STS evaluations included
    evaluation_cpu_seconds: float = 0.0  # of which its STS evaluations during training
    sessions: int = 0

    def __add__(self, other: RunTotals) -> RunTotals:
        return RunTotals(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    @classmethod
    def stored(cls, record: Any, global_step: int) -> RunTotals | None:
        """The totals a checkpoint's ``stateful_callbacks`` record holds, when they are those of its
        ``global_step``; None when it holds none (a checkpoint of an earlier version) or others."""
        try:
            totals = cls(**record["args"])
        except (TypeError, KeyError):
            return None
        return totals if totals.steps == global_step else None

    def train_metrics(self, samples_per_step: int, total_flos: float) -> dict[str, float]:
        """The train metrics of these steps (train_results.json's), named as the Trainer and
        :meth:`IFCLTrainer.train_measured` name them; samples are ``samples_per_step`` × steps."""
        steps, seconds = max(self.steps, 1), max(self.seconds, 1e-9)
        return {
            "train_runtime": round(self.seconds, 4),
            "train_samples_per_second": round(samples_per_step * self.steps / seconds, 3),
            "train_steps_per_second": round(self.steps / seconds, 3),
            "total_flos": total_flos,
            "train_loss": self.loss_sum / steps,
            "train_steps": self.steps,
            "train_sessions": self.sessions,
            "train_seconds_per_step": self.seconds / steps,
            "train_cpu_seconds": self.cpu_seconds,
            "train_evaluation_cpu_seconds": self.evaluation_cpu_seconds,
            "train_cpu_seconds_per_step": (self.cpu_seconds - self.evaluation_cpu_seconds) / steps,
        }


class RunTotalsCallback(TrainerCallback, ExportableState):
    """Counts the run's :class:`RunTotals` across its sessions: a session starts from those of the checkpoint it
    resumes from (``trainer_state.json``'s ``stateful_callbacks``), adds its own, and each checkpoint it writes keeps
    the sum. A step that saves, evaluates or ends training logs first, so that the logged losses reach every
    checkpoint and the run's end whole (and the loss is checked for NaN there, by :meth:`IFCLTrainer.log`): the loss
    is counted here, not taken from ``train``'s mean, which transformers versions divide by different step counts on
    a resumed run. ``earlier``: the totals before this session."""

    def __init__(self, **earlier: Any) -> None:
        self.earlier: RunTotals | None = RunTotals(**earlier)  # None: unknown (a checkpoint of an earlier version)
        self.started: tuple[float, float, int] | None = None  # this session's start: time, CPU time, step
        self.training = False
        self.step = 0
        self.logged_step = 0
        self.loss_sum = 0.0  # this session's logged step losses, summed
        self.evaluation_cpu_seconds = 0.0  # this session's STS evaluations while training

    def on_train_begin(self, args, state, control, **kwargs) -> None:
        name = type(self).__name__
        stored = state.stateful_callbacks.get(name)
        self.earlier = RunTotals() if state.global_step == 0 else RunTotals.stored(stored, state.global_step)
        state.stateful_callbacks.setdefault(name, {})  # the Trainer writes checkpoints' records only under known names
        self.started = (time.time(), time.process_time(), state.global_step)
        self.training, self.step, self.logged_step = True, state.global_step, state.global_step
        self.loss_sum, self.evaluation_cpu_seconds = 0.0, 0.0

    def on_step_end(self, args, state, control, **kwargs) -> None:
        self.step = state.global_step
        if control.should_save or control.should_evaluate or control.should_training_stop:
            control.should_log = True

    on_epoch_end = on_step_end

    def on_log(self, args, state, control, logs=None, **kwargs) -> None:
        if self.training and logs and "loss" in logs and state.global_step > self.logged_step:
            self.loss_sum += logs["loss"] * (state.global_step - self.logged_step)  # the Trainer logs their mean
            self.logged_step = state.global_step

    def on_train_end(self, args, state, control, **kwargs) -> None:
        self.training = False

    def evaluated(self, cpu_seconds: float) -> None:
        """An STS evaluation took ``cpu_seconds``: counted while training."""
        if self.training:
            self.evaluation_cpu_seconds += cpu_seconds

    def session_loss_sum(self, mean_loss: float) -> float:
        """This session's step losses summed: those logged, when every step is; else ``mean_loss`` (the Trainer's
        mean of the session) times its steps."""
        return self.loss_sum if self.logged_step == self.step else mean_loss * self.session_steps

    @property
    def session_steps(self) -> int:
        """The steps this session has trained."""
        return self.step - self.started[2] if self.started is not None else 0

    def this_session(self, loss_sum: float, seconds: float) -> RunTotals:
        """This session's totals up to now, given its ``loss_sum`` and ``seconds`` (what the caller measured)."""
        cpu_seconds = time.process_time() - self.started[1] if self.started is not None else 0.0
        return RunTotals(self.session_steps, loss_sum, seconds, cpu_seconds, self.evaluation_cpu_seconds, 1)

    def whole_run(self, loss_sum: float, seconds: float) -> RunTotals | None:
        """The run's totals: the earlier sessions' and this one's (:meth:`this_session`); None when the earlier are
        unknown."""
        return None if self.earlier is None else self.earlier + self.this_session(loss_sum, seconds)

    def state(self) -> dict:
        """The record of the checkpoint being written: the run's totals up to its step (none when unknown, or when a
        step since the last log is missing from the loss)."""
        totals = None
        if self.started is None:
            totals = self.earlier
        elif self.logged_step == self.step:
            totals = self.whole_run(self.loss_sum, time.time() - self.started[0])
        return {"args": asdict(totals) if totals is not None else {}, "attributes": {}}


class IFCLTrainer(Trainer):
    """The ``transformers`` Trainer for IFCL (Eq. 9), its ablations and the peer objectives, with STS evaluation.

    Args:
        model: an ``IFCLModel`` (``IFCLModel.from_encoder`` or ``from_pretrained``).
        args: ``TrainingArguments`` (``remove_unused_columns`` is turned off: objectives read more columns than
            the model's ``forward`` takes).
        train_dataset: a text ``datasets.Dataset`` with the objective's columns (``sentence``, and ``fraternal`` for
            IFCL's fraternal twins), checked and tokenized by the objective, or features already tokenized. Fewer
            rows than a global batch are refused (``ValueError``); fewer than the queue holds are warned about.
        eval_dataset: STS sets (``datasets.Dataset`` with sentence1, sentence2, score, or ``STSEvaluator``); a dict
            of them gives ``eval_<name>_spearman`` (× 100), usable as ``metric_for_best_model``.
        objective: the training objective; default the one the model's config names (``build_objective``). It is
            the model's sub-module ``training_objective`` while training, so that its own weights are optimized and
            checkpointed.
        preprocessing_num_workers, tokenize_on_the_fly: how a text training set is tokenized
            (``Objective.tokenize_dataset``).
        cache_mini_batch_size: a gradient cache (GradCache, Gao et al. 2021; :class:`GradientCache`): each
            per-device batch is embedded this many rows at a time, so its size is bounded by time, not memory, and
            trains as the whole batch would. None: off.
        kwargs: the Trainer's other arguments; the default data collator is the objective's.

    ``compute_loss`` is the objective's loss, whose terms are logged (``loss_identical``, ``loss_fraternal``,
    ``loss_twins`` for IFCL). After each optimizer step the objective's ``on_step_end`` runs (IFCL pushes the anchors
    of all processes into the queue). :meth:`save_model` writes the published model (the objective's modules and its
    training state left out) with its sentence-transformers view; checkpoints keep everything for exact resume.
    """

    def __init__(
        self,
        model=None,
        args=None,
        *rest,
        objective: Objective | None = None,
        preprocessing_num_workers: int | None = None,
        tokenize_on_the_fly: bool = False,
        cache_mini_batch_size: int | None = None,
        **kwargs,
    ) -> None:
        if model is None:
            raise ValueError("IFCLTrainer needs a model (an IFCLModel); model_init is not supported.")
        self.cache_mini_batch_size = cache_mini_batch_size
        self.objective = objective if objective is not None else build_objective(model)
        if cache_mini_batch_size is not None and args is not None:  # before the model changes (else: below)
            check_cache_mini_batch_size(cache_mini_batch_size, args, self.objective)
        kwargs.setdefault("processing_class", model.tokenizer)  # saved with checkpoints and the published model
        model.training_objective = self.objective  # optimizer, data parallelism and checkpoints take its weights
        if args is not None and args.remove_unused_columns:
            args.remove_unused_columns = False
        if not rest and kwargs.get("data_collator") is None:
            kwargs["data_collator"] = ObjectiveDataCollator(self.objective, kwargs["processing_class"])
        super().__init__(model, args, *rest, **kwargs)
        if cache_mini_batch_size is not None and args is None:  # the Trainer's default arguments
            check_cache_mini_batch_size(cache_mini_batch_size, self.args, self.objective)
        if isinstance(self.train_dataset, datasets.IterableDataset):  # a user's stream, read in its own order
            self.train_dataset = TrainingStream(self.train_dataset, shuffle_buffer_size=0, name="the training stream")
        # The one preparation of the run: the model fitted to it, the text tokenized, the data's size checked.
        self.train_dataset = self.objective.prepare(
            unwrap_model(self.model),
            global_batch_size(self.args),
            self.train_dataset,
            tokenizer=self.processing_class,
            main_process_first=lambda: self.args.main_process_first(desc="tokenizing the training set"),
            num_proc=preprocessing_num_workers,
            on_the_fly=tokenize_on_the_fly,
        )
        if isinstance(self.train_dataset, TrainingStream):
            # Each process reads its own part; the stream keeps its place in the checkpoints, so a resume reads on
            # from there (the Trainer's own skipping of the batches trained would read them again).
            self.train_dataset = self.train_dataset.for_process(self.args.process_index, self.args.world_size)
            self.args.ignore_data_skip = True
            self.add_callback(StreamStateCallback(self))
        logger.info(trainable_parameters(unwrap_model(self.model)))
        # compute_loss returns a per-micro-batch mean: the Trainer divides it by the accumulation steps.
        self.loss_is_scaled_for_ga = False
        self._loss_sums: dict[str, torch.Tensor] = {}
        self._loss_count = 0
        self._last_checked_step = 0
        self.add_callback(ObjectiveStepCallback(self))
        self.add_callback(RunTotalsCallback())

    # ---------------------------------------------------------------- training

    def get_train_dataloader(self):
        """The Trainer's data loader; for a stream (``ifcl.streaming.TrainingStream``), this process's part in batches
        read in the training process, every batch taken by all processes or none (``StreamBatches``)."""
        stream = self.train_dataset
        if not isinstance(stream, TrainingStream):
            return super().get_train_dataloader()
        if self.args.dataloader_num_workers:
            logger.warning("A stream is read in the training process: --dataloader_num_workers is left unused.")
        rows_needed = self.args.max_steps * global_batch_size(self.args)
        return StreamBatches(stream, self._train_batch_size, self.data_collator, rows_needed, self.args.device)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        """``Trainer.train``; resuming a stream, it first reads on from where this process's part was at the
        checkpoint (``TrainingStream.resume``)."""
        if resume_from_checkpoint and isinstance(self.train_dataset, TrainingStream):
            checkpoint = resume_from_checkpoint
            if checkpoint is True:
                checkpoint = get_last_checkpoint(self.args.output_dir)
            self.train_dataset.resume(checkpoint, self.args.process_index)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _get_train_sampler(self, train_dataset=None) -> torch.utils.data.Sampler | None:
        """The Trainer's random order of a map-style training set without its Python list of every row
        (``ifcl.data.ShuffledRows``): the same order, seeded as accelerate seeds it, up to 2^25 rows, and memory that
        does not grow with the rows beyond; the Trainer's other sampling strategies as they are."""
        dataset = self.train_dataset if train_dataset is None else train_dataset
        if dataset is None or not has_length(dataset) or self.args.train_sampling_strategy != "random":
            return super()._get_train_sampler(train_dataset)
        seed = self.args.data_seed if self.args.data_seed is not None else torch.random.initial_seed()
        return ShuffledRows(len(dataset), seed)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.cache_mini_batch_size and model.training and torch.is_grad_enabled():
            embeddings = embed_with_gradient_cache(self.objective, model, inputs, self.cache_mini_batch_size)
            output = self.objective.loss_from(model, embeddings, inputs, self.gather_candidates)
        else:
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

        Called at logging, which every step that saves a checkpoint does (:class:`RunTotalsCallback`; one
        collective and host sync there, none per step), so the newest checkpoint on disk is always one trained on
        finite losses. ``sums``: the terms' sums over processes when the caller has them (:meth:`log`), else reduced
        here.
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
            model = unwrap_model(self.model)  # its Matryoshka sizes scored too, from the same embeddings
            sizes = [d for d in getattr(model.config, "matryoshka_dims", None) or () if d != model.hidden_size]
            dataset = STSEvaluator.from_dataset(dataset, name=metric_key_prefix, truncate_dims=sizes)
        start, cpu_start = time.time(), time.process_time()
        # The evaluator's own batch, not the Trainer's eval batch for classification; one progress bar, the main's.
        show_progress_bar = self.is_local_process_zero() and not self.args.disable_tqdm
        scores = dataset(unwrap_model(self.model), show_progress_bar=show_progress_bar)
        self.run_totals.evaluated(time.process_time() - cpu_start)
        metrics = {f"{metric_key_prefix}_{name}": value for name, value in scores.items()}
        metrics.update(speed_metrics(metric_key_prefix, start, num_samples=len(dataset)))
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    # ---------------------------------------------------------------- publishing

    def published_model(self) -> AbstractContextManager[torch.nn.Module]:
        """The model without what only training needs (``ifcl.publishing.TRAINING_ONLY``), restored after: the
        objective's own modules (heads, peer network, momentum encoder) and IFCL's queue (a loaded model starts it
        empty), LoRA adapters merged into their layers. Checkpoints keep all three, for exact resume."""
        return without_training_state(unwrap_model(self.model))

    @property
    def train_samples(self) -> int:
        """The training set's size, as the ``transformers`` examples report it; for a stream, which has none, the rows
        the run's steps read."""
        dataset = self.train_dataset
        return len(dataset) if has_length(dataset) else self.state.global_step * global_batch_size(self.args)

    @property
    def run_totals(self) -> RunTotalsCallback:
        """The callback that counts the run's totals (the Trainer makes a new one when it restores callbacks)."""
        return next(cb for cb in self.callback_handler.callbacks if isinstance(cb, RunTotalsCallback))

    def finish_from_checkpoint(self, checkpoint: str) -> dict[str, float]:
        """Take up a run whose training had ended when it stopped (before its results were written): the Trainer's
        state from ``checkpoint`` and the model training ended with (the best checkpoint when
        ``load_best_model_at_end`` kept one, else ``checkpoint``), without training a step. Returns the whole run's
        train metrics, as :meth:`train_measured` gives them, from the totals the checkpoint keeps (its steps alone,
        with a warning, when it keeps none: a checkpoint of an earlier version)."""
        self.state = TrainerState.load_from_json(os.path.join(checkpoint, "trainer_state.json"))
        best = self.state.best_model_checkpoint
        final = best if self.args.load_best_model_at_end and best and os.path.isdir(best) else checkpoint
        logger.info(f"Training had ended at step {self.state.global_step}; the final model is {final}.")
        self._load_from_checkpoint(final)
        record = self.state.stateful_callbacks.get(RunTotalsCallback.__name__)
        totals = RunTotals.stored(record, self.state.global_step)
        if totals is None:
            logger.warning(
                f"{checkpoint} keeps no totals of its training (an earlier version saved it): the train results "
                "hold its steps only."
            )
            return {"train_steps": self.state.global_step}
        return {**totals.train_metrics(global_batch_size(self.args), self.state.total_flos), "epoch": self.state.epoch}

    def train_measured(self, resume_from_checkpoint: str | None = None) -> dict[str, float]:
        """``train``, and the train metrics of the whole run (:class:`RunTotals`; a resumed run's earlier sessions
        count up to the checkpoint it resumed from): the Trainer's, for every step and summed over the sessions, with
        the steps, the sessions and the CPU time per step: the main process's CPU time (all its threads), which other
        processes sharing the cores do not lengthen, less the STS evaluations' own."""
        output = self.train(resume_from_checkpoint=resume_from_checkpoint)
        counter = self.run_totals
        loss_sum, seconds = counter.session_loss_sum(output.training_loss), output.metrics["train_runtime"]
        totals = counter.whole_run(loss_sum, seconds)
        samples_per_step = global_batch_size(self.args)
        if totals is not None:
            return {**output.metrics, **totals.train_metrics(samples_per_step, self.state.total_flos)}
        logger.warning(
            f"The checkpoint resumed from ({resume_from_checkpoint}) keeps no totals of the training before it (an "
            f"earlier version saved it): the train loss and times count this session's {counter.session_steps} "
            "steps only."
        )
        metrics = counter.this_session(loss_sum, seconds).train_metrics(samples_per_step, self.state.total_flos)
        metrics.pop("train_sessions")
        return {**output.metrics, **metrics, "train_steps": self.state.global_step}

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Checkpoints keep the objective's modules and LoRA adapters (exact resume; the adapters also in peft's
        files); the published model leaves them out, with adapters merged, so that every published model loads alike
        whatever it was trained with, and gets its sentence-transformers view."""
        folder = output_dir or self.args.output_dir
        if _internal_call:
            super().save_model(output_dir, _internal_call)
            if self.args.should_save:
                save_adapters(unwrap_model(self.model), folder)
        else:
            with self.published_model() as model:
                super().save_model(output_dir, _internal_call)
                if self.args.should_save:  # the weights' save_pretrained wrote the tokenizers
                    save_view(model, folder)
        if self.args.should_save:  # the Trainer saved the tokenizer again, with the processor its base named
            without_processor_class(os.path.join(folder, "tokenizer_config.json"))

    def save_state(self) -> None:
        """The Trainer's ``trainer_state.json`` in the output folder, published with the model: its best checkpoint
        named relative to that folder (``checkpoint-200``), never by a path of the training machine. Checkpoints keep
        their own copy as the Trainer writes it, for resuming."""
        super().save_state()
        if not self.is_world_process_zero() or not self.state.best_model_checkpoint:
            return
        state = read_json(self.args.output_dir, "trainer_state.json")
        best = os.path.abspath(state["best_model_checkpoint"])
        state["best_model_checkpoint"] = os.path.relpath(best, os.path.abspath(self.args.output_dir))
        write_json_atomically(os.path.join(self.args.output_dir, "trainer_state.json"), state, sort_keys=True)

    def create_model_card(
        self, model_name: str | None = None, dataset: str | list[str] | None = None, **facts
    ) -> None:
        """Write README.md in the output folder: STS results, IFCL settings, how to load (see ``ifcl.model_card``).

        The card is written from one record of the run's facts, ``ifcl.model_card.CardFacts``, built here: what the
        trainer knows (its folder, model config, arguments, log and training set's size, all_results.json), the
        training data ``dataset`` as the run named it, and ``facts``: more of the record's fields (``sts_sources``,
        ``train_text``, ...). Of the Hub card arguments ``Trainer.push_to_hub`` passes on, the card takes none: license
        and language come from the base model's card, tags from the run."""
        if not self.is_world_process_zero():
            return

        for name in ("language", "license", "tags", "finetuned_from", "tasks", "dataset_tags", "dataset_args"):
            facts.pop(name, None)
        results = read_json(self.args.output_dir, "all_results.json") or {}
        facts.setdefault("log_history", self.state.log_history)
        facts.setdefault("trained_parameters", parameter_counts(unwrap_model(self.model)))
        facts.setdefault("weights_dtype", dtype_name(unwrap_model(self.model).dtype))
        facts.setdefault("base_folder", getattr(unwrap_model(self.model), "base_folder", None))
        if self.train_dataset is not None and hasattr(self.train_dataset, "__len__"):
            facts.setdefault("train_size", len(self.train_dataset))
        model_name = model_name or self.args.hub_model_id or os.path.basename(os.path.abspath(self.args.output_dir))
        config = unwrap_model(self.model).config
        record = CardFacts(
            self.args.output_dir,
            config,
            results,
            training_args=self.args,
            model_name=model_name,
            datasets=dataset,
            **facts,
        )
        write_model_card(record)
