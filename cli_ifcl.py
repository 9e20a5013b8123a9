"""How the command-line scripts end (one line per error, a fixed exit code, a traceback only when asked for), the
input checks they share, and how they write results files.

``run_ifcl.py``, ``evaluate_sts.py`` and ``prepare_fraternal.py`` all end the same way:

- a bad input (the project's own errors, which are ``ValueError`` or ``OSError``) prints ``<script>: error: <message>``
  and exits with code 2, found before any model is loaded;
- the same errors once the real work has begun (``Command.running``) are failures of the run: the same one line,
  exit code 1;
- Ctrl-C prints what the script says about continuing, exit code 130.

``IFCL_DEBUG=1`` in the environment shows the traceback instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

DEBUG_VARIABLE = "IFCL_DEBUG"
INPUT_ERROR, RUNTIME_FAILURE, INTERRUPTED = 2, 1, 130
# What a script reports as one line: the project's errors subclass these (DataFormatError, SettingsError,
# OutputFolderError, TaskDataNotFoundError), and so do invalid JSON, a missing file and a full disk.
REPORTED_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError, FloatingPointError)


@dataclass
class Command:
    """One script's run: its name in messages, and whether the checks are over and the work has begun."""

    script: str
    running: bool = False
    details: dict[str, object] = field(default_factory=dict)  # what on_interrupt needs (e.g. the output folder)

    def main(self, work: Callable[[], object], on_interrupt: Callable[[], str] | None = None) -> None:
        """Call ``work``; turn its errors and Ctrl-C into a message and an exit code (see the module docstring)."""
        self.running = False
        try:
            work()
        except KeyboardInterrupt:
            message = on_interrupt() if on_interrupt is not None else "interrupted"
            print(f"\n{self.script}: {message}", file=sys.stderr)
            raise SystemExit(INTERRUPTED) from None
        except REPORTED_ERRORS as error:
            if os.environ.get(DEBUG_VARIABLE):
                raise
            print(f"{self.script}: error: {error}", file=sys.stderr)
            if self.running:
                print(f"{self.script}: the run failed; {DEBUG_VARIABLE}=1 shows the traceback.", file=sys.stderr)
            raise SystemExit(RUNTIME_FAILURE if self.running else INPUT_ERROR) from None


def check_model_path(option: str, path: str | None) -> None:
    """A Hub id is ``name`` or ``owner/name``: any other model path that is not a folder here is a mistyped one
    (found before anything loads, instead of the Hub client's "Repo id must be in the form ...")."""
    looks_local = path is not None and (path.startswith((".", "/", "~")) or path.count("/") > 1)
    if looks_local and not os.path.isdir(os.path.expanduser(path)):
        raise FileNotFoundError(f"{option} {path}: no such folder (and not a Hub id of the form owner/name).")


def without_nan(value: Any) -> Any:
    """NaN (the correlation over constant scores) and infinities as null, in nested dicts and lists: strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: without_nan(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [without_nan(item) for item in value]
    return value


def write_json_atomically(path: str, content: Any, sort_keys: bool = False) -> None:
    """``content`` as JSON (NaN and infinities as null) to a temporary file beside ``path``, then renamed over it: a
    reader finds the old file or the whole new one, never half of one; a failed write leaves no temporary file."""
    temporary = f"{path}.tmp-{os.getpid()}"
    try:
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(without_nan(content), handle, indent=2, sort_keys=sort_keys, ensure_ascii=False, allow_nan=False)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


@contextlib.contextmanager
def exclusive_lock(lock_file: str) -> Iterator[str]:
    """Hold an exclusive ``flock`` on ``lock_file`` (made if missing) for the ``with`` block; yield its path.

    Another process that holds it: ``BlockingIOError`` at once (callers say which run holds it). The lock file is
    removed at the end, while still locked; a process that opened it just before finds, once it has the lock, that the
    path no longer leads to the file it locked, and takes the new lock file instead. A lock file left by a killed
    process holds no lock (the kernel released it): it is taken over.
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
