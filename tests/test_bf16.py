"""Mixed precision as a GPU user turns it on, here with ``--bf16 --use_cpu``: every objective trains through
``run_ifcl.py`` with finite losses, its loss terms and queues in float32, and saves float32 weights."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import objective_run_args
from safetensors.torch import load_file

OBJECTIVES = ("ifcl", "simcse", "conisi", "pcl", "micse")


@pytest.mark.slow
@pytest.mark.parametrize("objective", OBJECTIVES)
def test_every_objective_trains_in_bf16(
    objective, tiny_encoder_dir, pairs_data, english_sts_data, tmp_path, monkeypatch
):
    import run_ifcl
    from ifcl.model import IFCLModel
    from trainer_ifcl import IFCLTrainer

    dtypes: list[torch.dtype] = []
    compute_loss = IFCLTrainer.compute_loss

    def recording(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, output = compute_loss(self, model, inputs, True, num_items_in_batch)
        dtypes.extend([loss.dtype, *(term.dtype for term in output.components.values())])
        assert all(bool(torch.isfinite(term)) for term in [loss, *output.components.values()])
        return (loss, output) if return_outputs else loss

    monkeypatch.setattr(IFCLTrainer, "compute_loss", recording)
    autocast: list[bool] = []  # whether the encoder runs under bf16 autocast
    encode_tokens = IFCLModel.encode_tokens

    def recording_states(self, *args, **kwargs):
        autocast.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16)
        return encode_tokens(self, *args, **kwargs)

    monkeypatch.setattr(IFCLModel, "encode_tokens", recording_states)
    data = pairs_data if objective == "ifcl" else english_sts_data
    extra = ("--queue_size", "2", "--forgetting_rate", "0.2") if objective == "ifcl" else ()
    if objective == "micse":
        extra = ("--micse_queue_size", "4", "--micse_attention_layers", "top2")
    output = tmp_path / objective
    args = objective_run_args(tiny_encoder_dir, data, output, objective, "--bf16", *extra, max_steps=3)
    trainer, metrics = run_ifcl.main(args)
    assert trainer.args.bf16 and math.isfinite(metrics["train_loss"])
    assert any(autocast)  # the encoder ran under bf16 autocast ...
    assert dtypes and set(dtypes) == {torch.float32}, dtypes  # ... and the loss and every term are float32
    queues = [trainer.model.queue, getattr(trainer.objective, "queue", None)]
    assert all(queue.embeddings.dtype == torch.float32 for queue in queues if queue is not None)
    assert objective not in ("ifcl", "micse") or any(queue is not None for queue in queues)
    weights = load_file(str(output / "model.safetensors"))
    assert {tensor.dtype for tensor in weights.values() if tensor.is_floating_point()} == {torch.float32}


def saved_in_bf16(encoder: Path, folder: Path) -> Path:
    """``encoder`` saved in bfloat16, as most decoders ship (its config.json's dtype says so)."""
    from transformers import AutoModel, AutoTokenizer

    AutoModel.from_pretrained(str(encoder), dtype=torch.bfloat16).save_pretrained(str(folder))
    AutoTokenizer.from_pretrained(str(encoder)).save_pretrained(str(folder))
    return folder


@pytest.mark.parametrize("family", ["bert", "qwen3"])
def test_a_base_saved_in_bf16_trains_float32_weights_unless_another_dtype_is_asked(
    family, tiny_encoder_dir, tmp_path, caplog
):
    """Loading follows the checkpoint's dtype since transformers 5, and decoders ship in bfloat16; a model to train
    is loaded in float32 (master weights) by default, ``dtype`` is honoured, and pure low precision is warned about
    with what it costs."""
    import logging

    from conftest import LAST, build_tiny_decoder

    from ifcl.model import IFCLModel

    encoder = tiny_encoder_dir if family == "bert" else build_tiny_decoder("qwen3", tmp_path / "qwen3")
    base = saved_in_bf16(encoder, tmp_path / "bf16")
    poolers = LAST if family == "qwen3" else {}
    with caplog.at_level(logging.INFO):
        model = IFCLModel.from_encoder(str(base), queue_size=0, **poolers)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert "training float32 weights (its checkpoint holds bfloat16)" in caplog.text
    assert IFCLModel.from_encoder(str(base), queue_size=0, dtype=torch.float16, **poolers).dtype == torch.float16
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        kept = IFCLModel.from_encoder(str(base), queue_size=0, dtype="auto", **poolers)
    assert kept.dtype == torch.bfloat16 and "training in pure bfloat16" in caplog.text
    with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16, float16, auto"):
        IFCLModel.from_encoder(str(base), dtype="int8")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "auto"])
def test_a_bf16_saved_base_trained_by_the_script_moves_its_weights_as_a_float32_one_and_says_its_precision(
    dtype, tiny_encoder_dir, english_sts_data, tmp_path
):
    """Two steps of ``run_ifcl.py`` at its default learning rate change the layer weights of a base saved in bfloat16
    as much as those of the same base in float32, and its card says it trained float32 weights; ``--dtype auto``
    (pure bfloat16, as before float32 was the default) rounds most updates away, and its card says so."""
    from safetensors.torch import load_file

    import run_ifcl

    def changed_share(base: Path, output: Path, *extra: str) -> float:
        run_ifcl.main(objective_run_args(base, english_sts_data, output, "simcse", *extra, max_steps=2))
        start = {k: v.float() for k, v in load_file(str(base / "model.safetensors")).items() if ".layer." in k}
        trained = {k.removeprefix("bert."): v.float() for k, v in load_file(str(output / "model.safetensors")).items()}
        changed = [(trained[k] != v).float().mean().item() for k, v in start.items()]
        return sum(changed) / len(changed)

    bf16 = changed_share(saved_in_bf16(tiny_encoder_dir, tmp_path / "bf16"), tmp_path / "from-bf16", "--dtype", dtype)
    float32 = changed_share(tiny_encoder_dir, tmp_path / "from-float32")
    card = (tmp_path / "from-bf16" / "README.md").read_text(encoding="utf-8")
    if dtype == "float32":
        assert bf16 > 0.9 and abs(bf16 - float32) < 0.05, (bf16, float32)
        assert "**Training precision:** float32 weights" in card
    else:
        assert bf16 < float32 - 0.3, (bf16, float32)
        assert "**Training precision:** pure bfloat16" in card
