"""Who is in the job, as one replica group sees it: the first step's wait for every group, whether a
restarted group finds anyone that holds the job, the reports of groups lost, joined and finished,
the group that writes checkpoints, and the end of the job (a group whose script ended says so in a
step's row, step_share.py).

The session hands it each committed or discarded step's summed rows; it keeps no reference to the
session, only the Manager (for the first step's quorums) and the group's store (kept by the group's
agent across restarts: a restarted group reads there whether the job had trained).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..core.settings import env_text
from .config import FaultToleranceConfig
from .step_share import checkpoint_writer, contributors, finished, membership_reports

# Set in the group's store once the group commits a step: a restarted group then knows the job
# has trained, and must heal from a group that holds it.
PROGRESS_KEY = "cadence_ft_committed"


def say(text: str) -> None:
    """A quorum report: one line on stdout, flushed, with the prefix the launcher's lines carry."""
    print(f"cadence fault tolerance: {text}", flush=True)


class JobLost(RuntimeError):
    """Every replica group was lost at once after the job trained: nobody holds its state."""


class Membership:
    """One replica group's view of the job's groups (see the module docstring).

    Args:
        config: the resolved fault-tolerance settings.
        group_rank: this process's rank in its group (rank 0 reports).
        manager: torchft's Manager of this group.
        store: the group's store at its root (a function: made on first use).
    """

    def __init__(
        self,
        config: FaultToleranceConfig,
        group_rank: int,
        manager: Any,
        store: Callable[[], Any],
    ) -> None:
        self.config = config
        self.group_rank = group_rank
        self.manager = manager
        self._store = store
        self.restarted = int(env_text("TORCHELASTIC_RESTART_COUNT", "0") or "0") > 0
        # Whether the job had committed steps before this group's processes restarted.
        self.job_had_trained = self.restarted and bool(store().check([PROGRESS_KEY]))
        self.members: frozenset[int] | None = None  # the contributors of the last committed step
        self.writer: int | None = None  # the group that writes checkpoints (checkpoint_writer)
        # A group's script ended (it said so in a step's row): the job's training is over, and
        # training passes draw nothing, so no group trains past the job's last step.
        self.job_finished = False
        self.all_finished = False  # every group of the job said its script ended

    def wait_for_every_group(self) -> None:
        """Before the job's first commit, quorum again until every group of the job is in it.

        A group that started late would otherwise find the others' steps committed without it (or
        the others finished) and, with no peer ahead to heal from, train the same samples again.
        Bounded by the quorum timeout; past it the groups present go on (and say so)."""
        groups = self.config.replica_groups
        if not groups or self.manager.current_step() != 0:
            return
        deadline = time.monotonic() + self.config.quorum_timeout
        said = False
        while self.manager.num_participants() < groups:  # bounded by the deadline
            if time.monotonic() > deadline:
                if self.restarted:
                    # A restarted group alone at the job's step 0: the others finished (or are
                    # gone for good); training the epoch from its start would repeat their steps.
                    raise RuntimeError(
                        f"replica group {self.config.replica_group} restarted but found no other "
                        f"group within {self.config.quorum_timeout:g} s: they finished, or are "
                        "gone, and nobody is ahead of it to heal from, so it does not train the "
                        "epoch again from its start. Restart the job from its last checkpoint "
                        "if training is not complete"
                    )
                if self.group_rank == 0:
                    say(
                        f"replica group {self.config.replica_group} starts with "
                        f"{self.manager.num_participants()} of {groups} groups after "
                        f"{self.config.quorum_timeout:g} s (the others heal when they join)"
                    )
                return
            if not said and self.group_rank == 0:
                say(
                    f"replica group {self.config.replica_group} waits for all {groups} groups "
                    "to start before the first step"
                )
                said = True
            time.sleep(0.2)
            self.manager.start_quorum()

    def check_someone_holds_the_job(self, committed_steps: int) -> None:
        """A restarted group that found every group at the job's first step although the job had
        trained: every group was lost, nobody holds the trained state, and training again from
        the start would train every sample again. Stop, saying what to do.

        Raises:
            JobLost: as said.
        """
        if self.job_had_trained and committed_steps == 0 and self.manager.current_step() == 0:
            raise JobLost(
                f"replica group {self.config.replica_group} restarted after the job had committed "
                "steps, and no group that holds them is left (every replica group was lost at "
                "once): training again from the first step would train every sample twice. "
                "Restart the job from its last checkpoint (save_state / load_state); keep the "
                "groups on separate machines so one failure cannot take them all"
            )

    def note_step(
        self, summed: list[float], step: int, committed: bool, first_commit: bool, finishing: bool
    ) -> None:
        """A step closed with the rows `summed`: report who joined, left or finished, choose the
        checkpoint writer, and mark the job as trained in the group's store at its first commit."""
        groups = self.config.replica_groups
        if committed and first_commit and self.group_rank == 0:
            self._store().set(PROGRESS_KEY, "1")
        if not groups:
            return
        self._note_finished(summed, groups, step, finishing)
        if committed:
            self._note_members(frozenset(contributors(summed, groups)), step)
            self.writer = checkpoint_writer(summed, groups)

    def _note_finished(self, summed: list[float], groups: int, step: int, finishing: bool) -> None:
        done = finished(summed, groups)
        if not done:
            return
        present = set(contributors(summed, groups)) | set(done)
        self.all_finished = present <= set(done) and len(present) == groups
        if not self.job_finished and not finishing:
            self.job_finished = True
            if self.group_rank == 0:
                names = ", ".join(str(g) for g in done)
                say(
                    f"replica group {names} finished its script at step {step}; replica group "
                    f"{self.config.replica_group} trains no further step (its loops run to their "
                    "end without drawing batches)"
                )

    def _note_members(self, members: frozenset[int], step: int) -> None:
        before, self.members = self.members, members
        if self.group_rank == 0:
            for line in membership_reports(
                before, members, self.config.replica_group, self.config.replica_groups, step
            ):
                say(line)

    def writes_checkpoints(self, catching_up: bool, fallback: Callable[[], bool]) -> bool:
        """Whether this group writes `save_state`: every group holds the same committed state, so
        one writes it: the first group of the last committed step that never restarted
        (`checkpoint_writer`: its script's own counters, which may name the checkpoint, are the
        job's); before any commit, `fallback()`; never a restarted group still passing through
        what the job did before it came back (`catching_up`)."""
        if catching_up:
            return False
        if self.writer is not None:
            return self.writer == self.config.replica_group
        return fallback()

    def say_waiting(self, step: int) -> None:
        """Why the quorum of `step` is late (said by the quorum watchdog)."""
        if self.group_rank == 0:
            say(
                f"replica group {self.config.replica_group} waits for a quorum at step {step}: "
                f"fewer than min_replicas={self.config.min_replicas} groups are alive (or the "
                f"Lighthouse at {self.config.lighthouse} is unreachable); training resumes when "
                f"enough groups are back, or fails after {self.config.quorum_timeout:g} s"
            )
