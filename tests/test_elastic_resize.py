"""A run started on one process grows, through real launches (issue 32): the default shuffled
DataLoader of a script that saves on 1 process and resumes on 2 and on 3 with `load_state`, and a
node joining a running elastic job at world size 1, count every sample of the epoch.

One process shuffles with torch's global generator, several with a generator preparation shares
between them; the position a single process saves still replays its epoch's order on any number
(the in-process matrix of every combination is test_data_resize_matrix.py).
"""

from __future__ import annotations

import collections
import json
import signal
import textwrap

import pytest
from elastic_helpers import launch_local, start_node, stop_all, wait_until

from harness import free_port

SIZE, BATCH, SAVED_AFTER, ACCUMULATION = 96, 4, 4, 3

# The script: set_seed(0), a TensorDataset, DataLoader(batch_size=4, shuffle=True),
# Accelerator(), prepare; accumulation of 3 micro-steps, saved after 4 (inside the second window).
# "save" trains the whole epoch on one process and saves after step 4; a resume loads that
# checkpoint and trains the rest. Each rank reports its batches (sample ids) and sync flags.
SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    torch.set_num_threads(1)
    from cadence import Accelerator
    from cadence.utils import set_seed

    mode, workdir = sys.argv[1], sys.argv[2]
    set_seed(0)
    dataset = torch.utils.data.TensorDataset(torch.arange(SIZE_HERE), torch.randn(SIZE_HERE, 2))
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH_HERE, shuffle=True)
    acc = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATION_HERE)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    if mode == "resume":
        acc.load_state(os.path.join(workdir, "checkpoint"))
    batches, syncs = [], []
    for step, (ids, x) in enumerate(loader, start=1):
        with acc.accumulate(model):
            acc.backward(model(x).pow(2).mean())
            optimizer.step()
            optimizer.zero_grad()
        batches.append(ids.tolist())
        syncs.append(acc.sync_gradients)
        if mode == "save" and step == SAVED_AFTER_HERE:
            acc.save_state(os.path.join(workdir, "checkpoint"))
    report = {"batches": batches, "syncs": syncs}
    name = f"{mode}-{acc.num_processes}-{acc.process_index}.json"
    with open(os.path.join(workdir, name), "w") as f:
        json.dump(report, f)
    """
)
for _name, _value in [("SIZE", SIZE), ("BATCH", BATCH), ("SAVED_AFTER", SAVED_AFTER),
                      ("ACCUMULATION", ACCUMULATION)]:  # fmt: skip
    SCRIPT = SCRIPT.replace(f"{_name}_HERE", str(_value))


@pytest.fixture(scope="module")
def saved_on_one(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("resize")
    (workdir / "train.py").write_text(SCRIPT)
    (report,) = launch_local(workdir, 1, "save")
    return workdir, report


@pytest.mark.parametrize("processes", [2, 3])
def test_saved_on_one_process_resumes_on_more_with_every_sample_once(saved_on_one, processes):
    workdir, uninterrupted = saved_on_one
    order = [s for batch in uninterrupted["batches"] for s in batch]  # the epoch's order
    assert sorted(order) == list(range(SIZE))
    done = SAVED_AFTER * BATCH
    resumed = launch_local(workdir, processes, "resume")
    steps = len(resumed[0]["batches"])
    assert all(len(r["batches"]) == steps for r in resumed)  # even_batches: as many on every rank
    rest = [s for step in range(steps) for r in resumed for s in r["batches"][step]]
    # The rest of the epoch in its order, then even_batches' padding: the epoch's first samples.
    step_samples = processes * BATCH
    padding = -(SIZE - done) % step_samples
    assert rest == order[done:] + order[:padding]
    counts = collections.Counter(order[:done] + rest)
    assert sorted(counts) == list(range(SIZE)), "a sample of the epoch was never trained"
    assert all(counts[s] == 1 for s in order[padding:])  # nothing trained twice but the padding
    # The accumulation counter goes on from the checkpoint's (4 micro-steps): windows close every
    # 3 micro-steps of the run, and at the epoch's last batch.
    expected = [(SAVED_AFTER + i) % ACCUMULATION == 0 or i == steps for i in range(1, steps + 1)]
    assert all(r["syncs"] == expected for r in resumed)


# A node joins a job that trains at world size 1 with the default shuffled DataLoader: the job
# commits a checkpoint at the step boundary, the new round of 2 loads it with load_state() and
# finishes the epoch. Each rank logs the sample ids of every step. (Before the fix: the rest of
# epoch 0 repeated and skipped samples.)
JOIN_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    import torch
    torch.set_num_threads(1)
    from cadence import Accelerator
    from cadence.utils import ProjectConfiguration, set_seed

    project, EPOCHS, SIZE = sys.argv[1], 2, 64
    os.makedirs(project, exist_ok=True)

    class Progress:
        def __init__(self):
            self.epoch, self.step = 0, 0
        def state_dict(self):
            return {"epoch": self.epoch, "step": self.step}
        def load_state_dict(self, state):
            self.epoch, self.step = state["epoch"], state["step"]

    set_seed(0)
    config = ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True, total_limit=3)
    acc = Accelerator(cpu=True, project_config=config)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(list(range(SIZE)), batch_size=2, shuffle=True)
    model, opt, loader = acc.prepare(model, opt, loader)
    progress = Progress()
    acc.register_for_checkpointing(progress)
    if os.path.isdir(os.path.join(project, "checkpoints")):
        acc.load_state()
        if acc.is_main_process:
            print(f"resumed at epoch {progress.epoch}, world size {acc.num_processes}", flush=True)
    log = open(os.path.join(project, f"log-{acc.process_index}-{os.getpid()}.jsonl"), "a")
    while progress.epoch < EPOCHS:
        for batch in loader:
            loss = model(batch.float().unsqueeze(1)).pow(2).mean()
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            progress.step += 1
            record = {"epoch": progress.epoch, "step": progress.step, "samples": batch.tolist(),
                      "world": acc.num_processes, "rank": acc.process_index,
                      "last": loader.end_of_dataloader, "time": time.time()}
            log.write(json.dumps(record) + "\\n")
            log.flush()
            if progress.step % 4 == 0:
                acc.save_state()
            # Alone, node a trains slowly after its 4th step, so that node b joins mid-epoch.
            time.sleep(2.5 if acc.num_processes == 1 and progress.step > 4 else 0.2)
        progress.epoch += 1
    acc.save_state()  # the finished state: a restart after the end has nothing left to do
    if acc.is_main_process:
        print("finished", flush=True)
    """
)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX signals needed")
def test_a_node_joining_a_shuffled_run_trains_every_sample_once(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(JOIN_SCRIPT)
    port = free_port()

    def records() -> list[dict]:
        found = []
        for path in (tmp_path / "project").glob("log-*.jsonl"):
            found += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return sorted(found, key=lambda r: r["time"])

    first = start_node(tmp_path, port, "a", script)
    second = None
    try:
        started = lambda: len(records()) >= 4 or first.poll() is not None  # noqa: E731
        assert wait_until(started, limit=120) and first.poll() is None, (
            "node a never trained:\n" + (tmp_path / "a.out").read_text()
        )
        second = start_node(tmp_path, port, "b", script)
        assert first.wait(timeout=180) == 0, (tmp_path / "a.out").read_text()
        assert second.wait(timeout=60) == 0, (tmp_path / "b.out").read_text()
    finally:
        stop_all(first, *([second] if second else []))
    out_a = (tmp_path / "a.out").read_text()
    assert "world size 1 -> 2" in out_a, out_a
    logged = records()
    assert logged[0]["world"] == 1 and logged[-1]["world"] == 2
    joined_in = next(r["epoch"] for r in logged if r["world"] == 2)
    assert joined_in == 0, "node b joined after epoch 0: the test saw no join mid-epoch"
    for epoch in range(2):
        of_epoch = [r for r in logged if r["epoch"] == epoch]
        counts = collections.Counter(s for r in of_epoch for s in r["samples"])
        assert sorted(counts) == list(range(64)), f"epoch {epoch}: samples never trained"
        # The only repeats: even_batches' padding of the epoch's last step (at world size 2).
        padding = collections.Counter(
            s for r in of_epoch if r["last"] and r["world"] == 2 for s in r["samples"]
        )
        redone = {s: n for s, n in counts.items() if n > 1}
        assert all(n - 1 <= padding[s] for s, n in redone.items()), (
            f"epoch {epoch}: samples trained more than once: {sorted(redone)}"
        )
        assert sum(n - 1 for n in redone.values()) <= 2  # at most one batch of padding
