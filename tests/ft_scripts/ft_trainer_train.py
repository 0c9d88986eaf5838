"""transformers' Trainer under `cadence launch --fault_tolerance`, through the `accelerate` alias,
as a user writes it: `Trainer(model, args, train_dataset, eval_dataset).train()` with an evaluation
each epoch. A callback SIGKILLs one group at a chosen optimizer step (first incarnation only) and
slows every step, so the restarted group comes back while the job trains; each rank logs the
samples of every step it committed and, at the end, its weights and evaluations.

python ft_trainer_train.py OUT   (env: KILL_GROUP, KILL_AT, STEP_SLEEP, EPOCHS, SAMPLES, ACCUM)
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

OUT = sys.argv[1]
FT = json.loads(os.environ["CADENCE_LAUNCH_CONFIG"]).get("fault_tolerance") or {}
GROUP = FT.get("replica_group", 0)
INCARNATION = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
RANK = int(os.environ.get("RANK", "0"))
SAMPLES = int(os.environ.get("SAMPLES", "48"))


class Samples(torch.utils.data.Dataset):
    """y = x . (1, 2, 3, 4) + noise, with each sample's index (so steps can be logged)."""

    def __init__(self, n: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 4, generator=generator)
        self.y = self.x @ torch.tensor([1.0, 2.0, 3.0, 4.0]) + 0.1 * torch.randn(
            n, generator=generator
        )

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "y": self.y[i], "idx": torch.tensor(i)}


class Regression(torch.nn.Module):
    """A linear model that returns Trainer's {"loss": ...} and notes the samples whose loss was
    backpropagated since the last optimizer step (a stand-in batch's never is)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)
        self.trained: list[int] = []

    def forward(self, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor) -> dict:
        loss = torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), y)
        if loss.requires_grad:
            ids = idx.tolist()
            loss.register_hook(lambda grad: self.trained.extend(ids))
        return {"loss": loss}


class Steps(TrainerCallback):
    """Logs each committed step's samples; kills the chosen group once; slows every step."""

    def __init__(self, model: Regression) -> None:
        self.model = model
        self.log = open(os.path.join(OUT, f"steps.{GROUP}.{RANK}.jsonl"), "a")  # noqa: SIM115

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        if not optimizer.step_was_skipped:  # a discarded step, or a stand-in batch's
            record = {"inc": INCARNATION, "ids": self.model.trained}
            self.log.write(json.dumps(record) + "\n")
            self.log.flush()
        self.model.trained = []  # a discarded step's samples are drawn again
        kill = os.environ.get("KILL_GROUP")
        if kill and int(kill) == GROUP and INCARNATION == 0:
            if state.global_step == int(os.environ["KILL_AT"]):
                os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(float(os.environ.get("STEP_SLEEP", "0")))


torch.manual_seed(0)
model = Regression()
args = TrainingArguments(
    output_dir=os.path.join(OUT, "trainer"), per_device_train_batch_size=4,
    gradient_accumulation_steps=int(os.environ.get("ACCUM", "1")),
    per_device_eval_batch_size=4, num_train_epochs=int(os.environ.get("EPOCHS", "3")),
    learning_rate=0.05, label_names=["y"], eval_strategy="epoch", save_strategy="no", logging_steps=1,
    report_to="none", use_cpu=True, seed=0, disable_tqdm=True, dataloader_num_workers=0,
)  # fmt: skip
trainer = Trainer(
    model=model,
    args=args,
    train_dataset=Samples(SAMPLES, 0),
    eval_dataset=Samples(20, 7),
    callbacks=[Steps(model)],
)
trainer.train()
result = {
    "inc": INCARNATION,
    "weights": torch.cat([p.detach().flatten() for p in model.parameters()]).tolist(),
    "evals": [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h],
}
with open(os.path.join(OUT, f"result.{GROUP}.{RANK}.json"), "w") as f:
    json.dump(result, f)
