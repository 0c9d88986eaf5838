import pytest

from cadence.runtime.topology import LaunchEnvironmentError, Topology, detect_topology


def test_no_launcher_means_one_process():
    assert detect_topology({}) == Topology()


def test_torch_elastic_variables():
    env = {
        "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "1234",
    }  # fmt: skip
    topo = detect_topology(env)
    assert (topo.rank, topo.local_rank, topo.world_size, topo.local_world_size) == (5, 1, 8, 4)
    assert (topo.node_rank, topo.num_nodes) == (1, 2)
    assert (topo.master_addr, topo.master_port, topo.source) == ("10.1.2.3", 1234, "torch elastic")


@pytest.mark.parametrize(
    "env, expected",
    [
        (
            {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
             "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
            (3, 1, 4, 2, 1, 2, "Open MPI"),
        ),
        (
            {"PMI_RANK": "2", "PMI_SIZE": "3"},
            (2, 2, 3, 3, 0, 1, "MPICH/Intel MPI"),
        ),
        (
            {"MV2_COMM_WORLD_RANK": "1", "MV2_COMM_WORLD_SIZE": "2",
             "MV2_COMM_WORLD_LOCAL_RANK": "0", "MV2_COMM_WORLD_LOCAL_SIZE": "1"},
            (1, 0, 2, 1, 1, 2, "MVAPICH"),
        ),
        (
            {"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2",
             "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_NODEID": "1",
             "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.9"},
            (6, 2, 8, 4, 1, 2, "SLURM"),
        ),
    ],
)  # fmt: skip
def test_mpi_and_slurm(env, expected):
    topo = detect_topology(env)
    got = (topo.rank, topo.local_rank, topo.world_size, topo.local_world_size,
           topo.node_rank, topo.num_nodes, topo.source)  # fmt: skip
    assert got == expected


def test_slurm_master_address_comes_from_launch_node():
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.9"}
    assert detect_topology(env).master_addr == "10.0.0.9"


def test_torch_elastic_wins_over_slurm():
    env = {"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    assert detect_topology(env).source == "torch elastic"


@pytest.mark.parametrize(
    "env, words",
    [
        ({"RANK": "0"}, ["RANK", "WORLD_SIZE"]),
        ({"WORLD_SIZE": "2"}, ["WORLD_SIZE", "RANK"]),
        ({"LOCAL_RANK": "0"}, ["LOCAL_RANK"]),
        ({"OMPI_COMM_WORLD_RANK": "0"}, ["OMPI_COMM_WORLD_SIZE"]),
        ({"SLURM_NTASKS": "2"}, ["SLURM_PROCID"]),
        ({"RANK": "x", "WORLD_SIZE": "2"}, ["RANK", "not an integer"]),
        ({"RANK": "2", "WORLD_SIZE": "2"}, ["rank 2", "world of 2"]),
    ],
)
def test_half_set_environment_is_a_clear_error(env, words):
    with pytest.raises(LaunchEnvironmentError) as info:
        detect_topology(env)
    for word in words:
        assert word in str(info.value)
