"""Configuration of IFCL (Identical and Fraternal Twins) sentence encoders; remote code, beside modeling_ifcl.py."""

from __future__ import annotations

import difflib
import inspect
import math
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from transformers import AutoConfig, PretrainedConfig
from transformers.dynamic_module_utils import get_class_from_dynamic_module

POOLER_TYPES = ("cls", "cls_before_pooler", "avg", "avg_first_last", "avg_top2", "last")
SETTINGS_KEY = "ifcl"  # config.json: the encoder's own config (read without remote code), IFCL's settings under this
FILE_KEYS = ("architectures", "auto_map", "transformers_version", "_name_or_path", "_commit_hash")
# The Python types each setting's annotation allows (an int where a float is asked for; never a bool for a number).
SETTING_TYPES = {
    "float": ((int, float), "a number"),
    "int": ((int,), "an integer"),
    "bool": ((bool,), "True or False"),
    "list[int]": ((list, tuple), "a list of whole numbers"),
    "list[float]": ((list, tuple), "a list of numbers"),
}


def check_setting_types(settings: Any) -> None:
    """``TypeError`` naming the first field of a settings dataclass whose value is not of its annotated type."""
    for setting in fields(settings):
        annotation = setting.type if isinstance(setting.type, str) else str(setting.type)
        annotation = annotation if annotation.startswith("list") else getattr(setting.type, "__name__", annotation)
        allowed, kind = SETTING_TYPES.get(annotation, ((object,), ""))
        value = getattr(settings, setting.name)
        if not isinstance(value, allowed) or (bool not in allowed and isinstance(value, bool)):
            raise TypeError(f"{setting.name} must be {kind}, got {value!r} ({type(value).__name__}).")


@dataclass
class IFCLSettings:
    """IFCL's own settings (the paper's Sections 3.1–3.3): their defaults, help and checks, which the command line,
    ``IFCLLoss``, the model config and the model card read."""

    fusion_rate: float = field(default=0.5, metadata={"help": "ε of Eq. 3: ε·BEL_S(x) + (1−ε)·BEL_F(x⁻)."})
    freeze_word_embeddings: bool = field(
        default=True, metadata={"help": "Keep BEL_S, the encoder's word table, fixed (the paper's reading)."}
    )
    freeze_fraternal_embeddings: bool = field(
        default=True, metadata={"help": "Keep BEL_F fixed (its width-matching projection trains either way)."}
    )
    queue_size: int = field(default=4, metadata={"help": "k: hippocampus queue length in mini-batches (0: none)."})
    forgetting_rate: float = field(default=0.1, metadata={"help": "λ of Eq. 4, p_m = 1 − λ·⌈m/N⌉; λ·k < 1."})
    fraternal_loss_weight: float = field(default=1.0, metadata={"help": "Weight of ℓ^F (Eq. 7)."})
    twins_loss_weight: float = field(default=1.0, metadata={"help": "Weight of the Twins loss ℓ^T (Eq. 8)."})

    def __post_init__(self) -> None:
        check_setting_types(self)
        for name in ("fusion_rate", "forgetting_rate", "fraternal_loss_weight", "twins_loss_weight"):
            if not math.isfinite(getattr(self, name)) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be a finite number ≥ 0, got {getattr(self, name)}.")
        if self.fusion_rate > 1:
            raise ValueError(f"fusion_rate must lie in [0, 1] (Eq. 3 mixes ε·y + (1−ε)·y⁻), got {self.fusion_rate}.")
        if self.queue_size < 0:
            raise ValueError(f"queue_size (k, in mini-batches) must be ≥ 0, got {self.queue_size}.")
        if self.queue_size > 0 and self.forgetting_rate * self.queue_size >= 1:
            raise ValueError(
                f"forgetting_rate × queue_size = {self.forgetting_rate * self.queue_size:g} ≥ 1: the oldest queue "
                "entries would get a forgetting coefficient p = 1 − λ·k ≤ 0 (Eq. 4). Choose forgetting_rate < "
                f"{1 / self.queue_size:g} or a smaller queue_size."
            )

    @property
    def uses_fraternal_twins(self) -> bool:
        """Whether training needs the fraternal view at all (ℓ^F or ℓ^T has a weight)."""
        return self.fraternal_loss_weight > 0 or self.twins_loss_weight > 0


@dataclass
class SharedSettings:
    """What every objective shares: the temperature of its InfoNCE terms, the poolers, and the Matryoshka sizes over
    which its contrastive terms are summed."""

    temperature: float = field(default=0.05, metadata={"help": "τ of the InfoNCE terms (IFCL's Eq. 6–7)."})
    pooler_type: str = field(default="avg", metadata={"help": f"Training pooler, one of {POOLER_TYPES}."})
    eval_pooler_type: str = field(default="avg", metadata={"help": "Pooler of evaluation and of the saved model."})
    matryoshka_dims: list[int] = field(
        default_factory=list,
        metadata={
            "help": "Matryoshka sizes, e.g. 384 256 128 64 32: the loss is summed over the sizes, its contrastive "
            "terms on the embeddings' first that many dimensions, each an embedding of its own. None: the full size."
        },
    )
    matryoshka_weights: list[float] = field(
        default_factory=list, metadata={"help": "A weight per --matryoshka_dims size (default: all 1)."}
    )
    training_dropout: float = field(
        default=0.1,
        metadata={
            "help": "Dropout while training an encoder whose own dropouts are all 0 (decoders, ModernBERT), so that "
            "identical twins differ; 0: none, the twins copies of the anchors (the log says so)."
        },
    )

    def __post_init__(self) -> None:
        check_setting_types(self)
        if not math.isfinite(self.temperature) or self.temperature <= 0:
            raise ValueError(f"temperature (τ) must be a finite number > 0, got {self.temperature}.")
        for name in ("pooler_type", "eval_pooler_type"):
            if getattr(self, name) not in POOLER_TYPES:
                raise ValueError(f"{name} must be one of {', '.join(POOLER_TYPES)}; got {getattr(self, name)!r}.")
        if not math.isfinite(self.training_dropout) or not 0 <= self.training_dropout < 1:
            raise ValueError(f"training_dropout must lie in [0, 1), got {self.training_dropout}.")
        dims, weights = list(self.matryoshka_dims), list(self.matryoshka_weights)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims) or len(set(dims)) < len(
            dims
        ):
            raise ValueError(f"matryoshka_dims must be distinct whole numbers ≥ 1, got {dims}.")
        numbers = all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in weights)
        if weights and (
            len(weights) != len(dims) or not numbers or not all(math.isfinite(w) and w > 0 for w in weights)
        ):
            raise ValueError(
                f"matryoshka_weights must be one number > 0 per size of matryoshka_dims {dims}, got {weights}."
            )


@dataclass
class ModelSettings:
    """What rebuilds a model beyond its settings: the encoder's config and where it came from, the attribute that
    holds it (its own ``base_model_prefix``, so that its weights keep the names its plain ``AutoModel`` reads), BEL_F's
    shape and pad id (None: the encoder's table's) and where it came from, the training length, the queue's N (the
    global batch), whether the three training views share one encoder call (None: on accelerators), the training
    objective (None: IFCL) with its own settings, and the LoRA adapters the encoder trains with (``ifcl.lora``: rank,
    alpha, dropout, target modules; None: none), which a checkpoint holds beside their base layers and loading merges
    (``IFCLModel.from_pretrained``), and a published folder holds merged; as a sentence-transformers base
    defines them, whether a prompt's tokens are pooled and the prompt ``encode`` puts before every sentence unless
    given another; and, for an encoder that ships its own code, its config and model classes as ``auto_map``
    references to the files the model's folder carries beside this one (None: transformers' own classes)."""

    encoder_config: dict[str, Any] = field(default_factory=dict)
    encoder_name_or_path: str | None = None
    encoder_prefix: str | None = None
    fraternal_vocab_size: int | None = None
    fraternal_embedding_size: int | None = None
    fraternal_pad_token_id: int | None = None
    fraternal_model_name_or_path: str | None = None
    max_seq_length: int = 32
    queue_batch_size: int = 64
    stack_views: bool | None = None
    objective: str | None = None
    objective_settings: dict[str, Any] = field(default_factory=dict)
    lora: dict[str, Any] | None = None
    include_prompt: bool = True
    default_prompt: str | None = None
    encoder_code: dict[str, str] | None = None


class IFCLConfig(PretrainedConfig):
    """Every setting needed to rebuild an ``IFCLModel`` from its folder alone: the fields of :class:`ModelSettings`,
    :class:`IFCLSettings` and :class:`SharedSettings` (its ``temperature`` as ``contrastive_temperature``: transformers
    keeps ``temperature`` for generation), checked as they are, then ``PretrainedConfig``'s."""

    model_type = "ifcl"

    def __init__(self, **kwargs: Any) -> None:
        if "contrastive_temperature" in kwargs:
            kwargs["temperature"] = kwargs.pop("contrastive_temperature")
        for group in (ModelSettings, IFCLSettings, SharedSettings):
            given = group(**{f.name: kwargs.pop(f.name) for f in fields(group) if f.name in kwargs})
            for name, value in asdict(given).items():
                setattr(self, "contrastive_temperature" if name == "temperature" else name, value)
        refuse_unknown_settings(kwargs)
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):  # the encoder's, as the Trainer reads them
            kwargs.setdefault(name, self.encoder_config.get(name))
        super().__init__(**kwargs)

    uses_fraternal_twins = IFCLSettings.uses_fraternal_twins  # the same rule on the config's own fields

    @property
    def shares_word_table(self) -> bool:
        """Whether BEL_F is BEL_S itself: no fraternal model and both tables frozen, so a copy would never differ."""
        width = self.encoder_config.get("embedding_size") or self.encoder_config.get("hidden_size")
        return (
            self.uses_fraternal_twins
            and self.fraternal_model_name_or_path is None
            and self.freeze_word_embeddings
            and self.freeze_fraternal_embeddings
            and self.fraternal_embedding_size in (None, width)
            and self.fraternal_vocab_size in (None, self.encoder_config.get("vocab_size"))
        )

    def build_encoder_config(self) -> PretrainedConfig:
        """The encoder's own config object: of transformers' class for its model type, or, for an encoder with its own
        code (``encoder_code``), of its class in the model's folder (``name_or_path``), whose ``auto_map`` then
        leads ``AutoModel.from_config`` to its model class there."""
        if not self.encoder_config:
            raise ValueError("IFCLConfig.encoder_config is empty: the config does not say which encoder to build.")
        settings = dict(self.encoder_config)
        if not self.encoder_code:
            return AutoConfig.for_model(settings.pop("model_type"), **settings)
        config = get_class_from_dynamic_module(self.encoder_code["AutoConfig"], self.name_or_path).from_dict(settings)
        config.auto_map, config.name_or_path = dict(self.encoder_code), self.name_or_path
        return config

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> IFCLConfig:
        return super().from_dict(ifcl_config_dict(config_dict) or config_dict, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs: Any) -> IFCLConfig:
        """Without transformers' warning that config.json names the encoder's model type (it does on purpose)."""
        config_dict, kwargs = cls.get_config_dict(pretrained_model_name_or_path, **kwargs)
        loaded = cls.from_dict(config_dict, **kwargs)
        (loaded[0] if isinstance(loaded, tuple) else loaded).name_or_path = pretrained_model_name_or_path
        return loaded

    def to_dict(self) -> dict[str, Any]:
        """config.json's form: the encoder's config with its model type, IFCL's settings under ``"ifcl"``."""
        output = super().to_dict()
        encoder = output.pop("encoder_config", None) or {}
        if not encoder:  # transformers' default config, made to compare with
            return {**output, "encoder_config": encoder}
        settings = {name: output.pop(name) for name in setting_names() if name in output}
        output.pop("model_type", None)
        return {**output, **{k: v for k, v in encoder.items() if k not in FILE_KEYS}, SETTINGS_KEY: settings}


def refuse_unknown_settings(names: Any) -> None:
    """``ValueError`` naming a keyword that is neither an IFCL setting nor one ``PretrainedConfig`` takes, with the
    closest setting's name (``fusion_rat`` → ``fusion_rate``): a typo would otherwise be stored and ignored."""
    known = {*inspect.signature(PretrainedConfig.__init__).parameters, *PretrainedConfig().to_dict(), *FILE_KEYS}
    known |= {"pad_token_id", "bos_token_id", "eos_token_id", "name_or_path", "output_attentions", "encoder_config"}
    known |= {"attn_implementation", "experts_implementation"}  # PretrainedConfig pops them; from_dict may pass them
    for name in (name for name in names if not name.startswith("_") and name not in known):
        close = difflib.get_close_matches(name, setting_names(), n=1)
        hint = f"; did you mean {close[0]}?" if close else f". IFCL's settings: {', '.join(setting_names())}."
        raise ValueError(f"{name} is not a setting of IFCLConfig{hint}")


def setting_names() -> list[str]:
    """The names config.json keeps under ``"ifcl"``."""
    names = [f.name for group in (ModelSettings, IFCLSettings, SharedSettings) for f in fields(group)]
    return [name.replace("temperature", "contrastive_temperature") for name in names if name != "encoder_config"]


def ifcl_config_dict(config: dict[str, Any]) -> dict[str, Any] | None:
    """An IFCL config.json in :class:`IFCLConfig`'s flat form (None for any other model's config)."""
    if not isinstance(config.get(SETTINGS_KEY), dict):
        return None
    encoder = {key: value for key, value in config.items() if key != SETTINGS_KEY}
    file_keys = {key: encoder.pop(key) for key in FILE_KEYS if key in encoder}
    names = setting_names()
    given = {key: encoder.pop(key) for key in names if key in encoder}  # settings given beside the file's
    saved = {key: value for key, value in config[SETTINGS_KEY].items() if key in names}
    return {**file_keys, **saved, **given, "encoder_config": encoder}
