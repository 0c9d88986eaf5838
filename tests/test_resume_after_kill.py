"""A 2-process job SIGKILLed mid-training and resumed from its newest checkpoint ends with weights
bit-identical to a run that never stopped (sequential and shuffled data, accumulation, fp16 scaler).

Each step trains on a batch of a sequential loader and one of a shuffled loader together, so one run
checks the resume of both orders: a loader resumed at a wrong position (or with a wrong shuffle)
changes the samples of the steps after the kill and so the final weights, whichever loader it is.
(The two orders used to be two parametrizations of three and four launches, with the same kill and
resume in each; one run killed twice covers both in four.)"""

import os
import subprocess
import sys
import textwrap

import torch

from harness import free_port

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    from cadence import Accelerator, GradScalerKwargs, ProjectConfiguration

    project_dir, kill_at = sys.argv[1], int(sys.argv[2])

    class Progress:
        def __init__(self):
            self.epoch = 0
        def state_dict(self):
            return {"epoch": self.epoch}
        def load_state_dict(self, state):
            self.epoch = state["epoch"]

    torch.manual_seed(0)
    acc = Accelerator(
        gradient_accumulation_steps=2,
        mixed_precision="fp16",
        project_config=ProjectConfiguration(project_dir, automatic_checkpoint_naming=True, total_limit=2),
        kwargs_handlers=[GradScalerKwargs(init_scale=512.0, growth_interval=3)],
    )
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(80, 4, generator=generator)
    y = x.sum(dim=1, keepdim=True)
    dataset = torch.utils.data.TensorDataset(x, y)
    sequential = torch.utils.data.DataLoader(dataset, batch_size=4, shuffle=False)
    shuffled = torch.utils.data.DataLoader(dataset, batch_size=4, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.8)
    model, optimizer, sequential, shuffled, scheduler = acc.prepare(
        model, optimizer, sequential, shuffled, scheduler
    )
    progress = Progress()
    acc.register_for_checkpointing(progress)
    checkpoints = os.path.join(project_dir, "checkpoints")
    if os.path.isdir(checkpoints) and os.listdir(checkpoints):
        acc.load_state()

    def in_step(first, second):
        # Both loaders in step, then each iterated to its end: zip alone leaves the second one
        # suspended at its last batch, and a prepared loader ends its epoch at the next() after it.
        first, second = iter(first), iter(second)
        yield from zip(first, second)
        for rest in (first, second):
            for _ in rest:
                pass

    micro_steps = 0
    while progress.epoch < 3:
        for (x1, y1), (x2, y2) in in_step(sequential, shuffled):
            x, y = torch.cat([x1, x2]), torch.cat([y1, y2])
            with acc.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                acc.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            micro_steps += 1
            if acc.sync_gradients and micro_steps % 4 == 0:
                acc.save_state()
            if micro_steps == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        progress.epoch += 1
    if acc.is_main_process:
        torch.save(acc.unwrap_model(model).state_dict(), os.path.join(project_dir, "final.pt"))
    """
)


def launch(tmp_path, project_dir, kill_at):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
         str(script), str(project_dir), str(kill_at)],
        capture_output=True, text=True, timeout=180,
        env=dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=""),  # CPU workers
    )  # fmt: skip


# Kill points count the micro-steps of each launch: (9, 19) kills the first launch at micro-step 9
# (newest checkpoint after 8), then the run resumed from it at its own micro-step 19 (27 of the
# whole run, in the last of the three epochs of 10), and the third launch finishes: two kills in one
# run, mid-epoch in the first epoch and in a later one, for both loaders.
def test_killed_and_resumed_run_matches_the_uninterrupted_one(tmp_path):
    kill_points = [9, 19]
    reference_dir = tmp_path / "reference"
    result = launch(tmp_path, reference_dir, -1)
    assert result.returncode == 0, result.stderr[-3000:]
    expected = torch.load(reference_dir / "final.pt")
    project = tmp_path / "killed"
    for kill_at in kill_points:
        killed = launch(tmp_path, project, kill_at)
        assert killed.returncode != 0
        assert not (project / "final.pt").exists()
    resumed = launch(tmp_path, project, -1)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = torch.load(project / "final.pt")
    for key in expected:
        assert torch.equal(expected[key], final[key]), (kill_points, key)
