"""Read the launch environment (torch elastic, MPI, SLURM or none) into one frozen record."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500


class LaunchEnvironmentError(RuntimeError):
    """The environment describes a distributed launch, but not completely or not consistently."""


@dataclass(frozen=True)
class Topology:
    """Where this process sits in the launch: ranks, sizes, master address and the launcher seen."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    master_addr: str = DEFAULT_MASTER_ADDR
    master_port: int = DEFAULT_MASTER_PORT
    source: str = "single"

    @property
    def is_distributed(self) -> bool:
        """Whether the launch has more than one process."""
        return self.world_size > 1


def _int(env: Mapping[str, str], name: str) -> int:
    raw = env[name]
    try:
        return int(raw)
    except ValueError:
        raise LaunchEnvironmentError(
            f"Environment variable {name}={raw!r} is not an integer. "
            "Fix or unset it before starting the script."
        ) from None


def _require_together(env: Mapping[str, str], names: tuple[str, ...], source: str) -> bool:
    present = [n for n in names if n in env]
    if not present:
        return False
    missing = [n for n in names if n not in env]
    if missing:
        raise LaunchEnvironmentError(
            f"The {source} launch environment is incomplete: {', '.join(present)} "
            f"{'is' if len(present) == 1 else 'are'} set but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not. Launch with `cadence launch` or "
            "`torchrun`, or unset the stray variables to run as a single process."
        )
    return True


def _master(env: Mapping[str, str], fallback_addr: str | None = None) -> tuple[str, int]:
    addr = env.get("MASTER_ADDR") or fallback_addr or DEFAULT_MASTER_ADDR
    port = _int(env, "MASTER_PORT") if "MASTER_PORT" in env else DEFAULT_MASTER_PORT
    return addr, port


def _finish(
    env: Mapping[str, str],
    source: str,
    rank: int,
    world_size: int,
    local_rank: int | None,
    local_world_size: int | None,
    node_rank: int | None = None,
    fallback_addr: str | None = None,
) -> Topology:
    if local_world_size is None:
        local_world_size = world_size
    if local_rank is None:
        local_rank = rank % local_world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise LaunchEnvironmentError(
            f"{source} environment gives rank {rank} in a world of {world_size} processes; "
            "the rank must be in [0, world size)."
        )
    if local_world_size < 1 or not 0 <= local_rank < local_world_size:
        raise LaunchEnvironmentError(
            f"{source} environment gives local rank {local_rank} with {local_world_size} "
            "processes on this machine; the local rank must be in [0, local world size)."
        )
    num_nodes = max(1, world_size // local_world_size)
    if node_rank is None:
        node_rank = rank // local_world_size
    addr, port = _master(env, fallback_addr)
    return Topology(
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=local_world_size,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=addr,
        master_port=port,
        source=source,
    )


def _opt_int(env: Mapping[str, str], name: str) -> int | None:
    return _int(env, name) if name in env else None


def _from_torch_elastic(env: Mapping[str, str]) -> Topology | None:
    if not _require_together(env, ("RANK", "WORLD_SIZE"), "torch elastic"):
        if "LOCAL_RANK" in env and "WORLD_SIZE" not in env:
            raise LaunchEnvironmentError(
                "LOCAL_RANK is set but RANK and WORLD_SIZE are not, so the size of the job is "
                "unknown. Launch with `cadence launch` or `torchrun`, which set all three."
            )
        return None
    return _finish(
        env,
        "torch elastic",
        _int(env, "RANK"),
        _int(env, "WORLD_SIZE"),
        _opt_int(env, "LOCAL_RANK"),
        _opt_int(env, "LOCAL_WORLD_SIZE"),
        _opt_int(env, "GROUP_RANK"),
    )


_MPI_FLAVOURS = (
    ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("MVAPICH", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE",
     "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"),
    ("MPICH/Intel MPI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)  # fmt: skip


def _from_mpi(env: Mapping[str, str]) -> Topology | None:
    for name, rank_var, size_var, local_rank_var, local_size_var in _MPI_FLAVOURS:
        if _require_together(env, (rank_var, size_var), name):
            return _finish(
                env,
                name,
                _int(env, rank_var),
                _int(env, size_var),
                _opt_int(env, local_rank_var),
                _opt_int(env, local_size_var),
            )
    return None


def _slurm_tasks_per_node(env: Mapping[str, str]) -> int | None:
    if "SLURM_NTASKS_PER_NODE" in env:
        return _int(env, "SLURM_NTASKS_PER_NODE")
    raw = env.get("SLURM_TASKS_PER_NODE")  # e.g. "4(x2)" or "4,4"
    if raw:
        first = raw.split(",")[0].split("(")[0]
        if first.isdigit():
            return int(first)
    return None


def _from_slurm(env: Mapping[str, str]) -> Topology | None:
    if not _require_together(env, ("SLURM_PROCID", "SLURM_NTASKS"), "SLURM"):
        return None
    world_size = _int(env, "SLURM_NTASKS")
    return _finish(
        env,
        "SLURM",
        _int(env, "SLURM_PROCID"),
        world_size,
        _opt_int(env, "SLURM_LOCALID"),
        _slurm_tasks_per_node(env),
        _opt_int(env, "SLURM_NODEID"),
        fallback_addr=env.get("SLURM_LAUNCH_NODE_IPADDR"),
    )


def detect_topology(env: Mapping[str, str] | None = None) -> Topology:
    """Read rank and world from the environment: torch elastic, then MPI, then SLURM, else one process."""
    env = os.environ if env is None else env
    for reader in (_from_torch_elastic, _from_mpi, _from_slurm):
        found = reader(env)
        if found is not None:
            return found
    return Topology()
