"""What `cadence launch` gives each process: ranks and world size consistent with the process
state, and a device of the requested kind. Run under `cadence launch`."""

from __future__ import annotations

import os

import torch

from cadence.runtime.state import PartialState
from cadence.test_utils.scripts._checks import check


def main() -> None:
    """Run every check of this script on this process; the first failure raises."""
    state = PartialState()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    check(
        state.num_processes == world,
        f"{state.num_processes} processes in the state, WORLD_SIZE={world}",
    )
    check(state.process_index == int(os.environ.get("RANK", "0")), "process index is RANK")
    check(
        state.local_process_index == int(os.environ.get("LOCAL_RANK", "0")),
        "local index is LOCAL_RANK",
    )
    if torch.cuda.is_available() and state.device.type == "cuda":
        check(state.device.index == state.local_process_index, f"process uses {state.device}")
    if state.is_main_process:
        print(
            f"{state.num_processes} process(es) on {state.device.type}; CUDA available: {torch.cuda.is_available()}"
        )
        print("The launcher set up every process correctly.")


if __name__ == "__main__":
    main()
