"""Building an ``IFCLModel`` from pretrained parts, for training: ``IFCLModel.from_encoder`` calls
:func:`build_from_encoder` (the published model's own code needs none of this to load and embed)."""

from __future__ import annotations

import torch
from torch import nn
from transformers import AutoModel, AutoTokenizer, PreTrainedTokenizerBase

from configuration_ifcl import IFCLConfig
from ifcl.checks import check_model_path
from ifcl.publishing import adopt_base, public_name
from modeling_ifcl import drop_pooler_head, word_table_of


def encoder_attribute_name(encoder: nn.Module) -> str:
    """Where IFCLModel holds ``encoder``: its ``base_model_prefix`` (``bert``), so that the weights keep the names its
    plain ``AutoModel`` reads (``encoder`` when it has none)."""
    prefix = getattr(encoder, "base_model_prefix", "")
    return prefix if prefix.isidentifier() and prefix != "encoder" else "encoder"


@torch.no_grad()
def scaled_orthogonal_projection(
    projection: nn.Linear, source_table: torch.Tensor, fraternal_table: torch.Tensor
) -> None:
    """Start ``projection`` (BEL_F's width → BEL_S's) as an orthogonal map scaled to give the projected table BEL_S's
    mean variance per dimension, with the bias that gives it BEL_S's mean (docs/paper-reading.md: a random projection
    of a narrower table would start the fraternal twins at a fraction of BEL_S's scale)."""
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


def load_fraternal(name_or_path: str) -> tuple[torch.Tensor, PreTrainedTokenizerBase]:
    """BEL_F's starting table, the fraternal model's word table (checked as the encoder's is), and its tokenizer."""
    table = word_table_of(AutoModel.from_pretrained(name_or_path), name_or_path).weight
    return table, AutoTokenizer.from_pretrained(name_or_path)


def build_from_encoder(model_class, encoder_name_or_path: str, fraternal_model_name_or_path: str | None, **settings):
    """``IFCLModel.from_encoder``: the encoder's weights and tokenizer, BEL_F from the fraternal model's word table
    (and its tokenizer) or the encoder's own, the config from both and ``settings``. The tokenizer embeds as a
    sentence-transformers base encoder does (:func:`~ifcl.publishing.adopt_base`: its truncation and lowercasing)
    before anything is tokenized for training."""
    check_model_path("encoder_name_or_path", encoder_name_or_path)
    check_model_path("fraternal_model_name_or_path", fraternal_model_name_or_path)
    encoder = drop_pooler_head(AutoModel.from_pretrained(encoder_name_or_path))
    fraternal_table = word_table_of(encoder, encoder_name_or_path).weight
    tokenizer = AutoTokenizer.from_pretrained(encoder_name_or_path)
    fraternal_tokenizer = None
    if fraternal_model_name_or_path is not None:
        fraternal_table, fraternal_tokenizer = load_fraternal(fraternal_model_name_or_path)
    config = IFCLConfig(
        encoder_config=encoder.config.to_dict(),
        encoder_name_or_path=public_name(encoder_name_or_path),
        encoder_prefix=encoder_attribute_name(encoder),
        # None: the encoder's own table's (see IFCLConfig.shares_word_table)
        fraternal_vocab_size=fraternal_table.shape[0] if fraternal_tokenizer else None,
        fraternal_embedding_size=fraternal_table.shape[1] if fraternal_tokenizer else None,
        fraternal_pad_token_id=(fraternal_tokenizer or tokenizer).pad_token_id,
        fraternal_model_name_or_path=public_name(fraternal_model_name_or_path),
        **settings,
    )
    model = model_class(config)
    model.encoder.load_state_dict(encoder.state_dict())
    if model.fraternal_embeddings is not None:
        model.fraternal_embeddings.weight.data.copy_(fraternal_table)
        if model.fraternal_projection is not None:
            scaled_orthogonal_projection(
                model.fraternal_projection, model.get_input_embeddings().weight, fraternal_table
            )
    model.name_or_path = encoder_name_or_path  # where its tokenizer and sentence-transformers settings come from
    model._tokenizer, model.fraternal_tokenizer = tokenizer, fraternal_tokenizer
    adopt_base(model)
    return model
