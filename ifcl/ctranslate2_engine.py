"""``prepare_fraternal.py --engine ctranslate2``: the translation model converted once into a CTranslate2 folder,
then translated there with the same tokenizer, prefix, language tokens and length limits as the transformers engine;
docs/translation.md gives how the folder is recorded, checked and converted again."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from transformers import AutoConfig, GenerationConfig
from transformers.utils import cached_file

from ifcl.data import file_sha256
from ifcl.files import read_json, write_json_atomically

logger = logging.getLogger(__name__)

CONVERSION_RECORD = "ifcl_conversion.json"
MADE_BY = "ifcl prepare_fraternal.py"  # in a conversion record and in prepare_fraternal.py's work folder manifest
# The types CTranslate2 computes in (ctranslate2.Translator's compute_type).
COMPUTE_TYPES = (
    "default",
    "auto",
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
    "float32",
)
# The model families whose conversion and language handling the tests check.
SUPPORTED_MODEL_TYPES = ("marian", "t5", "mt5", "m2m_100", "mbart")


class EngineSettingsError(ValueError):
    """A setting of the CTranslate2 engine that cannot work (prepare_fraternal's SettingsError wraps it)."""


def import_ctranslate2() -> Any:
    """The ``ctranslate2`` module, or EngineSettingsError saying how to install it."""
    try:
        # ctranslate2 is an optional extra (ifcl[ctranslate2])
        import ctranslate2
    except ImportError:
        raise EngineSettingsError(
            "--engine ctranslate2 needs the ctranslate2 package: pip install -e '.[ctranslate2]' in this checkout."
        ) from None
    return ctranslate2


def expected_record(model_name_or_path: str) -> dict[str, Any]:
    """The conversion record of a folder this project converted from this model: the converter's version and what
    identifies the model's files: the folder they are in (a Hub model's cached snapshot, whose name is its commit),
    the SHA-256 of its config.json, and the names and sizes of its weight files."""
    config_file = cached_file(model_name_or_path, "config.json")
    folder = os.path.dirname(os.path.realpath(config_file)) if os.path.isdir(model_name_or_path) else None
    snapshot = os.path.dirname(config_file)
    weights = {
        name: os.path.getsize(os.path.join(snapshot, name))
        for name in sorted(os.listdir(snapshot))
        if name.endswith((".safetensors", ".bin", ".pt"))
    }
    return {
        "converted_by": MADE_BY,
        "ctranslate2_version": import_ctranslate2().__version__,
        "model_name_or_path": folder or model_name_or_path,
        "snapshot": None if folder else os.path.basename(snapshot),
        "config_sha256": file_sha256(config_file),
        "weight_files": weights,
    }


def read_conversion_record(model_dir: str, model_name_or_path: str) -> dict[str, Any] | None:
    """The conversion record of ``model_dir`` when this project converted this model there; None when the folder is
    free. EngineSettingsError for a folder this project did not convert, one converted from another model or with
    another converter, and one whose record cannot be read."""
    if not os.path.exists(model_dir):
        return None
    record_file = os.path.join(model_dir, CONVERSION_RECORD)
    hint = "pass another --ct2_model_dir (the folder is left as it is)"
    if not os.path.isfile(record_file):
        raise EngineSettingsError(
            f"--ct2_model_dir {model_dir}: exists and was not converted by prepare_fraternal.py (it has no "
            f"{CONVERSION_RECORD}); {hint}."
        )
    try:
        record = read_json(model_dir, CONVERSION_RECORD)
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
    except ValueError as error:
        raise EngineSettingsError(
            f"--ct2_model_dir {model_dir}: its {CONVERSION_RECORD} cannot be read ({error}); delete the folder to "
            "convert the model again, or pass another --ct2_model_dir."
        ) from None
    expected = expected_record(model_name_or_path)
    different = [key for key in expected if record.get(key) != expected[key]]
    if different:
        raise EngineSettingsError(
            f"--ct2_model_dir {model_dir}: converted from another model or with other settings (differs in "
            f"{', '.join(different)}: {record.get(different[0])!r} there, {expected[different[0]]!r} now); {hint}, "
            "or delete it to convert again."
        )
    return record


def find_damage(model_dir: str, record: dict[str, Any]) -> str | None:
    """What differs between the files of ``model_dir`` and its conversion record, or None when none does."""
    recorded = record.get("files")
    if not recorded or not isinstance(recorded, dict) or not all(isinstance(file, dict) for file in recorded.values()):
        return f"its {CONVERSION_RECORD} lists no files to check them against"
    for name, expected in recorded.items():
        path = os.path.join(model_dir, name)
        if not os.path.isfile(path):
            return f"{name} is missing"
        if os.path.getsize(path) != expected.get("size"):
            return f"{name} has {os.path.getsize(path)} bytes, {expected.get('size')} when converted"
        if file_sha256(path) != expected.get("sha256"):
            return f"{name} differs from the file converted (SHA-256)"
    return None


def make_converter(model_name_or_path: str) -> Any:
    """ctranslate2's ``TransformersConverter`` for the model, mended for transformers 5: its mBART loader reads
    ``config.normalize_before``, which mBART's configs no longer define unless their config.json does (mBART's
    layers normalise before, always); and a tokenizer without a bos token (mBART-50's; the converted model's config
    needs one) gets the token of the config's ``bos_token_id``."""
    # ctranslate2 is an optional extra (ifcl[ctranslate2])
    from ctranslate2.converters import TransformersConverter

    class Converter(TransformersConverter):
        def load_model(self, model_class: Any, path: str, **kwargs: Any) -> Any:
            model = super().load_model(model_class, path, **kwargs)
            if model.config.model_type == "mbart" and not hasattr(model.config, "normalize_before"):
                model.config.normalize_before = True
            return model

        def load_tokenizer(self, tokenizer_class: Any, path: str, **kwargs: Any) -> Any:
            tokenizer = super().load_tokenizer(tokenizer_class, path, **kwargs)
            if tokenizer.bos_token is None:
                bos_token_id = getattr(AutoConfig.from_pretrained(path, trust_remote_code=False), "bos_token_id", None)
                if bos_token_id is not None:
                    tokenizer.bos_token = tokenizer.convert_ids_to_tokens(bos_token_id)
            return tokenizer

    return Converter(model_name_or_path, trust_remote_code=False)


def convert_model(model_name_or_path: str, model_dir: str) -> None:
    """Convert the Hugging Face model into ``model_dir`` (a temporary folder renamed into place when complete)."""
    record = expected_record(model_name_or_path)
    parent = os.path.dirname(os.path.abspath(model_dir))
    os.makedirs(parent, exist_ok=True)
    temporary = os.path.join(parent, f".{os.path.basename(model_dir)}.tmp-{os.getpid()}")
    logger.info(f"Converting {model_name_or_path} for CTranslate2 into {model_dir} (once)")
    try:
        make_converter(model_name_or_path).convert(temporary, force=True)
        paths = {name: os.path.join(temporary, name) for name in sorted(os.listdir(temporary))}  # what it wrote
        record["files"] = {
            name: {"size": os.path.getsize(path), "sha256": file_sha256(path)} for name, path in paths.items()
        }
        write_json_atomically(os.path.join(temporary, CONVERSION_RECORD), record)
        os.rename(temporary, model_dir)
    finally:
        if os.path.exists(temporary):
            shutil.rmtree(temporary)


def prepare_model_dir(model_dir: str, model_name_or_path: str) -> None:
    """Convert the model into ``model_dir`` unless this project already did and the folder is intact: a damaged one
    (``find_damage``) is converted again in its place, with a log line."""
    record = read_conversion_record(model_dir, model_name_or_path)
    if record is not None:
        damage = find_damage(model_dir, record)
        if damage is None:
            return
        logger.warning(
            f"--ct2_model_dir {model_dir}: {damage}; converting {model_name_or_path} into it again (this project "
            "made it)"
        )
        shutil.rmtree(model_dir)
    convert_model(model_name_or_path, model_dir)


def check_compute_type(compute_type: str, device: str, setting: str = "--compute_type") -> None:
    """``compute_type`` must be one CTranslate2 computes in on ``device`` (cpu or cuda); the error names the
    ``setting`` it came from (``--compute_type``, or ``--dtype`` when that is not given)."""
    ctranslate2 = import_ctranslate2()
    supported = sorted(ctranslate2.get_supported_compute_types(device))
    if compute_type in (*supported, "default", "auto"):
        return
    cannot = f"{setting} {compute_type}: CTranslate2 {ctranslate2.__version__} cannot compute in it on {device} here"
    can = f"{', '.join(supported)} (or default, auto)"
    if setting == "--compute_type":
        raise EngineSettingsError(f"{cannot}; it can in {can}.")
    raise EngineSettingsError(
        f"{cannot} (without --compute_type, it computes in --dtype's type); pass --compute_type with one it can: {can}."
    )


class CTranslate2Translator:
    """A converted model and the Hugging Face tokenizer, set up like ``Translator`` for one translation direction.

    Greedy output equals ``generate``'s: the tokenizer's ids as source tokens, the target language of NLLB, M2M100
    and mBART-50 as a target prefix, and where the generation config forces the end token on the last position
    (``forced_eos_token_id``: Marian, NLLB) a hypothesis that reaches ``max_length`` loses its last token.
    """

    def __init__(
        self,
        model_dir: str,
        config: Any,
        tokenizer: Any,
        prefix: str,
        max_length: int,
        num_beams: int | None,
        forced_bos_token_id: int | None,
        device: Any,
        compute_type: str,
    ) -> None:
        ctranslate2 = import_ctranslate2()
        if device.index is not None:
            device_index = [device.index]
        else:  # every visible GPU: CTranslate2 gives each a replica
            device_index = list(range(torch.cuda.device_count())) if device.type == "cuda" else [0]
        threads = {"intra_threads": torch.get_num_threads()} if device.type == "cpu" else {"inter_threads": 1}
        try:
            self.translator = ctranslate2.Translator(
                model_dir, device=device.type, device_index=device_index, compute_type=compute_type, **threads
            )
        except (RuntimeError, ValueError) as error:  # its files were just checked against their record: not them
            raise EngineSettingsError(
                f"--ct2_model_dir {model_dir}: CTranslate2 cannot load it on {device.type} {device_index} in compute "
                f"type {compute_type} ({error})."
            ) from None
        try:
            generation = GenerationConfig.from_pretrained(config.name_or_path)
        except OSError:
            generation = GenerationConfig.from_model_config(config)
        eos = generation.eos_token_id if generation.eos_token_id is not None else config.eos_token_id
        forced_eos = generation.forced_eos_token_id
        self.end_is_forced = forced_eos is not None and forced_eos in (eos if isinstance(eos, list) else [eos])
        self.tokenizer = tokenizer
        self.prefix = prefix
        self.max_length = max_length
        self.beam_size = num_beams if num_beams is not None else (generation.num_beams or 1)
        # The target prefix follows CTranslate2's own decoder start token; a converted model without one (mBART-25)
        # is given the Hugging Face model's first. generate counts the forced token among its max_new_tokens.
        has_start_token = read_json(model_dir, "config.json").get("decoder_start_token") is not None
        start_id = getattr(config, "decoder_start_token_id", None)
        start = [] if has_start_token or start_id is None else [start_id]
        forced = [] if forced_bos_token_id is None else [forced_bos_token_id]
        self.target_prefix = tokenizer.convert_ids_to_tokens(start + forced)
        self.generated_prefix = len(forced)
        logger.info(
            f"Translating with {config.name_or_path} on CTranslate2 ({model_dir}), {device.type} {device_index}, "
            f"compute type {compute_type}; prefix {prefix!r}"
            + (f", target prefix {self.target_prefix}" if self.target_prefix else "")
        )

    def submit(self, sentences: Sequence[str]) -> list[Any]:
        """Start translating ``sentences`` (asynchronously: the model's replicas take batches in parallel), as the
        tokens transformers' engine feeds the encoder (prefix, truncation, special tokens)."""
        encoded = self.tokenizer(
            [self.prefix + sentence for sentence in sentences], truncation=True, max_length=self.max_length
        )
        tokens = [self.tokenizer.convert_ids_to_tokens(ids) for ids in encoded["input_ids"]]
        target_prefix = [list(self.target_prefix) for _ in tokens] if self.target_prefix else None
        return self.translator.translate_batch(
            tokens,
            target_prefix,
            asynchronous=True,
            beam_size=self.beam_size,
            max_input_length=0,
            max_decoding_length=self.max_length + len(self.target_prefix) - self.generated_prefix,
        )

    def decode(self, hypothesis: Sequence[str]) -> str:
        """A hypothesis's tokens (target prefix dropped, the forced end applied) as text, as ``batch_decode``."""
        tokens = list(hypothesis[len(self.target_prefix) :])
        if self.end_is_forced and self.generated_prefix + len(tokens) >= self.max_length:
            tokens = tokens[: self.max_length - self.generated_prefix - 1]  # generate's last token is the end
        return self.tokenizer.decode(self.tokenizer.convert_tokens_to_ids(tokens), skip_special_tokens=True)

    def translate_batches(self, batches: Sequence[list[str]]) -> Iterator[list[str]]:
        """Translations of each batch in turn; all batches are submitted at once, so that several replicas (GPUs)
        work in parallel."""
        submitted = [self.submit(batch) for batch in batches]
        for results in submitted:
            yield [self.decode(result.result().hypotheses[0]) for result in results]
