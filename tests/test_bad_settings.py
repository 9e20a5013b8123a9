"""Bad settings and data stop ``run_ifcl.py``, ``evaluate_sts.py`` and ``prepare_fraternal.py`` before any model
loads, with exit code 2, no traceback, and a message ``<script>: error: ...`` that names the culprit."""

from __future__ import annotations

import json
import re
import shutil
from types import SimpleNamespace

import pytest
from conftest import ENGLISH, GERMAN, cpu_training_args, launch, run_script, write_sts_file

from ifcl.arguments import check_choice, check_within


@pytest.fixture(scope="module")
def files(tmp_path_factory, published_dir, tiny_encoder_dir):
    folder = tmp_path_factory.mktemp("bad")
    lines = [f"{e}\t{d}\n" for e, d in zip(ENGLISH, GERMAN)] * 3  # 36 pairs
    (folder / "train.txt").write_text("".join(lines), encoding="utf-8")
    write_sts_file(folder / "sts.tsv")
    (folder / "constant.tsv").write_text("sentence1\tsentence2\tscore\nA.\tB.\t3\nC.\tD.\t3\n", encoding="utf-8")
    (folder / "one_row.tsv").write_text("sentence1\tsentence2\tscore\nA.\tB.\t3\n", encoding="utf-8")
    (folder / "sentences.txt").write_text("".join(f"{e}\n" for e in ENGLISH), encoding="utf-8")
    (folder / "args.json").write_text('{"learning_rate": 1e-5,', encoding="utf-8")
    (folder / "good_args.json").write_text(json.dumps({"objective": "simcse", "queue_size": 2}), encoding="utf-8")
    # A saved IFCL model whose weights file was cut short (a full disk, an interrupted copy).
    shutil.copytree(published_dir, folder / "cut_model")
    weights = folder / "cut_model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    # Models whose tokenizer files were deleted (an IFCL model, a plain encoder), and one whose tokenizer.json is cut.
    for name, source in (("no_tokenizer", published_dir), ("plain_no_tokenizer", tiny_encoder_dir)):
        shutil.copytree(source, folder / name)
        for tokenizer_file in ("tokenizer.json", "tokenizer_config.json"):
            (folder / name / tokenizer_file).unlink()
    (folder / "empty").mkdir()  # a folder that holds no model, and one that holds other files
    (folder / "not_a_model").mkdir()
    (folder / "not_a_model" / "notes.txt").write_text("my notes", encoding="utf-8")
    shutil.copytree(published_dir, folder / "cut_tokenizer")
    tokenizer = folder / "cut_tokenizer" / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text(encoding="utf-8")[:100], encoding="utf-8")
    return folder


# The data's size is checked where the run is prepared (Objective.prepare), once the model is loaded.
CHECKED_ONCE_THE_MODEL_IS_LOADED = ("fewer than one global batch", "--lora_target_modules valeu: no")
CASES = [
    # (script, extra arguments ({files} is filled in), what the message must name)
    ("run_ifcl.py", ["--temperature", "nan"], "temperature"),
    ("run_ifcl.py", ["--temperature", "inf"], "temperature"),
    ("run_ifcl.py", ["--forgetting_rate", "nan"], "forgetting_rate"),
    ("run_ifcl.py", ["--fusion_rate", "1.5"], "fusion_rate"),
    ("run_ifcl.py", ["--per_device_train_batch_size", "0"], "--per_device_train_batch_size"),
    ("run_ifcl.py", ["--max_train_samples", "0"], "--max_train_samples"),
    ("run_ifcl.py", ["--max_seq_length", "4096"], "--max_seq_length"),
    ("run_ifcl.py", ["--objective", "conisi", "--max_seq_length", "100"], "ConIsI's sentence pairs"),
    ("run_ifcl.py", ["--objective", "simcse", "--pcl_beta", "2"], "--pcl_beta (--objective pcl)"),
    ("run_ifcl.py", ["--per_device_train_batch_size", "48"], "fewer than one global batch"),
    ("run_ifcl.py", ["--validation_file", "{files}/constant.tsv"], "constant.tsv"),
    ("run_ifcl.py", ["--validation_file", "{files}/one_row.tsv"], "one_row.tsv"),
    ("run_ifcl.py", ["--model_name_or_path", "./no/such/model"], "./no/such/model"),
    ("run_ifcl.py", ["--resume_from_checkpoint", "last"], "holds no checkpoint"),
    ("run_ifcl.py", ["--sts_score_range", "5", "0"], "--sts_score_range"),
    ("run_ifcl.py", ["--max_steps", "0"], "--max_steps 0 trains no step"),
    ("run_ifcl.py", ["--max_seq_length", "2"], "adds 2 special token(s)"),
    ("run_ifcl.py", ["--dataset_name", "owner/sentences"], "give one source of training text"),
    ("run_ifcl.py", ["--report_to", "clearml"], "--report_to clearml: its package is not installed"),
    ("run_ifcl.py", ["--report_to", "no_such_logger"], "not a logger the Trainer knows"),
    ("run_ifcl.py", ["--dataloader_num_workers", "-1"], "--dataloader_num_workers must be ≥ 0"),
    ("run_ifcl.py", ["--model_name_or_path", "{files}/cut_model"], "cut_model/model.safetensors cannot be read"),
    ("run_ifcl.py", ["--model_name_or_path", "{files}/no_tokenizer"], "no_tokenizer holds no tokenizer files"),
    ("run_ifcl.py", ["--model_name_or_path", "{files}/plain_no_tokenizer"], "plain_no_tokenizer holds no tokenizer"),
    ("run_ifcl.py", ["--model_name_or_path", "{files}/cut_tokenizer"], "cut_tokenizer/tokenizer.json is not valid"),
    ("run_ifcl.py", ["--model_name_or_path", "{files}/empty"], "empty: the folder holds no model (no config.json; it"),
    ("run_ifcl.py", ["--model_name_or_path", "{files}/not_a_model"], "holds no model (no config.json; it holds notes"),
    ("run_ifcl.py", ["--training_dropout", "0.2"], "--training_dropout 0.2: "),
    ("run_ifcl.py", ["--lora_dropout", "0.1"], "--lora_dropout given without --lora_r"),
    ("run_ifcl.py", ["--lora_r", "4", "--lora_alpha", "inf"], "--lora_alpha must be a finite number > 0, got inf"),
    ("run_ifcl.py", ["--lora_r", "2.5"], "argument --lora_r/--lora-r: invalid int value: '2.5'"),
    ("run_ifcl.py", ["--lora_r", "4", "--lora_target_modules", "query", "valeu"], "--lora_target_modules valeu: no"),
    ("run_ifcl.py", ["--objective", "pcl", "--pcl_untied_peer", "--lora_r", "4"], "--pcl_untied_peer with --lora_r"),
    ("run_ifcl.py", ["--objective", "conisi", "--matryoshka_dims", "16"], "--matryoshka_dims with --objective conisi"),
    ("run_ifcl.py", ["--cache_mini_batch_size", "8"], "--cache_mini_batch_size 8 must lie between 1 and the"),
    ("evaluate_sts.py", ["--model_name_or_path", "{files}/no_tokenizer"], "no_tokenizer holds no tokenizer files"),
    ("evaluate_sts.py", ["--model_name_or_path", "{files}/plain_no_tokenizer"], "plain_no_tokenizer holds no"),
    (
        "evaluate_sts.py",
        ["--model_name_or_path", "{files}/cut_tokenizer"],
        "cut_tokenizer/tokenizer.json is not valid",
    ),
    ("evaluate_sts.py", ["--model_name_or_path", "{files}/empty"], "empty: the folder holds no model"),
    ("evaluate_sts.py", ["--batch_size", "0"], "--batch_size"),
    ("evaluate_sts.py", ["--model_name_or_path", "./no/such/model"], "./no/such/model"),
    ("evaluate_sts.py", ["--tasks", "{files}/constant.tsv"], "constant.tsv"),
    ("evaluate_sts.py", ["--tasks", "{files}/missing.tsv"], "missing.tsv"),
    ("evaluate_sts.py", ["--mutual_information", "{files}/train.txt", "--mi_batch_size", "1"], "--mi_batch_size"),
    ("prepare_fraternal.py", ["--batch_size", "0"], "--batch_size"),
    ("prepare_fraternal.py", ["--output_file", "{files}/pairs.tsv"], "must end in .txt"),
    ("prepare_fraternal.py", ["--input_file", "{files}/missing.txt"], "missing.txt"),
    ("prepare_fraternal.py", ["--model_name_or_path", "./no/such/model"], "./no/such/model"),
    ("prepare_fraternal.py", ["--max_length", "129"], "--max_length 129: more than the 128 positions"),
    ("prepare_fraternal.py", ["--device", "cuda:99"], "--device cuda:99: not on this machine"),
    ("prepare_fraternal.py", ["--device", "gpu"], "--device gpu: not a device name torch understands"),
]


def base_arguments(script: str, files, tiny_encoder_dir, tmp_path) -> list[str]:
    """Arguments that work for ``script``; a case's own arguments come after them and win."""
    if script == "run_ifcl.py":
        return [
            "--model_name_or_path",
            str(tiny_encoder_dir),
            "--train_file",
            str(files / "train.txt"),
            "--validation_file",
            str(files / "sts.tsv"),
            "--test_file",
            str(files / "sts.tsv"),
            "--output_dir",
            str(tmp_path / "out"),
            "--max_seq_length",
            "16",
            "--per_device_train_batch_size",
            "4",
            "--use_cpu",
        ]
    if script == "evaluate_sts.py":
        return [
            "--model_name_or_path",
            str(tiny_encoder_dir),
            "--tasks",
            str(files / "sts.tsv"),
            "--output_dir",
            str(tmp_path / "out"),
        ]
    return [
        "--input_file",
        str(files / "sentences.txt"),
        "--output_file",
        str(tmp_path / "out" / "pairs.txt"),
        "--model_name_or_path",
        str(tiny_encoder_dir),
    ]


def script_main(script: str):
    """The function each script's command line runs (``ifcl.failures.run_command`` turns its errors into exit codes)."""
    if script == "run_ifcl.py":
        import run_ifcl

        return run_ifcl.main
    if script == "evaluate_sts.py":
        from ifcl.sts.command import main

        return main
    from ifcl.translation import run

    return run


@pytest.mark.parametrize("script, extra, named", CASES, ids=[f"{c[0]} {' '.join(c[1])}" for c in CASES])
def test_bad_setting_stops_with_a_message_naming_it(files, tiny_encoder_dir, tmp_path, script, extra, named, capsys):
    """In this process (the scripts' entries are tested as commands below): exit code 2, one line naming it."""
    from ifcl.failures import run_command

    base = base_arguments(script, files, tiny_encoder_dir, tmp_path)
    argv = [*base, *(a.replace("{files}", str(files)) for a in extra)]
    with pytest.raises(SystemExit) as exit_info:
        run_command(script, lambda: script_main(script)(argv))
    error = capsys.readouterr().err
    assert exit_info.value.code == 2, error[-2000:]
    assert "Traceback" not in error and named in error, error[-2000:]
    if named in CHECKED_ONCE_THE_MODEL_IS_LOADED:  # Objective.prepare checks the data: after the weights' progress bar
        error = error.splitlines()[-1]
    assert error.startswith(f"{script}: error:") and error.count("\n") <= 1
    assert not (tmp_path / "out").exists()  # nothing written


@pytest.mark.slow
@pytest.mark.parametrize(
    "script, extra, named",
    [CASES[0], CASES[-12], CASES[-1]],
    ids=["run_ifcl.py", "evaluate_sts.py", "prepare_fraternal.py"],
)
def test_the_commands_end_with_one_line_and_exit_code_2(files, tiny_encoder_dir, tmp_path, script, extra, named):
    base = base_arguments(script, files, tiny_encoder_dir, tmp_path)
    result = run_script(script, *base, *(a.replace("{files}", str(files)) for a in extra), cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and named in result.stderr, result.stderr[-2000:]
    assert result.stderr.startswith(f"{script}: error:")
    assert not (tmp_path / "out").exists()


def test_each_process_under_torchrun_gives_its_error_line_to_torchruns_report(tmp_path, monkeypatch, capsys):
    """A process torchrun started (it sets TORCHELASTIC_ERROR_FILE) writes its one line where torch's failure report
    reads it, the process that does not print it too."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from ifcl.failures import RunFailure, run_command

    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.setenv("LOCAL_RANK", "1")  # not the machine's first process: it prints nothing
    for error, code in ((ValueError("--cache_mini_batch_size 2: refused"), 2), (RunFailure("disk full"), 1)):

        def fail(error=error):
            raise error

        with pytest.raises(SystemExit) as stop:
            run_command("run_ifcl.py", fail)
        assert stop.value.code == code and capsys.readouterr().err == ""
        failure = ProcessFailure(local_rank=1, pid=1, exitcode=code, error_file=str(error_file))
        assert failure.message == f"run_ifcl.py: error: {error}"


@pytest.mark.slow
def test_a_setting_every_process_refuses_is_named_by_the_script_and_in_torchruns_report(
    files, tiny_encoder_dir, tmp_path
):
    """Two processes under ``accelerate launch`` (torchrun underneath), a setting each refuses: the script's line at
    most once for the machine (its first process prints it, unless torchrun stopped that one first), and in torch's
    failure report, which the launcher prints whatever a process does (docs/reliability.md), each process that exited
    names it (its error file) instead of a link to torch's docs; the launcher exits 1."""
    base = base_arguments("run_ifcl.py", files, tiny_encoder_dir, tmp_path)
    result = launch([*base, "--objective", "conisi", "--cache_mini_batch_size", "2"], processes=2)
    line = (
        "run_ifcl.py: error: --cache_mini_batch_size with --objective conisi: its heads train in the loss's backward"
    )
    assert result.returncode == 1, result.stderr[-3000:]
    printed = [text for text in result.stderr.splitlines() if text.startswith("run_ifcl.py: error:")]
    assert len(printed) <= 1 and all(text.startswith(line) for text in printed), result.stderr[-3000:]
    assert "ChildFailedError" in result.stderr  # torchrun's report: no process can keep it out
    assert f"traceback : {line}" in result.stderr, result.stderr[-3000:]
    assert "To enable traceback see" not in result.stderr


@pytest.mark.parametrize("script", ["run_ifcl.py", "evaluate_sts.py", "prepare_fraternal.py"])
def test_invalid_json_arguments_file_is_named(files, script, capsys):
    """The three scripts read a .json file of arguments the same way, and name it when it is not JSON."""
    from ifcl.failures import run_command

    with pytest.raises(SystemExit) as exit_info:
        run_command(script, lambda: script_main(script)([str(files / "args.json")]))
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in error
    assert "args.json: not valid JSON" in error


JSON_CASES = [
    # (a setting with a value of the wrong type, what the message must name): as the command line would say it
    ({"fusion_rate": "half"}, "argument --fusion_rate/--fusion-rate: invalid float value: 'half'"),
    ({"fusion_rate": None}, "fusion_rate needs a value, got null"),
    ({"queue_size": 4.5}, "argument --queue_size/--queue-size: invalid int value: '4.5'"),
    ({"max_steps": 2.7}, "argument --max_steps/--max-steps: invalid int value: '2.7'"),
    (
        {"freeze_word_embeddings": "maybe"},
        "argument --freeze_word_embeddings/--freeze-word-embeddings: Truthy value expected: got maybe",
    ),
    ({"freeze_word_embeddings": [True]}, "freeze_word_embeddings takes one value, got the list [true]"),
    ({"objective": "simsce"}, "argument --objective: invalid choice: 'simsce'"),
    ({"learning_rate": True}, "argument --learning_rate/--learning-rate: invalid float value: 'true'"),
    ({"no_such_setting": 1}, "unknown argument(s) no_such_setting"),
]


def json_arguments(files, tiny_encoder_dir, tmp_path) -> dict:
    """run_ifcl.py's working base arguments as a JSON object."""
    words = base_arguments("run_ifcl.py", files, tiny_encoder_dir, tmp_path)
    values: dict = {}
    for index, word in enumerate(words):
        if word.startswith("--"):
            following = words[index + 1] if index + 1 < len(words) else None
            values[word[2:]] = True if following is None or following.startswith("--") else following
    return values


@pytest.mark.parametrize("bad, named", JSON_CASES, ids=[json.dumps(case[0]) for case in JSON_CASES])
def test_json_values_of_the_wrong_type_stop_with_a_message(files, tiny_encoder_dir, tmp_path, bad, named, capsys):
    import run_ifcl
    from ifcl.failures import run_command

    path = tmp_path / "arguments.json"
    path.write_text(json.dumps({**json_arguments(files, tiny_encoder_dir, tmp_path), **bad}), encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        run_command("run_ifcl.py", lambda: run_ifcl.main([str(path)]))
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in error
    assert f"run_ifcl.py: error: {path}: " in error and named in error, error[-2000:]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", [False, "false", "False", "no", 0])
def test_json_false_means_false_as_on_the_command_line(files, tiny_encoder_dir, tmp_path, value):
    import run_ifcl

    path = tmp_path / "arguments.json"
    arguments = {**json_arguments(files, tiny_encoder_dir, tmp_path), "freeze_word_embeddings": value}
    path.write_text(json.dumps({**arguments, "queue_size": "2", "sts_score_range": [0, 5]}), encoding="utf-8")
    parsed = run_ifcl.parse_arguments([str(path)])
    assert parsed.ifcl.freeze_word_embeddings is False
    assert parsed.ifcl.queue_size == 2 and parsed.data.sts_score_range == [0.0, 5.0]  # as --queue_size 2 would


# ---------------------------------------------------------------------------------------------------- Python API

API_DATA_CASES = [
    # (training columns, what the error must name)
    ({"sentence": [], "fraternal": []}, "The training set is empty"),
    ({"sentence": list(range(8))}, "column 'sentence' holds"),
    ({"sentence": ENGLISH[:3] + [None] + ENGLISH[4:8]}, "None in row 3"),
    ({"sentence": ENGLISH[:8], "fraternal": GERMAN[:5] + ["  "] + GERMAN[6:8]}, "'  ' in row 5"),
]


@pytest.mark.parametrize("columns, named", API_DATA_CASES, ids=[c[1] for c in API_DATA_CASES])
def test_ifcl_trainer_checks_its_text_like_the_command_line(tiny_encoder_dir, tmp_path, columns, named):
    from datasets import Dataset

    from ifcl.model import IFCLModel
    from trainer_ifcl import IFCLTrainer

    weights = {} if "fraternal" in columns else {"fraternal_loss_weight": 0, "twins_loss_weight": 0}
    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0, **weights)  # fraternal twins: that column
    args = cpu_training_args(tmp_path / "out", per_device_train_batch_size=2)
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        IFCLTrainer(model, args, train_dataset=Dataset.from_dict(columns))


def test_a_queue_larger_than_the_data_is_warned_about(tiny_encoder_dir, tmp_path, caplog):
    from datasets import Dataset

    from ifcl.model import IFCLModel
    from trainer_ifcl import IFCLTrainer

    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=4)
    args = cpu_training_args(tmp_path / "out", per_device_train_batch_size=4)
    data = Dataset.from_dict({"sentence": ENGLISH[:12], "fraternal": GERMAN[:12]})  # 12 < k·N = 16
    IFCLTrainer(model, args, train_dataset=data)
    assert "12 training sentences are fewer than the hippocampus queue holds (k·N = 4 × 4)" in caplog.text


def test_a_missing_local_model_path_is_named(tiny_encoder_dir, tmp_path):
    from ifcl.model import IFCLModel

    missing = str(tmp_path / "no" / "such" / "model")
    with pytest.raises(FileNotFoundError, match=f"fraternal_model_name_or_path {missing}: no such folder"):
        IFCLModel.from_encoder(str(tiny_encoder_dir), fraternal_model_name_or_path=missing)
    with pytest.raises(FileNotFoundError, match=f"encoder_name_or_path {missing}: no such folder"):
        IFCLModel.from_encoder(missing)


API_ARGUMENT_CASES = [
    # (what is called, its keyword arguments, the error, what the message must name)
    (
        "from_encoder",
        {"fusion_rat": 0.9},
        ValueError,
        "fusion_rat is not a setting of IFCLConfig; did you mean fusion_rate?",
    ),
    ("from_encoder", {"queue_size": "4"}, TypeError, "queue_size must be an integer, got '4'"),
    ("from_encoder", {"queue_size": 2.5}, TypeError, "queue_size must be an integer, got 2.5"),
    ("from_encoder", {"fusion_rate": "0.5"}, TypeError, "fusion_rate must be a number, got '0.5'"),
    ("encode", {"sentences": None}, TypeError, "sentences must be a str or a sequence of str, got NoneType"),
    ("encode", {"sentences": ["a", 3]}, TypeError, "sentences[1] is 3 (int)"),
    ("encode", {"sentences": [b"a"]}, TypeError, "sentences[0] is b'a' (bytes)"),
    ("encode", {"sentences": ["a"], "batch_size": 0}, ValueError, "batch_size must be a whole number ≥ 1, got 0"),
    ("encode", {"sentences": ["a"], "truncate_dim": 64.5}, TypeError, "truncate_dim must be a whole number"),
    ("encode", {"sentences": ["a"], "truncate_dim": "64"}, TypeError, "truncate_dim must be a whole number"),
    (
        "from_encoder",
        {"matryoshka_dims": "64"},
        TypeError,
        "matryoshka_dims must be a list of whole numbers, got '64'",
    ),
    ("from_encoder", {"matryoshka_dims": [16, 16]}, ValueError, "matryoshka_dims must be distinct whole numbers"),
    (
        "from_encoder",
        {"matryoshka_dims": [16], "matryoshka_weights": ["1"]},
        ValueError,
        "matryoshka_weights must be one number > 0 per size",
    ),
]


@pytest.mark.parametrize(
    "call, arguments, error, named", API_ARGUMENT_CASES, ids=[str(c[1]) for c in API_ARGUMENT_CASES]
)
def test_the_python_api_names_a_bad_argument(tiny_encoder_dir, tiny_model, call, arguments, error, named):
    """One ``ValueError`` or ``TypeError`` from the project's own code, naming the argument, before any work."""
    from ifcl.model import IFCLModel

    with pytest.raises(error) as raised:
        if call == "from_encoder":
            IFCLModel.from_encoder(str(tiny_encoder_dir), **arguments)
        else:
            tiny_model.encode(**arguments)
    assert named in str(raised.value)
    assert raised.traceback[-1].path.name in ("modeling_ifcl.py", "configuration_ifcl.py")


@pytest.mark.parametrize(
    "arguments, error, named",
    [
        ({"r": 2.5}, TypeError, "--lora_r must be a whole number, got 2.5"),
        ({"r": 0}, ValueError, "--lora_r (to train LoRA) must be ≥ 1, got 0."),
        ({"r": 4, "dropout": None}, TypeError, "--lora_dropout must be a number, got None."),
        ({"r": 4, "dropout": "0.1"}, TypeError, "--lora_dropout must be a number, got '0.1' (str)."),
        ({"r": 4, "alpha": -8}, ValueError, "--lora_alpha must be > 0, got -8."),
        ({"r": 4, "alpha": float("inf")}, ValueError, "--lora_alpha must be a finite number > 0, got inf"),
        ({"r": 4, "target_modules": ["query", "valeu"]}, ValueError, "--lora_target_modules valeu: no layer"),
        ({"r": 4, "use_dora": True}, ValueError, "add_lora does not take use_dora"),
    ],
)
def test_add_lora_checks_its_settings_in_the_command_lines_words(tiny_encoder_dir, arguments, error, named):
    """Before any adapter goes in: the model is left as it was."""
    from ifcl.lora import add_lora
    from ifcl.model import IFCLModel

    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0)
    with pytest.raises(error, match=re.escape(named)):
        add_lora(model, **arguments)
    assert model.config.lora is None and not [n for n, _ in model.named_parameters() if "lora_" in n]


def test_the_trainer_checks_the_cache_size_type_before_any_work(tiny_model, tmp_path):
    from trainer_ifcl import IFCLTrainer

    args = cpu_training_args(tmp_path / "run", per_device_train_batch_size=4)
    with pytest.raises(
        TypeError, match=re.escape("--cache_mini_batch_size must be a whole number of sentences, got 2.5")
    ):
        IFCLTrainer(model=tiny_model, args=args, cache_mini_batch_size=2.5)


@pytest.mark.parametrize(
    ("value", "interval", "message"),
    [
        (0.0, "(0, 1]", "--rate must be in (0, 1], got 0.0."),
        (1.0, "(0, 1)", "--rate must be in (0, 1), got 1.0."),
        (-0.5, "[0, 1]", "--rate must be in [0, 1], got -0.5."),
        (0, "[1, inf)", "--rate must be ≥ 1, got 0."),
        (0.0, "(0, inf)", "--rate must be > 0, got 0.0."),
        (float("nan"), "[0, 1]", "--rate must be a finite number in [0, 1], got nan."),
        (float("inf"), "[0, inf)", "--rate must be a finite number ≥ 0, got inf."),
    ],
)
def test_a_value_outside_its_interval_is_named_with_the_interval(value, interval, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        check_within(SimpleNamespace(rate=value), interval, "rate")


@pytest.mark.parametrize(("value", "interval"), [(0.0, "[0, 1]"), (1.0, "(0, 1]"), (5, "[1, inf)"), (None, "(0, 1)")])
def test_a_value_inside_its_interval_or_unset_passes(value, interval):
    check_within(SimpleNamespace(rate=value), interval, "rate")


@pytest.mark.parametrize("value", ["0.5", True])
def test_a_value_that_is_no_number_is_named_with_its_type(value):
    with pytest.raises(
        TypeError, match=re.escape(f"--rate must be a number, got {value!r} ({type(value).__name__}).")
    ):
        check_within(SimpleNamespace(rate=value), "[0, 1]", "rate")


def test_an_objective_setting_of_the_wrong_type_is_named():
    from ifcl.objectives.conisi import ConIsISettings

    with pytest.raises(TypeError, match="--conisi_lambda"):
        ConIsISettings(conisi_lambda="0.5")


def test_a_choice_outside_its_choices_is_named_with_them():
    with pytest.raises(ValueError, match=re.escape("--unit must be one of word, token, got 'char'.")):
        check_choice(SimpleNamespace(unit="char"), "unit", ("word", "token"))
