"""ConIsI (Sun & Huang, "ConIsI: A Contrastive Framework with Inter-sentence Interaction for Self-supervised Sentence
Representation", CCL 2022), Section 3, as an objective of the IFCL trainer.

Three inputs per sentence x_i, encoded in one model call (padded to a common length; padding is masked): x_i alone;
the positive pair Y_i = [x_i ; x_i] (Section 3.1.1), each half holding the tokens of x_i's own truncation; the
composed pair Z_i = [x_i ; c_i] with c_i a sentence of another meaning (Section 3.2), by ``--conisi_strategy``.

h_[CLS] of the paper is the training pooler's output; the paper's setup (Section 4.2) is ``--pooler_type
cls_before_pooler --eval_pooler_type cls_before_pooler``. Decision: the heads g and f sit on whatever the training
pooler gives; they are this objective's own modules, left out of the published model, which embeds with its
evaluation pooler alone (the paper evaluates the encoder's [CLS], not g's output).

With several processes the contrastive negatives are the pairs of all of them; strategy s draws c_i from the
process's own batch, and the heads' BatchNorm takes each process's batch statistics.
"""

from __future__ import annotations

import random
import re
import zlib
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ifcl.arguments import check_choice, check_within
from ifcl.losses import float32_region, info_nce, widened

from .base import Embeddings, Gather, Objective, ObjectiveOutput, Paper, no_gather, pad_features, unwrap_model
from .wordnet import DEFAULT_WORDNET_PATH, AntonymLexicon, check_wordnet_folder, load_antonym_lexicon

STRATEGIES = ("s", "o1", "o2")
ANTONYM_FALLBACKS = ("subword", "other_sentence")
BATCHNORM_STATISTICS = ("joint", "per_view")

# The three inputs of a step, as feature groups: x_i, Y_i = [x_i ; x_i], Z_i = [x_i ; c_i].
SINGLE, POSITIVE, NEGATIVE = "", "pair_", "negative_"
# Per-token 1/0 list: 1 for the content tokens of a pair's second segment (from the fast tokenizer's sequence ids).
SECOND_SEGMENT = "second_segment"
# Per-row count of words o2 replaced with antonyms (0: the sentence had none, the fallback makes c_i).
ANTONYM_COUNT = "antonym_count"

# A word for o2: letters, possibly hyphenated ("well-known"); WordNet has no entries for digits or punctuation.
WORD = re.compile(r"[A-Za-z]+(?:-[A-Za-z]+)*")


@dataclass
class ConIsISettings:
    """Settings of ``--objective conisi`` (Sun & Huang 2022). τ is the shared ``--temperature``."""

    conisi_strategy: str = field(
        default="s",
        metadata={
            "help": "How c_i of the composed pair Z_i = [x_i ; c_i] is made (Section 3.2): o1 subword replacement, "
            "o2 word replacement by WordNet antonyms, s another sentence of the batch (ConIsI-s, the paper's best "
            "for BERT, Table 6)."
        },
    )
    conisi_lambda: float = field(
        default=0.8,
        metadata={
            "help": "λ of Eq. 10, the weight of the interactive loss; the contrastive loss takes 1 − λ (paper: 0.8 "
            "for BERT-base, 0.1 for RoBERTa-base and BERT-large, Table 3). 0 leaves only the contrastive loss."
        },
    )
    conisi_subword_share: float = field(
        default=0.15,
        metadata={"help": "o1: share of c_i's subword tokens chosen for replacement (at least one)."},
    )
    conisi_random_token_rate: float = field(
        default=0.8,
        metadata={"help": "o1: how often a chosen token becomes a random one; it stays unchanged otherwise."},
    )
    conisi_antonym_share: float = field(
        default=0.15,
        metadata={"help": "o2: share of c_i's words replaced by their WordNet antonym (at least one)."},
    )
    conisi_antonym_fallback: str = field(
        default="subword",
        metadata={
            "help": "o2: c_i of a sentence without any word that has a WordNet antonym: 'subword' (o1 on that "
            "sentence) or 'other_sentence' (s). The paper does not say."
        },
    )
    conisi_wordnet_path: str = field(
        default=DEFAULT_WORDNET_PATH,
        metadata={"help": "o2: folder of the WordNet 3.0 database files (Debian: apt-get install wordnet-base)."},
    )
    conisi_batchnorm: str = field(
        default="joint",
        metadata={
            "help": "Batch statistics of the heads' shared BatchNorm (BN_1 = BN_2, Eq. 2, 6): 'joint' over x, Y and "
            "Z of the batch together, or 'per_view' (each of the three on its own). The paper does not say."
        },
    )

    def __post_init__(self) -> None:
        check_choice(self, "conisi_strategy", STRATEGIES)
        check_within(self, "[0, 1]", "conisi_lambda", meaning="λ of Eq. 10")
        check_within(self, "(0, 1]", "conisi_subword_share")
        check_within(self, "[0, 1]", "conisi_random_token_rate")
        check_within(self, "(0, 1]", "conisi_antonym_share")
        check_choice(self, "conisi_antonym_fallback", ANTONYM_FALLBACKS)
        if not self.conisi_wordnet_path:
            raise ValueError("--conisi_wordnet_path must name a folder (Debian's wordnet-base: /usr/share/wordnet).")
        check_choice(self, "conisi_batchnorm", BATCHNORM_STATISTICS)


class ConIsIHead(nn.Module):
    """The CL head g (Eq. 2) and the interaction classifier f (Eq. 6–7), sharing W_1 = W_2, b_1 = b_2, BN_1 = BN_2.

    h = Elu(BN(W_1·h_[CLS] + b_1)) is g's output (contrast) and f's hidden layer; r = W_3·h + b_3 is f's output.
    Decision: r is one score per pair (W_3 ∈ R^{1×d}). The paper writes r ∈ R^d but then uses it as a scalar logit in
    Eq. 8, a softmax over the two pairs' scores, which needs one number per pair.

    Decision: the shared BN takes the statistics of x, Y and Z together (``joint``, default: Y and Z keep their
    difference in mean, which f learns from), or of each on its own (``per_view``; a batch of one row takes the joint
    statistics, as BatchNorm needs two rows).
    """

    def __init__(self, hidden_size: int, batchnorm: str = "joint") -> None:
        super().__init__()
        self.batchnorm_statistics = batchnorm
        self.dense = nn.Linear(hidden_size, hidden_size)  # W_1, b_1 (= W_2, b_2)
        self.batchnorm = nn.BatchNorm1d(hidden_size)  # BN_1 (= BN_2)
        self.activation = nn.ELU()
        self.classifier = nn.Linear(hidden_size, 1)  # W_3, b_3

    def forward(self, pooled: torch.Tensor, num_views: int = 1) -> torch.Tensor:
        """h (Eq. 2 / Eq. 6) of ``pooled`` [num_views·N, d], the views stacked in blocks of N rows."""
        projected = self.dense(pooled)
        rows = projected.shape[0] // num_views
        if self.batchnorm_statistics == "per_view" and num_views > 1 and rows > 1:
            normalized = torch.cat([self.batchnorm(block) for block in projected.split(rows)])
        else:
            normalized = self.batchnorm(projected)
        return self.activation(normalized)

    def score(self, hidden: torch.Tensor) -> torch.Tensor:
        """r = W_3·h + b_3 (Eq. 7): one same-category score per pair, [N]."""
        return self.classifier(hidden).squeeze(-1)


class ConIsILoss(nn.Module):
    """Eq. 10: L = (1 − λ)·L_Contrastive + λ·L_Interactive, on the heads' outputs.

    - L_Contrastive, Eq. 3–4: the single sentence's h_i^x is the anchor, its pair h_i^Y the positive, the other pairs
      (of all processes; ``label_offset`` points at this process's) the negatives:
      ℓ^I_i = −log e^{sim(h_i^x,h_i^Y)/τ} / Σ_j e^{sim(h_i^x,h_j^Y)/τ}.
    - L_Interactive, Eq. 8–9: ℓ^II_i = −log e^{r_i^Y} / (e^{r_i^Y} + e^{r_i^Z}), the positive pair Y_i scored above
      the composed pair Z_i; computed as softplus(r^Z − r^Y), the same quantity, stable for large scores.

    Returns the total and its terms (``loss_contrastive``, ``loss_interactive``, unweighted, for the logs).
    """

    def __init__(self, temperature: float = 0.05, interactive_weight: float = 0.8) -> None:
        super().__init__()
        self.temperature = temperature
        self.interactive_weight = interactive_weight

    def forward(
        self,
        single: torch.Tensor,
        pair_candidates: torch.Tensor,
        same_scores: torch.Tensor,
        different_scores: torch.Tensor,
        label_offset: int = 0,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        contrastive = info_nce(single, pair_candidates, self.temperature, label_offset=label_offset)
        with float32_region(same_scores):
            interactive = F.softplus(widened(different_scores) - widened(same_scores)).mean()
        loss = (1.0 - self.interactive_weight) * contrastive + self.interactive_weight * interactive
        return loss, {"loss_contrastive": contrastive.detach(), "loss_interactive": interactive.detach()}


def second_segment_span(second_segment: list[int]) -> tuple[int, int]:
    """[start, end) of the second segment's content tokens (1s of the mask; contiguous in a pair input)."""
    positions = [i for i, flag in enumerate(second_segment) if flag]
    if not positions:
        return len(second_segment), len(second_segment)
    return positions[0], positions[-1] + 1


def random_tokens(count: int, vocab_size: int, special_ids: set[int], generator: torch.Generator | None) -> list[int]:
    """``count`` token ids drawn uniformly from the vocabulary without its special tokens."""
    if sum(1 for token in special_ids if 0 <= token < vocab_size) >= vocab_size:
        raise ValueError("The tokenizer's vocabulary has only special tokens: o1 has no token to draw.")
    tokens: list[int] = []
    while len(tokens) < count:
        draws = torch.randint(vocab_size, (count - len(tokens),), generator=generator).tolist()
        tokens.extend(token for token in draws if token not in special_ids)
    return tokens


def replace_subwords(
    input_ids: list[int],
    second_segment: list[int],
    share: float,
    random_token_rate: float,
    vocab_size: int,
    special_ids: set[int],
    generator: torch.Generator | None = None,
) -> tuple[list[int], list[int]]:
    """Subword replacement (o1, Section 3.2.1) of a pair's second segment: c_i from x_i.

    max(1, round(share·n)) of the n content tokens of the second segment are chosen at random (Decision: a count,
    at least one, as BERT's masking picks its 15%); each chosen token becomes a random non-special token with
    probability ``random_token_rate`` (paper: 80%) and stays unchanged otherwise (20%).
    Returns the new ids and the chosen positions.
    """
    eligible = [i for i, flag in enumerate(second_segment) if flag]
    replaced = list(input_ids)
    if not eligible:
        return replaced, []
    count = min(len(eligible), max(1, round(share * len(eligible))))
    order = torch.randperm(len(eligible), generator=generator)[:count].tolist()
    chosen = sorted(eligible[i] for i in order)
    draws = torch.rand(count, generator=generator).tolist()
    randomized = [position for position, draw in zip(chosen, draws) if draw < random_token_rate]
    for position, token in zip(randomized, random_tokens(len(randomized), vocab_size, special_ids, generator)):
        replaced[position] = token
    return replaced, chosen


def swap_second_segment(
    pair: dict[str, list[int]], other: dict[str, list[int]], max_length: int | None = None
) -> dict[str, list[int]]:
    """Z_i = [x_i ; x_k] for strategy s (Section 3.2.2): pair i with its second segment's content tokens replaced by
    those of pair k (both features of one pair group, with the ``second_segment`` mask).

    The special tokens around the segment stay; the new tokens take the token type of the segment they replace.
    The result is cut to ``max_length`` tokens (default: the longer of the two pairs, which keeps it within the
    pair limit, twice x_i's truncated tokens plus the pair's special tokens) by shortening the new second segment.
    """
    start, end = second_segment_span(pair[SECOND_SEGMENT])
    other_start, other_end = second_segment_span(other[SECOND_SEGMENT])
    content = other["input_ids"][other_start:other_end]
    limit = max(len(pair["input_ids"]), len(other["input_ids"])) if max_length is None else max_length
    room = limit - (len(pair["input_ids"]) - (end - start))
    content = content[: max(room, 1)]  # c_i keeps at least one token
    swapped = {
        "input_ids": pair["input_ids"][:start] + content + pair["input_ids"][end:],
        "attention_mask": [1] * (len(pair["input_ids"]) - (end - start) + len(content)),
        SECOND_SEGMENT: pair[SECOND_SEGMENT][:start] + [1] * len(content) + pair[SECOND_SEGMENT][end:],
    }
    if "token_type_ids" in pair:
        types = pair["token_type_ids"]
        segment_type = types[start] if start < len(types) else types[-1]
        swapped["token_type_ids"] = types[:start] + [segment_type] * len(content) + types[end:]
    return swapped


def pick_other_rows(contents: list[tuple[int, ...]], generator: torch.Generator | None = None) -> list[int | None]:
    """For each row i, a random row k ≠ i whose sentence differs from row i's (strategy s: never the sentence
    itself, not even a duplicate of it elsewhere in the batch); None when the batch has no such row."""
    picks: list[int | None] = []
    for i, content in enumerate(contents):
        candidates = [k for k, other in enumerate(contents) if k != i and other != content]
        if not candidates:
            picks.append(None)
            continue
        picks.append(candidates[int(torch.randint(len(candidates), (1,), generator=generator))])
    return picks


@dataclass
class AntonymReplacement:
    """A sentence after word replacement (o2): its text and how many words were replaced."""

    text: str
    replaced: int


def replace_with_antonyms(
    sentence: str, lexicon: AntonymLexicon, share: float, rng: random.Random
) -> AntonymReplacement:
    """Word replacement (o2, Section 3.2.1): full words of ``sentence`` replaced by their WordNet antonym.

    Decision (the paper says 'some full words'): max(1, round(share × words)) words are replaced, chosen at random
    among the words that have an antonym (all of them when fewer); each takes the antonym of its most frequent sense
    that has one (:meth:`AntonymLexicon.antonym`), in WordNet's base form, with the word's capitalization.
    """
    words = list(WORD.finditer(sentence))
    candidates = [(match, antonym) for match in words if (antonym := lexicon.antonym(match.group())) is not None]
    if not candidates:
        return AntonymReplacement(sentence, 0)
    count = min(len(candidates), max(1, round(share * len(words))))
    chosen = sorted(rng.sample(range(len(candidates)), count))
    pieces, last = [], 0
    for index in chosen:
        match, antonym = candidates[index]
        pieces += [sentence[last : match.start()], match_case(match.group(), antonym)]
        last = match.end()
    pieces.append(sentence[last:])
    return AntonymReplacement("".join(pieces), count)


def match_case(word: str, replacement: str) -> str:
    """``replacement`` written in ``word``'s case: UPPER, Capitalized or as is."""
    if len(word) > 1 and word.isupper():
        return replacement.upper()
    if word[:1].isupper():
        return replacement[:1].upper() + replacement[1:]
    return replacement


class ConIsIObjective(Objective):
    """ConIsI: contrast of x_i with its pair [x_i ; x_i], and the interactive classification of [x_i ; x_i] against
    [x_i ; c_i] (Eq. 10). Owns the heads g/f (:class:`ConIsIHead`); τ is the model config's
    ``contrastive_temperature``. Needs a fast tokenizer (its sequence ids locate the pairs' second segments).
    """

    name = "conisi"
    paper = Paper(
        "ConIsI",
        "ConIsI, a contrastive framework with inter-sentence interaction (Sun and Huang, CCL 2022)",
        """@inproceedings{sun2022conisi,
  title     = {{ConIsI}: A Contrastive Framework with Inter-sentence Interaction for Self-supervised Sentence Representation},
  author    = {Sun, Meng and Huang, Degen},
  booktitle = {Proceedings of the 21st China National Conference on Computational Linguistics},
  pages     = {748--760},
  year      = {2022}
}""",
    )
    loss_terms = ("loss_contrastive", "loss_interactive")
    settings_class = ConIsISettings
    without_matryoshka = (
        "its InfoNCE compares the outputs of its training heads, not the embeddings the model publishes, so no size "
        "of those would be trained. Train the sizes with another objective."
    )

    def __init__(self, model: nn.Module, settings: ConIsISettings | None = None) -> None:
        super().__init__(model, settings)
        unwrapped = unwrap_model(model)
        settings = self.settings
        self.strategy = settings.conisi_strategy
        self.head = ConIsIHead(unwrapped.hidden_size, settings.conisi_batchnorm)
        self.loss = ConIsILoss(unwrapped.config.contrastive_temperature, settings.conisi_lambda)
        if self.strategy == "o2":
            # Before any data is read: a missing WordNet stops the run at once, naming the package.
            check_wordnet_folder(settings.conisi_wordnet_path)

    @classmethod
    def longest_input(cls, tokenizer, max_seq_length: int) -> tuple[int, str]:
        """The sentence pairs Y_i, about twice as long as the sentences."""
        length = pair_max_length(tokenizer, max_seq_length)
        return length, f"ConIsI's sentence pairs ({length} tokens for --max_seq_length {max_seq_length})"

    def tokenize(self, batch, tokenizer, max_length: int) -> dict[str, list]:
        """x_i (``max_length``), Y_i = [x_i ; x_i] (x_i's truncated tokens twice, group ``pair_``) with the second segment's
        mask, and for o2 Z_i = [x_i ; antonyms(x_i)] (group ``negative_``) with the count of replaced words."""
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError(
                "--objective conisi needs a fast tokenizer (its sequence ids locate the second sentence of a pair); "
                f"{type(tokenizer).__name__} is not one."
            )
        pair_length = pair_max_length(tokenizer, max_length)
        if max_length - tokenizer.num_special_tokens_to_add(pair=False) < 1:
            raise ValueError(
                f"--max_seq_length {max_length} is too short for ConIsI: a truncated sentence must keep at least one "
                f"token besides its special tokens."
            )
        sentences = batch["sentence"]
        features: dict[str, list] = dict(tokenizer(sentences, truncation=True, max_length=max_length))
        pairs = tokenizer(sentences, sentences, truncation=True, max_length=pair_length)
        features.update(pair_group(pairs, POSITIVE))
        if self.strategy == "o2":
            lexicon = load_antonym_lexicon(self.settings.conisi_wordnet_path)
            share = self.settings.conisi_antonym_share
            # Decision: the words are chosen with a generator seeded by the sentence itself, so the dataset map is
            # reproducible whatever its number of processes (one epoch, as in the paper, sees each sentence once).
            replacements = [
                replace_with_antonyms(s, lexicon, share, random.Random(zlib.crc32(s.encode("utf-8"))))
                for s in sentences
            ]
            negatives = tokenizer(sentences, [r.text for r in replacements], truncation=True, max_length=pair_length)
            features.update(pair_group(negatives, NEGATIVE))
            features[ANTONYM_COUNT] = [r.replaced for r in replacements]
        return features

    def collate(self, features: list[dict[str, Any]], tokenizer):
        """Makes Z_i = [x_i ; c_i] for the batch (o1, s, and the o2 fallback), then pads the three groups to one
        length, so that :meth:`forward` encodes them in one call."""
        rows = [dict(feature) for feature in features]
        negatives = self.compose_negatives(rows, tokenizer)
        for row, negative in zip(rows, negatives):
            row.pop(POSITIVE + SECOND_SEGMENT, None)
            row.pop(ANTONYM_COUNT, None)
            row.update({NEGATIVE + key: value for key, value in negative.items() if key != SECOND_SEGMENT})
            row.pop(NEGATIVE + SECOND_SEGMENT, None)
        pad_token_id = tokenizer.pad_token_id or 0
        return pad_to_common_length(pad_features(rows, {"": pad_token_id}), (SINGLE, POSITIVE, NEGATIVE), pad_token_id)

    def compose_negatives(self, rows: list[dict[str, Any]], tokenizer) -> list[dict[str, list[int]]]:
        """The composed pair Z_i of every row, by the strategy (Section 3.2), drawn from torch's global generator."""
        positives = [group_of(row, POSITIVE) for row in rows]
        if self.strategy == "o2":
            negatives = [group_of(row, NEGATIVE) for row in rows]
            # Rows whose sentence has no word with an antonym: Decision, see --conisi_antonym_fallback.
            fallback = "o1" if self.settings.conisi_antonym_fallback == "subword" else "s"
            methods = ["keep" if row[ANTONYM_COUNT] > 0 else fallback for row in rows]
        else:
            negatives = [None] * len(rows)
            methods = [self.strategy] * len(rows)
        others: list[int | None] = [None] * len(rows)
        if "s" in methods:
            contents = [tuple(p["input_ids"][slice(*second_segment_span(p[SECOND_SEGMENT]))]) for p in positives]
            others = pick_other_rows(contents)
        vocab_size, special_ids = len(tokenizer), set(tokenizer.all_special_ids)
        composed = []
        for i, method in enumerate(methods):
            if method == "keep":
                composed.append(negatives[i])
            elif method == "s" and others[i] is not None:
                composed.append(swap_second_segment(positives[i], positives[others[i]]))
            else:
                # o1, and s for a sentence with no other sentence in its batch (a batch of one or of duplicates).
                negative = dict(positives[i])
                negative["input_ids"], _ = replace_subwords(
                    negative["input_ids"],
                    negative[SECOND_SEGMENT],
                    self.settings.conisi_subword_share,
                    self.settings.conisi_random_token_rate,
                    vocab_size,
                    special_ids,
                )
                composed.append(negative)
        return composed

    @classmethod
    def gradient_cache_refusal(cls, processes: int) -> str | None:
        """Its heads, whose batch norm takes the whole batch, train in the loss's backward outside the encoder's
        forward: exact in one process, but data parallelism would not reduce their gradients."""
        if processes > 1:
            return (
                "its heads train in the loss's backward, outside the encoder's forward, so data parallelism would not "
                "reduce their gradients; train ConIsI with the cache in one process."
            )
        return None

    def embed(self, model: nn.Module, inputs: dict[str, torch.Tensor], replay: bool = False) -> Embeddings:
        """The pooled x_i, Y_i and Z_i, before the heads (whose batch norm takes the whole batch: :meth:`loss_from`)."""
        stacked = stack_groups(inputs, (SINGLE, POSITIVE, NEGATIVE))
        pooled = model(**stacked, training_pooler=True).sentence_embedding
        return dict(zip(("single", "positive", "negative"), pooled.split(inputs["input_ids"].shape[0])))

    def loss_from(
        self, model: nn.Module, embeddings: Embeddings, inputs: dict[str, torch.Tensor], gather: Gather = no_gather
    ) -> ObjectiveOutput:
        pooled = torch.cat([embeddings["single"], embeddings["positive"], embeddings["negative"]])
        single, positive, negative = self.head(pooled, num_views=3).split(embeddings["single"].shape[0])
        pair_candidates, label_offset = gather(positive)
        loss, components = self.loss(
            single, pair_candidates, self.head.score(positive), self.head.score(negative), label_offset
        )
        return ObjectiveOutput(loss, components)


def pair_max_length(tokenizer, max_length: int) -> int:
    """Length of the pair [x_i ; x_i] whose two halves hold the same tokens as x_i alone (truncated to
    ``max_length``): the pair's special tokens plus twice x_i's other tokens. (A limit of 2·max_length would leave
    the halves one token apart whenever the special tokens are odd in number, as BERT's three.)"""
    return tokenizer.num_special_tokens_to_add(pair=True) + 2 * (
        max_length - tokenizer.num_special_tokens_to_add(pair=False)
    )


def pair_group(encoding, prefix: str) -> dict[str, list]:
    """A batch encoding of pairs as the fields of one feature group, with its ``second_segment`` mask."""
    group = {prefix + key: value for key, value in encoding.items()}
    group[prefix + SECOND_SEGMENT] = [
        [1 if sequence == 1 else 0 for sequence in encoding.sequence_ids(i)] for i in range(len(encoding["input_ids"]))
    ]
    return group


def group_of(row: dict[str, Any], prefix: str) -> dict[str, list[int]]:
    """The fields of one feature group of a row, without the prefix."""
    return {key[len(prefix) :]: value for key, value in row.items() if key.startswith(prefix)}


def pad_to_common_length(
    batch: dict[str, torch.Tensor], prefixes: tuple[str, ...], pad_token_id: int
) -> dict[str, torch.Tensor]:
    """Pad the token fields of the groups ``prefixes`` of a padded batch to their common longest length."""
    length = max(batch[prefix + "input_ids"].shape[1] for prefix in prefixes)
    for prefix in prefixes:
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            if prefix + key in batch:
                value = batch[prefix + key]
                pad = pad_token_id if key == "input_ids" else 0
                batch[prefix + key] = F.pad(value, (0, length - value.shape[1]), value=pad)
    return batch


def stack_groups(inputs: dict[str, torch.Tensor], prefixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """The groups' input_ids / attention_mask / token_type_ids (padded to one length by
    :func:`pad_to_common_length`) stacked in the order of ``prefixes``, for one model call (mean pooling and [CLS]
    both ignore the padding). token_type_ids join only when every group has them."""
    return {
        key: torch.cat([inputs[prefix + key] for prefix in prefixes])
        for key in ("input_ids", "attention_mask", "token_type_ids")
        if all(prefix + key in inputs for prefix in prefixes)
    }
