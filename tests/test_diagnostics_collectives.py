"""Collectives on 2 real processes with the diagnostics on: nested structures through gather / reduce /
pad_across_processes / broadcast, fuzzed with hypothesis and checked against what the operations mean
(concatenate, sum, max, pad, copy); and a slow rank that stays within the stuck timeout is left alone."""

import time
from collections import namedtuple

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

WORLD = 2
Pair = namedtuple("Pair", "first second")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64}


# -- a structure is described by plain data (picklable), then built the same way on every rank ----
def leaves():
    shape = st.lists(st.integers(1, 3), min_size=0, max_size=3)
    pad_sizes = st.lists(st.integers(1, 3), min_size=WORLD, max_size=WORLD)
    return st.tuples(st.just("leaf"), st.sampled_from(sorted(DTYPES)), shape, pad_sizes)


def structures():
    return st.recursive(
        leaves(),
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.tuples(st.just("tuple"), st.lists(inner, max_size=3)),
            st.tuples(st.just("pair"), inner, inner),
            st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3),
        ),
        max_leaves=5,
    )


def build(spec, rank, pad_dim=None):
    """The tensors of `rank`: values depend on the rank and the leaf; with `pad_dim`, the size along
    that dimension is the rank's own (the shapes then differ between ranks)."""
    counter = iter(range(1000))

    def make(node):
        if isinstance(node, dict):
            return {key: make(value) for key, value in node.items()}
        if isinstance(node, list):
            return [make(item) for item in node]
        if node[0] == "tuple":
            return tuple(make(item) for item in node[1])
        if node[0] == "pair":
            return Pair(make(node[1]), make(node[2]))
        _, dtype, shape, pad_sizes = node
        shape = list(shape)
        if pad_dim is not None and shape:
            shape[pad_dim] = pad_sizes[rank]
        leaf = next(counter)
        count = 1
        for size in shape:
            count *= size
        values = (rank + 1) * 100 + leaf * 10 + torch.arange(count)
        return values.reshape(shape).to(DTYPES[dtype])

    return make(spec)


def plain(data):
    """Tensors as (dtype, shape, values), containers kept as they are: comparable with ==."""
    if isinstance(data, torch.Tensor):
        return (str(data.dtype), tuple(data.shape), data.tolist())
    if isinstance(data, dict):
        return {key: plain(value) for key, value in data.items()}
    if isinstance(data, Pair):
        return Pair(plain(data.first), plain(data.second))
    if isinstance(data, (list, tuple)):
        return type(data)(plain(item) for item in data)
    return data


def all_floating(spec):
    if isinstance(spec, dict):
        return all(all_floating(v) for v in spec.values())
    if isinstance(spec, list):
        return all(all_floating(v) for v in spec)
    if spec[0] == "tuple":
        return all(all_floating(v) for v in spec[1])
    if spec[0] == "pair":
        return all_floating(spec[1]) and all_floating(spec[2])
    return spec[1].startswith("float")


def map_leaves(function, *structures_per_rank):
    """Combine the same leaf of every rank's structure with `function`."""
    first = structures_per_rank[0]
    if isinstance(first, torch.Tensor):
        return function(list(structures_per_rank))
    if isinstance(first, dict):
        return {k: map_leaves(function, *(s[k] for s in structures_per_rank)) for k in first}
    items = [map_leaves(function, *parts) for parts in zip(*structures_per_rank)]
    return Pair(*items) if isinstance(first, Pair) else type(first)(items)


# -- what every worker runs ---------------------------------------------------------------------------
def run_collectives(spec, reduction, pad_dim, pad_index, pad_first, source):
    from cadence import Accelerator
    from cadence.utils import broadcast

    acc = Accelerator()
    rank = acc.process_index
    mine = build(spec, rank)
    results = {
        "gather": plain(acc.gather(mine)),
        "reduce": plain(acc.reduce(mine, reduction=reduction)),
        "pad": plain(
            acc.pad_across_processes(
                build(spec, rank, pad_dim), dim=pad_dim, pad_index=pad_index, pad_first=pad_first
            )
        ),
    }
    results["inputs_kept"] = plain(mine) == plain(build(spec, rank))
    results["broadcast"] = plain(broadcast(mine, from_process=source))
    results["inputs_after_broadcast"] = plain(mine)  # broadcast writes in place
    return results


# -- expectations from first principles ---------------------------------------------------------------
def expected_gather(per_rank):
    return map_leaves(
        lambda ts: torch.cat([t.reshape(1) if t.ndim == 0 else t for t in ts]), *per_rank
    )


def expected_reduce(per_rank, reduction):
    def combine(ts):
        stacked = torch.stack(ts)
        if reduction == "max":
            return stacked.max(dim=0).values
        total = stacked.sum(dim=0)
        return total / len(ts) if reduction == "mean" else total

    return map_leaves(combine, *per_rank)


def expected_pad(tensor_per_rank, rank, dim, pad_index, pad_first):
    def pad(ts):
        mine = ts[rank]
        if mine.ndim == 0:
            return mine
        longest = max(t.shape[dim] for t in ts)
        shape = list(mine.shape)
        shape[dim] = longest - mine.shape[dim]
        filler = torch.full(shape, pad_index, dtype=mine.dtype)
        return torch.cat([filler, mine] if pad_first else [mine, filler], dim=dim)

    return map_leaves(pad, *tensor_per_rank)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    spec=structures(),
    reduction=st.sampled_from(["sum", "max", "mean"]),
    pad_dim=st.sampled_from([0, -1]),
    pad_index=st.integers(-2, 5),
    pad_first=st.booleans(),
    source=st.integers(0, WORLD - 1),
)
def test_nested_collectives_match_their_definition(
    dist_pool, spec, reduction, pad_dim, pad_index, pad_first, source
):
    if reduction == "mean" and not all_floating(spec):
        reduction = "sum"  # the mean of integers is refused (tested with the bad inputs)
    results = dist_pool(WORLD).run(
        run_collectives, spec, reduction, pad_dim, pad_index, pad_first, source
    )
    per_rank = [build(spec, rank) for rank in range(WORLD)]
    padded_inputs = [build(spec, rank, pad_dim) for rank in range(WORLD)]
    for rank, result in enumerate(results):
        assert result["gather"] == plain(expected_gather(per_rank))
        reduced = plain(expected_reduce(per_rank, reduction))
        assert result["reduce"] == reduced
        assert result["pad"] == plain(
            expected_pad(padded_inputs, rank, pad_dim, pad_index, pad_first)
        )
        assert result["broadcast"] == plain(per_rank[source])
        assert result["inputs_kept"]  # gather, reduce and pad leave their inputs alone
        assert result["inputs_after_broadcast"] == plain(per_rank[source])


def slow_rank_within_the_timeout():
    from cadence import Accelerator
    from cadence.diagnostics.watchdog import active_watchdog

    acc = Accelerator()
    if acc.process_index == 0:
        time.sleep(2.5)  # e.g. saving a checkpoint; the other rank waits in gather meanwhile
    gathered = acc.gather(torch.tensor([acc.process_index]))
    acc.wait_for_everyone()
    return gathered.tolist(), active_watchdog().settings.stuck_timeout


def test_a_slow_rank_within_the_stuck_timeout_is_not_stopped(dist_pool):
    results = dist_pool(WORLD).run(slow_rank_within_the_timeout, env={"CADENCE_STUCK_TIMEOUT": "4"})
    assert results == [([0, 1], 4.0)] * WORLD
