"""Distributed training: the queue's gather makes one collective (two gloo processes on the CPU), and parameter
sharding (FSDP, DeepSpeed ZeRO-3) is refused before any model loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import ENGLISH, GERMAN, ROOT, free_port

from ifcl.checks import check_unsharded_parameters, deepspeed_zero_stage


@pytest.mark.slow
def test_gather_rows_makes_one_collective_and_gathers_what_three_did(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
    ]
    result = subprocess.run(
        [*command, str(ROOT / "tests" / "distributed_gather.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    ranks = [torch.load(tmp_path / f"gather_rank{rank}.pt") for rank in (0, 1)]
    for case in range(len(ranks[0])):
        expected = torch.cat([ranks[0][case]["rows"], ranks[1][case]["rows"]])  # rank order
        for rank in (0, 1):
            result_of = ranks[rank][case]
            assert torch.equal(result_of["old"], expected) and torch.equal(result_of["new"], expected), case
            assert len(result_of["old_calls"]) == 3, result_of["old_calls"]
            assert len(result_of["new_calls"]) == 1, result_of["new_calls"]


def test_gather_rows_refuses_more_rows_than_a_step_holds():
    from trainer_ifcl import gather_rows_in_one_collective

    with pytest.raises(ValueError, match="5 rows to gather, more than the 4"):
        gather_rows_in_one_collective(None, torch.zeros(5, 3), capacity=4)


def sharding_settings(fsdp=None, deepspeed=None) -> SimpleNamespace:
    return SimpleNamespace(fsdp=fsdp, deepspeed=deepspeed)


def test_sharded_parameters_are_refused_naming_the_setting(tmp_path):
    stage3, stage2 = tmp_path / "zero3.json", tmp_path / "zero2.json"
    stage3.write_text(json.dumps({"zero_optimization": {"stage": 3}}), encoding="utf-8")
    stage2.write_text(json.dumps({"zero_optimization": {"stage": 2}}), encoding="utf-8")
    assert deepspeed_zero_stage(str(stage3)) == 3 and deepspeed_zero_stage({"train_batch_size": 8}) is None
    with pytest.raises(ValueError, match="--fsdp .*FSDP and ZeRO-3.*DDP"):
        check_unsharded_parameters(sharding_settings(fsdp=["full_shard"]), environ={})
    with pytest.raises(ValueError, match="zero3.json sets ZeRO stage 3"):
        check_unsharded_parameters(sharding_settings(deepspeed=str(stage3)), environ={})
    with pytest.raises(ValueError, match="--deepspeed .* sets ZeRO stage 3"):
        check_unsharded_parameters(sharding_settings(deepspeed={"zero_optimization": {"stage": 3}}), environ={})
    with pytest.raises(ValueError, match="accelerate launch with FSDP"):
        check_unsharded_parameters(sharding_settings(), environ={"ACCELERATE_USE_FSDP": "true"})
    accelerate_zero3 = {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}
    with pytest.raises(ValueError, match="accelerate launch with DeepSpeed ZeRO stage 3"):
        check_unsharded_parameters(sharding_settings(), environ=accelerate_zero3)
    accelerate_file = {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_CONFIG_FILE": str(stage3)}
    with pytest.raises(ValueError, match="ZeRO stage 3"):
        check_unsharded_parameters(sharding_settings(), environ=accelerate_file)
    # DDP and ZeRO-2 keep every parameter whole.
    check_unsharded_parameters(sharding_settings(deepspeed=str(stage2)), environ={})
    check_unsharded_parameters(sharding_settings(), environ={"ACCELERATE_USE_DEEPSPEED": "true"})
    check_unsharded_parameters(sharding_settings(), environ={})


@pytest.mark.slow
def test_run_ifcl_refuses_fsdp_before_any_model_loads(tmp_path):
    (tmp_path / "train.txt").write_text("".join(f"{e}\t{d}\n" for e, d in zip(ENGLISH, GERMAN)), encoding="utf-8")
    args = ["--fsdp", "full_shard", "--use_cpu", "--train_file", str(tmp_path / "train.txt")]
    args += ["--model_name_or_path", str(tmp_path / "no_model_here"), "--output_dir", str(tmp_path / "out")]
    result = subprocess.run(
        [sys.executable, str(ROOT / "run_ifcl.py"), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "run_ifcl.py: error: --fsdp" in result.stderr and "no_model_here" not in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()


def test_the_queue_survives_zero_to_fp32s_buffer_cast(tiny_encoder_dir):
    """DeepSpeed's zero_to_fp32 keeps a checkpoint's persistent buffers but casts each to float32 (``v.float()`` in
    its ``parse_model_states``); ``load_state_dict`` casts them back, so the queue (float rows, bool marks, long
    head) comes back whole."""
    from ifcl import queue as ring
    from ifcl.model import IFCLModel

    trained = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=3, queue_batch_size=4)
    for step in range(2):
        ring.push(trained.queue, torch.randn(4 if step else 3, trained.hidden_size))
    buffers = {name for name, _ in trained.named_buffers()}
    consolidated = {name: value.float() if name in buffers else value for name, value in trained.state_dict().items()}
    assert consolidated["queue.valid"].dtype == torch.float32 and consolidated["queue.head"].dtype == torch.float32
    restored = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=3, queue_batch_size=4)
    restored.load_state_dict(consolidated)
    for name, value in trained.queue.named_buffers():
        restored_value = dict(restored.queue.named_buffers())[name]
        assert restored_value.dtype == value.dtype and torch.equal(restored_value, value), name
    assert ring.size(restored.queue) == 7
