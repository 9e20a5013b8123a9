#!/usr/bin/env python
"""Translate a file of sentences into IFCL training pairs (``sentence<TAB>translation``, one per line).

    python prepare_fraternal.py --input_file wiki1m_for_simcse.txt --output_file wiki1m_en_de.txt \\
        --model_name_or_path Helsinki-NLP/opus-mt-en-de
    python prepare_fraternal.py ... --model_name_or_path google-t5/t5-base --source_lang English --target_lang German
    python prepare_fraternal.py ... --model_name_or_path facebook/nllb-200-distilled-600M \\
        --source_lang eng_Latn --target_lang deu_Latn --batch_size 128 --dtype bfloat16

Any Hugging Face sequence-to-sequence translation model works: T5 gets its task prefix ("translate English to
German: "), M2M100/NLLB/mBART get the source language on the tokenizer and the target language as the forced first
token, multilingual Marian models get their ">>deu<< " token. Sentences are translated in length-sorted batches
and written in input order; the output is appended to and flushed after every batch, translations that are ahead
of the order wait in ``OUTPUT.pending``. Running the same command again after an interruption checks the output
against the input and translates only what is in neither file. ``run_ifcl.py --train_file OUTPUT`` reads the
result directly.

Two engines: transformers' ``generate`` (``--engine transformers``, the default) and CTranslate2 (``--engine
ctranslate2``, ``pip install "ifcl[ctranslate2]"``), which converts the model once into ``--ct2_model_dir`` and
reuses it (``--compute_type int8`` on the CPU); greedy output is the same on both. Under ``accelerate launch
--num_processes N`` each process translates its share of every round of chunks, read from the input as a stream;
the main process alone writes the output, in input order, byte for byte what one process writes.

Nothing is lost to a mistake or to a second run. The model is loaded before the output is changed in any way (even
before an unfinished last line is cut), so a mistyped ``--model_name_or_path`` stops the run with the output as it
was. ``--overwrite_output_file`` writes a new file, ``OUTPUT.new`` (with its own side file), and puts it in place of
the old output only when the run has finished: until then the old output stays as it was (an interrupted overwrite
run leaves ``OUTPUT.new`` behind; the next one starts it over). A run holds an exclusive lock (``flock``) on
``OUTPUT.lock`` from before it reads the output to its end, so a second run on the same output stops at once
instead of writing every line a second time; the lock file is removed at the end (one left by a killed run locks
nothing and is taken over).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import fcntl
import glob
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from configuration_ifcl import check_model_path
from ifcl.cli import Command
from ifcl.ctranslate2_engine import COMPUTE_TYPES
from ifcl.data import DataFormatError, _iter_lines

logger = logging.getLogger(__name__)

PENDING_SUFFIX = ".pending"
NEW_SUFFIX = ".new"  # --overwrite_output_file writes OUTPUT.new, then replaces OUTPUT with it
LOCK_SUFFIX = ".lock"
DEFAULT_MAX_LENGTH = 128  # --max_length when not given (lowered to the model's positions where they are fewer)
# Config attributes that count a model's absolute positions, encoder side and decoder side, the first one set wins
# (Marian, M2M100/NLLB, mBART, FSMT: max_position_embeddings; LED: its own two). Relative positions (T5) have none:
# the n_positions of T5 configs is no limit, and is not read.
ENCODER_POSITION_ATTRIBUTES = ("max_encoder_position_embeddings", "max_source_positions", "max_position_embeddings")
DECODER_POSITION_ATTRIBUTES = ("max_decoder_position_embeddings", "max_target_positions", "max_position_embeddings")

# Characters that would break a `sentence<TAB>translation` line: the tab, and everything str.splitlines splits on.
_FIELD_BREAKERS = "\t\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_FIELD_CLEANUP = str.maketrans({character: " " for character in _FIELD_BREAKERS})


class SettingsError(ValueError):
    """Impossible settings, or settings that do not fit the chosen model."""


@dataclass
class PrepareFraternalArguments:
    """Which sentences to translate, with which model, into which file."""

    input_file: str = field(
        metadata={"help": "UTF-8 text, one sentence per line (e.g. wiki1m_for_simcse.txt); empty lines are skipped."}
    )
    output_file: str = field(
        metadata={"help": "The .txt training file to write (or to continue): one 'sentence<TAB>translation' a line."}
    )
    model_name_or_path: str = field(
        metadata={"help": "Translation model (Hub id or folder), e.g. Helsinki-NLP/opus-mt-en-de."}
    )
    source_lang: str | None = field(
        default=None,
        metadata={"help": "Source language: a name for T5 (English), a code for NLLB (eng_Latn), M2M100 (en), "
                  "mBART-50 (en_XX)."},
    )  # fmt: skip
    target_lang: str | None = field(
        default=None,
        metadata={"help": "Target language: German for T5, deu_Latn for NLLB, de for M2M100, de_DE for mBART, deu for "
                  "a multilingual Marian model."},
    )  # fmt: skip
    prefix: str | None = field(
        default=None,
        metadata={"help": "Text put before every sentence. Default: 'translate <source> to <target>: ' for T5, "
                  "'>><target><< ' for multilingual Marian models, else none. --prefix '' for none."},
    )  # fmt: skip
    engine: Literal["transformers", "ctranslate2"] = field(
        default="transformers",
        metadata={"help": "transformers: the model's generate. ctranslate2: the model converted once for CTranslate2 "
                  "(pip install 'ifcl[ctranslate2]'), several times faster, same greedy output."},
    )  # fmt: skip
    ct2_model_dir: str | None = field(
        default=None,
        metadata={"help": "--engine ctranslate2: where the converted model is kept and reused. Default: "
                  "<output folder>/<model name>-ct2."},
    )  # fmt: skip
    compute_type: str | None = field(
        default=None,
        metadata={"help": "--engine ctranslate2: the type it computes in: int8, int8_float32, int8_float16, "
                  "int8_bfloat16, int16, float16, bfloat16, float32, default, auto. Default: --dtype's type."},
    )  # fmt: skip
    batch_size: int = field(default=32, metadata={"help": "Sentences per generate call."})
    max_batch_tokens: int | None = field(
        default=None,
        metadata={"help": "Also cap each batch at this many source tokens, padding included (batch size × longest "
                  "sentence): long sentences go in smaller batches. Default: no cap."},
    )  # fmt: skip
    batches_per_chunk: int = field(
        default=16,
        metadata={"help": "Sentences are sorted by length within chunks of this many batches (less padding); "
                  "output stays in input order."},
    )  # fmt: skip
    max_length: int | None = field(
        default=None,
        metadata={"help": f"Longer sentences are truncated to this many tokens; translations stop there. Default: "
                  f"{DEFAULT_MAX_LENGTH}, or the model's positions where they are fewer (more is refused)."},
    )  # fmt: skip
    num_beams: int | None = field(
        default=None, metadata={"help": "Beam width. Default: the model's generation config."}
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = field(
        default="auto",
        metadata={"help": "Type of the model's weights. auto: bfloat16 on a GPU that supports it, else float32."},
    )
    device: str | None = field(default=None, metadata={"help": "cuda, cuda:1, mps, cpu... Default: a GPU if present."})
    max_sentences: int | None = field(
        default=None,
        metadata={"help": "Stop after the first N sentences of the input (counting those already in the output)."},
    )
    overwrite_output_file: bool = field(
        default=False,
        metadata={"help": "Start the output over instead of continuing it: the new pairs go to OUTPUT.new, which "
                  "replaces the output only once the run has finished; until then the old output stays as it was."},
    )  # fmt: skip

    def __post_init__(self) -> None:
        for name in (
            "batch_size",
            "max_batch_tokens",
            "batches_per_chunk",
            "max_length",
            "num_beams",
            "max_sentences",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise SettingsError(f"--{name} must be ≥ 1, got {value}.")
        check_model_path("--model_name_or_path", self.model_name_or_path)
        check_engine_arguments(self)
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
class PrepareSummary:
    """What a run found and did."""

    output_file: str
    input_sentences: int
    empty_input_lines: int
    already_translated: int = 0  # lines the output held when the run started
    translated: int = 0  # sentences this run sent to the model
    empty_translations: int = 0  # lines written by this run whose translation came out empty
    output_lines: int = 0  # lines the output holds at the end


def clean_field(text: str) -> str:
    """``text`` as one field of a ``sentence<TAB>translation`` line: tabs and line breaks become spaces, stripped."""
    return text.translate(_FIELD_CLEANUP).strip()


def check_engine_arguments(args: PrepareFraternalArguments) -> None:
    """The engine's own flags: ``--ct2_model_dir`` and ``--compute_type`` only with ``--engine ctranslate2``, and a
    compute type CTranslate2 knows."""
    if args.engine != "ctranslate2":
        for name in ("ct2_model_dir", "compute_type"):
            if getattr(args, name) is not None:
                raise SettingsError(
                    f"--{name}: only for --engine ctranslate2 (the transformers engine takes --dtype)."
                )
    elif args.compute_type is not None and args.compute_type not in COMPUTE_TYPES:
        raise SettingsError(f"--compute_type {args.compute_type}: not one of {', '.join(COMPUTE_TYPES)}.")


class InputSentences:
    """The input's non-empty lines as cleaned sentences, read as a stream: a window of them is held at a time.

    Built with one pass that counts the sentences and the empty lines (and finds invalid UTF-8). ``sentences[i]``
    reads on until sentence ``i``; ``release_before(i)`` forgets those before it. Reading before the window starts
    the stream over (correct, only slower; the run never does it).
    """

    def __init__(self, input_file: str) -> None:
        if not os.path.isfile(input_file):
            raise FileNotFoundError(f"input file not found: {input_file}")
        self.input_file = input_file
        self.count = 0
        self.empty_lines = 0
        for _, line in _iter_lines(input_file):
            if clean_field(line):
                self.count += 1
            else:
                self.empty_lines += 1
        if not self.count:
            raise DataFormatError(f"{input_file}: no sentences (the file is empty or has only empty lines)")
        self._restart()

    def _restart(self) -> None:
        self._stream = (
            InputSentence(line_number, text)
            for line_number, text in ((number, clean_field(line)) for number, line in _iter_lines(self.input_file))
            if text
        )
        self._window: collections.deque[InputSentence] = collections.deque()
        self._window_start = 0

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> InputSentence:
        if not 0 <= index < self.count:
            raise IndexError(index)
        if index < self._window_start:
            self._restart()
        while index >= self._window_start + len(self._window):
            self._window.append(next(self._stream))
        return self._window[index - self._window_start]

    def release_before(self, index: int) -> None:
        """Forget the sentences before ``index``: they are written."""
        while self._window and self._window_start < index:
            self._window.popleft()
            self._window_start += 1


def read_input_sentences(input_file: str) -> tuple[InputSentences, int]:
    """The input's sentences (``InputSentences``) and the number of empty or whitespace-only lines."""
    sentences = InputSentences(input_file)
    return sentences, sentences.empty_lines


def count_finished_lines(output_file: str, sentences: Sequence[InputSentence], input_file: str) -> tuple[int, int]:
    """Check an existing output against the input: how many sentences it already holds, and their length in bytes.

    Line k of the output must be ``sentence<TAB>translation`` with sentence k of the input; anything else means the
    output belongs to another input (DataFormatError naming both files and the line). A last line without its
    line break was cut by an interruption: it is not counted, and the file is left as it is (see
    ``remove_unfinished_line``).
    """
    if not os.path.exists(output_file):
        return 0, 0
    finished = 0
    finished_bytes = 0
    with open(output_file, "rb") as handle:
        for raw_line in handle:
            if not raw_line.endswith(b"\n"):
                break  # the partial last line
            line_number = finished + 1
            where = f"{output_file}: line {line_number}"
            try:
                line = raw_line[:-1].decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataFormatError(f"{where}: not valid UTF-8 ({error.reason})") from error
            if finished >= len(sentences):
                raise DataFormatError(
                    f"{where}: the output has more lines than {input_file} has sentences ({len(sentences)}); "
                    "it was made from another input. Choose another --output_file or pass --overwrite_output_file."
                )
            fields = line.split("\t")
            if len(fields) != 2 or not fields[1].strip():
                raise DataFormatError(
                    f"{where}: expected 'sentence<TAB>translation' with a non-empty translation; "
                    "the file was not written by prepare_fraternal.py. Choose another --output_file or pass "
                    "--overwrite_output_file."
                )
            expected = sentences[finished]
            if fields[0] != expected.text:
                raise DataFormatError(
                    f"{where}: sentence {fields[0]!r} differs from sentence {line_number} of {input_file} "
                    f"(line {expected.line_number}: {expected.text!r}); the output was made from another input. "
                    "Choose another --output_file or pass --overwrite_output_file."
                )
            finished += 1
            finished_bytes += len(raw_line)
            if isinstance(sentences, InputSentences):
                sentences.release_before(finished)
    return finished, finished_bytes


def remove_unfinished_line(output_file: str, finished_bytes: int) -> None:
    """Cut what follows the ``finished_bytes`` of complete lines: a last line cut by an interruption."""
    if os.path.exists(output_file) and os.path.getsize(output_file) > finished_bytes:
        logger.warning(f"{output_file}: removing an unfinished last line (cut by an interruption)")
        os.truncate(output_file, finished_bytes)


def language_token_id(tokenizer: Any, code: str) -> int | None:
    """Id of the token that stands for language ``code`` (NLLB ``deu_Latn``, M2M100 ``de``, mBART ``de_DE``)."""
    if hasattr(tokenizer, "get_lang_id"):  # M2M100: "de" is the token "__de__"
        try:
            return tokenizer.get_lang_id(code)
        except KeyError:
            return None
    vocabulary = tokenizer.get_vocab()
    for token in (code, f"__{code}__"):
        if token in vocabulary:
            return vocabulary[token]
    return None


def uses_language_codes(tokenizer: Any) -> bool:
    """Whether the tokenizer marks the source language itself (M2M100, NLLB, mBART: they have ``src_lang``)."""
    return hasattr(tokenizer, "src_lang")


def set_up_languages(tokenizer: Any, args: PrepareFraternalArguments) -> int | None:
    """For models with language codes: set ``tokenizer.src_lang``, return the target's forced first token id."""
    if not uses_language_codes(tokenizer):
        return None
    if args.source_lang is None or args.target_lang is None:
        raise SettingsError(
            f"{args.model_name_or_path} translates between language codes: pass --source_lang and --target_lang "
            "(NLLB: eng_Latn, deu_Latn; M2M100: en, de; mBART-50: en_XX, de_DE)."
        )
    for option, code in (("--source_lang", args.source_lang), ("--target_lang", args.target_lang)):
        if language_token_id(tokenizer, code) is None:
            raise SettingsError(
                f"{option} {code}: not a language code of the tokenizer of {args.model_name_or_path} "
                "(NLLB: eng_Latn, deu_Latn; M2M100: en, de; mBART-50: en_XX, de_DE)."
            )
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


def available_devices() -> list[str]:
    """The devices this machine can translate on: the CPU, each CUDA GPU (``cuda:0``, ...), Apple's MPS."""
    import torch

    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += [f"cuda:{index}" for index in range(torch.cuda.device_count())]
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        devices.append("mps")
    return devices


def select_device(device_name: str | None) -> Any:
    """The torch device to translate on: ``--device`` if this machine has it, else a GPU when present.

    A name torch does not understand, or a device this machine lacks (CUDA on a CPU-only torch, a GPU index beyond
    those present, MPS off a Mac, any other kind of device): SettingsError naming ``--device`` and what there is.
    """
    import torch

    available = available_devices()
    if device_name is None:
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps" if "mps" in available else "cpu")
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
    import torch

    device = select_device(device_name)
    if dtype_name != "auto":
        return device, getattr(torch, dtype_name)
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return device, torch.bfloat16
    return device, torch.float32


def position_limit(config: Any) -> int | None:
    """The most tokens the model reads and writes: the fewer of its encoder's and its decoder's absolute positions
    (an EncoderDecoderModel's from their own configs); None where the config gives none (T5's relative positions).

    Sentences are truncated to ``--max_length`` tokens and translations stop after as many new ones, which the
    decoder reads (its start token and all but the last generated one): both sides must hold ``--max_length``.
    """

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


def check_device_and_max_length(args: PrepareFraternalArguments) -> PrepareFraternalArguments:
    """``--device`` against this machine and ``--max_length`` against the model's config (neither tokenizer nor
    weights are loaded); the arguments with ``max_length`` resolved. Done before the output is locked, so that a bad
    setting stops the run with nothing written. A config that cannot be read is no error here: a finished output
    needs no model, and ``load_translator`` names the model when one is needed."""
    from transformers import AutoConfig

    select_device(args.device)
    try:
        config = AutoConfig.from_pretrained(args.model_name_or_path)
    except (OSError, ValueError):
        return args
    return dataclasses.replace(args, max_length=resolve_max_length(args.max_length, config, args.model_name_or_path))


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
    def from_arguments(cls, args: PrepareFraternalArguments, processes: Processes | None = None) -> Any:
        """Check device and length against the config, load the tokenizer and check the language settings, then load
        the model and put it on its device (``--engine ctranslate2``: a ``CTranslate2Translator``)."""
        import torch
        from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer

        if args.engine == "ctranslate2":
            return load_ctranslate2(args, processes or Processes())
        device, dtype = resolve_device_and_dtype(args.device, args.dtype)
        if processes is not None and processes.count > 1 and device.type == "cuda" and device.index is None:
            device = torch.device("cuda", processes.local_index)  # one GPU per process under accelerate launch
        config = AutoConfig.from_pretrained(args.model_name_or_path)
        max_length = resolve_max_length(args.max_length, config, args.model_name_or_path)
        tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
        forced_bos_token_id = set_up_languages(tokenizer, args)
        prefix = resolve_prefix(config, tokenizer, args)
        if forced_bos_token_id is None and not prefix and (args.source_lang or args.target_lang):
            logger.info(f"{args.model_name_or_path} translates one direction: --source_lang/--target_lang unused")
        model = AutoModelForSeq2SeqLM.from_pretrained(args.model_name_or_path, config=config, dtype=dtype)
        model.to(device).eval()
        logger.info(
            f"Translating with {args.model_name_or_path} on {device} ({dtype}); prefix {prefix!r}"
            + (f", target language token {args.target_lang}" if forced_bos_token_id is not None else "")
        )
        return cls(model, tokenizer, prefix, max_length, args.num_beams, forced_bos_token_id)

    def translate_batch(self, sentences: list[str]) -> list[str]:
        """Translations of ``sentences``, in their order (one generate call)."""
        import torch

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


def load_ctranslate2(args: PrepareFraternalArguments, processes: Processes) -> Any:
    """The CTranslate2 engine: the tokenizer and languages as for transformers, the model converted once into
    ``--ct2_model_dir`` (by the main process; the others wait), loaded on this process's device(s)."""
    import torch
    from transformers import AutoConfig, AutoTokenizer

    from ifcl import ctranslate2_engine

    device, dtype = resolve_device_and_dtype(args.device, args.dtype)
    config = AutoConfig.from_pretrained(args.model_name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    forced_bos_token_id = set_up_languages(tokenizer, args)
    prefix = resolve_prefix(config, tokenizer, args)
    model_dir = ct2_model_dir_of(args)
    with processes.main_first():
        if processes.is_main:
            ctranslate2_engine.prepare_model_dir(model_dir, args.model_name_or_path)
    if device.type == "cuda":
        device_index = [device.index] if device.index is not None else processes.gpus(torch.cuda.device_count())
    else:
        device_index = [0]
    compute_type = args.compute_type or str(dtype).removeprefix("torch.")
    translator = ctranslate2_engine.load_ctranslate2_translator(
        model_dir, args.model_name_or_path, tokenizer, prefix=prefix, max_length=args.max_length or DEFAULT_MAX_LENGTH,
        num_beams=args.num_beams, forced_bos_token_id=forced_bos_token_id, device=device.type,
        device_index=device_index, compute_type=compute_type, cpu_threads=torch.get_num_threads(),
    )  # fmt: skip
    logger.info(
        f"Translating with {args.model_name_or_path} on CTranslate2 ({model_dir}), {device.type} {device_index}, "
        f"compute type {compute_type}; prefix {prefix!r}"
        + (f", target prefix {translator.target_prefix}" if translator.target_prefix else "")
    )
    return translator


def ct2_model_dir_of(args: PrepareFraternalArguments) -> str:
    """``--ct2_model_dir``, or its default beside the output."""
    from ifcl.ctranslate2_engine import default_model_dir

    return args.ct2_model_dir or default_model_dir(args.output_file, args.model_name_or_path)


def check_engine(args: PrepareFraternalArguments) -> None:
    """``--engine ctranslate2``: installed, a CPU or CUDA device, a compute type it has there, a model family it
    converts, and a ``--ct2_model_dir`` that is free or holds this model converted by this project. Checked before
    the output is locked."""
    if args.engine != "ctranslate2":
        return
    from transformers import AutoConfig

    from ifcl import ctranslate2_engine

    try:
        ctranslate2_engine.import_ctranslate2()
        device, _ = resolve_device_and_dtype(args.device, args.dtype)
        if device.type not in ("cpu", "cuda"):
            raise SettingsError(f"--device {args.device}: CTranslate2 runs on cpu or cuda, not {device.type}.")
        ctranslate2_engine.check_compute_type(args.compute_type or "default", device.type)
        try:
            config = AutoConfig.from_pretrained(args.model_name_or_path)
        except (OSError, ValueError):
            return  # reported when the model loads, if there is something to translate
        if config.model_type not in ctranslate2_engine.SUPPORTED_MODEL_TYPES:
            raise SettingsError(
                f"--engine ctranslate2: {args.model_name_or_path} is a {config.model_type} model; this script "
                f"converts {', '.join(ctranslate2_engine.SUPPORTED_MODEL_TYPES)} (use --engine transformers)."
            )
        ctranslate2_engine.check_model_dir(ct2_model_dir_of(args), args.model_name_or_path)
    except ctranslate2_engine.EngineSettingsError as error:
        raise SettingsError(str(error)) from None


def pending_file_of(output_file: str) -> str:
    """The side file where translations that are ahead of the output's order wait for their turn."""
    return output_file + PENDING_SUFFIX


def new_file_of(output_file: str) -> str:
    """Where ``--overwrite_output_file`` writes, until the finished file replaces the output."""
    return output_file + NEW_SUFFIX


def lock_file_of(output_file: str) -> str:
    """The file a run locks while it works on ``output_file`` (beside the real file, if the output is a link)."""
    return os.path.realpath(output_file) + LOCK_SUFFIX


@contextlib.contextmanager
def output_lock(output_file: str) -> Iterator[str]:
    """Hold an exclusive lock on ``output_file`` for the ``with`` block; yield the lock file's path.

    Another run that holds it: SettingsError at once. The lock file is removed at the end, while still locked; a run
    that opened it just before finds, once it has the lock, that the path no longer leads to the file it locked, and
    takes the new lock file instead. A lock file left by a killed run holds no lock: it is taken over.
    """
    lock_file = lock_file_of(output_file)
    os.makedirs(os.path.dirname(lock_file), exist_ok=True)
    while True:
        descriptor = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException as error:
            os.close(descriptor)
            if isinstance(error, BlockingIOError):
                raise SettingsError(
                    f"--output_file {output_file}: another prepare_fraternal.py run is writing it (it holds "
                    f"{lock_file}); wait for it to end, or choose another --output_file."
                ) from None
            raise
        try:
            locked_the_path = os.path.samestat(os.stat(lock_file), os.fstat(descriptor))
        except FileNotFoundError:
            locked_the_path = False  # removed by the run that held it
        if locked_the_path:
            break
        os.close(descriptor)  # a lock file already removed: lock the one now at that path
    try:
        yield lock_file
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(lock_file)
        os.close(descriptor)


def read_pending_translations(
    pending_file: str, sentences: Sequence[InputSentence], first_unwritten: int
) -> dict[int, str]:
    """Translations an interrupted run made but had not written yet: {sentence index: translation}.

    Lines read ``index<TAB>sentence<TAB>translation``. Entries already in the output are skipped; entries whose
    sentence is not the input's sentence at that index, and an unfinished last line, are ignored (translated again).
    """
    pending: dict[int, str] = {}
    if not os.path.exists(pending_file):
        return pending
    ignored = 0
    with open(pending_file, "rb") as handle:
        for raw_line in handle:
            if not raw_line.endswith(b"\n"):
                break
            fields = raw_line[:-1].decode("utf-8", errors="replace").split("\t")
            if len(fields) != 3 or not fields[0].isdigit():
                ignored += 1
                continue
            index = int(fields[0])
            if index < first_unwritten:
                continue
            if index >= len(sentences) or sentences[index].text != fields[1]:
                ignored += 1
                continue
            pending[index] = fields[2]
    if ignored:
        logger.warning(f"{pending_file}: ignored {ignored} entries that do not match the input")
    return pending


class OrderedOutput:
    """The output file, written strictly in input order, and its side file of translations that are ahead.

    Batches are sorted by length, so a batch can finish sentences whose predecessors are not translated yet. Their
    translations wait in ``<output>.pending`` (appended and flushed with every batch) until all sentences before
    them are done; a restart reads them back instead of translating them again. The side file is emptied whenever
    nothing waits, and removed when the run ends with nothing waiting.
    """

    def __init__(
        self, output_file: str, sentences: Sequence[InputSentence], first_unwritten: int, waiting: dict[int, str]
    ) -> None:
        self.output_file = output_file
        self.pending_file = pending_file_of(output_file)
        self.sentences = sentences
        self.next_index = first_unwritten
        self.waiting = dict(waiting)
        self.empty_translations = 0
        self._pending_has_entries = bool(waiting)

    def __enter__(self) -> OrderedOutput:
        os.makedirs(os.path.dirname(os.path.abspath(self.output_file)), exist_ok=True)
        self._output = open(self.output_file, "a", encoding="utf-8", newline="\n")
        self._pending = open(self.pending_file, "a", encoding="utf-8", newline="\n")
        self._write_ready_lines()
        return self

    def __exit__(self, *exception: object) -> None:
        self._output.close()
        self._pending.close()
        if not self.waiting:
            os.remove(self.pending_file)

    def add(self, translations: dict[int, str]) -> None:
        """Keep a batch's translations (by sentence index), then write every line whose turn has come."""
        self._pending.write(
            "".join(f"{index}\t{self.sentences[index].text}\t{text}\n" for index, text in translations.items())
        )
        self._pending.flush()
        self._pending_has_entries = True
        self.waiting.update(translations)
        self._write_ready_lines()

    def _write_ready_lines(self) -> None:
        lines = []
        while self.next_index in self.waiting:
            sentence = self.sentences[self.next_index].text
            translation = self.waiting.pop(self.next_index)
            if not translation:
                self.empty_translations += 1
                translation = sentence
            lines.append(f"{sentence}\t{translation}\n")
            self.next_index += 1
        if lines:
            self._output.write("".join(lines))
            self._output.flush()
        if not self.waiting and self._pending_has_entries:
            self._pending.truncate(0)  # everything it held is in the output now
            self._pending_has_entries = False


def length_sorted_batches(
    indices: Sequence[int],
    sentences: Sequence[InputSentence],
    batch_size: int,
    max_batch_tokens: int | None = None,
    token_count: Any = None,
) -> list[list[int]]:
    """``indices`` in batches of ``batch_size``, longest sentences first, so that similar lengths share a batch; with
    ``max_batch_tokens``, a batch also holds at most that many source tokens, padding included (``token_count``
    gives a sentence's)."""
    order = sorted(indices, key=lambda index: len(sentences[index].text), reverse=True)
    if max_batch_tokens is None:
        return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    counts = dict(zip(order, token_count([sentences[index].text for index in order])))
    batches: list[list[int]] = []
    longest = 0
    for index in sorted(order, key=counts.__getitem__, reverse=True):  # a batch's first sentence is its longest
        if batches and len(batches[-1]) < batch_size and (len(batches[-1]) + 1) * longest <= max_batch_tokens:
            batches[-1].append(index)
        else:
            batches.append([index])
            longest = counts[index]
    return batches


def source_token_counts(translator: Any, texts: Sequence[str]) -> list[int]:
    """How many tokens the translator's encoder reads for each of ``texts`` (prefix and truncation included)."""
    encoded = translator.tokenizer(
        [translator.prefix + text for text in texts], truncation=True, max_length=translator.max_length
    )
    return [len(ids) for ids in encoded["input_ids"]]


@dataclass
class Processes:
    """This process among those ``accelerate launch`` started (one process: index 0 of 1, nothing to share)."""

    index: int = 0
    count: int = 1
    local_index: int = 0
    state: Any = None  # accelerate's PartialState when there are several

    @classmethod
    def from_environment(cls, cpu: bool) -> Processes:
        """accelerate's PartialState when launched as several processes (WORLD_SIZE > 1), else one process."""
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return cls()
        from accelerate import PartialState

        state = PartialState(cpu=cpu)
        return cls(state.process_index, state.num_processes, state.local_process_index, state)

    @property
    def is_main(self) -> bool:
        return self.index == 0

    def wait_for_everyone(self) -> None:
        if self.state is not None:
            self.state.wait_for_everyone()

    def main_first(self) -> contextlib.AbstractContextManager:
        """The main process runs the block first, the others after it."""
        return self.state.main_process_first() if self.state is not None else contextlib.nullcontext()

    def from_main(self, value: Any) -> Any:
        """The main process's ``value``, on every process."""
        if self.state is None:
            return value
        from accelerate.utils import broadcast_object_list

        return broadcast_object_list([value], from_process=0)[0]

    def gpus(self, visible: int) -> list[int]:
        """The GPUs a CTranslate2 model of this process uses: its own under accelerate launch, else all visible."""
        return [self.local_index % max(visible, 1)] if self.count > 1 else list(range(visible))


def side_file_of(output_file: str, process_index: int) -> str:
    """Where process ``process_index`` (not the main one) keeps its translations until the main one writes them."""
    return f"{pending_file_of(output_file)}.rank{process_index}"


def side_files(output_file: str) -> list[str]:
    """The side files of other processes that a run (with any number of processes) left beside ``output_file``."""
    pattern = glob.escape(pending_file_of(output_file)) + ".rank*"
    return sorted(path for path in glob.glob(pattern) if path.rsplit(".rank", 1)[1].isdigit())


def append_translations(handle: Any, sentences: Sequence[InputSentence], translations: dict[int, str]) -> None:
    """Append ``index<TAB>sentence<TAB>translation`` lines (the side files' format) and flush."""
    handle.write("".join(f"{index}\t{sentences[index].text}\t{text}\n" for index, text in translations.items()))
    handle.flush()


def translate_share(
    indices: list[int], sentences: Sequence[InputSentence], translator: Any, args: PrepareFraternalArguments, keep: Any
) -> None:
    """Translate ``indices`` in length-sorted batches, handing each batch's translations to ``keep``."""
    token_count = None
    if args.max_batch_tokens is not None:
        token_count = lambda texts: source_token_counts(translator, texts)  # noqa: E731
    batches = length_sorted_batches(indices, sentences, args.batch_size, args.max_batch_tokens, token_count)
    texts = [[sentences[index].text for index in batch] for batch in batches]
    for batch, outputs in zip(batches, translator.translate_batches(texts)):
        if len(outputs) != len(batch):
            raise RuntimeError(f"{len(batch)} sentences gave {len(outputs)} translations")
        keep({index: clean_field(text) for index, text in zip(batch, outputs)})


def translate_missing(
    output: OrderedOutput | None,
    plan: dict[str, Any],
    sentences: InputSentences | Sequence[InputSentence],
    translator: Any,
    args: PrepareFraternalArguments,
    processes: Processes,
    progress: Any = None,
) -> int:
    """Translate the sentences from ``plan["start"]`` to ``plan["end"]`` that are neither written nor waiting; return
    how many this process translated.

    They go in chunks of ``batch_size * batches_per_chunk`` consecutive sentences, each translated in length-sorted
    batches. With several processes, a round gives each process one chunk (process k the k-th); each keeps its
    translations in its own side file, and at the end of the round the main process writes them all, in input order,
    into the output (``output``, on the main process only), and empties their side files.
    """
    chunk_size = args.batch_size * args.batches_per_chunk
    waiting, translated = set(plan["waiting"]), 0
    side_file = (
        None if processes.is_main else open(side_file_of(plan["target"], processes.index), "a", encoding="utf-8")
    )
    try:
        for round_start in range(plan["start"], plan["end"], chunk_size * processes.count):
            round_end = min(round_start + chunk_size * processes.count, plan["end"])
            share_start = round_start + processes.index * chunk_size
            share = [i for i in range(share_start, min(share_start + chunk_size, round_end)) if i not in waiting]
            if processes.is_main:
                keep = output.add
            else:
                keep = lambda translations: append_translations(side_file, sentences, translations)  # noqa: E731
            translate_share(share, sentences, translator, args, keep)
            translated += len(share)
            if progress is not None:
                progress.update(len(share))
            if processes.count > 1:
                collect_side_files(output, plan["target"], processes, round_end, progress)
            if isinstance(sentences, InputSentences):
                sentences.release_before(round_end)
    finally:
        if side_file is not None:
            side_file.close()
    return translated


def collect_side_files(
    output: OrderedOutput | None, target: str, processes: Processes, round_end: int, progress: Any
) -> None:
    """End of a round: once every process has finished its chunk, the main process moves their translations into
    the output (through its own side file first, so that nothing is lost to a kill) and empties their side files."""
    processes.wait_for_everyone()
    if processes.is_main:
        for index in range(1, processes.count):
            path = side_file_of(target, index)
            translations = read_pending_translations(path, output.sentences, output.next_index)
            output.add(translations)
            open(path, "w").close()
            if progress is not None:
                progress.update(len(translations))
        if output.next_index < round_end:
            raise RuntimeError(f"sentences {output.next_index} to {round_end} were not translated by any process")
    processes.wait_for_everyone()


def parse_arguments(argv: list[str]) -> PrepareFraternalArguments:
    """Command line (or one .json file of arguments) → the argument dataclass."""
    from transformers import HfArgumentParser

    parser = HfArgumentParser(PrepareFraternalArguments)
    if len(argv) == 1 and argv[0].endswith(".json"):
        (args,) = parser.parse_json_file(argv[0])
    else:
        (args,) = parser.parse_args_into_dataclasses(args=argv)
    return args


def run(argv: list[str]) -> PrepareSummary:
    """Parse ``argv``, check the input, the device, the length and the engine, lock the output and check it,
    translate what is missing (with several processes under ``accelerate launch``: each its share, the main process
    locking, checking and writing the output)."""
    args = parse_arguments(argv)
    COMMAND.details.update(output_file=args.output_file, overwrite=args.overwrite_output_file)
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    logger.setLevel(logging.INFO)

    # Everything that can be wrong with the files is found before the model is loaded.
    sentences, empty_lines = read_input_sentences(args.input_file)
    if empty_lines:
        logger.warning(f"{args.input_file}: skipped {empty_lines} empty line(s)")
    args = check_device_and_max_length(args)
    check_engine(args)
    processes = Processes.from_environment(cpu=select_device(args.device).type == "cpu")
    summary = PrepareSummary(args.output_file, len(sentences), empty_lines)
    if not processes.is_main:
        return translate_into_output(args, sentences, summary, processes)
    try:
        with output_lock(args.output_file):
            return translate_into_output(args, sentences, summary, processes)
    except (ValueError, OSError) as error:
        if not COMMAND.running:
            processes.from_main({"error": str(error)})  # the other processes stop with the same message
        raise


def load_translator(args: PrepareFraternalArguments, processes: Processes | None = None) -> Any:
    """``Translator.from_arguments``; a model that cannot be loaded is a SettingsError that names its path."""
    try:
        return Translator.from_arguments(args, processes) if processes is not None else Translator.from_arguments(args)
    except SettingsError:
        raise
    except (OSError, ValueError) as error:
        raise SettingsError(
            f"--model_name_or_path {args.model_name_or_path}: cannot load the model: {error}"
        ) from error


def plan_output(args: PrepareFraternalArguments, sentences: Sequence[InputSentence], summary: PrepareSummary):
    """Main process, output locked: check the output against the input, read the translations waiting in side files;
    the plan ({target, start, end, waiting indices, todo}) and the waiting translations, nothing changed yet."""
    overwrite = args.overwrite_output_file
    target = new_file_of(args.output_file) if overwrite else args.output_file
    target_pending = pending_file_of(target)
    finished_bytes = 0
    waiting: dict[int, str] = {}
    if not overwrite and os.path.exists(target):
        summary.already_translated, finished_bytes = count_finished_lines(target, sentences, args.input_file)
        for pending_file in [target_pending, *side_files(target)]:
            waiting.update(read_pending_translations(pending_file, sentences, summary.already_translated))
    end = len(sentences) if args.max_sentences is None else min(args.max_sentences, len(sentences))
    waiting = {index: text for index, text in waiting.items() if index < end}
    todo = end - summary.already_translated - len(waiting) if end > summary.already_translated else 0
    logger.info(
        f"{args.input_file}: {len(sentences)} sentences; "
        + (
            f"{args.output_file} will be replaced (--overwrite_output_file), the new pairs go to {target}"
            if overwrite
            else f"{args.output_file} holds {summary.already_translated}"
        )
        + (f" (+{len(waiting)} waiting in {target_pending})" if waiting else "")
        + f"; {todo} to translate"
    )
    plan = {"target": target, "start": summary.already_translated, "end": end, "waiting": sorted(waiting)}
    return plan | {"todo": todo, "finished_bytes": finished_bytes}, waiting


def reset_or_trim(args: PrepareFraternalArguments, plan: dict[str, Any]) -> None:
    """Once the model is loaded: start OUTPUT.new (or a missing output) over with no side files, or cut the output's
    unfinished last line."""
    target = plan["target"]
    if args.overwrite_output_file or not os.path.exists(target):
        # OUTPUT.new is started over; a side file without its output belongs to an output that was deleted.
        for path in (target, pending_file_of(target), *side_files(target)):
            if os.path.exists(path):
                os.remove(path)
    else:
        remove_unfinished_line(target, plan["finished_bytes"])


def translate_into_output(
    args: PrepareFraternalArguments,
    sentences: Sequence[InputSentence],
    summary: PrepareSummary,
    processes: Processes | None = None,
) -> PrepareSummary:
    """The run once the output is locked: check the output, load the model, only then change files and translate.

    Without ``--overwrite_output_file`` the output is continued in place. With it, the run writes ``OUTPUT.new``
    (a leftover one is started over) and replaces the output with it only at the end of a finished run. With
    several processes the main one checks and plans, and tells the others.
    """
    processes = processes or Processes()
    plan, waiting = plan_output(args, sentences, summary) if processes.is_main else (None, {})
    if processes.count > 1:
        plan = processes.from_main(plan)
        if "error" in plan:
            raise SettingsError(plan["error"])
    translator = load_translator(args, processes if processes.count > 1 else None) if plan["todo"] else None
    # The model is loaded (or not needed): only now are files changed.
    if processes.is_main:
        reset_or_trim(args, plan)
    ready = processes.from_main(plan)  # every process starts once the files are ready
    if "error" in ready:
        raise SettingsError(ready["error"])
    COMMAND.running = True  # the input, the output and the model are checked: what fails now is the run
    if not processes.is_main:
        if translator is not None:
            translate_missing(None, plan, sentences, translator, args, processes)
        processes.wait_for_everyone()
        with contextlib.suppress(FileNotFoundError):
            os.remove(side_file_of(plan["target"], processes.index))
        return summary
    with OrderedOutput(plan["target"], sentences, summary.already_translated, waiting) as output:
        if translator is not None:
            from tqdm.auto import tqdm

            started = time.perf_counter()
            end = plan["end"]
            with tqdm(total=end, initial=end - plan["todo"], unit="sentence", desc="Translating") as progress:
                translate_missing(output, plan, sentences, translator, args, processes, progress)
            summary.translated = plan["todo"]  # by all processes
            logger.info(f"Translated {summary.translated} sentences in {time.perf_counter() - started:.1f} s")
        summary.output_lines = output.next_index
        summary.empty_translations = output.empty_translations
        leftovers = [] if output.waiting else side_files(plan["target"])
    processes.wait_for_everyone()
    for path in leftovers:  # all they held is in the output (those of a killed run with more processes, too)
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
    if args.overwrite_output_file:
        replace_output(plan["target"], args.output_file)
    if summary.empty_translations:
        logger.warning(
            f"{summary.empty_translations} translation(s) came out empty: the sentence itself was written instead"
        )
    logger.info(f"{args.output_file}: {summary.output_lines} of {len(sentences)} sentences with their translation")
    return summary


def replace_output(new_file: str, output_file: str) -> None:
    """Put the finished ``new_file`` (and its side file, if any waits) in place of ``output_file`` and its own."""
    new_pending, pending = pending_file_of(new_file), pending_file_of(output_file)
    if os.path.exists(new_pending):
        os.replace(new_pending, pending)
    elif os.path.exists(pending):
        os.remove(pending)  # the old output's translations must not wait for the new output
    os.replace(new_file, output_file)
    logger.info(f"{output_file}: replaced by the new pairs (--overwrite_output_file)")


def interrupt_message() -> str:
    """What Ctrl-C prints: how to go on, and that an overwrite run left the old output as it was."""
    if COMMAND.details.get("overwrite"):
        return (
            f"interrupted; {COMMAND.details['output_file']} is unchanged; run the same command again to start "
            "the overwrite over, or without --overwrite_output_file to continue the old output."
        )
    return "interrupted; run the same command again to continue."


COMMAND = Command("prepare_fraternal.py")


def main(argv: list[str] | None = None) -> None:
    """Command-line entry: a bad input ends with ``prepare_fraternal.py: error: <message>`` and exit code 2, a
    failure once translation began with exit code 1 (the traceback with ``IFCL_DEBUG=1``); Ctrl-C says how to go on."""
    COMMAND.main(
        lambda: run(sys.argv[1:] if argv is None else argv),
        on_interrupt=interrupt_message,
    )


if __name__ == "__main__":
    main()
