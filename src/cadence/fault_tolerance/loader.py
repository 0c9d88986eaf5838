"""The exactly-once loader: the epoch's seeded order consumed through one cursor that only committed
steps advance.

Each step the quorum's participating ranks take consecutive slices of the next
`participants x batch_size` samples, in the order of their participating rank (replica rank x ranks
per group + rank in the group). A step the quorum does not commit leaves the cursor where it was,
so its samples are drawn again; a group that heals receives the cursor with the weights.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..runtime.collectives import send_to_device


@dataclass(frozen=True)
class StepView:
    """What one step's quorum says about this rank's share of the data."""

    participants: int  # participating ranks across the quorum (groups x ranks per group)
    index: int  # this rank's participating index


class CursorLoader:
    """Iterates the wrapped DataLoader's dataset in its seeded order, `batch_size` samples per rank
    per micro-step, through the global cursor (see the module docstring).

    The epoch's order is the one torch's DataLoader draws from the same generators (so a checkpoint
    resumes in a run without fault tolerance, and the other way round): its state is a prepared
    dataloader's position (issue 24's format: epoch, generator states at the epoch's start and the
    samples consumed over all processes), the global count being the committed cursor.

    Args:
        data_loader: the user's DataLoader (its dataset, batch size, collate function, sampler and
            generators are used).
        device: where batches go (None: left where the collate function put them).
        begin_step: the session's call that opens (or returns) the current step's `StepView`.
        gradient_state: the Accelerator's GradientState: this loader is its active dataloader
            while iterated, and says when it yields the epoch's last batch (`end_of_dataloader`),
            so a last, shorter accumulation window still steps (and commits) as Accelerate's does.
    """

    end_of_dataloader = False
    remainder = -1  # no padding: the epoch's tail is shared out, never repeated

    def __init__(
        self,
        data_loader: Any,
        device: torch.device | None,
        begin_step: Callable[[], StepView],
        gradient_state: Any = None,
    ) -> None:
        batch_size = getattr(data_loader, "batch_size", None)
        if batch_size is None:
            raise ValueError(
                "fault tolerance needs a DataLoader with a batch_size (a batch_sampler cannot be "
                "re-cut by the exactly-once cursor); pass batch_size=... to the DataLoader"
            )
        sampler = getattr(data_loader, "sampler", None)
        self.shuffle = isinstance(sampler, torch.utils.data.RandomSampler)
        if not self.shuffle and not isinstance(sampler, torch.utils.data.SequentialSampler):
            raise ValueError(
                f"fault tolerance cuts the epoch's order itself: a DataLoader with a "
                f"{type(sampler).__name__} cannot be re-cut; use shuffle=True (with a generator) "
                "or shuffle=False"
            )
        if self.shuffle and getattr(sampler, "generator", None) is None:
            raise ValueError(
                "fault tolerance needs the shuffled order to be the same on every replica group: "
                "pass generator=torch.Generator().manual_seed(SEED) to the DataLoader"
            )
        self.data_loader = data_loader
        self.dataset = data_loader.dataset
        self.batch_size = int(batch_size)
        self.collate_fn = data_loader.collate_fn
        self.device = device
        # torch's DataLoader draws its base seed from its own generator at each pass, then the
        # RandomSampler its permutation (and, once exhausted, one more it discards).
        self.sampler_generator: torch.Generator | None = getattr(sampler, "generator", None)
        self.loader_generator: torch.Generator | None = getattr(data_loader, "generator", None)
        self._begin_step = begin_step
        self.gradient_state = gradient_state
        self.epoch = 0
        self.cursor = 0  # committed samples of this epoch
        self._pending = 0  # samples drawn by the open step (not yet committed)
        self._order: torch.Tensor | None = None  # this epoch's order, once drawn
        self._start_states: list[torch.Tensor] | None = None  # generators before it was drawn
        self.last_indices: list[int] = []  # the dataset indices of the batch last yielded
        self.participants = 0  # participating ranks of the step last drawn

    def __len__(self) -> int:
        """Batches of this rank in an epoch when the quorum stays as it is now (an estimate)."""
        per_step = self.batch_size * max(self.participants, 1)
        return -(-len(self.dataset) // per_step)

    def _generators(self) -> list[torch.Generator]:
        found: list[torch.Generator] = []
        for generator in (self.sampler_generator, self.loader_generator):
            if generator is not None and all(generator is not g for g in found):
                found.append(generator)
        return found

    def _generator_names(self, processes: int) -> list[str]:
        # The names a prepared DataLoader on `processes` processes gives them (data/position.py).
        names = []
        if self.sampler_generator is not None:
            names.append("synchronized" if processes > 1 else "sampler")
        if (
            self.loader_generator is not None
            and self.loader_generator is not self.sampler_generator
        ):
            names.append("loader")
        return names

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` at its beginning (its order drawn from the generators as they stand)."""
        if epoch != self.epoch:
            self.epoch, self.cursor, self._pending = epoch, 0, 0
            self._order, self._start_states = None, None

    def _epoch_order(self) -> torch.Tensor:
        if self._order is None:
            size = len(self.dataset)
            self._start_states = [g.get_state() for g in self._generators()]
            if self.loader_generator is not None:
                torch.empty((), dtype=torch.int64).random_(generator=self.loader_generator)
            if self.shuffle:
                self._order = torch.randperm(size, generator=self.sampler_generator)
                torch.randperm(size, generator=self.sampler_generator)
            else:
                self._order = torch.arange(size)
        return self._order

    def _slice(self, view: StepView) -> list[int]:
        order = self._epoch_order()
        start = self.cursor + self._pending
        remaining = len(order) - start
        full = view.participants * self.batch_size
        if remaining >= full:
            lo = start + view.index * self.batch_size
            chosen = order[lo : lo + self.batch_size]
            self._pending += full
        else:  # the epoch's tail: shared out as evenly as it goes (sizes differ by one at most)
            if remaining < view.participants:
                # Every rank sees the same numbers, so every rank refuses together (none hangs).
                raise RuntimeError(
                    f"rank {view.index} of {view.participants} participating: the epoch's last "
                    f"{remaining} samples are fewer than the participating ranks, so some rank "
                    "would train on nothing and the step could not be exact; use a dataset whose "
                    "length leaves no such tail (a multiple of the batch size times every "
                    "possible rank count) or drop the tail (docs: Training through failures, limits)"
                )
            pieces = torch.tensor_split(order[start:], view.participants)
            chosen = pieces[view.index]
            self._pending += remaining
        return chosen.tolist()

    def __iter__(self) -> Iterator[Any]:
        if self.cursor >= len(self.dataset):  # a finished epoch: the next one starts
            self.set_epoch(self.epoch + 1)
        self._pending = 0  # a pass left without a commit (an interrupted loop) draws them again
        self.end_of_dataloader = False
        if self.gradient_state is not None:
            self.gradient_state._add_dataloader(self)
        try:
            # Bounded: every committed step advances the cursor by at least one sample; a
            # discarded step is redrawn, as often as the quorum discards (each one is reported).
            while self.cursor + self._pending < len(self.dataset):
                view = self._begin_step()
                self.participants = view.participants
                indices = self._slice(view)
                self.last_indices = indices
                # The epoch's last batch unless its step is discarded (then it is drawn again).
                self.end_of_dataloader = self.cursor + self._pending >= len(self.dataset)
                batch = self.collate_fn([self.dataset[i] for i in indices])
                yield send_to_device(batch, self.device) if self.device is not None else batch
        finally:
            if self.gradient_state is not None:
                self.gradient_state._remove_dataloader(self)

    def end_step(self, committed: bool) -> None:
        """The step closed: its samples are consumed when `committed`, drawn again otherwise."""
        if committed:
            self.cursor += self._pending
        self._pending = 0

    def state_dict(self) -> dict[str, Any]:
        """The committed position, as a prepared dataloader's (a heal, or `save_state`)."""
        from ..data.position import STATE_VERSION  # deferred: the data package's position format

        processes = max(self.participants, 1)
        epoch, cursor = self.epoch, self.cursor
        if self._order is not None and cursor >= len(self.dataset):  # finished: the next epoch
            epoch, cursor, states = epoch + 1, 0, [g.get_state() for g in self._generators()]
        elif self._start_states is not None:
            states = [s.clone() for s in self._start_states]
        else:
            states = [g.get_state() for g in self._generators()]
        size = self.batch_size
        return {
            "version": STATE_VERSION,
            "epoch": epoch,
            "batches_yielded": cursor // (size * processes),
            "in_epoch": cursor > 0,
            "generator_names": self._generator_names(processes),
            "generator_states": states,
            "global": {
                "kind": "batches",
                "num_processes": processes,
                "split_batches": False,
                "source_batch_size": size,
                "source_batches": cursor // size,
                "samples": cursor,
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Join at the saved epoch and committed sample count (a heal, or a checkpoint written with
        or without fault tolerance); the epoch's order is drawn again from the saved generators."""
        record = state.get("global") or {}
        if not state.get("in_epoch"):
            cursor = 0
        elif isinstance(record.get("samples"), int):
            cursor = int(record["samples"])
        else:
            raise ValueError(
                "this dataloader position records no global sample count (saved by an older "
                "Cadence): fault tolerance resumes only from a position that has one"
            )
        generators = self._generators()
        states = list(state.get("generator_states") or [])
        if len(states) != len(generators):
            raise ValueError(
                f"this dataloader position holds {len(states)} generator states, the fault-tolerant "
                f"loader has {len(generators)} (a DataLoader prepared differently?)"
            )
        for generator, saved in zip(generators, states):
            generator.set_state(saved)
        self.epoch, self.cursor, self._pending = int(state["epoch"]), cursor, 0
        self._order, self._start_states = None, None
