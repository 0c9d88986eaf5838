"""A loader's position as a place in the epoch's global order, so an epoch continues on another
number of processes.

Every process draws the same seeded order of the whole epoch, cut into *source batches* (the batches
of the batch sampler before sharding): without `split_batches` process i of n takes source batches
i, i + n, ...; with it, every source batch is cut into n parts. So after k batches handed out per
process, n * k (or k) source batches of the epoch are consumed over all processes. The position records
that global count (and the samples it holds); on m processes the epoch resumes by dropping that many
samples of the same order and sharding the rest over the m processes, under the same `even_batches` /
`drop_last` rules. On the same number of processes the per-process count is used as before, so an
exact resume stays bit-identical, padding included.

Every process draws the same order, but not always from the same generator: on several processes a
random sampler shuffles with the generator preparation gave it (shared by all ranks), on one process
it has none and shuffles with torch's global generator, as the unprepared DataLoader does. The
position says which (`GLOBAL_ORDER_KEY`): an epoch whose order came from the global generator is
replayed from the global generator's saved state on any number of processes, the sampler's own
generator set aside while the order is drawn (and untouched by it); the epochs after draw as the
resuming loader always does.

Exactness needs an order that can be replayed without running the data: a map-style dataset under a
(batch) sampler. An iterable dataset, or a dispatching loader, resumes only on the number of
processes that saved it (a clear error otherwise).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

import torch
from torch.utils.data import BatchSampler

from .samplers import SkipBatchSampler, draws_from_global_rng, get_sampler
from .sharding import BatchSamplerShard, IterableDatasetShard

GLOBAL_KEY = "global"
# Set in a mid-epoch position whose epoch order was drawn from torch's global generator.
GLOBAL_ORDER_KEY = "order_from_global_rng"


def _batch_sampler(loader: Any) -> Any:
    sampler = loader.sampler if isinstance(loader.sampler, BatchSampler) else loader.batch_sampler
    while isinstance(sampler, SkipBatchSampler):
        sampler = sampler.batch_sampler
    return sampler


def loader_layout(loader: Any) -> dict[str, Any]:
    """How `loader` cuts the epoch's order: kind ("batches", "iterable", "dispatch"), number of
    processes, split_batches and the source batch size."""
    if hasattr(loader, "slice_fn"):  # a dispatching loader: the main process reads for all
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        return {
            "kind": "dispatch",
            "num_processes": world,
            "split_batches": bool(loader.split_batches),
        }
    if isinstance(loader.dataset, IterableDatasetShard):
        dataset = loader.dataset
        return {
            "kind": "iterable",
            "num_processes": dataset.num_processes,
            "split_batches": bool(dataset.split_batches),
        }
    if isinstance(loader.dataset, torch.utils.data.IterableDataset):
        return {"kind": "iterable", "num_processes": 1, "split_batches": False}
    sampler = _batch_sampler(loader)
    if isinstance(sampler, BatchSamplerShard):
        return {
            "kind": "batches",
            "num_processes": sampler.num_processes,
            "split_batches": bool(sampler.split_batches),
            "source_batch_size": sampler.batch_size,
        }
    return {
        "kind": "batches",
        "num_processes": 1,
        "split_batches": False,
        "source_batch_size": getattr(sampler, "batch_size", None),
    }


def global_record(loader: Any, yielded: int, source_offset: int) -> dict[str, Any]:
    """The epoch's progress over all processes: source batches and samples handed out."""
    layout = loader_layout(loader)
    per_batch = 1 if layout["split_batches"] else layout["num_processes"]
    source = source_offset + yielded * per_batch
    size = layout.get("source_batch_size")
    layout["source_batches"] = int(source)
    layout["samples"] = int(source * size) if isinstance(size, int) else None
    return layout


def needs_global_resume(loader: Any, state: dict[str, Any]) -> bool:
    """Whether `state` must resume from its global count: saved by a loader cut over another number
    of processes (or split otherwise), or already resumed that way (its per-process count is then
    not the whole story)."""
    saved = state.get(GLOBAL_KEY)
    if not isinstance(saved, dict):
        return False
    layout = loader_layout(loader)
    if saved.get("num_processes") != layout["num_processes"] or bool(
        saved.get("split_batches")
    ) != bool(layout["split_batches"]):
        return True
    per_batch = 1 if saved.get("split_batches") else saved.get("num_processes", 1)
    return saved.get("source_batches") != state.get("batches_yielded", 0) * per_batch


def resharded(loader: Any, state: dict[str, Any]) -> dict[str, Any]:
    """`state` (saved on another number of processes) as a resume of this loader: no per-process
    skip, `source_skip` source batches of the epoch's global order dropped before sharding."""
    saved, layout = state[GLOBAL_KEY], loader_layout(loader)
    if saved.get("kind") != "batches" or layout["kind"] != "batches":
        raise ValueError(
            f"This dataloader state was saved on {saved.get('num_processes')} process(es) and this "
            f"loader runs on {layout['num_processes']}: a {saved.get('kind')} loader (iterable "
            "dataset or dispatch_batches) can only resume on the number of processes that saved it, "
            "because its order cannot be replayed without reading the data. Resume on "
            f"{saved.get('num_processes')} process(es), or use a map-style dataset."
        )
    state = dict(state)
    state["batches_yielded"] = 0
    if not state.get("in_epoch"):
        return state
    samples, size = saved.get("samples"), layout.get("source_batch_size")
    if not isinstance(samples, int) or not isinstance(size, int):
        raise ValueError(
            f"This dataloader state was saved mid-epoch on {saved.get('num_processes')} "
            f"process(es) and this loader runs on {layout['num_processes']}, but its batch sampler "
            "has no fixed batch_size, so the samples of the epoch already trained cannot be counted "
            f"from its batches. Resume on {saved.get('num_processes')} process(es), or give the "
            "batch sampler a fixed `batch_size`."
        )
    if samples % size:
        raise ValueError(
            f"This dataloader state was saved after {samples} samples of the epoch on "
            f"{saved.get('num_processes')} process(es); this loader's batches of {size} samples "
            "cannot continue from there. Keep the batch size per step such that the samples "
            "already seen are a whole number of batches (or resume on the same number of processes)."
        )
    state["source_skip"] = samples // size
    return state


class SourceResumeSkip:
    """Index sampler of the iterator that resumes an epoch on another number of processes: the first
    `skip` source batches of the epoch's order are dropped, the rest is sharded as usual (and the
    padding of `even_batches`, as in any epoch, repeats the epoch's first samples).

    The loader sets `skip` to 0 once its iterator is built, like samplers.ResumeSkip.
    """

    def __init__(self, index_sampler: Any, skip: int) -> None:
        self.index_sampler = index_sampler
        self.skip = skip

    def __iter__(self) -> Iterator[Any]:
        sampler = self.index_sampler
        if not self.skip:
            return iter(sampler)
        if isinstance(sampler, BatchSamplerShard):
            # The shard skips them itself, so that even_batches still pads from the epoch's start.
            shard = copy.copy(sampler)
            shard.source_skip = self.skip
            return iter(shard)
        return islice(iter(sampler), self.skip, None)

    def __len__(self) -> int:
        return len(self.index_sampler)


def adopt_generators(loader: Any, names: list[str]) -> None:
    """Give a loader the shuffling generator a checkpoint names when it has none of its own.

    On one process a RandomSampler without generator shuffles with torch's global generator; on
    several, preparation gives it a generator shared by all ranks ("synchronized"). A state saved on
    several processes resumes on one by giving the sampler such a generator, so that this epoch and
    the following ones draw the orders the saved run would have drawn.
    """
    if "synchronized" not in names or getattr(loader, "synchronized_generator", None) is not None:
        return
    sampler = get_sampler(loader)
    if sampler is None or not hasattr(sampler, "generator") or sampler.generator is not None:
        return
    generator = torch.Generator()
    sampler.generator = generator
    loader.synchronized_generator = generator


def order_from_global_rng(state: dict[str, Any]) -> bool:
    """Whether a mid-epoch position's order was drawn from torch's global generator: it says so, or
    (a position saved before it said so) it names no sampler generator but the global state."""
    if "torch_rng_state" not in state:
        return False
    names = set(state.get("generator_names") or ())
    return bool(state.get(GLOBAL_ORDER_KEY)) or not names & {"synchronized", "sampler"}


def draw_from_global_rng(loader: Any) -> Callable[[], None]:
    """Set aside the sampler's own generator, so that the epoch's order is drawn from torch's global
    generator as the loader that saved the position drew it (on one process); returns the function
    that puts it back once the order is drawn (a random sampler draws it when it starts)."""
    sampler = get_sampler(loader)
    if sampler is None or not hasattr(sampler, "generator") or draws_from_global_rng(sampler):
        return _nothing
    own = sampler.generator
    sampler.generator = None

    def put_back() -> None:
        sampler.generator = own

    return put_back


def _nothing() -> None:
    return None
