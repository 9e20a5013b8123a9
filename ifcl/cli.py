"""How the command-line scripts end (``<script>: error: <message>``: exit code 2 for bad input, 1 for a failure once
the work has begun, 130 for Ctrl-C; the traceback only with ``IFCL_DEBUG=1``), and the helpers they share: the lock,
JSON reading and atomic writing, threads, write failures, logging and lists of names in messages."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

logger = logging.getLogger(__name__)

DEBUG_VARIABLE = "IFCL_DEBUG"
# What a script reports as one line: the project's errors subclass these (DataFormatError, SettingsError,
# OutputFolderError, TaskDataNotFoundError), and so do invalid JSON, a missing file and a full disk.
REPORTED_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError, FloatingPointError)
# What a failed write reports: no space, no quota, a read-only file system, no permission, an I/O error, too large.
WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EFBIG)


class RunFailure(Exception):
    """An error once the script's real work has begun: one line, exit code 1 (bad input gives 2)."""


class Interrupted(Exception):
    """Ctrl-C, carrying what the script says about going on (exit code 130)."""


@contextlib.contextmanager
def failures_of_the_run() -> Iterator[None]:
    """Inside the block the input is checked and the work has begun: the project's errors become
    :class:`RunFailure` (exit code 1 instead of 2)."""
    try:
        yield
    except REPORTED_ERRORS as error:
        raise RunFailure(str(error)) from error


def run_command(script: str, main: Callable[[], object]) -> None:
    """Call ``main`` and end as every script of this project ends (see the module's docstring); other exceptions
    (bugs) keep their traceback."""
    try:
        main()
    except (Interrupted, KeyboardInterrupt) as stop:
        print(f"\n{script}: {stop or 'interrupted'}", file=sys.stderr)
        raise SystemExit(130) from None
    except (RunFailure, *REPORTED_ERRORS) as error:
        if os.environ.get(DEBUG_VARIABLE):
            raise
        print(f"{script}: error: {error}", file=sys.stderr)
        if isinstance(error, RunFailure):
            print(f"{script}: the run failed; {DEBUG_VARIABLE}=1 shows the traceback.", file=sys.stderr)
        raise SystemExit(1 if isinstance(error, RunFailure) else 2) from None


def listed(names: Iterable[str], limit: int = 6) -> str:
    """Names for a message, sorted, at most ``limit`` of them."""
    ordered = sorted(names)
    return ", ".join(ordered[:limit]) + (f", ... ({len(ordered)} in all)" if len(ordered) > limit else "")


def without_nan(value: Any) -> Any:
    """NaN (the correlation over constant scores) and infinities as null, in nested dicts and lists: strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: without_nan(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [without_nan(item) for item in value]
    return value


def read_json(name_or_path: str, filename: str, subfolder: str = "") -> Any:
    """A JSON file of a folder or Hub repo (the Hub's cache offline), or None when there is none to read."""
    from transformers.utils import cached_file

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


def launcher_chose_one_thread() -> bool:
    """Whether ``OMP_NUM_THREADS=1`` is ``accelerate launch``'s own default (it gives a CPU process one thread unless
    the user set ``OMP_NUM_THREADS`` or ``--num_cpu_threads_per_process``), as the launcher's environment and command
    line (``/proc/<parent>/``) tell; where they cannot be read, the number counts as the user's."""
    if os.environ.get("OMP_NUM_THREADS") != "1" or "ACCELERATE_MIXED_PRECISION" not in os.environ:
        return False  # not started by accelerate launch, or not its default
    try:
        with open(f"/proc/{os.getppid()}/environ", "rb") as handle:
            launcher_environment = handle.read().split(b"\0")
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as handle:
            launcher_arguments = handle.read().split(b"\0")
    except OSError:
        return False
    user_set_it = any(entry.startswith(b"OMP_NUM_THREADS=") for entry in launcher_environment) or any(
        argument.startswith(b"--num_cpu_threads_per_process") for argument in launcher_arguments
    )
    return not user_set_it


def use_all_cpu_cores(training_args) -> None:
    """Train a single CPU process on every core it is given when its one thread is the launcher's default (which
    halves the speed on two cores); a number the user set is kept."""
    if training_args.world_size != 1 or training_args.device.type != "cpu" or not launcher_chose_one_thread():
        return
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    import torch

    if torch.get_num_threads() < available:
        logger.info(f"Training on {available} CPU threads (accelerate launch's default is 1).")
        torch.set_num_threads(available)


@contextlib.contextmanager
def write_failures_named(folder: str, step: Callable[[], int]) -> Iterator[None]:
    """A failed write while training or saving (as the OS, torch or safetensors report it) ends in one line naming the
    folder, the step and the way on."""
    try:
        yield
    except Exception as error:
        if isinstance(error, OSError):
            write_failed = error.errno in WRITE_ERRNOS
        else:
            text = str(error)
            write_failed = type(error).__name__ == "SafetensorError" or (
                isinstance(error, RuntimeError) and ("write failed" in text or "No space left" in text)
            )
        if not write_failed:
            raise
        raise OSError(
            f"writing into {folder} failed at step {step()} ({type(error).__name__}: {error}). Free space or fix "
            "the folder, then continue with the same command and --resume_from_checkpoint last (it takes the newest "
            "complete checkpoint and names a broken one)."
        ) from error


def setup_logging(training_args, logger: logging.Logger) -> None:
    """The examples' logging: the process's own level for transformers and datasets, and the script's progress
    (``logger`` and the package's) on the main process."""
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    log_level = training_args.get_process_log_level()
    script_log_level = min(log_level, logging.INFO) if training_args.should_log else log_level
    logger.setLevel(script_log_level)
    logging.getLogger("ifcl").setLevel(script_log_level)
    import datasets
    import transformers

    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    logger.warning(
        f"Process rank: {training_args.process_index}, device: {training_args.device}, "
        f"n_gpu: {training_args.n_gpu}, distributed: {training_args.parallel_mode.value == 'distributed'}"
    )
