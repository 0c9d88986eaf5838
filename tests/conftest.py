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


# The longest test modules (whole launches, a Ray cluster, kill-and-resume runs) start first: with two
# pytest-xdist processes, a long test picked up last would leave one core idle until it ends.
LONG_FIRST = (
    "test_fault_tolerance_epochs.py",
    "test_fault_campaign.py",
    "test_fault_tolerance_trainer.py",
    "test_ray_train.py",
    "test_resume_after_kill.py",
    "test_elastic_launch.py",
    "test_transformers_alias.py",
    "test_elastic_checkpoint.py",
    "test_supervision.py",
    "test_checkpoint_writer_lock.py",
    "test_tracking_offline_runs.py",
    "test_elastic_fsdp.py",
    "test_diagnostics_jobs.py",
    "test_diagnostics_stall_report.py",
    "test_test_utils.py",
)


def pytest_collection_modifyitems(config, items):
    """Order the collected tests: the long modules of LONG_FIRST first, the rest as collected."""
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FIRST)))
