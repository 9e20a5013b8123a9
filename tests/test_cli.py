"""How the scripts end (``cli_ifcl.Command``): one line per error, exit 2 for bad input, 1 for a failure once the
work has begun, 130 for Ctrl-C with the way on, the traceback only with IFCL_DEBUG=1."""

from __future__ import annotations

import pytest

import run_ifcl
from cli_ifcl import Command


def fail_with(error: BaseException, command: Command | None = None, running: bool = False):
    def work() -> None:
        if command is not None:
            command.running = running
        raise error

    return work


@pytest.mark.parametrize(
    "running, code",
    [(False, 2), (True, 1)],
    ids=["bad input", "failure during the run"],
)
def test_errors_end_with_one_line_and_an_exit_code(capsys, monkeypatch, running, code):
    monkeypatch.delenv("IFCL_DEBUG", raising=False)
    command = Command("some_script.py")
    with pytest.raises(SystemExit) as exit_info:
        command.main(fail_with(ValueError("--setting 3: out of range"), command, running))
    assert exit_info.value.code == code
    err = capsys.readouterr().err
    assert err.startswith("some_script.py: error: --setting 3: out of range\n")
    assert "Traceback" not in err
    assert ("IFCL_DEBUG=1 shows the traceback" in err) == running


def test_debug_variable_shows_the_traceback(monkeypatch):
    monkeypatch.setenv("IFCL_DEBUG", "1")
    with pytest.raises(OSError, match="disk full"):
        Command("some_script.py").main(fail_with(OSError("disk full")))


def test_other_exceptions_are_not_swallowed(monkeypatch):
    monkeypatch.delenv("IFCL_DEBUG", raising=False)
    with pytest.raises(RuntimeError, match="a bug"):
        Command("some_script.py").main(fail_with(RuntimeError("a bug")))


def test_ctrl_c_names_the_newest_checkpoint_and_the_resume_command(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "run"
    for step in (2, 10, 4):
        (folder / f"checkpoint-{step}").mkdir(parents=True)
    monkeypatch.setattr("sys.argv", ["run_ifcl.py", "--output_dir", str(folder)])

    def interrupted() -> None:
        run_ifcl.COMMAND.details["output_dir"] = str(folder)
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as exit_info:
        run_ifcl.COMMAND.main(interrupted, on_interrupt=run_ifcl.interrupted_message)
    assert exit_info.value.code == 130
    err = capsys.readouterr().err
    assert f"the newest checkpoint is {folder / 'checkpoint-10'}" in err
    assert f"continue with: run_ifcl.py --output_dir {folder} --resume_from_checkpoint last" in err
    run_ifcl.COMMAND.details["output_dir"] = str(tmp_path / "empty")
    assert run_ifcl.interrupted_message() == "interrupted; no checkpoint was written yet"
