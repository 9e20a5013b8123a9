"""On a GPU (marker ``gpu``, skipped without CUDA; ``benchmarks/gpu_check.sh`` runs them): the stacked and two-call
views, bf16 against float32 on a BERT-base-sized model, the five objectives in bf16, a saved model on CUDA and on the
CPU, the gradient cache, the sentence-transformers losses with Matryoshka sizes in bf16, LoRA decoders (one with a
BOS template, resumed and published merged), a bf16-saved decoder trained with float32 master weights under bf16, a
streamed run resumed exactly, and CTranslate2 on CUDA.

``IFCL_TEST_DEVICE=cpu python -m pytest -m gpu tests/test_gpu.py`` runs the same checks on the CPU, to check the tests
themselves where there is no GPU; what they measure is then the CPU's.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from conftest import (
    ENGLISH,
    GERMAN,
    LAST,
    TRANSLATION_SENTENCES,
    build_tiny_decoder,
    build_tokenizer,
    cpu_training_args,
    losses_by_step,
    one_training_step,
    read_pairs,
    tool_args,
    without_dropout,
)
from datasets import Dataset

from ifcl import queue as ring
from ifcl.model import IFCLModel
from trainer_ifcl import IFCLTrainer

DEVICE = torch.device(os.environ.get("IFCL_TEST_DEVICE", "cuda"))
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(), reason="needs CUDA"),
]

# Each objective's model settings: IFCL with its queue and fraternal twins, the peers with their own extras.
OBJECTIVES = {
    "ifcl": {"queue_size": 2},
    "simcse": {"objective": "simcse"},
    "micse": {"objective": "micse", "objective_settings": {"micse_attention_layers": "top2", "micse_queue_size": 4}},
    "conisi": {"objective": "conisi", "objective_settings": {"conisi_strategy": "o1"}},
    "pcl": {"objective": "pcl"},
}
PAIRS = {"sentence": ENGLISH + GERMAN, "fraternal": GERMAN + ENGLISH}


@pytest.fixture(autouse=True)
def float32_without_tf32():
    """float32 matrix products in float32, not TF32, so that float32 comparisons hold at 1e-5."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


def trainer_on_device(model: IFCLModel, output_dir, columns: dict | None = None, **settings) -> IFCLTrainer:
    """An ``IFCLTrainer`` on :data:`DEVICE` over the 24 sentence pairs (the sentences alone for a peer objective)."""
    columns = columns or (PAIRS if model.config.objective in (None, "ifcl") else {"sentence": PAIRS["sentence"]})
    args = cpu_training_args(output_dir, use_cpu=DEVICE.type == "cpu", **settings)
    trainer = IFCLTrainer(model, args, train_dataset=Dataset.from_dict(columns))
    trainer.model.to(DEVICE), trainer.objective.to(DEVICE)
    return trainer


def batch_of(trainer: IFCLTrainer, size: int) -> dict[str, torch.Tensor]:
    """The first ``size`` training rows, collated, on :data:`DEVICE`."""
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(size)])
    return {name: value.to(DEVICE) for name, value in batch.items()}


def largest_difference(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> float:
    """The largest absolute difference between same-named tensors."""
    assert first and first.keys() == second.keys()
    return max((first[name].float() - second[name].float()).abs().max().item() for name in first)


def test_stacked_and_two_call_views_give_the_same_loss_and_gradients(tiny_encoder_dir, tmp_path, record_property):
    """``stack_views`` (one encoder call over the three views, the default on CUDA) against two calls: float32,
    dropout off, the same loss and gradients within 1e-5."""
    model = without_dropout(IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=2))
    trainer = trainer_on_device(model, tmp_path)
    ring.push(model.queue, torch.randn(model.queue.valid.numel(), model.hidden_size, device=DEVICE))
    batch = batch_of(trainer, 8)
    steps = {}
    for stacked in (True, False):
        model.config.stack_views = stacked
        steps[stacked] = one_training_step(trainer, batch)[:3]
    (loss, terms, gradients), (two_call_loss, two_call_terms, two_call_gradients) = steps[True], steps[False]
    record_property("largest_gradient_difference", largest_difference(gradients, two_call_gradients))
    torch.testing.assert_close(loss, two_call_loss, rtol=0, atol=1e-5)
    assert largest_difference(terms, two_call_terms) <= 1e-5
    assert largest_difference(gradients, two_call_gradients) <= 1e-5


@pytest.fixture(scope="module")
def base_sized_encoder(tmp_path_factory):
    """A random-weight encoder of BERT-base's size (12 layers, width 768, 12 heads, feed-forward 3072) over the
    test sentences' vocabulary, dropout off."""
    from transformers import BertConfig, BertModel

    folder = tmp_path_factory.mktemp("bert-base-sized")
    tokenizer = build_tokenizer(ENGLISH + GERMAN)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_bf16_losses_stay_within_1e_2_of_float32_over_20_steps(base_sized_encoder, tmp_path, record_property):
    """20 IFCL steps of a BERT-base-sized model with ``bf16`` and without, the same data and seed, dropout off: every
    logged loss finite, and bf16's within 1e-2 of float32's (relative to losses above 1)."""
    losses = {}
    for bf16 in (False, True):
        model = IFCLModel.from_encoder(str(base_sized_encoder), queue_size=2, training_dropout=0.0)
        settings = {"bf16": bf16, "max_steps": 20, "logging_steps": 1, "learning_rate": 1e-5, "seed": 0}
        trainer = trainer_on_device(model, tmp_path / str(bf16), per_device_train_batch_size=8, **settings)
        trainer.train()
        losses[bf16] = losses_by_step(trainer)
    assert len(losses[True]) == len(losses[False]) == 20
    relative = [abs(losses[True][step] - loss) / max(1.0, abs(loss)) for step, loss in losses[False].items()]
    record_property("largest_relative_loss_difference", max(relative))
    for step, loss in losses[False].items():
        assert math.isfinite(losses[True][step]), step
        assert abs(losses[True][step] - loss) <= 1e-2 * max(1.0, abs(loss)), (step, losses[True][step], loss)


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_each_objective_trains_20_steps_in_bf16(tiny_encoder_dir, tmp_path, name):
    model = IFCLModel.from_encoder(str(tiny_encoder_dir), **OBJECTIVES[name])
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    settings = {"bf16": True, "max_steps": 20, "logging_steps": 1, "learning_rate": 1e-3}
    trainer = trainer_on_device(model, tmp_path, per_device_train_batch_size=4, **settings)
    trainer.train()
    losses = losses_by_step(trainer)
    assert len(losses) == 20 and all(math.isfinite(loss) for loss in losses.values()), losses
    after = dict(model.named_parameters())
    assert any(not torch.equal(after[n].detach().cpu(), value.cpu()) for n, value in before.items())


@pytest.mark.parametrize("cached", [False, True], ids=["IFCLLoss", "CachedIFCLLoss"])
def test_the_sentence_transformers_losses_train_with_matryoshka_sizes_in_bf16(tiny_encoder_dir, tmp_path, cached):
    """IFCLLoss and CachedIFCLLoss with their own Matryoshka sizes under SentenceTransformerTrainer in bf16: 10 finite
    steps, one queue push each."""
    pytest.importorskip("sentence_transformers")
    from conftest import st_training_args
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    from ifcl.sentence_transformers_loss import CachedIFCLLoss, IFCLLoss

    transformer = Transformer(str(tiny_encoder_dir), max_seq_length=16)
    model = SentenceTransformer(modules=[transformer, Pooling(32, "mean")], device=str(DEVICE))
    options = {"mini_batch_size": 2} if cached else {}
    loss = (CachedIFCLLoss if cached else IFCLLoss)(model, queue_size=4, matryoshka_dims=[32, 16, 8], **options)
    pairs = Dataset.from_dict(PAIRS)
    args = st_training_args(
        tmp_path, per_device_train_batch_size=4, max_steps=10, bf16=True, logging_steps=1, use_cpu=DEVICE.type == "cpu"
    )
    trainer = SentenceTransformerTrainer(
        model=model, args=args, train_dataset=pairs, loss=loss, data_collator=loss.data_collator(pairs)
    )
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 10 and all(math.isfinite(value) for value in losses), losses
    assert ring.size(loss.queue) == 16 and loss.queue.head.item() == 9 % 4


def test_a_saved_model_embeds_alike_on_cuda_and_on_the_cpu(published_dir, record_property):
    """The published folder through its remote code: float32 embeddings on :data:`DEVICE` and on the CPU within
    1e-4."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(published_dir), trust_remote_code=True)
    on_cpu = model.encode(ENGLISH, device="cpu")
    on_device = model.encode(ENGLISH, device=DEVICE)
    assert on_device.device.type == "cpu" and on_device.dtype == torch.float32  # returned on the CPU, as documented
    record_property("largest_difference", (on_device - on_cpu).abs().max().item())
    torch.testing.assert_close(on_device, on_cpu, rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", ["ifcl", "simcse", "micse"])
def test_the_cached_step_equals_the_uncached_one(tiny_encoder_dir, tmp_path, name, record_property):
    """Dropout off, mini-batches of 3 rows over a batch of 8: float32 loss, terms and gradients within 1e-5; under
    bf16 autocast, the loss within 1e-4."""
    model = without_dropout(IFCLModel.from_encoder(str(tiny_encoder_dir), **OBJECTIVES[name]))
    trainer = trainer_on_device(model, tmp_path)
    for queue in (model.queue, getattr(trainer.objective, "queue", None)):
        if queue is not None:
            ring.push(queue, torch.randn(queue.valid.numel(), model.hidden_size, device=DEVICE))
    batch = batch_of(trainer, 8)
    for autocast in (False, True):
        loss, terms, gradients, _ = one_training_step(trainer, batch, autocast=autocast)
        cached_loss, cached_terms, cached_gradients, _ = one_training_step(trainer, batch, 3, autocast)
        record_property(f"loss_difference_{'bf16' if autocast else 'float32'}", (cached_loss - loss).abs().item())
        if autocast:
            torch.testing.assert_close(cached_loss, loss, rtol=0, atol=1e-4)
        else:
            torch.testing.assert_close(cached_loss, loss, rtol=0, atol=1e-5)
            assert largest_difference(terms, cached_terms) <= 1e-5
            assert largest_difference(gradients, cached_gradients) <= 1e-5


def test_a_lora_decoder_trains_saves_and_reloads(tmp_path):
    """A tiny random Qwen3 with LoRA adapters trains 3 steps on :data:`DEVICE`; its published folder (adapters merged)
    loads through its remote code and embeds as the trained model did, within 1e-4."""
    from transformers import AutoModel

    from ifcl.lora import add_lora
    from ifcl.publishing import save_published

    decoder = build_tiny_decoder("qwen3", tmp_path / "qwen3")
    model = IFCLModel.from_encoder(str(decoder), queue_size=2, **LAST)
    add_lora(model, r=4)
    trainer = trainer_on_device(model, tmp_path / "run", per_device_train_batch_size=4, max_steps=3)
    trainer.train()
    expected = model.encode(ENGLISH, device=DEVICE)
    save_published(model, str(tmp_path / "published"))
    reloaded = AutoModel.from_pretrained(str(tmp_path / "published"), trust_remote_code=True)
    torch.testing.assert_close(reloaded.encode(ENGLISH, device=DEVICE), expected, rtol=0, atol=1e-4)


def test_a_bos_template_lora_decoder_trains_in_bf16_resumes_and_publishes_merged(tmp_path):
    """A tiny Llama 3 (its tokenizer a ByteLevel step then a BOS template, no pad token) with LoRA trains 4 steps in
    bf16 on :data:`DEVICE`; a second run resumed from its checkpoint-2 logs the same losses at steps 3 and 4 (1e-4);
    its checkpoint-4 loads merged, as the published folder holds it (1e-4), and both read ``<bos> tokens <eos>``."""
    from transformers import AutoModel, AutoTokenizer

    from ifcl.lora import add_lora

    decoder = build_tiny_decoder("llama", tmp_path / "llama")
    sentence = ENGLISH[0]
    base = AutoTokenizer.from_pretrained(decoder)
    expected = [*base(sentence)["input_ids"], base.eos_token_id]

    def trainer(output: str) -> IFCLTrainer:
        torch.manual_seed(0)
        model = IFCLModel.from_encoder(str(decoder), queue_size=2, **LAST)
        add_lora(model, r=4)
        settings = {"per_device_train_batch_size": 4, "max_steps": 4, "logging_steps": 1, "learning_rate": 1e-3}
        return trainer_on_device(model, tmp_path / output, bf16=True, save_strategy="steps", save_steps=2, **settings)

    whole = trainer("whole")
    whole.train()
    resumed = trainer("resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-2"))
    for step in (3, 4):
        assert losses_by_step(resumed)[step] == pytest.approx(losses_by_step(whole)[step], abs=1e-4), step
    whole.save_model()
    published = AutoModel.from_pretrained(str(tmp_path / "whole"), trust_remote_code=True)
    checkpoint = IFCLModel.from_pretrained(str(tmp_path / "whole" / "checkpoint-4"))  # the package merges LoRA
    assert published.tokenizer(sentence)["input_ids"] == checkpoint.tokenizer(sentence)["input_ids"] == expected
    in_process = whole.model.encode(ENGLISH, device=DEVICE)
    for loaded in (published, checkpoint):
        torch.testing.assert_close(loaded.encode(ENGLISH, device=DEVICE), in_process, rtol=0, atol=1e-4)


def test_a_bf16_saved_decoder_trains_float32_master_weights_under_bf16(tmp_path):
    """A tiny Qwen3 saved in bfloat16, as decoders ship: from_encoder loads float32 weights by default, ``--bf16``
    autocasts over them for 4 steps on :data:`DEVICE` with finite losses, most layer weights move, and the published
    weights are float32."""
    from safetensors import safe_open
    from transformers import AutoModel

    decoder = build_tiny_decoder("qwen3", tmp_path / "qwen3")
    AutoModel.from_pretrained(decoder).to(torch.bfloat16).save_pretrained(decoder)
    model = IFCLModel.from_encoder(str(decoder), queue_size=2, **LAST)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    layers = {n: p.detach().clone() for n, p in model.named_parameters() if ".layers." in n and p.requires_grad}
    settings = {"per_device_train_batch_size": 4, "max_steps": 4, "logging_steps": 1, "learning_rate": 1e-3}
    trainer = trainer_on_device(model, tmp_path / "run", bf16=True, **settings)
    trainer.train()
    assert all(math.isfinite(loss) for loss in losses_by_step(trainer).values())
    after = dict(model.named_parameters())
    moved = [(after[n].detach().cpu() != p.cpu()).float().mean().item() for n, p in layers.items()]
    assert sum(moved) / len(moved) > 0.9, moved
    trainer.save_model()
    with safe_open(str(tmp_path / "run" / "model.safetensors"), "pt") as saved:
        assert {saved.get_slice(name).get_dtype() for name in saved.keys()} == {"F32"}


def test_a_streamed_run_resumes_exactly_on_the_device(tiny_encoder_dir, tmp_path):
    """``run_ifcl.py --streaming`` on :data:`DEVICE` over two shards: stopped in step 4 and resumed from checkpoint-3,
    it logs the uninterrupted run's losses at steps 4 to 6 (1e-4)."""
    from conftest import stopped_in_step, write_sts_file

    import run_ifcl
    from ifcl.failures import Interrupted

    shards = tmp_path / "shards"
    shards.mkdir()
    pairs = [(f"{english} {i}", f"{german} {i}") for i in range(4) for english, german in zip(ENGLISH, GERMAN)]
    for index in range(2):
        (shards / f"part-{index}.txt").write_text("".join(f"{s}\t{f}\n" for s, f in pairs[index::2]), "utf-8")
    write_sts_file(tmp_path / "sts.tsv")

    def args(output: str) -> list[str]:
        flags = ["--model_name_or_path", str(tiny_encoder_dir), "--train_file", str(shards / "*.txt"), "--streaming"]
        flags += ["--shuffle_buffer_size", "16", "--output_dir", str(tmp_path / output), "--max_steps", "6"]
        flags += ["--validation_file", str(tmp_path / "sts.tsv"), "--test_file", str(tmp_path / "sts.tsv")]
        flags += ["--save_steps", "3", "--eval_steps", "3", "--logging_steps", "1", "--per_device_train_batch_size"]
        return [*flags, "4", "--queue_size", "2", *(["--use_cpu"] if DEVICE.type == "cpu" else [])]

    whole, _ = run_ifcl.main(args("whole"))
    with stopped_in_step(4), pytest.raises(Interrupted):
        run_ifcl.main(args("stopped"))
    resumed, _ = run_ifcl.main([*args("stopped"), "--resume_from_checkpoint", "last"])
    for step in (4, 5, 6):
        assert losses_by_step(resumed)[step] == pytest.approx(losses_by_step(whole)[step], abs=1e-4), step


def test_ctranslate2_on_cuda_writes_what_transformers_writes(tiny_marian_dir, sentences_file, tmp_path):
    """``prepare_fraternal.py --device cuda`` on the tiny Marian model: CTranslate2's pairs are those of
    ``--engine transformers`` (greedy; at least 95% of them, as on the CPU)."""
    pytest.importorskip("ctranslate2")
    import ifcl.translation as prepare_fraternal

    pairs = {}
    for engine in ("transformers", "ctranslate2"):
        output = tmp_path / f"{engine}.txt"
        arguments = tool_args(sentences_file, output, tiny_marian_dir, "--engine", engine, "--device", DEVICE.type)
        prepare_fraternal.run(arguments)
        pairs[engine] = read_pairs(output)
    assert [sentence for sentence, _ in pairs["ctranslate2"]] == TRANSLATION_SENTENCES
    same = sum(a == b for a, b in zip(pairs["transformers"], pairs["ctranslate2"]))
    assert same >= 0.95 * len(TRANSLATION_SENTENCES), pairs
