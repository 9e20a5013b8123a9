"""How the command-line scripts end: one line per error, a fixed exit code, a traceback only when asked for.

``run_ifcl.py``, ``evaluate_sts.py`` and ``prepare_fraternal.py`` all end the same way:

- a bad input (the project's own errors, which are ``ValueError`` or ``OSError``) prints ``<script>: error: <message>``
  and exits with code 2, found before any model is loaded;
- the same errors once the real work has begun (``Command.running``) are failures of the run: the same one line,
  exit code 1;
- Ctrl-C prints what the script says about continuing, exit code 130.

``IFCL_DEBUG=1`` in the environment shows the traceback instead.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

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
