"""The model card (README.md) that every trained IFCL model carries: results, settings, how to load, citation."""

from __future__ import annotations

import os
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

SETTINGS = (
    "fusion_rate",
    "freeze_word_embeddings",
    "freeze_fraternal_embeddings",
    "queue_size",
    "queue_batch_size",
    "forgetting_rate",
    "contrastive_temperature",
    "fraternal_loss_weight",
    "twins_loss_weight",
    "pooler_type",
    "eval_pooler_type",
    "max_seq_length",
    "fraternal_model_name_or_path",
)
# The settings every objective shares (the IFCL-only ones above are shown for IFCL alone).
SHARED_SETTINGS = ("contrastive_temperature", "pooler_type", "eval_pooler_type", "max_seq_length")
TRAINING_SETTINGS = ("learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps", "seed")


def looks_like_hub_id(name: str | None) -> bool:
    """True for ``owner/name`` ids, False for local paths (which the Hub metadata must not name)."""
    return bool(name) and not os.path.exists(name) and name.count("/") == 1 and not name.startswith((".", "/"))


def results_table(results: dict[str, Any], tasks: list[str]) -> str:
    """Markdown table of STS Spearman × 100 before and after training, per split and task."""
    rows = ["| STS set | split | before training | after training |", "|---|---|---|---|"]
    for task in tasks:
        for split, label in (("eval", "dev"), ("test", "test")):
            after = results.get(f"{split}_{task}_spearman")
            before = results.get(f"init_{split}_{task}_spearman")
            if after is None and before is None:
                continue
            fmt = lambda v: "–" if v is None else f"{v:.2f}"  # noqa: E731
            rows.append(f"| {task} | {label} | {fmt(before)} | {fmt(after)} |")
    return "\n".join(rows)


def write_model_card(
    output_dir: str,
    config,
    results: dict[str, Any],
    training_args=None,
    model_name: str = "ifcl-model",
    base_model: str | None = None,
    dataset: str | list[str] | None = None,
    **_: Any,
) -> str:
    """Write ``output_dir/README.md`` and return its path."""
    base_model = base_model or getattr(config, "encoder_name_or_path", None)
    tasks = sorted(
        {
            key[len("eval_") : -len("_spearman")]
            for key in results
            if key.startswith("eval_") and key.endswith("_spearman")
        }
        | {
            key[len("test_") : -len("_spearman")]
            for key in results
            if key.startswith("test_") and key.endswith("_spearman")
        }
    )
    eval_results = [
        EvalResult(
            task_type="sentence-similarity",
            task_name="Semantic Textual Similarity",
            dataset_type="sentence-transformers/stsb" if task == "stsb" else task,
            dataset_name="STS Benchmark" if task == "stsb" else task,
            dataset_split="validation" if split == "eval" else "test",
            metric_type="spearman_cosine",
            metric_name="Spearman (cosine) × 100",
            metric_value=round(float(results[f"{split}_{task}_spearman"]), 2),
        )
        for task in tasks
        for split in ("eval", "test")
        if f"{split}_{task}_spearman" in results
    ]
    datasets = [dataset] if isinstance(dataset, str) else dataset
    objective_name = getattr(config, "objective", "ifcl")
    card_data = ModelCardData(
        model_name=model_name,
        library_name="transformers",
        pipeline_tag="sentence-similarity",
        tags=sorted({"ifcl", objective_name})
        + ["sentence-transformers", "sentence-embeddings", "sentence-similarity", "feature-extraction"],
        base_model=base_model if looks_like_hub_id(base_model) else None,
        datasets=[d for d in (datasets or []) if looks_like_hub_id(d)] or None,
        eval_results=eval_results or None,
    )
    shown = [("objective", objective_name)]
    shown += [
        (name, getattr(config, name, None)) for name in (SETTINGS if objective_name == "ifcl" else SHARED_SETTINGS)
    ]
    shown += sorted((getattr(config, "objective_settings", None) or {}).items())
    settings = "\n".join(f"| `{name}` | `{value}` |" for name, value in shown)
    if training_args is not None:
        settings += "\n" + "\n".join(
            f"| `{name}` | `{getattr(training_args, name, None)}` |" for name in TRAINING_SETTINGS
        )
        if results.get("train_steps") is None and getattr(training_args, "max_steps", -1) > 0:
            settings += f"\n| `max_steps` | `{training_args.max_steps}` |"
    from ifcl_objectives import objective_class

    paper = objective_class(objective_name).paper
    objective, method, citation = paper.title, paper.description, paper.citation
    if objective_name == "ifcl" and not config.uses_fraternal_twins and config.queue_size == 0:
        objective = "SimCSE (IFCL without fraternal twins, Twins loss and queue)"
    repo = model_name if "/" in model_name else f"<user>/{model_name}"
    sentence_transformers_usage = ""
    if os.path.isfile(os.path.join(output_dir, "modules.json")):
        sentence_transformers_usage = f"""
With [sentence-transformers](https://www.sbert.net) (no remote code: the folder also holds the plain encoder in
`0_Transformer/` and the pooler), the embeddings are the same:

```python
from sentence_transformers import SentenceTransformer

model = SentenceTransformer("{repo}")
embeddings = model.encode(["A man is playing a guitar.", "Someone plays the guitar."])
```
"""
    body = f"""
# {model_name}

A sentence encoder trained with **{objective}**: {method}, from `{base_model}`. Sentences are embedded with the
`{config.eval_pooler_type}` pooler; similarity is the cosine of two embeddings.

## Results

Spearman's rank correlation × 100 between the cosine of the two sentence embeddings and the gold score.

{results_table(results, tasks) if tasks else "No STS evaluation was run."}

## Settings

| setting | value |
|---|---|
{settings}

## How to load

```python
from transformers import AutoModel

model = AutoModel.from_pretrained("{repo}", trust_remote_code=True)
embeddings = model.encode(["A man is playing a guitar.", "Someone plays the guitar."])
similarity = embeddings[0] @ embeddings[1] / (embeddings[0].norm() * embeddings[1].norm())
```

`encode` returns one float32 row per sentence; the tokenizer is loaded from the same folder (the fraternal
language's tokenizer, when there is one, lies in `fraternal_tokenizer/`).
{sentence_transformers_usage}
## Citation

```bibtex
{citation}
```
"""
    card = ModelCard(f"---\n{card_data.to_yaml()}\n---\n{body}")
    path = os.path.join(output_dir, "README.md")
    os.makedirs(output_dir, exist_ok=True)
    card.save(path)
    return path
