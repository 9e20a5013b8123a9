"""The PCL objective (Wu et al. 2022): the five augmentations, the group softmax of Eq. 4, the KL terms of Eq. 5, the
loss of Eq. 6, the tied and untied peer, and ``run_ifcl.py --objective pcl``."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from dataclasses import asdict

import pytest
import torch
from conftest import ENGLISH, objective_run_args, saved_weight_names
from torch import nn

from ifcl.model import IFCLModel
from ifcl.objectives import build_objective
from ifcl.objectives.pcl import (
    PCLLoss,
    PCLObjective,
    PCLSettings,
    PeerCooperationLoss,
    PeerPositiveContrast,
    VanillaContrastiveLoss,
    augment_sentence,
    split_units,
)

CLS, SEP = 101, 102
# [CLS] w0 w1 w2 ... [SEP] with ten one-token words 10..19.
TEN_WORDS = [CLS, *range(10, 20), SEP]
TEN_WORDS_MASK = [1] + [0] * 10 + [1]
# Words of several pieces: "a" (10), "play ##ing" (11 12), "gu ##it ##ar" (13 14 15), "." (16).
PIECES = [CLS, 10, 11, 12, 13, 14, 15, 16, SEP]
PIECES_WORD_IDS = [-1, 0, 1, 1, 2, 2, 2, 3, -1]
PIECES_WORDS = [[10], [11, 12], [13, 14, 15], [16]]


def content_words(ids: list[int], word_starts: dict[int, list[int]] | None = None) -> list[list[int]]:
    """The words between [CLS] and [SEP] of a view (one-token words, or pieces grouped by their first token)."""
    assert ids[0] == CLS and ids[-1] == SEP, "the special tokens must stay at both ends"
    content = ids[1:-1]
    if word_starts is None:
        return [[token] for token in content]
    words, position = [], 0
    while position < len(content):
        word = word_starts[content[position]]
        assert content[position : position + len(word)] == word, "the pieces of a word were split"
        words.append(word)
        position += len(word)
    return words


def is_subsequence(short: list, long: list) -> bool:
    remaining = iter(long)
    return all(any(item == other for other in remaining) for item in short)


# ---------------------------------------------------------------------------------------------------- augmentations


def test_split_units_keeps_special_tokens_apart_and_groups_word_pieces():
    assert split_units(TEN_WORDS, TEN_WORDS_MASK) == ([CLS], [[t] for t in range(10, 20)], [SEP])
    mask = [int(w == -1) for w in PIECES_WORD_IDS]
    assert split_units(PIECES, mask, PIECES_WORD_IDS) == ([CLS], PIECES_WORDS, [SEP])
    assert split_units([CLS, SEP], [1, 1]) == ([CLS, SEP], [], [])  # an empty sentence has no content


def test_inversion_reverses_the_content_and_keeps_special_tokens_in_place():
    rng = random.Random(0)
    assert augment_sentence(TEN_WORDS, TEN_WORDS_MASK, "inversion", rng) == [CLS, *range(19, 9, -1), SEP]
    # Word level: the words are reversed, the pieces inside a word keep their order.
    mask = [int(w == -1) for w in PIECES_WORD_IDS]
    inverted = augment_sentence(PIECES, mask, "inversion", rng, word_ids=PIECES_WORD_IDS)
    assert inverted == [CLS, 16, 13, 14, 15, 11, 12, 10, SEP]
    # Token level (no word ids): every piece moves on its own.
    assert augment_sentence(PIECES, mask, "inversion", rng) == [CLS, 16, 15, 14, 13, 12, 11, 10, SEP]


def test_shuffle_permutes_whole_words_between_the_special_tokens():
    rng = random.Random(1)
    views = [augment_sentence(TEN_WORDS, TEN_WORDS_MASK, "shuffle", rng) for _ in range(5)]
    for view in views:
        assert sorted(content_words(view)) == [[t] for t in range(10, 20)]
    assert any(view != TEN_WORDS for view in views), "five shuffles of ten words all kept the order"

    mask = [int(w == -1) for w in PIECES_WORD_IDS]
    starts = {word[0]: word for word in PIECES_WORDS}
    orders = set()
    for _ in range(30):
        view = augment_sentence(PIECES, mask, "shuffle", rng, word_ids=PIECES_WORD_IDS)
        words = content_words(view, starts)  # asserts that no word was split
        assert sorted(words) == sorted(PIECES_WORDS)
        orders.add(tuple(word[0] for word in words))
    assert len(orders) > 5  # the order really is random


def test_repetition_inserts_copies_of_a_fifth_of_the_words():
    rng = random.Random(2)
    for _ in range(10):
        view = augment_sentence(TEN_WORDS, TEN_WORDS_MASK, "repetition", rng, repetition_ratio=0.2)
        words = [word[0] for word in content_words(view)]
        assert len(words) == 12  # 20% of 10 words, duplicated
        extra = Counter(words) - Counter(range(10, 20))
        assert sum(extra.values()) == 2 and len(extra) == 2  # two distinct words, one copy each
        assert is_subsequence(list(range(10, 20)), words)  # the original sentence is still there, in order

    # Word level: a copied word brings all its pieces; a short sentence still gets one copy.
    mask = [int(w == -1) for w in PIECES_WORD_IDS]
    starts = {word[0]: word for word in PIECES_WORDS}
    for _ in range(10):
        view = augment_sentence(PIECES, mask, "repetition", rng, word_ids=PIECES_WORD_IDS, repetition_ratio=0.2)
        words = content_words(view, starts)
        assert len(words) == 5 and is_subsequence(PIECES_WORDS, words)


def test_deletion_removes_a_fifth_of_the_words_and_never_all():
    rng = random.Random(3)
    for _ in range(10):
        view = augment_sentence(TEN_WORDS, TEN_WORDS_MASK, "deletion", rng, deletion_ratio=0.2)
        words = [word[0] for word in content_words(view)]
        assert len(words) == 8 and is_subsequence(words, list(range(10, 20)))
    # One word: nothing is removed; two words: one remains; an empty sentence stays empty.
    assert augment_sentence([CLS, 10, SEP], [1, 0, 1], "deletion", rng, deletion_ratio=0.9) == [CLS, 10, SEP]
    for _ in range(5):
        assert len(augment_sentence([CLS, 10, 11, SEP], [1, 0, 0, 1], "deletion", rng, deletion_ratio=0.9)) == 3
    assert augment_sentence([CLS, SEP], [1, 1], "deletion", rng) == [CLS, SEP]
    # Word level: a deleted word takes all its pieces.
    mask = [int(w == -1) for w in PIECES_WORD_IDS]
    starts = {word[0]: word for word in PIECES_WORDS}
    view = augment_sentence(PIECES, mask, "deletion", rng, word_ids=PIECES_WORD_IDS, deletion_ratio=0.2)
    assert len(content_words(view, starts)) == 3


def test_dropout_view_is_the_sentence_itself_and_long_views_are_cut():
    rng = random.Random(4)
    assert augment_sentence(TEN_WORDS, TEN_WORDS_MASK, "dropout", rng) == TEN_WORDS
    view = augment_sentence(TEN_WORDS, TEN_WORDS_MASK, "repetition", rng, repetition_ratio=1.0, max_length=12)
    assert len(view) == 12 and view[0] == CLS and view[-1] == SEP


def test_positives_are_dropout_then_the_discrete_augmentations_in_turn():
    # K = 9 of the paper: dropout and each discrete augmentation twice (Appendix A: strategies repeat).
    nine = PCLSettings().positive_augmentations()
    assert nine[0] == "dropout" and len(nine) == 9
    assert Counter(nine) == {"dropout": 1, "shuffle": 2, "inversion": 2, "repetition": 2, "deletion": 2}
    five = ["dropout", "shuffle", "inversion", "repetition", "deletion"]
    assert PCLSettings(pcl_num_positives=5).positive_augmentations() == five
    assert PCLSettings(pcl_num_positives=1).positive_augmentations() == ["dropout"]  # PCL_{K=1}
    mono = PCLSettings(pcl_augmentations="shuffle").positive_augmentations()  # PCL_SS of Fig. 3
    assert mono == ["dropout"] + ["shuffle"] * 8


@pytest.mark.parametrize("unit", ["word", "token"])
def test_collate_gives_k_augmented_positives_padded_with_the_anchors(tiny_model, unit):
    tokenizer = tiny_model.tokenizer
    objective = PCLObjective(tiny_model, PCLSettings(pcl_num_positives=5, pcl_augmentation_unit=unit))
    features = objective.tokenize({"sentence": ENGLISH[:3]}, tokenizer, max_length=32)
    assert ("word_ids" in features) == (unit == "word")
    rows = [{key: values[row] for key, values in features.items()} for row in range(3)]
    for row in rows:  # as a BERT tokenizer gives them
        row["token_type_ids"] = [0] * len(row["input_ids"])
    random.seed(0)
    batch = objective.collate(rows, tokenizer)
    random.seed(0)
    assert torch.equal(objective.collate(rows, tokenizer)["positive_input_ids"], batch["positive_input_ids"])

    n, k, length = batch["positive_input_ids"].shape
    assert (n, k) == (3, 5) and batch["input_ids"].shape == (3, length)
    assert batch["positive_attention_mask"].shape == (3, 5, length)
    assert batch["token_type_ids"].shape == (3, length) and batch["token_type_ids"].abs().sum() == 0
    assert torch.equal(batch["positive_token_type_ids"], torch.zeros(3, 5, length, dtype=torch.long))
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    for row, feature in enumerate(rows):
        anchor = feature["input_ids"]
        assert batch["input_ids"][row, : len(anchor)].tolist() == anchor
        assert batch["attention_mask"][row].sum().item() == len(anchor)
        views = []
        for view_ids, view_mask in zip(batch["positive_input_ids"][row], batch["positive_attention_mask"][row]):
            view = view_ids[: int(view_mask.sum())].tolist()
            assert view[0] == cls_id and view[-1] == sep_id and set(view_ids[len(view) :].tolist()) <= {0}
            views.append(view)
        dropout, shuffled, inverted, repeated, deleted = views
        content = anchor[1:-1]
        assert dropout == anchor
        assert sorted(shuffled[1:-1]) == sorted(content) and sorted(inverted[1:-1]) == sorted(content)
        if unit == "token":
            assert inverted[1:-1] == content[::-1]
        assert len(repeated) > len(anchor) and len(deleted) < len(anchor)
        assert is_subsequence(content, repeated[1:-1]) and is_subsequence(deleted[1:-1], content)


def test_word_level_augmentation_needs_word_ids(tiny_model):
    class SlowTokenizer:
        is_fast = False

        def __call__(self, sentences, **kwargs):
            return {"input_ids": [[CLS, 10, SEP] for _ in sentences], "attention_mask": [[1, 1, 1] for _ in sentences]}

    objective = PCLObjective(tiny_model, PCLSettings())
    with pytest.raises(ValueError, match="pcl_augmentation_unit"):
        objective.tokenize({"sentence": ["a b"]}, SlowTokenizer(), max_length=8)
    with pytest.raises(ValueError, match="pcl_augmentation_unit"):
        objective.collate([{"input_ids": [CLS, 10, SEP], "attention_mask": [1, 1, 1]}], SlowTokenizer())


# ---------------------------------------------------------------------------------------------------- losses by hand


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a @ b).item() / (math.sqrt((a @ a).item()) * math.sqrt((b @ b).item()))


def log_group_softmax_by_hand(anchors, positives, candidates, tau, offset=0) -> list[list[float]]:
    """Eq. 4 written out: [cos(a_i, p_ik)/τ]_k ∪ [cos(a_i, c_j)/τ]_{j ≠ i}, then log-softmax, for each anchor."""
    rows = []
    for i in range(anchors.shape[0]):
        logits = [cosine(anchors[i], positive) / tau for positive in positives[i]]
        logits += [cosine(anchors[i], c) / tau for j, c in enumerate(candidates) if j != offset + i]
        log_normalizer = math.log(sum(math.exp(x) for x in logits))
        rows.append([x - log_normalizer for x in logits])
    return rows


def vanilla_by_hand(anchors, positives, candidates, tau, offset=0) -> float:
    """Σ_k of Eq. 1, averaged over anchors: −log e^{s_ik} / (e^{s_ik} + Σ_{j≠i} e^{s_ij})."""
    total = 0.0
    for i in range(anchors.shape[0]):
        negatives = sum(math.exp(cosine(anchors[i], c) / tau) for j, c in enumerate(candidates) if j != offset + i)
        for positive in positives[i]:
            s = math.exp(cosine(anchors[i], positive) / tau)
            total += -math.log(s / (s + negatives))
    return total / anchors.shape[0]


def kl_by_hand(log_p: list[list[float]], log_q: list[list[float]]) -> float:
    """E_i KL[P ‖ Q] = mean_i Σ_c P_ic (log P_ic − log Q_ic)."""
    return sum(sum(math.exp(p) * (p - q) for p, q in zip(row_p, row_q)) for row_p, row_q in zip(log_p, log_q)) / len(
        log_p
    )


def hand_tensors(seed: int, n: int = 3, k: int = 2, d: int = 4):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=generator), torch.randn(n, k, d, generator=generator)


def test_group_softmax_is_eq4_over_positives_and_the_other_sentences():
    anchors, positives = hand_tensors(0)
    candidates = torch.randn(3, 4, generator=torch.Generator().manual_seed(9))
    module = PeerPositiveContrast(temperature=0.5)
    log_p = module(anchors, positives, candidates)
    assert log_p.shape == (3, 2 + 2)  # K positives and the N − 1 other sentences
    torch.testing.assert_close(log_p, torch.tensor(log_group_softmax_by_hand(anchors, positives, candidates, 0.5)))
    # Candidates of all processes: this process's sentences start at the offset and only its own is left out.
    others = torch.tensor([[1.0, 0.0, -1.0, 2.0], [0.5, 0.5, 0.5, -0.5]])
    gathered = torch.cat([others, candidates])
    log_p = module(anchors, positives, gathered, label_offset=2)
    expected = log_group_softmax_by_hand(anchors, positives, gathered, 0.5, offset=2)
    torch.testing.assert_close(log_p, torch.tensor(expected))


def test_vanilla_contrastive_is_eq1_summed_over_the_augmentations():
    anchors, positives = hand_tensors(1, k=3)
    module = VanillaContrastiveLoss(temperature=0.5)
    value = module(anchors, positives, anchors)
    assert value.item() == pytest.approx(vanilla_by_hand(anchors, positives, anchors, 0.5), rel=1e-5)
    # A lone sentence has no negatives: every positive is the whole softmax, the loss is 0.
    assert module(anchors[:1], positives[:1], anchors[:1]).item() == pytest.approx(0.0, abs=1e-6)


def test_pcl_loss_is_the_two_kl_terms_of_eq5_plus_beta_times_the_vanilla_terms():
    tau, beta = 0.5, 0.7
    main_anchors, main_positives = hand_tensors(2)
    peer_anchors, peer_positives = hand_tensors(3)
    loss, components = PCLLoss(temperature=tau, beta=beta)(main_anchors, main_positives, peer_anchors, peer_positives)

    # p_{θa,θb}: θa encodes the anchor, θb the positives and the negatives.
    main_peer = log_group_softmax_by_hand(main_anchors, peer_positives, peer_anchors, tau)
    peer_peer = log_group_softmax_by_hand(peer_anchors, peer_positives, peer_anchors, tau)
    peer_main = log_group_softmax_by_hand(peer_anchors, main_positives, main_anchors, tau)
    kl_peer_peer, kl_peer_main = kl_by_hand(main_peer, peer_peer), kl_by_hand(main_peer, peer_main)
    contrastive_main = vanilla_by_hand(main_anchors, main_positives, main_anchors, tau)
    contrastive_peer = vanilla_by_hand(peer_anchors, peer_positives, peer_anchors, tau)

    assert components["loss_kl_peer_peer"].item() == pytest.approx(kl_peer_peer, rel=1e-4)
    assert components["loss_kl_peer_main"].item() == pytest.approx(kl_peer_main, rel=1e-4)
    assert components["loss_contrastive_main"].item() == pytest.approx(contrastive_main, rel=1e-5)
    assert components["loss_contrastive_peer"].item() == pytest.approx(contrastive_peer, rel=1e-5)
    expected = kl_peer_peer + kl_peer_main + beta * (contrastive_main + contrastive_peer)
    assert loss.item() == pytest.approx(expected, rel=1e-5)

    # The cooperation weight scales Eq. 5 only (0 is PCL_noP).
    no_cooperation, _ = PCLLoss(tau, beta, cooperation_weight=0.0)(
        main_anchors, main_positives, peer_anchors, peer_positives
    )
    assert no_cooperation.item() == pytest.approx(beta * (contrastive_main + contrastive_peer), rel=1e-5)


def test_kl_module_is_kl_of_the_first_argument_against_each_other():
    log_p = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6]]).log()
    log_q = torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.3, 0.6]]).log()
    log_r = torch.tensor([[1 / 3, 1 / 3, 1 / 3], [0.4, 0.4, 0.2]]).log()
    first, second = PeerCooperationLoss()(log_p, log_q, log_r)
    assert first.item() == pytest.approx(kl_by_hand(log_p.tolist(), log_q.tolist()), rel=1e-5)
    assert second.item() == pytest.approx(kl_by_hand(log_p.tolist(), log_r.tolist()), rel=1e-5)


@pytest.mark.parametrize("detach", [False, True])
def test_kl_target_carries_gradient_unless_detached(detach):
    main_anchors, main_positives = hand_tensors(4)
    peer_anchors, peer_positives = hand_tensors(5)
    main_candidates = main_anchors.clone()  # θ's negatives of p_{θ′,θ}, kept apart from θ's anchors here
    main_anchors.requires_grad_(True)
    # θ's anchors then enter Eq. 5 only through the first argument p_{θ,θ′}; with β = 0 nothing else uses them.
    loss, _ = PCLLoss(0.5, beta=0.0, detach_kl_target=detach)(
        main_anchors, main_positives, peer_anchors, peer_positives, main_candidates, peer_anchors
    )
    loss.backward()
    has_gradient = main_anchors.grad is not None and main_anchors.grad.abs().sum().item() > 0
    assert has_gradient == (not detach)


# ---------------------------------------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    ("settings", "name"),
    [
        ({"pcl_num_positives": 0}, "pcl_num_positives"),
        ({"pcl_augmentations": "shuffle,rotate"}, "pcl_augmentations"),
        ({"pcl_augmentations": " , "}, "pcl_augmentations"),
        ({"pcl_augmentation_unit": "char"}, "pcl_augmentation_unit"),
        ({"pcl_repetition_ratio": 0.0}, "pcl_repetition_ratio"),
        ({"pcl_repetition_ratio": 1.5}, "pcl_repetition_ratio"),
        ({"pcl_deletion_ratio": 1.0}, "pcl_deletion_ratio"),
        ({"pcl_beta": -1.0}, "pcl_beta"),
        ({"pcl_cooperation_weight": -0.1}, "pcl_cooperation_weight"),
        ({"pcl_beta": 0.0, "pcl_cooperation_weight": 0.0}, "pcl_beta and pcl_cooperation_weight"),
    ],
)
def test_impossible_settings_name_the_setting(settings, name):
    with pytest.raises(ValueError, match=name):
        PCLSettings(**settings)


# ---------------------------------------------------------------------------------------------------- objective


class CountingModel(nn.Module):
    """Passes calls to an IFCL model and counts them."""

    def __init__(self, model: IFCLModel) -> None:
        super().__init__()
        self.module = model
        self.calls: list[int] = []

    def forward(self, **inputs):
        self.calls.append(inputs["input_ids"].shape[0])
        return self.module(**inputs)


def pcl_batch(objective: PCLObjective, tokenizer, sentences: list[str]) -> dict[str, torch.Tensor]:
    features = objective.tokenize({"sentence": sentences}, tokenizer, max_length=32)
    random.seed(0)
    rows = [{key: values[row] for key, values in features.items()} for row in range(len(sentences))]
    for row in rows:  # as a BERT tokenizer gives them
        row["token_type_ids"] = [0] * len(row["input_ids"])
    return objective.collate(rows, tokenizer)


def test_tied_peer_encodes_both_networks_in_one_call_and_feeds_the_loss(tiny_model):
    objective = PCLObjective(tiny_model, PCLSettings(pcl_num_positives=3))
    assert objective.peer is None
    batch = pcl_batch(objective, tiny_model.tokenizer, ENGLISH[:4])
    counting = CountingModel(tiny_model)
    others = torch.randn(2, tiny_model.hidden_size, generator=torch.Generator().manual_seed(0))
    gathered_rows = []

    def gather(local):
        gathered_rows.append(local.shape[0])
        return torch.cat([others, local]), 2

    tiny_model.eval()  # no dropout: each view's embedding can be recomputed on its own
    try:
        output = objective(counting, batch, gather)
        assert counting.calls == [2 * 4 * (1 + 3)]  # anchors and positives of θ and θ′ in one call
        assert gathered_rows == [4, 4]  # each network's anchors are gathered as negatives

        @torch.no_grad()
        def alone(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            """The training pooler's embedding of one sequence, its padding cut off."""
            return tiny_model(input_ids=ids[mask.bool()][None], training_pooler=True).sentence_embedding[0]

        anchors = torch.stack([alone(ids, mask) for ids, mask in zip(batch["input_ids"], batch["attention_mask"])])
        views = zip(batch["positive_input_ids"], batch["positive_attention_mask"])
        positives = torch.stack([torch.stack([alone(ids, mask) for ids, mask in zip(*view)]) for view in views])
    finally:
        tiny_model.train()
    candidates = torch.cat([others, anchors])
    expected, _ = PCLLoss(tiny_model.config.contrastive_temperature)(
        anchors, positives, anchors, positives, candidates, candidates, 2
    )
    torch.testing.assert_close(output.loss, expected, atol=1e-4, rtol=1e-4)
    # Without dropout the two passes coincide, so the networks agree exactly.
    assert output.components["loss_kl_peer_peer"].item() == pytest.approx(0.0, abs=1e-5)
    assert not objective.pending_rows


def test_untied_peer_is_a_trainable_copy_called_beside_the_model(tiny_model):
    objective = PCLObjective(tiny_model, PCLSettings(pcl_num_positives=2, pcl_untied_peer=True))
    peer = objective.peer
    for (name, theirs), (_, ours) in zip(tiny_model.encoder.named_parameters(), peer.encoder.named_parameters()):
        assert torch.equal(theirs, ours) and theirs.data_ptr() != ours.data_ptr(), name
        assert ours.requires_grad
    batch = pcl_batch(objective, tiny_model.tokenizer, ENGLISH[:4])
    counting = CountingModel(tiny_model)
    tiny_model.zero_grad()
    output = objective(counting, batch)
    assert counting.calls == [4 * (1 + 2)]  # θ only; θ′ is called directly
    output.loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in peer.encoder.parameters() if p.requires_grad)
    assert tiny_model.encoder.embeddings.word_embeddings.weight.grad is not None
    terms = {"loss_kl_peer_peer", "loss_kl_peer_main", "loss_contrastive_main", "loss_contrastive_peer"}
    assert set(output.components) == terms
    tiny_model.zero_grad()


def test_build_objective_reads_pcl_settings_from_the_config(tiny_encoder_dir):
    settings = PCLSettings(pcl_num_positives=4, pcl_beta=0.5)
    model = IFCLModel.from_encoder(
        str(tiny_encoder_dir), objective="pcl", objective_settings=asdict(settings), queue_size=0
    )
    objective = build_objective(model)
    assert isinstance(objective, PCLObjective) and objective.settings == settings
    assert objective.loss.beta == 0.5 and len(objective.positive_augmentations) == 4


# ---------------------------------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("untied", [False, True], ids=["tied", "untied"])
def test_pcl_end_to_end(tiny_encoder_dir, english_sts_data, tmp_path, untied):
    import run_ifcl

    output = tmp_path / "pcl"
    peer = ["--pcl_untied_peer"] if untied else []
    args = objective_run_args(tiny_encoder_dir, english_sts_data, output, "pcl", "--pcl_num_positives", "3", *peer)
    trainer, metrics = run_ifcl.main(args)
    results = json.loads((output / "all_results.json").read_text())
    assert math.isfinite(results["eval_stsb_spearman"]) and math.isfinite(metrics["test_stsb_spearman"])
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    for name in ("loss_kl_peer_peer", "loss_kl_peer_main", "loss_contrastive_main", "loss_contrastive_peer"):
        assert all(math.isfinite(entry[name]) for entry in logged), name
    config = json.loads((output / "config.json").read_text())["ifcl"]
    assert config["objective"] == "pcl" and config["objective_settings"]["pcl_untied_peer"] is untied
    assert not [key for key in saved_weight_names(output) if key.startswith("training_objective.")]
    checkpoint = sorted(output.glob("checkpoint-*"))[-1]
    peer_keys = [key for key in saved_weight_names(checkpoint) if key.startswith("training_objective.peer.")]
    assert bool(peer_keys) is untied  # the untied peer is checkpointed for an exact resume
