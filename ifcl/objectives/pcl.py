"""PCL: Peer-Contrastive Learning (Wu et al., "PCL: Peer-Contrastive Learning with Diverse Augmentations for
Unsupervised Sentence Embeddings", EMNLP 2022, arXiv:2201.12093, Section 2).

Every sentence x_i gets K positives x̂_k^i from five augmentations (Eq. 2–3, Appendix A): dropout (the sentence
again, another dropout mask), shuffle, inversion, word repetition and word deletion, the discrete four made per batch
in :meth:`PCLObjective.collate`. Two peer networks θ (the model) and θ′ (the peer) score the anchor against its K
positives and the in-batch negatives in one softmax (Eq. 4), agree through two KL terms (Eq. 5) and each learn from
vanilla InfoNCE on every augmentation (Eq. 6, :class:`PCLLoss`). θ′ is tied to θ by default (two passes of one
network with different dropout, as the paper trains its large models) or a trainable copy of the encoder with
``--pcl_untied_peer``; only θ is published (Section 2.3).
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ifcl.arguments import check_choice, check_within
from ifcl.losses import Matryoshka, float32_region, over_sizes, widened
from modeling_ifcl import max_input_length

from .base import TOKEN_FIELDS, Embeddings, Gather, Objective, ObjectiveOutput, Paper, no_gather, unwrap_model

# The five augmentations of Section 3.2 / Appendix A. "dropout" is the continuous one (Δ^(c)), the others are
# discrete (Δ^(d)) and change the token ids.
AUGMENTATIONS = ("dropout", "shuffle", "inversion", "repetition", "deletion")
# The word id of special tokens in the ``word_ids`` feature (the fast tokenizer's None).
SPECIAL_WORD_ID = -1


@dataclass
class PCLSettings:
    """PCL's own settings (Wu et al. 2022, Sections 2.2–3.2); τ is the shared ``--temperature``."""

    pcl_num_positives: int = field(
        default=9,
        metadata={
            "help": "K, the number of augmented positives per sentence (|Δ| of Eq. 2; 9 for base models, 4 for large "
            "ones in the paper). The first positive is always dropout; positives 2..K cycle through "
            "--pcl_augmentations (the default gives dropout + two of each discrete augmentation)."
        },
    )
    pcl_augmentations: str = field(
        default="shuffle,inversion,repetition,deletion",
        metadata={
            "help": "Comma-separated augmentations that positives 2..K cycle through, from dropout, shuffle, "
            "inversion, repetition, deletion (Appendix A). One name gives the mono-augmenting variants of Fig. 3 "
            "(e.g. 'shuffle' is PCL_SS, 'dropout' is PCL_DP)."
        },
    )
    pcl_augmentation_unit: str = field(
        default="word",
        metadata={"help": "What the augmentations move: 'word' (the paper's; needs a fast tokenizer) or 'token'."},
    )
    pcl_repetition_ratio: float = field(
        default=0.2, metadata={"help": "Share of words duplicated and inserted by word repetition (Appendix A: 0.2)."}
    )
    pcl_deletion_ratio: float = field(
        default=0.2, metadata={"help": "Share of words removed by word deletion (Appendix A: 0.2)."}
    )
    pcl_beta: float = field(
        default=1.0, metadata={"help": "β of Eq. 6, the weight of the vanilla InfoNCE terms Σ_k L^(c) (paper: 1)."}
    )
    pcl_cooperation_weight: float = field(
        default=1.0,
        metadata={
            "help": "Weight of the peer-cooperation loss L^(p) of Eq. 5 (1 in Eq. 6; 0 is the PCL_noP ablation of "
            "Table 3)."
        },
    )
    pcl_untied_peer: bool = field(
        default=False,
        metadata={
            "help": "Train a separate peer network θ′ (a trainable copy of the encoder, left out of the published "
            "model) instead of tying θ′ = θ (two passes of the model with different dropout masks)."
        },
    )
    pcl_detach_kl_target: bool = field(
        default=False,
        metadata={"help": "No gradient through p_{θ,θ′}, the first argument of both KL terms of Eq. 5."},
    )

    def __post_init__(self) -> None:
        check_within(self, "[1, inf)", "pcl_num_positives", meaning="K")
        names = self.augmentation_cycle
        if not names:
            raise ValueError("pcl_augmentations must name at least one augmentation.")
        unknown = [name for name in names if name not in AUGMENTATIONS]
        if unknown:
            raise ValueError(
                f"pcl_augmentations: unknown augmentation(s) {', '.join(map(repr, unknown))}; "
                f"choose from {', '.join(AUGMENTATIONS)}."
            )
        check_choice(self, "pcl_augmentation_unit", ("word", "token"))
        check_within(self, "(0, 1]", "pcl_repetition_ratio")
        check_within(self, "(0, 1)", "pcl_deletion_ratio")
        check_within(self, "[0, inf)", "pcl_beta", meaning="β of Eq. 6")
        check_within(self, "[0, inf)", "pcl_cooperation_weight")
        if self.pcl_beta == 0.0 and self.pcl_cooperation_weight == 0.0:
            raise ValueError("pcl_beta and pcl_cooperation_weight are both 0: PCL would have no loss left.")

    @property
    def augmentation_cycle(self) -> list[str]:
        """The names in ``pcl_augmentations``, in order."""
        return [name.strip() for name in self.pcl_augmentations.split(",") if name.strip()]

    def positive_augmentations(self) -> list[str]:
        """The augmentation of each of the K positives: dropout first, then the cycle.

        Decision: the paper keeps "the diversity of augmentations as much as possible" for every K and at least one
        dropout positive in every variant (Section 3.5); K = 1 is "SimCSE w/ peer-network cooperation" (App. C.1).
        So positive 1 is dropout and positives 2..K cycle through the discrete four: K = 5 uses all five
        augmentations once, K = 9 is dropout plus each discrete augmentation twice.
        """
        cycle = self.augmentation_cycle
        return ["dropout"] + [cycle[k % len(cycle)] for k in range(self.pcl_num_positives - 1)]


def affected_count(num_units: int, ratio: float) -> int:
    """How many of ``num_units`` words a ratio touches: round(ratio·n), at least one when there is a word.

    Decision: a fixed count (not an independent coin per word), so every view changes exactly ~ratio of the words;
    at least one so that a short sentence's view still differs from it.
    """
    return 0 if num_units == 0 else max(1, round(ratio * num_units))


def repeat_units(units: list[list[int]], ratio: float, rng: random.Random) -> list[list[int]]:
    """Words Repetition (WR): duplicate ``ratio`` of the words and insert the copies at random positions.

    Decision: round(ratio·n) distinct words (at least one) are copied; each copy goes to a uniformly random
    position of the growing sentence ("randomly insert them into the original sentences", Appendix A), so the
    original sentence stays a subsequence of the view.
    """
    repeated = list(units)
    for index in sorted(rng.sample(range(len(units)), affected_count(len(units), ratio))):
        repeated.insert(rng.randint(0, len(repeated)), units[index])
    return repeated


def delete_units(units: list[list[int]], ratio: float, rng: random.Random) -> list[list[int]]:
    """Words Deletion (WD): remove ``ratio`` of the words, keeping the order of the rest.

    Decision: round(ratio·n) words (at least one), but never every word: one word always remains.
    """
    count = min(affected_count(len(units), ratio), max(len(units) - 1, 0))
    dropped = set(rng.sample(range(len(units)), count))
    return [unit for index, unit in enumerate(units) if index not in dropped]


def split_units(
    input_ids: list[int], special_tokens_mask: list[int], word_ids: list[int] | None = None
) -> tuple[list[int], list[list[int]], list[int]]:
    """(leading special tokens, content units, trailing special tokens) of one tokenized sentence.

    The content is everything from the first to the last non-special token. A unit is one token, or with
    ``word_ids`` (the fast tokenizer's word index of each token) the run of tokens of one word.
    """
    content = [position for position, special in enumerate(special_tokens_mask) if not special]
    if not content:
        return list(input_ids), [], []
    start, end = content[0], content[-1] + 1
    units: list[list[int]] = []
    for position in range(start, end):
        same_word = (
            word_ids is not None
            and bool(units)
            and word_ids[position] != SPECIAL_WORD_ID
            and word_ids[position] == word_ids[position - 1]
        )
        if same_word:
            units[-1].append(input_ids[position])
        else:
            units.append([input_ids[position]])
    return list(input_ids[:start]), units, list(input_ids[end:])


def augment_sentence(
    input_ids: list[int],
    special_tokens_mask: list[int],
    augmentation: str,
    rng: random.Random,
    word_ids: list[int] | None = None,
    repetition_ratio: float = 0.2,
    deletion_ratio: float = 0.2,
    max_length: int | None = None,
) -> list[int]:
    """One augmented view x̂ = δ(x) of a tokenized sentence (Eq. 3, Appendix A).

    The special tokens ([CLS]/[SEP], <s>/</s>) stay where they are; the augmentation moves the content's units
    (words with ``word_ids``, else tokens): shuffled (SS: a random permutation), inverted (IS: the words in reverse
    order, the tokens inside a word keep theirs), repeated (WR) or deleted (WD). "dropout" returns the sentence
    unchanged: its view differs by the dropout mask of the encoder. A view longer than ``max_length`` (repetition)
    loses the end of its content.
    """
    if augmentation == "dropout":
        return list(input_ids)
    leading, units, trailing = split_units(input_ids, special_tokens_mask, word_ids)
    if augmentation == "shuffle":
        rng.shuffle(units)
    elif augmentation == "inversion":
        units = units[::-1]
    elif augmentation == "repetition":
        units = repeat_units(units, repetition_ratio, rng)
    else:
        units = delete_units(units, deletion_ratio, rng)
    content = [token for unit in units for token in unit]
    if max_length is not None:
        content = content[: max(max_length - len(leading) - len(trailing), 0)]
    return leading + content + trailing


class GroupContrast(nn.Module):
    """What Eq. 4 and Eq. 1 share: the logits of each anchor against its K positives and its in-batch negatives, at
    the temperature τ."""

    def __init__(self, temperature: float = 0.05) -> None:
        super().__init__()
        self.temperature = temperature

    def logits(
        self, anchors: torch.Tensor, positives: torch.Tensor, candidates: torch.Tensor, label_offset: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """For anchors f_θ1(x_i) [N, D], positives f_θ2(x̂_k^i) [N, K, D] and candidates f_θ2(x_j) [M, D] (the
        anchors of all processes, this process's from ``label_offset``): s(anchor_i, positive_ik)/τ [N, K] and
        s(anchor_i, candidate_j)/τ for j ≠ i [N, M − 1] (x_j ∼ X ∧ j ≠ i). Cosine similarity, in float32."""
        with float32_region(anchors):
            unit_anchors = F.normalize(widened(anchors), dim=-1)
            positive_logits = torch.einsum("nd,nkd->nk", unit_anchors, F.normalize(widened(positives), dim=-1))
            candidate_logits = unit_anchors @ F.normalize(widened(candidates), dim=-1).T
            rows = torch.arange(anchors.shape[0], device=anchors.device)
            own = torch.zeros_like(candidate_logits, dtype=torch.bool)
            own[rows, rows + label_offset] = True
            negative_logits = candidate_logits[~own].view(anchors.shape[0], candidates.shape[0] - 1)
            return positive_logits / self.temperature, negative_logits / self.temperature


class PeerPositiveContrast(GroupContrast):
    """log p^{P-Cf}_{θ1,θ2}(x_i), Eq. 4: one softmax over the anchor's K positives and its in-batch negatives.

    θ1 encodes the anchor x_i; θ2 encodes the positives x̂_k^i and the negatives x_j (the other sentences of the
    batch, unaugmented). The positives compete with each other as well as with the negatives ("peer-competition").
    Returns log-probabilities [N, K + M − 1], the K positives first.
    """

    def forward(
        self, anchors: torch.Tensor, positives: torch.Tensor, candidates: torch.Tensor, label_offset: int = 0
    ) -> torch.Tensor:
        positive_logits, negative_logits = self.logits(anchors, positives, candidates, label_offset)
        with float32_region(anchors):
            return torch.cat([positive_logits, negative_logits], dim=1).log_softmax(dim=1)


class VanillaContrastiveLoss(GroupContrast):
    """Σ_{δ_k ∈ Δ} L^(c)(X, δ_k; θ), the vanilla InfoNCE of Eq. 1 for each augmentation, summed (Eq. 6).

    L^(c)_k = −E_i log e^{s(f(x_i), f(δ_k(x_i)))/τ} / (e^{s(f(x_i), f(δ_k(x_i)))/τ} + Σ_{j≠i} e^{s(f(x_i), f(x_j))/τ}):
    one network encodes anchor, positive and negatives; as in Eq. 1 the negatives are the other sentences x_j.
    """

    def forward(
        self, anchors: torch.Tensor, positives: torch.Tensor, candidates: torch.Tensor, label_offset: int = 0
    ) -> torch.Tensor:
        positive_logits, negative_logits = self.logits(anchors, positives, candidates, label_offset)
        with float32_region(anchors):
            negatives = negative_logits.logsumexp(dim=1, keepdim=True)  # −inf with no negatives: loss 0
            per_positive = torch.logaddexp(positive_logits, negatives) - positive_logits  # [N, K]
            return per_positive.sum(dim=1).mean()


class PeerCooperationLoss(nn.Module):
    """L^(p), Eq. 5: E_i KL[p_{θ,θ′}(x_i) ‖ p_{θ′,θ′}(x_i)] + E_i KL[p_{θ,θ′}(x_i) ‖ p_{θ′,θ}(x_i)].

    KL[P ‖ Q] = Σ P (log P − log Q), with P = p_{θ,θ′} the first argument of both terms. The first term makes the
    main network's anchors agree with the peer's; the second keeps θ′ from drifting away from θ (Section 2.2.3).
    Decision: the paper writes L^(p)_{θ,θ′}, optimized w.r.t. both θ and θ′ (the subscript convention of Eq. 1), and
    names no stop-gradient, so by default both arguments carry gradient; ``detach_target`` makes P a fixed target.
    Returns the two terms, each averaged over the anchors.
    """

    def __init__(self, detach_target: bool = False) -> None:
        super().__init__()
        self.detach_target = detach_target

    def forward(
        self, log_p_main_peer: torch.Tensor, log_p_peer_peer: torch.Tensor, log_p_peer_main: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        with float32_region(log_p_main_peer):
            log_target = widened(log_p_main_peer)
            if self.detach_target:
                log_target = log_target.detach()
            target = log_target.exp()

            def kl(log_q: torch.Tensor) -> torch.Tensor:
                return (target * (log_target - widened(log_q))).sum(dim=1).mean()

            return kl(log_p_peer_peer), kl(log_p_peer_main)


class PCLLoss(nn.Module):
    """Eq. 6: w·L^(p)_{θ,θ′} + β·Σ_k [L^(c)_θ(δ_k) + L^(c)_θ′(δ_k)], with w = 1 in the paper.

    Inputs are the sentence embeddings of both networks: anchors [N, D] and positives [N, K, D] of θ (main) and θ′
    (peer), and each network's anchors of all processes as candidates [M, D] (this process's rows from
    ``label_offset``). Returns the total and its terms (detached) for logging: ``loss_kl_peer_peer`` and
    ``loss_kl_peer_main`` (Eq. 5), ``loss_contrastive_main`` and ``loss_contrastive_peer`` (Σ_k of Eq. 1).
    """

    def __init__(
        self,
        temperature: float = 0.05,
        beta: float = 1.0,
        cooperation_weight: float = 1.0,
        detach_kl_target: bool = False,
    ) -> None:
        super().__init__()
        self.group_softmax = PeerPositiveContrast(temperature)
        self.cooperation_loss = PeerCooperationLoss(detach_kl_target)
        self.contrastive_loss = VanillaContrastiveLoss(temperature)
        self.beta = beta
        self.cooperation_weight = cooperation_weight

    def forward(
        self,
        main_anchors: torch.Tensor,
        main_positives: torch.Tensor,
        peer_anchors: torch.Tensor,
        peer_positives: torch.Tensor,
        main_candidates: torch.Tensor | None = None,
        peer_candidates: torch.Tensor | None = None,
        label_offset: int = 0,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        main_candidates = main_anchors if main_candidates is None else main_candidates
        peer_candidates = peer_anchors if peer_candidates is None else peer_candidates
        # p_{θa,θb}: θa encodes the anchor, θb the positives and the negatives (Eq. 4).
        log_p_main_peer = self.group_softmax(main_anchors, peer_positives, peer_candidates, label_offset)
        log_p_peer_peer = self.group_softmax(peer_anchors, peer_positives, peer_candidates, label_offset)
        log_p_peer_main = self.group_softmax(peer_anchors, main_positives, main_candidates, label_offset)
        kl_peer_peer, kl_peer_main = self.cooperation_loss(log_p_main_peer, log_p_peer_peer, log_p_peer_main)
        contrastive_main = self.contrastive_loss(main_anchors, main_positives, main_candidates, label_offset)
        contrastive_peer = self.contrastive_loss(peer_anchors, peer_positives, peer_candidates, label_offset)
        loss = self.cooperation_weight * (kl_peer_peer + kl_peer_main) + self.beta * (
            contrastive_main + contrastive_peer
        )
        components = {
            "loss_kl_peer_peer": kl_peer_peer.detach(),
            "loss_kl_peer_main": kl_peer_main.detach(),
            "loss_contrastive_main": contrastive_main.detach(),
            "loss_contrastive_peer": contrastive_peer.detach(),
        }
        return loss, components


class PCLObjective(Objective):
    """K augmented positives per sentence, a peer network θ′, and the loss of Eq. 6; τ is the model config's
    ``contrastive_temperature``.

    Batches carry the anchors (``input_ids``, ...) and their positives (``positive_input_ids``, ... [N, K, L]),
    all padded to one length so that one model call encodes a network's anchors and positives together.
    """

    name = "pcl"
    paper = Paper(
        "PCL",
        "Peer-Contrastive Learning with diverse augmentations ([Wu et al., 2022](https://arxiv.org/abs/2201.12093))",
        """@inproceedings{wu2022pcl,
  title     = {{PCL}: Peer-Contrastive Learning with Diverse Augmentations for Unsupervised Sentence Embeddings},
  author    = {Wu, Qiyu and Tao, Chongyang and Shen, Tao and Xu, Can and Geng, Xiubo and Jiang, Daxin},
  booktitle = {Proceedings of EMNLP},
  year      = {2022}
}""",
    )
    loss_terms = ("loss_kl_peer_peer", "loss_kl_peer_main", "loss_contrastive_main", "loss_contrastive_peer")
    settings_class = PCLSettings

    @classmethod
    def check_config(cls, config, settings: PCLSettings | None = None) -> None:
        """As every objective's, and the untied peer refused with LoRA: it is a second whole encoder, trained in full,
        which LoRA's frozen encoder would not be."""
        super().check_config(config, settings)
        if getattr(config, "lora", None) and (settings or cls.stored_settings(config)).pcl_untied_peer:
            raise ValueError(
                "--pcl_untied_peer with --lora_r: the untied peer θ′ is a second whole encoder, trained in full, "
                "while LoRA trains adapters on a frozen one; use the tied peer (the default) with LoRA."
            )

    def __init__(self, model: nn.Module, settings: PCLSettings | None = None) -> None:
        super().__init__(model, settings)
        unwrapped = unwrap_model(model)
        self.positive_augmentations = self.settings.positive_augmentations()
        self.loss = PCLLoss(
            unwrapped.config.contrastive_temperature,
            self.settings.pcl_beta,
            self.settings.pcl_cooperation_weight,
            self.settings.pcl_detach_kl_target,
        )
        self.matryoshka = Matryoshka.of(unwrapped.config)  # every term summed over its sizes
        self.encoder_config = unwrapped.encoder.config  # its input limit caps the views word repetition lengthens
        # θ′: None when tied to θ. Untied, a trainable second IFCL model of the same config holding a copy of the
        # encoder (and of SimCSE's MLP for the cls pooler), so it pools exactly like θ.
        self.peer: nn.Module | None = None
        if self.settings.pcl_untied_peer:
            peer_config = copy.deepcopy(unwrapped.config)
            peer_config.update(self.run_settings(self.settings))  # the encoder alone, as the model trains
            self.peer = type(unwrapped)(peer_config)
            self.peer.encoder.load_state_dict(unwrapped.encoder.state_dict())
            if unwrapped.mlp is not None:
                self.peer.mlp.load_state_dict(unwrapped.mlp.state_dict())
            parameter = next(unwrapped.parameters())
            self.peer.to(device=parameter.device, dtype=parameter.dtype)

    def tokenize(self, batch, tokenizer, max_length: int) -> dict[str, list]:
        """The sentences' features, plus ``word_ids`` (−1 for special tokens) for word-level augmentation."""
        encoding = tokenizer(batch["sentence"], truncation=True, max_length=max_length)
        features = dict(encoding)
        if self.settings.pcl_augmentation_unit == "word":
            if not getattr(tokenizer, "is_fast", False):
                raise ValueError(
                    f"pcl_augmentation_unit 'word' needs a fast tokenizer (word_ids); {type(tokenizer).__name__} is "
                    "not one. Use --pcl_augmentation_unit token."
                )
            features["word_ids"] = [
                [SPECIAL_WORD_ID if word is None else word for word in encoding.word_ids(row)]
                for row in range(len(encoding["input_ids"]))
            ]
        return features

    def collate(self, features: list[dict[str, Any]], tokenizer):
        """Anchors and K augmented positives per sentence (Eq. 3), padded to one length.

        Word-level augmentation reads each feature's ``word_ids`` (from :meth:`tokenize`); token-level finds the
        special tokens with ``tokenizer.get_special_tokens_mask``. Returns ``input_ids``/``attention_mask`` [N, L] and ``positive_input_ids``/``positive_attention_mask``
        [N, K, L] (with ``token_type_ids`` when the tokenizer gives them).
        """
        word_level = self.settings.pcl_augmentation_unit == "word"
        if word_level and any("word_ids" not in feature for feature in features):
            raise ValueError(
                "pcl_augmentation_unit is 'word' but the batch has no word_ids: tokenize the data with "
                "PCLObjective.tokenize, or use --pcl_augmentation_unit token."
            )
        # Drawn from the global generator, which the trainer's seed (and each DataLoader worker's seed) sets.
        rng = random.Random(random.getrandbits(64))
        max_length = max_input_length(tokenizer, self.encoder_config)
        anchors, positives = [], []
        for feature in features:
            input_ids = list(feature["input_ids"])
            if word_level:
                word_ids = list(feature["word_ids"])
                special_tokens_mask = [int(word == SPECIAL_WORD_ID) for word in word_ids]
            else:
                word_ids = None
                special_tokens_mask = tokenizer.get_special_tokens_mask(input_ids, already_has_special_tokens=True)
            anchors.append(input_ids)
            positives.append(
                [
                    augment_sentence(
                        input_ids,
                        special_tokens_mask,
                        augmentation,
                        rng,
                        word_ids,
                        self.settings.pcl_repetition_ratio,
                        self.settings.pcl_deletion_ratio,
                        max_length,
                    )
                    for augmentation in self.positive_augmentations
                ]
            )
        length = max(len(ids) for ids in anchors + [view for views in positives for view in views])
        pad_id = tokenizer.pad_token_id or 0

        def padded(ids: list[int], value: int) -> list[int]:
            return ids + [value] * (length - len(ids))

        batch = {
            "input_ids": torch.tensor([padded(ids, pad_id) for ids in anchors]),
            "attention_mask": torch.tensor([padded([1] * len(ids), 0) for ids in anchors]),
            "positive_input_ids": torch.tensor([[padded(view, pad_id) for view in views] for views in positives]),
            "positive_attention_mask": torch.tensor(
                [[padded([1] * len(view), 0) for view in views] for views in positives]
            ),
        }
        if "token_type_ids" in features[0]:
            # Single sentences: every token is of segment 0, the positives' too.
            batch["token_type_ids"] = torch.tensor([padded(list(f["token_type_ids"]), 0) for f in features])
            batch["positive_token_type_ids"] = torch.zeros_like(batch["positive_input_ids"])
        return batch

    def embed(self, model: nn.Module, inputs: dict[str, torch.Tensor], replay: bool = False) -> Embeddings:
        """Both networks' anchors [N, D] and positives [N, K, D]."""
        num_sentences, num_positives, length = inputs["positive_input_ids"].shape
        # One network's rows: the N anchors, then the N·K positives (sentence-major).
        views = {
            name: torch.cat([inputs[name], inputs[f"positive_{name}"].reshape(-1, length)])
            for name in TOKEN_FIELDS
            if name in inputs and f"positive_{name}" in inputs
        }
        if self.peer is None:
            # Tied θ′ = θ: both networks' rows in one call; each row draws its own dropout mask, so the second half
            # is the second pass of Section 3.2.
            both = {name: torch.cat([rows, rows]) for name, rows in views.items()}
            main, peer = model(**both, training_pooler=True).sentence_embedding.chunk(2)
        else:
            main = model(**views, training_pooler=True).sentence_embedding
            # The peer is the objective's own module, called directly: it is not the (possibly DDP-wrapped) model.
            # Its parameters are still the wrapped model's (the objective is its sub-module), so data parallelism
            # averages their gradients like any other.
            peer = self.peer(**views, training_pooler=True).sentence_embedding
        positives_shape = (num_sentences, num_positives, -1)
        return {
            "main_anchors": main[:num_sentences],
            "main_positives": main[num_sentences:].reshape(positives_shape),
            "peer_anchors": peer[:num_sentences],
            "peer_positives": peer[num_sentences:].reshape(positives_shape),
        }

    def loss_from(
        self, model: nn.Module, embeddings: Embeddings, inputs: dict[str, torch.Tensor], gather: Gather = no_gather
    ) -> ObjectiveOutput:
        main_candidates, label_offset = gather(embeddings["main_anchors"])
        peer_candidates, _ = gather(embeddings["peer_anchors"])
        names = ("main_anchors", "main_positives", "peer_anchors", "peer_positives")
        rows = (*(embeddings[name] for name in names), main_candidates, peer_candidates)
        loss, components = over_sizes(
            self.matryoshka, lambda d: self.loss(*(view[..., :d] for view in rows), label_offset)
        )
        return ObjectiveOutput(loss, components)
