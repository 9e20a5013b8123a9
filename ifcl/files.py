"""The files the scripts share: the one JSON reader of a model folder or Hub repo (``read_json``), the check of a
model path (``check_model_path``), how published files name a model or file (``public_name``), atomic writes
(strict JSON) and the one lock."""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
from collections.abc import Iterator
from typing import Any

from transformers.utils import cached_file

# The files a run of this project writes into its output folder and checkpoints (ifcl.output_folder, ifcl.checkpoints,
# ifcl.streaming and ifcl.hub name them).
RUN_IN_PROGRESS_FILE = "run_in_progress.json"  # the run that writes the folder, while it runs
RUN_RECORD_FILE = "ifcl_run.json"  # what runs of this project wrote into the folder
LOCK_FILE = ".ifcl_run.lock"  # held while a run writes the folder
TRAINING_DATA_FILE = "ifcl_training_data.json"  # what a run read its training rows from, in each checkpoint
STREAM_STATE_FILE = "ifcl_stream_state-{rank}.json"  # where each process's stream was, in each checkpoint

__all__ = [
    "LOCK_FILE",
    "RUN_IN_PROGRESS_FILE",
    "RUN_RECORD_FILE",
    "STREAM_STATE_FILE",
    "TRAINING_DATA_FILE",
    "atomic_path",
    "check_model_path",
    "exclusive_lock",
    "looks_like_hub_id",
    "public_model_name",
    "public_name",
    "read_json",
    "without_nan",
    "write_json_atomically",
]


def looks_local(path: str) -> bool:
    """Whether ``path`` can only be a local path, never a Hub id: it starts with ``.``, ``/`` or ``~``, or holds more
    than one ``/``."""
    return path.startswith((".", "/", "~")) or path.count("/") > 1


def read_json(name_or_path: str, filename: str, subfolder: str = "") -> Any:
    """A JSON file of a folder or Hub repo (the Hub's cache offline), or None when there is none to read (a local
    folder that does not exist included: ``check_model_path`` names it where it matters)."""
    if looks_local(str(name_or_path)) and not os.path.isdir(os.path.expanduser(str(name_or_path))):
        return None
    path = cached_file(
        name_or_path,
        filename,
        subfolder=subfolder,
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
    )
    if path is None:
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def check_model_path(option: str, path: str | None) -> None:
    """Name a model path that is neither a folder here nor a Hub id (``name`` or ``owner/name``), and a folder that
    holds no model: neither a config.json nor a sentence-transformers modules.json (an empty folder, another kind of
    files)."""
    folder = os.path.expanduser(path) if path is not None else ""
    if path is not None and looks_local(path) and not os.path.isdir(folder):
        raise FileNotFoundError(f"{option} {path}: no such folder (and not a Hub id of the form owner/name).")
    if os.path.isdir(folder) and not any(
        os.path.isfile(os.path.join(folder, f)) for f in ("config.json", "modules.json")
    ):
        raise FileNotFoundError(
            f"{option} {path}: the folder holds no model (no config.json; "
            f"{'it is empty' if not os.listdir(folder) else 'it holds ' + ', '.join(sorted(os.listdir(folder))[:3])}"
            "): give the folder a model was saved to (save_pretrained), or a Hub id."
        )


def public_model_name(folder: str) -> str:
    """A local model folder by the Hub id its own card loads itself by (``from_pretrained('owner/name')`` or
    ``SentenceTransformer('owner/name')`` with the card's title as name, as the PyPI all-MiniLM-L6-v2's card does),
    else by the folder's name."""
    folder_name = os.path.basename(os.path.normpath(os.path.abspath(folder)))
    card = os.path.join(folder, "README.md")
    if os.path.isfile(card):
        with open(card, encoding="utf-8", errors="replace") as f:
            text = f.read()
        title = re.search(r"^# +(\S+)\s*$", text, flags=re.MULTILINE)
        names = {title.group(1) if title else None, folder_name}
        for hub_id in re.findall(r"(?:from_pretrained|SentenceTransformer)\(\s*['\"]([\w.-]+/[\w.-]+)['\"]", text):
            if hub_id.split("/")[1] in names:
                return hub_id
    return folder_name


def looks_like_hub_id(name: str | None) -> bool:
    """True for ``owner/name`` ids, False for local paths (which the Hub metadata must not name)."""
    return (
        bool(name) and not looks_local(name) and name.count("/") == 1 and not os.path.exists(os.path.expanduser(name))
    )


def public_name(name_or_path: str | None, folder: str | None = None) -> str | None:
    """How a published file names a model or file, never by the training machine's path: a Hub id as it is; a local
    model folder (``folder``, else ``name_or_path`` itself) as :func:`public_model_name` does; any other path by its
    base name."""
    if not name_or_path:
        return None
    if looks_like_hub_id(name_or_path):
        return name_or_path
    local = folder if folder and os.path.isdir(folder) else name_or_path
    if os.path.isdir(local):
        return public_model_name(local)
    return os.path.basename(os.path.normpath(name_or_path)) or None


def without_nan(value: Any) -> Any:
    """NaN (the correlation over constant scores) and infinities as null, in nested dicts and lists: strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: without_nan(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [without_nan(item) for item in value]
    return value


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """A temporary path beside ``path`` for the ``with`` block to write, renamed over ``path`` when the block ends
    without error: a reader finds the old file or the whole new one, never half of one. On an error (Ctrl-C too) the
    temporary file is removed and ``path`` is left as it was."""
    temporary = f"{path}.tmp-{os.getpid()}"
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
        raise


def write_json_atomically(path: str, content: Any, sort_keys: bool = False, indent: int = 2) -> None:
    """``content`` as JSON (NaN and infinities as null) written to ``path`` through :func:`atomic_path`."""
    with atomic_path(path) as temporary, open(temporary, "w", encoding="utf-8") as handle:
        json.dump(
            without_nan(content), handle, indent=indent, sort_keys=sort_keys, ensure_ascii=False, allow_nan=False
        )


@contextlib.contextmanager
def exclusive_lock(lock_file: str) -> Iterator[str]:
    """Hold an exclusive ``flock`` on ``lock_file`` (made if missing) for the ``with`` block; ``BlockingIOError`` at
    once when another process holds it.

    The lock file is removed at the end, while still locked: a process that opened it just before finds, once it has
    the lock, that the path leads to another file, and locks that one instead. A lock file left by a killed process
    holds no lock (the kernel released it) and is taken over.
    """
    while True:
        descriptor = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            os.close(descriptor)
            raise
        try:
            locked_the_path = os.path.samestat(os.stat(lock_file), os.fstat(descriptor))
        except FileNotFoundError:
            locked_the_path = False  # removed by the process that held it
        if locked_the_path:
            break
        os.close(descriptor)  # a lock file already removed: lock the one now at that path
    try:
        yield lock_file
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(lock_file)
        os.close(descriptor)
