"""What a replica group's session does for the script's own loops: its prepared DataLoaders and
their passes, the evaluations it runs and a restarted group replays, and the end of its script
(telling the other groups, so that none trains past the job's last step).

`ScriptSide` is a base of `FaultTolerantSession` (session.py), which holds the step's life; the
attributes below are the session's.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..core.settings import env_text
from .config import FaultToleranceConfig
from .loader import CursorLoader, StepView
from .membership import Membership, say

# How long a group whose script ended waits for lost groups to come back and finish with it.
FINISH_WAIT = 60.0


class ScriptSide:
    """The script-facing half of the session (see the module docstring)."""

    config: FaultToleranceConfig
    group_rank: int
    manager: Any
    membership: Membership
    models: list[torch.nn.Module]
    optimizers: list[Any]
    loaders: list[CursorLoader]
    counters: list[Any]
    _closed: bool
    _finishing: bool
    begin_step: Callable[..., StepView]
    commit: Callable[[], bool]
    shutdown: Callable[[], None]
    _heal: Any
    # The batch drawn last is a stand-in (loader.py `_stand_in`): its step trains nothing.
    phantom_step = False

    @property
    def job_finished(self) -> bool:
        """A group's script ended: no group trains past the job's last step (membership.py)."""
        return self.membership.job_finished

    def wrap_loader(
        self,
        data_loader: Any,
        device: torch.device | None,
        gradient_state: Any = None,
        group_loader: Callable[[], Iterable[Any]] | None = None,
    ) -> CursorLoader:
        """The exactly-once loader over `data_loader`'s dataset (see loader.py); `group_loader`
        makes what an evaluation pass iterates (the DataLoader prepared over this group)."""
        loader = CursorLoader(
            data_loader,
            device,
            self.begin_step,
            gradient_state,
            training=self._models_training,
            finished=lambda: self.job_finished,
            group_loader=group_loader,
            phantom=self._start_phantom,
        )
        self.loaders.append(loader)
        # Prepared after this restarted group healed (transformers' Trainer prepares a DataLoader
        # for each evaluation): it lines up with the job's loader prepared in the same place.
        self._heal.line_up_later(loader, len(self.loaders) - 1)
        return loader

    def _start_phantom(self) -> None:
        self.phantom_step = True

    def end_phantom(self) -> bool:
        """The optimizer step of a stand-in batch: nothing to average, nothing commits (the
        optimizer reports a skipped step); the step leaves no trace in the job."""
        self.phantom_step = False
        for loader in self.loaders:
            loader.end_step(False)
        return False

    def trains_nothing(self) -> bool:
        """Whether the batch in hand is a stand-in, whose backward pass is skipped."""
        return self.phantom_step

    def cuts(self, active_loader: Any) -> bool:
        """Whether `active_loader` (the dataloader being iterated) is one of this session's
        exactly-once loaders, whose batches are cut over every group's ranks."""
        return any(active_loader is loader for loader in self.loaders)

    def _models_training(self) -> bool:
        """Whether a pass starting now trains: the prepared models are in training mode."""
        return not self.models or any(model.training for model in self.models)

    def attach_counter(self, counter: Any) -> None:
        """A counter of the script's progress (with `state_dict` / `load_state_dict`; the
        accumulation counter): a healing group receives it."""
        self.counters.append(counter)

    def evaluation_gather(self, gather: Callable[[], Any]) -> Any:
        """`gather_for_metrics` outside the cursor: in an evaluation pass, kept (or, in a pass a
        restarted group replays, the job's result); elsewhere `gather()` as it is."""
        for loader in self.loaders:
            if loader.evaluating:
                return loader.evaluation_gather(gather)
        return gather()

    def finish(self) -> None:
        """This group's script ended: say so to the groups still training, then leave.

        The group takes part in the next steps without contributing (zeros in its gradients' place,
        a row that says it finished), so a group still training, one that came back and whose own
        counters lag, stops drawing instead of training alone after the job's last step. It ends
        when every group of the job has finished, or after `FINISH_WAIT` seconds: a group lost
        near the end and restarted by its agent heals from it, passes through its script (every
        training pass yields nothing, every evaluation is replayed) and finishes with the others.
        Groups that end together spend one all-reduce on it.
        """
        if self._closed:
            return
        if self.catching_up():
            # Its loops stopped before reaching the job's (transformers' Trainer stops at an epoch
            # that yields nothing): saying "finished" would end the job for every group.
            self.shutdown()
            raise RuntimeError(
                f"replica group {self.config.replica_group}: the script, restarted, ended while "
                "passing through the epochs the job had finished before the group came back (a "
                "training loop that stops at an epoch without batches, as transformers' Trainer "
                "does, cannot be lined up with the job). The group leaves the job; the others go "
                "on. Write the loop as in docs: Training through failures, 'Scripts as you write "
                "them'"
            )
        if self.optimizers and self.config.replica_groups and self.manager.current_step() > 0:
            deadline = time.monotonic() + min(self.config.quorum_timeout, FINISH_WAIT)
            self._finishing = True
            try:
                # Bounded: each round ends within the cross-group or the quorum timeout, and the
                # rounds by the deadline.
                while not self.membership.all_finished and time.monotonic() < deadline:
                    self.commit()
                    if not self.membership.all_finished:
                        time.sleep(0.2)  # a group is missing: its agent may be restarting it
            except Exception as error:  # the others see this group leave instead
                if self.group_rank == 0:
                    say(
                        f"replica group {self.config.replica_group} could not tell the others it "
                        f"finished ({error!r}); they see it leave"
                    )
            finally:
                self._finishing = False
        self.shutdown()

    def _finish_at_exit(self) -> None:
        # Only a script that ended well finishes; one that failed must look lost (and heal).
        if env_text("CADENCE_SCRIPT_EXIT_CODE") == "0":
            try:
                self.finish()
            except RuntimeError as error:  # the script's end is not the job's: a failed exit
                print(f"cadence fault tolerance: {error}", file=sys.stderr, flush=True)
                os._exit(1)
        elif not self._closed:
            self.shutdown()

    def catching_up(self) -> bool:
        """Whether this group's script, restarted, is still passing through what the job did."""
        return any(loader.behind() for loader in self.loaders)
