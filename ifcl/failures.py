"""How the command-line scripts end (``<script>: error: <message>``: exit code 2 for bad input, 1 for a failure once
the work has begun, 130 for Ctrl-C; the traceback only with ``IFCL_DEBUG=1``), failed writes named, and lists of names
in messages."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Callable, Iterable, Iterator

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
