"""First-principles model of which samples each process gets, written from the spec's description.

* Whole batches (split_batches=False): the epoch's samples are cut into batches of `batch_size`; process
  `r` takes batches r, r + n, r + 2n, ... With `even_batches` (and no drop_last) the sample stream loops
  back to its start until every process has the same number of full batches.
* Split batches: each batch of `batch_size` is cut into n equal parts; process r takes part r. With
  `even_batches` the last batch is completed from the start of the stream.
* drop_last: only rounds where every process gets a full batch are kept.
* One process: the loader is left as it is (nothing to even out).
* Dispatch: the main process puts n batches end to end (or takes one with split_batches); a last global
  batch whose size is not a multiple of n is completed with samples from the start of the stream; every
  process takes an equal slice.
"""

from __future__ import annotations

import math
from itertools import cycle, islice


def looped(stream: list[int], length: int) -> list[int]:
    return list(islice(cycle(stream), length))


def whole_batches(stream, batch_size, n, rank, even=True, drop_last=False):
    size = len(stream)
    batches = size // batch_size if drop_last else math.ceil(size / batch_size)
    if drop_last:
        rounds = batches // n
        return [
            stream[(k * n + rank) * batch_size : (k * n + rank + 1) * batch_size]
            for k in range(rounds)
        ]
    if not even or n == 1:
        return [stream[i * batch_size : (i + 1) * batch_size] for i in range(rank, batches, n)]
    rounds = math.ceil(batches / n)
    padded = looped(stream, rounds * n * batch_size)
    return [
        padded[(k * n + rank) * batch_size : (k * n + rank + 1) * batch_size] for k in range(rounds)
    ]


def split_batches(stream, batch_size, n, rank, even=True, drop_last=False):
    size = len(stream)
    part = batch_size // n
    batches = size // batch_size if drop_last else math.ceil(size / batch_size)
    padded = looped(stream, batches * batch_size) if even and n > 1 else stream
    result = []
    for j in range(batches):
        piece = padded[j * batch_size + rank * part : j * batch_size + (rank + 1) * part]
        if piece:
            result.append(piece)
    return result


def dispatched(stream, batch_size, n, rank, split=False, drop_last=False):
    size = len(stream)
    global_size = batch_size if split else batch_size * n
    if drop_last:
        count = size // global_size
    else:
        count = math.ceil(size / global_size)
    result = []
    for j in range(count):
        batch = stream[j * global_size : (j + 1) * global_size]
        if len(batch) % n:
            batch = batch + looped(stream, math.ceil(len(batch) / n) * n - len(batch))
        per = len(batch) // n
        result.append(batch[rank * per : (rank + 1) * per])
    return result
