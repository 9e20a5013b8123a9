"""Publishing a finished run on the Hub: one push of the output folder, once everything is saved.

The Trainer's own push would create the repository when training starts (failing offline) and push at every save;
``run_ifcl.py`` takes it over instead (:func:`take_over_push`) and pushes the finished folder at the very end, so a
failed push loses nothing and says how to push later.
"""

from __future__ import annotations

import logging
import os

from transformers import TrainingArguments

from .output_folder import LOCK_FILE, RUN_IN_PROGRESS_FILE, RUN_RECORD_FILE

logger = logging.getLogger(__name__)

# What a push leaves out: the checkpoints and the Trainer's own state, logs and arguments, and the run's local record.
PUSH_IGNORE_PATTERNS = [
    "checkpoint-*",
    "checkpoint-*/**",
    "training_args.bin",
    "runs/**",
    LOCK_FILE,
    RUN_IN_PROGRESS_FILE,
    RUN_RECORD_FILE,
]


class PushError(OSError):
    """The push to the Hub failed once everything was saved; the message says where, and how to push later."""


def take_over_push(training_args: TrainingArguments) -> bool:
    """Whether to push at the end; the Trainer itself is kept from pushing (it would create the repo at start).

    The push happens once training, evaluation, model card and plots are saved, so a failed push loses nothing.
    """
    wanted = training_args.push_to_hub
    if wanted:
        from huggingface_hub import constants, get_token

        training_args.push_to_hub = False
        if constants.HF_HUB_OFFLINE or (training_args.hub_token or get_token()) is None:
            logger.warning(
                "--push_to_hub: the Hub is unreachable from here (HF_HUB_OFFLINE) or no token is set; training "
                "goes on and the push will be tried at the end."
            )
    return wanted


def push_later_command(repo_id: str, training_args: TrainingArguments) -> str:
    """The ``hf upload`` command that pushes the output folder as :func:`push_output_folder` does."""
    import shlex

    words = ["hf", "upload", repo_id, training_args.output_dir, "."]
    for pattern in PUSH_IGNORE_PATTERNS:
        words += ["--exclude", pattern]
    if training_args.hub_private_repo:
        words.append("--private")
    return " ".join(shlex.quote(word) for word in words)


def push_output_folder(training_args: TrainingArguments) -> str:
    """Upload the output folder to ``--hub_model_id`` (default: the folder's name); returns the commit's address.

    Raises :class:`PushError` (offline, no token, no rights, ...) with the ``hf upload`` command that pushes later.
    """
    from huggingface_hub import HfApi

    folder = training_args.output_dir
    repo_id = training_args.hub_model_id or os.path.basename(os.path.abspath(folder))
    api = HfApi(token=training_args.hub_token)
    try:
        repo_id = api.create_repo(repo_id, private=training_args.hub_private_repo, exist_ok=True).repo_id
        commit = api.upload_folder(
            repo_id=repo_id,
            folder_path=folder,
            commit_message="Upload IFCL model",
            ignore_patterns=PUSH_IGNORE_PATTERNS,
        )
    except Exception as error:  # offline, no token, no rights: everything is saved; say how to push later
        raise PushError(
            f"--push_to_hub: could not push to {repo_id} ({type(error).__name__}: {error}). Everything is saved in "
            f"{folder}; push it later with: {push_later_command(repo_id, training_args)}"
        ) from error
    logger.info(f"Pushed {folder} to https://huggingface.co/{repo_id}")
    return getattr(commit, "commit_url", None) or repo_id
