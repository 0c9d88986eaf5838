"""A run started on one process grows, through real launches (issue 32): the default shuffled
DataLoader of a script that saves on 1 process and resumes on 2 and on 3 with `load_state`, and a
node joining a running elastic job at world size 1, count every sample of the epoch.

One process shuffles with torch's global generator, several with a generator preparation shares
between them; the position a single process saves still replays its epoch's order on any number
(the in-process matrix of every combination is test_data_resize_matrix.py).
"""

from __future__ import annotations

import collections
import textwrap

import pytest
from elastic_helpers import launch_local

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
