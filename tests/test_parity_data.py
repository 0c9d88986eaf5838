"""Parity with the reference (issue 12): dataloaders.

Iterable datasets whose batches hold Python objects (one process, and dispatched on two), the
`base_dataloader` of prepared loaders, pickling a prepared loader, the "round multiple" error of
`split_batches`, and the torchdata `StatefulDataLoader` layout of a stateful loader's state dict.
Multi-process behaviour runs on 2 real gloo processes (tests/harness.py).
"""

from __future__ import annotations

import pickle

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset


class Tagged(IterableDataset):
    """Samples {"x": tensor([i]), "meta": "s<i>"}: the default collate makes "meta" a list of strings."""

    def __init__(self, length: int = 5) -> None:
        self.length = length

    def __iter__(self):
        for i in range(self.length):
            yield {"x": torch.tensor([float(i)]), "meta": f"s{i}"}


class WholeBatches(IterableDataset):
    """Ready-made batches (batch_size=None) with one object for the whole batch."""

    def __iter__(self):
        for i in range(3):
            yield {"x": torch.tensor([2.0 * i, 2.0 * i + 1]), "meta": f"batch{i}"}


def _as_lists(loader):
    return [(batch["x"].flatten().tolist(), batch["meta"]) for batch in loader]


# -- iterable datasets with objects in their batches -------------------------------------------
@pytest.mark.parametrize("dispatch_batches", [None, True, False])
def test_objects_in_iterable_batches_on_one_process(dispatch_batches):
    from cadence import Accelerator
    from cadence.utils import DataLoaderConfiguration

    config = DataLoaderConfiguration(dispatch_batches=dispatch_batches)
    acc = Accelerator(cpu=True, dataloader_config=config)
    loader = acc.prepare(DataLoader(Tagged(), batch_size=2))
    # One process reads the stream as it is, whatever the dispatch setting.
    assert _as_lists(loader) == [
        ([0.0, 1.0], ["s0", "s1"]),
        ([2.0, 3.0], ["s2", "s3"]),
        ([4.0], ["s4"]),
    ]


def dispatched_objects(split_batches: bool):
    from cadence import Accelerator
    from cadence.utils import DataLoaderConfiguration

    config = DataLoaderConfiguration(dispatch_batches=True, split_batches=split_batches)
    acc = Accelerator(cpu=True, dataloader_config=config)
    samples = _as_lists(acc.prepare(DataLoader(Tagged(), batch_size=2)))
    whole = None
    if not split_batches:
        loader = acc.prepare(DataLoader(WholeBatches(), batch_size=None))
        whole = _as_lists(loader)
    return samples, whole


def test_dispatched_batches_carry_their_objects(dist_pool):
    rank0, rank1 = dist_pool(2).run(dispatched_objects, False)
    # Dispatch puts two batches of 2 end to end and gives each process its own: rank 0 the first,
    # rank 1 the second. The last global batch ([4]) is completed with the epoch's first sample so
    # both processes get one sample; the strings travel with their samples.
    assert rank0[0] == [([0.0, 1.0], ["s0", "s1"]), ([4.0], ["s4"])]
    assert rank1[0] == [([2.0, 3.0], ["s2", "s3"]), ([0.0], ["s0"])]
    # An object that belongs to a whole batch comes back with that batch; the last batch is cut in
    # two, so both processes get its object.
    assert rank0[1] == [([0.0, 1.0], "batch0"), ([4.0], "batch2")]
    assert rank1[1] == [([2.0, 3.0], "batch1"), ([5.0], "batch2")]


def test_dispatched_split_batches_carry_their_objects(dist_pool):
    rank0, rank1 = dist_pool(2).run(dispatched_objects, True)
    # split_batches cuts each batch of 2 in two halves; the last batch ([4]) is completed with s0.
    assert rank0[0] == [([0.0], ["s0"]), ([2.0], ["s2"]), ([4.0], ["s4"])]
    assert rank1[0] == [([1.0], ["s1"]), ([3.0], ["s3"]), ([0.0], ["s0"])]


class Unpicklable(IterableDataset):
    def __iter__(self):
        for i in range(2):
            yield {"x": torch.tensor([float(i)]), "fn": lambda: None}  # lambdas do not pickle


def dispatch_unpicklable():
    from cadence import Accelerator
    from cadence.utils import DataLoaderConfiguration

    config = DataLoaderConfiguration(dispatch_batches=True)
    acc = Accelerator(cpu=True, dataloader_config=config)
    try:
        list(acc.prepare(DataLoader(Unpicklable(), batch_size=None)))
    except (TypeError, RuntimeError) as error:
        return str(error)
    return "no error"


def test_dispatching_an_unpicklable_object_fails_on_every_rank(dist_pool):
    # The main process cannot send the batch; no rank may be left waiting for it.
    for message in dist_pool(2).run(dispatch_unpicklable, timeout=60):
        assert "cannot be pickled" in message and "dispatch_batches=False" in message


# -- base_dataloader, pickling -------------------------------------------------------------------
def test_prepared_and_skipping_loaders_expose_base_dataloader():
    from cadence import Accelerator

    acc = Accelerator(cpu=True)
    prepared = acc.prepare(DataLoader(TensorDataset(torch.arange(6.0)), batch_size=2))
    base = prepared.base_dataloader
    assert type(base) is DataLoader
    assert base is prepared.base_dataloader  # built once
    assert base.batch_sampler is prepared.batch_sampler
    assert [b[0].tolist() for b in base] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    skipping = acc.skip_first_batches(prepared, 1)
    assert type(skipping.base_dataloader) is DataLoader

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(torch.arange(6.0))

    skip_loader = acc.skip_first_batches(DataLoader(Stream(), batch_size=2), 1)
    assert type(skip_loader).__name__ == "SkipDataLoader"
    assert [b.tolist() for b in skip_loader.base_dataloader] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    assert [b.tolist() for b in skip_loader] == [[2.0, 3.0], [4.0, 5.0]]


def pickled_loader_batches():
    from cadence import Accelerator

    acc = Accelerator(cpu=True)
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(8.0)), batch_size=2))
    copy = pickle.loads(pickle.dumps(loader))
    return type(copy).__name__, [b[0].tolist() for b in copy], [b[0].tolist() for b in loader]


def test_a_prepared_loader_pickles_and_its_copy_reads_the_same_shard(dist_pool):
    results = dist_pool(2).run(pickled_loader_batches)
    # Batch i of 4 goes to rank i % 2.
    assert results[0] == ("DataLoaderShard", [[0.0, 1.0], [4.0, 5.0]], [[0.0, 1.0], [4.0, 5.0]])
    assert results[1] == ("DataLoaderShard", [[2.0, 3.0], [6.0, 7.0]], [[2.0, 3.0], [6.0, 7.0]])


# -- the split_batches error ---------------------------------------------------------------------
def split_error():
    from cadence import Accelerator
    from cadence.utils import DataLoaderConfiguration

    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(split_batches=True))
    try:
        acc.prepare(DataLoader(TensorDataset(torch.arange(9.0)), batch_size=3))
    except ValueError as error:
        return str(error)
    return "no error"


def test_split_batches_error_keeps_the_reference_phrase(dist_pool):
    for message in dist_pool(2).run(split_error):
        assert "round multiple" in message
        assert "batch size (3)" in message and "processes (2)" in message


# -- the StatefulDataLoader layout ---------------------------------------------------------------
def _stateful_accelerator():
    from cadence import Accelerator
    from cadence.utils import DataLoaderConfiguration

    config = DataLoaderConfiguration(use_stateful_dataloader=True)
    return Accelerator(cpu=True, dataloader_config=config)


def test_stateful_state_dict_has_torchdata_layout():
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    acc = _stateful_accelerator()
    dataset = TensorDataset(torch.arange(10.0))
    prepared = acc.prepare(DataLoader(dataset, batch_size=2))
    reference = stateful.StatefulDataLoader(dataset, batch_size=2)
    assert isinstance(prepared, stateful.StatefulDataLoader)
    torchdata_keys = set(reference.state_dict())
    assert set(prepared.state_dict()) == torchdata_keys
    # save_state keeps Cadence's exact position beside torchdata's state, under one more key.
    assert set(prepared.checkpoint_state_dict()) == torchdata_keys | {"_cadence_position"}

    def counters(state):
        return state["_num_yielded"], state["_sampler_iter_yielded"], state["_iterator_finished"]

    # torchdata counts the batches handed out, and marks the iterator finished after the last one.
    iterator = iter(prepared)
    next(iterator), next(iterator)
    assert counters(prepared.state_dict()) == (2, 2, False)
    list(iterator)
    assert counters(prepared.state_dict()) == (5, 5, True)


def test_stateful_loader_loads_a_torchdata_state():
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    dataset = TensorDataset(torch.arange(10.0))
    saver = stateful.StatefulDataLoader(dataset, batch_size=2)
    iterator = iter(saver)
    next(iterator), next(iterator)
    saved = saver.state_dict()  # two batches handed out

    prepared = _stateful_accelerator().prepare(DataLoader(dataset, batch_size=2))
    prepared.load_state_dict(saved)
    assert [b[0].tolist() for b in prepared] == [[4.0, 5.0], [6.0, 7.0], [8.0, 9.0]]
    # The next epoch is whole again.
    assert len(list(prepared)) == 5


def stateful_round_trip(path: str):
    pytest.importorskip("torchdata.stateful_dataloader")
    from cadence.utils import set_seed

    set_seed(0)
    acc = _stateful_accelerator()
    dataset = TensorDataset(torch.arange(16.0))
    loader = acc.prepare(DataLoader(dataset, batch_size=2, shuffle=True))
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    torch.save(state, f"{path}.{acc.process_index}")
    acc.save_state(f"{path}-checkpoint")
    rest = [b[0].tolist() for b in iterator]

    # torchdata's own state, loaded as torchdata loads it: the batches handed out are skipped.
    again = acc.prepare(DataLoader(dataset, batch_size=2, shuffle=True))
    again.load_state_dict(torch.load(f"{path}.{acc.process_index}", weights_only=True))
    counted = [b[0].tolist() for b in again]
    # save_state's checkpoint: Cadence's exact position rides along, the same order resumes.
    acc.load_state(f"{path}-checkpoint")
    exact = [b[0].tolist() for b in loader]
    return state["_num_yielded"], rest, counted, exact


def test_stateful_state_round_trip_on_two_processes(dist_pool, tmp_path):
    pytest.importorskip("torchdata.stateful_dataloader")
    results = dist_pool(2).run(stateful_round_trip, str(tmp_path / "s"))
    for num_yielded, rest, counted, exact in results:
        assert num_yielded == 1
        assert len(rest) == 3  # 16 samples, 2 per batch, 2 processes: 4 batches each
        assert len(counted) == 3  # the rest of the epoch, as torchdata counts it
        assert exact == rest
    # the two processes still read disjoint halves of the resumed epoch
    for halves in (zip(*(r[1] for r in results)), zip(*(r[3] for r in results))):
        for first, second in halves:
            assert not set(first) & set(second)


def _four_loaders(num_workers: int):
    from torchdata.stateful_dataloader import StatefulDataLoader

    from cadence.data_loader import DataLoaderDispatcher, DataLoaderShard, SkipDataLoader

    def options():
        return dict(
            batch_size=4, num_workers=num_workers, generator=torch.Generator().manual_seed(3)
        )

    dataset = list(range(48))
    return [
        StatefulDataLoader(dataset, **options()),
        SkipDataLoader(dataset, use_stateful_dataloader=True, **options()),
        DataLoaderShard(dataset, use_stateful_dataloader=True, **options()),
        DataLoaderDispatcher(dataset, use_stateful_dataloader=True, **options()),
    ]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_loaders_report_what_torchdata_reports(num_workers):
    """A stateful Cadence loader's state_dict() is torchdata's after the batches handed out (it reads
    one batch ahead, torchdata does not), and torchdata's state loads into it."""
    pytest.importorskip("torchdata.stateful_dataloader")
    from cadence import PartialState

    PartialState(cpu=True)
    loaders = _four_loaders(num_workers)
    seen = []
    for loader in loaders:
        batches = []
        for batch in loader:
            batches.append(batch.tolist())
            if len(batches) == 5:
                break
        seen.append(batches)
    assert all(batches == seen[0] for batches in seen)
    expected = loaders[0].state_dict()
    for loader in loaders[1:]:
        assert loader.state_dict() == expected
    # Loaded into fresh loaders, the state resumes after the fifth batch (12 batches in all).
    for loader in _four_loaders(num_workers):
        loader.load_state_dict(expected)
        assert [batch.tolist() for batch in loader] == [
            list(range(i, i + 4)) for i in range(20, 48, 4)
        ]
    # After a whole epoch, all say that the iterator finished.
    for loader in _four_loaders(num_workers):
        list(loader)
        assert loader.state_dict()["_iterator_finished"] is True


def join_with_an_iterable_loader():
    import warnings

    from cadence import Accelerator

    acc = Accelerator(cpu=True)
    model = acc.prepare(torch.nn.Linear(1, 1))

    class Numbers(IterableDataset):
        def __iter__(self):
            return iter(torch.arange(6.0).reshape(6, 1))

    map_style = acc.prepare(DataLoader(TensorDataset(torch.arange(8.0)), batch_size=2))
    acc.prepare(DataLoader(Numbers(), batch_size=2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with acc.join_uneven_inputs([model], even_batches=False):
            inside = map_style.batch_sampler.even_batches
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    return inside, map_style.batch_sampler.even_batches, messages


def test_join_warns_once_when_an_iterable_loader_cannot_follow(dist_pool):
    for inside, after, messages in dist_pool(2).run(join_with_an_iterable_loader):
        assert inside is False and after is True  # overridden inside the block, restored after
        assert len(messages) == 1 and "only supported for map-style datasets" in messages[0]


STATEFUL_RESUME_SCRIPT = """
import json, sys, torch
from torch.utils.data import DataLoader, TensorDataset
from cadence import Accelerator
from cadence.utils import DataLoaderConfiguration, set_seed


def stateful_resumes(path, dispatch, workers):
    set_seed(0)
    config = DataLoaderConfiguration(use_stateful_dataloader=True, dispatch_batches=dispatch)
    acc = Accelerator(cpu=True, dataloader_config=config)
    dataset = TensorDataset(torch.arange(40.0))

    def loader():
        return acc.prepare(DataLoader(dataset, batch_size=2, shuffle=True, num_workers=workers))

    first = loader()
    iterator = iter(first)
    for _ in range(3):
        next(iterator)
    acc.save_state(path)
    torchdata_state = first.state_dict()
    rest = [b[0].tolist() for b in iterator]
    acc.load_state(path)
    exact = [b[0].tolist() for b in first]
    counted = loader()
    counted.load_state_dict(torchdata_state)
    return rest, exact, len(list(counted))


if __name__ == "__main__":
    out, dispatch, workers = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
    result = stateful_resumes(out + "-ckpt", dispatch, workers)
    with open(f"{out}.{Accelerator().process_index}.json", "w") as f:
        json.dump(result, f)
"""


def _check_stateful_resumes(results):
    for rest, exact, counted in results:
        assert len(rest) == 7  # 40 samples, 2 per batch, 2 processes: 10 batches each, 3 read
        assert exact == rest  # save_state / load_state: the same batches
        assert counted == 7  # torchdata's state: the same number of batches


def _stateful_resumes_in_pool(path: str, dispatch: bool):
    namespace: dict = {}
    exec(compile(STATEFUL_RESUME_SCRIPT, "stateful_resume", "exec"), namespace)
    return namespace["stateful_resumes"](path, dispatch, 0)


def test_stateful_dispatcher_resumes_on_two_processes(dist_pool, tmp_path):
    """A dispatcher's torchdata state counts the base loader's batches on the main process (two per
    global batch here); it loads back to the same position, and save_state resumes exactly."""
    pytest.importorskip("torchdata.stateful_dataloader")
    _check_stateful_resumes(dist_pool(2).run(_stateful_resumes_in_pool, str(tmp_path / "c"), True))


@pytest.mark.parametrize("dispatch", [False, True])
def test_stateful_loaders_with_worker_processes_resume(tmp_path, dispatch):
    """With DataLoader worker processes (torchdata's multi-worker snapshots), through a real launch."""
    pytest.importorskip("torchdata.stateful_dataloader")
    import json
    import subprocess
    import sys

    script = tmp_path / "resume.py"
    script.write_text(STATEFUL_RESUME_SCRIPT)
    out = tmp_path / "result"
    command = [sys.executable, "-m", "cadence.commands.cli", "launch", "--cpu", "--quiet"]
    command += ["--num_processes", "2", str(script), str(out), str(int(dispatch)), "2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    _check_stateful_resumes([json.loads(out.with_suffix(f".{r}.json").read_text()) for r in (0, 1)])


# -- a DataLoaderConfiguration assigned after construction -----------------------------------------
def batches_after_assigning(how: str, dispatch: bool):
    from cadence import Accelerator
    from cadence.utils import DataLoaderConfiguration

    acc = Accelerator(cpu=True)
    if how == "assign":  # a new configuration object
        acc.dataloader_config = DataLoaderConfiguration(
            split_batches=True, dispatch_batches=dispatch
        )
    else:  # the same object, changed
        acc.dataloader_config.split_batches = True
        acc.dataloader_config.dispatch_batches = dispatch
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(8)), batch_size=4))
    return {"split": acc.split_batches, "batches": [x.tolist() for (x,) in loader]}


@pytest.mark.parametrize("how", ["assign", "mutate"])
@pytest.mark.parametrize("dispatch", [False, True])
def test_a_dataloader_configuration_set_after_construction_applies_to_later_prepares(
    dist_pool, how, dispatch
):
    # Accelerate reads `accelerator.dataloader_config` at each prepare: replacing it or changing it
    # both apply. With split_batches a batch of 4 is cut in two, one half per process.
    for rank, result in enumerate(dist_pool(2).run(batches_after_assigning, how, dispatch)):
        assert result["split"] is True
        assert result["batches"] == [[2 * rank, 2 * rank + 1], [4 + 2 * rank, 5 + 2 * rank]]
