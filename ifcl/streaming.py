"""Training text read as a stream, for corpora larger than a disk: ``run_ifcl.py --streaming``.

Rows come from shards of local files (a glob or a list; ``.txt`` ``sentence<TAB>translation``, ``.csv``, ``.json`` or
``.jsonl`` as JSON Lines, ``.parquet``) or a dataset on the Hub, through a ``datasets.IterableDataset``: in several
processes each reads its own shards, or its own rows where the shards do not divide among the processes
(``datasets.distributed.split_dataset_by_node``). Each row is checked as it is read (a bad line names its shard and
line), shuffled in a seeded buffer of ``shuffle_buffer_size`` rows and tokenized as it leaves it: no text or token
cache is written. :class:`TrainingStream` keeps its place (the source's position, the buffer's rows and the
generator's state), which each checkpoint saves, so that a resumed run reads on exactly as the uninterrupted one.
A stream is read once: one that ends before the run's last step ends the run, saying how many rows it held.
"""

from __future__ import annotations

import csv
import glob
import json
import logging
import os
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import datasets
import torch

from ifcl.checkpoints import STREAM_STATE_FILE
from ifcl.data import DataFormatError, _as_text, _format_error, _iter_lines, _parse_train_txt_line

logger = logging.getLogger(__name__)

# Rows a stream holds to shuffle (run_ifcl.py --shuffle_buffer_size): about 1 MB of text per 10,000 pairs.
SHUFFLE_BUFFER_SIZE = 10_000
STREAM_EXTENSIONS = (".txt", ".csv", ".json", ".jsonl", ".parquet")


class StreamEnded(ValueError):
    """A stream that ended before the training it was to feed."""


def shard_paths(patterns: str | Sequence[str]) -> list[str]:
    """The files ``patterns`` name (a path, a glob, or a list of them), sorted, all of one extension a stream reads;
    ``FileNotFoundError`` naming a pattern that matches no file, ``DataFormatError`` naming another extension."""
    paths = []
    for pattern in [patterns] if isinstance(patterns, str) else patterns:
        matched = sorted(glob.glob(os.path.expanduser(pattern))) if glob.has_magic(pattern) else [pattern]
        matched = [path for path in matched if os.path.isfile(path)]
        if not matched:
            raise FileNotFoundError(f"--train_file {pattern}: no such file (nor files that the pattern matches).")
        paths += matched
    extensions = sorted({os.path.splitext(path)[1].lower() for path in paths})
    unknown = [extension for extension in extensions if extension not in STREAM_EXTENSIONS]
    if unknown or len(extensions) > 1:
        example = next(path for path in paths if os.path.splitext(path)[1].lower() == (unknown or extensions)[0])
        raise _format_error(
            example,
            f"the shards of a stream are all {', '.join(STREAM_EXTENSIONS)} files of one kind; found "
            f"{', '.join(extension or '(none)' for extension in extensions)}",
        )
    return paths


def read_shards(shards: list[str], columns: dict[str, str]) -> Iterator[dict[str, str]]:
    """Rows of each shard in turn, as ``{canonical name: text}`` of ``columns`` (canonical name → the shard's column;
    a ``.txt`` shard's are its fields): ``datasets.IterableDataset.from_generator`` hands each process its shards.
    A ``.txt`` line as the memory-mapped route reads it (a bad one names the shard and line); a table's row with an
    empty cell left out, counted in a warning at the end of its shard."""
    for shard in shards:
        extension = os.path.splitext(shard)[1].lower()
        if extension == ".txt":
            for number, line in _iter_lines(shard):
                row = _parse_train_txt_line(shard, number, line, with_fraternal=len(columns) > 1)
                if row is not None:
                    yield dict(zip(columns, row))
            continue
        dropped = 0
        for number, cells in TABLE_READERS[extension](shard, list(columns.values())):
            texts = {name: _as_text(cells[source]) for name, source in columns.items()}
            if all(texts.values()):
                yield texts
            else:
                dropped += 1
        if dropped:
            logger.warning("%s: dropped %d row(s) with an empty sentence or translation", shard, dropped)


def csv_rows(shard: str, wanted: list[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) of a CSV file with a header naming ``wanted``."""
    with open(shard, encoding="utf-8-sig", newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [column for column in wanted if column not in (reader.fieldnames or [])]
        if missing:
            raise _format_error(shard, f"missing column(s) {missing}; found columns {reader.fieldnames}", 1)
        for row in reader:
            yield reader.line_num, row


def json_lines_rows(shard: str, wanted: list[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) of a JSON Lines file, each line an object holding ``wanted``."""
    for number, line in _iter_lines(shard):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            hint = (
                " (a stream reads JSON Lines: one object per line)" if number == 1 and line.lstrip()[:1] == "[" else ""
            )
            raise _format_error(shard, f"not a JSON object ({error.msg}){hint}", number) from None
        if not isinstance(row, dict) or any(column not in row for column in wanted):
            found = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise _format_error(shard, f"expected an object with {wanted}; found {found}", number)
        yield number, row


def parquet_rows(shard: str, wanted: list[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based row number, row) of a Parquet file, read a record batch at a time."""
    import pyarrow
    import pyarrow.parquet

    try:
        table = pyarrow.parquet.ParquetFile(shard)
    except (OSError, pyarrow.ArrowException) as error:
        raise _format_error(shard, f"cannot be read as Parquet ({error})") from None
    found = table.schema_arrow.names
    missing = [column for column in wanted if column not in found]
    if missing:
        raise _format_error(shard, f"missing column(s) {missing}; found columns {found}")
    number = 0
    for batch in table.iter_batches(columns=wanted):
        for row in batch.to_pylist():
            number += 1
            yield number, row


TABLE_READERS: dict[str, Callable[[str, list[str]], Iterator[tuple[int, dict[str, Any]]]]] = {
    ".csv": csv_rows,
    ".json": json_lines_rows,
    ".jsonl": json_lines_rows,
    ".parquet": parquet_rows,
}


def file_source(patterns: str | Sequence[str], columns: dict[str, str]) -> datasets.IterableDataset:
    """The rows of local shards as a ``datasets.IterableDataset`` of one shard per file (:func:`read_shards`)."""
    shards = shard_paths(patterns)
    return datasets.IterableDataset.from_generator(read_shards, gen_kwargs={"shards": shards, "columns": columns})


def hub_source(name: str, config: str | None, split: str, columns: dict[str, str]) -> datasets.IterableDataset:
    """The rows of a Hub dataset (or a local dataset folder), streamed, under their canonical names; a Hub id while
    the Hub cannot be reached is named in one line before anything is read."""
    from ifcl.hub import hub_reachable

    if not os.path.exists(name) and not hub_reachable():
        raise ConnectionError(
            f"--dataset_name {name} --streaming: the Hub cannot be reached (offline, or HF_HUB_OFFLINE is set), and a "
            "stream is read from it as training goes; give local shards with --train_file, or train where it can be."
        )
    stream = datasets.load_dataset(name, config, split=split, streaming=True)
    source = f"--dataset_name {name} ({split})"

    def canonical(row: dict[str, Any]) -> dict[str, str]:
        missing = [column for column in columns.values() if column not in row]
        if missing:
            raise DataFormatError(f"{source}: missing column(s) {missing}; found columns {sorted(row)}")
        return {canonical_name: _as_text(row[column]) for canonical_name, column in columns.items()}

    return stream.map(canonical, remove_columns=list(stream.column_names or []) or None).filter(
        lambda row: all(row.values())
    )


class TrainingStream(torch.utils.data.IterableDataset):
    """Training rows read once from ``source`` (a ``datasets.IterableDataset``), shuffled in a buffer of
    ``shuffle_buffer_size`` rows by a generator seeded with ``seed`` (0 or 1: in the source's order), each checked
    and tokenized as it leaves the buffer (``IFCLTrainer`` gives the stream its objective's columns and tokenizer:
    :meth:`set_transform`).

    It keeps its place: :meth:`state_dict` (the source's position, the buffer's rows, the generator's state) is what
    ``IFCLTrainer`` saves with each checkpoint, and :meth:`load_state_dict` of it reads on as the stream did. For
    several processes, :meth:`for_process` gives each its part. ``name`` names the stream in messages.
    """

    def __init__(
        self,
        source: datasets.IterableDataset,
        shuffle_buffer_size: int = SHUFFLE_BUFFER_SIZE,
        seed: int = 0,
        name: str = "the training stream",
    ) -> None:
        if (
            isinstance(shuffle_buffer_size, bool)
            or not isinstance(shuffle_buffer_size, int)
            or shuffle_buffer_size < 0
        ):
            raise ValueError(f"shuffle_buffer_size must be a whole number ≥ 0, got {shuffle_buffer_size!r}.")
        self.source, self.shuffle_buffer_size, self.seed, self.name = source, shuffle_buffer_size, seed, name
        self.columns: tuple[str, ...] | None = None  # checked and kept; None: each row as it comes
        self.transform: Callable[[dict[str, str]], dict[str, Any]] | None = None
        self.buffer: list[dict[str, str]] = []
        self.random = random.Random(seed)
        self.rows_read = 0  # rows taken from the source by this process

    @classmethod
    def from_files(cls, patterns: str | Sequence[str], columns: dict[str, str], **options: Any) -> TrainingStream:
        """The stream of local shards (:func:`file_source`), named by ``patterns``."""
        shown = patterns if isinstance(patterns, str) else " ".join(patterns)
        stream = cls(file_source(patterns, columns), name=f"--train_file {shown}", **options)
        stream.columns = tuple(columns)
        return stream

    @classmethod
    def from_hub(cls, name: str, config: str | None, split: str, columns: dict[str, str], **options) -> TrainingStream:
        """The stream of a Hub dataset (:func:`hub_source`)."""
        stream = cls(hub_source(name, config, split, columns), name=f"--dataset_name {name} ({split})", **options)
        stream.columns = tuple(columns)
        return stream

    def for_process(self, rank: int, world_size: int) -> TrainingStream:
        """This stream's part for process ``rank`` of ``world_size``: its own shards, or its own rows where the
        shards do not divide among the processes; its buffer seeded apart from the others'."""
        if world_size <= 1:
            return self
        from datasets.distributed import split_dataset_by_node

        part = TrainingStream(
            split_dataset_by_node(self.source, rank=rank, world_size=world_size),
            self.shuffle_buffer_size,
            self.seed + rank,
            self.name,
        )
        part.columns, part.transform = self.columns, self.transform
        return part

    def set_transform(self, columns: Sequence[str], transform: Callable[[dict[str, str]], dict[str, Any]]) -> None:
        """Check each row for ``columns`` (non-empty text) and make it ``transform(row)`` (its tokens) as it leaves."""
        self.columns, self.transform = tuple(columns), transform

    def checked(self, row: dict[str, Any]) -> dict[str, str]:
        """The row's text columns, each a non-empty string, or ``ValueError`` naming the row and column."""
        if self.columns is None:
            return row
        for column in self.columns:
            value = row.get(column)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(
                    f"{self.name}: row {self.rows_read} of this process's part has {value!r} in column {column!r}: "
                    "every row must be a sentence (a non-empty string)."
                )
        return {column: row[column] for column in self.columns}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """The rows, from where the stream is (a loaded state included): each row read takes a random place in the
        full buffer and sends out the row that held it; at the source's end, the buffer's rows in random order."""
        transform = self.transform or (lambda row: row)
        for row in self.source:
            self.rows_read += 1
            row = self.checked(row)
            if len(self.buffer) < max(self.shuffle_buffer_size, 1):
                self.buffer.append(row)
                continue
            place = self.random.randrange(len(self.buffer))
            row, self.buffer[place] = self.buffer[place], row
            yield transform(row)
        while self.buffer:
            place = self.random.randrange(len(self.buffer))
            row, self.buffer[place] = self.buffer[place], self.buffer[-1]
            self.buffer.pop()
            yield transform(row)

    def state_dict(self) -> dict[str, Any]:
        """Where the stream is: the source's position, the buffer's rows, the generator's state and the rows read."""
        version, internal, gauss = self.random.getstate()
        return {
            "source": self.source.state_dict(),
            "buffer": list(self.buffer),
            "random": [version, list(internal), gauss],
            "rows_read": self.rows_read,
            "shuffle_buffer_size": self.shuffle_buffer_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Read on from ``state`` (:meth:`state_dict`), which must come from a stream of the same buffer size."""
        if state["shuffle_buffer_size"] != self.shuffle_buffer_size:
            raise ValueError(
                f"the checkpoint's stream shuffled in a buffer of {state['shuffle_buffer_size']} rows, this one in "
                f"{self.shuffle_buffer_size}: resume with --shuffle_buffer_size {state['shuffle_buffer_size']}."
            )
        self.source.load_state_dict(state["source"])
        self.buffer = list(state["buffer"])
        version, internal, gauss = state["random"]
        self.random.setstate((version, tuple(internal), gauss))
        self.rows_read = state["rows_read"]

    def save(self, checkpoint: str, rank: int) -> None:
        """Write :meth:`state_dict` into ``checkpoint`` as this process's ``ifcl.checkpoints.STREAM_STATE_FILE``."""
        from ifcl.files import write_json_atomically

        write_json_atomically(os.path.join(checkpoint, STREAM_STATE_FILE.format(rank=rank)), self.state_dict())

    def resume(self, checkpoint: str, rank: int) -> None:
        """Read on from where this process's stream was at ``checkpoint``; ``ValueError`` naming the file when the
        checkpoint was not saved by a streamed run."""
        path = os.path.join(checkpoint, STREAM_STATE_FILE.format(rank=rank))
        if not os.path.isfile(path):
            raise ValueError(
                f"--resume_from_checkpoint {checkpoint}: it holds no {os.path.basename(path)}, so it was not saved by a "
                "streamed run: resume it without --streaming, or train anew."
            )
        with open(path, encoding="utf-8") as handle:
            self.load_state_dict(json.load(handle))
        logger.info(f"{self.name}: reading on after the {self.rows_read} rows this process had read.")

    def ended(self, rows_needed: int, rows_read: int) -> StreamEnded:
        """The error of a stream that held ``rows_read`` rows in all, fewer than the ``rows_needed`` of the run."""
        return StreamEnded(
            f"{self.name} ended after {rows_read} rows, before the {rows_needed} that --max_steps needs (its steps × "
            "the global batch): give more data or fewer steps."
        )


def load_training_stream(data_args, needs_fraternal: bool, seed: int) -> TrainingStream:
    """``run_ifcl.py --streaming``'s training stream (its ``DataArguments``: --train_file shards or --dataset_name,
    their columns, --max_train_samples, --shuffle_buffer_size), its buffer seeded with ``seed``."""
    from ifcl.data import _wanted_columns

    columns = _wanted_columns(data_args.sentence_column, data_args.fraternal_column if needs_fraternal else None)
    options = {"shuffle_buffer_size": data_args.shuffle_buffer_size, "seed": seed}
    if data_args.train_file is not None:
        stream = TrainingStream.from_files(data_args.train_file, columns, **options)
    elif data_args.dataset_name is not None:
        name, config, split = data_args.dataset_name, data_args.dataset_config_name, data_args.dataset_split
        stream = TrainingStream.from_hub(name, config, split, columns, **options)
    else:
        raise ValueError("--streaming reads --train_file (shards) or --dataset_name; give one of them.")
    if data_args.max_train_samples is not None:
        stream.source = stream.source.take(data_args.max_train_samples)
    return stream


def check_stream_resume(checkpoint: str, streaming: bool, shuffle_buffer_size: int) -> None:
    """A checkpoint saved by a streamed run is resumed with ``--streaming`` and the same ``--shuffle_buffer_size``
    (that each process's state is there, ``ifcl.checkpoints.checkpoint_problem`` checks): each as a one-line
    ``ValueError`` naming the file or flag."""
    saved = os.path.join(checkpoint, STREAM_STATE_FILE.format(rank=0))
    if not os.path.isfile(saved):
        return  # not a streamed run's, or, resumed with --streaming, named as incomplete before this
    if not streaming:
        raise ValueError(
            f"--resume_from_checkpoint {checkpoint} was trained with --streaming ({os.path.basename(saved)}): "
            "resume it with --streaming and the same data, or train anew."
        )
    with open(saved, encoding="utf-8") as handle:
        buffer_size = json.load(handle).get("shuffle_buffer_size")
    if buffer_size != shuffle_buffer_size:
        raise ValueError(
            f"--shuffle_buffer_size {shuffle_buffer_size}: --resume_from_checkpoint {checkpoint} shuffled its stream in a "
            f"buffer of {buffer_size} rows; resume with --shuffle_buffer_size {buffer_size}."
        )


class StreamBatches:
    """The batches of ``loader`` (a data loader over ``stream``), which every process takes or none: in several
    processes each batch is agreed on (one flag and a count, all-reduced), so that a stream that ends in one process
    ends the run in all, with :meth:`TrainingStream.ended` naming the rows they held, instead of leaving the others
    waiting. ``rows_needed``: the run's steps × its global batch."""

    def __init__(self, loader, stream: TrainingStream, rows_needed: int, device: torch.device) -> None:
        self.loader, self.stream, self.rows_needed, self.device = loader, stream, rows_needed, device

    def __iter__(self) -> Iterator[Any]:
        import torch.distributed as dist

        several = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        batches = iter(self.loader)
        while True:
            batch = next(batches, None)
            rows_read, all_have_one = self.stream.rows_read, batch is not None
            if several:
                agreed = torch.tensor([all_have_one, rows_read], dtype=torch.int64, device=self.device)
                dist.all_reduce(agreed[:1], op=dist.ReduceOp.MIN)
                dist.all_reduce(agreed[1:], op=dist.ReduceOp.SUM)
                all_have_one, rows_read = bool(agreed[0]), int(agreed[1])
            if not all_have_one:
                raise self.stream.ended(self.rows_needed, rows_read)
            yield batch
