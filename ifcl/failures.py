"""How the command-line scripts end (``<script>: error: <message>``, printed once per machine under several
processes and given to torchrun's failure report: exit code 2 for bad input, 1 for a failure once the work has begun,
130 for Ctrl-C; the traceback only with ``IFCL_DEBUG=1``), failed writes named (a run's folder, a cache), and lists of
names in messages."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator

DEBUG_VARIABLE = "IFCL_DEBUG"
# Where torchrun (under ``accelerate launch`` of several processes) has each process write why it failed.
LAUNCHER_ERROR_FILE_VARIABLE = "TORCHELASTIC_ERROR_FILE"
# What a script reports as one line: the project's errors subclass these (DataFormatError, SettingsError,
# OutputFolderError, TaskDataNotFoundError), and so do invalid JSON, a missing file and a full disk.
REPORTED_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError, FloatingPointError)
# What a failed write reports: no space, no quota, a read-only file system, no permission, an I/O error, too large.
WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EFBIG)
# The names Python's tempfile gives: datasets' map writes its cache file under one, renamed once complete.
TEMPORARY_NAME = re.compile(r"tmp[a-z0-9_]{8}")


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


def reports_for_its_machine() -> bool:
    """Whether this process prints how a script ended: the only one, or the first of its machine under
    ``accelerate launch`` or ``torchrun`` (``LOCAL_RANK``, else ``RANK``, unset or 0; read from the environment the
    launcher sets, so before any process group exists). The other processes meet the same settings, files and
    checks, so their line would repeat the first's."""
    return os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")).strip() in ("", "0")


def tell_the_launcher(line: str) -> None:
    """Under torchrun (``accelerate launch`` of several processes, ``torchrun``), write ``line`` into this process's
    error file (:data:`LAUNCHER_ERROR_FILE_VARIABLE`, in the form torch's ``ErrorHandler`` writes), which torch's
    failure report (``ChildFailedError``) shows as the process's ``traceback`` instead of a link to its docs: the
    report names what failed even when this process was not the one that printed the line."""
    path = os.environ.get(LAUNCHER_ERROR_FILE_VARIABLE)
    if not path:
        return
    with contextlib.suppress(OSError), open(path, "w", encoding="utf-8") as handle:
        json.dump({"message": line, "timestamp": int(time.time())}, handle)


def run_command(script: str, main: Callable[[], object]) -> None:
    """Call ``main`` and end as every script of this project ends (see the module's docstring); other exceptions
    (bugs) keep their traceback. Under a launcher of several processes each ends with the same exit code, the line
    is printed once per machine (:func:`reports_for_its_machine`) and every process gives it to torchrun's report
    (:func:`tell_the_launcher`); ``IFCL_DEBUG=1`` shows every process's traceback."""
    try:
        main()
    except (Interrupted, KeyboardInterrupt) as stop:
        if reports_for_its_machine():
            print(f"\n{script}: {stop or 'interrupted'}", file=sys.stderr)
        raise SystemExit(130) from None
    except (RunFailure, *REPORTED_ERRORS) as error:
        if os.environ.get(DEBUG_VARIABLE):
            raise
        tell_the_launcher(f"{script}: error: {error}")
        if reports_for_its_machine():
            print(f"{script}: error: {error}", file=sys.stderr)
            if isinstance(error, RunFailure):
                print(f"{script}: the run failed; {DEBUG_VARIABLE}=1 shows the traceback.", file=sys.stderr)
        raise SystemExit(1 if isinstance(error, RunFailure) else 2) from None


def listed(names: Iterable[str], limit: int = 6) -> str:
    """Names for a message, sorted, at most ``limit`` of them."""
    ordered = sorted(names)
    return ", ".join(ordered[:limit]) + (f", ... ({len(ordered)} in all)" if len(ordered) > limit else "")


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


def temporary_files(folder: str) -> set[str]:
    """The files of ``folder`` named as Python's ``tempfile`` names them (:data:`TEMPORARY_NAME`)."""
    try:
        return {entry.name for entry in os.scandir(folder) if TEMPORARY_NAME.fullmatch(entry.name) and entry.is_file()}
    except OSError:
        return set()


@contextlib.contextmanager
def cache_write_failures_named(folder: str, cache: str, ways_out: str) -> Iterator[None]:
    """A cache written into ``folder`` under a temporary name that is renamed once complete, as datasets' ``map``
    writes one: a failed write (:data:`WRITE_ERRNOS`) removes the temporary files that appeared in ``folder`` meanwhile
    (``map`` leaves its own when the disk is full: its clean-up writes again; a concurrent writer's there, which the
    full disk fails too, goes with them) and ends in one line naming the ``cache``, its folder, what to do there
    (free space, or make it writable) and the other ``ways_out``."""
    before = temporary_files(folder)
    try:
        yield
    except OSError as error:
        if error.errno not in WRITE_ERRNOS:
            raise
        for name in temporary_files(folder) - before:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(folder, name))
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OSError(f"{folder}: no space left for {cache}; free space there, {ways_out}.") from error
        problem = f"{cache} could not be written ({error.strerror or error})"
        raise OSError(f"{folder}: {problem}; make the folder writable, {ways_out}.") from error
