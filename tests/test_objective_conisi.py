"""ConIsI (ifcl/objectives/conisi.py, ifcl/objectives/wordnet.py): the losses against hand computations, the three ways of
making c_i, WordNet antonyms from the installed database, settings, and a tiny run of run_ifcl."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from conftest import ENGLISH, build_tokenizer, objective_run_args, saved_weight_names

from ifcl.objectives.conisi import (
    ConIsIHead,
    ConIsILoss,
    ConIsIObjective,
    ConIsISettings,
    pick_other_rows,
    replace_subwords,
    replace_with_antonyms,
    second_segment_span,
    swap_second_segment,
)
from ifcl.objectives.wordnet import (
    DEFAULT_WORDNET_PATH,
    AntonymLexicon,
    WordNetNotFoundError,
    load_antonym_lexicon,
    missing_wordnet_message,
)

needs_wordnet = pytest.mark.skipif(
    missing_wordnet_message(DEFAULT_WORDNET_PATH) is not None,
    reason="WordNet (Debian's wordnet-base) is not installed",
)


def rows_of(features: dict[str, list]) -> list[dict]:
    """Column-wise tokenize output → the list of row features a data collator receives."""
    count = len(features["input_ids"])
    return [{key: values[i] for key, values in features.items()} for i in range(count)]


def second_content(ids: list[int], second_segment: list[int]) -> list[int]:
    return ids[slice(*second_segment_span(second_segment))]


# ------------------------------------------------------------------------------------------------ losses by hand


def test_loss_matches_hand_computation():
    torch.manual_seed(0)
    single, pairs = torch.randn(3, 4), torch.randn(3, 4)
    same, different = torch.randn(3), torch.randn(3)
    tau, lam = 0.05, 0.8

    def cosine(a, b):
        return float((a @ b) / (a.norm() * b.norm()))

    contrastive = 0.0
    for i in range(3):
        numerator = math.exp(cosine(single[i], pairs[i]) / tau)
        denominator = sum(math.exp(cosine(single[i], pairs[j]) / tau) for j in range(3))
        contrastive += -math.log(numerator / denominator) / 3  # Eq. 3-4
    interactive = (
        sum(-math.log(math.exp(same[i]) / (math.exp(same[i]) + math.exp(different[i]))) for i in range(3)) / 3
    )  # Eq. 8-9
    total = (1 - lam) * contrastive + lam * interactive  # Eq. 10

    loss, components = ConIsILoss(tau, lam)(single, pairs, same, different)
    assert components["loss_contrastive"].item() == pytest.approx(contrastive, rel=1e-5)
    assert components["loss_interactive"].item() == pytest.approx(interactive, rel=1e-5)
    assert loss.item() == pytest.approx(total, rel=1e-5)


def test_contrastive_candidates_of_other_processes():
    """Gathered pairs: this process's rows start at the offset; all candidates are negatives."""
    torch.manual_seed(1)
    single, pairs = torch.randn(2, 4), torch.randn(5, 4)  # 3 rows from another process, then ours
    same = different = torch.zeros(2)
    tau, offset = 0.1, 3
    expected = 0.0
    for i in range(2):
        logits = [float((single[i] @ pairs[j]) / (single[i].norm() * pairs[j].norm())) / tau for j in range(5)]
        expected += (-logits[offset + i] + math.log(sum(math.exp(v) for v in logits))) / 2
    _, components = ConIsILoss(tau, 0.5)(single, pairs, same, different, label_offset=offset)
    assert components["loss_contrastive"].item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("batchnorm", ["joint", "per_view"])
def test_head_matches_hand_computation(batchnorm):
    torch.manual_seed(2)
    head = ConIsIHead(4, batchnorm).train()
    pooled = torch.randn(6, 4)  # three views of two rows
    W1, b1 = head.dense.weight.detach(), head.dense.bias.detach()
    W3, b3 = head.classifier.weight.detach(), head.classifier.bias.detach()
    gamma, beta, eps = head.batchnorm.weight.detach(), head.batchnorm.bias.detach(), head.batchnorm.eps

    def normalize(z):
        mean = z.mean(dim=0)
        variance = ((z - mean) ** 2).mean(dim=0)  # BatchNorm's batch variance (biased)
        return (z - mean) / torch.sqrt(variance + eps) * gamma + beta

    def elu(z):
        return torch.where(z > 0, z, torch.exp(z) - 1)

    projected = pooled @ W1.T + b1
    if batchnorm == "joint":
        normalized = normalize(projected)
    else:
        normalized = torch.cat([normalize(block) for block in projected.split(2)])
    hidden = elu(normalized)  # Eq. 2 (= Eq. 6, shared W, b, BN)
    scores = hidden @ W3.T.squeeze(-1) + b3  # Eq. 7, one score per pair

    got = head(pooled, num_views=3)
    torch.testing.assert_close(got, hidden, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(head.score(got), scores, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------ making c_i


def test_subword_replacement_changes_a_share_of_the_second_segment_only():
    ids = [2, 10, 11, 12, 3, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 3]
    second = [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0]
    specials = {0, 1, 2, 3, 4}
    generator = torch.Generator().manual_seed(0)
    replaced, chosen = replace_subwords(ids, second, 0.3, 1.0, 30, specials, generator)
    assert len(chosen) == 3  # round(0.3 · 10)
    assert all(second[p] for p in chosen)
    assert [t for p, t in enumerate(replaced) if p not in chosen] == [t for p, t in enumerate(ids) if p not in chosen]
    assert all(replaced[p] not in specials and replaced[p] < 30 for p in chosen)

    # At least one token, however small the share; with rate 0 the chosen tokens stay as they were (the 20%).
    unchanged, chosen = replace_subwords(ids, second, 0.01, 0.0, 30, specials, generator)
    assert len(chosen) == 1 and unchanged == ids


def test_subword_replacement_randomizes_80_percent_of_the_chosen_tokens():
    ids, second = [2] + list(range(100, 110)) + [3], [0] + [1] * 10 + [0]
    generator = torch.Generator().manual_seed(1)
    changed = total = 0
    for _ in range(1500):
        replaced, chosen = replace_subwords(ids, second, 1.0, 0.8, 10**6, {0, 1, 2, 3}, generator)
        total += len(chosen)
        changed += sum(replaced[p] != ids[p] for p in chosen)  # a draw equal to the original: p = 1e-6
    assert total == 15000
    assert changed / total == pytest.approx(0.8, abs=0.02)


def test_swap_second_segment_keeps_the_first_sentence_and_the_special_tokens():
    cls, sep = 101, 102
    pair = {
        "input_ids": [cls, 5, 6, sep, 5, 6, sep],
        "attention_mask": [1] * 7,
        "token_type_ids": [0, 0, 0, 0, 1, 1, 1],
        "second_segment": [0, 0, 0, 0, 1, 1, 0],
    }
    other = {
        "input_ids": [cls, 7, 8, 9, sep, 7, 8, 9, sep],
        "attention_mask": [1] * 9,
        "token_type_ids": [0, 0, 0, 0, 0, 1, 1, 1, 1],
        "second_segment": [0, 0, 0, 0, 0, 1, 1, 1, 0],
    }
    swapped = swap_second_segment(pair, other)
    assert swapped["input_ids"] == [cls, 5, 6, sep, 7, 8, 9, sep]
    assert swapped["token_type_ids"] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert swapped["attention_mask"] == [1] * 8
    assert swapped["second_segment"] == [0, 0, 0, 0, 1, 1, 1, 0]
    # Over a limit, the new second sentence is shortened.
    assert swap_second_segment(pair, other, max_length=7)["input_ids"] == [cls, 5, 6, sep, 7, 8, sep]


def test_other_sentence_is_never_the_sentence_itself():
    contents = [(1, 2), (3,), (1, 2), (4, 5), (3,)]
    generator = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(50):
        picks = pick_other_rows(contents, generator)
        for i, k in enumerate(picks):
            assert k is not None and k != i and contents[k] != contents[i]
            seen.add((i, k))
    allowed = {(i, k) for i in range(5) for k in range(5) if contents[k] != contents[i]}
    assert seen == allowed  # every allowed pairing turns up
    assert pick_other_rows([(1,)]) == [None]
    assert pick_other_rows([(1,), (1,)]) == [None, None]


def test_tokenize_pairs_and_collate_strategy_s(tiny_model):
    tokenizer = tiny_model.tokenizer
    objective = ConIsIObjective(tiny_model, ConIsISettings(conisi_strategy="s"))
    sentences = ENGLISH[:5] + [ENGLISH[0]]  # a duplicate: never its own c_i either
    max_length = 8
    features = objective.tokenize({"sentence": sentences}, tokenizer, max_length)
    rows = rows_of(features)
    for row in rows:
        assert len(row["input_ids"]) <= max_length
        assert len(row["pair_input_ids"]) <= 2 * max_length
        first = row["pair_input_ids"][1 : row["pair_input_ids"].index(tokenizer.sep_token_id)]
        second = second_content(row["pair_input_ids"], row["pair_second_segment"])
        # Both halves hold exactly the tokens of x_i's own truncation, also when x_i was cut.
        assert first == second == row["input_ids"][1:-1]

    torch.manual_seed(0)
    negatives = objective.compose_negatives([dict(r) for r in rows], tokenizer)
    contents = [tuple(second_content(r["pair_input_ids"], r["pair_second_segment"])) for r in rows]
    for row, negative, own in zip(rows, negatives, contents):
        start, _ = second_segment_span(row["pair_second_segment"])
        assert negative["input_ids"][:start] == row["pair_input_ids"][:start]  # x_i and the special tokens
        other = tuple(second_content(negative["input_ids"], negative["second_segment"]))
        assert other != own and other in contents
        assert len(negative["input_ids"]) <= 2 * max_length

    batch = objective.collate(rows, tokenizer)
    lengths = {batch[f"{p}input_ids"].shape for p in ("", "pair_", "negative_")}
    assert len(lengths) == 1 and batch["input_ids"].shape[0] == len(sentences)
    assert not any("second_segment" in key for key in batch)
    # A batch of one has no other sentence: c_i falls back to subword replacement of the sentence itself.
    lone = objective.compose_negatives([dict(rows[0])], tokenizer)[0]
    assert len(lone["input_ids"]) == len(rows[0]["pair_input_ids"])


def test_collate_strategy_o1_with_token_types(tiny_model):
    tokenizer = build_tokenizer(ENGLISH)
    tokenizer.model_input_names = ["input_ids", "token_type_ids", "attention_mask"]
    objective = ConIsIObjective(tiny_model, ConIsISettings(conisi_strategy="o1", conisi_subword_share=0.5))
    rows = rows_of(objective.tokenize({"sentence": ENGLISH[:4]}, tokenizer, 8))
    torch.manual_seed(0)
    negatives = objective.compose_negatives([dict(r) for r in rows], tokenizer)
    for row, negative in zip(rows, negatives):
        assert negative["token_type_ids"] == row["pair_token_type_ids"]
        changed = [p for p, (a, b) in enumerate(zip(row["pair_input_ids"], negative["input_ids"])) if a != b]
        assert all(row["pair_second_segment"][p] for p in changed)
    batch = objective.collate(rows, tokenizer)
    assert batch["negative_token_type_ids"].shape == batch["token_type_ids"].shape


def test_forward_encodes_the_three_inputs_in_one_call(tiny_model):
    objective = ConIsIObjective(tiny_model, ConIsISettings())
    tokenizer = tiny_model.tokenizer
    batch = objective.collate(rows_of(objective.tokenize({"sentence": ENGLISH[:4]}, tokenizer, 8)), tokenizer)
    calls = []

    def counting_model(**inputs):
        calls.append(inputs["input_ids"].shape)
        return tiny_model(**inputs)

    def gather(local):  # two rows of "another process" before ours
        return torch.cat([torch.randn(2, local.shape[1]), local]), 2

    tiny_model.train()
    objective.train()
    output = objective(counting_model, batch, gather)
    assert calls == [(12, batch["input_ids"].shape[1])]
    assert torch.isfinite(output.loss) and set(output.components) == {"loss_contrastive", "loss_interactive"}
    output.loss.backward()
    assert objective.head.dense.weight.grad.abs().sum() > 0 and objective.head.classifier.weight.grad is not None
    tiny_model.zero_grad()
    objective.zero_grad()


# ------------------------------------------------------------------------------------------------ WordNet (o2)


@needs_wordnet
def test_wordnet_antonyms_from_the_installed_files():
    lexicon = load_antonym_lexicon(DEFAULT_WORDNET_PATH)
    assert lexicon.antonym("good") == "bad"
    assert lexicon.antonym("hot") == "cold"
    assert lexicon.antonym("cold") == "hot"
    assert lexicon.antonym("Happy") == "unhappy"
    assert lexicon.antonym("hotter") == "cold"  # adj.exc: hotter → hot
    assert lexicon.antonym("guitar") is None


@needs_wordnet
def test_word_replacement_by_antonyms():
    lexicon = load_antonym_lexicon(DEFAULT_WORDNET_PATH)
    replaced = replace_with_antonyms("The weather is cold and rainy today.", lexicon, 0.15, random.Random(0))
    assert (replaced.text, replaced.replaced) == ("The weather is hot and rainy today.", 1)
    assert replace_with_antonyms("Good.", lexicon, 0.15, random.Random(0)).text == "Bad."
    none = replace_with_antonyms("The the, 42.", lexicon, 0.15, random.Random(0))
    assert (none.text, none.replaced) == ("The the, 42.", 0)


@needs_wordnet
@pytest.mark.parametrize("fallback", ["subword", "other_sentence"])
def test_strategy_o2_and_its_fallback(tiny_model, fallback):
    tokenizer = tiny_model.tokenizer
    objective = ConIsIObjective(tiny_model, ConIsISettings(conisi_strategy="o2", conisi_antonym_fallback=fallback))
    sentences = ["The weather is cold and rainy today.", "The the the.", "A man is playing a guitar."]
    features = objective.tokenize({"sentence": sentences}, tokenizer, 16)
    assert features["antonym_count"][0] == 1 and features["antonym_count"][1] == 0
    rows = rows_of(features)
    # Pair limit: BERT's 3 special tokens + twice the 16 - 2 tokens of a truncated sentence.
    expected = tokenizer(sentences[0], "The weather is hot and rainy today.", truncation=True, max_length=31)
    assert rows[0]["negative_input_ids"] == expected["input_ids"]
    torch.manual_seed(0)
    negatives = objective.compose_negatives([dict(r) for r in rows], tokenizer)
    assert negatives[0]["input_ids"] == rows[0]["negative_input_ids"]
    own = second_content(rows[1]["pair_input_ids"], rows[1]["pair_second_segment"])
    made = second_content(negatives[1]["input_ids"], negatives[1]["second_segment"])
    if fallback == "subword":
        assert len(made) == len(own)
    else:
        others = [second_content(r["pair_input_ids"], r["pair_second_segment"]) for r in (rows[0], rows[2])]
        assert made in others


def test_missing_wordnet_folder_names_the_package(tiny_model, tmp_path):
    settings = ConIsISettings(conisi_strategy="o2", conisi_wordnet_path=str(tmp_path / "no-wordnet"))
    with pytest.raises(WordNetNotFoundError, match="wordnet-base") as error:
        ConIsIObjective(tiny_model, settings)
    assert "apt-get install wordnet-base" in str(error.value) and "--conisi_wordnet_path" in str(error.value)
    with pytest.raises(FileNotFoundError, match="apt-get install wordnet-base"):
        AntonymLexicon.from_folder(str(tmp_path))


# ------------------------------------------------------------------------------------------------ settings


@pytest.mark.parametrize(
    "name, value",
    [
        ("conisi_strategy", "o3"),
        ("conisi_lambda", 1.5),
        ("conisi_lambda", -0.1),
        ("conisi_subword_share", 0.0),
        ("conisi_random_token_rate", 1.2),
        ("conisi_antonym_share", 0.0),
        ("conisi_antonym_fallback", "skip"),
        ("conisi_wordnet_path", ""),
        ("conisi_batchnorm", "sync"),
    ],
)
def test_impossible_settings_are_refused(name, value):
    with pytest.raises(ValueError, match=f"--{name}"):
        ConIsISettings(**{name: value})


def test_too_short_pairs_are_refused(tiny_model):
    objective = ConIsIObjective(tiny_model, ConIsISettings())
    with pytest.raises(ValueError, match="--max_seq_length 1"):
        objective.tokenize({"sentence": ["A man."]}, tiny_model.tokenizer, 1)


# ------------------------------------------------------------------------------------------------ end to end


def test_run_ifcl_with_conisi(tiny_encoder_dir, english_sts_data, tmp_path):
    import run_ifcl

    output = tmp_path / "out"
    extra = (
        "--conisi_strategy s --max_seq_length 16 --pooler_type cls_before_pooler --eval_pooler_type cls_before_pooler"
    )
    trainer, _ = run_ifcl.main(
        objective_run_args(tiny_encoder_dir, english_sts_data, output, "conisi", *extra.split())
    )

    results = json.loads((output / "all_results.json").read_text())
    assert math.isfinite(results["eval_stsb_spearman"])
    logged = [entry for entry in trainer.state.log_history if "loss_interactive" in entry]
    assert logged and all(
        math.isfinite(e["loss_contrastive"]) and math.isfinite(e["loss_interactive"]) for e in logged
    )
    config = json.loads((output / "config.json").read_text())["ifcl"]
    assert config["objective"] == "conisi" and config["objective_settings"]["conisi_lambda"] == 0.8
    assert not any(key.startswith("training_objective.") for key in saved_weight_names(output))
