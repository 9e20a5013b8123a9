"""Run under ``torch.distributed.run`` (gloo, CPU; one process or several): trains the tiny encoder through
``SentenceTransformerTrainer``, three steps each, with ``IFCLLoss`` and ``CachedIFCLLoss`` (mini-batches of one row),
with and without Matryoshka sizes (32 and 8), and with ``IFCLLoss`` on a stream (a ``datasets.IterableDataset``, each
process reading its own batches: ``dispatch_batches=False``, as docs/training.md says). It saves ``st_rank<r>.pt`` in
the output folder: for each of the five, the loss and the weighted terms (when the loss gives them by name) of each
step as this process computed them, at full precision, the queue, the model's weights at the end and the loss's own
(BEL_F and its projection) before and after training.

Arguments: OUTPUT ENCODER FRATERNAL PER_DEVICE_BATCH_SIZE GATHER (1: ``gather_across_devices=True``, 0: not).
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from conftest import ENGLISH, GERMAN, st_training_args  # noqa: E402
from datasets import Dataset  # noqa: E402
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Pooling, Transformer  # noqa: E402

from ifcl.sentence_transformers_loss import CachedIFCLLoss, IFCLLoss  # noqa: E402

# A queue of two batches, a fraternal model of another width (so a projection that trains in the loss module).
SETTINGS = {"queue_size": 2, "forgetting_rate": 0.2, "training_dropout": 0.0}
RUNS = {  # name: (loss class, Matryoshka sizes, the rows read as a stream)
    "IFCLLoss": (IFCLLoss, None, False),
    "CachedIFCLLoss": (CachedIFCLLoss, None, False),
    "IFCLLoss with sizes": (IFCLLoss, [32, 8], False),
    "CachedIFCLLoss with sizes": (CachedIFCLLoss, [32, 8], False),
    "IFCLLoss on a stream": (IFCLLoss, None, True),
}


class RecordingTrainer(SentenceTransformerTrainer):
    """Keeps the loss of each training step and, when the loss gives them by name, its weighted terms."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.losses: list[float] = []
        self.terms: list[dict[str, float]] = []

    def compute_loss(self, *args, **kwargs) -> torch.Tensor:
        loss = super().compute_loss(*args, **kwargs)
        self.losses.append(loss.item())
        return loss

    def track_loss_components(self, loss: dict[str, torch.Tensor]) -> None:
        self.terms.append({name: value.item() for name, value in loss.items()})
        super().track_loss_components(loss)


def train(name: str, output: str, encoder: str, fraternal: str, batch_size: int, gather: bool) -> dict:
    loss_class, sizes, streamed = RUNS[name]
    torch.manual_seed(0)
    transformer = Transformer(encoder, max_seq_length=16)
    model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")])
    extra = {"mini_batch_size": 1} if loss_class is CachedIFCLLoss else {}
    loss = loss_class(model, fraternal, gather_across_devices=gather, matryoshka_dims=sizes, **SETTINGS, **extra)
    pairs = Dataset.from_dict({"sentence": ENGLISH, "fraternal": GERMAN})
    # A stream is not shuffled: three steps of the global batch 4 read its 12 rows once.
    streaming = {"accelerator_config": {"dispatch_batches": False}} if streamed else {}
    pairs = pairs.to_iterable_dataset() if streamed else pairs
    args = st_training_args(
        os.path.join(output, name.replace(" ", "_")),
        per_device_train_batch_size=batch_size,
        max_steps=3,
        learning_rate=5e-3,
        logging_steps=1,
        seed=0,
        **streaming,
    )
    trainer = RecordingTrainer(
        model=model, args=args, train_dataset=pairs, loss=loss, data_collator=loss.data_collator(pairs)
    )
    before = {
        name: tensor.detach().clone() for name, tensor in loss.named_parameters() if not name.startswith("model.")
    }
    trainer.train()
    queue = {name: buffer.detach().clone() for name, buffer in loss.queue.named_buffers()}
    weights = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    own = {name: tensor.detach().clone() for name, tensor in loss.named_parameters() if not name.startswith("model.")}
    return {
        "losses": trainer.losses,
        "terms": trainer.terms,
        "queue": queue,
        "weights": weights,
        "loss_weights": own,
        "loss_weights_before": before,
    }


if __name__ == "__main__":
    output, encoder, fraternal, batch_size, gather = sys.argv[1:6]
    results = {name: train(name, output, encoder, fraternal, int(batch_size), gather == "1") for name in RUNS}
    rank = int(os.environ.get("RANK", "0"))
    torch.save(results, os.path.join(output, f"st_rank{rank}.pt"))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # without it gloo may abort the process as it exits
