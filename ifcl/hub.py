"""Publishing a finished run on the Hub: ``run_ifcl.py`` takes the push over from the Trainer (which would create the
repository when training starts and push at every save) and pushes the finished folder once, at the very end."""

from __future__ import annotations

import logging
import os
import shlex
import socket
from urllib.parse import urlparse

from huggingface_hub import HfApi, constants, get_token, try_to_load_from_cache
from transformers import TrainingArguments

from ifcl.files import LOCK_FILE, RUN_IN_PROGRESS_FILE, RUN_RECORD_FILE, looks_like_hub_id

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


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hub can be reached: HF_HUB_OFFLINE unset and a connection to its host opens."""
    if constants.HF_HUB_OFFLINE:
        return False
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # behind a proxy a direct connection says nothing; the download itself will tell
    endpoint = urlparse(constants.ENDPOINT)
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        with socket.create_connection((endpoint.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def check_model_reachable(option: str, path: str) -> None:
    """``FileNotFoundError`` in one line for a model ``path`` of the form ``owner/name`` that is no folder here, is not
    in the Hub's cache, and cannot be fetched because the Hub cannot be reached: most often a folder a run has not
    written yet (``outputs/my-run``), which transformers would otherwise report as a failed Hub connection."""
    if not looks_like_hub_id(path):
        return
    try:
        if any(isinstance(try_to_load_from_cache(path, name), str) for name in ("config.json", "modules.json")):
            return
    except ValueError:  # not a valid repo id: the loader names it
        return
    if hub_reachable():
        return
    why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "no connection to it opens"
    raise FileNotFoundError(
        f"{option} {path}: no such folder here, and no Hub repo of that name in the cache, while the Hub cannot be "
        f"reached ({why}): give the folder a model was saved to (train it first), or a Hub id you can download."
    )
