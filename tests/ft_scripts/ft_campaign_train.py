"""The fault campaign's training script (tests/ft_campaign.py), run by `cadence launch
--fault_tolerance`: written as users write theirs, with the idiom, the DataLoader and the failures
of one scenario.

Usage: ft_campaign_train.py OUT (the scenario in OUT/scenario.json; OUT also names the run's
processes, so the harness finds any left behind).

Idioms: `epochs` (for epoch in range(E): for batch in loader), `no_trainer` (transformers'
run_*_no_trainer.py: a completed_steps counter with its break, save_state every N steps and at
each epoch's end; `max_steps` in the scenario sets max_train_steps below the epochs' steps),
`step_total` (the loop stops when the prepared scheduler reaches a total). Each
evaluates after every epoch over a prepared eval DataLoader with gather_for_metrics and
`torch.cat`, as those scripts do.

Written per rank: `ledger.G.R.jsonl`, one line per optimizer-step window (the job's step it was
drawn at, the micro-batches' sample ids, the short-window factor, committed or not, the epoch; `clip` in the scenario: clip_grad_norm_ to
it before each optimizer step);
`eval.G.R.jsonl`, one line per evaluation; `weights.G.R.json` at the end; `killed.G.I.N` before
each failure it causes.
"""

import json
import os
import signal
import sys
import time

import torch

from cadence import Accelerator
from cadence.utils import DataLoaderConfiguration, ProjectConfiguration, set_seed


class Samples(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 4, generator=generator)
        self.y = self.x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return i, self.x[i], self.y[i]


class Progress:
    """A counter of committed steps the script keeps and registers for checkpointing."""

    def __init__(self) -> None:
        self.n = 0

    def state_dict(self) -> dict:
        return {"n": self.n}

    def load_state_dict(self, state: dict) -> None:
        self.n = state["n"]


def train_loader(kind: str, samples: int, batch: int) -> torch.utils.data.DataLoader:
    data = Samples(samples, 0)
    if kind == "shuffle":  # as every Accelerate example builds it, after set_seed
        return torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True)
    if kind == "shuffle_gen":
        generator = torch.Generator().manual_seed(1)
        return torch.utils.data.DataLoader(
            data, batch_size=batch, shuffle=True, generator=generator
        )
    if kind == "drop_last":
        return torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True, drop_last=True)
    if kind == "batch_sampler":
        sampler = torch.utils.data.RandomSampler(data)
        batches = torch.utils.data.BatchSampler(sampler, batch_size=batch, drop_last=False)
        return torch.utils.data.DataLoader(data, batch_sampler=batches)
    return torch.utils.data.DataLoader(data, batch_size=batch, shuffle=kind == "seedable")


def main() -> None:
    out = sys.argv[1]
    with open(os.path.join(out, "scenario.json")) as f:
        scenario = json.load(f)
    ft = json.loads(os.environ["CADENCE_LAUNCH_CONFIG"]).get("fault_tolerance") or {}
    group, groups = ft.get("replica_group", 0), ft.get("replica_groups", 1)
    incarnation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    epochs, accum = scenario["epochs"], scenario["accum"]

    set_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    scheduler = torch.optim.lr_scheduler.LinearLR(
        optimizer, start_factor=1.0, end_factor=0.25, total_iters=scenario["schedule"]
    )
    loader = train_loader(scenario["loader"], scenario["samples"], scenario["batch"])
    eval_loader = torch.utils.data.DataLoader(Samples(scenario["eval_samples"], 7), batch_size=4)
    accelerator = Accelerator(
        cpu=True,
        gradient_accumulation_steps=accum,
        project_config=ProjectConfiguration(project_dir=os.path.join(out, "run")),
        dataloader_config=DataLoaderConfiguration(
            use_seedable_sampler=scenario["loader"] == "seedable"
        ),
    )
    model, optimizer, loader, eval_loader, scheduler = accelerator.prepare(
        model, optimizer, loader, eval_loader, scheduler
    )
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    session = accelerator._fault_tolerance  # read for the ledger only (the job's step number)
    rank = accelerator.process_index
    ledger = open(os.path.join(out, f"ledger.{group}.{rank}.jsonl"), "a")
    evals = open(os.path.join(out, f"eval.{group}.{rank}.jsonl"), "a")
    counts = {"train": 0, "eval": 0, "save": 0}

    def maybe_fail(phase: str) -> None:
        counts[phase] += 1
        for kill in scenario["kills"]:
            chosen = (kill["group"], kill["incarnation"], kill["phase"], kill["at"])
            if chosen != (group, incarnation, phase, counts[phase]):
                continue
            ledger.flush()
            evals.flush()
            # Every rank of the group has written what it committed before any dies.
            accelerator.wait_for_everyone()
            marker = f"killed.{group}.{incarnation}.{rank}"
            with open(os.path.join(out, marker), "w") as f:
                f.write(json.dumps({"t": time.time(), "phase": phase, "at": counts[phase]}))
            sig = signal.SIGKILL if kill["signal"] == "KILL" else signal.SIGTERM
            os.kill(os.getpid(), sig)
            time.sleep(10)  # a SIGTERM handled late: at most this long (then the agent stops it)
            os.kill(os.getpid(), signal.SIGKILL)

    accelerator.register_save_state_pre_hook(lambda *args: maybe_fail("save"))

    def save(name: str) -> None:
        accelerator.save_state(os.path.join(out, "checkpoints", name))

    window: list[list[int]] = []
    drawn_at = [0]

    def train_step(ids, x, y) -> bool:
        """One micro-batch; True when it closed a committed window."""
        maybe_fail("train")
        model.train()  # (a no-op unless the loop left it to here, as Trainer does)
        if not window:
            drawn_at[0] = session.manager.current_step() if session is not None else 0
        window.append(ids.tolist())
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            factor = accelerator.gradient_state.window_factor
            if scenario.get("clip") and accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), scenario["clip"])
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        if not accelerator.sync_gradients:
            return False
        committed = not accelerator.optimizer_step_was_skipped
        record = {
            "inc": incarnation,
            "step": drawn_at[0],
            "mbs": list(window),
            "factor": factor,
            "committed": committed,
            "epoch": loader.epoch,
            "participants": loader.participants,
        }
        ledger.write(json.dumps(record) + "\n")
        ledger.flush()
        window.clear()
        if committed:
            progress.n += 1
        if scenario["slow"] and loader.participants < groups * accelerator.num_processes:
            time.sleep(scenario["slow"])  # degraded: a restarted group comes back in time
        return committed

    def evaluate(epoch: int) -> None:
        model.eval()
        losses = []
        for _ids, x, y in eval_loader:
            maybe_fail("eval")
            with torch.no_grad():
                error = (model(x) - y).pow(2).flatten()
            losses.append(accelerator.gather_for_metrics(error))
        losses = torch.cat(losses)
        record = {"inc": incarnation, "epoch": epoch, "mse": losses.mean().item(), "n": len(losses)}
        evals.write(json.dumps(record) + "\n")
        evals.flush()

    idiom = scenario["idiom"]
    if idiom == "no_trainer":
        num_update_steps_per_epoch = -(-len(loader) // accum)
        max_train_steps = scenario.get("max_steps") or epochs * num_update_steps_per_epoch
        num_train_epochs = -(-max_train_steps // num_update_steps_per_epoch)
        completed_steps = 0
        for epoch in range(num_train_epochs):
            model.train()
            for _step, (ids, x, y) in enumerate(loader):
                train_step(ids, x, y)
                if accelerator.sync_gradients:
                    completed_steps += 1
                if completed_steps % scenario["save_every"] == 0 and accelerator.sync_gradients:
                    save(f"step_{completed_steps}")
                if completed_steps >= max_train_steps:
                    break
            evaluate(epoch)
            save(f"epoch_{epoch}")
    elif idiom == "step_total":
        stop = False
        for epoch in range(epochs):
            model.train()
            for ids, x, y in loader:
                train_step(ids, x, y)
                if scheduler.scheduler.last_epoch >= scenario["total"]:
                    stop = True
                    break
            if stop:
                break
            evaluate(epoch)
    else:
        for epoch in range(epochs):
            if not scenario.get("late_train_mode"):
                model.train()
            for ids, x, y in loader:
                train_step(ids, x, y)
            evaluate(epoch)

    weights = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
    with open(os.path.join(out, f"weights.{group}.{rank}.json"), "w") as f:
        record = {"weights": weights, "inc": incarnation, "progress": progress.n, "t": time.time()}
        record["lr"] = scheduler.get_last_lr()[0]
        json.dump(record, f)
    ledger.close()
    evals.close()
    if scenario["end_training"]:
        accelerator.end_training()


if __name__ == "__main__":
    main()
