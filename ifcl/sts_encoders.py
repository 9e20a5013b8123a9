"""Encoders for STS evaluation by name, and the mutual information of the IFCL paper's Eq. 10 (Table 4).

What ``evaluate_sts.py`` needs beyond :class:`ifcl.evaluation.STSEvaluator`; the Trainer does not import it.
Three kinds of encoder, each behind ``encode(sentences, batch_size) -> Tensor`` and ``twins(...)``:

- a saved IFCL model, :class:`IFCLEncoder`;
- a plain ``transformers`` encoder with a pooler chosen by name, :class:`TransformersEncoder`;
- a sentence-transformers model, :class:`SentenceTransformerEncoder`.

:func:`load_encoder` picks the right one for a folder or Hub id. :func:`mutual_information` is Eq. 10, computed over a
file of sentence pairs by :class:`MutualInformationEvaluator`.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from configuration_ifcl import POOLER_TYPES, ifcl_config_dict
from modeling_ifcl import ALL_LAYER_POOLERS, max_input_length, pool_hidden_states

logger = logging.getLogger(__name__)

MODEL_TYPES = ("auto", "ifcl", "transformers", "sentence-transformers")
DEFAULT_TEMPERATURE = 0.05


class TwinsEncoder(Protocol):
    """An encoder that can embed a batch with dropout on: anchors, identical twins and (if it has them) fraternal
    twins of the same sentences, as in training."""

    def twins(
        self, sentences: Sequence[str], fraternals: Sequence[str] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]: ...


# ---------------------------------------------------------------------------------------------------- encoders


def length_order(lengths: Sequence[int]) -> list[int]:
    """Indices longest first (stable), so every batch pads to nearly its own length."""
    return sorted(range(len(lengths)), key=lambda i: -lengths[i])


def batch_starts(count: int, batch_size: int, show_progress_bar: bool, description: str = "Encoding") -> Iterable[int]:
    """Start index of every batch, wrapped in a progress bar when asked."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be ≥ 1, got {batch_size}.")
    starts = range(0, count, batch_size)
    if not show_progress_bar:
        return starts
    from tqdm.auto import tqdm

    return tqdm(starts, desc=description, unit="batch")


def pool_encoder_outputs(pooler_type: str, attention_mask: torch.Tensor, outputs: Any) -> torch.Tensor:
    """Float32 sentence embeddings from a plain encoder's outputs, pooled as :func:`modeling_ifcl.pool_hidden_states`
    does, except ``cls``: a plain encoder has no SimCSE MLP, so ``cls`` is its own ``pooler_output``."""
    if pooler_type == "cls":
        return outputs.pooler_output.to(torch.float32)
    hidden_states = outputs.hidden_states if pooler_type in ALL_LAYER_POOLERS else (outputs.last_hidden_state,)
    return pool_hidden_states(pooler_type, attention_mask, [hidden.to(torch.float32) for hidden in hidden_states])


class TransformersEncoder:
    """A plain ``transformers`` encoder (``AutoModel``) with a pooler chosen by name.

    There is no MLP, so ``cls`` is the model's own ``pooler_output`` (BERT's dense+tanh); a model without a pooler
    head falls back to ``cls_before_pooler`` with a warning. Sentences are tokenized once, sorted by token count
    and encoded in batches without gradients; rows come back in input order as a float32 CPU tensor.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        pooler_type: str = "avg",
        max_length: int | None = None,
        show_progress_bar: bool = False,
    ) -> None:
        if pooler_type not in POOLER_TYPES:
            raise ValueError(f"Unknown pooler_type {pooler_type!r}; expected one of {POOLER_TYPES}.")
        if pooler_type == "cls" and getattr(model, "pooler", "no pooler attribute") is None:
            logger.warning(
                f"{type(model).__name__} has no pooler head, so there is no pooler_output for 'cls': using the "
                "[CLS] state itself ('cls_before_pooler')."
            )
            pooler_type = "cls_before_pooler"
        self.model = model
        self.tokenizer = tokenizer
        self.pooler_type = pooler_type
        self.max_length = max_length or max_input_length(tokenizer, model.config)
        self.show_progress_bar = show_progress_bar

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        pooler_type: str = "avg",
        max_length: int | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        show_progress_bar: bool = False,
        trust_remote_code: bool = False,
        subfolder: str = "",
    ) -> TransformersEncoder:
        """Load ``AutoModel`` and ``AutoTokenizer`` from a folder or Hub id, in eval mode on ``device``."""
        from transformers import AutoModel, AutoTokenizer

        options = {"trust_remote_code": trust_remote_code, "subfolder": subfolder}
        model = AutoModel.from_pretrained(name_or_path, **options)
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, **options)
        model.to(device=device or default_device(), dtype=dtype).eval()
        return cls(model, tokenizer, pooler_type, max_length, show_progress_bar)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def needs_hidden_states(self) -> bool:
        return self.pooler_type in ALL_LAYER_POOLERS

    def tokenize(self, sentences: Sequence[str]) -> dict[str, torch.Tensor]:
        """One padded batch on the model's device."""
        batch = self.tokenizer(
            list(sentences), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        return {name: tensor.to(self.device) for name, tensor in batch.items()}

    def embed_batch(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Pooled float32 embeddings of one tokenized batch (in whatever mode the model is)."""
        outputs = self.model(**batch, output_hidden_states=self.needs_hidden_states, return_dict=True)
        return pool_encoder_outputs(self.pooler_type, batch["attention_mask"], outputs)

    def pad_batch(self, encoded: dict[str, list[list[int]]], indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """Rows ``indices`` of an unpadded tokenization, padded to their longest, on the model's device."""
        length = max(len(encoded["input_ids"][i]) for i in indices)
        pad_values = {
            "input_ids": self.tokenizer.pad_token_id or 0,
            "token_type_ids": getattr(self.tokenizer, "pad_token_type_id", 0),
            "attention_mask": 0,
        }
        left = getattr(self.tokenizer, "padding_side", "right") == "left"
        batch = {}
        for name, rows in encoded.items():
            pad = pad_values.get(name, 0)
            padded = [
                [pad] * (length - len(rows[i])) + rows[i] if left else rows[i] + [pad] * (length - len(rows[i]))
                for i in indices
            ]
            batch[name] = torch.tensor(padded, dtype=torch.long, device=self.device)
        return batch

    @torch.inference_mode()
    def encode(self, sentences: str | Sequence[str], batch_size: int = 64) -> torch.Tensor:
        """Evaluation embeddings, one float32 CPU row per sentence, in input order.

        All sentences are tokenized in one call of the fast (Rust, batched) tokenizer; batches are then formed
        longest first by token count and padded to their own longest row.
        """
        if isinstance(sentences, str):
            sentences = [sentences]
        sentences = list(sentences)
        if not sentences:
            return torch.empty(0, 0)
        tokenized = self.tokenizer(sentences, truncation=True, max_length=self.max_length)
        wanted = set(getattr(self.tokenizer, "model_input_names", ())) | {"input_ids", "attention_mask"}
        encoded = {name: rows for name, rows in tokenized.items() if name in wanted}
        if "attention_mask" not in encoded:
            encoded["attention_mask"] = [[1] * len(ids) for ids in encoded["input_ids"]]
        order = length_order([len(ids) for ids in encoded["input_ids"]])
        embeddings: torch.Tensor | None = None
        was_training = self.model.training
        self.model.eval()
        try:
            for start in batch_starts(len(order), batch_size, self.show_progress_bar):
                indices = order[start : start + batch_size]
                pooled = self.embed_batch(self.pad_batch(encoded, indices)).cpu()
                if embeddings is None:
                    embeddings = torch.empty(len(sentences), pooled.shape[-1])
                embeddings[indices] = pooled
        finally:
            self.model.train(was_training)
        return embeddings

    @torch.no_grad()
    def twins(
        self, sentences: Sequence[str], fraternals: Sequence[str] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, None]:
        """Anchors and identical twins: the batch encoded twice in one call with dropout on (no fraternal view)."""
        batch = self.tokenize(sentences)
        doubled = {name: torch.cat([tensor, tensor]) for name, tensor in batch.items()}
        with training_mode(self.model):
            pooled = self.embed_batch(doubled).cpu()
        anchors, identical = pooled.split(len(sentences))
        return anchors, identical, None


class SentenceTransformerEncoder:
    """A sentence-transformers model (a folder with ``modules.json``) behind the same ``encode``."""

    def __init__(self, model, show_progress_bar: bool = False) -> None:
        self.model = model
        self.show_progress_bar = show_progress_bar

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        max_length: int | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        show_progress_bar: bool = False,
        trust_remote_code: bool = False,
    ) -> SentenceTransformerEncoder:
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(
            name_or_path, device=str(device or default_device()), trust_remote_code=trust_remote_code
        )
        if max_length is not None:
            model.max_seq_length = max_length
        if dtype is not None:
            model.to(dtype)
        return cls(model, show_progress_bar)

    @property
    def device(self) -> torch.device:
        return self.model.device

    def encode(self, sentences: str | Sequence[str], batch_size: int = 64) -> torch.Tensor:
        """Evaluation embeddings, one float32 CPU row per sentence, in input order."""
        if isinstance(sentences, str):
            sentences = [sentences]
        embeddings = self.model.encode(
            list(sentences), batch_size=batch_size, convert_to_tensor=True, show_progress_bar=self.show_progress_bar
        )
        return embeddings.float().cpu()

    @torch.no_grad()
    def twins(
        self, sentences: Sequence[str], fraternals: Sequence[str] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, None]:
        """Anchors and identical twins: two forward passes with dropout on (no fraternal view)."""
        preprocess = getattr(self.model, "preprocess", None) or self.model.tokenize
        features = {
            name: value.to(self.device) if isinstance(value, torch.Tensor) else value
            for name, value in preprocess(list(sentences)).items()
        }
        with training_mode(self.model):
            # The modules add their outputs to the dict they are given: each pass gets its own copy.
            anchors = self.model(dict(features))["sentence_embedding"].float().cpu()
            identical = self.model(dict(features))["sentence_embedding"].float().cpu()
        return anchors, identical, None


class IFCLEncoder:
    """An :class:`IFCLModel` with the settings of a run: truncation length and progress bar.

    ``encode`` is the model's own (what the Trainer evaluates with); ``twins`` is the training forward
    (``return_twins=True``) with dropout on, tokenized as ``run_ifcl.py`` tokenizes.
    """

    def __init__(self, model, max_length: int | None = None, show_progress_bar: bool = False) -> None:
        self.model = model
        self.max_length = max_length
        self.show_progress_bar = show_progress_bar

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        pooler_type: str | None = None,
        max_length: int | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        show_progress_bar: bool = False,
    ) -> IFCLEncoder:
        """A saved IFCL model, loaded by this project's own :class:`IFCLModel`: the ``.py`` files saved beside the
        weights are never run. ``pooler_type`` overrides its evaluation pooler."""
        from modeling_ifcl import IFCLModel

        model = IFCLModel.from_pretrained(name_or_path)
        if pooler_type is not None and pooler_type != model.config.eval_pooler_type:
            if pooler_type == "cls" and getattr(model, "mlp", None) is None:
                raise ValueError(
                    f"{name_or_path}: pooler 'cls' is SimCSE's MLP, which this IFCL model does not have (it was "
                    f"trained with pooler {model.config.pooler_type!r}); choose another --pooler_type."
                )
            model.config.eval_pooler_type = pooler_type
        model.to(device=device or default_device(), dtype=dtype).eval()
        return cls(model, max_length, show_progress_bar)

    @property
    def pooler_type(self) -> str:
        return self.model.config.eval_pooler_type

    @property
    def device(self) -> torch.device:
        return self.model.device

    def encode(self, sentences: str | Sequence[str], batch_size: int = 64) -> torch.Tensor:
        return self.model.encode(
            sentences, batch_size=batch_size, max_length=self.max_length, show_progress_bar=self.show_progress_bar
        )

    @torch.no_grad()
    def twins(
        self, sentences: Sequence[str], fraternals: Sequence[str] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Anchors, identical twins and (with ``fraternals`` and a fraternal table) fraternal twins, dropout on,
        each side truncated to the training length ``config.max_seq_length`` as in training."""
        model = self.model
        max_length = model.config.max_seq_length
        batch = model.tokenizer(
            list(sentences), padding=True, truncation=True, max_length=max_length, return_tensors="pt"
        ).to(self.device)
        inputs = dict(batch)
        if fraternals is not None and model.has_fraternal_view:
            fraternal = model.fraternal_tokenizer(
                list(fraternals), padding=True, truncation=True, max_length=max_length, return_tensors="pt"
            ).to(self.device)
            inputs["fraternal_input_ids"] = fraternal["input_ids"]
            inputs["fraternal_attention_mask"] = fraternal["attention_mask"]
        with training_mode(model):
            views = model(**inputs, return_twins=True)
        fraternal_view = views.fraternal.float().cpu() if views.fraternal is not None else None
        return views.anchor.float().cpu(), views.identical.float().cpu(), fraternal_view


@contextmanager
def training_mode(module: nn.Module) -> Iterator[nn.Module]:
    """The module in training mode (dropout on) inside the block, its previous mode restored afterwards."""
    was_training = module.training
    module.train()
    try:
        yield module
    finally:
        module.train(was_training)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# ---------------------------------------------------------------------------------------------------- loading


def model_file(name_or_path: str, filename: str) -> str | None:
    """Local path of ``filename`` in a model folder or Hub repo, or None when it has none."""
    if os.path.isdir(name_or_path):
        path = os.path.join(name_or_path, filename)
        return path if os.path.isfile(path) else None
    from transformers.utils import cached_file

    try:
        return cached_file(
            name_or_path,
            filename,
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
        )
    except OSError:
        return None


def detect_model_type(name_or_path: str) -> str:
    """``ifcl`` (config.json holds IFCL's settings), ``sentence-transformers`` (modules.json) or ``transformers``."""
    config_path = model_file(name_or_path, "config.json")
    if config_path is not None:
        with open(config_path, encoding="utf-8") as handle:
            config = json.load(handle)
        if isinstance(config, dict) and ifcl_config_dict(config) is not None:
            return "ifcl"
    if model_file(name_or_path, "modules.json") is not None:
        return "sentence-transformers"
    return "transformers"


def sentence_transformers_modules(name_or_path: str) -> list[dict[str, Any]]:
    """The entries of a sentence-transformers model's ``modules.json`` (empty when it has none)."""
    modules_path = model_file(name_or_path, "modules.json")
    if modules_path is None:
        return []
    with open(modules_path, encoding="utf-8") as handle:
        return json.load(handle)


def sentence_transformers_pooler(name_or_path: str) -> str | None:
    """The pooler of a sentence-transformers model's Pooling module in this project's names (avg or
    cls_before_pooler), or None when it is another kind or cannot be read."""
    modules = sentence_transformers_modules(name_or_path)
    pooling = next((m for m in modules if str(m.get("type", "")).endswith("Pooling")), None)
    config_path = pooling and model_file(name_or_path, f"{pooling['path']}/config.json")
    if not config_path:
        return None
    with open(config_path, encoding="utf-8") as handle:
        config = json.load(handle)
    modes = config.get("pooling_mode")
    modes = {modes} if isinstance(modes, str) else set(modes or ())
    modes |= {
        key.removeprefix("pooling_mode_") for key, on in config.items() if key.startswith("pooling_mode_") and on
    }
    if modes == {"mean"} or modes == {"mean_tokens"}:
        return "avg"
    if modes == {"cls"} or modes == {"cls_token"}:
        return "cls_before_pooler"
    return None


def sentence_transformers_available() -> bool:
    try:
        import sentence_transformers  # noqa: F401
    except ImportError as error:  # not installed, or installed without a dependency it needs
        logger.warning(f"sentence-transformers cannot be imported ({error}).")
        return False
    return True


@dataclass
class LoadedEncoder:
    """An encoder ready for :class:`STSEvaluator`, with what it is."""

    encoder: IFCLEncoder | TransformersEncoder | SentenceTransformerEncoder
    model_type: str
    pooler_type: str | None


def load_encoder(
    name_or_path: str,
    model_type: str = "auto",
    pooler_type: str | None = None,
    max_length: int | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    show_progress_bar: bool = False,
    trust_remote_code: bool = False,
) -> LoadedEncoder:
    """The encoder of a folder or Hub id: an IFCL model, a sentence-transformers model or a plain encoder.

    ``pooler_type``: for a plain encoder the pooler (default ``avg``, the paper's evaluation pooler); for an IFCL
    model it overrides the evaluation pooler saved in its config; a sentence-transformers model keeps its own
    Pooling module. A sentence-transformers folder read as a plain encoder (``model_type="transformers"``, or when
    the package cannot be imported) uses the weights of its Transformer module and, unless ``pooler_type`` is
    given, the mode of its Pooling module (mean → avg, cls → cls_before_pooler).
    """
    if model_type not in MODEL_TYPES:
        raise ValueError(f"Unknown model_type {model_type!r}; expected one of {MODEL_TYPES}.")
    if pooler_type is not None and pooler_type not in POOLER_TYPES:
        raise ValueError(f"Unknown pooler_type {pooler_type!r}; expected one of {POOLER_TYPES}.")
    if model_type == "auto":
        model_type = detect_model_type(name_or_path)
        if model_type == "sentence-transformers" and not sentence_transformers_available():
            logger.warning(
                f"{name_or_path} is a sentence-transformers model, but the package cannot be imported: reading it "
                f"as a plain transformers encoder with pooler "
                f"{pooler_type or sentence_transformers_pooler(name_or_path) or 'avg'!r} (extra modules such as Dense "
                "layers are left out; normalisation does not change cosines)."
            )
            model_type = "transformers"
    try:
        return load_known_encoder(
            name_or_path, model_type, pooler_type, max_length, device, dtype, show_progress_bar, trust_remote_code
        )
    except Exception as error:
        if not is_unreadable_weights(error):
            raise
        raise OSError(
            f"{name_or_path}: its weights cannot be read ({type(error).__name__}: {str(error).splitlines()[0]}); the "
            "file is damaged or was cut short (a full disk, an interrupted copy): save or copy the model again."
        ) from error


def is_unreadable_weights(error: BaseException) -> bool:
    """Whether loading failed on a weights file that is damaged or cut short (safetensors' own error)."""
    return type(error).__name__ == "SafetensorError" or "deserializ" in str(error).lower()


def load_known_encoder(
    name_or_path: str,
    model_type: str,
    pooler_type: str | None,
    max_length: int | None,
    device: str | torch.device | None,
    dtype: torch.dtype | None,
    show_progress_bar: bool,
    trust_remote_code: bool,
) -> LoadedEncoder:
    """:func:`load_encoder` once the model type is known."""
    if model_type == "ifcl":
        encoder = IFCLEncoder.from_pretrained(name_or_path, pooler_type, max_length, device, dtype, show_progress_bar)
        return LoadedEncoder(encoder, model_type, encoder.pooler_type)
    if model_type == "sentence-transformers":
        if pooler_type is not None:
            logger.warning(f"--pooler_type {pooler_type} is ignored: the sentence-transformers model pools itself.")
        encoder = SentenceTransformerEncoder.from_pretrained(
            name_or_path, max_length, device, dtype, show_progress_bar, trust_remote_code
        )
        return LoadedEncoder(encoder, model_type, None)
    # A sentence-transformers folder read as a plain encoder: the weights are those of its Transformer module.
    transformer = next(
        (m for m in sentence_transformers_modules(name_or_path) if str(m.get("type", "")).endswith("Transformer")),
        {},
    )
    encoder = TransformersEncoder.from_pretrained(
        name_or_path,
        pooler_type or sentence_transformers_pooler(name_or_path) or "avg",
        max_length,
        device,
        dtype,
        show_progress_bar,
        trust_remote_code,
        subfolder=transformer.get("path", ""),
    )
    return LoadedEncoder(encoder, model_type, encoder.pooler_type)


# ---------------------------------------------------------------------------------------------------- Eq. 10


def mutual_information(
    embeddings: torch.Tensor, twin_embeddings: torch.Tensor, temperature: float = DEFAULT_TEMPERATURE
) -> float:
    """MI(h, h*) of Eq. 10 for one batch of N rows:

    log N + (1/N) Σ_i log( e^{sim(h_i,h_i*)/τ} / Σ_j e^{sim(h_i,h_j*)/τ} ), sim = cosine.

    It is log N minus the InfoNCE loss of the batch, so it lies in (−∞, log N].
    """
    if embeddings.shape != twin_embeddings.shape or embeddings.dim() != 2:
        raise ValueError(
            f"Expected two [N, D] tensors of one shape, got {tuple(embeddings.shape)} and "
            f"{tuple(twin_embeddings.shape)}."
        )
    count = embeddings.shape[0]
    logits = F.normalize(embeddings.double(), dim=-1) @ F.normalize(twin_embeddings.double(), dim=-1).T / temperature
    return math.log(count) + logits.log_softmax(dim=-1).diagonal().mean().item()


class MutualInformationEvaluator:
    """MI(h, h⁺) and MI(h, h⁻) of the paper's Table 4 over a set of sentences (and their translations).

    The sentences are cut into consecutive batches of N (file order); each batch is encoded with dropout on
    (the training views, no gradient) and Eq. 10 is averaged over the batches. A last batch shorter than N is
    left out (log N sets the scale of the figure), unless it is the only one.
    """

    def __init__(
        self,
        sentences: Sequence[str],
        fraternals: Sequence[str] | None = None,
        batch_size: int = 64,
        temperature: float = DEFAULT_TEMPERATURE,
        max_batches: int | None = None,
    ) -> None:
        if fraternals is not None and len(fraternals) != len(sentences):
            raise ValueError(f"{len(sentences)} sentences but {len(fraternals)} translations.")
        if len(sentences) < 2:
            raise ValueError(f"Mutual information needs at least 2 sentences, got {len(sentences)}.")
        if batch_size < 2:
            raise ValueError(f"The MI batch size N must be ≥ 2, got {batch_size}.")
        if temperature <= 0:
            raise ValueError(f"The temperature τ must be > 0, got {temperature}.")
        self.sentences = list(sentences)
        self.fraternals = list(fraternals) if fraternals is not None else None
        self.batch_size = batch_size
        self.temperature = temperature
        self.max_batches = max_batches

    def batches(self) -> list[range]:
        """Row ranges of the batches that count."""
        count = len(self.sentences)
        size = min(self.batch_size, count)
        ranges = [range(start, start + size) for start in range(0, count - size + 1, size)]
        return ranges[: self.max_batches] if self.max_batches else ranges

    def __call__(self, encoder: TwinsEncoder, show_progress_bar: bool = False) -> dict[str, Any]:
        """``{"mi_identical", "mi_fraternal" (None without fraternal twins), "batch_size", "num_batches",
        "temperature", "upper_bound" (log N)}``."""
        ranges = self.batches()
        identical_values, fraternal_values = [], []
        if show_progress_bar:
            from tqdm.auto import tqdm

            ranges = tqdm(ranges, desc="Mutual information", unit="batch")
        for rows in ranges:
            sentences = self.sentences[rows.start : rows.stop]
            fraternals = self.fraternals[rows.start : rows.stop] if self.fraternals is not None else None
            anchors, identical, fraternal = encoder.twins(sentences, fraternals)
            identical_values.append(mutual_information(anchors, identical, self.temperature))
            if fraternal is not None:
                fraternal_values.append(mutual_information(anchors, fraternal, self.temperature))
        size = len(self.batches()[0])
        return {
            "mi_identical": float(np.mean(identical_values)),
            "mi_fraternal": float(np.mean(fraternal_values)) if fraternal_values else None,
            "batch_size": size,
            "num_batches": len(identical_values),
            "temperature": self.temperature,
            "upper_bound": math.log(size),
        }
