"""Translate a file of sentences into IFCL training pairs (``sentence<TAB>translation``, one per line): the code of
``prepare_fraternal.py``; docs/translation.md gives how the work is kept in chunks, shards and a manifest."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import shutil
import sys
import time
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from accelerate import PartialState
from accelerate.utils import broadcast_object_list
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoModelForSeq2SeqLM, HfArgumentParser

import ifcl.ctranslate2_engine as ctranslate2_engine
from ifcl.arguments import check_within, command_line
from ifcl.ctranslate2_engine import (
    COMPUTE_TYPES,
    MADE_BY,
    EngineSettingsError,
)
from ifcl.data import DataFormatError, file_sha256, iter_lines
from ifcl.failures import Interrupted, RunFailure, failures_of_the_run, run_command
from ifcl.files import atomic_path, check_model_path, exclusive_lock, read_json, write_json_atomically
from ifcl.processes import log_to_stdout
from modeling_ifcl import load_tokenizer

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
# The arguments that say where and how much, not how to translate: every other one is in the manifest, and shards
# made with other values are not joined with this run's.
NOT_IN_MANIFEST = ("input_file", "output_file", "ct2_model_dir", "device", "max_sentences", "overwrite_output_file")
SHOWN_EMPTY_LINES = 10  # how many input line numbers a log line about empty translations names
DEFAULT_MAX_LENGTH = 128  # --max_length when not given (lowered to the model's positions where they are fewer)
# Config attributes that count a model's absolute positions, encoder side and decoder side, the first one set wins
# (Marian, M2M100/NLLB, mBART, FSMT: max_position_embeddings; LED: its own two). Relative positions (T5) have none:
# the n_positions of T5 configs is no limit, and is not read.
ENCODER_POSITION_ATTRIBUTES = ("max_encoder_position_embeddings", "max_source_positions", "max_position_embeddings")
DECODER_POSITION_ATTRIBUTES = ("max_decoder_position_embeddings", "max_target_positions", "max_position_embeddings")

# Characters that would break a `sentence<TAB>translation` line: the tab, and everything str.splitlines splits on.
_FIELD_BREAKERS = "\t\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
# The breakers become spaces; every other control character (NUL, escapes, DEL: Unicode's Cc) is dropped.
_CONTROL_CHARACTERS = [chr(code) for code in (*range(0x20), *range(0x7F, 0xA0))]
_FIELD_CLEANUP = str.maketrans(
    {c: " " if c in _FIELD_BREAKERS else None for c in [*_CONTROL_CHARACTERS, *_FIELD_BREAKERS]}
)
_NOT_TEXT_CATEGORIES = ("Cc", "Cf")  # control and format characters (NUL, escapes, zero-width spaces): no text


class SettingsError(ValueError):
    """Impossible settings, or settings that do not fit the chosen model."""


@dataclass
class PrepareFraternalArguments:
    """Which sentences to translate, with which model, into which file (docs/translation.md has the details)."""

    input_file: str = field(metadata={"help": "UTF-8 text, one sentence a line; empty lines are skipped."})
    output_file: str = field(metadata={"help": "The 'sentence<TAB>translation' .txt file to write or continue."})
    model_name_or_path: str = field(metadata={"help": "Translation model (Hub id or folder)."})
    source_lang: str | None = field(default=None, metadata={"help": "Source language: English (T5), eng_Latn (NLLB)."})
    target_lang: str | None = field(default=None, metadata={"help": "Target language (NLLB: deu_Latn; Marian: deu)."})
    prefix: str | None = field(
        default=None, metadata={"help": "Text put before each sentence ('' for none). Default: the model's."}
    )
    engine: Literal["transformers", "ctranslate2"] = field(
        default="transformers",
        metadata={"help": "ctranslate2 is faster: pip install -e '.[ctranslate2]' in this checkout."},
    )
    ct2_model_dir: str | None = field(
        default=None, metadata={"help": "ctranslate2: the converted model. Default: <output folder>/<model>-ct2."}
    )
    compute_type: str | None = field(
        default=None, metadata={"help": f"ctranslate2: {', '.join(COMPUTE_TYPES)}. Default: --dtype's type."}
    )
    batch_size: int = field(default=32, metadata={"help": "Sentences per batch."})
    max_batch_tokens: int | None = field(default=None, metadata={"help": "Most source tokens per batch (padded)."})
    batches_per_chunk: int = field(default=16, metadata={"help": "Batches per chunk: sorted by length, kept whole."})
    max_length: int | None = field(
        default=None, metadata={"help": f"Max tokens in and out. Default: {DEFAULT_MAX_LENGTH} or the model's limit."}
    )
    num_beams: int | None = field(default=None, metadata={"help": "Beam width. Default: the model's."})
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = field(
        default="auto", metadata={"help": "Weights' type. auto: bfloat16 on a GPU that supports it, else float32."}
    )
    device: str | None = field(default=None, metadata={"help": "cuda, cuda:1, mps, cpu... Default: a GPU if present."})
    max_sentences: int | None = field(default=None, metadata={"help": "Translate only the first N input sentences."})
    overwrite_output_file: bool = field(default=False, metadata={"help": "Start over; replace the output when done."})

    def __post_init__(self) -> None:
        counts = ("batch_size", "max_batch_tokens", "batches_per_chunk", "max_length", "num_beams", "max_sentences")
        try:
            check_within(self, "[1, inf)", *counts)
        except ValueError as error:
            raise SettingsError(str(error)) from None
        check_model_path("--model_name_or_path", self.model_name_or_path)
        if self.engine != "ctranslate2":
            for name in ("ct2_model_dir", "compute_type"):
                if getattr(self, name) is not None:
                    raise SettingsError(
                        f"--{name}: only for --engine ctranslate2 (the transformers engine takes --dtype)."
                    )
        elif self.compute_type is not None and self.compute_type not in COMPUTE_TYPES:
            raise SettingsError(f"--compute_type {self.compute_type}: not one of {', '.join(COMPUTE_TYPES)}.")
        if os.path.splitext(self.output_file)[1].lower() != ".txt":
            raise SettingsError(
                f"--output_file {self.output_file}: must end in .txt, the extension run_ifcl.py reads as "
                "'sentence<TAB>translation' lines."
            )
        if os.path.exists(self.input_file) and os.path.realpath(self.input_file) == os.path.realpath(self.output_file):
            raise SettingsError(f"--input_file and --output_file are the same file: {self.input_file}")


@dataclass(frozen=True, slots=True)
class InputSentence:
    """A sentence of the input file, cleaned for the output, with its 1-based line number."""

    line_number: int
    text: str


@dataclass
class Plan:
    """What a run does, decided by the main process with the output locked, before anything is changed."""

    work_folder: str
    manifest: dict[str, Any]  # what the shards are made from (written into the work folder)
    start_over: bool  # the work folder is made anew (none yet, or one that --overwrite_output_file starts over)
    chunks: list[range]  # the sentences the run adds to the output, chunk by chunk, in input order
    todo: list[range]  # the chunks without a finished shard
    kept_lines: int = 0  # the lines of the existing output that the new one begins with (continuing it)
    kept_bytes: int = 0


@dataclass
class PrepareSummary:
    """What a run found and did."""

    input_sentences: int
    empty_input_lines: int
    control_input_lines: int = 0  # input lines skipped because they hold only control characters (a lone NUL)
    already_translated: int = 0  # sentences translated before this run (in the output, or in finished shards)
    translated: int = 0  # sentences this run sent to the model (all processes)
    empty_translations: int = 0  # sentences left out of the output because their translation came out empty
    output_lines: int = 0  # lines the output holds at the end


def clean_field(text: str) -> str:
    """``text`` as one field of a ``sentence<TAB>translation`` line: tabs and line breaks become spaces, other control
    characters (a NUL inside a sentence) are dropped, stripped."""
    return text.translate(_FIELD_CLEANUP).strip()


def is_sentence(text: str) -> bool:
    """Whether ``text`` holds something printable: a character that is neither whitespace nor a control or format
    character. A line of NULs or escape codes is no sentence."""
    return any(not c.isspace() and unicodedata.category(c) not in _NOT_TEXT_CATEGORIES for c in text)


def input_sentences(input_file: str) -> Iterator[InputSentence]:
    """The input's lines that hold a sentence, cleaned, read as a stream: empty lines and lines of control
    characters only are skipped (the same in every pass, so resumed runs number the sentences alike)."""
    for line_number, line in iter_lines(input_file):
        text = clean_field(line)
        if is_sentence(text):
            yield InputSentence(line_number, text)


def check_input(input_file: str) -> tuple[int, int, int]:
    """One pass over the input: its sentences, its empty lines and its lines of control characters only, counted;
    invalid UTF-8 named with its line, an input without sentences refused."""
    if not os.path.isfile(input_file):
        raise FileNotFoundError(f"input file not found: {input_file}")
    line_count = sentences = control_lines = 0
    for line_count, line in iter_lines(input_file):  # numbered from 1: the last number is the count
        if is_sentence(clean_field(line)):
            sentences += 1
        elif line.strip():  # something, but no printable character
            control_lines += 1
    if not sentences:
        raise DataFormatError(
            f"{input_file}: no sentences (the file is empty or has only empty lines or control characters)"
        )
    return sentences, line_count - sentences - control_lines, control_lines


def sentences_of(input_file: str, chunks: Sequence[range]) -> Iterator[tuple[range, list[InputSentence]]]:
    """Each of ``chunks`` (ranges of sentence indices, in input order) with its sentences, read as a stream."""
    wanted = iter(chunks)
    chunk = next(wanted, None)
    sentences: list[InputSentence] = []
    for index, sentence in enumerate(input_sentences(input_file)):
        if chunk is None:
            return
        if index in chunk:
            sentences.append(sentence)
            if index == chunk.stop - 1:
                yield chunk, sentences
                chunk, sentences = next(wanted, None), []
    if chunk is not None:
        raise DataFormatError(f"{input_file}: fewer sentences than when the run began (was it changed meanwhile?)")


def count_finished_lines(output_file: str, input_file: str) -> tuple[int, int, int]:
    """Check an existing output against the input: its complete lines, their length in bytes, and how many
    sentences of the input they cover. Each line must hold a sentence of the input, in input order (those between
    came out empty), else DataFormatError names both files and lines. An unfinished last line is not counted."""
    sentences = enumerate(input_sentences(input_file))
    lines = size = covered = 0
    way_on = "Choose another --output_file or pass --overwrite_output_file."
    with open(output_file, "rb") as handle:
        for raw_line in handle:
            if not raw_line.endswith(b"\n"):
                logger.warning(f"{output_file}: the last line is unfinished (no line break); it is left out")
                break
            where = f"{output_file}: line {lines + 1}"
            try:
                sentence, translation = raw_line[:-1].decode("utf-8").split("\t")
            except ValueError:  # not UTF-8, or not exactly one tab
                sentence = translation = ""
            if not translation.strip():
                raise DataFormatError(
                    f"{where}: expected 'sentence<TAB>translation' in UTF-8 with a non-empty translation; the file "
                    f"was not written by prepare_fraternal.py. {way_on}"
                )
            first = next(sentences, None)
            if first is None:
                raise DataFormatError(
                    f"{where}: the output has more lines than {input_file} has sentences; it was made from another "
                    f"input. {way_on}"
                )
            found = next((i for i, expected in itertools.chain([first], sentences) if expected.text == sentence), None)
            if found is None:
                raise DataFormatError(
                    f"{where}: sentence {sentence!r} differs from sentence {first[0] + 1} of {input_file} (line "
                    f"{first[1].line_number}: {first[1].text!r}) and from every later one; the output was made "
                    f"from another input. {way_on}"
                )
            lines, size, covered = lines + 1, size + len(raw_line), found + 1
    return lines, size, covered


def language_token_id(tokenizer: Any, code: str) -> int | None:
    """Id of the token that stands for language ``code`` (NLLB ``deu_Latn``, M2M100 ``de``, mBART ``de_DE``)."""
    if hasattr(tokenizer, "get_lang_id"):  # M2M100: "de" is the token "__de__"
        try:
            return tokenizer.get_lang_id(code)
        except KeyError:
            return None
    return tokenizer.get_vocab().get(code)


def set_up_languages(tokenizer: Any, args: PrepareFraternalArguments) -> int | None:
    """For models with language codes (their tokenizer has ``src_lang``: M2M100, NLLB, mBART): set
    ``tokenizer.src_lang``, return the target's forced first token id."""
    if not hasattr(tokenizer, "src_lang"):
        return None
    examples = "(NLLB: eng_Latn, deu_Latn; M2M100: en, de; mBART-50: en_XX, de_DE)"
    if args.source_lang is None or args.target_lang is None:
        raise SettingsError(
            f"{args.model_name_or_path} translates between language codes: pass --source_lang and --target_lang "
            f"{examples}."
        )
    for option, code in (("--source_lang", args.source_lang), ("--target_lang", args.target_lang)):
        if language_token_id(tokenizer, code) is None:
            raise SettingsError(f"{option} {code}: not a language code of {args.model_name_or_path} {examples}.")
    tokenizer.src_lang = args.source_lang
    return language_token_id(tokenizer, args.target_lang)


def resolve_prefix(config: Any, tokenizer: Any, args: PrepareFraternalArguments) -> str:
    """The text put before each sentence: ``--prefix`` if given, else what the model's kind expects."""
    if args.prefix is not None:
        return args.prefix
    model_type = getattr(config, "model_type", None)
    source, target = args.source_lang, args.target_lang
    if model_type == "t5":
        if source is None or target is None:
            logger.warning(
                "T5 needs a task prefix: pass --source_lang English --target_lang German (or --prefix); "
                "translating without one."
            )
            return ""
        task = (getattr(config, "task_specific_params", None) or {}).get(f"translation_{source}_to_{target}", {})
        return task.get("prefix") or f"translate {source} to {target}: "
    if model_type == "marian" and target is not None and f">>{target}<<" in tokenizer.get_vocab():
        return f">>{target}<< "
    return ""


def select_device(device_name: str | None) -> Any:
    """The torch device to translate on: ``--device`` if this machine has it (else SettingsError naming the devices
    there are), or a GPU when present."""
    available = ["cpu"]
    if torch.cuda.is_available():
        available += [f"cuda:{index}" for index in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        available.append("mps")
    if device_name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "mps" if "mps" in available else "cpu")
    try:
        device = torch.device(device_name)
    except RuntimeError:  # "Expected one of cpu, cuda, ... device type at start of device string: gpu"
        raise SettingsError(
            f"--device {device_name}: not a device name torch understands (cpu, cuda, cuda:1, mps...); this machine "
            f"has {', '.join(available)}."
        ) from None
    indexed = {name if ":" in name else f"{name}:0" for name in available}  # "cuda" is cuda:0, "mps" mps:0
    if device.type == "cpu" or f"{device.type}:{device.index or 0}" in indexed:
        return device
    reason = ""
    if device.type == "cuda" and not torch.cuda.is_available():
        reason = " (this torch is built without CUDA)" if torch.version.cuda is None else " (no CUDA GPU found)"
    raise SettingsError(
        f"--device {device_name}: not on this machine{reason}; it has {', '.join(available)}. Pass one of them, "
        "or leave --device out for a GPU when there is one."
    )


def resolve_device_and_dtype(device_name: str | None, dtype_name: str) -> tuple[Any, Any]:
    """The torch device (``select_device``) and weights' dtype (auto: bfloat16 on capable GPUs)."""
    device = select_device(device_name)
    if dtype_name == "auto":
        dtype_name = "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    return device, getattr(torch, dtype_name)


def position_limit(config: Any) -> int | None:
    """The most tokens the model reads and writes (sentences are truncated to ``--max_length`` tokens, and the
    decoder reads as many): the fewer of its encoder's and decoder's absolute positions (an EncoderDecoderModel's
    from their own configs); None where the config gives none (T5's relative positions)."""

    def first_set(part: str, names: Sequence[str]) -> int | None:
        part_config = getattr(config, part, None)
        if not hasattr(part_config, "model_type"):  # not an EncoderDecoderConfig: the config speaks for both
            part_config = config
        values = [getattr(part_config, name, None) for name in names]
        return next((value for value in values if isinstance(value, int) and value > 0), None)

    limits = [first_set("encoder", ENCODER_POSITION_ATTRIBUTES), first_set("decoder", DECODER_POSITION_ATTRIBUTES)]
    known = [limit for limit in limits if limit is not None]
    return min(known) if known else None


def resolve_max_length(max_length: int | None, config: Any, model_name_or_path: str) -> int:
    """``--max_length`` within the model's positions (``position_limit``), else SettingsError; not given: the
    default, lowered (with a log line) to the model's positions where they are fewer."""
    limit = position_limit(config)
    if max_length is None:
        if limit is not None and limit < DEFAULT_MAX_LENGTH:
            logger.info(
                f"--max_length {limit}: {model_name_or_path} has {limit} positions, fewer than the default "
                f"{DEFAULT_MAX_LENGTH}"
            )
            return limit
        return DEFAULT_MAX_LENGTH
    if limit is not None and max_length > limit:
        raise SettingsError(
            f"--max_length {max_length}: more than the {limit} positions of {model_name_or_path}, which reads and "
            f"writes at most {limit} tokens; pass --max_length {limit} or less, or leave it out "
            f"({min(limit, DEFAULT_MAX_LENGTH)})."
        )
    return max_length


def check_settings(
    args: PrepareFraternalArguments, config_required: bool = False
) -> tuple[PrepareFraternalArguments, Any]:
    """Work out the settings derived from the arguments, once, and check them before the output is locked, with
    neither tokenizer nor weights loaded: ``--device`` checked, ``--dtype`` resolved (auto: for that device), the
    compute type that ``--engine ctranslate2`` will use (``--compute_type``, else the dtype), ``--max_length`` against
    the model's config, and the engine's settings. Returns the arguments with those settings resolved (what the
    manifest records and the model is loaded with) and the config. A config that cannot be read is None here and
    reported when the model loads, only if there is something to translate (``config_required``: raised at once)."""
    _, dtype = resolve_device_and_dtype(args.device, args.dtype)
    resolved: dict[str, Any] = {"dtype": str(dtype).removeprefix("torch.")}
    if args.engine == "ctranslate2":
        resolved["compute_type"] = args.compute_type or resolved["dtype"]
    try:
        config = AutoConfig.from_pretrained(args.model_name_or_path, trust_remote_code=False)
    except (OSError, ValueError):
        if config_required:
            raise
        config = None
    else:
        resolved["max_length"] = resolve_max_length(args.max_length, config, args.model_name_or_path)
    compute_type_given = args.compute_type is not None
    args = dataclasses.replace(args, **resolved)
    check_engine(args, config, compute_type_given)
    return args, config


class Translator:
    """A sequence-to-sequence model and its tokenizer, set up for one translation direction."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        prefix: str = "",
        max_length: int = DEFAULT_MAX_LENGTH,
        num_beams: int | None = None,
        forced_bos_token_id: int | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.prefix = prefix
        self.max_length = max_length
        self.generation_kwargs: dict[str, int] = {"max_new_tokens": max_length}
        if num_beams is not None:
            self.generation_kwargs["num_beams"] = num_beams
        if forced_bos_token_id is not None:
            self.generation_kwargs["forced_bos_token_id"] = forced_bos_token_id

    @classmethod
    def from_arguments(cls, args: PrepareFraternalArguments, state: Any = None, config: Any = None) -> Any:
        """Load the tokenizer and check the language settings, then load the model on its device (under ``accelerate
        launch``, ``cuda`` is each process's own GPU); ``--engine ctranslate2`` gives a ``CTranslate2Translator``.
        ``args`` and ``config`` are as ``check_settings`` returns them; without ``config`` it is run here."""
        state = state or PartialState()
        if config is None:  # a direct call, or a config that could not be read when the settings were checked
            args, config = check_settings(args, config_required=True)
        device, dtype = select_device(args.device), getattr(torch, args.dtype)
        if device.type == "cuda" and device.index is None and state.num_processes > 1:
            device = state.device
        tokenizer = load_tokenizer(args.model_name_or_path)  # a folder without one is refused
        forced_bos_token_id = set_up_languages(tokenizer, args)
        prefix = resolve_prefix(config, tokenizer, args)
        if forced_bos_token_id is None and not prefix and (args.source_lang or args.target_lang):
            logger.info(f"{args.model_name_or_path} translates one direction: --source_lang/--target_lang unused")
        if args.engine == "ctranslate2":
            model_dir = ct2_model_dir_of(args)
            with state.main_process_first():  # the main process converts the model (once), the others wait
                if state.is_main_process:
                    ctranslate2_engine.prepare_model_dir(model_dir, args.model_name_or_path)
            return ctranslate2_engine.CTranslate2Translator(
                model_dir,
                config,
                tokenizer,
                prefix,
                args.max_length,
                args.num_beams,
                forced_bos_token_id,
                device,
                args.compute_type,
            )
        model = AutoModelForSeq2SeqLM.from_pretrained(
            args.model_name_or_path, config=config, dtype=dtype, trust_remote_code=False
        )
        model.to(device).eval()
        logger.info(
            f"Translating with {args.model_name_or_path} on {device} ({dtype}); prefix {prefix!r}"
            + (f", target language token {args.target_lang}" if forced_bos_token_id is not None else "")
        )
        return cls(model, tokenizer, prefix, args.max_length, args.num_beams, forced_bos_token_id)

    def translate_batch(self, sentences: list[str]) -> list[str]:
        """Translations of ``sentences``, in their order (one generate call)."""
        encoded = self.tokenizer(
            [self.prefix + sentence for sentence in sentences],
            padding=True,
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )
        inputs = {name: encoded[name].to(self.model.device) for name in ("input_ids", "attention_mask")}
        with torch.inference_mode():
            output_ids = self.model.generate(**inputs, **self.generation_kwargs)
        return self.tokenizer.batch_decode(output_ids, skip_special_tokens=True)

    def translate_batches(self, batches: Sequence[list[str]]) -> Iterator[list[str]]:
        """Translations of each batch in turn (one generate call each)."""
        for batch in batches:
            yield self.translate_batch(batch)


def ct2_model_dir_of(args: PrepareFraternalArguments) -> str:
    """``--ct2_model_dir``, or by default ``<output folder>/<model name>-ct2``."""
    if args.ct2_model_dir is not None:
        return args.ct2_model_dir
    name = os.path.basename(os.path.normpath(args.model_name_or_path)) or "model"
    return os.path.join(os.path.dirname(os.path.abspath(args.output_file)), f"{name}-ct2")


def check_engine(args: PrepareFraternalArguments, config: Any = None, compute_type_given: bool = True) -> None:
    """``--engine ctranslate2``: installed, a CPU or CUDA device, the compute type it will use (``args`` as
    ``check_settings`` resolves them; ``compute_type_given``: from ``--compute_type``, else from ``--dtype``) one it
    has there, and (when the model's ``config`` could be read) a model family it converts and a ``--ct2_model_dir``
    that is free or holds this model converted by this project."""
    if args.engine != "ctranslate2":
        return

    try:
        device = select_device(args.device)
        if device.type not in ("cpu", "cuda"):
            raise SettingsError(f"--device {args.device}: CTranslate2 runs on cpu or cuda, not {device.type}.")
        setting = "--compute_type" if compute_type_given else "--dtype"
        ctranslate2_engine.check_compute_type(args.compute_type, device.type, setting)
        if config is None:
            return  # reported when the model loads, if there is something to translate
        if config.model_type not in ctranslate2_engine.SUPPORTED_MODEL_TYPES:
            raise SettingsError(
                f"--engine ctranslate2: {args.model_name_or_path} is a {config.model_type} model; this script "
                f"converts {', '.join(ctranslate2_engine.SUPPORTED_MODEL_TYPES)} (use --engine transformers)."
            )
        ctranslate2_engine.read_conversion_record(ct2_model_dir_of(args), args.model_name_or_path)
    except EngineSettingsError as error:
        raise SettingsError(str(error)) from None


def length_sorted_batches(
    texts: Sequence[str],
    batch_size: int,
    max_batch_tokens: int | None = None,
    token_counts: Sequence[int] | None = None,
) -> list[list[int]]:
    """The positions of ``texts`` in batches of ``batch_size``, longest first, so that similar lengths share a batch;
    with ``max_batch_tokens``, a batch also holds at most that many source tokens, padding included (``token_counts``
    gives each text's)."""
    order = sorted(range(len(texts)), key=lambda position: len(texts[position]), reverse=True)
    if max_batch_tokens is None:
        return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    batches: list[list[int]] = []
    longest = 0
    for position in sorted(order, key=token_counts.__getitem__, reverse=True):  # a batch's first text is its longest
        if batches and len(batches[-1]) < batch_size and (len(batches[-1]) + 1) * longest <= max_batch_tokens:
            batches[-1].append(position)
        else:
            batches.append([position])
            longest = token_counts[position]
    return batches


def source_token_counts(translator: Any, texts: Sequence[str]) -> list[int]:
    """How many tokens the translator's encoder reads for each of ``texts`` (prefix and truncation included)."""
    encoded = translator.tokenizer(
        [translator.prefix + text for text in texts], truncation=True, max_length=translator.max_length
    )
    return [len(ids) for ids in encoded["input_ids"]]


def work_folder_of(output_file: str) -> str:
    """The folder beside the output (the real file, if the output is a link) where the shards wait."""
    return os.path.realpath(output_file) + ".parts"


def shard_name(chunk: range) -> str:
    """The file of a finished chunk: its first and past-the-last sentence index (names sort in input order)."""
    return f"{chunk.start:010d}-{chunk.stop:010d}.txt"


def chunks_between(start: int, end: int, chunk_size: int) -> list[range]:
    """Sentences ``start`` to ``end`` cut at the multiples of ``chunk_size``: the same chunks for any number of
    processes and any interruption."""
    if start >= end:
        return []
    bounds = [start, *range((start // chunk_size + 1) * chunk_size, end, chunk_size), end]
    return [range(first, stop) for first, stop in zip(bounds, bounds[1:])]


def lock_output(stack: contextlib.ExitStack, output_file: str) -> None:
    """Hold the output's lock (``OUTPUT.lock``) until ``stack`` closes; SettingsError at once when another run
    holds it."""
    lock_file = os.path.realpath(output_file) + ".lock"
    os.makedirs(os.path.dirname(lock_file), exist_ok=True)
    try:
        stack.enter_context(exclusive_lock(lock_file))
    except BlockingIOError:
        raise SettingsError(
            f"--output_file {output_file}: another prepare_fraternal.py run is writing it (it holds {lock_file}); "
            "wait for it to end, or choose another --output_file."
        ) from None


def finished_shards(work_folder: str, manifest: dict[str, Any], overwrite: bool) -> set[str] | None:
    """The shard files of ``work_folder`` that this run can join (None: the folder is to be made anew). A folder
    without this project's manifest is refused and never touched; one of other settings or another input is started
    over under ``--overwrite_output_file``, else refused."""
    if not os.path.exists(work_folder):
        return None
    try:
        found = read_json(work_folder, MANIFEST)
    except (OSError, ValueError):
        found = None
    if not isinstance(found, dict) or found.get("made_by") != MADE_BY:
        raise SettingsError(
            f"{work_folder}: exists and was not made by prepare_fraternal.py (no readable {MANIFEST}); move it "
            "away, or choose another --output_file."
        )
    different = [key for key in manifest if found.get(key) != manifest[key]]
    if not different:
        return set(os.listdir(work_folder))
    if overwrite:
        return None
    key = different[0]
    raise SettingsError(
        f"{work_folder}: holds the finished chunks of an interrupted run made with another {key} ({found.get(key)!r} "
        f"there, {manifest[key]!r} now); run that command again to finish it, or pass --overwrite_output_file to "
        "start over."
    )


def plan_output(args: PrepareFraternalArguments, summary: PrepareSummary) -> Plan:
    """Main process, output locked: check the existing output against the input and the work folder against the
    settings; what is to be done. Nothing is changed yet."""
    plan = Plan(work_folder_of(args.output_file), {}, start_over=False, chunks=[], todo=[])
    start = 0
    if not args.overwrite_output_file and os.path.exists(args.output_file):
        plan.kept_lines, plan.kept_bytes, start = count_finished_lines(args.output_file, args.input_file)
    end = min(args.max_sentences or summary.input_sentences, summary.input_sentences)
    plan.chunks = chunks_between(start, end, args.batch_size * args.batches_per_chunk)
    if plan.chunks:
        plan.manifest = {
            "made_by": MADE_BY,
            "input_sha256": file_sha256(args.input_file),
            "first_sentence": start,  # where the new sentences begin: the lines of the output before them are kept
            **{name: value for name, value in dataclasses.asdict(args).items() if name not in NOT_IN_MANIFEST},
        }
        finished = finished_shards(plan.work_folder, plan.manifest, args.overwrite_output_file)
        plan.start_over = finished is None
        plan.todo = [chunk for chunk in plan.chunks if shard_name(chunk) not in (finished or set())]
    elif os.path.exists(plan.work_folder):
        logger.warning(
            f"{plan.work_folder}: left by an interrupted run that this one does not continue (nothing is left to "
            "translate here); delete it unless you mean to finish that run"
        )
    todo = sum(map(len, plan.todo))
    resumed = sum(map(len, plan.chunks)) - todo
    summary.already_translated = start + resumed
    summary.output_lines = plan.kept_lines
    logger.info(
        f"{args.input_file}: {summary.input_sentences} sentences; "
        + (
            f"{args.output_file} will be replaced once the new pairs are finished (--overwrite_output_file)"
            if args.overwrite_output_file
            else f"{args.output_file} holds {plan.kept_lines}"
        )
        + (f" (+{resumed} in {plan.work_folder} from an interrupted run)" if resumed else "")
        + f"; {todo} to translate"
    )
    return plan


def start_work_folder(plan: Plan) -> None:
    """Once the model is loaded: make the work folder with its manifest (one that is started over goes first)."""
    if not plan.start_over:
        return  # the folder of an interrupted run, continued
    if os.path.exists(plan.work_folder):
        shutil.rmtree(plan.work_folder)  # ours (it has our manifest), and --overwrite_output_file starts it over
    os.makedirs(plan.work_folder)
    write_json_atomically(os.path.join(plan.work_folder, MANIFEST), plan.manifest)


def translate_chunk(sentences: list[InputSentence], translator: Any, args: PrepareFraternalArguments) -> list[str]:
    """The translations of one chunk's sentences, in their order, made in length-sorted batches; a batch that comes
    back mostly empty means the model gives no text: RunFailure saying what to check."""
    texts = [sentence.text for sentence in sentences]
    counts = source_token_counts(translator, texts) if args.max_batch_tokens else None
    batches = length_sorted_batches(texts, args.batch_size, args.max_batch_tokens, counts)
    translations = [""] * len(texts)
    for batch, outputs in zip(batches, translator.translate_batches([[texts[i] for i in batch] for batch in batches])):
        for position, text in zip(batch, outputs, strict=True):
            translations[position] = clean_field(text)
        empty = [sentences[position].line_number for position in batch if not translations[position]]
        if 2 * len(empty) > len(batch):
            where = f"; with --engine ctranslate2, delete {ct2_model_dir_of(args)} to convert it again"
            raise RunFailure(
                f"the model output is empty: {len(empty)} of the {len(batch)} translations of a batch came out "
                f"empty (lines {format_line_numbers(empty)} of {args.input_file}). Check --model_name_or_path "
                f"{args.model_name_or_path}, --source_lang, --target_lang and --prefix"
                + (where if args.engine == "ctranslate2" else "")
                + "."
            )
    return translations


def format_line_numbers(line_numbers: Sequence[int]) -> str:
    """The first few line numbers, for a log line."""
    shown = ", ".join(map(str, line_numbers[:SHOWN_EMPTY_LINES]))
    return shown + (", ..." if len(line_numbers) > SHOWN_EMPTY_LINES else "")


def write_shard(work_folder: str, chunk: range, sentences: list[InputSentence], translations: list[str]) -> None:
    """A finished chunk as its shard file, ``sentence<TAB>translation`` a line (empty translations too), written to
    a temporary file and renamed: a shard is whole or absent."""
    with (
        atomic_path(os.path.join(work_folder, shard_name(chunk))) as temporary,
        open(temporary, "w", encoding="utf-8", newline="\n") as handle,
    ):
        handle.writelines(f"{sentence.text}\t{text}\n" for sentence, text in zip(sentences, translations))


def translate_share(
    plan: Plan, translator: Any, args: PrepareFraternalArguments, state: Any, summary: PrepareSummary
) -> None:
    """This process's chunks (the k-th, (k+N)-th, ... of those to do), each translated and written as its shard. The
    main process shows a progress bar of every process's finished shards, and the time taken."""
    started = time.perf_counter()
    sizes = {shard_name(chunk): len(chunk) for chunk in plan.todo}
    summary.translated = sum(sizes.values())  # by all processes
    total = sum(map(len, plan.chunks))
    share = plan.todo[state.process_index :: state.num_processes]
    progress = tqdm(
        total=total,
        initial=total - summary.translated,
        unit="sentence",
        desc="Translating",
        disable=not state.is_main_process,
    )
    with progress:
        for chunk, sentences in sentences_of(args.input_file, share):
            write_shard(plan.work_folder, chunk, sentences, translate_chunk(sentences, translator, args))
            done = sum(sizes.get(name, 0) for name in os.listdir(plan.work_folder))
            progress.update(total - summary.translated + done - progress.n)
    if state.is_main_process:
        logger.info(f"Translated {summary.translated} sentences in {time.perf_counter() - started:.1f} s")


def join_shards(args: PrepareFraternalArguments, plan: Plan, summary: PrepareSummary) -> None:
    """The kept lines of the output and every shard, in input order, into a temporary file that then replaces the
    output (the real file, if the output is a link); translations that came out empty are left out and named. The
    work folder goes."""
    output = os.path.realpath(args.output_file)
    empty: list[int] = []
    with atomic_path(output) as temporary:
        if plan.kept_lines:
            shutil.copyfile(output, temporary)
            os.truncate(temporary, plan.kept_bytes)
        with open(temporary, "a", encoding="utf-8", newline="\n") as joined:
            for chunk, sentences in sentences_of(args.input_file, plan.chunks):
                shard = os.path.join(plan.work_folder, shard_name(chunk))
                with open(shard, encoding="utf-8", newline="\n") as handle:
                    pairs = [line.split("\t") for line in handle.read().splitlines()]
                if len(pairs) != len(sentences) or any(pair[0] != s.text for pair, s in zip(pairs, sentences)):
                    raise DataFormatError(
                        f"{shard}: does not hold the translations of sentences {chunk.start + 1} to {chunk.stop} of "
                        f"{args.input_file}; delete it and run the same command again."
                    )
                for (sentence, translation), source in zip(pairs, sentences):
                    if translation:
                        joined.write(f"{sentence}\t{translation}\n")
                    else:
                        empty.append(source.line_number)
    shutil.rmtree(plan.work_folder)
    summary.empty_translations = len(empty)
    summary.output_lines = plan.kept_lines + sum(map(len, plan.chunks)) - len(empty)
    if empty:
        logger.warning(
            f"{len(empty)} translation(s) came out empty and are left out of {args.output_file}: lines "
            f"{format_line_numbers(empty)} of {args.input_file}"
        )


def parse_arguments(argv: list[str]) -> PrepareFraternalArguments:
    """Command line (or one .json file of arguments) → the argument dataclass."""
    parser = HfArgumentParser(PrepareFraternalArguments)
    (args,) = parser.parse_args_into_dataclasses(args=command_line(argv, parser)[0])
    return args


def prepare(args: PrepareFraternalArguments) -> PrepareSummary:
    """Check the input and the settings, lock the output and plan (main process), load the model, then translate
    this process's chunks into shards and (main process) join them into the output."""
    # 1. Everything that can be wrong with the input and the settings is found before the model is loaded.
    summary = PrepareSummary(*check_input(args.input_file))
    if summary.empty_input_lines:
        logger.warning(f"{args.input_file}: skipped {summary.empty_input_lines} empty line(s)")
    if summary.control_input_lines:
        logger.warning(
            f"{args.input_file}: skipped {summary.control_input_lines} line(s) holding only control characters"
        )
    args, config = check_settings(args)
    state = PartialState(cpu=select_device(args.device).type == "cpu")  # this process among those launched
    with contextlib.ExitStack() as stack:
        # 2. The main process locks the output and plans; the others learn the plan, or the error that stopped it.
        plan: Plan | str | None = None
        if state.is_main_process:
            try:
                lock_output(stack, args.output_file)
                plan = plan_output(args, summary)
            except (ValueError, OSError) as error:
                broadcast_object_list([str(error)])
                raise
        (plan,) = broadcast_object_list([plan])
        if isinstance(plan, str):
            raise SettingsError(plan)
        # 3. The model is loaded (when there is something to translate); only then are files changed. A model that
        # cannot be loaded is named by its path.
        try:
            translator = Translator.from_arguments(args, state, config) if plan.todo else None
        except (SettingsError, EngineSettingsError):
            raise
        except (OSError, ValueError) as error:
            raise SettingsError(
                f"--model_name_or_path {args.model_name_or_path}: cannot load the model: {error}"
            ) from error
        if state.is_main_process and plan.chunks:
            start_work_folder(plan)
        state.wait_for_everyone()
        # 4. Each process translates its chunks; the main process joins the shards into the output.
        with failures_of_the_run():
            if translator is not None:
                translate_share(plan, translator, args, state, summary)
            state.wait_for_everyone()
            if state.is_main_process and plan.chunks:
                join_shards(args, plan, summary)
    if state.is_main_process:
        logger.info(
            f"{args.output_file}: {summary.output_lines} of {summary.input_sentences} sentences with their translation"
        )
    state.destroy_process_group()  # before the interpreter ends: gloo's threads would otherwise abort it
    return summary


def run(argv: list[str]) -> PrepareSummary:
    """Parse ``argv``, set up the log, and :func:`prepare`; Ctrl-C becomes :class:`Interrupted` saying how to go on."""
    args = parse_arguments(argv)
    log_to_stdout()
    logger.setLevel(logging.INFO)
    try:
        return prepare(args)
    except KeyboardInterrupt:
        unchanged = f"{args.output_file} is unchanged; " if args.overwrite_output_file else ""
        raise Interrupted(
            f"interrupted; {unchanged}run the same command again to continue (the finished chunks are kept in "
            f"{work_folder_of(args.output_file)})."
        ) from None


def main(argv: list[str] | None = None) -> None:
    """Command-line entry: a bad input ends with ``prepare_fraternal.py: error: <message>`` and exit code 2, a
    failure once translation began with exit code 1 (the traceback with ``IFCL_DEBUG=1``); Ctrl-C says how to go on."""
    run_command("prepare_fraternal.py", lambda: run(sys.argv[1:] if argv is None else argv))
