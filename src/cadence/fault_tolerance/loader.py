"""The exactly-once loader: the epoch's seeded order consumed through one cursor that only committed
steps advance.

Each step the quorum's participating ranks take consecutive slices of the next
`participants x batch_size` samples, in the order of their participating rank (replica rank x ranks
per group + rank in the group). A step the quorum does not commit leaves the cursor where it was,
so its samples are drawn again; a group that heals receives the cursor with the weights.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..runtime.collectives import send_to_device
from .loader_source import read_source

# Micro-steps of slack in `len()` before the first step, for steps discarded in an epoch (two
# membership changes of two discarded steps each).
DISCARD_SLACK = 4


@dataclass(frozen=True)
class StepView:
    """What one step's quorum says about this rank's share of the data."""

    participants: int  # participating ranks across the quorum (groups x ranks per group)
    index: int  # this rank's participating index
    # The most ranks any step of the job can have (every group back); 0: `participants`.
    most: int = 0


class CursorLoader:
    """Iterates the wrapped DataLoader's dataset in its seeded order, `batch_size` samples per rank
    per micro-step, through the global cursor (see the module docstring).

    The epoch's order is the one torch's DataLoader draws from the same generators (so a checkpoint
    resumes in a run without fault tolerance, and the other way round): its state is a prepared
    dataloader's position (issue 24's format: epoch, generator states at the epoch's start and the
    samples consumed over all processes), the global count being the committed cursor.

    **Passes.** Each `for batch in loader` is a pass. A pass started while the prepared model is in
    training mode, or over a loader an optimizer step has closed a step of, is a training pass, cut
    by the cursor; another one started after `model.eval()` is an evaluation pass: each replica group reads the whole dataset over its own processes (as a
    DataLoader prepared without fault tolerance on the group's processes would), so a group lost
    during an evaluation costs the others nothing, and every group computes the same numbers. The
    loader counts its passes; a restarted group's script starts again at its first line, and the
    heal tells it how many passes the job has finished (`line_up`): it passes through those
    without yielding (its script's loops run through the epochs the job finished without training
    or evaluating twice; transformers' Trainer gets one stand-in batch that trains nothing, see
    `_stand_in`) and continues the job's current pass at the cursor.

    Args:
        data_loader: the user's DataLoader (see loader_source.py for what it may be).
        device: where batches go (None: left where the collate function put them).
        begin_step: the session's call that opens (or returns) the current step's `StepView`.
        gradient_state: the Accelerator's GradientState: this loader is its active dataloader
            while iterated, and says when it yields the epoch's last batch (`end_of_dataloader`),
            so a last, shorter accumulation window still steps (and commits) as Accelerate's does.
        training: whether a pass starting now is a training pass (the prepared models' mode).
        finished: whether the job's training is over (a group's script ended): training passes
            then yield nothing, so no group draws past the job's last committed step.
        group_loader: makes the DataLoader an evaluation pass iterates: the user's, prepared over
            this group's processes.
        phantom: called before a pass the job finished yields its one stand-in batch to a
            training loop that stops at an empty pass (transformers' Trainer: see `_stand_in`);
            the session then trains nothing with it.
    """

    end_of_dataloader = False
    remainder = -1  # no padding: the epoch's tail is shared out, never repeated

    def __init__(
        self,
        data_loader: Any,
        device: torch.device | None,
        begin_step: Callable[[], StepView],
        gradient_state: Any = None,
        *,
        training: Callable[[], bool] = lambda: True,
        finished: Callable[[], bool] = lambda: False,
        group_loader: Callable[[], Iterable[Any]] | None = None,
        phantom: Callable[[], None] | None = None,
    ) -> None:
        source = read_source(data_loader)
        self.data_loader = data_loader
        self.dataset = source.dataset
        self.batch_size = source.batch_size
        self.shuffle = source.shuffle
        self.drop_last = source.drop_last
        self.collate_fn = source.collate_fn
        self.device = device
        # torch's DataLoader draws its base seed from its own generator at each pass, then the
        # RandomSampler its permutation (and, once exhausted, one more it discards).
        self.sampler_generator: torch.Generator | None = source.sampler_generator
        self.loader_generator: torch.Generator | None = source.loader_generator
        self._begin_step = begin_step
        self.gradient_state = gradient_state
        self._training = training
        self._finished = finished
        self._make_group_loader = group_loader
        self._group_loader: Iterable[Any] | None = None
        self._phantom = phantom
        self.epoch = 0
        self.cursor = 0  # committed samples of this epoch
        self._pending = 0  # samples drawn by the open step (not yet committed)
        self._order: torch.Tensor | None = None  # this epoch's order, once drawn
        self._start_states: list[torch.Tensor] | None = None  # generators before it was drawn
        self.last_indices: list[int] = []  # the dataset indices of the batch last yielded
        self.participants = 0  # participating ranks of the step last drawn
        self.passes = 0  # passes this script started over the loader
        self.trains = False  # an optimizer step closed during one of its training passes
        self.iterating = False  # inside a training pass
        self.evaluating = False  # inside an evaluation pass
        self._skip_through = 0  # passes up to this one the job finished before a heal
        self._live_from = 0  # the first pass this group runs with the job
        # What gather_for_metrics returned in each evaluation pass, by pass: a restarted group
        # replays the passes the job evaluated before it came back with these results.
        self.gathered: dict[int, list[Any]] = {}
        self._replay: list[Any] | None = None  # the results of the pass being replayed

    def __len__(self) -> int:
        """Batches of this rank in an epoch when the quorum stays as it is now (an estimate).

        Before the first step (when scripts size their loops) it is the most a rank can draw:
        every batch of the epoch alone, plus `DISCARD_SLACK` micro-steps of accumulation for
        discarded steps, whose samples are drawn again (transformers' Trainer draws at most this
        many batches an epoch). Every group reads the same number then, restarted or not."""
        per_step = self.batch_size * max(self.participants, 1)
        size = len(self.dataset)
        batches = size // per_step if self.drop_last else -(-size // per_step)
        if self.participants == 0:
            steps = getattr(self.gradient_state, "num_steps", 1) or 1
            batches += DISCARD_SLACK * steps
        return batches

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
        """Start `epoch` at its beginning (its order drawn from the generators as they stand).

        Ignored while a restarted group's script passes through what the job did: the heal has
        put the loader at the job's epoch."""
        if self.passes < self._live_from:
            return
        if epoch != self.epoch and self._order is not None and 0 < self.cursor < len(self._order):
            # Every sample of an epoch is trained once: one left behind would never be.
            raise RuntimeError(
                f"set_epoch({epoch}) while epoch {self.epoch} of this fault-tolerant DataLoader "
                f"has {len(self._order) - self.cursor} of its {len(self._order)} samples left to "
                "train: a replica group's share of an epoch changes with the groups present and "
                "with discarded steps (drawn again), so a loop that draws a fixed number of "
                "batches per epoch can run out before the epoch does. Iterate the DataLoader to "
                "its end each epoch (docs: Training through failures, limits)"
            )
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

    def _slice(self, view: StepView) -> list[int] | None:
        """This rank's share of the step's samples; None when drop_last drops the epoch's tail."""
        order = self._epoch_order()
        start = self.cursor + self._pending
        remaining = len(order) - start
        full = view.participants * self.batch_size
        # A tail the next step might not share out is taken now: fewer samples than the most
        # ranks the job can have, since a group may come back for that step (a rank then takes
        # at most ceil((most - 1) / participants) samples more than its batch). So every step
        # after a committed one starts with no samples or at least `most`.
        most = max(view.most, view.participants)
        absorbs = not self.drop_last and 0 < remaining - full < most
        if remaining >= full and not absorbs:
            lo = start + view.index * self.batch_size
            chosen = order[lo : lo + self.batch_size]
            self._pending += full
        elif self.drop_last:
            # Every rank of the step sees the same numbers: all drop the tail together.
            self.cursor, self._pending = len(order), 0
            return None
        else:  # the epoch's tail: shared out as evenly as it goes (sizes differ by one at most)
            if remaining < view.participants:  # only a dataset smaller than the ranks
                # Every rank sees the same numbers, so every rank refuses together (none hangs).
                raise RuntimeError(
                    f"rank {view.index} of {view.participants} participating: the epoch's last "
                    f"{remaining} samples are fewer than the participating ranks (the dataset "
                    f"has {len(order)} samples), so some rank would train on nothing and the step "
                    "could not be exact; use a dataset with at least as many samples as the "
                    "job's ranks, or drop_last=True (docs: Training through failures, limits)"
                )
            pieces = torch.tensor_split(order[start:], view.participants)
            chosen = pieces[view.index]
            self._pending += remaining
        return chosen.tolist()

    def _last_of_epoch(self, view: StepView) -> bool:
        """Whether the batch just drawn is the epoch's last (unless its step is discarded)."""
        left = len(self.dataset) - self.cursor - self._pending
        if self.drop_last:
            return left < view.participants * self.batch_size
        return left <= 0

    def __iter__(self) -> Iterator[Any]:
        self.passes += 1
        # A loader the optimizer has stepped over stays a training loader (transformers' Trainer
        # calls model.train() only once a batch is drawn); another follows the model's mode.
        training = self.trains or self._training()
        if self.passes <= self._skip_through:
            # The job finished this pass before this group came back: a training pass yields
            # nothing; an evaluation pass runs again with the job's gathered results.
            if not training and self.passes in self.gathered:
                yield from self._evaluation_pass(replay=self.gathered[self.passes])
            elif training:
                yield from self._stand_in()
            return
        if self._finished() and training:
            return  # a group's script ended: nobody trains past the job's last step
        if not training:
            yield from self._evaluation_pass()
            return
        if self.cursor >= len(self.dataset):  # a finished epoch: the next one starts
            self.set_epoch(self.epoch + 1)
        self._pending = 0  # a pass left without a commit (an interrupted loop) draws them again
        self.end_of_dataloader = False
        self.iterating = True
        if self.gradient_state is not None:
            self.gradient_state._add_dataloader(self)
        try:
            # Bounded: every committed step advances the cursor by at least one sample; a
            # discarded step is redrawn, as often as the quorum discards (each one is reported).
            while self.cursor + self._pending < len(self.dataset):
                if self._finished():
                    return  # another group's script ended: nobody draws past its last step
                view = self._begin_step()
                if self.passes <= self._skip_through:
                    yield from self._stand_in()  # the heal just said the job finished this pass
                    return
                self.participants = view.participants
                indices = self._slice(view)
                if indices is None:
                    return  # drop_last: the tail is dropped
                self.last_indices = indices
                # The epoch's last batch unless its step is discarded (then it is drawn again).
                self.end_of_dataloader = self._last_of_epoch(view)
                batch = self.collate_fn([self.dataset[i] for i in indices])
                yield send_to_device(batch, self.device) if self.device is not None else batch
        finally:
            self.iterating = False
            if self.gradient_state is not None:
                self.gradient_state._remove_dataloader(self)

    def _stand_in(self) -> Iterator[Any]:
        """What a training pass the job finished before this group came back yields: nothing,
        except to a loop that ends its training at a pass without batches (transformers' Trainer:
        "There seems not to be a single sample in your epoch_iterator, stopping training"), which
        gets one batch of the dataset's first samples that trains nothing (the session's
        `phantom` step: no backward, no quorum, the optimizer step skipped), so that its loop
        passes through the epoch as the script's own loops do."""
        if self._phantom is None or not _drawn_by_trainer(sys._getframe(1)):
            return
        self._phantom()
        self.end_of_dataloader = True
        batch = self.collate_fn(
            [self.dataset[i] for i in range(min(self.batch_size, len(self.dataset)))]
        )
        yield send_to_device(batch, self.device) if self.device is not None else batch

    def _evaluation_pass(self, replay: list[Any] | None = None) -> Iterator[Any]:
        """The whole dataset over this group's processes (see the class docstring); with `replay`,
        `gather_for_metrics` returns those results, in order, instead of gathering."""
        if self._make_group_loader is None:
            raise RuntimeError(
                "this fault-tolerant DataLoader was iterated while the prepared model is in eval "
                "mode, but it has no group loader for an evaluation pass"
            )
        if self._group_loader is None:
            self._group_loader = self._make_group_loader()
        self.evaluating = True
        self._replay = list(replay) if replay is not None else None
        if replay is None:
            self.gathered[self.passes] = []
        try:
            yield from self._group_loader
        finally:
            self.evaluating = False
            self._replay = None

    def evaluation_gather(self, gather: Callable[[], Any]) -> Any:
        """`gather_for_metrics` in this loader's evaluation pass: `gather()`'s result, kept for a
        group that comes back later; in a replayed pass, the job's result instead.

        Raises:
            RuntimeError: a replayed pass gathers more often than the job's pass did.
        """
        if self._replay is not None:
            if not self._replay:
                raise RuntimeError(
                    "this replica group's script, restarted, gathers more results in an "
                    "evaluation pass the job finished before it came back than the job did: its "
                    "evaluation loop differs from the other groups' (docs: Training through "
                    "failures)"
                )
            kept = self._replay.pop(0)  # kept on the CPU; returned where batches go, as live
            return send_to_device(kept, self.device) if self.device is not None else kept
        result = gather()
        self.gathered.setdefault(self.passes, []).append(_kept(result))
        return result

    # -- passes: a restarted group's script lines up with the job's ----------------------------------
    def pass_record(self) -> dict[str, Any]:
        """Where this loader's passes stand, for a group that heals from this one (with the
        results its evaluation passes gathered)."""
        gathered = {n: list(results) for n, results in self.gathered.items()}
        return {
            "passes": self.passes,
            "iterating": self.iterating,
            "trains": self.trains,
            "gathered": gathered,
        }

    def check_passes(self, record: dict[str, Any], group: int) -> None:
        """Refuse a peer's `pass_record` this script cannot line up with (before a heal changes
        anything).

        Raises:
            RuntimeError: this script has started more passes over the loader than the job (its
                loops differ from the other groups'): it cannot train in step with them.
        """
        live = int(record["passes"])  # the job's current pass, or its last finished one
        if self.passes > live:
            raise RuntimeError(
                f"replica group {group}'s script has started {self.passes} passes over a "
                f"prepared DataLoader, the job it heals into only {live}: the groups' training "
                "loops differ (a script whose loops depend on something other than its prepared "
                "objects, such as the time or a per-process setting, cannot be lined up). Run the "
                "same loops on every group (docs: Training through failures)"
            )

    def line_up(self, record: dict[str, Any]) -> None:
        """Take the job's pass count from a peer's `pass_record` (checked by `check_passes`): the
        passes the job finished are passed through without yielding; the pass it is in continues
        at the cursor."""
        done = int(record["passes"]) - bool(record["iterating"])
        self._skip_through = done
        self._live_from = done + 1 if record["iterating"] else done
        self.trains = self.trains or bool(record.get("trains"))
        # The job's results of the passes this group missed; its own of those it evaluated.
        for number, results in record.get("gathered", {}).items():
            self.gathered.setdefault(int(number), list(results))

    def behind(self) -> bool:
        """Whether this group's script has not yet reached the job's pass over this loader."""
        return self.passes < self._live_from

    def end_step(self, committed: bool) -> None:
        """The step closed: its samples are consumed when `committed`, drawn again otherwise."""
        if committed:
            self.cursor += self._pending
        self._pending = 0
        self.trains = self.trains or self.iterating

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


def _drawn_by_trainer(frame: Any) -> bool:
    """Whether the generator whose frame called this draws for transformers' Trainer (its
    `get_batch_samples`, a few frames up through the prepared DataLoader's wrappers)."""
    for _ in range(6):  # bounded: the Trainer's draw is within a few frames of the loader
        frame = frame.f_back if frame is not None else None
        if frame is None:
            return False
        module = frame.f_globals.get("__name__", "")
        if frame.f_code.co_name == "get_batch_samples" and module.startswith("transformers."):
            return True
    return False


def _kept(result: Any) -> Any:
    """A gathered result as kept for a replay: tensors detached, on the CPU, copied."""
    if isinstance(result, torch.Tensor):
        return result.detach().to("cpu", copy=True)
    if isinstance(result, (list, tuple)):
        kept = [_kept(item) for item in result]
        return type(result)(kept) if isinstance(result, list) else tuple(kept)
    if isinstance(result, dict):
        return {key: _kept(value) for key, value in result.items()}
    return result
