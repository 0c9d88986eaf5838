"""A fault-tolerant training script for tests/test_fault_tolerance.py (run by `cadence launch
--fault_tolerance`). Writes, per replica group, a ledger line per step: the incarnation, whether the
step committed, and the sample ids this rank trained; at the end the final weights.

Environment knobs: FT_OUT (folder), FT_KILL_GROUP / FT_KILL_AT (SIGKILL that group's first
incarnation before drawing that step's batch), FT_SAMPLES, FT_BATCH, FT_SLOW_ALONE (seconds to
sleep per step while fewer groups than the job's train, so a restarted group can return).
"""

import json
import os
import signal
import time

import torch

from cadence import Accelerator


class Indexed(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=generator)
        self.y = self.x.sum(dim=1, keepdim=True)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return i, self.x[i], self.y[i]


def main() -> None:
    out = os.environ["FT_OUT"]
    group = json.loads(os.environ["CADENCE_LAUNCH_CONFIG"])["fault_tolerance"]["replica_group"]
    groups = json.loads(os.environ["CADENCE_LAUNCH_CONFIG"])["fault_tolerance"]["replica_groups"]
    incarnation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    kill_group = int(os.environ.get("FT_KILL_GROUP", "-1"))
    kill_at = int(os.environ.get("FT_KILL_AT", "-1"))
    slow_alone = float(os.environ.get("FT_SLOW_ALONE", "0"))
    if incarnation > 0:
        with open(os.path.join(out, f"restarted.{group}"), "w") as f:
            f.write(str(time.time()))
    if incarnation > 0:  # a slow restart, so the survivors are seen waiting (FT_RESTART_DELAY)
        time.sleep(float(os.environ.get("FT_RESTART_DELAY", "0")))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.99)
    loader = torch.utils.data.DataLoader(
        Indexed(int(os.environ.get("FT_SAMPLES", "64"))),
        batch_size=int(os.environ.get("FT_BATCH", "2")),
        shuffle=True,
        generator=torch.Generator().manual_seed(1),
    )
    accelerator = Accelerator(cpu=True)
    model, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler, loader)
    ledger = open(os.path.join(out, f"ledger.{group}.{accelerator.process_index}.jsonl"), "a")
    steps = 0
    for ids, x, y in loader:  # bounded: the loader ends when the epoch's cursor is at its end
        if group == kill_group and incarnation == 0 and steps == kill_at:
            ledger.close()
            with open(os.path.join(out, "killed_at"), "w") as f:
                f.write(str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        steps += 1
        record = {
            "incarnation": incarnation,
            "committed": not accelerator.optimizer_step_was_skipped,
            "ids": ids.tolist(),
            "participants": loader.participants,
            "lr": scheduler.get_last_lr()[0],
            "t": time.time(),
        }
        ledger.write(json.dumps(record) + "\n")
        ledger.flush()
        if slow_alone and loader.participants < groups:
            time.sleep(slow_alone)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
    with open(os.path.join(out, f"weights.{group}.{accelerator.process_index}.json"), "w") as f:
        json.dump({"weights": weights, "incarnation": incarnation, "steps": steps}, f)
    accelerator.end_training()


if __name__ == "__main__":
    main()
