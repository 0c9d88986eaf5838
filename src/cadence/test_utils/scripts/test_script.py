"""The main end-to-end script: process control, splitting work between processes, RNG
synchronisation, dataloader sharding, training that matches one-process training, triggers,
gather_for_metrics and re-creating the state objects.

Run it on any number of processes: `cadence launch --num_processes 2 --cpu test_script.py`.
"""

from __future__ import annotations

import copy

import torch
from torch.utils.data import DataLoader

from cadence import Accelerator
from cadence.runtime.state import AcceleratorState, GradientState, PartialState
from cadence.test_utils.scripts._checks import check
from cadence.test_utils.training import RegressionDataset, RegressionModel
from cadence.utils import gather, gather_object, set_seed, synchronize_rng_states


def process_execution_check(accelerator: Accelerator) -> None:
    """on_main_process / on_process / on_last_process run exactly where they say."""
    ran = []

    @accelerator.on_main_process
    def on_main() -> None:
        ran.append("main")

    @accelerator.on_last_process
    def on_last() -> None:
        ran.append("last")

    @accelerator.on_process(process_index=0)
    def on_zero() -> None:
        ran.append("zero")

    on_main()
    on_last()
    on_zero()
    expected = []
    if accelerator.is_main_process:
        expected += ["main"]
    if accelerator.is_last_process:
        expected += ["last"]
    if accelerator.process_index == 0:
        expected += ["zero"]
    check(ran == expected, f"process-execution decorators ran {ran}, expected {expected}")


def split_between_processes_check(accelerator: Accelerator) -> None:
    """Each process gets a contiguous slice; together the slices are the whole input."""
    n = accelerator.num_processes
    items = list(range(2 * n + 1))
    with accelerator.split_between_processes(items) as mine:
        pieces = gather_object([mine])
    flat = [item for piece in pieces for item in piece]
    check(flat == items, f"split_between_processes pieces {pieces} do not make up {items}")
    sizes = [len(piece) for piece in pieces]
    check(max(sizes) - min(sizes) <= 1, f"split sizes {sizes} differ by more than one")
    tensor = torch.arange(2 * n, device=accelerator.device)
    with accelerator.split_between_processes(tensor) as mine:
        whole = gather(mine)
    check(whole.tolist() == tensor.tolist(), "split_between_processes of a tensor")


def rng_sync_check(accelerator: Accelerator) -> None:
    """After synchronize_rng_states, every process draws the same random numbers."""
    torch.manual_seed(1234 + accelerator.process_index)  # different on purpose
    synchronize_rng_states(["torch"])
    draws = gather(torch.rand(3, device=accelerator.device).reshape(1, 3))
    check(
        all(torch.equal(draws[0], row) for row in draws), f"RNG not synchronised: {draws.tolist()}"
    )


def dataloader_sharding_check(accelerator: Accelerator, length: int) -> None:
    """The shards of a prepared dataloader cover the dataset; gather_for_metrics drops the
    samples repeated to even out the last batch."""
    loader = accelerator.prepare(DataLoader(list(range(length)), batch_size=4))
    seen = []
    metrics = []
    for batch in loader:
        seen += gather(batch).tolist()
        metrics += accelerator.gather_for_metrics(batch).tolist()
    check(sorted(set(seen)) == list(range(length)), f"sharding lost samples: {sorted(set(seen))}")
    check(sorted(metrics) == list(range(length)), f"gather_for_metrics gave {sorted(metrics)}")


def training_check(accelerator: Accelerator) -> None:
    """Training with the batch split over the processes gives the parameters of training on the
    whole batch in one process."""
    n = accelerator.num_processes
    per_process = 4
    dataset = RegressionDataset(length=per_process * n * 6, seed=42)
    set_seed(42)
    baseline = RegressionModel()
    model = copy.deepcopy(baseline)
    base_optimizer = torch.optim.SGD(baseline.parameters(), lr=0.1)
    base_loader = DataLoader(dataset, batch_size=per_process * n)
    for batch in base_loader:
        loss = torch.nn.functional.mse_loss(baseline(batch["x"]), batch["y"])
        loss.backward()
        base_optimizer.step()
        base_optimizer.zero_grad()

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(dataset, batch_size=per_process)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    trained = accelerator.unwrap_model(model)
    for name in ("a", "b"):
        got, want = getattr(trained, name).item(), getattr(baseline, name).item()
        check(
            abs(got - want) < 1e-5,
            f"parameter {name}: {got} after distributed training, {want} on one process",
        )


def trigger_check(accelerator: Accelerator) -> None:
    """A trigger set by one process is seen by all, then reset."""
    if accelerator.process_index == accelerator.num_processes - 1:
        accelerator.set_trigger()
    check(accelerator.check_trigger(), "the trigger set by the last process was not seen")
    check(not accelerator.check_trigger(), "the trigger was not reset after being checked")


def reinstantiated_state_check() -> None:
    """Creating the state objects again returns the same shared state."""
    first, second = PartialState(), PartialState()
    check(first.process_index == second.process_index, "PartialState is shared")
    check(AcceleratorState().device == first.device, "AcceleratorState shares the device")


def main() -> None:
    """Run every check of this script on this process; the first failure raises."""
    accelerator = Accelerator(cpu=True)
    state = accelerator.state
    if accelerator.is_local_main_process:
        print("**Initialization**")
        print(state)
    for name, run in (
        ("process execution", lambda: process_execution_check(accelerator)),
        ("split_between_processes", lambda: split_between_processes_check(accelerator)),
        ("RNG synchronisation", lambda: rng_sync_check(accelerator)),
        (
            "dataloader sharding (even)",
            lambda: dataloader_sharding_check(accelerator, 8 * accelerator.num_processes),
        ),
        (
            "dataloader sharding (uneven)",
            lambda: dataloader_sharding_check(accelerator, 8 * accelerator.num_processes + 1),
        ),
        ("training equivalence", lambda: training_check(accelerator)),
        ("trigger", lambda: trigger_check(accelerator)),
        ("re-instantiated state", reinstantiated_state_check),
    ):
        if accelerator.is_local_main_process:
            print(f"**Test {name}**")
        run()
    accelerator.wait_for_everyone()
    if accelerator.is_local_main_process:
        print("All checks of test_script passed.")
    accelerator.end_training()
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def _mp_fn(index: int) -> None:
    """Entry point for spawn-based launchers (one call per process)."""
    main()


if __name__ == "__main__":
    main()
