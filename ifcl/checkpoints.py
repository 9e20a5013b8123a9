"""What resuming from a checkpoint reads, checked before anything loads: every file, the weights' values, the
settings it was trained with, and how far its training went (docs/reliability.md)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import zipfile
from dataclasses import dataclass, fields
from typing import Any

import torch
from safetensors import safe_open
from transformers.trainer_callback import TrainerState

from configuration_ifcl import ifcl_config_dict
from ifcl.data import DEFAULT_TRANS_DE_EN, shard_paths
from ifcl.failures import listed
from ifcl.files import STREAM_STATE_FILE, TRAINING_DATA_FILE, public_name, read_json
from ifcl.lora import resolved_alpha

logger = logging.getLogger(__name__)

TRAINER_STATE_FILE = "trainer_state.json"
CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")

# The settings a checkpoint cannot be resumed with other values of: config key -> the flag that sets it. The
# queue's shape and the optimizer's state depend on the first three; each of the others shapes the loss or the model,
# so a resume with another value would train its steps otherwise, and the card would describe settings the weights
# were not trained with. LoRA's settings are checked beside them (check_resume_lora).
RESUME_SETTINGS = {
    "objective": "--objective",
    "queue_size": "--queue_size",
    "queue_batch_size": "global batch (--per_device_train_batch_size × processes × --gradient_accumulation_steps)",
    "fusion_rate": "--fusion_rate",
    "contrastive_temperature": "--temperature",
    "forgetting_rate": "--forgetting_rate",
    "fraternal_loss_weight": "--fraternal_loss_weight",
    "twins_loss_weight": "--twins_loss_weight",
    "freeze_word_embeddings": "--freeze_word_embeddings",
    "freeze_fraternal_embeddings": "--freeze_fraternal_embeddings",
    "pooler_type": "--pooler_type",
    "eval_pooler_type": "--eval_pooler_type",
    "matryoshka_dims": "--matryoshka_dims",
    "matryoshka_weights": "--matryoshka_weights",
    "training_dropout": "--training_dropout",
    "max_seq_length": "--max_seq_length",
    "objective_settings": "the objective's own settings",
    "fraternal_model_name_or_path": "--fraternal_model_name_or_path",
}


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from: a file missing or damaged, or other settings than this run's."""


@dataclass
class ResumePoint:
    """A checkpoint to resume from, checked; ``finished``: its training is done, only the results are missing."""

    checkpoint: str
    config: dict[str, Any]  # its config.json in IFCLConfig's form
    finished: bool


def checkpoint_folders(folder: str) -> list[str]:
    """The ``checkpoint-N`` folders of ``folder``, newest (highest N) first."""
    steps = {}
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        match = CHECKPOINT_PATTERN.match(name)
        if match and os.path.isdir(os.path.join(folder, name)):
            steps[os.path.join(folder, name)] = int(match.group(1))
    return sorted(steps, key=steps.__getitem__, reverse=True)


def weights_problem(weights_file: str, values: bool = True) -> str | None:
    """What is wrong with a safetensors file, read in full one tensor at a time (with ``values`` False only its header
    and length: a cut file): ``"cannot be read (...)"`` or ``"holds NaN or infinite values (...)"``; None when nothing
    is."""
    try:
        with safe_open(weights_file, framework="pt") as weights:
            names = weights.keys() if values else []
            broken = [name for name in names if not bool(torch.isfinite(weights.get_tensor(name)).all())]
    except Exception as error:  # safetensors raises its own error type for a cut or damaged file
        return f"cannot be read ({str(error).splitlines()[0]})"
    return f"holds NaN or infinite values ({listed(broken, 3)})" if broken else None


def trainer_state_damage(state: Any) -> str | None:
    """What keeps a ``trainer_state.json``'s content (valid JSON) from being the Trainer's state: not an object, a
    field the Trainer's ``TrainerState`` does not have (``load_from_json`` would fail), or a step count that is not a
    whole number; None when nothing does."""
    if not isinstance(state, dict):
        shown = json.dumps(state)
        return f"it holds {shown if len(shown) <= 40 else shown[:37] + '...'}, not the Trainer's JSON object"
    unknown = set(state) - {field.name for field in fields(TrainerState)}
    if unknown:
        return f"fields the Trainer's state does not have, {listed(unknown, 3)}: damaged, or another transformers'"
    for name in ("global_step", "max_steps"):
        if name not in state:
            return f"no {name}"
        value = state[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return f"{name} is {json.dumps(value)}, not a whole number of steps"
    return None


def checkpoint_problem(
    checkpoint: str, world_size: int, max_steps: int, streaming: bool = False
) -> tuple[str | None, bool]:
    """(what keeps ``checkpoint`` from being resumed, naming the file, or None; whether its training is done) for a
    run of ``max_steps`` steps (-1: the checkpoint's own plan).

    Checked: ``trainer_state.json`` and ``config.json`` (valid JSON; the former the Trainer's state, as
    :func:`trainer_state_damage` checks it), the weights (every value finite) and, unless training is done, the
    optimizer, scheduler and each process's RNG state and, for a ``streaming`` run, stream state
    (:data:`STREAM_STATE_FILE`), without which the resumed steps would differ from an uninterrupted run's; every
    ``torch.save`` file must be a whole zip archive.
    """
    contents = {}
    for name in (TRAINER_STATE_FILE, "config.json"):
        if not os.path.isfile(os.path.join(checkpoint, name)):
            return os.path.join(checkpoint, f"{name} is missing (not a complete checkpoint folder)"), False
        try:
            contents[name] = read_json(checkpoint, name)
        except (ValueError, UnicodeDecodeError) as error:
            return os.path.join(checkpoint, f"{name} is not valid JSON ({error})"), False
    state = contents[TRAINER_STATE_FILE]
    damage = trainer_state_damage(state)
    if damage is not None:
        return os.path.join(checkpoint, f"{TRAINER_STATE_FILE} is damaged ({damage})"), False
    finished = state["global_step"] >= (max_steps if max_steps > 0 else state["max_steps"]) > 0
    weights = os.path.join(checkpoint, "model.safetensors")
    problem = weights_problem(weights) if os.path.isfile(weights) else "is missing"
    if problem is not None:
        return f"{weights} {problem}", finished
    rng_states = ["rng_state.pth"] if world_size <= 1 else [f"rng_state_{rank}.pth" for rank in range(world_size)]
    stream_states = [STREAM_STATE_FILE.format(rank=rank) for rank in range(world_size)] if streaming else []
    for name in [] if finished else ["optimizer.pt", "scheduler.pt", *rng_states, *stream_states]:
        if not os.path.isfile(os.path.join(checkpoint, name)):
            return os.path.join(checkpoint, f"{name} is missing (without it the resumed steps would differ)"), finished
    # torch.save writes zip archives, whose directory is at the end: a cut file is not a zip any more.
    for name in sorted(os.listdir(checkpoint)):
        if name.endswith((".pt", ".pth", ".bin")) and not zipfile.is_zipfile(os.path.join(checkpoint, name)):
            return os.path.join(checkpoint, f"{name} is cut short or damaged (not a whole torch.save file)"), finished
    return None, finished


def resume_point(
    resume: str,
    folder: str,
    world_size: int,
    max_steps: int,
    stream_buffer: int | None = None,
    training_data: dict[str, Any] | None = None,
) -> ResumePoint:
    """The checkpoint ``--resume_from_checkpoint`` names, checked for resuming a run of ``max_steps`` steps: a
    folder, or ``last``, the newest checkpoint of ``folder`` that can be resumed from (newer broken ones, a save cut
    short by a kill or a full disk, are named and skipped), then against the run's stream (:func:`check_stream`;
    ``stream_buffer``: its ``--shuffle_buffer_size``, None without ``--streaming``) and the training data it reads
    (:func:`check_training_data`; ``training_data``: its :func:`training_data_record`, None: not compared). Raises
    :class:`CheckpointError` naming the broken file or the setting."""
    last = resume == "last"
    skipped = []
    for checkpoint in checkpoint_folders(folder) if last else [resume]:
        if stream_buffer is not None and trained_without_streaming(checkpoint):
            raise CheckpointError(
                f"--resume_from_checkpoint {checkpoint} was trained without --streaming (its {TRAINING_DATA_FILE}): "
                "resume it without --streaming, with the same --train_file."
            )
        problem, finished = checkpoint_problem(checkpoint, world_size, max_steps, stream_buffer is not None)
        if problem is None:
            check_stream(checkpoint, stream_buffer)
            if training_data is not None:
                check_training_data(checkpoint, training_data)
            config = read_json(checkpoint, "config.json")
            saved = ifcl_config_dict(config) if isinstance(config, dict) else None
            return ResumePoint(checkpoint, saved or {}, finished)
        if not last:
            raise CheckpointError(
                f"--resume_from_checkpoint {checkpoint}: {problem}; resume from an earlier checkpoint (a checkpoint-* "
                "folder there), or start over with --overwrite_output_dir."
            )
        logger.warning(f"--resume_from_checkpoint last: skipping a broken checkpoint: {problem}.")
        skipped.append(problem)
    if skipped:
        raise CheckpointError(
            f"--resume_from_checkpoint last: no checkpoint of {folder} can be resumed from: {'; '.join(skipped)}. "
            "Start over with --overwrite_output_dir."
        )
    raise CheckpointError(f"--resume_from_checkpoint last: {folder} holds no checkpoint-* folder.")


def check_stream(checkpoint: str, buffer_size: int | None) -> None:
    """A checkpoint a streamed run saved is resumed with ``--streaming`` and the same ``--shuffle_buffer_size``
    (``buffer_size``; None: without ``--streaming``); :class:`CheckpointError` naming the file or the flag."""
    saved = os.path.join(checkpoint, STREAM_STATE_FILE.format(rank=0))
    if not os.path.isfile(saved):
        return  # not a streamed run's (resumed with --streaming, checkpoint_problem named the file)
    if buffer_size is None:
        raise CheckpointError(
            f"--resume_from_checkpoint {checkpoint} was trained with --streaming ({os.path.basename(saved)}): "
            "resume it with --streaming and the same data, or train anew."
        )
    saved_size = read_json(checkpoint, os.path.basename(saved)).get("shuffle_buffer_size")
    if saved_size != buffer_size:
        raise CheckpointError(
            f"--shuffle_buffer_size {buffer_size}: --resume_from_checkpoint {checkpoint} shuffled its stream in a buffer "
            f"of {saved_size} rows; resume with --shuffle_buffer_size {saved_size}."
        )


def check_resume_settings(checkpoint: str, saved: dict[str, Any], wanted: dict[str, Any]) -> None:
    """Name every setting of :data:`RESUME_SETTINGS` whose value in this command differs from the checkpoint's."""
    differences = [
        f"{flag}: {saved.get(key)!r} in the checkpoint, {wanted.get(key)!r} now"
        for key, flag in RESUME_SETTINGS.items()
        if key in saved and saved.get(key) != wanted.get(key)
    ]
    if differences:
        raise CheckpointError(
            f"--resume_from_checkpoint {checkpoint} was trained with other settings than this command's: "
            + "; ".join(differences)
            + ". Resume with the checkpoint's settings, or train anew in another --output_dir."
        )


def planned_fraternal_model(saved: dict | None, given: str | None, planned) -> str | None:
    """The fraternal model a run trains with, by the name its config keeps (``public_name``), to compare with a
    checkpoint's: the one given, else a continued IFCL model's own (``saved``: its IFCL settings; None for a plain
    encoder); None when the ``planned`` config has no fraternal twins."""
    if not planned.uses_fraternal_twins:
        return None
    return public_name(given if given is not None else (saved or {}).get("fraternal_model_name_or_path"))


def check_resume_lora(checkpoint: str, saved: dict[str, Any] | None, lora: dict[str, Any] | None) -> None:
    """The LoRA adapters the checkpoint was trained with (its config's ``lora``, ``saved``) are those this command
    asks for (``lora``: the keywords of ``ifcl.lora.add_lora``, None without LoRA): LoRA on or off alike, the same
    rank, alpha, dropout and, when the command names them, target modules. Each difference is named."""
    if saved is None or lora is None:
        if saved is not None or lora is not None:
            trained = f"with LoRA (--lora_r {saved['r']})" if saved else "without LoRA"
            raise CheckpointError(
                f"--resume_from_checkpoint {checkpoint} was trained {trained}, unlike this command: resume with the "
                "checkpoint's LoRA flags, or train anew in another --output_dir."
            )
        return
    pairs = [
        ("--lora_r", saved["r"], lora["r"]),
        ("--lora_alpha", saved["alpha"], resolved_alpha(lora["r"], lora["alpha"])),
        ("--lora_dropout", saved["dropout"], lora["dropout"]),
    ]
    if lora["target_modules"] is not None:
        pairs.append(("--lora_target_modules", sorted(saved["target_modules"]), sorted(lora["target_modules"])))
    differences = [f"{flag}: {then!r} in the checkpoint, {now!r} now" for flag, then, now in pairs if then != now]
    if differences:
        raise CheckpointError(
            f"--resume_from_checkpoint {checkpoint} was trained with other LoRA settings than this command's: "
            + "; ".join(differences)
            + ". Resume with the checkpoint's settings, or train anew in another --output_dir."
        )


def interrupted_message(folder: str, command: list[str]) -> str:
    """What Ctrl-C prints in ``run_ifcl.py``: the newest complete checkpoint of ``folder`` and the ``command``
    that resumes from it."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))  # set by accelerate launch and torchrun
    checkpoints = checkpoint_folders(folder)
    newest = next((c for c in checkpoints if checkpoint_problem(c, world_size, -1)[0] is None), None)
    if newest is None:
        return "interrupted; no complete checkpoint was written yet"
    return (
        f"interrupted; the newest complete checkpoint is {newest}; continue with: {shlex.join(command)} "
        "--resume_from_checkpoint last"
    )


# ---------------------------------------------------------------------------------------------------- training data

# The bytes hashed at each end of a training file: a rewritten file is noticed, a copied or touched one is not.
FILE_END_BYTES = 1 << 16


def training_files(data_args) -> list[str]:
    """The local files ``run_ifcl.py`` reads its training rows from: ``--train_file``'s (a path or a glob, as matched
    now), or trans-de-en's when neither it nor ``--dataset_name`` is given."""
    if data_args.train_file is None:
        return [] if data_args.dataset_name is not None else [DEFAULT_TRANS_DE_EN]
    return shard_paths(data_args.train_file)


def file_fingerprint(path: str) -> dict[str, Any] | None:
    """A file's size and the SHA-256 of its first and last :data:`FILE_END_BYTES`; None when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            digest = hashlib.sha256(handle.read(FILE_END_BYTES))
            if size > FILE_END_BYTES:
                handle.seek(max(FILE_END_BYTES, size - FILE_END_BYTES))
                digest.update(handle.read())
    except OSError:
        return None
    return {"size": size, "ends_sha256": digest.hexdigest()}


def training_data_record(data_args, training_args) -> dict[str, Any]:
    """What decides which rows a run trains on, and in which order: the flags that shape them, by name, and each
    local training file's :func:`file_fingerprint` (a shard deleted, added or rewritten changes it)."""
    settings = {
        "--train_file": data_args.train_file,
        "--dataset_name": data_args.dataset_name,
        "--dataset_config_name": data_args.dataset_config_name,
        "--dataset_split": data_args.dataset_split,
        "--sentence_column": data_args.sentence_column,
        "--fraternal_column": data_args.fraternal_column,
        "--max_train_samples": data_args.max_train_samples,
        "--streaming": data_args.streaming,
        "--seed": training_args.seed,
        "--data_seed": training_args.data_seed,
    }
    return {"settings": settings, "files": {path: file_fingerprint(path) for path in training_files(data_args)}}


def trained_without_streaming(checkpoint: str) -> bool:
    """Whether ``checkpoint``'s training-data record says its run read memory-mapped data, not a stream."""
    try:
        record = read_json(checkpoint, TRAINING_DATA_FILE) if os.path.isdir(checkpoint) else None
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(record, dict) and (record.get("settings") or {}).get("--streaming") is False


def check_training_data(checkpoint: str, wanted: dict[str, Any]) -> None:
    """The training data this command reads (``wanted``, :func:`training_data_record`) is what ``checkpoint`` read
    (its :data:`TRAINING_DATA_FILE`, which ``ifcl.output_folder.RunFolder`` writes into each checkpoint):
    each flag and file that differs is named in one :class:`CheckpointError`, since a resume would read on in other
    rows or another order. A checkpoint without a record (of an earlier version) is not compared."""
    path = os.path.join(checkpoint, TRAINING_DATA_FILE)
    try:
        saved = read_json(checkpoint, TRAINING_DATA_FILE) if os.path.isfile(path) else None
    except (ValueError, UnicodeDecodeError):
        saved = None
    if not isinstance(saved, dict):
        logger.info(
            f"{checkpoint} holds no {TRAINING_DATA_FILE} (an earlier version's): its training data is not compared."
        )
        return
    settings, files = saved.get("settings") or {}, saved.get("files") or {}
    differences = [
        f"{flag} {settings[flag]!r} in the checkpoint, {value!r} now"
        for flag, value in wanted["settings"].items()
        if flag in settings and settings[flag] != value
    ]
    for name in sorted(set(files) | set(wanted["files"])):
        then, now = files.get(name, "absent"), wanted["files"].get(name, "absent")
        if then == now:
            continue
        if then == "absent" or now == "absent":
            differences.append(f"{name} {'is read now but was not then' if then == 'absent' else 'is not read now'}")
        elif now is None:
            differences.append(f"{name} cannot be read now")
        else:
            sizes = f"{then['size']} bytes then, {now['size']} now" if then and then["size"] != now["size"] else ""
            differences.append(f"{name} has changed since ({sizes or 'other content'})")
    if differences:
        raise CheckpointError(
            f"--resume_from_checkpoint {checkpoint} read other training data than this command would: "
            + "; ".join(differences)
            + ". A resume reads on in the same rows and order only: resume with the checkpoint's data and flags, or "
            "train anew in another --output_dir."
        )
