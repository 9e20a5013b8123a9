"""What a training run may do to its output folder (docs/reliability.md): write only where nothing of the user's would
be lost, delete only what runs of this project recorded as theirs, one run at a time, and resume only what is
unfinished. A run records the top-level names it wrote in ``run_in_progress.json``, renamed to ``ifcl_run.json`` once
it is finished."""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ifcl.failures import listed
from ifcl.files import (
    LOCK_FILE,
    RUN_IN_PROGRESS_FILE,
    RUN_RECORD_FILE,
    TRAINING_DATA_FILE,
    exclusive_lock,
    read_json,
    write_json_atomically,
)

from .checkpoints import ResumePoint, resume_point

logger = logging.getLogger(__name__)

# The top-level names a run writes (fnmatch patterns): checkpoints, the model with its remote code, tokenizers and
# sentence-transformers modules, results, card, plots and the Trainer's state and logs. A file of one of these names
# that no run recorded is never written over.
RUN_OUTPUT_PATTERNS = (
    "checkpoint-*",
    "runs",
    "README.md",
    "config.json",
    "model.safetensors",
    "model-*.safetensors",
    "model.safetensors.index.json",
    "modeling_ifcl.py",
    "configuration_ifcl.py",
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template*",
    "vocab*",
    "merges.txt",
    "*.model",
    "*.spm",
    "fraternal_tokenizer",
    "modules.json",
    "config_sentence_transformers.json",
    "sentence_bert_config.json",
    "[0-9]_*",
    "*_results.json",
    "trainer_state.json",
    "training_args.bin",
    "training_curves.png",
    RUN_IN_PROGRESS_FILE,
    RUN_RECORD_FILE,
)


class OutputFolderError(ValueError):
    """The output folder holds what this run must not write over or delete, or cannot be written."""


def is_run_output(name: str) -> bool:
    """Whether a top-level name is one a run writes (:data:`RUN_OUTPUT_PATTERNS`)."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in RUN_OUTPUT_PATTERNS)


def folder_entries(folder: str) -> set[str]:
    """The top-level names of ``folder`` (empty when it does not exist), the lock file left out."""
    return set(os.listdir(folder)) - {LOCK_FILE} if os.path.isdir(folder) else set()


@dataclass
class RunRecord:
    """What a run wrote into its output folder (the content of ``run_in_progress.json`` / ``ifcl_run.json``).

    ``preexisting``: the top-level names the folder held before the run began, None when unknown (a damaged record,
    which then owns nothing); ``written``: the top-level names the run wrote.
    """

    finished: bool
    preexisting: list[str] | None = None
    written: list[str] = field(default_factory=list)
    command: str = ""
    pid: int = 0
    started: str = ""

    @classmethod
    def read(cls, folder: str) -> RunRecord | None:
        """The record of the run in ``folder``: the unfinished one's while ``run_in_progress.json`` exists, else the
        finished one's; None for a folder no run recorded itself in."""
        for name, finished in ((RUN_IN_PROGRESS_FILE, False), (RUN_RECORD_FILE, True)):
            if not os.path.isfile(os.path.join(folder, name)):
                continue
            try:
                content = read_json(folder, name)
            except (OSError, ValueError):
                content = {}
            content = content if isinstance(content, dict) else {}
            preexisting, written = content.get("preexisting"), content.get("written")
            return cls(
                finished=finished,
                preexisting=list(preexisting) if isinstance(preexisting, list) else None,
                written=list(written) if isinstance(written, list) else [],
                command=str(content.get("command", "")),
                pid=int(content.get("pid", 0) or 0),
                started=str(content.get("started", "")),
            )
        return None

    def owned_entries(self, folder: str) -> set[str]:
        """The top-level entries of ``folder`` the run wrote: those recorded and, for an unfinished run, those of a
        run's names that appeared after it began (a save cut short by a kill is not recorded yet)."""
        if self.preexisting is None:
            return set()
        present = folder_entries(folder)
        owned = set(self.written) | {RUN_IN_PROGRESS_FILE, RUN_RECORD_FILE}
        if not self.finished:
            owned |= {name for name in present - set(self.preexisting) if is_run_output(name)}
        return owned & present


@dataclass
class OutputPlan:
    """What a run will do to its output folder, decided before anything loads."""

    resume: ResumePoint | None = None
    to_delete: list[str] = field(default_factory=list)  # an earlier run's entries that the run deletes when it starts
    record: RunRecord | None = None  # the unfinished run this one continues


def contains(folder: str, path: str) -> bool:
    """Whether ``path`` is ``folder`` or lies inside it (symbolic links resolved)."""
    folder, path = os.path.realpath(folder), os.path.realpath(path)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def plan_output_folder(
    folder: str,
    *,
    overwrite: bool,
    resume: str | None,
    protected: Mapping[str, str],
    world_size: int = 1,
    max_steps: int = -1,
    stream_buffer: int | None = None,
    training_data: dict[str, Any] | None = None,
) -> OutputPlan:
    """Decide, reading only, what the run does to ``folder``: resume its unfinished run (``resume``: a checkpoint, or
    ``last``), delete what an earlier run recorded (``overwrite``, unless the folder holds what the run reads,
    ``protected``: option -> local path, or is the working folder), or start in a folder without a run
    (``stream_buffer``: a streamed run's ``--shuffle_buffer_size``, whose checkpoints keep each process's stream
    state; None: not streamed; ``training_data``: what the run reads, which a resume compares). Raises
    :class:`OutputFolderError` (or ``checkpoints.CheckpointError``) when the run would lose anything."""
    record = RunRecord.read(folder)
    owned = record.owned_entries(folder) if record is not None else set()
    present = folder_entries(folder)
    if resume is not None:
        if record is not None and record.finished:
            raise OutputFolderError(
                f"--resume_from_checkpoint {resume}: the run in --output_dir {folder} is finished ({RUN_RECORD_FILE}); "
                "there is nothing to resume. Evaluate it with evaluate_sts.py, train on from it with "
                f"--model_name_or_path {folder} --output_dir NEW_FOLDER, or train anew with --overwrite_output_dir."
            )
        point = resume_point(resume, folder, world_size, max_steps, stream_buffer, training_data)
        if record is None:  # resuming a checkpoint from elsewhere into this folder
            refuse_unrecorded_files(folder, {name for name in present if is_run_output(name)})
        return OutputPlan(resume=point, record=record if owned else None)
    if owned == {RUN_IN_PROGRESS_FILE}:  # an earlier run stopped before writing anything: nothing to keep
        logger.warning(f"{folder}: an earlier run ({record.command}) stopped before writing anything; starting anew.")
        return OutputPlan(to_delete=sorted(owned))
    if record is not None and not overwrite:
        state = "a finished run" if record.finished else "an unfinished run"
        raise OutputFolderError(
            f"--output_dir {folder} already holds a run ({state}: {listed(owned or present)}). Choose another "
            "--output_dir, continue it with --resume_from_checkpoint last, or replace it with --overwrite_output_dir."
        )
    if owned:
        where = f"--overwrite_output_dir with --output_dir {folder}"
        if contains(folder, os.getcwd()):
            raise OutputFolderError(
                f"{where}: that is the working folder or one of its parents, which may hold anything of yours. Give "
                "the run a folder of its own (--output_dir outputs/NAME)."
            )
        inside = [f"{option} {path}" for option, path in protected.items() if contains(folder, path)]
        if inside:
            raise OutputFolderError(
                f"{where}: it holds what this run reads ({', '.join(inside)}). Choose another --output_dir, or move "
                "them out of it."
            )
    refuse_unrecorded_files(folder, {name for name in present - owned if is_run_output(name)})
    return OutputPlan(to_delete=sorted(owned))


def refuse_unrecorded_files(folder: str, unrecorded: set[str]) -> None:
    """Refuse a folder holding files a run would write over that no run of this project recorded as its own."""
    if unrecorded:
        raise OutputFolderError(
            f"--output_dir {folder} holds {listed(unrecorded)}, which this run would write over and which no run of "
            f"run_ifcl.py recorded as its own ({RUN_RECORD_FILE}; runs of versions before it recorded nothing). "
            "Choose another --output_dir, or move them away yourself."
        )


class RunFolder(TrainerCallback):
    """The output folder of one run: its lock, its record, and the deletion of an earlier run's entries; as a Trainer
    callback, it records each checkpoint once it is saved, and writes into it what the run reads
    (``training_data``, ``ifcl.checkpoints.training_data_record``; None: nothing), which a resume compares. Only the
    main process (``is_main``) locks and writes."""

    def __init__(self, folder: str, is_main: bool = True, training_data: dict[str, Any] | None = None) -> None:
        self.folder = folder
        self.is_main = is_main
        self.training_data = training_data
        self.record: RunRecord | None = None  # set by start()

    @contextlib.contextmanager
    def locked(self) -> Iterator[RunFolder]:
        """Hold the folder's lock for the block (made if missing, and removed again if the run left it empty). A
        run that fails before writing anything but its record leaves no record, so the same command works again."""
        if not self.is_main:
            yield self
            return
        if os.path.exists(self.folder) and not os.path.isdir(self.folder):
            raise OutputFolderError(f"--output_dir {self.folder} is a file, not a folder; choose another.")
        made = not os.path.exists(self.folder)
        try:
            with contextlib.ExitStack() as stack:
                try:
                    os.makedirs(self.folder, exist_ok=True)
                    stack.enter_context(exclusive_lock(os.path.join(self.folder, LOCK_FILE)))
                except BlockingIOError:
                    record = RunRecord.read(self.folder)
                    who = f" (pid {record.pid}: {record.command})" if record and record.pid else ""
                    raise OutputFolderError(
                        f"--output_dir {self.folder}: another run is writing into it{who}. Wait for it to end, or "
                        "choose another --output_dir."
                    ) from None
                except OSError as error:
                    raise OutputFolderError(f"--output_dir {self.folder} cannot be written: {error}") from error
                try:
                    yield self
                except BaseException:
                    self.abandon()
                    raise
        finally:
            if made:
                with contextlib.suppress(OSError):
                    os.rmdir(self.folder)  # only when empty: a run that stopped before writing anything

    def start(self, plan: OutputPlan) -> None:
        """Delete the earlier run's entries the plan names, then record this run as in progress (a resumed run
        keeps its record). Main process only."""
        if not self.is_main:
            return
        for name in plan.to_delete:
            path = os.path.join(self.folder, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            elif os.path.lexists(path):
                os.remove(path)
        if plan.to_delete and plan.to_delete != [RUN_IN_PROGRESS_FILE]:
            logger.warning(
                f"--overwrite_output_dir: deleted what the earlier run in {self.folder} wrote: {listed(plan.to_delete)}."
            )
        record = plan.record or RunRecord(finished=False, preexisting=sorted(folder_entries(self.folder)))
        record.command = " ".join(sys.argv)
        record.pid = os.getpid()
        record.started = time.strftime("%Y-%m-%d %H:%M:%S")
        self.record = record
        self.note_written()

    def note_written(self) -> None:
        """Record the run's names that appeared in the folder since it began (main process, once started)."""
        if not self.is_main or self.record is None:
            return
        preexisting = set(self.record.preexisting or ())
        new = {name for name in folder_entries(self.folder) - preexisting if is_run_output(name)}
        self.record.written = sorted((set(self.record.written) | new) - {RUN_IN_PROGRESS_FILE, RUN_RECORD_FILE})
        write_json_atomically(os.path.join(self.folder, RUN_IN_PROGRESS_FILE), asdict(self.record))

    def on_save(self, args, state, control, **kwargs) -> None:
        checkpoint = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if self.is_main and self.training_data is not None and os.path.isdir(checkpoint):
            write_json_atomically(os.path.join(checkpoint, TRAINING_DATA_FILE), self.training_data)
        self.note_written()

    def finish(self) -> None:
        """Mark the run finished: its record, with everything it wrote, becomes ``ifcl_run.json``."""
        if not self.is_main or self.record is None:
            return
        self.note_written()
        self.record.finished = True
        in_progress = os.path.join(self.folder, RUN_IN_PROGRESS_FILE)
        write_json_atomically(in_progress, asdict(self.record))
        os.replace(in_progress, os.path.join(self.folder, RUN_RECORD_FILE))
        self.record = None

    def abandon(self) -> None:
        """After a failure: keep the record of a run that wrote something (a resume or an overwrite can take it
        up); remove the record of one that wrote nothing, so the same command works again."""
        if not self.is_main or self.record is None:
            return
        with contextlib.suppress(OSError):
            self.note_written()
            if not self.record.written:
                os.remove(os.path.join(self.folder, RUN_IN_PROGRESS_FILE))
        self.record = None


def protected_paths(model_args, data_args) -> dict[str, str]:
    """What a ``run_ifcl.py`` run reads here, by option: --overwrite_output_dir never deletes a folder holding one."""
    paths = {
        "--train_file": data_args.train_file,
        "--validation_file": data_args.validation_file,
        "--test_file": data_args.test_file,
        "--model_name_or_path": model_args.model_name_or_path,
        "--fraternal_model_name_or_path": model_args.fraternal_model_name_or_path,
    }
    return {option: path for option, path in paths.items() if path and os.path.exists(path)}
