import pytest

from harness import WorkerPool


@pytest.fixture(scope="session")
def dist_pool():
    """`dist_pool(n)` gives a pool of n gloo worker processes, shared by every test of the session."""
    pools: dict[int, WorkerPool] = {}

    def get(world_size: int) -> WorkerPool:
        if world_size not in pools:
            pools[world_size] = WorkerPool(world_size)
        return pools[world_size]

    yield get
    for pool in pools.values():
        pool.close()


@pytest.fixture(autouse=True)
def fresh_cadence_state():
    """In-process tests start without the process-wide state an earlier test may have left."""
    from cadence.state import reset_state

    reset_state(destroy_process_group=True)  # only a group Cadence started itself (FSDP at world 1)
    yield
