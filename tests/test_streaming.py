"""``run_ifcl.py --streaming``: shards read as a stream, shuffled in a seeded buffer, tokenized as read, resumed
exactly, split among processes; no cache written; bad input in one line."""

from __future__ import annotations

import itertools
import json
import os
import re
from pathlib import Path

import datasets
import pytest
import torch
from conftest import ENGLISH, GERMAN, cpu_training_args, launch, losses_by_step, stopped_in_step, write_sts_file

import run_ifcl
from ifcl.data import DataFormatError, shard_paths
from ifcl.failures import Interrupted, RunFailure
from ifcl.files import STREAM_STATE_FILE
from ifcl.streaming import TrainingStream

COLUMNS = {"sentence": "sentence", "fraternal": "fraternal"}
PAIRS = [(f"{english} {i}", f"{german} {i}") for i in range(10) for english, german in zip(ENGLISH, GERMAN)]


def write_shards(folder: Path, count: int, extension: str = ".txt", pairs=PAIRS) -> Path:
    """``pairs`` dealt round-robin into ``count`` shards of one format, in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        rows = pairs[index::count]
        path = folder / f"part-{index}{extension}"
        if extension == ".txt":
            path.write_text("".join(f"{s}\t{f}\n" for s, f in rows), encoding="utf-8")
        elif extension == ".csv":
            path.write_text("sentence,fraternal\n" + "".join(f'"{s}","{f}"\n' for s, f in rows), encoding="utf-8")
        elif extension == ".jsonl":
            lines = [json.dumps({"sentence": s, "fraternal": f, "source": "web"}) for s, f in rows]
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        else:
            datasets.Dataset.from_dict(
                {"sentence": [s for s, _ in rows], "fraternal": [f for _, f in rows]}
            ).to_parquet(str(path))
    return folder


def rows_of(stream: TrainingStream) -> list[tuple[str, str]]:
    return [(row["sentence"], row["fraternal"]) for row in stream]


@pytest.fixture
def shards(tmp_path) -> Path:
    return write_shards(tmp_path / "shards", 3)


def cli(encoder: Path, shards: Path, output: Path, *extra: str) -> list[str]:
    """A tiny streamed run: batch 4, 6 steps, saved and evaluated every 3, the stream shuffled in 16 rows."""
    write_sts_file(output.parent / "sts.tsv")
    sts = str(output.parent / "sts.tsv")
    flags = ["--model_name_or_path", str(encoder), "--train_file", str(shards / "*.txt"), "--streaming"]
    flags += ["--shuffle_buffer_size", "16", "--validation_file", sts, "--test_file", sts, "--output_dir", str(output)]
    flags += ["--max_steps", "6", "--save_steps", "3", "--eval_steps", "3", "--logging_steps", "1"]
    return [*flags, "--per_device_train_batch_size", "4", "--queue_size", "2", "--use_cpu", *extra]


def test_every_format_of_shard_reads_the_same_rows_a_row_with_an_empty_cell_left_out(tmp_path, caplog):
    expected = PAIRS
    for extension in (".txt", ".csv", ".jsonl", ".parquet"):
        folder = write_shards(tmp_path / extension[1:], 2, extension)
        stream = TrainingStream.from_files(str(folder / f"*{extension}"), COLUMNS, shuffle_buffer_size=0)
        assert sorted(rows_of(stream)) == sorted(expected), extension
    with_empty = [*PAIRS[:3], ("A sentence.", ""), *PAIRS[3:5]]
    folder = write_shards(tmp_path / "empty", 1, ".csv", with_empty)
    with caplog.at_level("WARNING"):
        rows = rows_of(TrainingStream.from_files(str(folder / "*.csv"), COLUMNS, shuffle_buffer_size=0))
    assert rows == PAIRS[:5] and "dropped 1 row(s) with an empty sentence or translation" in caplog.text


def test_the_buffer_shuffles_by_its_seed_and_a_loaded_state_reads_on_exactly(shards):
    """Every row once; the same order for the same seed, another for another; a stream's state taken after some rows
    and loaded into a new stream gives the rest exactly, buffer and generator included."""

    def stream(seed: int) -> TrainingStream:
        return TrainingStream.from_files(str(shards / "*.txt"), COLUMNS, shuffle_buffer_size=16, seed=seed)

    whole = rows_of(stream(1))
    assert sorted(whole) == sorted(PAIRS) and whole != PAIRS and whole == rows_of(stream(1)) != rows_of(stream(2))
    first = stream(1)
    rows = iter(first)
    head = [(row["sentence"], row["fraternal"]) for row in itertools.islice(rows, 30)]
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint keeps it
    assert state["rows_read"] == 46 and len(state["buffer"]) == 16
    again = stream(1)
    again.load_state_dict(state)
    assert head + rows_of(again) == whole


def test_each_process_reads_its_own_shards_or_its_own_rows_each_row_once(tmp_path):
    """Four shards among two processes: two each; three: every other row. Either way each row is read by exactly one
    process."""
    for count in (4, 3):
        folder = write_shards(tmp_path / str(count), count)
        stream = TrainingStream.from_files(str(folder / "*.txt"), COLUMNS, shuffle_buffer_size=8, seed=0)
        parts = [rows_of(stream.for_process(rank, 2)) for rank in range(2)]
        assert sorted(parts[0] + parts[1]) == sorted(PAIRS) and not set(parts[0]) & set(parts[1])
        assert abs(len(parts[0]) - len(parts[1])) <= 1


def test_a_streamed_run_stopped_after_a_checkpoint_and_resumed_trains_as_the_uninterrupted_one(
    tiny_encoder_dir, shards, tmp_path
):
    """run_ifcl.py --streaming over three shards, 6 steps, a checkpoint every 3: stopped in step 4 and resumed from
    checkpoint-3, it logs the losses of steps 4-6 of the uninterrupted run and publishes its weights (1e-6). No
    training-data cache is written."""
    from safetensors.torch import load_file

    caches = [os.environ["IFCL_DATA_CACHE"], str(datasets.config.HF_DATASETS_CACHE)]

    def cached() -> dict[str, list[str]]:  # what the caches hold, but the empty lock files datasets' builders leave
        return {
            folder: sorted(
                name
                for name in (os.listdir(folder) if os.path.isdir(folder) else [])
                if not (name.endswith(".lock") and os.path.getsize(os.path.join(folder, name)) == 0)
            )
            for folder in caches
        }

    before = cached()
    whole, _ = run_ifcl.main(cli(tiny_encoder_dir, shards, tmp_path / "whole"))
    expected = losses_by_step(whole)
    assert sorted(expected) == [1, 2, 3, 4, 5, 6]
    assert os.path.isfile(tmp_path / "whole" / "checkpoint-3" / STREAM_STATE_FILE.format(rank=0))

    stopped = interrupted_run(tiny_encoder_dir, shards, tmp_path / "stopped")
    resumed, _ = run_ifcl.main([*stopped, "--resume_from_checkpoint", "last"])
    losses = losses_by_step(resumed)  # steps 1-3 from the checkpoint's log, 4-6 trained anew
    assert losses == pytest.approx(expected, abs=1e-6)
    published = [load_file(tmp_path / run / "model.safetensors") for run in ("whole", "stopped")]
    for name, weight in published[0].items():
        torch.testing.assert_close(published[1][name], weight, atol=1e-6, rtol=0, msg=name)
    assert cached() == before  # nothing parsed nor tokenized into a cache


@pytest.mark.slow
@pytest.mark.parametrize("count", [4, 3], ids=["its own shards", "its own rows"])
def test_two_processes_read_each_row_once_and_train_to_the_end(tiny_encoder_dir, tmp_path, count):
    """Two gloo processes of batch 2 over 120 rows read to the end of the stream in 30 steps: each row read by exactly
    one process, the run to its end."""
    shards = write_shards(tmp_path / "shards", count)
    args = cli(tiny_encoder_dir, shards, tmp_path / "run", "--per_device_train_batch_size", "2", "--max_steps", "30")
    args += ["--save_strategy", "no", "--eval_strategy", "no", "--load_best_model_at_end", "false"]
    result = launch(args, processes=2, script="tests/distributed_stream.py")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    read = [json.loads((tmp_path / "run" / f"rows_rank{rank}.json").read_text()) for rank in range(2)]
    assert sorted(read[0] + read[1]) == sorted(sentence for sentence, _ in PAIRS)
    assert not set(read[0]) & set(read[1])
    assert json.loads((tmp_path / "run" / "all_results.json").read_text())["train_steps"] == 30


def interrupted_run(encoder: Path, shards: Path, output: Path, *extra: str) -> list[str]:
    """A streamed run stopped in step 4, after checkpoint-3; its arguments."""
    with stopped_in_step(4), pytest.raises(Interrupted):
        run_ifcl.main(cli(encoder, shards, output, *extra))
    return cli(encoder, shards, output, *extra)


def test_a_stream_that_ends_before_the_last_step_ends_the_run_saying_how_many_rows_it_held(tiny_encoder_dir, tmp_path):
    shards = write_shards(tmp_path / "short", 2, pairs=PAIRS[:20])
    with pytest.raises(RunFailure, match=re.escape(f"--train_file {shards}/*.txt ended after 20 rows, before the 24")):
        run_ifcl.main(cli(tiny_encoder_dir, shards, tmp_path / "run"))


BAD_LINES = [
    (".txt", "A sentence without its translation\n", "line 1: expected 'sentence<TAB>translation' (exactly one tab)"),
    (".jsonl", '{"sentence": "A sentence."\n', "line 1: invalid JSON"),
    (".parquet", "not parquet at all", "cannot be read as Parquet"),
    (
        ".csv",
        "sentence,fraternal\nA man.,Ein Mann.\nA dog.,Ein Hund.,extra\n",
        "cannot be read as CSV (Error tokenizing data. C error: Expected 2 fields in line 3",
    ),
]


@pytest.mark.parametrize("extension, content, message", BAD_LINES, ids=[case[0] for case in BAD_LINES])
def test_a_bad_shard_is_named_with_its_line_as_it_is_read(tiny_encoder_dir, tmp_path, extension, content, message):
    shards = write_shards(tmp_path / "shards", 2, extension)
    bad = shards / f"a-bad-shard{extension}"  # the first, in the shards' order
    bad.write_text(content, encoding="utf-8")
    with pytest.raises(RunFailure, match=re.escape(f"{bad}: {message}")) as error:
        run_ifcl.main(
            [*cli(tiny_encoder_dir, shards, tmp_path / "run"), "--train_file", str(shards / f"*{extension}")]
        )
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "extra, error, message",
    [
        (("--max_steps", "-1", "--num_train_epochs", "1"), ValueError, "knows no size to count epochs by"),
        (("--max_train_samples", "10"), ValueError, "--max_train_samples 10 with --streaming: --max_steps 6"),
        (("--tokenize_on_the_fly",), ValueError, "--tokenize_on_the_fly with --streaming"),
        (("--shuffle_buffer_size", "-1"), ValueError, "--shuffle_buffer_size must be ≥ 0"),
        (("--train_file", "nowhere/*.txt"), FileNotFoundError, "--train_file nowhere/*.txt: no such file"),
        (("--dataset_name", "owner/corpus", "--train_file", None), ConnectionError, "the Hub cannot be reached"),
    ],
    ids=["epochs", "max_train_samples", "on the fly", "buffer", "no shard", "hub offline"],
)
def test_settings_a_stream_cannot_take_are_one_line_before_any_model_loads(
    tiny_encoder_dir, shards, tmp_path, monkeypatch, extra, error, message
):
    from transformers import AutoModel

    monkeypatch.setattr(AutoModel, "from_pretrained", lambda *a, **k: pytest.fail("a model loaded"))
    args = cli(tiny_encoder_dir, shards, tmp_path / "run")
    if None in extra:  # --dataset_name instead of --train_file
        index = args.index("--train_file")
        del args[index : index + 2]
        extra = extra[:2]
    with pytest.raises(error, match=re.escape(message)) as raised:
        run_ifcl.main([*args, *extra])
    assert "\n" not in str(raised.value) and not (tmp_path / "run" / "checkpoint-3").exists()


def test_shards_of_several_formats_are_refused(tmp_path):
    folder = write_shards(tmp_path / "mixed", 1, ".txt")
    write_shards(folder, 1, ".csv")
    with pytest.raises(DataFormatError, match="found .csv, .txt"):
        shard_paths(str(folder / "part-0.*"))


def test_a_streamed_checkpoint_resumes_only_as_it_was_streamed(tiny_encoder_dir, shards, tmp_path):
    args = interrupted_run(tiny_encoder_dir, shards, tmp_path / "run")
    resume = ["--resume_from_checkpoint", "last"]
    memory_mapped = [arg for arg in args if arg != "--streaming"]
    del memory_mapped[memory_mapped.index("--shuffle_buffer_size") : memory_mapped.index("--shuffle_buffer_size") + 2]
    with pytest.raises(ValueError, match="was trained with --streaming"):
        run_ifcl.main([*memory_mapped, "--train_file", str(shards / "part-0.txt"), *resume])
    with pytest.raises(ValueError, match=re.escape("resume with --shuffle_buffer_size 16")):
        run_ifcl.main([*args, "--shuffle_buffer_size", "8", *resume])
    checkpoint = tmp_path / "run" / "checkpoint-3"
    (checkpoint / STREAM_STATE_FILE.format(rank=0)).unlink()  # a save cut short before the stream's state
    missing = f"{checkpoint}/ifcl_stream_state-0.json is missing (without it the resumed steps would differ)"
    with pytest.raises(ValueError, match=re.escape(missing)):
        run_ifcl.main([*args, "--resume_from_checkpoint", str(checkpoint)])


@pytest.mark.parametrize("change", ["deleted", "added first", "rewritten", "other pattern"])
def test_a_streamed_resume_names_the_shards_that_changed_since_its_checkpoint(tiny_encoder_dir, tmp_path, change):
    """A stream's place is a shard and a row in it: a shard deleted, one added that sorts first, one rewritten, or
    another --train_file would make the resume read other rows. Each is named in one line before anything is read."""
    shards = write_shards(tmp_path / "shards", 2)
    args = interrupted_run(tiny_encoder_dir, shards, tmp_path / "run")
    resume = ["--resume_from_checkpoint", "last"]
    if change == "deleted":
        (shards / "part-1.txt").unlink()
        expected = f"{shards / 'part-1.txt'} is not read now"
    elif change == "added first":
        (shards / "part-00.txt").write_text("A new sentence.\tEin neuer Satz.\n", encoding="utf-8")
        expected = f"{shards / 'part-00.txt'} is read now but was not then"
    elif change == "rewritten":
        with open(shards / "part-0.txt", "a", encoding="utf-8") as handle:
            handle.write("A new sentence.\tEin neuer Satz.\n")
        expected = f"{shards / 'part-0.txt'} has changed since ("
    else:
        args = [*args, "--train_file", str(shards / "part-*.txt")]
        expected = f"--train_file '{shards}/*.txt' in the checkpoint, '{shards}/part-*.txt' now"
    with pytest.raises(ValueError, match=re.escape(expected)) as error:
        run_ifcl.main([*args, *resume])
    assert "\n" not in str(error.value)


def test_shuffle_buffer_size_without_streaming_is_refused(tiny_encoder_dir, tmp_path):
    args = [arg for arg in cli(tiny_encoder_dir, tmp_path, tmp_path / "run") if arg != "--streaming"]
    args[args.index("--train_file") + 1] = str(write_shards(tmp_path / "one", 1) / "part-0.txt")
    with pytest.raises(ValueError, match="--shuffle_buffer_size 16 without --streaming"):
        run_ifcl.main(args)


def test_the_trainer_and_ifcl_loss_take_a_datasets_stream(tiny_encoder_dir, tmp_path):
    """A ``datasets.IterableDataset`` of text: IFCLTrainer reads it in its own order, tokenized as read; IFCLLoss under
    SentenceTransformerTrainer trains on it, a bad row named as it comes."""
    from ifcl.model import IFCLModel
    from trainer_ifcl import IFCLTrainer

    def pairs():
        for sentence, fraternal in PAIRS[:24]:
            yield {"sentence": sentence, "fraternal": fraternal}

    text = datasets.Features({"sentence": datasets.Value("string"), "fraternal": datasets.Value("string")})
    stream = datasets.IterableDataset.from_generator(pairs, features=text)
    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=2)
    args = cpu_training_args(tmp_path / "trainer", per_device_train_batch_size=4, max_steps=3, logging_steps=1)
    trainer = IFCLTrainer(model=model, args=args, train_dataset=stream)
    trainer.train()
    assert sorted(losses_by_step(trainer)) == [1, 2, 3] and trainer.train_dataset.rows_read == 13

    pytest.importorskip("sentence_transformers")
    from conftest import st_training_args
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    from ifcl.sentence_transformers_loss import IFCLLoss

    transformer = Transformer(str(tiny_encoder_dir), max_seq_length=16)
    st_model = SentenceTransformer(modules=[transformer, Pooling(32, "mean")])
    loss = IFCLLoss(st_model, queue_size=2)
    # Each process reads its own batches of a stream, as docs/training.md says (accelerate before 1.13 cannot join
    # sentence-transformers' batches even in one process).
    dispatch = {"accelerator_config": {"dispatch_batches": False}}
    st_args = st_training_args(tmp_path / "st", per_device_train_batch_size=4, max_steps=3, **dispatch)
    SentenceTransformerTrainer(
        model=st_model, args=st_args, train_dataset=stream, loss=loss, data_collator=loss.data_collator(stream)
    ).train()
    assert loss.queue is not None

    def with_an_empty_translation():
        yield {"sentence": "A sentence.", "fraternal": " "}

    collator = loss.data_collator(datasets.IterableDataset.from_generator(with_an_empty_translation, features=text))
    with pytest.raises(ValueError, match="A row of the training stream has ' ' in column 'fraternal'"):
        collator([{"sentence": "A sentence.", "fraternal": " "}])


def test_a_dataset_folder_streams_through_datasets_its_columns_named(tmp_path):
    """--dataset_name of a local dataset folder (as a Hub repo is laid out): its columns taken by name; a column it
    lacks named with those it has, as its first row is read."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    for index in range(2):
        rows = PAIRS[index::2]
        columns = {"text": [s for s, _ in rows], "de": [f for _, f in rows], "id": list(range(len(rows)))}
        datasets.Dataset.from_dict(columns).to_parquet(str(folder / f"train-{index}.parquet"))
    stream = TrainingStream.from_hub(str(folder), None, "train", {"sentence": "text", "fraternal": "de"}, seed=0)
    assert sorted(rows_of(stream)) == sorted(PAIRS) and stream.source.n_shards == 2
    missing = TrainingStream.from_hub(str(folder), None, "train", {"sentence": "text", "fraternal": "fr"}, seed=0)
    with pytest.raises(
        DataFormatError, match=re.escape("missing column(s) ['fr']; found columns ['de', 'id', 'text']")
    ):
        rows_of(missing)
