"""The training process: its CPU threads under ``accelerate launch`` and its logging."""

from __future__ import annotations

import logging
import os
import sys

import datasets
import torch
import transformers

logger = logging.getLogger(__name__)


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

    if torch.get_num_threads() < available:
        logger.info(f"Training on {available} CPU threads (accelerate launch's default is 1).")
        torch.set_num_threads(available)


def log_to_stdout(**options) -> None:
    """The scripts' log lines, as the examples write them, on standard output; ``options``: more of
    ``logging.basicConfig``'s (``level``)."""
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
        **options,
    )


def setup_logging(training_args, logger: logging.Logger) -> None:
    """The examples' logging: the process's own level for transformers and datasets, and the script's progress
    (``logger``, the package's and the trainer's) on the main process."""
    log_to_stdout()
    log_level = training_args.get_process_log_level()
    script_log_level = min(log_level, logging.INFO) if training_args.should_log else log_level
    logger.setLevel(script_log_level)
    for name in ("ifcl", "trainer_ifcl", "modeling_ifcl"):
        logging.getLogger(name).setLevel(script_log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    logger.warning(
        f"Process rank: {training_args.process_index}, device: {training_args.device}, "
        f"n_gpu: {training_args.n_gpu}, distributed: {training_args.parallel_mode.value == 'distributed'}"
    )
