"""LoRA through peft (``ifcl.lora``, ``--lora_r``), gradient checkpointing with frozen word tables, and bf16 on a
decoder: only the adapters train, checkpoints hold them and resume exactly, the published folder holds merged weights
that load without peft, and ``run_ifcl.py`` does it all from the command line."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import (
    ENGLISH,
    GERMAN,
    LAST,
    ROOT,
    build_tiny_decoder,
    cpu_training_args,
    launch,
    losses_by_step,
    run_script,
    saved_weight_names,
    write_sts_file,
)
from datasets import Dataset
from safetensors import safe_open
from torch import nn
from transformers import TrainingArguments

from ifcl.checkpoints import CheckpointError, check_resume_lora
from ifcl.lora import add_lora, merged_adapters
from ifcl.model import IFCLModel
from trainer_ifcl import IFCLTrainer

# transformers 5.23 renamed gradient_checkpointing (the old name warns that it goes in v6): the installed one's name.
CHECKPOINTING = next(
    name
    for name in ("activation_checkpointing", "gradient_checkpointing")
    if name in {field.name for field in dataclasses.fields(TrainingArguments)}
)
PAIRS = {"sentence": ENGLISH[:8], "fraternal": GERMAN[:8]}


def test_lora_defaults_follow_the_family_and_only_the_adapters_train(tmp_path, tiny_encoder_dir):
    decoder = IFCLModel.from_encoder(str(build_tiny_decoder("qwen3", tmp_path / "qwen3")), **LAST)
    config = add_lora(decoder, r=4)
    assert config.target_modules == {"q_proj", "v_proj"} and config.lora_alpha == 8 and config.lora_dropout == 0.05
    trained = {name for name, p in decoder.named_parameters() if p.requires_grad}
    assert trained and all(".lora_A." in name or ".lora_B." in name for name in trained)
    bert = IFCLModel.from_encoder(str(tiny_encoder_dir), freeze_word_embeddings=False)
    assert add_lora(bert, r=2, alpha=4).target_modules == {"query", "value"}
    IFCLTrainer(model=bert, args=cpu_training_args(tmp_path / "run"), train_dataset=Dataset.from_dict(PAIRS))
    assert bert.get_input_embeddings().weight.requires_grad  # the config's setting, not peft's freezing


def test_merged_weights_embed_like_the_adapters_and_leave_them_unchanged(tmp_path):
    model = IFCLModel.from_encoder(str(build_tiny_decoder("llama", tmp_path / "llama")), **LAST).eval()
    base = model.encode(ENGLISH)
    add_lora(model, r=4)
    torch.manual_seed(0)
    for name, parameter in model.named_parameters():
        if ".lora_B." in name:  # peft starts B at 0: give the adapters an effect
            nn.init.normal_(parameter, std=0.2)
    adapted = model.encode(ENGLISH)
    state = {name: value.clone() for name, value in model.state_dict().items()}
    with merged_adapters(model):
        assert not [name for name in model.state_dict() if "lora_" in name or "base_layer" in name]
        merged = model.encode(ENGLISH)
    assert (adapted - base).abs().max() > 1e-3 and (merged - adapted).abs().max() <= 1e-5
    assert (model.encode(ENGLISH) - adapted).abs().max() == 0
    assert all(torch.equal(value, state[name]) for name, value in model.state_dict().items())


def lora_trainer(
    decoder: Path,
    output: str,
    lora: bool = True,
    objective: str = "ifcl",
    pcl_untied_peer: bool = False,
    dtype: str = "float32",
    **settings,
) -> IFCLTrainer:
    torch.manual_seed(0)
    peer = {"objective_settings": {"pcl_untied_peer": True}} if pcl_untied_peer else {}
    if objective == "micse":
        peer = {"objective_settings": {"micse_attention_layers": "top2"}}  # the tiny decoder has 2 layers
    model = IFCLModel.from_encoder(str(decoder), queue_size=2, objective=objective, dtype=dtype, **peer, **LAST)
    if lora:
        add_lora(model, r=4)
    defaults = {"per_device_train_batch_size": 4, "max_steps": 4, "learning_rate": 1e-2, "logging_steps": 1}
    args = cpu_training_args(output, **{**defaults, "seed": 0, **settings})
    return IFCLTrainer(model=model, args=args, train_dataset=Dataset.from_dict(PAIRS))


def test_a_lora_run_resumes_exactly_from_a_checkpoint_that_holds_its_adapters(tmp_path):
    decoder = build_tiny_decoder("qwen2", tmp_path / "qwen2")
    saving = {"save_strategy": "steps", "save_steps": 2}
    whole = lora_trainer(decoder, str(tmp_path / "a"), **saving)
    whole.train()
    checkpoint = tmp_path / "a" / "checkpoint-2"
    assert not (checkpoint / "adapter_config.json").exists()  # else transformers would load it as an adapter
    with open(checkpoint / "adapter" / "adapter_config.json") as handle:
        assert json.load(handle)["r"] == 4
    with safe_open(str(checkpoint / "adapter" / "adapter_model.safetensors"), "pt") as adapters:
        names = list(adapters.keys())
    assert names and all(".lora_A." in name or ".lora_B." in name for name in names)
    resumed = lora_trainer(decoder, str(tmp_path / "b"), **saving)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    expected, got = losses_by_step(whole), losses_by_step(resumed)
    for step in (3, 4):
        assert got[step] == pytest.approx(expected[step], abs=1e-6), step
    final = dict(whole.model.named_parameters())
    for name, value in resumed.model.named_parameters():
        torch.testing.assert_close(value, final[name], atol=1e-6, rtol=0, msg=name)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_gradient_checkpointing_with_frozen_tables_trains_as_without_it(tmp_path, lora):
    """The usual pitfall: with frozen word tables (and the encoder frozen under LoRA) nothing entering the first
    checkpointed layer needs a gradient. One SGD step with ``gradient_checkpointing`` moves the same weights, the
    first layer's included, as without it (dropout replayed by the checkpoint)."""
    decoder = build_tiny_decoder("mistral", tmp_path / "mistral")
    weights = {}
    for checkpointing in (False, True):
        trainer = lora_trainer(
            decoder,
            str(tmp_path / str(checkpointing)),
            lora,
            max_steps=1,
            optim="sgd",
            **{CHECKPOINTING: checkpointing},
        )
        before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
        trainer.train()
        weights[checkpointing] = dict(trainer.model.named_parameters())
        moved = [name for name, p in weights[checkpointing].items() if not torch.equal(p, before[name])]
        assert any("layers.0." in name for name in moved), moved
        assert not any("embed_tokens" in name for name in moved)
    for name, value in weights[True].items():
        torch.testing.assert_close(value, weights[False][name], atol=1e-6, rtol=0, msg=name)


def test_bf16_lora_on_a_decoder_kept_in_bf16_keeps_float32_losses_and_queue_and_saves_bf16(tmp_path):
    """A decoder saved in bfloat16, kept so (``dtype="auto"``: by default it would train float32 weights), with LoRA
    under bf16 autocast: the adapters, losses and queue are float32, the published weights bfloat16."""
    from transformers import AutoModel

    folder = build_tiny_decoder("gemma3", tmp_path / "gemma3")
    AutoModel.from_pretrained(folder).to(torch.bfloat16).save_pretrained(folder)
    trainer = lora_trainer(folder, str(tmp_path / "run"), max_steps=2, bf16=True, dtype="auto")
    model = trainer.model
    assert model.encoder.dtype == torch.bfloat16
    trained = [p for p in model.parameters() if p.requires_grad]
    assert trained and all(p.dtype == torch.float32 for p in trained)  # peft keeps adapters in float32
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    with trainer.autocast_smart_context_manager():
        loss = trainer.compute_loss(model, batch)
    assert loss.dtype == torch.float32
    trainer.train()
    assert model.queue.embeddings.dtype == torch.float32 and model.queue.valid.any()
    trainer.save_model()
    with safe_open(str(tmp_path / "run" / "model.safetensors"), "pt") as saved:
        dtypes = {saved.get_slice(name).get_dtype() for name in saved.keys()}
    assert dtypes == {"BF16"}


LOADS_WITHOUT_PEFT = """
import sys
sys.modules["peft"] = None  # import peft fails, as without it installed
import torch
from sentence_transformers import SentenceTransformer
from transformers import AutoModel
folder, sentences = sys.argv[1], ["A man plays a guitar.", "Ein Hund rennt."]
remote = AutoModel.from_pretrained(folder, trust_remote_code=True).encode(sentences)
view = SentenceTransformer(folder, device="cpu").encode(sentences, convert_to_tensor=True)
torch.save({"remote": remote, "view": view}, sys.argv[2])
"""


@pytest.mark.slow
def test_run_ifcl_trains_a_decoder_with_lora_checkpointing_and_bf16(tmp_path):
    """The issue's command on a tiny Qwen3: it exits 0, fewer than 10% of the parameters train, checkpoints hold
    the adapters, the published folder holds none and loads without peft, embedding as the trained model does."""
    decoder = build_tiny_decoder("qwen3", tmp_path / "qwen3")
    (tmp_path / "train.txt").write_text("\n".join(f"{en}\t{de}" for en, de in zip(ENGLISH, GERMAN)) + "\n")
    write_sts_file(tmp_path / "sts.tsv")
    output = tmp_path / "run"
    flags = [
        *("--model_name_or_path", str(decoder), "--train_file", str(tmp_path / "train.txt")),
        *("--validation_file", str(tmp_path / "sts.tsv"), "--test_file", str(tmp_path / "sts.tsv")),
        *("--output_dir", str(output), "--max_steps", "4", "--per_device_train_batch_size", "4"),
        *("--eval_steps", "2", "--save_steps", "2", "--max_seq_length", "16", "--learning_rate", "1e-3"),
        *("--pooler_type", "last", "--eval_pooler_type", "last", "--lora_r", "8"),
        *("--gradient_checkpointing", "--bf16", "--use_cpu"),
    ]
    done = run_script("run_ifcl.py", *flags, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    log = done.stdout + done.stderr
    trained, total, share = re.search(r"trainable: ([\d,]+) of ([\d,]+) parameters \(([\d.]+)%\)", log).groups()
    assert 0 < float(share) < 10 and int(trained.replace(",", "")) < int(total.replace(",", ""))
    assert "LoRA r=8, alpha=16" in log
    checkpoint = next(output.glob("checkpoint-*"))
    adapter = checkpoint / "adapter"
    assert (adapter / "adapter_config.json").is_file() and (adapter / "adapter_model.safetensors").is_file()
    assert not list(output.glob("adapter*"))

    script = tmp_path / "load.py"
    script.write_text(LOADS_WITHOUT_PEFT)
    embedded = tmp_path / "embedded.pt"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    loaded = subprocess.run(
        [sys.executable, str(script), str(output), str(embedded)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    embeddings = torch.load(embedded)
    torch.testing.assert_close(embeddings["view"], embeddings["remote"], atol=1e-5, rtol=0)
    sys.path.insert(0, str(ROOT))
    trained_model = IFCLModel.from_pretrained(str(output))
    expected = trained_model.encode(["A man plays a guitar.", "Ein Hund rennt."])
    torch.testing.assert_close(embeddings["remote"], expected, atol=1e-5, rtol=0)

    # A resume is checked against the adapters the checkpoint's config records before any model loads.
    with open(checkpoint / "config.json") as handle:
        saved = json.load(handle)["ifcl"]["lora"]
    assert saved == {
        "r": 8,
        "alpha": 16,
        "dropout": 0.05,
        "target_modules": ["q_proj", "v_proj"],
        "use_rslora": False,
        "fan_in_fan_out": False,
    }
    lora = {"r": 8, "alpha": None, "dropout": 0.05, "target_modules": None}
    check_resume_lora(str(checkpoint), saved, lora)
    with pytest.raises(CheckpointError, match="--lora_r: 8 in the checkpoint, 4 now"):
        check_resume_lora(str(checkpoint), saved, {**lora, "r": 4})
    with pytest.raises(CheckpointError, match=r"trained with LoRA \(--lora_r 8\), unlike this command"):
        check_resume_lora(str(checkpoint), saved, None)

    # The card says what trained and that the weights are merged.
    card = (output / "README.md").read_text(encoding="utf-8")
    assert "**LoRA:** adapters of rank 8 (alpha 16, dropout 0.05) in `q_proj`, `v_proj`" in card
    assert f"{trained} of {total} parameters trained ({share}%)" in card and "adapters merged" in card

    # A checkpoint is the model of its step, merged, and training goes on from it: plain, or with new adapters.
    import run_ifcl

    continued = [*flags[: flags.index("--lora_r")], "--use_cpu", "--do_train", "--max_steps", "2"]
    for extra in ([], ["--lora_r", "4"]):
        out = tmp_path / f"continued{len(extra)}"
        trainer, _ = run_ifcl.main(
            [*continued, "--model_name_or_path", str(checkpoint), "--output_dir", str(out), *extra]
        )
        lora = IFCLModel.from_pretrained(str(out)).config.lora
        assert (lora or {}).get("r") == (4 if extra else None)
        assert not [name for name in saved_weight_names(out) if "lora_" in name or "base_layer" in name]


@pytest.mark.parametrize("objective", ["ifcl", "simcse"])
def test_a_lora_checkpoint_loads_as_the_model_of_its_step(objective, tmp_path):
    """``from_pretrained`` of a LoRA run's checkpoint with the package's class gives the model of that step with its
    adapters merged (no peft needed), equal to what publishing that step gives; without the merge it would load the
    base layers' untrained weights. The remote code, which holds only what a published folder runs, refuses such a
    checkpoint in one line naming the package's loader, rather than load it unmerged."""
    from transformers import AutoModel

    decoder = build_tiny_decoder("qwen3", tmp_path / "qwen3")
    trainer = lora_trainer(decoder, str(tmp_path / "run"), save_strategy="steps", save_steps=2, objective=objective)
    trainer.train()
    trainer.save_model(str(tmp_path / "published"))  # the model of step 4, merged
    published = IFCLModel.from_pretrained(str(tmp_path / "published")).encode(ENGLISH)
    checkpoint = str(tmp_path / "run" / "checkpoint-4")
    loaded = IFCLModel.from_pretrained(checkpoint)
    assert not [name for name, _ in loaded.named_parameters() if "lora_" in name]
    torch.testing.assert_close(loaded.encode(ENGLISH), published, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="checkpoint of a LoRA run.*IFCLModel.from_pretrained") as refused:
        AutoModel.from_pretrained(checkpoint, trust_remote_code=True)
    assert "\n" not in str(refused.value)
    loaded.save_pretrained(tmp_path / "saved_again")  # a loaded checkpoint saves under the model's own names
    assert not [
        name for name in saved_weight_names(tmp_path / "saved_again") if "lora_" in name or "base_layer" in name
    ]
    again = IFCLModel.from_pretrained(str(tmp_path / "saved_again")).encode(ENGLISH)
    torch.testing.assert_close(again, published, atol=1e-5, rtol=0)
    base_layers_only = IFCLModel.from_encoder(str(decoder), **LAST).encode(ENGLISH)
    assert (base_layers_only - published).abs().max() > 1e-3  # the adapters changed the model


def test_lora_trains_the_adapters_alone_whatever_the_objective(tmp_path):
    """The peers train both word tables without LoRA; with it, the adapters alone train, as with IFCL."""
    decoder = build_tiny_decoder("llama", tmp_path / "llama")
    for objective in ("simcse", "micse", "pcl"):
        model = lora_trainer(decoder, str(tmp_path / objective), objective=objective).model
        trained = [name for name, p in model.named_parameters() if p.requires_grad]
        assert trained and all(".lora_A." in name or ".lora_B." in name for name in trained), (objective, trained)


def test_pcls_untied_peer_is_refused_with_lora_in_one_line(tmp_path):
    decoder = build_tiny_decoder("qwen2", tmp_path / "qwen2")
    with pytest.raises(ValueError, match="--pcl_untied_peer with --lora_r: the untied peer"):
        lora_trainer(decoder, str(tmp_path / "run"), objective="pcl", pcl_untied_peer=True)


def test_after_bf16_training_the_process_embeds_as_its_published_folder(tmp_path):
    """accelerate wraps the model's forward in bf16 autocast for training; ``encode`` runs outside it, so the
    training process embeds as the saved folder does (it differed by about 1e-2 under autocast)."""
    from transformers import AutoModel

    decoder = build_tiny_decoder("llama", tmp_path / "llama")
    trainer = lora_trainer(decoder, str(tmp_path / "run"), lora=False, max_steps=2, bf16=True)
    trainer.train()
    model = trainer.model
    assert "_original_forward" in vars(model)  # accelerate's mixed-precision wrapper is on
    in_process = model.encode(ENGLISH)
    trainer.save_model()
    loaded = AutoModel.from_pretrained(str(tmp_path / "run"), trust_remote_code=True)
    torch.testing.assert_close(in_process, loaded.encode(ENGLISH), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--lora_alpha", "8"], "--lora_alpha given without --lora_r"),
        (["--lora_r", "-1"], "--lora_r (0: no LoRA) must be ≥ 0"),
        (["--lora_r", "4", "--lora_dropout", "1"], "--lora_dropout must be in [0, 1), got 1.0."),
    ],
)
def test_bad_lora_flags_are_one_line_before_any_model_loads(flags, message):
    import run_ifcl

    with pytest.raises(ValueError, match=re.escape(message)):
        run_ifcl.parse_arguments(["--output_dir", "unused", *flags])


def test_a_lora_target_that_is_no_layer_is_one_line_naming_the_flag(tiny_encoder_dir):
    from ifcl.lora import add_lora

    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0)
    with pytest.raises(
        ValueError, match=re.escape("--lora_target_modules embeddings (BertEmbeddings): LoRA adapts")
    ) as error:
        add_lora(model, r=4, target_modules=["embeddings"])
    assert "\n" not in str(error.value) and model.config.lora is None


def test_a_lora_checkpoint_without_its_lora_b_tensors_is_named_in_one_line(tmp_path, pairs_data):
    """A checkpoint file cut short or edited so that it lacks the adapters' lora_B tensors: from_pretrained names
    the folder and the tensor it lacks, before any weights load, and so does run_ifcl.py starting from it (bad
    input: before the output folder is taken)."""
    from conftest import objective_run_args
    from safetensors.torch import load_file, save_file

    import run_ifcl

    decoder = build_tiny_decoder("qwen3", tmp_path / "qwen3")
    lora_trainer(decoder, str(tmp_path / "run"), save_strategy="steps", save_steps=2, max_steps=2).train()
    checkpoint = tmp_path / "run" / "checkpoint-2"
    weights = load_file(checkpoint / "model.safetensors")
    save_file({k: v for k, v in weights.items() if ".lora_B." not in k}, checkpoint / "model.safetensors")
    with pytest.raises(
        ValueError, match=f"^{re.escape(str(checkpoint))}: its weights hold .*lora_A.* but not "
    ) as error:
        IFCLModel.from_pretrained(str(checkpoint))
    assert "lora_B" in str(error.value) and "incomplete" in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ValueError, match=f"^{re.escape(str(checkpoint))}: its weights hold .*lora_A.* but not "):
        run_ifcl.main(objective_run_args(checkpoint, pairs_data, tmp_path / "out", "ifcl"))
    assert not (tmp_path / "out").exists()


def test_lora_without_peft_says_how_to_install_it(monkeypatch):
    import run_ifcl

    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(ValueError, match=re.escape("pip install 'ifcl[peft]'")):
        run_ifcl.parse_arguments(["--output_dir", "unused", "--lora_r", "4"])


@pytest.mark.slow
def test_two_processes_train_a_lora_llama_and_go_on_from_its_checkpoint(tmp_path):
    """As users run it on several GPUs (here two gloo processes): a tiny Llama 3 (BOS template, no pad token) with
    LoRA trains, its checkpoint starts a second two-process run with new adapters, and both published folders read
    a sentence as ``<bos> tokens <eos>`` and hold merged weights."""
    from transformers import AutoTokenizer

    decoder = build_tiny_decoder("llama", tmp_path / "llama")
    base = AutoTokenizer.from_pretrained(decoder)
    expected = [*base(ENGLISH[0])["input_ids"], base.eos_token_id]
    (tmp_path / "train.txt").write_text("\n".join(f"{en}\t{de}" for en, de in zip(ENGLISH, GERMAN)) + "\n")
    write_sts_file(tmp_path / "sts.tsv")
    flags = [
        *("--train_file", str(tmp_path / "train.txt"), "--validation_file", str(tmp_path / "sts.tsv")),
        *("--test_file", str(tmp_path / "sts.tsv"), "--max_steps", "4", "--per_device_train_batch_size", "2"),
        *("--eval_steps", "2", "--save_steps", "2", "--max_seq_length", "16", "--learning_rate", "1e-3"),
        *("--pooler_type", "last", "--eval_pooler_type", "last", "--lora_r", "4"),
    ]
    first, second = tmp_path / "first", tmp_path / "second"
    for output in (first, second):
        start = decoder if output == first else max(first.glob("checkpoint-*"), key=lambda c: int(c.name[11:]))
        result = launch([*flags, "--model_name_or_path", str(start), "--output_dir", str(output)], processes=2)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
        assert AutoTokenizer.from_pretrained(output)(ENGLISH[0])["input_ids"] == expected
        assert not [name for name in saved_weight_names(output) if "lora_" in name or "base_layer" in name]
        assert IFCLModel.from_pretrained(str(output)).config.lora["r"] == 4
