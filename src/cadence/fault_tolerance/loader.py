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

    Args:
        data_loader: the user's DataLoader (its dataset, batch size, collate function and whether
            it shuffles are used; its sampler's generator seed, when it has one, seeds the order).
        device: where batches go (None: left where the collate function put them).
        begin_step: the session's call that opens (or returns) the current step's `StepView`.
    """

    def __init__(
        self,
        data_loader: Any,
        device: torch.device | None,
        begin_step: Callable[[], StepView],
    ) -> None:
        batch_size = getattr(data_loader, "batch_size", None)
        if batch_size is None:
            raise ValueError(
                "fault tolerance needs a DataLoader with a batch_size (a batch_sampler cannot be "
                "re-cut by the exactly-once cursor); pass batch_size=... to the DataLoader"
            )
        self.data_loader = data_loader
        self.dataset = data_loader.dataset
        self.batch_size = int(batch_size)
        self.collate_fn = data_loader.collate_fn
        self.device = device
        sampler = getattr(data_loader, "sampler", None)
        self.shuffle = isinstance(sampler, torch.utils.data.RandomSampler)
        generator = getattr(sampler, "generator", None)
        self.seed = generator.initial_seed() if generator is not None else 0
        self._begin_step = begin_step
        self.epoch = 0
        self.cursor = 0  # committed samples of this epoch
        self._pending = 0  # samples drawn by the open step (not yet committed)
        self._order: torch.Tensor | None = None
        self._order_epoch = -1
        self.last_indices: list[int] = []  # the dataset indices of the batch last yielded
        self.participants = 0  # participating ranks of the step last drawn

    def __len__(self) -> int:
        """Batches of this rank in an epoch when the quorum stays as it is now (an estimate)."""
        per_step = self.batch_size * max(self.participants, 1)
        return -(-len(self.dataset) // per_step)

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` (its own seeded order) at its beginning."""
        if epoch != self.epoch:
            self.epoch, self.cursor, self._pending = epoch, 0, 0

    def _epoch_order(self) -> torch.Tensor:
        if self._order_epoch != self.epoch:
            size = len(self.dataset)
            if self.shuffle:
                generator = torch.Generator().manual_seed(self.seed + self.epoch)
                self._order = torch.randperm(size, generator=generator)
            else:
                self._order = torch.arange(size)
            self._order_epoch = self.epoch
        assert self._order is not None
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
            pieces = torch.tensor_split(order[start:], view.participants)
            chosen = pieces[view.index]
            self._pending += remaining
        return chosen.tolist()

    def __iter__(self) -> Iterator[Any]:
        if self.cursor >= len(self.dataset):  # a finished epoch: the next one starts
            self.set_epoch(self.epoch + 1)
        # Bounded: every committed step advances the cursor by at least one sample; a discarded
        # step is redrawn, as often as the quorum discards (each discard is reported).
        while self.cursor + self._pending < len(self.dataset):
            view = self._begin_step()
            self.participants = view.participants
            indices = self._slice(view)
            if not indices:  # fewer tail samples than ranks: this rank sits the step out
                raise RuntimeError(
                    f"the epoch's last {len(self.dataset) - self.cursor} samples are fewer than the "
                    f"{view.participants} participating ranks; use a dataset length that is a "
                    "multiple of the ranks (docs: Training through failures, limits)"
                )
            self.last_indices = indices
            batch = self.collate_fn([self.dataset[i] for i in indices])
            yield send_to_device(batch, self.device) if self.device is not None else batch

    def end_step(self, committed: bool) -> None:
        """The step closed: its samples are consumed when `committed`, drawn again otherwise."""
        if committed:
            self.cursor += self._pending
        self._pending = 0

    def state_dict(self) -> dict[str, int]:
        """The position a healing group receives: the epoch and its committed cursor."""
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Join at the given epoch and cursor (a heal, or a checkpoint)."""
        self.epoch, self.cursor, self._pending = int(state["epoch"]), int(state["cursor"]), 0
