"""A fault-tolerant training script for tests/test_fault_tolerance.py (run by `cadence launch
--fault_tolerance`). Writes, per replica group, a ledger line per step: the incarnation, whether the
step committed, and the sample ids this rank trained; at the end the final weights.

Environment knobs: FT_OUT (folder), FT_KILL_GROUP / FT_KILL_AT (SIGKILL that group's first
incarnation before drawing that step's batch), FT_SAMPLES, FT_BATCH, FT_SLOW_ALONE (seconds to
sleep per step while fewer groups than the job's train, so a restarted group can return),
FT_KILL_IN_ALLREDUCE (with FT_KILL_GROUP / FT_KILL_AT: the victim SIGKILLs itself inside the
gradient all-reduce, after its collective started), FT_SAVE_DEGRADED (save_state into FT_OUT/ckpt
at the first step committed with fewer groups than the job's after the kill), FT_RESUME (load_state from there
first; the script also runs under a plain `cadence launch`, as one group), FT_ACCUM (gradient
accumulation steps), FT_MLP (an MLP of that width instead of the linear model), FT_GATHER
(gather_for_metrics of each step's ids, inputs and ids as objects, into the ledger; and once after
the first step closed, where it is refused: FT_OUT/gather_refused.GROUP), FT_GATHER_FROM (gathering
starts once the job has committed that many steps, 0 by default: the job's count, which a restarted
group receives with its heal, so every group gathers at the same steps, as collectives must be), FT_MOMENTUM (SGD's
momentum: optimizer state that a healing group receives), FT_FSDP2 (shard the model with FSDP2
inside each group: `FullyShardedDataParallelPlugin(fsdp_version=2)`; the weights written are the
full ones), FT_UNPREPARED (the script's own batches instead of a prepared DataLoader, FT_SAMPLES //
FT_BATCH steps of the job: each step opens at the optimizer step, so a returning group heals after
its gradients were computed; FT_UNPREPARED=model: the model is not prepared either), FT_CLIP
(clip_grad_norm_ to that norm before each optimizer step), FT_TWO_BACKWARDS (each micro-batch
as two half losses, two backward passes).
"""

import copy
import json
import os
import pickle
import signal
import time

import torch

from cadence import Accelerator, FullyShardedDataParallelPlugin


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
    ft = json.loads(os.environ["CADENCE_LAUNCH_CONFIG"]).get("fault_tolerance")
    group, groups = (ft["replica_group"], ft["replica_groups"]) if ft else (0, 1)
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
    if os.environ.get("FT_MLP"):  # the benchmark's model: an MLP of FT_MLP hidden units
        hidden = int(os.environ["FT_MLP"])
        model = torch.nn.Sequential(
            torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
            torch.nn.ReLU(), torch.nn.Linear(hidden, 1),
        )  # fmt: skip
    else:
        model = torch.nn.Linear(4, 1)
    momentum = float(os.environ.get("FT_MOMENTUM", "0"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=momentum)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.99)
    loader = torch.utils.data.DataLoader(
        Indexed(int(os.environ.get("FT_SAMPLES", "64"))),
        batch_size=int(os.environ.get("FT_BATCH", "2")),
        shuffle=True,
        generator=torch.Generator().manual_seed(1),
    )
    fsdp = {}
    if os.environ.get("FT_FSDP2"):  # in code: the launcher's --use_fsdp excludes --cpu
        fsdp["fsdp_plugin"] = FullyShardedDataParallelPlugin(fsdp_version=2)
    accelerator = Accelerator(
        cpu=True, gradient_accumulation_steps=int(os.environ.get("FT_ACCUM", "1")), **fsdp
    )
    unprepared = bool(os.environ.get("FT_UNPREPARED"))
    if os.environ.get("FT_UNPREPARED") == "model":
        optimizer, scheduler = accelerator.prepare(optimizer, scheduler)
    elif unprepared:
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    else:
        model, optimizer, scheduler, loader = accelerator.prepare(
            model, optimizer, scheduler, loader
        )
    if os.environ.get("FT_RESUME"):
        accelerator.load_state(os.environ["FT_RESUME"])
    if accelerator.num_processes == 1 and os.environ.get("FT_UNPREPARED") != "model":
        # The session's hooks on the prepared model survive what users do with it: an EMA's copy,
        # pickling (the training below runs on the original).
        pickle.loads(pickle.dumps(copy.deepcopy(model)))
    session = accelerator._fault_tolerance  # the test hook below reaches the cross-group reduce
    if session is not None and os.environ.get("FT_KILL_IN_ALLREDUCE"):
        start = session.reducer.start

        def start_then_die(tensor, *args, **kwargs):
            finish = start(tensor, *args, **kwargs)  # the collective is under way
            if group == kill_group and incarnation == 0 and steps == kill_at:
                # Whether this step commits is the survivors' to say: the test reads their ledger.
                killed = {"killed_in_allreduce": True, "ids": loader.last_indices}
                ledger.write(json.dumps(killed) + "\n")
                ledger.close()
                with open(os.path.join(out, "killed_at"), "w") as f:
                    f.write(str(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            return finish

        session.reducer.start = start_then_die
    saved = False
    ledger = open(os.path.join(out, f"ledger.{group}.{accelerator.process_index}.jsonl"), "a")
    steps = 0
    in_allreduce = bool(os.environ.get("FT_KILL_IN_ALLREDUCE"))
    gather_from = int(os.environ.get("FT_GATHER_FROM", "0"))
    refused_once = incarnation > 0  # the first incarnation checks the refusal once
    if unprepared:
        data, size = loader.dataset, loader.batch_size
        total = len(data) // size

        def own_batches():  # the job's step picks the batch (a healed group jumps with it)
            for _ in range(4 * total):  # bounded; ends once the job committed `total` steps
                done = session.manager.current_step() if session is not None else steps
                if done >= total:
                    return
                ids = torch.arange(done * size, (done + 1) * size)
                yield ids, data.x[ids], data.y[ids]

        loader = own_batches()
    for ids, x, y in loader:  # bounded: the loader ends when the epoch's cursor is at its end
        if not in_allreduce and group == kill_group and incarnation == 0 and steps == kill_at:
            ledger.close()
            # Every rank of the group has written its last step before any dies: the first death
            # makes the agent stop the others, which could lose a rank's record of a committed step.
            accelerator.wait_for_everyone()
            with open(os.path.join(out, "killed_at"), "w") as f:
                f.write(str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        gathered = None
        done = session.manager.current_step() if session is not None else steps  # the job's
        gather = bool(os.environ.get("FT_GATHER")) and done >= gather_from
        if gather:  # the step's global batch: every participating rank's ids, x and objects
            try:
                ids_all, x_all = accelerator.gather_for_metrics((ids, x))
                objects = accelerator.gather_for_metrics(ids.tolist(), use_gather_object=True)
                gathered = {"ids": ids_all.tolist(), "x": x_all.tolist(), "objects": objects}
            except RuntimeError as error:  # a group lost during the gather: said, not silent
                gathered = {"error": str(error)}
        with accelerator.accumulate(model):  # FT_ACCUM micro-batches per optimizer step
            if os.environ.get("FT_TWO_BACKWARDS"):  # two half losses, two backward passes
                half = len(x) // 2
                for part in (slice(0, half), slice(half, None)):
                    loss = torch.nn.functional.mse_loss(model(x[part]), y[part])
                    accelerator.backward(loss / 2)
            else:
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
            if os.environ.get("FT_CLIP") and accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), float(os.environ["FT_CLIP"]))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        if gather and not refused_once:  # the step closed: refused
            refused_once = True
            try:
                accelerator.gather_for_metrics(y)
            except RuntimeError as error:
                with open(os.path.join(out, f"gather_refused.{group}"), "w") as f:
                    f.write(str(error))
        steps += 1
        participants = accelerator.num_processes
        if ft:
            participants = session.manager.num_participants() if unprepared else loader.participants
        record = {
            "incarnation": incarnation,
            "committed": not accelerator.optimizer_step_was_skipped,
            "synced": accelerator.sync_gradients,  # the window's last micro-batch
            "ids": ids.tolist(),
            "participants": participants,
            "step": scheduler.scheduler.last_epoch,  # committed steps so far
            "lr": scheduler.get_last_lr()[0],
            "t": time.time(),
        }
        if gathered is not None:
            record["gathered"] = gathered
        if session is not None:  # steps drawn on the previous quorum, so far
            record["overlapped"] = session.overlapped_steps
            record["reused"] = session.reused_steps
            record["early"] = session.early_steps
        ledger.write(json.dumps(record) + "\n")
        ledger.flush()
        full = groups * accelerator.num_processes  # participating ranks with every group in
        degraded = record["committed"] and participants < full
        degraded = degraded and os.path.exists(os.path.join(out, "killed_at"))  # after the kill
        if os.environ.get("FT_SAVE_DEGRADED") and degraded and not saved:
            accelerator.save_state(os.path.join(out, "ckpt"))
            saved = True
            ledger.write(json.dumps({"saved_at_step": record["step"]}) + "\n")
            ledger.flush()
        if slow_alone and participants < full:
            time.sleep(slow_alone)
    # FSDP2's parameters are shards (DTensors): gather the full ones (a collective of the group).
    tensors = [getattr(p, "full_tensor", p.detach)() for p in model.parameters()]
    weights = torch.cat([t.detach().flatten() for t in tensors]).tolist()
    with open(os.path.join(out, f"weights.{group}.{accelerator.process_index}.json"), "w") as f:
        json.dump({"weights": weights, "incarnation": incarnation, "steps": steps}, f)
    accelerator.end_training()


if __name__ == "__main__":
    main()
