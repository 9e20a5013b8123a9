"""The output folder is guarded: a finished or unfinished run is never overwritten without being asked, results
files hold this run's own figures, and a run in progress is marked until its results are written."""

from __future__ import annotations

import json

import pytest
from conftest import objective_run_args

import evaluate_sts
import run_ifcl


def test_a_second_run_into_a_finished_folder_is_refused_before_any_model_loads(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "all_results.json").write_text('{"test_stsb_spearman": 80.0}')
    (folder / "checkpoint-50").mkdir()
    with pytest.raises(run_ifcl.OutputFolderError) as error:
        run_ifcl.run(["--model_name_or_path", "owner/not-loaded", "--output_dir", str(folder)])
    message = str(error.value)
    assert str(folder) in message and "all_results.json" in message and "checkpoint-50" in message
    assert "--resume_from_checkpoint last" in message and "--overwrite_output_dir" in message
    assert json.loads((folder / "all_results.json").read_text()) == {"test_stsb_spearman": 80.0}  # untouched


def test_resume_last_needs_a_checkpoint_and_names_the_folder(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    with pytest.raises(run_ifcl.OutputFolderError, match="holds no checkpoint"):
        run_ifcl.run(["--resume_from_checkpoint", "last", "--output_dir", str(folder)])
    (folder / "checkpoint-3").mkdir()  # no trainer_state.json: a truncated checkpoint
    with pytest.raises(run_ifcl.OutputFolderError, match="checkpoint-3: not a checkpoint folder"):
        run_ifcl.run(["--resume_from_checkpoint", "True", "--output_dir", str(folder)])


def test_overwrite_replaces_the_run_and_results_are_this_runs_own(tiny_encoder_dir, english_sts_data, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "all_results.json").write_text('{"stale_figure": 1.0}')
    (folder / "checkpoint-99").mkdir()
    args = objective_run_args(tiny_encoder_dir, english_sts_data, folder, "simcse")
    with pytest.raises(run_ifcl.OutputFolderError):
        run_ifcl.run(args)
    _, metrics = run_ifcl.run([*args, "--overwrite_output_dir"])
    written = json.loads((folder / "all_results.json").read_text())
    assert "stale_figure" not in written and not (folder / "checkpoint-99").exists()
    assert written["test_stsb_spearman"] == pytest.approx(metrics["test_stsb_spearman"])
    assert not (folder / run_ifcl.RUN_IN_PROGRESS_FILE).exists()  # finished: the marker is gone
    assert not list(folder.glob("*.tmp-*"))


def test_an_unfinished_run_is_marked_and_evaluate_sts_refuses_it(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / run_ifcl.RUN_IN_PROGRESS_FILE).write_text("{}")
    with pytest.raises(ValueError, match="unfinished training run"):
        evaluate_sts.parse_arguments(["--model_name_or_path", str(folder)])
    with pytest.raises(run_ifcl.OutputFolderError, match="already holds a run"):
        run_ifcl.run(["--output_dir", str(folder)])


def test_unwritable_output_folder_is_found_before_training(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(run_ifcl.OutputFolderError, match="cannot be written"):
        run_ifcl.run(["--output_dir", str(blocker / "run")])


def test_results_with_nan_stay_valid_json(tmp_path):
    run_ifcl.write_json_atomically(str(tmp_path / "r.json"), {"eval_spearman": float("nan"), "ok": 1.5})
    assert json.loads((tmp_path / "r.json").read_text()) == {"eval_spearman": None, "ok": 1.5}


@pytest.fixture(scope="module")
def finished_simcse_run(tiny_encoder_dir, english_sts_data, tmp_path_factory):
    folder = tmp_path_factory.mktemp("resume") / "run"
    args = objective_run_args(tiny_encoder_dir, english_sts_data, folder, "simcse")
    run_ifcl.run(args)
    return folder, args


def test_resume_with_other_settings_names_each_of_them_before_any_model_loads(finished_simcse_run, monkeypatch):
    folder, args = finished_simcse_run
    checkpoint = folder / "checkpoint-2"
    monkeypatch.setattr(run_ifcl, "load_training_text", lambda *a: pytest.fail("data read before the check"))
    changed = [
        "--temperature",
        "0.1",
        "--per_device_train_batch_size",
        "2",
        "--resume_from_checkpoint",
        str(checkpoint),
    ]
    with pytest.raises(run_ifcl.OutputFolderError) as error:
        run_ifcl.run([*args, *changed])
    message = str(error.value)
    assert str(checkpoint) in message
    assert "--temperature: 0.05 in the checkpoint, 0.1 now" in message
    assert "global batch" in message and "4 in the checkpoint, 2 now" in message
    assert "--fusion_rate" not in message  # only what differs is named
    with pytest.raises(run_ifcl.OutputFolderError, match="--objective: 'simcse' in the checkpoint, 'ifcl' now"):
        run_ifcl.run([*[a for a in args if a != "simcse" and a != "--objective"], "--resume_from_checkpoint", "last"])


@pytest.mark.parametrize("name", ["trainer_state.json", "config.json", "model.safetensors", "optimizer.pt"])
def test_resume_from_a_broken_checkpoint_names_the_file(finished_simcse_run, tmp_path, name):
    import shutil

    folder, args = finished_simcse_run
    checkpoint = tmp_path / "checkpoint-2"
    shutil.copytree(folder / "checkpoint-2", checkpoint)
    data = (checkpoint / name).read_bytes()
    (checkpoint / name).write_bytes(data[: len(data) // 2])  # cut short, as by a full disk or a kill
    run_ifcl.check_checkpoint_files(str(folder / "checkpoint-2"))  # the original is fine
    with pytest.raises(
        run_ifcl.OutputFolderError, match=f"{checkpoint / name} (is not valid JSON|cannot be read|is cut)"
    ):
        run_ifcl.run([*args, "--resume_from_checkpoint", str(checkpoint)])


def test_resume_with_the_same_settings_goes_on(finished_simcse_run):
    folder, args = finished_simcse_run
    trainer, metrics = run_ifcl.run([*args, "--resume_from_checkpoint", str(folder / "checkpoint-2")])
    assert trainer.state.global_step == 4 and "test_stsb_spearman" in metrics


def test_a_run_that_fails_in_its_final_test_evaluation_does_not_look_finished(
    tiny_encoder_dir, english_sts_data, tmp_path, monkeypatch
):
    from trainer_ifcl import IFCLTrainer

    evaluate = IFCLTrainer.evaluate

    def fail_on_the_final_test(self, *args, **kwargs):
        if kwargs.get("metric_key_prefix") == "test":
            raise KeyboardInterrupt  # Ctrl-C during the last evaluation
        return evaluate(self, *args, **kwargs)

    monkeypatch.setattr(IFCLTrainer, "evaluate", fail_on_the_final_test)
    folder = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_ifcl.run(objective_run_args(tiny_encoder_dir, english_sts_data, folder, "simcse"))
    assert (folder / "model.safetensors").exists()  # the weights were saved ...
    assert not (folder / "all_results.json").exists()  # ... but no results file says the run finished
    assert (folder / run_ifcl.RUN_IN_PROGRESS_FILE).exists()
    with pytest.raises(ValueError, match="unfinished training run"):
        evaluate_sts.parse_arguments(["--model_name_or_path", str(folder)])
