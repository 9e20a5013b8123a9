"""run_ifcl.py on a training file from the Arrow caches: the token cache is shared by later runs, and
``--tokenize_on_the_fly`` trains exactly as the cached tokens do."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ENGLISH, GERMAN, losses_by_step, write_sts_file

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
