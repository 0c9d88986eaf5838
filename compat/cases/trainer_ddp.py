"""transformers' Trainer on however many processes launched it (python, `cadence launch`, torchrun):
a map-style and an iterable dataset (batches dispatched from the main process), global batch 8.

python trainer_ddp.py OUTPUT_DIR  ->  prints `RESULT {...}` on rank 0
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import TokenDataset, digest, ensure_alias, quiet, report, tiny_gpt2_config  # noqa: E402

ensure_alias()
quiet()

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

OUT = sys.argv[1]
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
GLOBAL_BATCH = 8


class TokenStream(torch.utils.data.IterableDataset):
    """The same sequences as TokenDataset, as a stream (Trainer dispatches its batches)."""

    def __init__(self) -> None:
        self.data = TokenDataset()

    def __iter__(self):
        for index in range(len(self.data)):
            yield self.data[index]


def run(name: str, dataset) -> tuple[str, float, GPT2LMHeadModel]:
    transformers.set_seed(0)
    model = GPT2LMHeadModel(tiny_gpt2_config())
    args = TrainingArguments(
        output_dir=os.path.join(OUT, name), per_device_train_batch_size=GLOBAL_BATCH // WORLD,
        max_steps=4, learning_rate=1e-3, logging_steps=100, save_strategy="no", report_to="none",
        use_cpu=True, seed=0, disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=dataset)
    output = trainer.train()
    return digest(trainer.model.state_dict()), output.metrics["train_steps_per_second"], model


def sample(model) -> list[float]:
    """The first 16 values of every parameter."""
    return [v for p in model.parameters() for v in p.detach().flatten()[:16].tolist()]


map_digest, speed, map_model = run("map", TokenDataset())
stream_digest, _, stream_model = run("iterable", TokenStream())
report(
    {
        "world_size": WORLD,
        "map": map_digest,
        "iterable": stream_digest,
        "steps_per_second": speed,
        # the flat weights, to compare runs on different process counts within a tolerance
        "map_weights": sample(map_model),
        "iterable_weights": sample(stream_model),
    }
)
