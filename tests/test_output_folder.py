"""The output folder is the run's own: it deletes only what runs recorded as theirs, never writes over a user's file,
holds one run at a time, resumes only an unfinished run from its newest complete checkpoint, and a run that finished
training but not its results finishes them without another step."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import losses_by_step, objective_run_args, run_script, stopped_in_step
from safetensors.torch import load_file, save_file

import run_ifcl
from ifcl.checkpoints import CheckpointError
from ifcl.failures import Interrupted, run_command
from ifcl.files import LOCK_FILE, RUN_IN_PROGRESS_FILE, RUN_RECORD_FILE, exclusive_lock
from ifcl.output_folder import OutputFolderError, RunRecord
from ifcl.sts import command as evaluate_sts


def record(folder) -> RunRecord:
    found = RunRecord.read(str(folder))
    assert found is not None, f"no run record in {folder}"
    return found


def write_record(folder, written: list[str], finished: bool = True) -> None:
    """The record a run of this project leaves: it wrote ``written``."""
    content = {"finished": finished, "preexisting": [], "written": written, "command": "run_ifcl.py", "pid": 1}
    (folder / (RUN_RECORD_FILE if finished else RUN_IN_PROGRESS_FILE)).write_text(json.dumps(content))


# ---------------------------------------------------------------- what a run may write over or delete


def test_a_second_run_into_a_finished_folder_is_refused_before_any_model_loads(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "all_results.json").write_text('{"test_stsb_spearman": 80.0}')
    (folder / "checkpoint-50").mkdir()
    write_record(folder, ["all_results.json", "checkpoint-50"])
    with pytest.raises(OutputFolderError) as error:
        run_ifcl.main(["--model_name_or_path", "owner/not-loaded", "--output_dir", str(folder)])
    message = str(error.value)
    assert str(folder) in message and "all_results.json" in message and "checkpoint-50" in message
    assert "--resume_from_checkpoint last" in message and "--overwrite_output_dir" in message
    assert json.loads((folder / "all_results.json").read_text()) == {"test_stsb_spearman": 80.0}  # untouched
    assert not (folder / LOCK_FILE).exists()  # the lock is given back


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_users_files_that_the_run_would_write_over_are_refused_by_name(tmp_path, overwrite):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "README.md").write_text("# my notes\n")
    (folder / "config.json").write_text('{"mine": true}')
    args = ["--model_name_or_path", "owner/not-loaded", "--output_dir", str(folder)]
    with pytest.raises(OutputFolderError) as error:
        run_ifcl.main([*args, "--overwrite_output_dir"] if overwrite else args)
    assert "README.md" in str(error.value) and "config.json" in str(error.value)
    assert "no run of run_ifcl.py recorded" in str(error.value)
    assert (folder / "README.md").read_text() == "# my notes\n" and (
        folder / "config.json"
    ).read_text() == '{"mine": true}'
    assert sorted(os.listdir(folder)) == ["README.md", "config.json"]


def test_overwrite_deletes_only_what_the_earlier_run_wrote(tiny_encoder_dir, english_sts_data, tmp_path):
    folder = tmp_path / "run"
    args = objective_run_args(tiny_encoder_dir, english_sts_data, folder, "simcse")
    run_ifcl.main(args)
    first = record(folder)
    assert first.finished and "model.safetensors" in first.written and "all_results.json" in first.written
    (folder / "notes.txt").write_text("what I noticed")  # the user's, beside the run
    with pytest.raises(OutputFolderError, match="already holds a run"):
        run_ifcl.main(args)
    _, metrics = run_ifcl.main([*args, "--overwrite_output_dir"])
    assert (folder / "notes.txt").read_text() == "what I noticed"
    written = json.loads((folder / "all_results.json").read_text())
    assert written["test_stsb_spearman"] == pytest.approx(metrics["test_stsb_spearman"])
    assert not (folder / RUN_IN_PROGRESS_FILE).exists() and record(folder).finished
    assert "notes.txt" not in record(folder).written
    assert not list(folder.glob("*.tmp-*")) and not (folder / LOCK_FILE).exists()


def test_overwrite_refuses_a_folder_holding_what_the_run_reads(tiny_encoder_dir, english_sts_data, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(english_sts_data, data)
    args = objective_run_args(tiny_encoder_dir, data, data, "simcse")  # the output folder holds the data
    run_ifcl.main(args)
    with pytest.raises(OutputFolderError, match="it holds what this run reads.*--train_file"):
        run_ifcl.main([*args, "--overwrite_output_dir"])
    assert (data / "train.txt").exists() and (data / "model.safetensors").exists()
    # The model to continue from, as the output folder, is not deleted before it is loaded.
    continued = [*objective_run_args(data, english_sts_data, data, "simcse"), "--overwrite_output_dir"]
    with pytest.raises(OutputFolderError, match="--model_name_or_path"):
        run_ifcl.main(continued)
    assert (data / "model.safetensors").exists()


def test_the_working_folder_is_never_overwritten(tiny_encoder_dir, english_sts_data, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(english_sts_data, work)
    (work / "other_data.csv").write_text("a,b\n1,2\n")
    args = objective_run_args(tiny_encoder_dir, work, work, "simcse")
    args[args.index("--output_dir") + 1] = "."
    first = run_script("run_ifcl.py", *args, cwd=work)
    assert first.returncode == 0, first.stderr[-2000:]
    second = run_script("run_ifcl.py", *args, "--overwrite_output_dir", cwd=work)
    assert second.returncode == 2, second.stderr[-2000:]
    assert "Traceback" not in second.stderr and "working folder" in second.stderr
    assert (work / "train.txt").exists() and (work / "other_data.csv").exists() and (work / "sts.tsv").exists()


def test_one_run_per_folder_at_a_time(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    with exclusive_lock(str(folder / LOCK_FILE)):  # another run holds the folder
        with pytest.raises(OutputFolderError, match="another run is writing into it"):
            run_ifcl.main(["--model_name_or_path", "owner/not-loaded", "--output_dir", str(folder)])
    assert os.listdir(folder) == []


def test_a_run_that_fails_before_writing_anything_leaves_nothing_behind(
    tiny_encoder_dir, english_sts_data, tmp_path, monkeypatch
):
    from ifcl.model import IFCLModel

    def fail(*args, **kwargs):
        raise OSError("the disk went away")

    monkeypatch.setattr(IFCLModel, "from_encoder", fail)
    folder = tmp_path / "run"
    args = objective_run_args(tiny_encoder_dir, english_sts_data, folder, "simcse")
    with pytest.raises(OSError, match="the disk went away"):
        run_ifcl.main(args)
    assert not folder.exists()  # made for the lock, left empty, removed
    monkeypatch.undo()
    # A run killed before its first checkpoint leaves only its record: the same command starts anew.
    folder.mkdir()
    write_record(folder, [], finished=False)
    run_ifcl.main(args)
    assert record(folder).finished


def test_an_unfinished_run_is_marked_and_evaluate_sts_refuses_it(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "checkpoint-2").mkdir()
    write_record(folder, ["checkpoint-2"], finished=False)
    with pytest.raises(ValueError, match="unfinished training run"):
        evaluate_sts.parse_arguments(["--model_name_or_path", str(folder)])
    with pytest.raises(OutputFolderError, match="already holds a run"):
        run_ifcl.main(["--output_dir", str(folder)])


def test_unwritable_output_folder_is_found_before_training(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(OutputFolderError, match="cannot be written"):
        run_ifcl.main(["--output_dir", str(blocker / "run")])
    with pytest.raises(OutputFolderError, match="is a file, not a folder"):
        run_ifcl.main(["--output_dir", str(blocker)])


def test_results_with_nan_stay_valid_json(tmp_path):
    run_ifcl.write_json_atomically(str(tmp_path / "r.json"), {"eval_spearman": float("nan"), "ok": 1.5})
    assert json.loads((tmp_path / "r.json").read_text()) == {"eval_spearman": None, "ok": 1.5}


# ---------------------------------------------------------------- resuming


@pytest.fixture(scope="module")
def runs(tiny_encoder_dir, english_sts_data, tmp_path_factory):
    """An uninterrupted 4-step SimCSE run, and the same run stopped by Ctrl-C in step 3 (checkpoint-2 saved)."""
    base = tmp_path_factory.mktemp("resume")
    args = objective_run_args(tiny_encoder_dir, english_sts_data, base / "whole", "simcse")
    _, whole_metrics = run_ifcl.main(args)
    stopped = base / "stopped"
    stopped_args = objective_run_args(tiny_encoder_dir, english_sts_data, stopped, "simcse")
    with stopped_in_step(3), pytest.raises(Interrupted):
        run_ifcl.main(stopped_args)
    assert (stopped / "checkpoint-2").is_dir() and not record(stopped).finished
    return {"whole": (base / "whole", args, whole_metrics), "stopped": (stopped, stopped_args)}


def copy_of_stopped_run(runs, tmp_path):
    folder, args = runs["stopped"]
    copy = tmp_path / "stopped"
    shutil.copytree(folder, copy)
    args = [str(copy) if arg == str(folder) else arg for arg in args]
    return copy, args


def test_resume_with_other_settings_names_each_of_them_before_any_model_loads(runs, monkeypatch):
    folder, args = runs["stopped"]
    checkpoint = folder / "checkpoint-2"
    monkeypatch.setattr(run_ifcl, "load_training_text", lambda *a: pytest.fail("data read before the check"))
    changed = [
        *("--temperature", "0.1", "--per_device_train_batch_size", "2", "--matryoshka_dims", "16", "8"),
        *("--pooler_type", "cls", "--max_seq_length", "24", "--training_dropout", "0.2"),
        *("--resume_from_checkpoint", str(checkpoint)),
    ]
    with pytest.raises(CheckpointError) as error:
        run_ifcl.main([*args, *changed])
    message = str(error.value)
    assert str(checkpoint) in message
    assert "--temperature: 0.05 in the checkpoint, 0.1 now" in message
    assert "global batch" in message and "4 in the checkpoint, 2 now" in message
    assert "--matryoshka_dims: [] in the checkpoint, [16, 8] now" in message
    assert "--pooler_type: 'avg' in the checkpoint, 'cls' now" in message
    assert "--max_seq_length: 32 in the checkpoint, 24 now" in message
    assert "--training_dropout: 0.1 in the checkpoint, 0.2 now" in message
    assert "--fusion_rate" not in message  # only what differs is named
    with pytest.raises(CheckpointError, match="--objective: 'simcse' in the checkpoint, 'ifcl' now"):
        run_ifcl.main([*[a for a in args if a not in ("simcse", "--objective")], "--resume_from_checkpoint", "last"])


def test_resume_with_another_fraternal_model_names_the_flag(
    tiny_encoder_dir, tiny_fraternal_dir, pairs_data, tmp_path, monkeypatch
):
    """A checkpoint trained with one fraternal model, resumed with another or with none: the flag is named with
    both, before any model loads (it would otherwise fail on the optimizer's parameter groups)."""
    args = objective_run_args(tiny_encoder_dir, pairs_data, tmp_path / "run", "ifcl", fraternal=tiny_fraternal_dir)
    with stopped_in_step(2), pytest.raises(Interrupted):
        run_ifcl.main([*args, "--max_steps", "2", "--save_steps", "1", "--eval_steps", "1"])
    checkpoint = tmp_path / "run" / "checkpoint-1"
    other = tmp_path / "other_fraternal"
    shutil.copytree(tiny_fraternal_dir, other)
    monkeypatch.setattr(run_ifcl, "load_training_text", lambda *a: pytest.fail("data read before the check"))
    for fraternal, now in ((other, "'other_fraternal'"), (None, "None")):
        resumed = objective_run_args(tiny_encoder_dir, pairs_data, tmp_path / "run", "ifcl", fraternal=fraternal)
        expected = f"--fraternal_model_name_or_path: '{tiny_fraternal_dir.name}' in the checkpoint, {now} now"
        with pytest.raises(CheckpointError, match=re.escape(expected)):
            run_ifcl.main([*resumed, "--max_steps", "2", "--resume_from_checkpoint", str(checkpoint)])


def test_resume_with_other_data_names_each_difference_before_any_model_loads(runs, tmp_path, monkeypatch):
    """A memory-mapped resume reads on in the rest of an epoch whose order --seed and --data_seed drew, from the same
    file: another seed, another --train_file or the file rewritten since is named in one line, before any data is
    read; the same data resumes."""
    folder, args = copy_of_stopped_run(runs, tmp_path)
    checkpoint = folder / "checkpoint-2"
    train_file = Path(args[args.index("--train_file") + 1])
    other = tmp_path / "other.txt"
    shutil.copy(train_file, other)
    resume = ["--resume_from_checkpoint", str(checkpoint)]
    monkeypatch.setattr(run_ifcl, "load_training_text", lambda *a: pytest.fail("data read before the check"))
    with pytest.raises(CheckpointError) as error:
        run_ifcl.main([*args, "--seed", "7", "--data_seed", "3", *resume])
    message = str(error.value)
    assert "--seed 42 in the checkpoint, 7 now; --data_seed None in the checkpoint, 3 now" in message
    assert "\n" not in message and "--train_file" not in message
    with pytest.raises(CheckpointError) as error:
        run_ifcl.main([*args, "--train_file", str(other), *resume])
    assert f"{other} is read now but was not then" in str(error.value)
    assert f"{train_file} is not read now" in str(error.value)
    rewritten = tmp_path / "rewritten"
    shutil.copytree(train_file.parent, rewritten)
    moved = [str(rewritten / train_file.name) if arg == str(train_file) else arg for arg in args]
    with pytest.raises(CheckpointError, match="is read now but was not then"):  # the same content elsewhere
        run_ifcl.main([*moved, *resume])
    # The file as the checkpoint saw it, before a line was added (the shared file itself stays as it is).
    recorded = checkpoint / "ifcl_training_data.json"
    record = json.loads(recorded.read_text(encoding="utf-8"))
    size = record["files"][str(train_file)]["size"]
    record["files"][str(train_file)] = {"size": size - 30, "ends_sha256": "0" * 64}
    recorded.write_text(json.dumps(record), encoding="utf-8")
    with pytest.raises(
        CheckpointError, match=re.escape(f"{train_file} has changed since ({size - 30} bytes then, {size} now)")
    ):
        run_ifcl.main([*args, *resume])


def test_a_memory_mapped_checkpoint_resumed_with_streaming_is_told_to_resume_without_it(runs, tmp_path):
    folder, args = copy_of_stopped_run(runs, tmp_path)
    for resume in ("last", str(folder / "checkpoint-2")):
        with pytest.raises(CheckpointError, match="was trained without --streaming .*: resume it without --streaming"):
            run_ifcl.main([*args, "--streaming", "--resume_from_checkpoint", resume])


@pytest.mark.parametrize(
    "name", ["trainer_state.json", "config.json", "model.safetensors", "optimizer.pt", "rng_state.pth"]
)
def test_resume_from_a_broken_checkpoint_names_the_file(runs, tmp_path, name):
    folder, args = copy_of_stopped_run(runs, tmp_path)
    checkpoint = folder / "checkpoint-2"
    if name == "rng_state.pth":
        (checkpoint / name).unlink()  # without it the resumed steps would draw other dropout masks
        expected = f"{checkpoint / name} is missing"
    else:
        data = (checkpoint / name).read_bytes()
        (checkpoint / name).write_bytes(data[: len(data) // 2])  # cut short, as by a full disk or a kill
        expected = f"{checkpoint / name} (is not valid JSON|cannot be read|is cut)"
    with pytest.raises(CheckpointError, match=expected):
        run_ifcl.main([*args, "--resume_from_checkpoint", str(checkpoint)])
    with pytest.raises(CheckpointError, match="no checkpoint of .* can be resumed from"):
        run_ifcl.main([*args, "--resume_from_checkpoint", "last"])


@pytest.mark.parametrize("content", ["[]", "{}", '{"global_step": 2, "max_st'], ids=["array", "empty", "cut"])
def test_resume_last_from_a_damaged_trainer_state_is_one_line_before_any_model_loads(tmp_path, capsys, content):
    """A checkpoint whose ``trainer_state.json`` is ``[]``, ``{}`` or cut short used to trace back (or resume from step
    0): ``--resume_from_checkpoint last`` names it with the way on, exit code 2, before anything loads."""
    folder = tmp_path / "run"
    checkpoint = folder / "checkpoint-50"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(content)
    (checkpoint / "config.json").write_text("{}")
    write_record(folder, ["checkpoint-50"], finished=False)
    args = [
        "--model_name_or_path",
        "owner/not-loaded",
        "--output_dir",
        str(folder),
        "--resume_from_checkpoint",
        "last",
    ]
    with pytest.raises(SystemExit) as exit_info:
        run_command("run_ifcl.py", lambda: run_ifcl.main(args))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("run_ifcl.py: error: ") == 1 and "Traceback" not in err
    line = next(line for line in err.splitlines() if line.startswith("run_ifcl.py: error: "))
    damage = "is not valid JSON" if content.startswith('{"') else "is damaged"
    assert f"{checkpoint / 'trainer_state.json'} {damage}" in line and "--overwrite_output_dir" in line


def test_resume_trains_exactly_like_an_uninterrupted_run(runs, tmp_path):
    _, _, whole_metrics = runs["whole"]
    folder, args = copy_of_stopped_run(runs, tmp_path)
    trainer, metrics = run_ifcl.main([*args, "--resume_from_checkpoint", "last"])
    assert trainer.state.global_step == 4
    assert metrics["test_stsb_spearman"] == pytest.approx(whole_metrics["test_stsb_spearman"], abs=1e-9)
    whole_folder = runs["whole"][0]
    whole_losses = {
        entry["step"]: entry["loss"]
        for entry in json.loads((whole_folder / "trainer_state.json").read_text())["log_history"]
        if "loss" in entry
    }
    assert losses_by_step(trainer) == pytest.approx(whole_losses, rel=1e-6) and 4 in whole_losses
    assert record(folder).finished and "checkpoint-2" in record(folder).written
    with pytest.raises(OutputFolderError, match="is finished"):  # nothing left to resume
        run_ifcl.main([*args, "--resume_from_checkpoint", "last"])


def run_totals(checkpoint) -> dict:
    """The totals of the run up to ``checkpoint``, as its trainer_state.json keeps them."""
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return state["stateful_callbacks"]["RunTotalsCallback"]["args"]


@pytest.mark.parametrize("restore", [[], ["--restore_callback_states_from_checkpoint"]], ids=["", "restored"])
def test_a_resumed_run_reports_the_loss_and_times_of_the_whole_run(runs, tmp_path, restore):
    """train_results.json and all_results.json of a run resumed in the middle of training describe the whole run: the
    loss over all its steps (the uninterrupted run's), and its times summed over its two sessions, the first counted
    up to the checkpoint the second resumed from (also where the Trainer restores callbacks from the checkpoint)."""
    whole_folder, _, whole_metrics = runs["whole"]
    folder, args = copy_of_stopped_run(runs, tmp_path)
    first_session = run_totals(folder / "checkpoint-2")
    assert first_session["steps"] == 2 and first_session["sessions"] == 1 and first_session["seconds"] > 0
    trainer, _ = run_ifcl.main([*args, "--resume_from_checkpoint", "last", *restore])
    second_session = next(entry for entry in trainer.state.log_history if "train_runtime" in entry)  # the Trainer's
    assert second_session["train_loss"] != pytest.approx(whole_metrics["train_loss"], abs=1e-6)  # steps 3 and 4 only
    whole_run = json.loads((whole_folder / "train_results.json").read_text())
    for name in ("train_results.json", "all_results.json"):
        written = json.loads((folder / name).read_text())
        assert written["train_loss"] == pytest.approx(whole_metrics["train_loss"], abs=1e-9), name
        assert written["train_steps"] == 4 and written["train_sessions"] == 2, name
        runtime = first_session["seconds"] + second_session["train_runtime"]
        assert written["train_runtime"] == pytest.approx(runtime, abs=1e-3), name
        assert written["train_seconds_per_step"] == pytest.approx(written["train_runtime"] / 4, abs=1e-4), name
        assert written["train_steps_per_second"] == pytest.approx(4 / written["train_runtime"], rel=1e-2), name
        assert written["train_cpu_seconds"] > first_session["cpu_seconds"], name
        spent = written["train_cpu_seconds"] - written["train_evaluation_cpu_seconds"]
        assert written["train_cpu_seconds_per_step"] == pytest.approx(spent / 4), name
        assert set(whole_run) <= set(written), name
    assert whole_run["train_sessions"] == 1
    card = (folder / "README.md").read_text()  # the card's training time is the whole run's too
    assert f"- **Total**: {written['train_runtime']:.1f} seconds" in card


def test_a_checkpoint_without_totals_is_resumed_and_the_figures_say_they_are_the_sessions(runs, tmp_path, caplog):
    """A checkpoint saved before checkpoints kept the run's totals: resuming from it works (the Trainer saves the
    next checkpoint), and a warning says that the loss and times count the resumed session's steps only."""
    folder, args = copy_of_stopped_run(runs, tmp_path)
    state_file = folder / "checkpoint-2" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    del state["stateful_callbacks"]["RunTotalsCallback"]
    state_file.write_text(json.dumps(state))
    with caplog.at_level("WARNING"):
        trainer, _ = run_ifcl.main([*args, "--resume_from_checkpoint", "last"])
    assert any("keeps no totals" in message and "2 steps only" in message for message in caplog.messages)
    session = next(entry for entry in trainer.state.log_history if "train_runtime" in entry)
    logged = [(entry["step"], entry["loss"]) for entry in trainer.state.log_history if "loss" in entry]
    logged = [(step, loss) for step, loss in logged if step > 2]  # this session's logs, each the mean since the last
    session_loss = sum(loss * (step - before) for (step, loss), before in zip(logged, [2] + [s for s, _ in logged]))
    written = json.loads((folder / "train_results.json").read_text())
    assert written["train_steps"] == 4 and "train_sessions" not in written
    assert logged[-1][0] == 4 and written["train_loss"] == pytest.approx(session_loss / 2, abs=1e-9)
    assert written["train_seconds_per_step"] == pytest.approx(session["train_runtime"] / 2, abs=1e-4)


def test_last_skips_a_broken_newer_checkpoint_and_names_it(runs, tmp_path, caplog):
    folder, args = copy_of_stopped_run(runs, tmp_path)
    broken = folder / "checkpoint-3"  # a save cut short by a kill: its weights half written
    shutil.copytree(folder / "checkpoint-2", broken)
    state = json.loads((broken / "trainer_state.json").read_text())
    (broken / "trainer_state.json").write_text(json.dumps({**state, "global_step": 3}))
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 3])
    with caplog.at_level("WARNING"):
        trainer, _ = run_ifcl.main([*args, "--resume_from_checkpoint", "last"])
    assert trainer.state.global_step == 4
    assert any("checkpoint-3" in message and "model.safetensors" in message for message in caplog.messages)


def test_a_checkpoint_with_nan_weights_is_not_resumed_from(runs, tmp_path):
    folder, args = copy_of_stopped_run(runs, tmp_path)
    weights = folder / "checkpoint-2" / "model.safetensors"
    tensors = load_file(str(weights))
    name = next(n for n, t in tensors.items() if t.is_floating_point())
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    save_file(tensors, str(weights), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=f"NaN or infinite values \\({name}"):
        run_ifcl.main([*args, "--resume_from_checkpoint", "last"])


def test_a_run_stopped_after_training_finishes_its_results_without_a_step(
    tiny_encoder_dir, english_sts_data, tmp_path, monkeypatch
):
    from trainer_ifcl import IFCLTrainer

    args = [
        *objective_run_args(tiny_encoder_dir, english_sts_data, tmp_path / "whole", "simcse"),
        "--save_total_limit",
        "3",
    ]
    _, whole_metrics = run_ifcl.main(args)
    evaluate = IFCLTrainer.evaluate

    def stop_in_the_final_test(self, *a, **kwargs):
        if kwargs.get("metric_key_prefix") == "test":
            raise KeyboardInterrupt  # Ctrl-C during the last evaluation
        return evaluate(self, *a, **kwargs)

    monkeypatch.setattr(IFCLTrainer, "evaluate", stop_in_the_final_test)
    folder = tmp_path / "run"
    stopped_args = [str(folder) if a == str(tmp_path / "whole") else a for a in args]
    with pytest.raises(Interrupted):
        run_ifcl.main(stopped_args)
    assert (folder / "model.safetensors").exists()  # the weights were saved ...
    assert not (folder / "all_results.json").exists()  # ... but no results file says the run finished
    assert (folder / RUN_IN_PROGRESS_FILE).exists()
    with pytest.raises(ValueError, match="unfinished training run"):
        evaluate_sts.parse_arguments(["--model_name_or_path", str(folder)])
    monkeypatch.undo()
    trained = []
    monkeypatch.setattr(IFCLTrainer, "training_step", lambda *a, **k: trained.append(1) or pytest.fail("trained"))
    trainer, metrics = run_ifcl.main([*stopped_args, "--resume_from_checkpoint", "last"])
    assert not trained and trainer.state.global_step == 4
    assert metrics["test_stsb_spearman"] == pytest.approx(whole_metrics["test_stsb_spearman"], abs=1e-9)
    assert metrics["eval_stsb_spearman"] == pytest.approx(whole_metrics["eval_stsb_spearman"], abs=1e-9)
    assert record(folder).finished and (folder / "README.md").exists()
    for name in ("train_results.json", "all_results.json"):  # the training's own figures are kept
        written = json.loads((folder / name).read_text())
        assert written["train_loss"] == pytest.approx(whole_metrics["train_loss"], abs=1e-9), name


def test_a_run_stopped_while_publishing_finishes_with_the_whole_runs_train_figures(runs, tmp_path, monkeypatch):
    """Stopped while it saves the published model, before any results file: the resumed run finishes without a step,
    and its results hold what an uninterrupted run's do, the loss and times of its training from the totals its last
    checkpoint keeps, not only its steps."""
    from trainer_ifcl import IFCLTrainer

    whole_folder, whole_args, whole_metrics = runs["whole"]
    folder = tmp_path / "run"
    args = [*[str(folder) if a == str(whole_folder) else a for a in whole_args], "--save_total_limit", "3"]
    save_model = IFCLTrainer.save_model

    def stop_while_publishing(self, output_dir=None, _internal_call=False):
        if not _internal_call:  # the published model, once training has ended (checkpoints are internal calls)
            raise KeyboardInterrupt
        return save_model(self, output_dir, _internal_call)

    monkeypatch.setattr(IFCLTrainer, "save_model", stop_while_publishing)
    with pytest.raises(Interrupted):
        run_ifcl.main(args)
    assert not (folder / "train_results.json").exists() and not (folder / "model.safetensors").exists()
    last = run_totals(folder / "checkpoint-4")
    monkeypatch.undo()
    monkeypatch.setattr(IFCLTrainer, "training_step", lambda *a, **k: pytest.fail("trained a step"))
    trainer, metrics = run_ifcl.main([*args, "--resume_from_checkpoint", "last"])
    assert trainer.state.global_step == 4 and record(folder).finished
    assert metrics["test_stsb_spearman"] == pytest.approx(whole_metrics["test_stsb_spearman"], abs=1e-9)
    whole_run = json.loads((whole_folder / "train_results.json").read_text())
    for name in ("train_results.json", "all_results.json"):
        written = json.loads((folder / name).read_text())
        assert set(whole_run) <= set(written), name
        assert written["train_loss"] == pytest.approx(whole_metrics["train_loss"], abs=1e-9), name
        assert written["train_runtime"] == pytest.approx(last["seconds"], abs=1e-4), name
        assert written["train_cpu_seconds"] == last["cpu_seconds"] > 0, name
        assert written["train_steps"] == 4 and written["train_sessions"] == 1, name
        assert written["train_samples"] == whole_run["train_samples"], name
    assert "### Training Time" in (folder / "README.md").read_text()


# ---------------------------------------------------------------- failures once the run has begun


def test_a_full_disk_during_a_checkpoint_ends_in_one_line_and_resume_takes_the_last_complete_one(
    tiny_encoder_dir, english_sts_data, tmp_path, monkeypatch, capsys
):
    import transformers.modeling_utils

    real_save = transformers.modeling_utils.safe_save_file

    def disk_full_at_checkpoint_4(tensors, filename, *args, **kwargs):
        if "checkpoint-4" in str(filename):
            from safetensors import SafetensorError

            raise SafetensorError(
                'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
            )
        return real_save(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", disk_full_at_checkpoint_4)
    folder = tmp_path / "run"
    args = objective_run_args(tiny_encoder_dir, english_sts_data, folder, "simcse")
    monkeypatch.setattr("sys.argv", ["run_ifcl.py", *args])
    with pytest.raises(SystemExit) as exit_code:
        run_command("run_ifcl.py", run_ifcl.main)
    assert exit_code.value.code == 1
    error = capsys.readouterr().err
    assert "Traceback" not in error and "run_ifcl.py: error: writing into" in error and "at step 4" in error
    assert "No space left on device" in error and "--resume_from_checkpoint last" in error
    assert (folder / RUN_IN_PROGRESS_FILE).exists()
    monkeypatch.undo()
    trainer, _ = run_ifcl.main([*args, "--resume_from_checkpoint", "last"])  # checkpoint-4 is broken: from 2
    assert trainer.state.global_step == 4 and record(folder).finished


def test_a_full_disk_after_training_ends_with_exit_code_1(tiny_encoder_dir, english_sts_data, tmp_path, monkeypatch):
    """The results and the card are written once training has finished: a failure there is the run's (exit code 1),
    not bad input (2), and the run is not marked finished."""
    import errno

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_ifcl, "write_card_and_curves", disk_full)
    folder = tmp_path / "run"
    monkeypatch.setattr(
        "sys.argv", ["run_ifcl.py", *objective_run_args(tiny_encoder_dir, english_sts_data, folder, "simcse")]
    )
    with pytest.raises(SystemExit) as exit_code:
        run_command("run_ifcl.py", run_ifcl.main)
    assert exit_code.value.code == 1
    assert (folder / RUN_IN_PROGRESS_FILE).exists() and not record(folder).finished


@pytest.mark.parametrize(
    "source, objective, data",
    [("tiny_encoder_dir", "simcse", "english_sts_data"), ("published_dir", "ifcl", "pairs_data")],
    ids=["plain encoder", "IFCL model continued"],
)
def test_nan_in_the_weights_to_train_from_is_named_before_training(source, objective, data, request, tmp_path):
    broken = tmp_path / "broken-encoder"
    shutil.copytree(request.getfixturevalue(source), broken)
    tensors = load_file(str(broken / "model.safetensors"))
    name = sorted(n for n in tensors if "encoder.layer.0" in n and n.endswith("weight"))[0]
    tensors[name].view(-1)[0] = float("nan")
    save_file(tensors, str(broken / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="weights hold NaN or infinite values"):
        run_ifcl.main(objective_run_args(broken, request.getfixturevalue(data), tmp_path / "run", objective))
    assert not (tmp_path / "run").exists()
