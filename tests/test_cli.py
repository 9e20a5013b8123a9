"""How the scripts end (``ifcl.failures.run_command``): one line per error, exit 2 for bad input, 1 for a failure once the
work has begun, 130 for Ctrl-C with the way on, the traceback only with IFCL_DEBUG=1."""

from __future__ import annotations

import pytest

from ifcl.failures import Interrupted, failures_of_the_run, run_command
from ifcl.files import atomic_path, write_json_atomically


def fail_with(error: BaseException, running: bool = False):
    def work() -> None:
        if running:
            with failures_of_the_run():
                raise error
        raise error

    return work


@pytest.mark.parametrize("running, code", [(False, 2), (True, 1)], ids=["bad input", "failure during the run"])
def test_errors_end_with_one_line_and_an_exit_code(capsys, monkeypatch, running, code):
    monkeypatch.delenv("IFCL_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        run_command("some_script.py", fail_with(ValueError("--setting 3: out of range"), running))
    assert exit_info.value.code == code
    err = capsys.readouterr().err
    assert err.startswith("some_script.py: error: --setting 3: out of range\n")
    assert "Traceback" not in err
    assert ("IFCL_DEBUG=1 shows the traceback" in err) == running


@pytest.mark.parametrize(
    "environment, prints",
    [
        ({}, True),  # one process
        ({"RANK": "0", "LOCAL_RANK": "0"}, True),  # the first of accelerate launch's processes
        ({"RANK": "1", "LOCAL_RANK": "1"}, False),  # another one
        ({"RANK": "1"}, False),  # a launcher that sets RANK alone
        ({"RANK": "2", "LOCAL_RANK": "0"}, True),  # the first process of the second machine
    ],
)
@pytest.mark.parametrize("running, code", [(False, 2), (True, 1)], ids=["bad input", "failure during the run"])
def test_under_several_processes_the_line_is_printed_once_with_every_process_exit_code(
    capsys, monkeypatch, environment, prints, running, code
):
    """``accelerate launch --num_processes 2`` with a bad setting printed its line once per process: now the first
    process of each machine prints it, and every process ends with the same exit code."""
    monkeypatch.delenv("IFCL_DEBUG", raising=False)
    for name in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_info:
        run_command("some_script.py", fail_with(ValueError("--setting 3: out of range"), running))
    assert exit_info.value.code == code
    err = capsys.readouterr().err
    assert err.startswith("some_script.py: error: --setting 3: out of range\n") if prints else err == ""

    def interrupted() -> None:
        raise Interrupted("interrupted; continue with: ...")

    with pytest.raises(SystemExit) as exit_info:
        run_command("some_script.py", interrupted)
    assert exit_info.value.code == 130
    assert ("some_script.py: interrupted; continue with" in capsys.readouterr().err) == prints


def test_debug_variable_shows_the_traceback(monkeypatch):
    monkeypatch.setenv("IFCL_DEBUG", "1")
    with pytest.raises(OSError, match="disk full"):
        run_command("some_script.py", fail_with(OSError("disk full")))


def test_other_exceptions_are_not_swallowed(monkeypatch):
    monkeypatch.delenv("IFCL_DEBUG", raising=False)
    with pytest.raises(RuntimeError, match="a bug"):
        run_command("some_script.py", fail_with(RuntimeError("a bug")))


def test_atomic_path_replaces_the_file_whole_or_not_at_all(tmp_path):
    target = tmp_path / "record.json"
    write_json_atomically(str(target), {"step": 1, "loss": float("nan")})
    assert target.read_text(encoding="utf-8") == '{\n  "step": 1,\n  "loss": null\n}'
    with pytest.raises(OSError, match="disk full"), atomic_path(str(target)) as temporary:
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write('{"step": 2')
        raise OSError("disk full")
    assert '"step": 1' in target.read_text(encoding="utf-8"), "the old file is left as it was"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["record.json"], "no temporary file is left"
    with atomic_path(str(target)) as temporary:
        assert temporary.startswith(f"{target}.tmp-"), "beside the target: the rename stays on one file system"
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write("new")
        assert target.read_text(encoding="utf-8") != "new", "replaced only when the block ends"
    assert target.read_text(encoding="utf-8") == "new"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["record.json"]


def write_checkpoint(folder, step: int) -> None:
    """A checkpoint folder holding every file resuming reads (tiny, but each a real file of its kind)."""
    import json

    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 100}))
    (folder / "config.json").write_text("{}")
    save_file({"weight": torch.zeros(2)}, str(folder / "model.safetensors"))
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        torch.save({"step": step}, folder / name)


def test_ctrl_c_names_the_newest_complete_checkpoint_and_the_resume_command(tmp_path, capsys):
    from ifcl.checkpoints import interrupted_message

    folder = tmp_path / "run"
    for step in (2, 10, 4):
        write_checkpoint(folder / f"checkpoint-{step}", step)
    (folder / "checkpoint-10" / "optimizer.pt").unlink()  # its save was cut short
    command = ["run_ifcl.py", "--output_dir", str(folder)]

    def interrupted() -> None:
        raise Interrupted(interrupted_message(str(folder), command))

    with pytest.raises(SystemExit) as exit_info:
        run_command("run_ifcl.py", interrupted)
    assert exit_info.value.code == 130
    err = capsys.readouterr().err
    assert f"the newest complete checkpoint is {folder / 'checkpoint-4'}" in err
    assert f"continue with: run_ifcl.py --output_dir {folder} --resume_from_checkpoint last" in err
    with_glob = interrupted_message(str(folder), [*command, "--train_file", "shards/*.txt"])
    assert "--train_file 'shards/*.txt' --resume_from_checkpoint last" in with_glob  # pasted, the shell keeps it
    assert (
        interrupted_message(str(tmp_path / "empty"), command) == "interrupted; no complete checkpoint was written yet"
    )


DAMAGED_TRAINER_STATES = {
    "an array": ("[]", "it holds [], not the Trainer's JSON object"),
    "an empty object": ("{}", "no global_step"),
    "not JSON": ('{"global_step": 4, "max', "is not valid JSON"),
    "a step that is text": ('{"global_step": "4", "max_steps": 100}', 'global_step is "4", not a whole number'),
    "another program's fields": ('{"global_step": 4, "max_steps": 100, "steps": 4}', "does not have, steps"),
}


@pytest.mark.parametrize("content, damage", DAMAGED_TRAINER_STATES.values(), ids=DAMAGED_TRAINER_STATES)
def test_a_damaged_trainer_state_names_the_checkpoint_and_last_skips_it(tmp_path, caplog, content, damage):
    """A checkpoint's ``trainer_state.json`` that is no Trainer state, valid JSON or not, is a broken checkpoint as a
    cut file is: named with the way on when given, skipped with a warning by ``last`` and Ctrl-C's message (it used
    to trace back there)."""
    from ifcl.checkpoints import CheckpointError, interrupted_message, resume_point

    folder = tmp_path / "run"
    for step in (2, 4):
        write_checkpoint(folder / f"checkpoint-{step}", step)
    damaged = folder / "checkpoint-4"
    (damaged / "trainer_state.json").write_text(content)
    with pytest.raises(CheckpointError) as info:
        resume_point(str(damaged), str(folder), world_size=1, max_steps=100)
    message = str(info.value)
    assert f"{damaged / 'trainer_state.json'} " in message and damage in message and "\n" not in message
    assert "resume from an earlier checkpoint" in message
    with caplog.at_level("WARNING"):
        point = resume_point("last", str(folder), world_size=1, max_steps=100)
    assert point.checkpoint == str(folder / "checkpoint-2") and not point.finished
    assert any(str(damaged / "trainer_state.json") in line and damage in line for line in caplog.messages)
    assert f"the newest complete checkpoint is {folder / 'checkpoint-2'}" in interrupted_message(str(folder), [])
    (folder / "checkpoint-2" / "trainer_state.json").write_text(content)
    with pytest.raises(CheckpointError, match="no checkpoint of .* can be resumed from: .*checkpoint-2"):
        resume_point("last", str(folder), world_size=1, max_steps=100)


LAUNCHER = """
import os, subprocess, sys
child = "import sys; sys.path.insert(0, {root!r}); from ifcl.processes import launcher_chose_one_thread; print(launcher_chose_one_thread())"
env = dict(os.environ, OMP_NUM_THREADS="1", ACCELERATE_MIXED_PRECISION="no")
print(subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True).stdout.strip())
"""


@pytest.mark.parametrize(
    "launcher_environment, launcher_arguments, expected",
    [
        ({}, [], "True"),  # accelerate launch's own default: all cores are used
        ({"OMP_NUM_THREADS": "1"}, [], "False"),  # the user's OMP_NUM_THREADS=1 is kept
        ({}, ["--num_cpu_threads_per_process", "1"], "False"),  # so is the launcher's flag
    ],
)
def test_a_thread_count_the_user_set_is_kept(launcher_environment, launcher_arguments, expected):
    """The launcher (here a stand-in that starts its child as accelerate launch does: OMP_NUM_THREADS=1) is the
    parent process whose own environment and command line tell whether the user chose the number."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    environment = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | launcher_environment
    script = LAUNCHER.format(root=str(ROOT))
    result = subprocess.run(
        [sys.executable, "-c", script, *launcher_arguments], env=environment, capture_output=True, text=True
    )
    assert result.stdout.strip().splitlines()[-1] == expected, result.stderr[-2000:]
