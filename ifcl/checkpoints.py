"""What resuming from a checkpoint reads, checked before anything loads: every file, the weights' values, the
settings it was trained with, and how far its training went."""

from __future__ import annotations

import os
import re
import zipfile
from dataclasses import dataclass
from typing import Any

from ifcl.cli import read_json

TRAINER_STATE_FILE = "trainer_state.json"
CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# What the Trainer reads to go on training from a checkpoint, beside the weights and the RNG states.
TRAINING_STATE_FILES = ("optimizer.pt", "scheduler.pt")

# The settings a checkpoint cannot be resumed with other values of: config key -> the flag that sets it. The
# queue's shape and the optimizer's state depend on the first three; the others would make the card describe
# settings the weights were not trained with.
RESUME_SETTINGS = {
    "objective": "--objective",
    "queue_size": "--queue_size",
    "queue_batch_size": "global batch (--per_device_train_batch_size × processes × --gradient_accumulation_steps)",
    "fusion_rate": "--fusion_rate",
    "contrastive_temperature": "--temperature",
    "forgetting_rate": "--forgetting_rate",
    "fraternal_loss_weight": "--fraternal_loss_weight",
    "twins_loss_weight": "--twins_loss_weight",
    "objective_settings": "the objective's own settings",
}


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from: a file missing or damaged, or other settings than this run's."""


def rng_state_files(world_size: int) -> list[str]:
    """The random-number states the Trainer restores: one file per process (``rng_state.pth`` for a single one)."""
    return ["rng_state.pth"] if world_size <= 1 else [f"rng_state_{rank}.pth" for rank in range(world_size)]


def checkpoint_step(path: str) -> int | None:
    """The step of a ``checkpoint-N`` folder (its name's N), None for any other name."""
    match = CHECKPOINT_PATTERN.match(os.path.basename(os.path.normpath(path)))
    return int(match.group(1)) if match else None


def checkpoint_folders(folder: str) -> list[str]:
    """The ``checkpoint-N`` folders of ``folder``, newest (highest N) first."""
    if not os.path.isdir(folder):
        return []
    names = [name for name in os.listdir(folder) if os.path.isdir(os.path.join(folder, name))]
    steps = {name: checkpoint_step(name) for name in names}
    return [
        os.path.join(folder, name) for name in sorted(names, key=lambda n: -(steps[n] or 0)) if steps[name] is not None
    ]


def non_finite_tensors(weights_file: str) -> list[str]:
    """Names of the tensors of a safetensors file that hold NaN or infinite values (read one tensor at a time)."""
    import torch
    from safetensors import safe_open

    found = []
    with safe_open(weights_file, framework="pt") as weights:
        for name in weights.keys():  # noqa: SIM118 (safe_open has no __iter__)
            tensor = weights.get_tensor(name)
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                found.append(name)
    return found


def read_checkpoint_config(checkpoint: str) -> dict[str, Any]:
    """A checkpoint's config.json in IFCLConfig's form (its settings beside ``encoder_config``)."""
    from configuration_ifcl import ifcl_config_dict

    config = read_json(checkpoint, "config.json")
    return (ifcl_config_dict(config) if isinstance(config, dict) else None) or config


def checkpoint_problem(checkpoint: str, world_size: int = 1, to_train: bool = True) -> str | None:
    """What keeps ``checkpoint`` from being resumed, as ``"<file> <what is wrong>"``, or None when nothing does.

    Checked: ``trainer_state.json`` and ``config.json`` (present, valid JSON), the weights (present, readable, every
    value finite), and, when training is to go on (``to_train``), the optimizer, scheduler and each process's RNG
    state, without which the resumed steps would differ from an uninterrupted run's. Every ``torch.save`` file
    present must be a complete zip archive (a save cut short is not).
    """
    if not os.path.isfile(os.path.join(checkpoint, TRAINER_STATE_FILE)):
        return f"{TRAINER_STATE_FILE} is missing (not a complete checkpoint folder)"
    for name in (TRAINER_STATE_FILE, "config.json"):
        path = os.path.join(checkpoint, name)
        if not os.path.isfile(path):
            return f"{name} is missing"
        try:
            read_json(os.path.dirname(path), os.path.basename(path))
        except (ValueError, UnicodeDecodeError) as error:
            return f"{name} is not valid JSON ({error})"
    weights = [name for name in WEIGHT_FILES if os.path.isfile(os.path.join(checkpoint, name))]
    if not weights:
        return f"{WEIGHT_FILES[0]} is missing"
    if weights[0] == "model.safetensors":
        try:
            broken = non_finite_tensors(os.path.join(checkpoint, "model.safetensors"))
        except Exception as error:  # safetensors raises its own error type for a cut or damaged file
            return f"model.safetensors cannot be read ({error})"
        if broken:
            shown = ", ".join(broken[:3]) + (", ..." if len(broken) > 3 else "")
            return f"model.safetensors holds NaN or infinite values ({shown})"
    if to_train:
        for name in (*TRAINING_STATE_FILES, *rng_state_files(world_size)):
            if not os.path.isfile(os.path.join(checkpoint, name)):
                return f"{name} is missing (without it the resumed steps would not be those of an uninterrupted run)"
    # torch.save writes zip archives, whose directory is at the end: a cut file is not a zip any more.
    for name in sorted(os.listdir(checkpoint)):
        if name.endswith((".pt", ".pth", ".bin")) and not zipfile.is_zipfile(os.path.join(checkpoint, name)):
            return f"{name} is cut short or damaged (not a complete torch.save file)"
    return None


def trained_steps(checkpoint: str) -> int:
    """The optimizer steps a checkpoint was saved after (its ``trainer_state.json``)."""
    return int(read_json(checkpoint, TRAINER_STATE_FILE).get("global_step", 0))


def planned_steps(checkpoint: str, max_steps: int) -> int:
    """The steps the run plans in all: ``--max_steps`` when set, else what the checkpoint's run computed."""
    if max_steps > 0:
        return max_steps
    return int(read_json(checkpoint, TRAINER_STATE_FILE).get("max_steps", 0))


@dataclass
class ResumePoint:
    """A checkpoint to resume from, checked; ``finished``: its training is done, only the results are missing."""

    checkpoint: str
    config: dict[str, Any]
    finished: bool
    skipped: list[str]  # newer checkpoints that are broken, each with why


def resume_problem(checkpoint: str, world_size: int, max_steps: int) -> tuple[str | None, bool]:
    """(what keeps ``checkpoint`` from being resumed, naming the file, or None; whether its training is done) for a
    run of ``max_steps`` steps (-1: the checkpoint's own plan). A finished checkpoint needs no optimizer state."""
    if not os.path.isfile(os.path.join(checkpoint, TRAINER_STATE_FILE)):
        return f"{checkpoint}: not a checkpoint folder (no {TRAINER_STATE_FILE} there)", False
    try:
        finished = trained_steps(checkpoint) >= planned_steps(checkpoint, max_steps) > 0
    except (ValueError, UnicodeDecodeError):
        finished = False  # a damaged trainer_state.json: checkpoint_problem names it
    problem = checkpoint_problem(checkpoint, world_size, to_train=not finished)
    return (None if problem is None else os.path.join(checkpoint, problem)), finished


def resume_point(checkpoint: str, world_size: int, max_steps: int) -> ResumePoint:
    """Check ``checkpoint`` for resuming a run of ``max_steps`` steps; raises :class:`CheckpointError` naming the
    broken file."""
    problem, finished = resume_problem(checkpoint, world_size, max_steps)
    if problem is not None:
        raise CheckpointError(
            f"--resume_from_checkpoint {checkpoint}: {problem}; resume from an earlier checkpoint (a checkpoint-* "
            "folder there), or start over with --overwrite_output_dir."
        )
    return ResumePoint(checkpoint, read_checkpoint_config(checkpoint), finished, [])


def newest_resume_point(folder: str, world_size: int, max_steps: int) -> ResumePoint:
    """``--resume_from_checkpoint last``: the newest checkpoint of ``folder`` that can be resumed from; the broken
    newer ones (a save cut short by a kill or a full disk) are named in ``skipped``."""
    skipped: list[str] = []
    for checkpoint in checkpoint_folders(folder):
        problem, finished = resume_problem(checkpoint, world_size, max_steps)
        if problem is None:
            return ResumePoint(checkpoint, read_checkpoint_config(checkpoint), finished, skipped)
        skipped.append(problem)
    if skipped:
        raise CheckpointError(
            f"--resume_from_checkpoint last: no checkpoint of {folder} can be resumed from: {'; '.join(skipped)}. "
            "Start over with --overwrite_output_dir."
        )
    raise CheckpointError(f"--resume_from_checkpoint last: {folder} holds no checkpoint-* folder.")


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


def interrupted_message(folder: object, command: list[str]) -> str:
    """What Ctrl-C prints in ``run_ifcl.py``: the newest complete checkpoint of ``folder`` and the ``command``
    that resumes from it."""
    checkpoints = checkpoint_folders(folder if isinstance(folder, str) else "")
    newest = next((c for c in checkpoints if resume_problem(c, 1, -1)[0] is None), None)
    if newest is None:
        return "interrupted; no complete checkpoint was written yet"
    return (
        f"interrupted; the newest complete checkpoint is {newest}; continue with: {' '.join(command)} "
        "--resume_from_checkpoint last"
    )
