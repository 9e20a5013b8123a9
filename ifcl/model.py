"""``IFCLModel`` as training uses it: the published model (``modeling_ifcl.IFCLModel``, the remote code a saved
folder carries) with what only training needs: building it from a pretrained encoder (:meth:`IFCLModel.from_encoder`:
the base's poolers and prompts, its tokenizer fitted, BEL_F from a fraternal model with its projection started at
BEL_S's scale), loading a LoRA run's checkpoint merged, and saving the folder with its tokenizers and remote code.

``from ifcl import IFCLModel`` gives this class; a folder it saves loads with the remote code alone.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedTokenizerBase
from transformers.dynamic_module_utils import custom_object_save
from transformers.utils import logging

import modeling_ifcl
from configuration_ifcl import IFCLConfig, ifcl_config_dict
from ifcl.files import check_model_path, public_name, read_json
from ifcl.lora import lora_weights, merge_lora
from ifcl.pooling import BaseFolder, base_settings
from ifcl.tokenization import check_vocabulary, fit_tokenizer, without_processor_class
from modeling_ifcl import FRATERNAL_TOKENIZER, checked_truncate_dim, load_tokenizer, word_table_of

logger = logging.get_logger(__name__)


AUTO_MODEL = "modeling_ifcl.IFCLModel"  # the class a saved folder's auto_map names


def dropout_settings(encoder_config: dict[str, Any]) -> dict[str, float]:
    """An encoder config's dropout rates by name (its classifier's left out): where they are all 0, training gives
    the encoder ``training_dropout`` (:func:`fit_dropout`); where one is not, the encoder trains with its own."""
    return {
        k: float(v)
        for k, v in encoder_config.items()
        if "dropout" in k and "classifier" not in k and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def fit_dropout(encoder: nn.Module, rate: float) -> str | None:
    """Identical twins are a sentence under two dropout masks, so an ``encoder`` (a transformers model) whose every
    dropout is 0 (most decoders, ModernBERT, ALBERT) gets ``rate`` (the config's ``training_dropout``) in every
    dropout of its config and modules, as LLM2Vec gives one; returns what was set (or, with ``rate`` 0, that the
    twins are copies), for the log. ``ValueError`` naming the setting when the encoder has no dropout to set."""
    encoder_config = encoder.config
    rates = dropout_settings(encoder_config.to_dict())
    if any(value > 0 for value in rates.values()):
        return None
    # LoRA's dropout on the adapters' input (ifcl.lora) is its own setting, --lora_dropout.
    places = [m for n, m in encoder.named_modules() if isinstance(m, nn.Dropout) and "lora_dropout" not in n]
    floats = [(m, k) for m in encoder.modules() for k, v in vars(m).items() if "dropout" in k and type(v) is float]
    encoder_name = type(encoder).__name__
    if rate == 0:
        return (
            f"{encoder_name} has no dropout and --training_dropout is 0: identical twins are exact copies of the "
            "anchors"
        )
    if not (places or floats):
        raise ValueError(
            f"{encoder_name} has no dropout ({', '.join(rates) or 'no dropout setting'} 0), so identical twins "
            "would be exact copies of the anchors; set --training_dropout (e.g. 0.1) to train it with dropout."
        )
    for name in rates:
        setattr(encoder_config, name, rate)
    for module in places:
        module.p = rate
    for module, name in floats:
        setattr(module, name, rate)
    return f"{encoder_name} has no dropout: its dropout is {rate} while training"


TRUST_ADVICE = "it runs only with --trust_remote_code; give it if you trust that code."


def check_custom_code(path: str, trust_remote_code: bool, subfolder: str = "", config: dict | None = None) -> None:
    """Refuse, without ``trust_remote_code``, a plain model whose config.json names custom code (``auto_map``), before
    any of it is imported: transformers would ask about it or, for a model type it knows, quietly replace it by its
    own class. An IFCL model's config names its remote code too, which this package never needs (its encoder's own
    code, when it has some, is asked for by :meth:`IFCLModel.from_pretrained`). ``config``: config.json's content,
    when already read."""
    try:
        config = config if config is not None else read_json(path, "config.json", subfolder)
    except (OSError, ValueError):
        return  # not readable here: the loader says why
    if not trust_remote_code and isinstance(config, dict) and config.get("auto_map") and not ifcl_config_dict(config):
        raise ValueError(
            f"{os.path.join(path, subfolder, 'config.json')} names custom code (auto_map): {TRUST_ADVICE}"
        )


def check_own_code_trusted(
    code: dict[str, str] | None, path: str, trust_remote_code: bool, flag: str = "--trust_remote_code"
) -> None:
    """``ValueError`` in one line, naming ``flag``, for an IFCL model whose encoder runs its own code (``code``: its
    config's ``encoder_code``, files of the folder at ``path``) without ``trust_remote_code``: loading would run it."""
    if code and not trust_remote_code:
        raise ValueError(
            f"{path}: its encoder runs its own code ({', '.join(sorted(code.values()))}, in the folder), which runs "
            f"only with {flag}; give it if you trust that code."
        )


def own_code(encoder: nn.Module) -> dict[str, str] | None:
    """The config and model classes of an encoder that ships its own code (transformers loaded them as dynamic
    modules, ``transformers_modules``), as ``auto_map`` references to the files a saved folder carries
    (``module.Class``, wherever the base's ``auto_map`` pointed); None for transformers' own classes."""
    if type(encoder).__module__.split(".")[0] == "transformers":
        return None
    classes = {"AutoConfig": type(encoder.config), "AutoModel": type(encoder)}
    return {auto: f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}" for auto, cls in classes.items()}


# The dtypes a model may be loaded to train in (run_ifcl.py --dtype, from_encoder's dtype): "auto" is the checkpoint's.
TRAINING_DTYPES = ("float32", "bfloat16", "float16", "auto")
LOW_PRECISION = (torch.bfloat16, torch.float16)


def checked_dtype(dtype: str | torch.dtype) -> str | torch.dtype:
    """``dtype`` as ``from_pretrained`` takes it: a ``torch.dtype`` of floating point, or one of :data:`TRAINING_DTYPES`
    (a name becomes its ``torch.dtype``); ``ValueError`` naming the setting otherwise."""
    if isinstance(dtype, str) and dtype in TRAINING_DTYPES:
        return dtype if dtype == "auto" else getattr(torch, dtype)
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    raise ValueError(f"dtype must be one of {', '.join(TRAINING_DTYPES)} (or a floating torch.dtype), got {dtype!r}.")


def precision_note(model: nn.Module, name_or_path: str, saved_dtype: Any) -> tuple[int, str]:
    """What to log about the precision ``model`` trains in, loaded from ``name_or_path`` whose checkpoint holds
    ``saved_dtype``: its weights' dtype (float32 master weights by default, whatever the checkpoint holds), or a
    warning of what pure low-precision training costs."""
    dtype = model.dtype
    saved = str(saved_dtype).removeprefix("torch.") if saved_dtype is not None else "an unrecorded dtype"
    if dtype not in LOW_PRECISION:
        return logging.INFO, f"{name_or_path}: training {dtype_name(dtype)} weights (its checkpoint holds {saved})."
    return logging.WARNING, (
        f"{name_or_path}: training in pure {dtype_name(dtype)} (its checkpoint holds {saved}): the optimizer steps "
        f"{dtype_name(dtype)} weights, and an update smaller than a weight's resolution (about 1/256 of it for "
        "bfloat16) rounds away, so at small learning rates most weights barely move. Load in float32 (the default) "
        "and train with --bf16 for mixed precision."
    )


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` as ``bfloat16``."""
    return str(dtype).removeprefix("torch.")


def load_fraternal(
    name_or_path: str | None, trust_remote_code: bool = False, dtype: str | torch.dtype = torch.float32
) -> tuple[torch.Tensor | None, PreTrainedTokenizerBase | None]:
    """BEL_F's starting table, the fraternal model's word table (checked as the encoder's is) in ``dtype``, and its
    tokenizer (read first: a folder without one, or with code not trusted, is refused before any weights load);
    (None, None) without a fraternal model."""
    if name_or_path is None:
        return None, None
    check_custom_code(name_or_path, trust_remote_code)
    tokenizer = load_tokenizer(name_or_path, trust_remote_code=trust_remote_code)
    config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    check_vocabulary(tokenizer, getattr(config, "vocab_size", None), name_or_path)
    model = AutoModel.from_pretrained(name_or_path, config=config, trust_remote_code=trust_remote_code, dtype=dtype)
    return word_table_of(model, name_or_path).weight, tokenizer


@torch.no_grad()
def scaled_orthogonal_projection(
    projection: nn.Linear, source_table: torch.Tensor, fraternal_table: torch.Tensor
) -> None:
    """Start ``projection`` (BEL_F's width → BEL_S's) as an orthogonal map scaled to give the projected table BEL_S's
    mean variance per dimension, with the bias that gives it BEL_S's mean (a random projection of a narrower table
    would start the fraternal twins at a fraction of BEL_S's scale)."""
    source, fraternal = source_table.detach().float(), fraternal_table.detach().float()
    weight = torch.empty(projection.weight.shape, device=fraternal.device)
    nn.init.orthogonal_(weight)
    fraternal_mean = fraternal.mean(dim=0)
    centred = fraternal - fraternal_mean
    covariance = centred.T @ centred / max(fraternal.shape[0] - 1, 1)
    projected_variance = ((weight @ covariance) * weight).sum(dim=1).mean()  # mean of diag(W Σ Wᵀ)
    weight *= (source.var(dim=0).mean() / projected_variance.clamp_min(1e-12)).sqrt()
    projection.weight.copy_(weight)
    projection.bias.copy_(source.mean(dim=0) - weight @ fraternal_mean)


class IFCLModel(modeling_ifcl.IFCLModel):
    """The published ``IFCLModel`` with what training needs (this module's docstring). Its folders name the published
    class in ``auto_map`` and carry its file, so that they load with the remote code alone."""

    _auto_class = None  # save_pretrained writes auto_map and the code files itself: the published class's, not this
    # A LoRA checkpoint's adapters, which from_pretrained merges into their layers itself.
    _keys_to_ignore_on_load_unexpected = [r"\.lora_(A|B|embedding_A|embedding_B)\.", r"\.base_layer\."]

    def set_fraternal_table(self, table: torch.Tensor | None = None) -> None:
        """The published model's BEL_F and projection; given the fraternal model's ``table``, the projection to BEL_S's
        width starts at BEL_S's scale (:func:`scaled_orthogonal_projection`), so the fraternal language is present
        from the first step."""
        super().set_fraternal_table(table)
        if self.fraternal_projection is not None and table is not None:
            scaled_orthogonal_projection(self.fraternal_projection, self.get_input_embeddings().weight, table)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *model_args, **kwargs) -> IFCLModel:
        """The published model's ``from_pretrained`` (``truncate_dim``, ``attn_implementation``), and a checkpoint of a
        LoRA run (its weights hold the adapters beside their base layers, ``ifcl.lora``) loads as the model of that
        step: the adapters merged into their layers (W + B·A·alpha/r, ``ifcl.lora.merge_lora``), as a published
        folder holds them; no peft is needed."""
        checked_truncate_dim(kwargs.get("truncate_dim"))  # its type, before anything is read
        path, config = str(pretrained_model_name_or_path), kwargs.get("config")
        if isinstance(config, PretrainedConfig):
            code = getattr(config, "encoder_code", None)
        else:  # config.json's settings, read before any of the encoder's code could run
            code = (ifcl_config_dict(read_json(path, "config.json") or {}) or {}).get("encoder_code")
        check_own_code_trusted(code, path, bool(kwargs.get("trust_remote_code")), "trust_remote_code=True")
        adapters = lora_weights(pretrained_model_name_or_path, kwargs)
        # The adapted layers' own weights are not in the file under their names (peft's base_layer holds them): not
        # missing, since merge_lora writes them; nothing else is left out of the load report.
        merged = [re.escape(name.replace(".base_layer.", ".")) for name in adapters if ".base_layer." in name]
        ignored = cls._keys_to_ignore_on_load_missing
        cls._keys_to_ignore_on_load_missing = [*ignored, *merged]
        try:
            loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        finally:
            cls._keys_to_ignore_on_load_missing = ignored
        if adapters:
            merge_lora(loaded[0] if isinstance(loaded, tuple) else loaded, adapters)  # (model, info) when asked for
        return loaded

    @classmethod
    def from_encoder(
        cls,
        encoder_name_or_path: str,
        fraternal_model_name_or_path: str | None = None,
        *,
        tokenizer: PreTrainedTokenizerBase | None = None,
        encoder_config: PretrainedConfig | None = None,
        trust_remote_code: bool = False,
        attn_implementation: str | None = None,
        dtype: str | torch.dtype = torch.float32,
        base_folder: BaseFolder | None = None,
        **settings,
    ) -> IFCLModel:
        """An IFCL model to train, built from a pretrained encoder.

        Args:
            encoder_name_or_path: a Hub id or a local folder of any encoder ``AutoModel`` loads.
            fraternal_model_name_or_path: a model of the fraternal language whose word table initialises BEL_F and
                whose tokenizer reads the fraternal text; without one BEL_F is the encoder's own table.
            tokenizer, encoder_config, base_folder: the encoder's tokenizer, config and files
                (:class:`ifcl.pooling.BaseFolder`), when already read (else read from ``encoder_name_or_path``).
            trust_remote_code: run the code the encoder and fraternal model ship with (transformers' own classes
                otherwise, and a model that needs its code is refused; no prompt is ever shown).
            attn_implementation: the encoder's attention (``"sdpa"``, ``"flash_attention_2"``, ...), which it checks;
                default its own default. Not saved: :meth:`from_pretrained` takes it again.
            dtype: the weights' dtype while training: float32 by default (float32 master weights, whatever dtype the
                checkpoint holds: bfloat16 for most decoders; ``--bf16`` is autocast over them); ``"auto"`` keeps the
                checkpoint's; bfloat16 or float16 train in pure low precision, which is warned about
                (:func:`precision_note`).
            settings: :class:`IFCLConfig` fields (``fusion_rate``, ``queue_size``, ``pooler_type``, ...). The
                poolers not given are the encoder's own: those of its sentence-transformers Pooling module (CLS,
                last token or mean), else ``avg`` (``ifcl.pooling.base_settings``, which logs where each came from).

        Returns:
            The model, with the encoder's tokenizer (and the fraternal one) attached.
        """
        cls.config_class(**settings)  # unknown settings and wrong values refused before any weights load
        dtype = checked_dtype(dtype)
        check_model_path("encoder_name_or_path", encoder_name_or_path)
        check_model_path("fraternal_model_name_or_path", fraternal_model_name_or_path)
        folder = base_folder or BaseFolder.read(encoder_name_or_path)  # its files, read once
        check_custom_code(encoder_name_or_path, trust_remote_code, config=folder.config)  # before any code is imported
        settings = base_settings(folder, settings)
        tokenizer = tokenizer or load_tokenizer(encoder_name_or_path, trust_remote_code=trust_remote_code)
        for change in fit_tokenizer(tokenizer, "last" in (settings["pooler_type"], settings["eval_pooler_type"])):
            logger.info(f"{encoder_name_or_path}: {change}.")
        encoder_config = encoder_config or AutoConfig.from_pretrained(
            encoder_name_or_path, trust_remote_code=trust_remote_code
        )
        check_vocabulary(tokenizer, getattr(encoder_config, "vocab_size", None), encoder_name_or_path)
        # checked, then loaded, before the encoder's weights load
        fraternal_table, fraternal_tokenizer = load_fraternal(fraternal_model_name_or_path, trust_remote_code, dtype)
        saved_dtype = getattr(encoder_config, "dtype", None)  # before from_pretrained sets it to the loaded one
        encoder = AutoModel.from_pretrained(
            encoder_name_or_path, config=encoder_config, trust_remote_code=trust_remote_code, dtype=dtype
        )
        word_table_of(encoder, encoder_name_or_path)  # refused before the model is built when it has none
        prefix = getattr(encoder, "base_model_prefix", "")  # its own, so that the weights keep their names
        config = cls.config_class(
            encoder_config=encoder.config.to_dict(),
            encoder_name_or_path=encoder_name_or_path,
            encoder_prefix=prefix if prefix.isidentifier() and prefix != "encoder" else "encoder",
            # None: the encoder's own table's (see IFCLConfig.shares_word_table)
            fraternal_vocab_size=fraternal_table.shape[0] if fraternal_tokenizer else None,
            fraternal_embedding_size=fraternal_table.shape[1] if fraternal_tokenizer else None,
            fraternal_pad_token_id=(fraternal_tokenizer or tokenizer).pad_token_id,
            fraternal_model_name_or_path=fraternal_model_name_or_path,
            encoder_code=own_code(encoder),
            **settings,
        )
        model = cls(config, encoder=encoder, fraternal_table=fraternal_table)
        if attn_implementation is not None:
            model.encoder.set_attn_implementation(attn_implementation)
        logger.log(*precision_note(model, encoder_name_or_path, saved_dtype))
        model.name_or_path = encoder_name_or_path  # where its tokenizer and sentence-transformers settings come from
        model.base_folder = folder  # its files as read, for the run's preparation (ifcl.publishing.adopt_base)
        model._tokenizer, model._fraternal_tokenizer = tokenizer, fraternal_tokenizer
        return model

    def save_pretrained(
        self, save_directory: str | os.PathLike, is_main_process: bool = True, push_to_hub: bool = False, **kwargs
    ) -> None:
        """``PreTrainedModel.save_pretrained``, and, as sentence-transformers' ``save`` does, the tokenizer the model
        holds (attached, or read from where the model was loaded) with, when the config names a fraternal model, the
        fraternal one in ``fraternal_tokenizer/``: a folder that loads alone. A fast tokenizer's file holds no truncation
        nor padding of the last call before it (the training length, say): its limit is ``model_max_length``. With ``push_to_hub`` (``repo_id``:
        default the folder's name) the folder is pushed with them, by :meth:`push_to_hub`."""
        hub_names = ("repo_id", "commit_message", "commit_description", "private", "create_pr", "revision", "tags")
        hub = {name: kwargs.pop(name) for name in hub_names if name in kwargs}
        if is_main_process:  # the published class's code and auto_map (what custom_object_save writes for it)
            os.makedirs(save_directory, exist_ok=True)
            shutil.copy(modeling_ifcl.__file__, save_directory)  # the config copies its own file
            if self.config.encoder_code:  # the encoder's own code, as its encoder_code names it
                custom_object_save(self.encoder.config, save_directory)
                custom_object_save(self.encoder, save_directory)
            self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}), "AutoModel": AUTO_MODEL}
        super().save_pretrained(save_directory, is_main_process, **kwargs)
        if not is_main_process:
            return
        tokenizers = {"": "tokenizer"}
        if self.config.fraternal_model_name_or_path is not None:
            tokenizers[FRATERNAL_TOKENIZER] = "fraternal_tokenizer"
        for subfolder, attribute in tokenizers.items():
            try:
                tokenizer = getattr(self, attribute)
            except (OSError, ValueError) as error:  # none attached nor loadable: the folder's loaders say so
                logger.warning(f"{save_directory}: no {attribute} saved ({str(error).splitlines()[0]}).")
                continue
            if getattr(tokenizer, "is_fast", False):  # the last call's truncation and padding are not the model's
                tokenizer.backend_tokenizer.no_truncation()
                tokenizer.backend_tokenizer.no_padding()
            tokenizer.save_pretrained(os.path.join(save_directory, subfolder))
            without_processor_class(os.path.join(save_directory, subfolder, "tokenizer_config.json"))
        if push_to_hub:
            repo_id = hub.pop("repo_id", os.path.basename(os.path.normpath(save_directory)))
            options = {name: kwargs[name] for name in ("token", "max_shard_size") if name in kwargs}
            self.push_to_hub(repo_id, **options, **hub)


@dataclass
class StartingModel:
    """The model a run starts from, read once before any weights load, for the checks (``ifcl.checks``) and the
    loader (:meth:`load`): its folder or Hub id, its encoder's config and tokenizer, for an IFCL model this project
    saved its config, and its files as read (:class:`BaseFolder`)."""

    path: str
    encoder_config: PretrainedConfig
    tokenizer: PreTrainedTokenizerBase
    saved: IFCLConfig | None = None
    folder: BaseFolder | None = None

    @classmethod
    def read(cls, path: str, trust_remote_code: bool = False, folder: BaseFolder | None = None) -> StartingModel:
        """Read ``path``'s files (``folder`` when already read: :class:`BaseFolder`; a folder, or a Hub id from the
        cache when offline), its encoder's config and its tokenizer (a folder without one is refused:
        ``load_tokenizer``); a plain model's own code runs only with ``trust_remote_code`` (:func:`check_custom_code`),
        an IFCL model's never, its encoder's own code only with ``trust_remote_code``."""
        folder = folder or BaseFolder.read(path)  # a config.json that cannot be read: AutoConfig says why
        check_custom_code(path, trust_remote_code, config=folder.config)
        saved_dict = folder.saved
        try:
            saved = IFCLConfig.from_dict(saved_dict) if saved_dict is not None else None
        except (TypeError, ValueError) as error:  # a setting of the wrong type or value
            raise ValueError(f"{path}/config.json: {error}") from None
        if saved is not None:
            saved.name_or_path = path  # where an encoder with its own code finds it
            check_own_code_trusted(saved.encoder_code, path, trust_remote_code)
        try:
            options = {"trust_remote_code": trust_remote_code}
            encoder_config = saved.build_encoder_config() if saved else AutoConfig.from_pretrained(path, **options)
            # Given the encoder's config, AutoTokenizer does not read config.json (an IFCL model's needs remote code).
            tokenizer = load_tokenizer(path, config=encoder_config, **options)
        except OSError as error:
            reason = str(error).splitlines()[0]
            named = reason if reason.startswith(path) else f"{path}: its config or tokenizer cannot be read ({reason})"
            raise OSError(named) from None
        except ValueError as error:
            if "trust_remote_code" not in str(error):
                raise
            raise ValueError(f"{path} loads with custom code (auto_map): {TRUST_ADVICE}") from None
        check_vocabulary(tokenizer, getattr(encoder_config, "vocab_size", None), path)
        return cls(path, encoder_config, tokenizer, saved, folder)

    def load(
        self,
        name: str,
        fraternal_model: str | None,
        settings: dict[str, Any],
        trust_remote_code: bool = False,
        dtype: str = "float32",
    ) -> IFCLModel:
        """The IFCL model to train from it, its weights in ``dtype`` (``run_ifcl.py --dtype``): continued from a saved
        one with ``settings`` (its queue loaded with its own shape, which ``Objective.prepare`` keeps only when
        unchanged; a LoRA checkpoint's adapters merged; this package's class, so no IFCL remote code runs), or built
        from a plain encoder (:meth:`IFCLModel.from_encoder`; its code runs only with ``trust_remote_code``). Its
        config names its base by ``name`` as given (``public_name``), never by a path."""
        if self.saved is not None:
            logger.info(f"{self.path} is an IFCL model: continuing from its encoder, fraternal table and queue.")
            config = copy.deepcopy(self.saved)  # its lora, if any, merges a checkpoint's adapters as it loads
            config.update({k: v for k, v in settings.items() if k not in ("queue_size", "queue_batch_size")})
            saved_dtype = config.encoder_config.get("dtype")
            model = IFCLModel.from_pretrained(  # trust_remote_code reaches only an encoder's own code, never IFCL's
                self.path, config=config, trust_remote_code=trust_remote_code, dtype=checked_dtype(dtype)
            )
            logger.log(*precision_note(model, self.path, saved_dtype))
            model.config.lora = None  # the weights are merged: adapters, if any, are this run's (add_lora)
            model._tokenizer = self.tokenizer
        else:
            model = IFCLModel.from_encoder(
                self.path,
                fraternal_model,
                tokenizer=self.tokenizer,
                encoder_config=self.encoder_config,
                base_folder=self.folder,
                trust_remote_code=trust_remote_code,
                dtype=dtype,
                **settings,
            )
        model.config.encoder_name_or_path = public_name(name)
        return model
