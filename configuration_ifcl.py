"""Configuration of IFCL (Identical and Fraternal Twins contrastive learning) sentence encoders.

This file travels with every saved model as remote code, beside ``modeling_ifcl.py``.
"""

from __future__ import annotations

import inspect
import math
import os
from typing import Any

from transformers import AutoConfig, PretrainedConfig

POOLER_TYPES = ("cls", "cls_before_pooler", "avg", "avg_first_last", "avg_top2")
# The objective whose model holds the fraternal word table and the hippocampus queue; every other objective's model
# holds neither. The one place that tells IFCL from its peers by name: the rest reads the config's settings. Names
# are checked where training starts (``ifcl.objectives.objective_class``), not here: a saved model carries this file.
DEFAULT_OBJECTIVE = "ifcl"
# config.json holds the encoder's own config at its top level (its model_type too), so that AutoTokenizer, AutoConfig
# and a plain AutoModel read an IFCL folder as the encoder it holds, with no remote code; IFCL's settings lie under
# this one key. Folders saved before kept the encoder's config under "encoder_config" and said "model_type": "ifcl".
SETTINGS_KEY = "ifcl"
# Keys of config.json that describe the file, not the encoder.
FILE_KEYS = ("architectures", "auto_map", "transformers_version", "_name_or_path", "_commit_hash")


def uses_fraternal_twins(fraternal_loss_weight: float, twins_loss_weight: float) -> bool:
    """Whether training needs the fraternal view at all (ℓ^F or ℓ^T has a weight)."""
    return fraternal_loss_weight > 0 or twins_loss_weight > 0


def check_ifcl_settings(
    *,
    fusion_rate: float,
    queue_size: int,
    forgetting_rate: float,
    temperature: float,
    twins_loss_weight: float = 1.0,
    fraternal_loss_weight: float = 1.0,
    pooler_type: str = "avg",
    eval_pooler_type: str = "avg",
) -> None:
    """Raise ``ValueError`` naming the setting when IFCL settings are impossible.

    Shared by :class:`IFCLConfig` and ``run_ifcl.py`` so that a bad command line stops before any model loads.
    """
    for name, value in (
        ("fusion_rate", fusion_rate),
        ("forgetting_rate", forgetting_rate),
        ("temperature", temperature),
        ("twins_loss_weight", twins_loss_weight),
        ("fraternal_loss_weight", fraternal_loss_weight),
    ):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value}.")  # fmt: skip
    if not 0.0 <= fusion_rate <= 1.0:
        raise ValueError(f"fusion_rate must lie in [0, 1] (Eq. 3 mixes ε·y + (1−ε)·y⁻), got {fusion_rate}.")
    if queue_size < 0:
        raise ValueError(f"queue_size (k, in mini-batches) must be ≥ 0, got {queue_size}.")
    if forgetting_rate < 0:
        raise ValueError(f"forgetting_rate (λ) must be ≥ 0, got {forgetting_rate}.")
    if queue_size > 0 and forgetting_rate * queue_size >= 1.0:
        raise ValueError(
            f"forgetting_rate × queue_size = {forgetting_rate} × {queue_size} = {forgetting_rate * queue_size:g} ≥ 1: "
            f"the oldest queue entries would get a forgetting coefficient p = 1 − λ·k ≤ 0 (Eq. 4). "
            f"Choose forgetting_rate < {1.0 / queue_size:g} or a smaller queue_size."
        )
    if temperature <= 0:
        raise ValueError(f"temperature (τ) must be > 0, got {temperature}.")
    if twins_loss_weight < 0 or fraternal_loss_weight < 0:
        raise ValueError(
            f"loss weights must be ≥ 0, got twins_loss_weight={twins_loss_weight}, "
            f"fraternal_loss_weight={fraternal_loss_weight}."
        )
    for name, value in (("pooler_type", pooler_type), ("eval_pooler_type", eval_pooler_type)):
        if value not in POOLER_TYPES:
            raise ValueError(f"{name} must be one of {', '.join(POOLER_TYPES)}; got {value!r}.")


def check_model_path(option: str, path: str | None) -> None:
    """A Hub id is ``name`` or ``owner/name``: any other model path that is not a folder here is a mistyped one
    (found before anything loads, instead of the Hub client's "Repo id must be in the form ...")."""
    looks_local = path is not None and (path.startswith((".", "/", "~")) or path.count("/") > 1)
    if looks_local and not os.path.isdir(os.path.expanduser(path)):
        raise FileNotFoundError(f"{option} {path}: no such folder (and not a Hub id of the form owner/name).")


class IFCLConfig(PretrainedConfig):
    """Every setting needed to rebuild an :class:`IFCLModel` from its folder alone.

    Args:
        encoder_config: the wrapped encoder's config as a dict (any model ``AutoModel`` builds: BERT, RoBERTa, ...).
        encoder_name_or_path: where the encoder's weights came from (informational, for the model card).
        fraternal_vocab_size: vocabulary size of the fraternal word-embedding table (BEL_F). ``None``: the encoder's.
        fraternal_embedding_size: width of BEL_F. When it differs from the encoder's width, a learned linear map
            brings fraternal embeddings to the encoder's width.
        fraternal_pad_token_id: padding id of the fraternal tokenizer.
        fraternal_model_name_or_path: where BEL_F was initialised from (informational; ``None``: copied from the
            encoder's own word embeddings, and the fraternal text uses the encoder's tokenizer).
        fusion_rate: ε of Eq. 3, fraternal twin input = ε·BEL_S(x) + (1−ε)·BEL_F(x⁻). The paper gives no value;
            0.5 is this project's choice (see the README's sweep).
        freeze_word_embeddings: keep BEL_S, the encoder's input word-embedding table, at its starting values (the
            paper, after Eq. 1: "the embedding layer without trainable parameters").
        freeze_fraternal_embeddings: keep BEL_F, the fraternal word-embedding table, at its starting values. The
            width-matching projection after it, when there is one, trains either way.
        queue_size: k of the hippocampus queue, in mini-batches (0 disables it).
        queue_batch_size: N, the anchors one optimizer step pushes (the global batch: per-device batch × processes ×
            gradient accumulation). The queue holds k·N entries.
        forgetting_rate: λ of Eq. 4, p_m = 1 − λ·⌈m/N⌉; λ·k < 1 is required.
        contrastive_temperature: τ of Eq. 6–7 (``--temperature`` on the command line; the config cannot call it
            ``temperature``, which transformers reserves for generation).
        fraternal_loss_weight, twins_loss_weight: weights of ℓ^F and ℓ^T in Eq. 9 (both 0 skips the fraternal pass).
        pooler_type: sentence representation used in training; ``cls`` adds SimCSE's MLP over [CLS].
        eval_pooler_type: sentence representation used by ``encode`` and evaluation (what a saved model embeds with).
        max_seq_length: truncation length of the training sentences (``encode`` truncates only at the encoder's limit).
        export_sentence_transformers: ``save_pretrained`` also writes the sentence-transformers modules (the root
            folder as the Transformer module, then the pooler), so the folder loads with ``SentenceTransformer``.
        objective: the training objective the model was (or is being) trained with, a name of
            ``ifcl.objectives.OBJECTIVES`` (checked when training starts). For other objectives than ``ifcl``,
            queue_size and the fraternal and Twins loss weights are set to 0 and no word table is frozen.
        objective_settings: that objective's own settings (``ifcl.objectives.<name>``), as a dict.
        stack_views: encode the three training views in one encoder call (True), in two (False: anchors and
            identical twins, then fraternal twins), or choose by device (None: one call on accelerators, two on CPU).
        encoder_prefix: the attribute, and so the prefix of the weight names, under which the model holds the
            encoder: the encoder's own ``base_model_prefix`` (``bert`` for BERT), so that a plain ``AutoModel`` of the
            encoder loads the trained encoder from the same weights file. ``None``: ``encoder`` (folders saved before).

    config.json holds the encoder's config at its top level and these settings under ``"ifcl"``
    (:func:`ifcl_config_dict` reads both that and the earlier nested form).
    """

    model_type = "ifcl"

    def __init__(
        self,
        encoder_config: dict[str, Any] | None = None,
        encoder_name_or_path: str | None = None,
        fraternal_vocab_size: int | None = None,
        fraternal_embedding_size: int | None = None,
        fraternal_pad_token_id: int | None = None,
        fraternal_model_name_or_path: str | None = None,
        fusion_rate: float = 0.5,
        freeze_word_embeddings: bool = True,
        freeze_fraternal_embeddings: bool = True,
        queue_size: int = 4,
        queue_batch_size: int = 64,
        forgetting_rate: float = 0.1,
        contrastive_temperature: float = 0.05,
        fraternal_loss_weight: float = 1.0,
        twins_loss_weight: float = 1.0,
        pooler_type: str = "avg",
        eval_pooler_type: str = "avg",
        max_seq_length: int = 32,
        stack_views: bool | None = None,
        export_sentence_transformers: bool = True,
        objective: str = DEFAULT_OBJECTIVE,
        objective_settings: dict[str, Any] | None = None,
        encoder_prefix: str | None = None,
        **kwargs: Any,
    ) -> None:
        if objective != DEFAULT_OBJECTIVE:
            # The queue, the fraternal and Twins losses and the frozen word table (IFCL's reading of BEL_S) are
            # IFCL's: the other objectives build neither the fraternal table nor the hippocampus queue and train the
            # whole encoder, as their papers do, and the saved config says so.
            queue_size, fraternal_loss_weight, twins_loss_weight = 0, 0.0, 0.0
            freeze_word_embeddings = freeze_fraternal_embeddings = False
        check_ifcl_settings(
            fusion_rate=fusion_rate,
            queue_size=queue_size,
            forgetting_rate=forgetting_rate,
            temperature=contrastive_temperature,
            twins_loss_weight=twins_loss_weight,
            fraternal_loss_weight=fraternal_loss_weight,
            pooler_type=pooler_type,
            eval_pooler_type=eval_pooler_type,
        )
        if queue_batch_size < 1:
            raise ValueError(f"queue_batch_size (N) must be ≥ 1, got {queue_batch_size}.")
        self.encoder_config = encoder_config if encoder_config is not None else {}
        self.encoder_name_or_path = encoder_name_or_path
        self.fraternal_vocab_size = fraternal_vocab_size
        self.fraternal_embedding_size = fraternal_embedding_size
        self.fraternal_pad_token_id = fraternal_pad_token_id
        self.fraternal_model_name_or_path = fraternal_model_name_or_path
        self.fusion_rate = fusion_rate
        self.freeze_word_embeddings = freeze_word_embeddings
        self.freeze_fraternal_embeddings = freeze_fraternal_embeddings
        self.queue_size = queue_size
        self.queue_batch_size = queue_batch_size
        self.forgetting_rate = forgetting_rate
        self.contrastive_temperature = contrastive_temperature
        self.fraternal_loss_weight = fraternal_loss_weight
        self.twins_loss_weight = twins_loss_weight
        self.pooler_type = pooler_type
        self.eval_pooler_type = eval_pooler_type
        self.max_seq_length = max_seq_length
        self.stack_views = stack_views
        self.export_sentence_transformers = export_sentence_transformers
        self.objective = objective
        self.objective_settings = dict(objective_settings or {})
        self.encoder_prefix = encoder_prefix
        super().__init__(**kwargs)

    @property
    def shares_word_table(self) -> bool:
        """Whether BEL_F is BEL_S itself: no fraternal model gave it its own table and both tables stay frozen, so a
        copy would never differ from the encoder's table; it is then neither built nor stored a second time."""
        return (
            self.uses_fraternal_twins
            and self.fraternal_model_name_or_path is None
            and self.freeze_word_embeddings
            and self.freeze_fraternal_embeddings
            and self.fraternal_embedding_size in (None, self.encoder_config.get("hidden_size"))
            and self.fraternal_vocab_size in (None, self.encoder_config.get("vocab_size"))
        )

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> IFCLConfig:
        """Read config.json in either form (:func:`ifcl_config_dict`)."""
        return super().from_dict(ifcl_config_dict(config_dict) or config_dict, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs: Any) -> IFCLConfig:
        """``PretrainedConfig.from_pretrained`` without its warning that config.json names the encoder's model type
        (it does so on purpose: see :data:`SETTINGS_KEY`)."""
        config_dict, kwargs = cls.get_config_dict(pretrained_model_name_or_path, **kwargs)
        return cls.from_dict(config_dict, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        """config.json's form: the encoder's config at the top level, with its model type, and IFCL's settings under
        ``"ifcl"``. A config without an encoder (transformers' default one) keeps the flat form."""
        output = super().to_dict()
        encoder = output.pop("encoder_config", None) or {}
        if not encoder:
            return {**output, "encoder_config": encoder}
        settings = {name: output.pop(name) for name in SETTING_NAMES if name in output}
        output.pop("model_type", None)
        encoder_fields = {key: value for key, value in encoder.items() if key not in FILE_KEYS}
        return {**output, **encoder_fields, SETTINGS_KEY: settings}

    @property
    def uses_fraternal_twins(self) -> bool:
        """Whether training needs the fraternal view at all (ℓ^F or ℓ^T has a weight)."""
        return uses_fraternal_twins(self.fraternal_loss_weight, self.twins_loss_weight)

    def build_encoder_config(self) -> PretrainedConfig:
        """The wrapped encoder's own config object."""
        if not self.encoder_config:
            raise ValueError("IFCLConfig.encoder_config is empty: the config does not say which encoder to build.")
        settings = dict(self.encoder_config)
        model_type = settings.pop("model_type")
        return AutoConfig.for_model(model_type, **settings)


# IFCL's own settings: the arguments of IFCLConfig, which config.json keeps under SETTINGS_KEY.
SETTING_NAMES = tuple(
    name
    for name in inspect.signature(IFCLConfig.__init__).parameters
    if name not in ("self", "encoder_config", "kwargs")
)


def ifcl_config_dict(config: dict[str, Any]) -> dict[str, Any] | None:
    """An IFCL model's config.json in :class:`IFCLConfig`'s own form (``encoder_config`` and the settings side by
    side), from either form it is saved in; None for any other model's config."""
    if isinstance(config.get(SETTINGS_KEY), dict):
        encoder = {key: value for key, value in config.items() if key != SETTINGS_KEY}
        file_keys = {key: encoder.pop(key) for key in FILE_KEYS if key in encoder}
        given = {key: encoder.pop(key) for key in SETTING_NAMES if key in encoder}  # settings given beside the file's
        return {**file_keys, **config[SETTINGS_KEY], **given, "encoder_config": encoder}
    if config.get("model_type") == IFCLConfig.model_type:
        return dict(config)
    return None
