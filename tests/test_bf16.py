"""Mixed precision as a GPU user turns it on, here with ``--bf16 --use_cpu``: every objective trains through
``run_ifcl.py`` with finite losses, its loss terms and queues in float32, and saves float32 weights."""

from __future__ import annotations

import math

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
