"""The training loop the Ray Train tests run, under Ray (TorchTrainer workers) and under
`cadence launch`. Kept in its own module so that Ray's workers import it by name."""

from __future__ import annotations

import os
import tempfile


class Progress:
    """Epoch and step counters, saved and loaded with the checkpoint."""

    def __init__(self) -> None:
        self.epoch = 0
        self.step = 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.step = state["epoch"], state["step"]


def train_loop(config: dict) -> None:
    """Two epochs of a small MLP on 48 shuffled samples, batch 4 per process.

    config: out (where rank 0 saves the final weights), ray (report checkpoints through Ray),
    save_at (the step after which each worker saves into its own temporary folder and reports it),
    stop_at (return after that step, as a preempted job would).
    """
    import torch

    torch.set_num_threads(1)
    from cadence import Accelerator

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    x = torch.randn(48, 4, generator=torch.Generator().manual_seed(3))
    y = x.sum(dim=1, keepdim=True)
    dataset = torch.utils.data.TensorDataset(x, y)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    if config.get("ray"):
        import ray.train

        checkpoint = ray.train.get_checkpoint()
        if checkpoint is not None:
            with checkpoint.as_directory() as folder:
                accelerator.load_state(folder)
    while progress.epoch < 2:
        for features, target in loader:
            loss = torch.nn.functional.mse_loss(model(features), target)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            progress.step += 1
            if config.get("ray") and progress.step == config.get("save_at"):
                import ray.train

                # Ray's pattern: every worker saves into its own folder and reports it; Ray merges
                # the folders into one checkpoint.
                with tempfile.TemporaryDirectory() as folder:
                    accelerator.save_state(folder)
                    ray.train.report(
                        {"step": progress.step},
                        checkpoint=ray.train.Checkpoint.from_directory(folder),
                    )
            if progress.step == config.get("stop_at"):
                return
        progress.epoch += 1
    if accelerator.is_main_process:
        weights = accelerator.unwrap_model(model).state_dict()
        torch.save({k: v.clone() for k, v in weights.items()}, config["out"])
    accelerator.wait_for_everyone()


def report_world(config: dict) -> None:
    """Rank 0 writes what a plain Accelerator() sees under Ray (with or without the switch)."""
    import json

    if config.get("ignore_group"):
        os.environ["CADENCE_IGNORE_PROCESS_GROUP"] = "1"
    from cadence import Accelerator

    accelerator = Accelerator()
    import torch.distributed as dist

    rank = dist.get_rank()
    with open(f"{config['out']}.{rank}.json", "w") as f:
        json.dump(
            {
                "num_processes": accelerator.num_processes,
                "distributed_type": str(accelerator.distributed_type),
                "is_main_process": accelerator.is_main_process,
            },
            f,
        )


def hf_trainer_loop(config: dict) -> None:
    """transformers' Trainer on a tiny regression model (under Ray: through prepare_trainer);
    rank 0 saves the final weights to config["out"]."""
    if config.get("alias"):  # a Ray worker: the alias is turned on here, before transformers loads
        import cadence

        cadence.as_accelerate()
    import torch
    import transformers

    torch.set_num_threads(1)

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))

        def forward(self, x, labels=None):
            out = self.net(x)
            loss = None if labels is None else torch.nn.functional.mse_loss(out, labels)
            return {"loss": loss, "logits": out}

    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(3))
    rows = [{"x": x[i], "labels": x[i].sum(dim=0, keepdim=True)} for i in range(32)]
    args = transformers.TrainingArguments(
        output_dir=config["out"] + ".trainer",
        per_device_train_batch_size=4,
        num_train_epochs=2,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        seed=0,
        dataloader_num_workers=0,
    )
    model = Tiny()
    trainer = transformers.Trainer(model=model, args=args, train_dataset=rows)
    if config.get("ray"):
        from ray.train.huggingface.transformers import prepare_trainer

        trainer = prepare_trainer(trainer)
    trainer.train()
    if trainer.is_world_process_zero():
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, config["out"])
