"""Elastic, preemptible training: the same script on any number of nodes, resumed after every change.

Two "nodes" on one machine (two launchers; the first one hosts the rendezvous and must stay):

    cadence launch --cpu --nnodes 1:2 --nproc_per_node 1 --max_restarts 3 \\
        --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:29500 examples/elastic_train.py /tmp/elastic-run

A SIGTERM to a launcher (a scheduler's notice) makes every rank finish its step, commit one
checkpoint and stop; the noticed node exits with code 75 ("resume me") and the others go on at the
smaller world size from that checkpoint. A node that joins does the same at the larger size.

At start the script loads the newest complete checkpoint (automatic naming), so it continues where
the job stopped. Resuming on a different number of processes relies on the loader saving a global
data position (Cadence's resumable loaders); on the same number it is exact today.
"""

import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

from cadence import Accelerator
from cadence.utils import ProjectConfiguration, set_seed


class Progress:
    """The epoch the job is in, saved with every checkpoint (`register_for_checkpointing`)."""

    def __init__(self) -> None:
        self.epoch = 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = state["epoch"]


def main() -> None:
    project_dir = sys.argv[1] if len(sys.argv) > 1 else "elastic-run"
    epochs = 3
    config = ProjectConfiguration(
        project_dir=project_dir, automatic_checkpoint_naming=True, total_limit=3
    )
    accelerator = Accelerator(project_config=config)
    set_seed(0)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=generator)
    dataset = TensorDataset(x, x.sum(dim=1, keepdim=True))
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(dataset, batch_size=8, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)

    if os.path.isdir(os.path.join(project_dir, "checkpoints")):
        accelerator.load_state()  # the newest complete checkpoint; numbering continues after it
        accelerator.print(
            f"resumed at epoch {progress.epoch} on {accelerator.num_processes} process(es)"
        )
    while progress.epoch < epochs:
        for inputs, targets in loader:  # a resumed epoch continues where it stopped
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        progress.epoch += 1
        accelerator.print(f"epoch {progress.epoch} done, loss {loss.item():.4f}")
    accelerator.save_state()  # the finished state: a restart after the end has nothing left to do


if __name__ == "__main__":
    main()
