"""run_ifcl.py on a training file from the Arrow caches: the token cache is shared by later runs, and
``--tokenize_on_the_fly`` trains exactly as the cached tokens do."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ENGLISH, GERMAN, cpu_training_args, losses_by_step, write_sts_file

import run_ifcl


@pytest.mark.slow
def test_tokenizing_on_the_fly_trains_like_the_token_cache(tiny_encoder_dir, tmp_path: Path):
    data = tmp_path / "train.txt"
    data.write_text("".join(f"{e}\t{d}\n" for e, d in zip(ENGLISH, GERMAN)) * 3, encoding="utf-8")
    write_sts_file(tmp_path / "sts.tsv")
    settings = "--do_train --max_steps 3 --logging_steps 1 --per_device_train_batch_size 4 --queue_size 2 --use_cpu"
    settings += " --eval_strategy no --save_strategy no --load_best_model_at_end false"
    losses, features = {}, {}
    for name, extra in (("cached", []), ("cached again", []), ("on the fly", ["--tokenize_on_the_fly"])):
        output_dir = tmp_path / name.replace(" ", "_")
        args = ["--model_name_or_path", tiny_encoder_dir, "--train_file", data, "--output_dir", output_dir]
        trainer, _ = run_ifcl.main([*map(str, args), *settings.split(), *extra])
        losses[name] = losses_by_step(trainer)
        features[name] = trainer.train_dataset
    assert len(losses["cached"]) == 3 and losses["on the fly"] == losses["cached"] == losses["cached again"]
    cache_files = [entry["filename"] for entry in features["cached"].cache_files]
    assert any(Path(name).name.startswith("cache-") for name in cache_files)  # the tokens, on disk
    assert [entry["filename"] for entry in features["cached again"].cache_files] == cache_files  # read, not redone
    assert features["on the fly"][0] == features["cached"][0]


def test_the_map_style_order_is_the_trainers_own_without_a_list_of_every_row(tiny_encoder_dir, tmp_path):
    """Up to 2^25 rows the shuffle gives exactly the order accelerate's seeded random sampler gave (so runs and their
    records are unchanged), epoch by epoch; the IFCL trainer uses it for a map-style set."""
    import torch
    from accelerate.data_loader import SeedableRandomSampler
    from datasets import Dataset

    from ifcl.data import ShuffledRows
    from ifcl.model import IFCLModel
    from trainer_ifcl import IFCLTrainer

    for size, epoch in ((7, 0), (1000, 0), (1000, 3)):
        theirs = SeedableRandomSampler(data_source=range(size), data_seed=42)
        ours = ShuffledRows(size, 42)
        theirs.set_epoch(epoch), ours.set_epoch(epoch)
        assert list(ours) == list(theirs)
    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0)
    args = cpu_training_args(tmp_path, per_device_train_batch_size=4, seed=3)
    trainer = IFCLTrainer(
        model=model, args=args, train_dataset=Dataset.from_dict({"sentence": ENGLISH, "fraternal": GERMAN})
    )
    torch.manual_seed(3)
    sampler = trainer._get_train_sampler()
    assert isinstance(sampler, ShuffledRows) and list(sampler) == list(
        SeedableRandomSampler(data_source=range(12), data_seed=3)
    )


def test_beyond_the_exact_order_limit_each_epoch_is_a_permutation_computed_row_by_row(monkeypatch):
    """Past the limit the order is a keyed permutation: every row once per epoch, the same at every pass of an epoch
    (a resume), another in the next epoch, and computed without a list of the rows."""
    import ifcl.data

    monkeypatch.setattr(ifcl.data, "EXACT_ORDER_LIMIT", 100)
    monkeypatch.setattr(ifcl.data, "ORDER_CHUNK", 64)  # several chunks
    rows = ifcl.data.ShuffledRows(1000, seed=5)
    first = list(rows)
    assert sorted(first) == list(range(1000)) and first != list(range(1000))
    rows.set_epoch(0)
    assert list(rows) == first
    rows.set_epoch(1)
    second = list(rows)
    assert sorted(second) == list(range(1000)) and second != first
