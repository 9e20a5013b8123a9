"""Training text read as a stream, for corpora larger than a disk: ``run_ifcl.py --streaming``.

Rows come from shards of local files (a glob or a list; ``.txt`` ``sentence<TAB>translation``, ``.csv``, ``.json`` or
``.jsonl`` as JSON Lines, ``.parquet``) or a dataset on the Hub, through a ``datasets.IterableDataset``: in several
processes each reads its own shards, or its own rows where the shards do not divide among the processes
(``datasets.distributed.split_dataset_by_node``). Each row is checked as it is read (a bad line names its shard and
line), shuffled in a seeded buffer of ``shuffle_buffer_size`` rows and tokenized a batch at a time as it leaves: no text or token
cache is written. :class:`TrainingStream` keeps its place (the source's position, the buffer's rows and the
generator's state), which each checkpoint saves, so that a resumed run reads on exactly as the uninterrupted one.
A stream is read once: one that ends before the run's last step ends the run, saying how many rows it held.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import datasets
import pyarrow
import torch
import torch.distributed as dist
from datasets.distributed import split_dataset_by_node

from ifcl.data import (
    FRATERNAL,
    SHUFFLE_BUFFER_SIZE,
    DataFormatError,
    as_text,
    canonical_rows,
    check_columns,
    check_text_row,
    format_error,
    iter_lines,
    json_lines,
    load_train_dataset,
    load_trans_de_en_dataset,
    parse_train_txt_line,
    shard_paths,
    wanted_columns,
)
from ifcl.files import STREAM_STATE_FILE, write_json_atomically
from ifcl.hub import hub_reachable

logger = logging.getLogger(__name__)


class StreamEnded(ValueError):
    """A stream that ended before the training it was to feed."""


def read_shards(shards: list[str], columns: dict[str, str]) -> Iterator[dict[str, str]]:
    """Rows of each shard in turn, as ``{canonical name: text}`` of ``columns`` (canonical name → the shard's column;
    a ``.txt`` shard's are its fields): ``datasets.IterableDataset.from_generator`` hands each process its shards.
    A ``.txt`` line as the memory-mapped route reads it (a bad one names the shard and line); a table's row with an
    empty cell left out, counted in a warning at the end of its shard."""
    for shard in shards:
        extension = os.path.splitext(shard)[1].lower()
        if extension == ".txt":
            for number, line in iter_lines(shard):
                row = parse_train_txt_line(shard, number, line, with_fraternal=len(columns) > 1)
                if row is not None:
                    yield dict(zip(columns, row))
            continue
        dropped = 0
        for cells in table_rows(shard, list(columns.values())):
            texts = {name: as_text(cells[source]) for name, source in columns.items()}
            if all(texts.values()):
                yield texts
            else:
                dropped += 1
        if dropped:
            logger.warning("%s: dropped %d row(s) with an empty sentence or translation", shard, dropped)


# datasets' own builder of each kind of table shard, as the memory-mapped route reads such files.
TABLE_BUILDERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


@contextlib.contextmanager
def builders_quiet() -> Iterator[None]:
    """datasets' builders log the error of a shard they cannot parse before raising it; :func:`table_rows` names the
    shard itself, in one line."""
    builders = logging.getLogger("datasets.packaged_modules")
    level = builders.level
    builders.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        builders.setLevel(level)


def table_rows(shard: str, wanted: list[str]) -> Iterator[dict[str, Any]]:
    """The rows of a CSV, JSON Lines or Parquet shard, streamed by datasets' own builder (:data:`TABLE_BUILDERS`),
    its columns checked for ``wanted``; a shard the builder cannot parse is named in one line: for JSON Lines, with
    its first line that is not a JSON object (:func:`json_lines`); else with the builder's words (CSV's name the
    line)."""
    builder = TABLE_BUILDERS[os.path.splitext(shard)[1].lower()]
    try:
        with builders_quiet():
            rows = datasets.load_dataset(builder, data_files=shard, split="train", streaming=True)
            for number, row in enumerate(rows):
                if number == 0:
                    check_columns(shard, wanted, list(row))
                yield row
    except DataFormatError:
        raise
    except (pyarrow.ArrowException, ValueError) as error:
        if builder == "json":
            for _ in json_lines(shard, ()):  # names the first line that is not a JSON object
                pass
        kind = {"csv": "CSV", "json": "JSON Lines", "parquet": "Parquet"}[builder]
        raise format_error(shard, f"cannot be read as {kind} ({str(error).splitlines()[0]})") from None


def file_source(patterns: str | Sequence[str], columns: dict[str, str]) -> datasets.IterableDataset:
    """The rows of local shards as a ``datasets.IterableDataset`` of one shard per file (:func:`read_shards`)."""
    shards = shard_paths(patterns)
    return datasets.IterableDataset.from_generator(read_shards, gen_kwargs={"shards": shards, "columns": columns})


def hub_source(name: str, config: str | None, split: str, columns: dict[str, str]) -> datasets.IterableDataset:
    """The rows of a Hub dataset (or a local dataset folder), streamed, under their canonical names; a Hub id while
    the Hub cannot be reached is named in one line before anything is read."""
    if not os.path.exists(name) and not hub_reachable():
        raise ConnectionError(
            f"--dataset_name {name} --streaming: the Hub cannot be reached (offline, or HF_HUB_OFFLINE is set), and a "
            "stream is read from it as training goes; give local shards with --train_file, or train where it can be."
        )
    stream = datasets.load_dataset(name, config, split=split, streaming=True)
    source = f"--dataset_name {name} ({split})"

    def canonical(row: dict[str, Any]) -> dict[str, str]:  # as the memory-mapped route reads a table's rows
        check_columns(
            source, columns.values(), sorted(row), hint=" (--sentence_column and --fraternal_column name them)"
        )
        return {canonical_name: as_text(row[column]) for canonical_name, column in columns.items()}

    return stream.map(canonical, remove_columns=list(stream.column_names or []) or None).filter(
        lambda row: all(row.values())
    )


class TrainingStream(torch.utils.data.IterableDataset):
    """Training rows read once from ``source`` (a ``datasets.IterableDataset``), shuffled in a buffer of
    ``shuffle_buffer_size`` rows by a generator seeded with ``seed`` (0 or 1: in the source's order), each checked
    for ``columns`` (None: as it comes) and tokenized as it leaves the buffer (``IFCLTrainer`` gives the stream its objective's columns and tokenizer:
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
        columns: Sequence[str] | None = None,
    ) -> None:
        if (
            isinstance(shuffle_buffer_size, bool)
            or not isinstance(shuffle_buffer_size, int)
            or shuffle_buffer_size < 0
        ):
            raise ValueError(f"shuffle_buffer_size must be a whole number ≥ 0, got {shuffle_buffer_size!r}.")
        self.source, self.shuffle_buffer_size, self.seed, self.name = source, shuffle_buffer_size, seed, name
        self.columns = None if columns is None else tuple(columns)  # checked and kept; None: each row as it comes
        self.transform: Callable[[dict[str, list[str]]], dict[str, list]] | None = None
        self.buffer: list[dict[str, str]] = []
        self.random = random.Random(seed)
        self.rows_read = 0  # rows taken from the source by this process

    @classmethod
    def from_files(cls, patterns: str | Sequence[str], columns: dict[str, str], **options: Any) -> TrainingStream:
        """The stream of local shards (:func:`file_source`), named by ``patterns``."""
        shown = patterns if isinstance(patterns, str) else " ".join(patterns)
        return cls(file_source(patterns, columns), name=f"--train_file {shown}", columns=list(columns), **options)

    @classmethod
    def from_hub(cls, name: str, config: str | None, split: str, columns: dict[str, str], **options) -> TrainingStream:
        """The stream of a Hub dataset (:func:`hub_source`)."""
        source = hub_source(name, config, split, columns)
        return cls(source, name=f"--dataset_name {name} ({split})", columns=list(columns), **options)

    def for_process(self, rank: int, world_size: int) -> TrainingStream:
        """This stream's part for process ``rank`` of ``world_size``: its own shards, or its own rows where the
        shards do not divide among the processes; its buffer seeded apart from the others'."""
        if world_size <= 1:
            return self

        source = split_dataset_by_node(self.source, rank=rank, world_size=world_size)
        part = TrainingStream(source, self.shuffle_buffer_size, self.seed + rank, self.name, self.columns)
        part.transform = self.transform
        return part

    def set_transform(
        self, columns: Sequence[str], transform: Callable[[dict[str, list[str]]], dict[str, list]]
    ) -> None:
        """Check each row for ``columns`` (non-empty text), and tokenize each batch by ``transform`` (columns of text
        → columns of features) as it leaves (:meth:`batches`)."""
        self.columns, self.transform = tuple(columns), transform

    def checked(self, row: dict[str, Any]) -> dict[str, str]:
        """The row's text columns, each a non-empty string, or ``ValueError`` naming the row and column."""
        if self.columns is None:
            return row
        check_text_row(row, self.columns, f"{self.name}: row {self.rows_read} of this process's part")
        return {column: row[column] for column in self.columns}

    def __iter__(self) -> Iterator[dict[str, str]]:
        """The text rows, from where the stream is (a loaded state included): each row read takes a random place in
        the full buffer and sends out the row that held it; at the source's end, the buffer's rows in random order."""
        for row in self.source:
            self.rows_read += 1
            row = self.checked(row)
            if len(self.buffer) < max(self.shuffle_buffer_size, 1):
                self.buffer.append(row)
                continue
            place = self.random.randrange(len(self.buffer))
            row, self.buffer[place] = self.buffer[place], row
            yield row
        while self.buffer:
            place = self.random.randrange(len(self.buffer))
            row, self.buffer[place] = self.buffer[place], self.buffer[-1]
            self.buffer.pop()
            yield row

    def batches(self, size: int) -> Iterator[list[dict[str, Any]]]:
        """Full batches of ``size`` rows, each tokenized at once as it leaves (:meth:`set_transform`: one tokenizer
        call a column, not one a row); a last, shorter one is left out, as no process may train on fewer rows."""
        transform = self.transform or (lambda batch: batch)
        rows: list[dict[str, str]] = []
        for row in self:
            rows.append(row)
            if len(rows) == size:
                features = transform({column: [row[column] for row in rows] for column in rows[0]})
                rows = []
                yield [dict(zip(features, values)) for values in zip(*features.values())]

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
        """Write :meth:`state_dict` into ``checkpoint`` as this process's ``ifcl.files.STREAM_STATE_FILE``."""
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


def load_training_text(data_args, needs_fraternal: bool, seed: int) -> datasets.Dataset | TrainingStream:
    """``run_ifcl.py``'s training text, from its ``DataArguments``: with ``--streaming`` a :class:`TrainingStream` of
    --train_file's shards or --dataset_name, its buffer seeded with ``seed``; else a Dataset of --train_file,
    --dataset_name or trans-de-en, memory-mapped. Columns sentence[, fraternal]; ``--max_train_samples`` the first
    rows of either."""
    fraternal_column = data_args.fraternal_column if needs_fraternal else None
    columns = wanted_columns(data_args.sentence_column, fraternal_column)
    samples = data_args.max_train_samples
    if data_args.streaming:
        options = {"shuffle_buffer_size": data_args.shuffle_buffer_size, "seed": seed}
        if data_args.train_file is not None:
            stream = TrainingStream.from_files(data_args.train_file, columns, **options)
        elif data_args.dataset_name is not None:
            name, config, split = data_args.dataset_name, data_args.dataset_config_name, data_args.dataset_split
            stream = TrainingStream.from_hub(name, config, split, columns, **options)
        else:
            raise ValueError("--streaming reads --train_file (shards) or --dataset_name; give one of them.")
        if samples is not None:
            stream.source = stream.source.take(samples)
        logger.info(f"{stream.name}: read as a stream, shuffled in a buffer of {stream.shuffle_buffer_size} rows")
        return stream
    if data_args.train_file is not None:
        dataset = load_train_dataset(data_args.train_file, data_args.sentence_column, fraternal_column)
    elif data_args.dataset_name is not None:
        table = datasets.load_dataset(
            data_args.dataset_name, data_args.dataset_config_name, split=data_args.dataset_split
        )
        dataset = canonical_rows(
            table, f"--dataset_name {data_args.dataset_name} ({data_args.dataset_split})", columns
        )
    else:
        dataset = load_trans_de_en_dataset()
        dataset = dataset if needs_fraternal else dataset.remove_columns(FRATERNAL)
    if samples is not None:
        dataset = dataset.select(range(min(samples, len(dataset))))
    logger.info(f"{len(dataset)} training sentences")
    return dataset


class StreamBatches:
    """What ``IFCLTrainer`` trains on from a stream: its :meth:`TrainingStream.batches` of ``batch_size``, made tensors
    by ``collate``, read in the training process (nothing read ahead, so that the stream's place at a checkpoint is
    the training's), and taken by every process or none: in several processes each batch is agreed on (one
    all-reduce of a flag and a count), so that a stream that ends in one process ends the run in all, with
    :meth:`TrainingStream.ended` naming the rows they held, instead of leaving the others waiting.
    ``rows_needed``: the run's steps × its global batch."""

    def __init__(
        self, stream: TrainingStream, batch_size: int, collate: Callable, rows_needed: int, device: torch.device
    ) -> None:
        self.stream, self.batch_size, self.collate = stream, batch_size, collate
        self.rows_needed, self.device = rows_needed, device

    def __iter__(self) -> Iterator[Any]:

        world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        batches = self.stream.batches(self.batch_size)
        while True:
            rows = next(batches, None)
            have_one, rows_read = int(rows is not None), self.stream.rows_read
            if world_size > 1:
                agreed = torch.tensor([have_one, rows_read], dtype=torch.int64, device=self.device)
                dist.all_reduce(agreed)
                have_one, rows_read = int(agreed[0]) // world_size, int(agreed[1])
            if not have_one:
                raise self.stream.ended(self.rows_needed, rows_read)
            yield self.collate(rows)
