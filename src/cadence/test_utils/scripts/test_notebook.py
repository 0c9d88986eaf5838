"""`notebook_launcher` from a plain Python process (as in a notebook): start functions on several
CPU processes, pass arguments, report a failing worker, and refuse bad process counts.

Run it with plain `python test_notebook.py` (not under `cadence launch`)."""

from __future__ import annotations

import os
import sys

from cadence import notebook_launcher
from cadence.test_utils.scripts._checks import check

NUM_PROCESSES = int(os.environ.get("CADENCE_NOTEBOOK_PROCESSES", "2"))


def basic_function(marker_dir: str) -> None:
    """Each process writes a file named after its rank, so the parent can see who ran."""
    from cadence.runtime.state import PartialState

    state = PartialState(cpu=True)
    with open(os.path.join(marker_dir, f"rank{state.process_index}"), "w") as handle:
        handle.write(str(state.num_processes))
    state.wait_for_everyone()


def failing_function() -> None:
    """Process 1 fails; the launcher must report it."""
    if os.environ.get("RANK") == "1":
        raise ValueError("worker 1 failed on purpose")


def test_can_initialize(tmp: str) -> None:
    """Check can initialize (raises AssertionError on failure)."""
    notebook_launcher(basic_function, (tmp,), num_processes=NUM_PROCESSES)
    markers = sorted(os.listdir(tmp))
    check(markers == [f"rank{i}" for i in range(NUM_PROCESSES)], f"processes that ran: {markers}")
    for name in markers:
        with open(os.path.join(tmp, name)) as handle:
            check(handle.read() == str(NUM_PROCESSES), f"{name} saw the wrong world size")


def test_failure_is_reported() -> None:
    """Check failure is reported (raises AssertionError on failure)."""
    try:
        notebook_launcher(failing_function, num_processes=NUM_PROCESSES)
    except Exception as error:  # the launcher's error names the failing worker
        check(
            "failed" in str(error).lower() or "worker" in str(error).lower(),
            f"unclear failure: {error}",
        )
        return
    check(False, "a failing worker was not reported")


def main() -> None:
    """Run every check of this script on this process; the first failure raises."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print("Test basic notebook can be ran")
        test_can_initialize(tmp)
    if NUM_PROCESSES > 1:
        print("Test a failing worker is reported")
        test_failure_is_reported()
    print("All notebook launcher checks passed.")


if __name__ == "__main__":
    main()
    sys.exit(0)
