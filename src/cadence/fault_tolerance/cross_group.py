"""The cross-group all-reduce of a step: a sum over the quorum's participants on the process group
the session gave torchft's Manager, with the Manager's rules for a failure.

torchft's `Manager.allreduce` wraps each collective in a chain of futures, a Python callback and a
timer thread's entry, which on steps of a few milliseconds cost as much as the collective itself
(benchmarks/bench_fault_tolerance.py). The session owns the process group the Manager reconfigures at
each quorum, so it calls it directly and keeps the Manager's semantics: no collective once the
step has errored; a group torchft does not count as a participant (healing) sends zeros; a failed
collective is reported to the Manager (`report_error`), so the commit vote discards the step; an
average divides the sum by the quorum's participant count. The collective's own timeout (the
process group's, `FaultToleranceConfig.timeout`) bounds every wait.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

Finish = Callable[[], None]


class StepQuorum(NamedTuple):
    """The open step's quorum as this group sees it, read once per step (each read of torchft's
    Manager waits on its quorum future under a profiler range)."""

    participants: int  # the replica groups torchft averages and votes over
    participating: bool  # False while this group heals: it sends zeros


class CrossGroupReduce:
    """Sums (or averages) tensors in place across the replica groups of the current quorum.

    Args:
        manager: torchft's Manager (the quorum: participants, errors).
        process_group: the process group the Manager was built with (reconfigured by it).
    """

    def __init__(self, manager: Any, process_group: Any) -> None:
        from torch.distributed import AllreduceOptions, ReduceOp

        self.manager = manager
        self.process_group = process_group
        self._sum = AllreduceOptions()
        self._sum.reduceOp = ReduceOp.SUM

    def quorum(self) -> StepQuorum:
        """The open step's quorum (waits for it if it is still forming)."""
        return StepQuorum(self.manager.num_participants(), self.manager.is_participating())

    def start(self, tensor: torch.Tensor, quorum: StepQuorum, average: bool = True) -> Finish:
        """Start the collective on `tensor` over `quorum` (this step's); the returned function
        waits for it (and divides, for an average). After a failure the tensor holds garbage and
        the step must be discarded: the Manager knows (its `errored()`), and the vote says so."""
        manager = self.manager
        if manager.errored() is not None:
            return _nothing  # torchft's rule: after the step's first error, no more collectives
        participants = quorum.participants
        if not quorum.participating:
            tensor.zero_()  # a healing group adds nothing to the sum
        try:
            work = self.process_group.allreduce([tensor], self._sum)
        except Exception as error:  # a process group torchft could not configure, a dead peer
            manager.report_error(error)
            return _nothing

        def finish() -> None:
            try:
                work.wait()
            except Exception as error:  # a peer lost during the collective, or its timeout
                manager.report_error(error)
                return
            if average:
                tensor.div_(participants)

        return finish


def _nothing() -> None:
    return None
