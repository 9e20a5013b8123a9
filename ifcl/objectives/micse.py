"""miCSE (Klein & Nabi, "miCSE: Mutual Information Contrastive Learning for Low-shot Sentence Embeddings", ACL 2023).

Two dropout views of each sentence (Section 2) are trained with a joint loss (Eq. 1), L_C(E_1, E_2) + L_D(W_1, W_2):

- L_C, Eq. 2 (Section 2.1): InfoNCE of the first view's embeddings against the second's, the other sentences of
  the batch (of all processes) and a queue Q of embeddings that a momentum encoder (an exponential moving average
  of the encoder, with more dropout) made of earlier batches.
- L_D, Eq. 3–5 (Section 2.2, Algorithm 1): attention mutual information (AMI) of the two views' attention maps of
  the upper layers, cut into slices and sampled at the same positions in both views: −λ times its mean.

The settings default to Section 3.1's. The paper trains with [CLS] and SimCSE's MLP: ``--pooler_type cls
--eval_pooler_type cls_before_pooler``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

import ifcl.queue as ring
from ifcl.arguments import check_within
from ifcl.losses import Matryoshka, float32_region, info_nce, over_sizes, widened
from modeling_ifcl import ALL_LAYER_POOLERS, QueueBuffers, pool_hidden_states

from .base import (
    TOKEN_FIELDS,
    Embeddings,
    Gather,
    Objective,
    ObjectiveOutput,
    Paper,
    RowGather,
    no_gather,
    no_row_gather,
    unwrap_model,
)

LAYERS_SETTING = "micse_attention_layers"


def parse_attention_layers(spec: str) -> int | list[int]:
    """``micse_attention_layers`` read: ``"topK"`` → K (the K deepest layers), else the listed 1-based layers.

    A list is comma-separated numbers and ranges: ``"9-12"``, ``"8,10-12"``.
    """
    text = spec.strip().lower().replace(" ", "")
    top = re.fullmatch(r"top(\d+)", text)
    if top:
        count = int(top.group(1))
        if count < 1:
            raise ValueError(f"{LAYERS_SETTING}={spec!r}: 'topK' needs K ≥ 1.")
        return count
    layers: set[int] = set()
    for item in text.split(","):
        bounds = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if not bounds:
            raise ValueError(
                f"{LAYERS_SETTING}={spec!r} is not 'topK' (the K deepest layers) nor 1-based layer numbers and "
                f"ranges such as '9-12' or '8,10-12'."
            )
        first, last = int(bounds.group(1)), int(bounds.group(2) or bounds.group(1))
        if first < 1 or last < first:
            raise ValueError(f"{LAYERS_SETTING}={spec!r}: layers are numbered from 1, ranges go upwards ({item!r}).")
        layers.update(range(first, last + 1))
    return sorted(layers)


def attention_layer_indices(spec: str, num_layers: int) -> list[int]:
    """The 0-based indices of the layers ``micse_attention_layers`` names in an encoder of ``num_layers`` layers."""
    parsed = parse_attention_layers(spec)
    if isinstance(parsed, int):
        if parsed > num_layers:
            raise ValueError(
                f"{LAYERS_SETTING}={spec!r} asks for the top {parsed} layers, but the encoder has {num_layers}."
            )
        return list(range(num_layers - parsed, num_layers))
    missing = [layer for layer in parsed if layer > num_layers]
    if missing:
        raise ValueError(
            f"{LAYERS_SETTING}={spec!r} names layer(s) {', '.join(map(str, missing))}, but the encoder has "
            f"{num_layers} layers (numbered 1 to {num_layers})."
        )
    return [layer - 1 for layer in parsed]


@dataclass
class MiCSESettings:
    """miCSE's own settings (``--micse_*``); τ is the shared ``--temperature``, the poolers are shared too."""

    micse_attention_weight: float = field(
        default=2.5e-3,
        metadata={"help": "λ of Eq. 5, the weight of the attention mutual-information loss L_D (0 turns AMI off)."},
    )
    micse_attention_layers: str = field(
        default="top4",
        metadata={
            "help": "Layers whose attention L_D aligns (Section 3.1: 'between 8 and 12' of BERT-base, (4 × H/2) "
            "chunks, i.e. layers 9-12). 'topK' takes the K deepest layers of any encoder; or 1-based layer "
            "numbers and ranges, e.g. '9-12' or '8,10-12'."
        },
    )
    micse_heads_per_group: int = field(
        default=2,
        metadata={"help": "Adjacent heads averaged into one slice w^r (Section 3.1: pairs); must divide the heads."},
    )
    micse_num_samples: int = field(
        default=150,
        metadata={"help": "m of Eq. 3, attention positions sampled per sentence and slice (Section 3.1: 150)."},
    )
    micse_sample_with_replacement: bool = field(
        default=True,
        metadata={
            "help": "Draw the m positions of Eq. 3 with replacement (m draws of the multinomial), so sentences "
            "with fewer than m positions take part too; false: distinct positions, all of them when fewer than m."
        },
    )
    micse_queue_size: int = field(
        default=384,
        metadata={"help": "|Q| of Eq. 2, momentum embeddings as extra negatives (0: no queue nor momentum encoder)."},
    )
    micse_momentum: float = field(
        default=0.995,
        metadata={"help": "EMA factor μ of the momentum encoder: θ_m ← μ·θ_m + (1−μ)·θ after each optimizer step."},
    )
    micse_momentum_dropout: float = field(
        default=0.3,
        metadata={"help": "Dropout of the momentum encoder (Section 3.1: raised from 0.1 to 0.3)."},
    )

    def __post_init__(self) -> None:
        check_within(self, "[0, inf)", "micse_attention_weight", meaning="λ of Eq. 5")
        parse_attention_layers(self.micse_attention_layers)
        check_within(self, "[1, inf)", "micse_heads_per_group")
        check_within(self, "[2, inf)", "micse_num_samples", meaning="m of Eq. 3: a correlation needs two values")
        check_within(self, "[0, inf)", "micse_queue_size", meaning="|Q| of Eq. 2")
        check_within(self, "[0, 1]", "micse_momentum", meaning="the EMA factor")
        check_within(self, "[0, 1)", "micse_momentum_dropout")


def check_heads_per_group(num_heads: int, heads_per_group: int) -> None:
    """``ValueError`` when ``micse_heads_per_group`` does not divide the encoder's head count."""
    if num_heads % heads_per_group:
        raise ValueError(
            f"micse_heads_per_group={heads_per_group} does not divide the encoder's {num_heads} attention heads."
        )


def attention_slices(attentions: Sequence[torch.Tensor], layers: Sequence[int], heads_per_group: int) -> torch.Tensor:
    """Slicing π of Section 2.2: [B, R, n, n] from the encoder's per-layer attentions [B, H, n, n].

    The slices are ordered layer by layer (``layers``, 0-based), then head group: group j of a layer averages its
    heads g·j … g·j + g − 1 (g = ``heads_per_group``). Decision: the paper's slices are n×n, so a group is pooled by
    its mean; a sum would give the same ρ, as the log turns the factor g into a constant shift.
    """
    num_heads = attentions[layers[0]].shape[1]
    check_heads_per_group(num_heads, heads_per_group)
    chosen = torch.stack([widened(attentions[layer]) for layer in layers], dim=1)  # [B, L', H, n, n]
    batch, num_layers, _, length, _ = chosen.shape
    grouped = chosen.view(batch, num_layers, num_heads // heads_per_group, heads_per_group, length, length)
    return grouped.mean(dim=3).flatten(1, 2)


def valid_attention_positions(
    slices_1: torch.Tensor, slices_2: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """[B, R, n·n] bool: the positions Eq. 3 samples from, the non-padding s×s part of each sentence's map.

    Decision: a position where either view's attention is 0 is left out too. The encoder returns its attention
    after attention dropout, so dropped entries are exactly 0, and log 0 (Algorithm 1) does not exist.
    """
    real = attention_mask.bool()
    pairs = (real.unsqueeze(2) & real.unsqueeze(1)).unsqueeze(1)  # [B, 1, n, n]: query and key both real tokens
    return (pairs & (slices_1 > 0) & (slices_2 > 0)).flatten(2)


def sample_attention_positions(
    valid: torch.Tensor, num_samples: int, with_replacement: bool = True, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Index sets J_r of Eq. 3, one per sentence and slice, uniform over the ``valid`` positions [B, R, n·n].

    Returns (indices [B, R, k] into the flattened n×n slice, sample mask [B, R, k]). With replacement k = m, all
    draws count (a slice with no valid position at all counts none). Without replacement the positions are
    distinct: k = min(m, n·n), and where a sentence has fewer than m valid positions all of them are taken and
    the mask marks the rest. Both views use the same indices.
    """
    flat = valid.flatten(0, 1)
    if with_replacement:
        usable = flat.any(dim=1, keepdim=True)
        # A row without valid positions draws from a uniform dummy and is masked out.
        weights = torch.where(usable, flat.float(), torch.ones_like(flat, dtype=torch.float))
        indices = torch.multinomial(weights, num_samples, replacement=True, generator=generator)
        mask = usable.expand(-1, num_samples)
    else:
        keys = torch.rand(flat.shape, device=flat.device, generator=generator).masked_fill(~flat, -1.0)
        indices = keys.topk(min(num_samples, flat.shape[1]), dim=1).indices
        mask = flat.gather(1, indices)
    return indices.view(*valid.shape[:2], -1), mask.reshape(*valid.shape[:2], -1)


def mutual_information(
    slices_1: torch.Tensor, slices_2: torch.Tensor, indices: torch.Tensor, sample_mask: torch.Tensor, epsilon: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """MI of Eq. 4 for each sentence and slice, I(z_1, z_2) = −½·log(1 − ρ²) with z_v the log of the sampled
    attention, [B, R]; and which slices have at least two samples, [B, R]. ``slices_*``: [B, R, n, n].

    ρ is the Pearson correlation of the two views' log-attentions at the sampled positions (Algorithm 1: the
    cosine of the centred values). ``epsilon`` keeps 1 − ρ² ≥ ε, so identical views (no dropout) give a finite
    MI of −½·log ε, and guards the division for constant samples.
    """
    with float32_region(slices_1):
        weights = sample_mask.float()
        count = weights.sum(dim=-1, keepdim=True)

        def centred_log(slices: torch.Tensor) -> torch.Tensor:
            values = widened(slices).flatten(2).gather(2, indices)
            logs = torch.where(sample_mask, values, torch.ones_like(values)).log()
            mean = (logs * weights).sum(dim=-1, keepdim=True) / count.clamp_min(1.0)
            return (logs - mean) * weights

        z_1, z_2 = centred_log(slices_1), centred_log(slices_2)
        covariance = (z_1 * z_2).sum(dim=-1)
        variances = (z_1 * z_1).sum(dim=-1) * (z_2 * z_2).sum(dim=-1)
        correlation = covariance / variances.clamp_min(epsilon**2).sqrt()
        unexplained = (1.0 - correlation.square()).clamp_min(epsilon)
        return -0.5 * unexplained.log(), count.squeeze(-1) >= 2


class AttentionMutualInformationLoss(nn.Module):
    """L_D of Eq. 5: −λ/(|R|·|D_b|) · Σ_i Σ_r MI_i^r, over the attention slices of two dropout views (Section 2.2).

    ``layers`` (0-based) and ``heads_per_group`` make the slices (:func:`attention_slices`); ``num_samples``
    positions are drawn per sentence and slice (Eq. 3) unless fixed ``indices`` and ``sample_mask`` are given.
    Slices with fewer than two samples take no part in the mean. Returns (L_D, mean MI).
    """

    def __init__(
        self,
        weight: float = 2.5e-3,
        layers: Sequence[int] = (8, 9, 10, 11),
        heads_per_group: int = 2,
        num_samples: int = 150,
        with_replacement: bool = True,
        epsilon: float = 1e-6,
    ) -> None:
        super().__init__()
        self.weight = weight
        self.layers = list(layers)
        self.heads_per_group = heads_per_group
        self.num_samples = num_samples
        self.with_replacement = with_replacement
        self.epsilon = epsilon

    def forward(self, *arguments, **options) -> tuple[torch.Tensor, torch.Tensor]:
        """L_D of a batch: :meth:`combine` of :meth:`per_sentence`, whose arguments it takes."""
        return self.combine(*self.per_sentence(*arguments, **options))

    def per_sentence(
        self,
        attentions_1: Sequence[torch.Tensor],
        attentions_2: Sequence[torch.Tensor],
        attention_mask: torch.Tensor,
        indices: torch.Tensor | None = None,
        sample_mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each sentence's Σ_r MI_i^r over its counted slices and their count, [B] each: L_D's parts, which
        :meth:`combine` sums over a batch (whole, or a gradient cache's mini-batches). ``attentions_v``: one
        [B, H, n, n] tensor per encoder layer, view v; ``attention_mask`` [B, n]."""
        slices_1 = attention_slices(attentions_1, self.layers, self.heads_per_group)
        slices_2 = attention_slices(attentions_2, self.layers, self.heads_per_group)
        if indices is None:
            with torch.no_grad():
                valid = valid_attention_positions(slices_1, slices_2, attention_mask)
                indices, sample_mask = sample_attention_positions(
                    valid, self.num_samples, self.with_replacement, generator
                )
        information, counted = mutual_information(slices_1, slices_2, indices, sample_mask, self.epsilon)
        counted = counted.float()
        return (information * counted).sum(dim=-1), counted.sum(dim=-1)

    def combine(self, information: torch.Tensor, counted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(L_D, mean MI) of the sentences' :meth:`per_sentence` parts."""
        mean = information.sum() / counted.detach().sum().clamp_min(1.0)
        return -self.weight * mean, mean


def set_dropout(module: nn.Module, rate: float) -> None:
    """Every dropout of an encoder at ``rate``: its ``nn.Dropout`` modules and its config's dropout rates."""
    for child in module.modules():
        if isinstance(child, nn.Dropout):
            child.p = rate
    config = getattr(module, "config", None)
    if config is not None:
        for name, value in vars(config).items():
            if "dropout" in name and isinstance(value, float):
                setattr(config, name, rate)


class MiCSEObjective(Objective):
    """miCSE: L_C (Eq. 2, with a momentum encoder's queue) + L_D (Eq. 5, attention mutual information).

    Both views come from one call of the model on [x; x] (each row draws its own dropout mask), pooled with the
    training pooler, with the attention maps of every layer (the objective switches the encoder to eager attention,
    which returns them). The momentum encoder is a copy of the encoder (no gradient, dropout
    ``micse_momentum_dropout``), updated by EMA after each optimizer step.

    Decision: the momentum encoder encodes each batch's sentences x once (its own dropout is its view), and
    those embeddings enter Q after the step, so Q only holds earlier batches ("samples from previous batches",
    Section 2.1) and a sentence is never its own negative. Decision: it pools like the model, with the model's
    own MLP for the ``cls`` pooler: Section 3.1 keeps the MLP "identical to the online network".
    """

    name = "micse"
    paper = Paper(
        "miCSE",
        "mutual-information contrastive learning ([Klein and Nabi, 2023](https://arxiv.org/abs/2211.04928))",
        """@inproceedings{klein2023micse,
  title     = {{miCSE}: Mutual Information Contrastive Learning for Low-shot Sentence Embeddings},
  author    = {Klein, Tassilo and Nabi, Moin},
  booktitle = {Proceedings of ACL},
  year      = {2023}
}""",
    )
    loss_terms = ("loss_contrastive", "loss_attention", "attention_mutual_information")
    settings_class = MiCSESettings

    def __init__(self, model: nn.Module, settings: MiCSESettings | None = None) -> None:
        super().__init__(model, settings)
        settings = self.settings
        model = unwrap_model(model)
        encoder_config = model.encoder.config
        num_layers = getattr(encoder_config, "num_hidden_layers", None)
        num_heads = getattr(encoder_config, "num_attention_heads", None)
        if num_layers is None or num_heads is None:
            raise ValueError(
                f"miCSE needs the encoder's layer and head counts; {type(encoder_config).__name__} has no "
                f"num_hidden_layers / num_attention_heads."
            )
        layers = attention_layer_indices(settings.micse_attention_layers, num_layers)
        check_heads_per_group(num_heads, settings.micse_heads_per_group)
        self.temperature, self.matryoshka = model.config.contrastive_temperature, Matryoshka.of(model.config)
        self.attention_loss = AttentionMutualInformationLoss(
            settings.micse_attention_weight,
            layers,
            settings.micse_heads_per_group,
            settings.micse_num_samples,
            settings.micse_sample_with_replacement,
        )
        self.momentum = settings.micse_momentum
        self.momentum_encoder: nn.Module | None = None
        self.queue: QueueBuffers | None = None
        if settings.micse_queue_size > 0:
            # Copied before the switch to eager attention: the momentum encoder returns no attention maps.
            self.momentum_encoder = copy.deepcopy(model.encoder).requires_grad_(False)
            set_dropout(self.momentum_encoder, settings.micse_momentum_dropout)
            # Q: one momentum embedding per slot of a ring buffer (ifcl.queue): the oldest overwritten first
            self.queue = QueueBuffers(settings.micse_queue_size, 1, model.hidden_size)
        if settings.micse_attention_weight > 0:
            model.encoder.set_attn_implementation("eager")
            if model.encoder.config._attn_implementation != "eager":
                raise ValueError(
                    f"miCSE reads attention maps, but {type(model.encoder).__name__} cannot switch to eager "
                    f"attention; set micse_attention_weight to 0 to train without L_D."
                )

    @property
    def uses_attentions(self) -> bool:
        """Whether L_D is on (λ > 0), so the model must return its attention maps."""
        return self.attention_loss.weight > 0

    def embed(self, model: nn.Module, inputs: dict[str, torch.Tensor], replay: bool = False) -> Embeddings:
        """The two views; with L_D each sentence's attention mutual information (:meth:`AttentionMutualInformationLoss.
        per_sentence`, its positions sampled with the views' dropout); in training with Q, outside ``replay``, the
        momentum embeddings."""
        inputs = {key: inputs[key] for key in TOKEN_FIELDS if inputs.get(key) is not None}
        batch_size = inputs["input_ids"].shape[0]
        if "attention_mask" not in inputs:  # a tokenizer without one: every token is real, as the model assumes
            inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
        both_views = {key: torch.cat([value, value]) for key, value in inputs.items()}
        output = model(**both_views, training_pooler=True, output_attentions=self.uses_attentions)
        first_views, second_views = output.sentence_embedding.split(batch_size)
        rows = {"first": first_views, "second": second_views}
        if self.uses_attentions:
            attentions_1 = [layer[:batch_size] for layer in output.attentions]
            attentions_2 = [layer[batch_size:] for layer in output.attentions]
            parts = self.attention_loss.per_sentence(attentions_1, attentions_2, inputs["attention_mask"])
            rows["mutual_information"], rows["counted_slices"] = parts
        if self.queue is not None and model.training and not replay:
            rows["momentum"] = self.momentum_embeddings(model, inputs)
        return rows

    def loss_from(
        self, model: nn.Module, embeddings: Embeddings, inputs: dict[str, torch.Tensor], gather: Gather = no_gather
    ) -> ObjectiveOutput:
        candidates, label_offset = gather(embeddings["second"])
        queue = queue_log_weights = None
        if self.queue is not None:  # every filled row weighs the same, an empty one takes no part
            queue, queue_log_weights = ring.negatives(self.queue)
        # L_C, Eq. 2: InfoNCE of the first views against the second views and Q. The in-batch terms are SimCSE's (the
        # denominator takes every second view, the positive too: Section 2's "standard InfoNCE"; Eq. 2 writes j ≠ i).
        queue_negatives = (queue, queue_log_weights)
        loss_contrastive = info_nce(
            embeddings["first"], candidates, self.temperature, *queue_negatives, label_offset, self.matryoshka
        )
        loss = loss_contrastive
        components = {"loss_contrastive": loss_contrastive.detach()}
        if self.uses_attentions:
            loss_attention, mutual_information = self.attention_loss.combine(
                embeddings["mutual_information"], embeddings["counted_slices"]
            )
            # The same at every size: counted at each, as L_C is, so that sizes keep the two terms' balance.
            loss_attention = over_sizes(self.matryoshka, lambda _: loss_attention)
            loss = loss + loss_attention
            components["loss_attention"] = loss_attention.detach()
            components["attention_mutual_information"] = mutual_information.detach()
        if "momentum" in embeddings:
            self.queue_rows(embeddings["momentum"])
        return ObjectiveOutput(loss, components)

    @torch.no_grad()
    def momentum_embeddings(self, model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The momentum encoder's embeddings of the batch (pooled with the training pooler), float32."""
        unwrapped = unwrap_model(model)
        pooler_type = unwrapped.config.pooler_type
        all_hidden_states = pooler_type in ALL_LAYER_POOLERS
        outputs = self.momentum_encoder(**inputs, output_hidden_states=all_hidden_states, return_dict=True)
        hidden_states = outputs.hidden_states if all_hidden_states else (outputs.last_hidden_state,)
        return pool_hidden_states(pooler_type, inputs["attention_mask"], hidden_states, unwrapped.mlp).float()

    @torch.no_grad()
    def on_step_end(self, model: nn.Module, gather_rows: RowGather = no_row_gather) -> None:
        """The step's momentum embeddings, of all processes, enter the queue Q; then the EMA of the momentum
        encoder: θ_m ← μ·θ_m + (1 − μ)·θ (Section 2.1, μ = ``micse_momentum``)."""
        rows = self.step_rows(gather_rows)
        if rows is not None:
            ring.push(self.queue, rows)
        if self.momentum_encoder is None:
            return
        online = dict(model.encoder.named_parameters())
        for name, parameter in self.momentum_encoder.named_parameters():
            parameter.lerp_(online[name].detach().to(parameter.dtype), 1.0 - self.momentum)
        online_buffers = dict(model.encoder.named_buffers())
        for name, buffer in self.momentum_encoder.named_buffers():
            if name in online_buffers:
                buffer.copy_(online_buffers[name])
