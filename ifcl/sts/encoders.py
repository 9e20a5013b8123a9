"""The encoders ``evaluate_sts.py`` scores (:func:`load_encoder`), and the mutual information of the IFCL paper's
Eq. 10 (Table 4). The Trainer does not import this module.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from tqdm.auto import tqdm
from transformers import AutoModel

from configuration_ifcl import POOLER_TYPES, IFCLConfig
from ifcl.model import IFCLModel, check_custom_code, check_own_code_trusted
from ifcl.pooling import BaseFolder, no_pooler_for
from modeling_ifcl import (
    ALL_LAYER_POOLERS,
    embed_sorted_by_length,
    load_tokenizer,
    max_input_length,
    pool_hidden_states,
)

logger = logging.getLogger(__name__)

MODEL_TYPES = ("auto", "ifcl", "transformers", "sentence-transformers")
DEFAULT_TEMPERATURE = 0.05

Views = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


@contextmanager
def training_mode(module: nn.Module, training: bool) -> Iterator[nn.Module]:
    """The module in training mode (dropout on) or not inside the block, its previous mode restored afterwards."""
    was_training = module.training
    module.train(training)
    try:
        yield module
    finally:
        module.train(was_training)


class Encoder:
    """A model behind ``IFCLModel.encode``'s signature (what :class:`STSEvaluator` calls), with ``twins``: anchors,
    identical twins and (IFCL models trained with them) fraternal twins of a batch, dropout on, as in training.

    Subclasses write ``embed`` (evaluation embeddings) and ``training_views``.
    """

    def __init__(self, model: nn.Module, max_length: int | None = None) -> None:
        self.model = model
        self.max_length = max_length
        self.truncate_dim: int | None = None

    @property
    def device(self) -> torch.device:
        return self.model.device

    def encode(
        self,
        sentences: Sequence[str],
        batch_size: int = 128,
        show_progress_bar: bool = False,
        *,
        description: str = "Encoding",
    ) -> torch.Tensor:
        """Evaluation embeddings, one float32 CPU row per sentence, in input order (their first
        :attr:`truncate_dim` dimensions when set: a Matryoshka size)."""
        with training_mode(self.model, False):
            return self.embed(list(sentences), batch_size, show_progress_bar, description)[:, : self.truncate_dim]

    @torch.no_grad()
    def twins(self, sentences: Sequence[str], fraternals: Sequence[str] | None = None) -> Views:
        with training_mode(self.model, True):
            return self.training_views(list(sentences), fraternals)


class TransformersEncoder(Encoder):
    """A plain ``transformers`` encoder (``AutoModel``) with a pooler chosen by name (``cls``: its ``pooler_output``),
    batched by length as ``IFCLModel.encode`` is; without a pooler head ``cls`` falls back to ``cls_before_pooler``."""

    def __init__(self, model: nn.Module, tokenizer, pooler_type: str = "avg", max_length: int | None = None) -> None:
        if pooler_type == "cls" and getattr(model, "pooler", "no pooler attribute") is None:
            logger.warning(
                f"{type(model).__name__} has no pooler head, so there is no pooler_output for 'cls': using the "
                "[CLS] state itself ('cls_before_pooler')."
            )
            pooler_type = "cls_before_pooler"
        super().__init__(model, max_length or max_input_length(tokenizer, model.config))
        self.tokenizer = tokenizer
        self.pooler_type = pooler_type

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        pooler_type: str = "avg",
        max_length: int | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        trust_remote_code: bool = False,
        subfolder: str = "",
    ) -> TransformersEncoder:
        """Load the tokenizer (``load_tokenizer``: a folder without one is refused before any weights load) and
        ``AutoModel`` from a folder or Hub id, in eval mode on ``device`` (None: the CPU)."""
        options = {"trust_remote_code": trust_remote_code, "subfolder": subfolder}
        tokenizer = load_tokenizer(name_or_path, **options)
        model = AutoModel.from_pretrained(name_or_path, **options)
        model.to(device=device, dtype=dtype).eval()
        return cls(model, tokenizer, pooler_type, max_length)

    def embed_batch(self, batch) -> torch.Tensor:
        """Pooled float32 embeddings of one tokenized batch (in whatever mode the model is)."""
        batch = batch.to(self.device)
        all_layers = self.pooler_type in ALL_LAYER_POOLERS
        outputs = self.model(**batch, output_hidden_states=all_layers, return_dict=True)
        if self.pooler_type == "cls":
            return outputs.pooler_output.to(torch.float32)
        hidden_states = outputs.hidden_states if all_layers else (outputs.last_hidden_state,)
        return pool_hidden_states(
            self.pooler_type, batch["attention_mask"], [hidden.to(torch.float32) for hidden in hidden_states]
        )

    def embed(self, sentences: list[str], batch_size: int, show_progress_bar: bool, description: str) -> torch.Tensor:
        return embed_sorted_by_length(
            sentences, self.tokenizer, self.embed_batch, batch_size, self.max_length, show_progress_bar, description
        )

    def training_views(self, sentences: list[str], fraternals: Sequence[str] | None) -> Views:
        """Anchors and identical twins: the batch encoded twice in one call (no fraternal view)."""
        batch = self.tokenizer(
            sentences * 2, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        anchors, identical = self.embed_batch(batch).cpu().split(len(sentences))
        return anchors, identical, None


class SentenceTransformerEncoder(Encoder):
    """A sentence-transformers model (a folder with ``modules.json``); its own progress bar has no name to take."""

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        max_length: int | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        trust_remote_code: bool = False,
        subfolder: str = "",
    ) -> SentenceTransformerEncoder:
        """``SentenceTransformer`` of a folder or Hub id, in eval mode on ``device`` (None: the CPU, as the other
        kinds); a local folder's tokenizer (in ``subfolder``, its Transformer module's) is checked first, as theirs."""
        # sentence-transformers is an optional extra (ifcl[sentence-transformers])
        from sentence_transformers import SentenceTransformer

        if os.path.isdir(name_or_path):
            load_tokenizer(name_or_path, subfolder, trust_remote_code)
        model = SentenceTransformer(name_or_path, device=str(device or "cpu"), trust_remote_code=trust_remote_code)
        if max_length is not None:
            model.max_seq_length = max_length
        model.to(dtype=dtype).eval()
        return cls(model)

    def embed(self, sentences: list[str], batch_size: int, show_progress_bar: bool, description: str) -> torch.Tensor:
        embeddings = self.model.encode(
            sentences, batch_size=batch_size, convert_to_tensor=True, show_progress_bar=show_progress_bar
        )
        return embeddings.float().cpu()

    def training_views(self, sentences: list[str], fraternals: Sequence[str] | None) -> Views:
        """Anchors and identical twins: two forward passes (no fraternal view)."""
        # sentence-transformers is an optional extra (ifcl[sentence-transformers])
        from sentence_transformers.util import batch_to_device

        features = batch_to_device(self.model.preprocess(sentences), self.device)
        # The modules add their outputs to the dict they are given: each pass gets its own copy.
        anchors = self.model(dict(features))["sentence_embedding"].float().cpu()
        identical = self.model(dict(features))["sentence_embedding"].float().cpu()
        return anchors, identical, None


class IFCLEncoder(Encoder):
    """An :class:`IFCLModel`: ``encode`` is the model's own (what the Trainer evaluates with), truncated at
    ``max_length`` (``--max_seq_length``); ``twins`` is the training forward (``return_twins=True``)."""

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        pooler_type: str | None = None,
        max_length: int | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        trust_remote_code: bool = False,
    ) -> IFCLEncoder:
        """This project's own :class:`IFCLModel` (the ``.py`` files saved beside the weights never run) with its
        tokenizer, read first, in eval mode on ``device``; ``pooler_type`` replaces its evaluation pooler.
        ``trust_remote_code`` reaches only the encoder's own code, which the folder's config names."""
        config = IFCLConfig.from_pretrained(name_or_path)
        check_own_code_trusted(config.encoder_code, name_or_path, trust_remote_code)
        tokenizer = load_tokenizer(name_or_path, config=config.build_encoder_config())
        model = IFCLModel.from_pretrained(name_or_path, config=config, trust_remote_code=trust_remote_code)
        model._tokenizer = tokenizer
        if pooler_type is not None and pooler_type != model.config.eval_pooler_type:
            if pooler_type == "cls" and model.mlp is None:
                raise ValueError(
                    f"{name_or_path}: pooler 'cls' is SimCSE's MLP, which this IFCL model does not have (it was "
                    f"trained with pooler {model.config.pooler_type!r}); choose another --pooler_type."
                )
            model.config.eval_pooler_type = pooler_type
        model.to(device=device, dtype=dtype).eval()
        return cls(model, max_length)

    def embed(self, sentences: list[str], batch_size: int, show_progress_bar: bool, description: str) -> torch.Tensor:
        return self.model.encode(
            sentences,
            batch_size=batch_size,
            show_progress_bar=show_progress_bar,
            max_length=self.max_length,
            description=description,
        )

    def training_views(self, sentences: list[str], fraternals: Sequence[str] | None) -> Views:
        """Each side tokenized at the training length ``config.max_seq_length``, as ``run_ifcl.py`` tokenizes."""
        model = self.model
        options = {"padding": True, "truncation": True, "max_length": model.config.max_seq_length}
        inputs = dict(model.tokenizer(sentences, return_tensors="pt", **options).to(self.device))
        if fraternals is not None and model.config.uses_fraternal_twins:
            fraternal = model.fraternal_tokenizer(list(fraternals), return_tensors="pt", **options).to(self.device)
            inputs["fraternal_input_ids"] = fraternal["input_ids"]
            inputs["fraternal_attention_mask"] = fraternal["attention_mask"]
        views = model(**inputs, return_twins=True)
        fraternal_view = views.fraternal.float().cpu() if views.fraternal is not None else None
        return views.anchor.float().cpu(), views.identical.float().cpu(), fraternal_view


# ---------------------------------------------------------------------------------------------------- loading


@dataclass
class LoadedEncoder:
    """An encoder ready for :class:`STSEvaluator`, with what it is."""

    encoder: Encoder
    model_type: str
    pooler_type: str | None


def load_encoder(
    name_or_path: str,
    model_type: str = "auto",
    pooler_type: str | None = None,
    max_length: int | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    trust_remote_code: bool = False,
) -> LoadedEncoder:
    """The encoder of a folder or Hub id, loaded by its kind's ``from_pretrained``: an IFCL model, a
    sentence-transformers model or a plain encoder, with ``pooler_type`` and ``model_type`` as docs/evaluation.md
    tells. The settings, the package a sentence-transformers model needs, custom code without ``trust_remote_code``
    (refused) and the tokenizer (read first: a folder without one, or with a damaged one, is refused) are checked
    before any weights load; a damaged weights file ends in one ``OSError`` line."""
    if model_type not in MODEL_TYPES:
        raise ValueError(f"--model_type must be one of {MODEL_TYPES}, got {model_type!r}.")
    if pooler_type is not None and pooler_type not in POOLER_TYPES:
        raise ValueError(f"--pooler_type must be one of {POOLER_TYPES}, got {pooler_type!r}.")
    folder = BaseFolder.read(name_or_path)  # config.json and the sentence-transformers files, read once
    if model_type == "auto":
        model_type = folder.kind
    if model_type == "sentence-transformers":
        try:
            import sentence_transformers  # noqa: F401
        except ImportError as error:  # not installed, or installed without a dependency it needs
            raise ValueError(
                f"{name_or_path} is a sentence-transformers model, and sentence-transformers cannot be imported "
                f"({error}): pip install sentence-transformers, or read its encoder with --model_type transformers."
            ) from None
    if model_type != "ifcl":  # an IFCL model's own code never runs
        check_custom_code(name_or_path, trust_remote_code, folder.transformer_folder)
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        if model_type == "ifcl":
            encoder = IFCLEncoder.from_pretrained(
                name_or_path, pooler_type, max_length, device, dtype, trust_remote_code
            )
            return LoadedEncoder(encoder, model_type, encoder.model.config.eval_pooler_type)
        if model_type == "sentence-transformers":
            if pooler_type is not None:
                logger.warning(
                    f"--pooler_type {pooler_type} is ignored: the sentence-transformers model pools itself."
                )
            encoder = SentenceTransformerEncoder.from_pretrained(
                name_or_path, max_length, device, dtype, trust_remote_code, subfolder=folder.transformer_folder
            )
            return LoadedEncoder(encoder, model_type, None)
        base = folder.pooling if pooler_type is None else None
        if base is not None and base.pooler is None:
            raise no_pooler_for(base, name_or_path, "--pooler_type")
        encoder = TransformersEncoder.from_pretrained(
            name_or_path,
            pooler_type or (base.pooler if base else None) or "avg",
            max_length,
            device,
            dtype,
            trust_remote_code,
            subfolder=folder.transformer_folder,
        )
        return LoadedEncoder(encoder, model_type, encoder.pooler_type)
    except Exception as error:
        if type(error).__name__ != "SafetensorError" and "deserializ" not in str(error).lower():
            raise
        raise OSError(
            f"{name_or_path}: its weights cannot be read ({type(error).__name__}: {str(error).splitlines()[0]}); the "
            "file is damaged or was cut short (a full disk, an interrupted copy): save or copy the model again."
        ) from error


# ---------------------------------------------------------------------------------------------------- Eq. 10


def mutual_information(
    embeddings: torch.Tensor, twin_embeddings: torch.Tensor, temperature: float = DEFAULT_TEMPERATURE
) -> float:
    """MI(h, h*) of Eq. 10 for one batch of N rows:

    log N + (1/N) Σ_i log( e^{sim(h_i,h_i*)/τ} / Σ_j e^{sim(h_i,h_j*)/τ} ), sim = cosine.

    It is log N minus the InfoNCE loss of the batch, so it lies in (−∞, log N].
    """
    count = embeddings.shape[0]
    logits = F.normalize(embeddings.double(), dim=-1) @ F.normalize(twin_embeddings.double(), dim=-1).T / temperature
    return math.log(count) + logits.log_softmax(dim=-1).diagonal().mean().item()


def consecutive_batches(count: int, size: int) -> list[range]:
    """Rows ``0..count`` cut into consecutive batches of ``size`` (at most ``count``); a last, shorter batch is left
    out (log N sets the scale of Eq. 10), unless it is the only one."""
    size = min(size, count)
    return [range(start, start + size) for start in range(0, count - size + 1, size)]


class MutualInformationEvaluator:
    """MI(h, h⁺) and MI(h, h⁻) of Table 4 (docs/evaluation.md): Eq. 10 averaged over :func:`consecutive_batches` of
    N sentences (and their translations), each encoded with dropout on (the training views, no gradient)."""

    def __init__(
        self,
        sentences: Sequence[str],
        fraternals: Sequence[str] | None = None,
        batch_size: int = 64,
        temperature: float = DEFAULT_TEMPERATURE,
        max_batches: int | None = None,
    ) -> None:
        if len(sentences) < 2:
            raise ValueError(f"Mutual information needs at least 2 sentences, got {len(sentences)}.")
        self.sentences = list(sentences)
        self.fraternals = list(fraternals) if fraternals is not None else None
        self.batch_size = batch_size
        self.temperature = temperature
        self.max_batches = max_batches

    def batches(self) -> list[range]:
        """Row ranges of the batches that count."""
        return consecutive_batches(len(self.sentences), self.batch_size)[: self.max_batches or None]

    def __call__(self, encoder: Encoder, show_progress_bar: bool = False) -> dict[str, Any]:
        """``{"mi_identical", "mi_fraternal" (None without fraternal twins), "batch_size", "num_batches",
        "temperature", "upper_bound" (log N)}``."""
        ranges = self.batches()
        size = len(ranges[0])
        identical_values, fraternal_values = [], []
        if show_progress_bar:
            ranges = tqdm(ranges, desc="Mutual information", unit="batch")
        for rows in ranges:
            fraternals = self.fraternals[rows.start : rows.stop] if self.fraternals is not None else None
            anchors, identical, fraternal = encoder.twins(self.sentences[rows.start : rows.stop], fraternals)
            identical_values.append(mutual_information(anchors, identical, self.temperature))
            if fraternal is not None:
                fraternal_values.append(mutual_information(anchors, fraternal, self.temperature))
        return {
            "mi_identical": float(np.mean(identical_values)),
            "mi_fraternal": float(np.mean(fraternal_values)) if fraternal_values else None,
            "batch_size": size,
            "num_batches": len(identical_values),
            "temperature": self.temperature,
            "upper_bound": math.log(size),
        }
