import torch


def ranks_and_gather():
    from cadence import Accelerator

    acc = Accelerator()
    return (
        acc.process_index,
        acc.num_processes,
        acc.gather(torch.tensor([acc.process_index])).tolist(),
    )


def test_pool(dist_pool):
    assert dist_pool(2).run(ranks_and_gather) == [(0, 2, [0, 1]), (1, 2, [0, 1])]
