"""Publishing a finished run on the Hub: ``run_ifcl.py`` takes the push over from the Trainer (which would create the
repository when training starts and push at every save) and pushes the finished folder once, at the very end."""

from __future__ import annotations

import logging
import os
import shlex

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


def take_over_push(training_args: TrainingArguments) -> bool:
    """Whether to push at the end; the Trainer itself is kept from pushing (it would create the repo at start)."""
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


def push_output_folder(training_args: TrainingArguments) -> None:
    """Upload the output folder to ``--hub_model_id`` (default: the folder's name); a failure (offline, no token, no
    rights, ...) raises ``OSError`` with the ``hf upload`` command that pushes the same files later."""
    from huggingface_hub import HfApi

    folder = training_args.output_dir
    repo_id = training_args.hub_model_id or os.path.basename(os.path.abspath(folder))
    api = HfApi(token=training_args.hub_token)
    try:
        repo_id = api.create_repo(repo_id, private=training_args.hub_private_repo, exist_ok=True).repo_id
        api.upload_folder(
            repo_id=repo_id,
            folder_path=folder,
            commit_message="Upload IFCL model",
            ignore_patterns=PUSH_IGNORE_PATTERNS,
        )
    except Exception as error:  # everything is saved: say how to push later
        command = ["hf", "upload", repo_id, folder, "."]
        for pattern in PUSH_IGNORE_PATTERNS:
            command += ["--exclude", pattern]
        if training_args.hub_private_repo:
            command.append("--private")
        raise OSError(
            f"--push_to_hub: could not push to {repo_id} ({type(error).__name__}: {error}). Everything is saved in "
            f"{folder}; push it later with: {shlex.join(command)}"
        ) from error
    logger.info(f"Pushed {folder} to https://huggingface.co/{repo_id}")
