"""What training does to a base's tokenizer: checks it against the word table, gives it a pad token and, for the
``last`` pooler, an end-of-sequence token at the end of every sentence (in its post-processor, so that a saved folder
reads alike), and saves it without a multimodal processor class."""

from __future__ import annotations

import json
import os

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerBase


def check_vocabulary(tokenizer: PreTrainedTokenizerBase, rows: int | None, name_or_path: str) -> None:
    """``ValueError`` in one line for a tokenizer with more ids than the word table's ``rows`` (its config's
    ``vocab_size``; None: unknown, unchecked): a token past the last row could not be embedded."""
    if rows is not None and len(tokenizer) > rows:
        raise ValueError(
            f"{name_or_path}: its tokenizer has {len(tokenizer)} ids, more than the {rows} rows of its word table "
            f"(vocab_size), so a token with id {rows} or above could not be embedded: resize the table to the "
            "tokenizer (model.resize_token_embeddings(len(tokenizer))) and save both, or give the tokenizer the "
            "model was trained with."
        )


def fit_tokenizer(tokenizer: PreTrainedTokenizerBase, end_with_eos: bool) -> list[str]:
    """Make ``tokenizer`` ready to embed with, in place, and say what changed (for the log): a pad token where it has
    none (Llama's and Mistral's): its end-of-sequence token; and, with ``end_with_eos`` (the ``last`` pooler, whose
    embedding is the last token's state), that token once at the end of every sentence where the tokenizer adds none
    (most decoders'; one without such a token that closes each sentence with another special token, BERT's [SEP],
    is left as it is: the last pooler reads that), in its post-processor, so that training, ``encode`` and a saved folder's tokenizer
    (sentence-transformers' view included) all read ``[BOS] tokens EOS``. ``ValueError`` naming the tokenizer when
    neither can be done."""
    changes = []
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"{tokenizer.name_or_path}: its tokenizer has no pad token and no end-of-sequence token to pad with; "
                "set one (tokenizer.pad_token = ...) and save it with the model."
            )
        tokenizer.pad_token = tokenizer.eos_token
        changes.append(f"its tokenizer has no pad token: it pads with its end-of-sequence token {tokenizer.eos_token}")
    probe = "A man plays."
    before = tokenizer(probe)["input_ids"]
    eos_id = tokenizer.eos_token_id
    closing = before[-1:] == [eos_id] or (eos_id is None and before[-1:] in ([i] for i in tokenizer.all_special_ids))
    if not end_with_eos or closing:
        return (
            changes  # it ends every sentence with its end-of-sequence token, or, having none, another (BERT's [SEP])
        )
    if eos_id is None or not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            f"{tokenizer.name_or_path}: the last pooler embeds with each sentence's last token, and its tokenizer "
            "ends a sentence with no end-of-sequence token nor has a fast tokenizer's post-processor to add one; "
            "give a fast tokenizer with an eos_token, or another pooler."
        )
    backend = tokenizer.backend_tokenizer
    backend.post_processor = post_processor_ending_with(backend, tokenizer.eos_token, eos_id)
    after = tokenizer(probe)["input_ids"]
    if after != before + [eos_id]:  # checked token by token
        raise ValueError(
            f"{tokenizer.name_or_path}: appending {tokenizer.eos_token} to its post-processor read {probe!r} as "
            f"{tokenizer.convert_ids_to_tokens(after)}, not as before plus one {tokenizer.eos_token}."
        )
    changes.append(f"its tokenizer ends each sentence with {tokenizer.eos_token}, which the last pooler reads")
    return changes


def post_processor_ending_with(backend, eos: str, eos_id: int):
    """``backend``'s post-processor (a ``tokenizers.Tokenizer``'s) with ``eos`` once at the end of each sequence:
    its template extended (one template: a second one after it would read each piece of the first as a sentence of
    its own), BERT's and RoBERTa's written as the templates they are, a byte-level one or none followed by a template
    that adds ``eos``; ``ValueError`` for any other."""
    state = json.loads(backend.to_str())
    steps = state["post_processor"]
    steps = [] if steps is None else steps["processors"] if steps["type"] == "Sequence" else [steps]
    templates = [
        i
        for i, step in enumerate(steps)
        if step["type"] in ("TemplateProcessing", "BertProcessing", "RobertaProcessing")
    ]
    others = {step["type"] for i, step in enumerate(steps) if i not in templates} - {"ByteLevel"}
    if others or len(templates) > 1:
        raise ValueError(
            f"a post-processor of {', '.join(step['type'] for step in steps)} cannot be made to end each sentence "
            f"with {eos}: give a tokenizer that ends sentences with it, or another pooler."
        )
    template = as_template(steps[templates[0]]) if templates else as_template(None)
    single, pair = template["single"], template["pair"]
    eos_of = lambda type_id: {"SpecialToken": {"id": eos, "type_id": type_id}}  # noqa: E731
    type_a = next(item["Sequence"]["type_id"] for item in pair if "Sequence" in item)
    b_index = next(i for i, item in enumerate(pair) if item.get("Sequence", {}).get("id") == "B")
    type_b = pair[b_index]["Sequence"]["type_id"]
    end_of_a = b_index  # before the special tokens that open the second sequence
    while end_of_a > 0 and type_b != type_a and pair[end_of_a - 1].get("SpecialToken", {}).get("type_id") == type_b:
        end_of_a -= 1
    template["single"] = [*single, eos_of(type_a)]
    template["pair"] = [*pair[:end_of_a], eos_of(type_a), *pair[end_of_a:], eos_of(type_b)]
    template["special_tokens"] = {**template["special_tokens"], eos: {"id": eos, "ids": [eos_id], "tokens": [eos]}}
    if templates:
        steps[templates[0]] = template
    else:
        steps.append(template)
    state["post_processor"] = steps[0] if len(steps) == 1 else {"type": "Sequence", "processors": steps}
    return Tokenizer.from_str(json.dumps(state)).post_processor


def as_template(step: dict | None) -> dict:
    """A post-processor's state (``tokenizers``' JSON) as the ``TemplateProcessing`` it amounts to: a template's
    own, BERT's ``[CLS] $A [SEP]`` and RoBERTa's ``<s> $A </s>`` written out, none as ``$A``."""

    def special(token: str, type_id: int = 0) -> dict:
        return {"SpecialToken": {"id": token, "type_id": type_id}}

    def sequence(name: str, type_id: int = 0) -> dict:
        return {"Sequence": {"id": name, "type_id": type_id}}

    if step is None:
        return {
            "type": "TemplateProcessing",
            "single": [sequence("A")],
            "pair": [sequence("A"), sequence("B", 1)],
            "special_tokens": {},
        }
    if step["type"] == "TemplateProcessing":
        return dict(step)
    (cls, cls_id), (sep, sep_id) = step["cls"], step["sep"]
    specials = {
        token: {"id": token, "ids": [token_id], "tokens": [token]}
        for token, token_id in ((cls, cls_id), (sep, sep_id))
    }
    single = [special(cls), sequence("A"), special(sep)]
    if step["type"] == "BertProcessing":
        pair = [*single, sequence("B", 1), special(sep, 1)]
    else:  # RobertaProcessing: <s> A </s></s> B </s>
        pair = [*single, special(sep), sequence("B"), special(sep)]
    return {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials}


def without_processor_class(path: str) -> None:
    """A saved tokenizer config without the multimodal processor its base named (Gemma 3's ships
    ``processor_class: Gemma3Processor``), which would make sentence-transformers and ``AutoProcessor`` look for an
    image processor this text-only model has not: its tokenizer is all it reads."""
    if not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as handle:
        settings = json.load(handle)
    if settings.pop("processor_class", None) is not None:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(settings, handle, indent=2, ensure_ascii=False)
            handle.write("\n")
