"""The files the scripts share: the one JSON reader of a model folder or Hub repo (``read_json``), the check of a
model path (``check_model_path``), atomic writes (strict JSON) and the one lock."""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
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
    "read_json",
    "without_nan",
    "write_json_atomically",
]


def read_json(name_or_path: str, filename: str, subfolder: str = "") -> Any:
    """A JSON file of a folder or Hub repo (the Hub's cache offline), or None when there is none to read (a local
    folder that does not exist included: ``check_model_path`` names it where it matters)."""
    looks_local = str(name_or_path).startswith((".", "/", "~")) or str(name_or_path).count("/") > 1
    if looks_local and not os.path.isdir(os.path.expanduser(str(name_or_path))):
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
    looks_local = path is not None and (path.startswith((".", "/", "~")) or path.count("/") > 1)
    folder = os.path.expanduser(path) if path is not None else ""
    if looks_local and not os.path.isdir(folder):
        raise FileNotFoundError(f"{option} {path}: no such folder (and not a Hub id of the form owner/name).")
    if os.path.isdir(folder) and not any(
        os.path.isfile(os.path.join(folder, f)) for f in ("config.json", "modules.json")
    ):
        raise FileNotFoundError(
            f"{option} {path}: the folder holds no model (no config.json; "
            f"{'it is empty' if not os.listdir(folder) else 'it holds ' + ', '.join(sorted(os.listdir(folder))[:3])}"
            "): give the folder a model was saved to (save_pretrained), or a Hub id."
        )


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
