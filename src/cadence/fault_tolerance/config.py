"""The fault-tolerance settings of one replica group: the plugin object and its one resolution."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, fields
from typing import Any

from ..core.settings import resolve
from ..options.dataclasses import KwargsHandler
from .defaults import DEFAULT_HEARTBEAT_TIMEOUT, DEFAULT_QUORUM_EVERY, DEFAULT_QUORUM_TIMEOUT

# The timeouts' defaults (defaults.py) bring the survivors back to committing within about 2 s of
# a group's death: the Lighthouse drops a group whose heartbeats stopped for `heartbeat_timeout`
# seconds, and forms the next quorum at its next tick (0.1 s).
DEFAULT_TIMEOUT = 10.0
DEFAULT_MAX_RESTARTS = 3


def torchft_missing_message(what: str) -> str | None:
    """None when torchft can be imported; otherwise the error to show for `what` (a flag, a class)."""
    try:
        found = importlib.util.find_spec("torchft") is not None
    except (ImportError, ValueError):  # a blocked or half-imported torchft counts as missing
        found = False
    if found:
        return None
    return (
        f"{what} needs torchft, which is not installed: pip install 'cadence[ft]' "
        "(or pip install torchft==0.2.0)"
    )


@dataclass
class FaultToleranceConfig(KwargsHandler):
    """Per-step fault tolerance for this process's replica group (torchft).

    Pass it in `Accelerator(kwargs_handlers=[FaultToleranceConfig(...)])`, or launch with
    `cadence launch --fault_tolerance`, which hands the same fields to every worker. Inside a group
    the processes train with DDP or with FSDP2 sharded over the group (`check_parallelism` says
    what else is refused); every group runs the same number of processes.

    Args:
        lighthouse: address of torchft's Lighthouse (`http://HOST:PORT`).
        replica_group: this group's index (0 .. replica_groups - 1).
        replica_groups: how many groups the job has (names the groups in the quorum reports).
        min_replicas: the fewest groups that may commit a step; with fewer, training waits.
        heartbeat_timeout: seconds without a heartbeat after which a group counts as lost.
        quorum_timeout: seconds a step waits for a quorum before the process fails (and its agent
            restarts it).
        timeout: seconds a cross-group collective or a heal transfer may take.
        quorum_every: while every group of the job trains, steps reuse the last quorum and a new
            one is asked for every `quorum_every` steps (1: every step, as torchft's own loop
            does). A failure is noticed without a quorum: the step's gradient all-reduce fails,
            the step is discarded, and the next one waits for a new quorum.
        host: the address this group's torchft listeners bind to and advertise.
    """

    lighthouse: str | None = None
    replica_group: int = 0
    replica_groups: int | None = None
    min_replicas: int = 1
    heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT
    quorum_timeout: float = DEFAULT_QUORUM_TIMEOUT
    timeout: float = DEFAULT_TIMEOUT
    quorum_every: int = DEFAULT_QUORUM_EVERY
    host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        problems = check_fields(self)
        if problems:
            raise ValueError("FaultToleranceConfig: " + "; ".join(problems))

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> FaultToleranceConfig:
        """The config the launcher wrote into the launch record (unknown keys refused)."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(record) - names)
        if unknown:
            raise ValueError(
                f"the launch record's fault_tolerance has unknown keys {unknown}: the launcher and "
                "the worker run different Cadence versions"
            )
        return cls(**record)

    def to_record(self) -> dict[str, Any]:
        """The fields as the launch record holds them."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def check_fields(config: FaultToleranceConfig) -> list[str]:
    """Every problem of `config`'s values, worded for the user."""
    problems = []
    if not config.lighthouse:
        problems.append("lighthouse is required (the Lighthouse's http://HOST:PORT)")
    if config.min_replicas < 1:
        problems.append(f"min_replicas must be 1 or more, got {config.min_replicas}")
    if config.replica_groups is not None:
        if config.replica_groups < 1:
            problems.append(f"replica_groups must be 1 or more, got {config.replica_groups}")
        elif not 0 <= config.replica_group < config.replica_groups:
            problems.append(
                f"replica_group must be in 0..{config.replica_groups - 1}, got {config.replica_group}"
            )
        elif config.min_replicas > config.replica_groups:
            problems.append(
                f"min_replicas {config.min_replicas} is more than the {config.replica_groups} "
                "replica groups: no step could ever commit"
            )
    every = config.quorum_every
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        problems.append(
            f"quorum_every must be a whole number of steps, 1 or more, got {config.quorum_every}"
        )
    if config.replica_group < 0:
        problems.append(f"replica_group must be 0 or more, got {config.replica_group}")
    for name in ("heartbeat_timeout", "quorum_timeout", "timeout"):
        if not getattr(config, name) > 0:
            problems.append(f"{name} must be more than 0 seconds, got {getattr(config, name)}")
    return problems


SUPPORTED_INSIDE_A_GROUP = (
    "one process, DDP over the group's processes (gradients averaged inside the group, then "
    "across the groups through torchft's Manager), or FSDP2 sharded over the group's processes "
    "(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2) / --use_fsdp --fsdp_version 2; "
    "each rank's gradient shard averaged with the same rank's of the other groups)"
)


def check_parallelism(
    config: FaultToleranceConfig | None,
    *,
    fsdp_plugin: Any = None,
    deepspeed_plugins: Any = None,
    torch_tp_plugin: Any = None,
    parallelism_config: Any = None,
) -> None:
    """Refuse, before anything starts, a parallelism inside a replica group that fault tolerance
    cannot make exact.

    Supported inside a group: one process, DDP, and FSDP2 (`fully_shard`) sharded over the group's
    processes only, which with the replication across groups through torchft's Manager is HSDP:
    rank r of every group holds the same shard, so each rank's gradient shard is averaged with rank
    r's of the other groups (the Manager's cross-group process group pairs rank r with rank r), and
    a healing group's rank r receives rank r's model and optimizer shards. Refused: FSDP version 1
    (its flat parameters have no per-rank shard layout that a peer's rank can load), HSDP inside a
    group (`dp_replicate_size > 1` with `dp_shard_size > 1`: the groups are the replicas), `dp_shard_size`
    without FSDP2, DeepSpeed, tensor, context and sequence parallelism (their state and collectives
    are not built into the commit gate and the heal).
    """
    if config is None:
        return
    found: dict[str, tuple[str, str]] = {}  # kind -> (how it was asked for, why); a kind named once
    fsdp2 = fsdp_plugin is not None and getattr(fsdp_plugin, "fsdp_version", 1) == 2
    if fsdp_plugin is not None and not fsdp2:
        found["FSDP"] = ("fsdp_plugin / --use_fsdp", " with fsdp_version=1")
    if deepspeed_plugins:
        found["DeepSpeed"] = ("deepspeed_plugin / --use_deepspeed", "")
    if torch_tp_plugin is not None:
        found["tensor parallelism"] = ("torch_tp_plugin", "")
    if parallelism_config is not None:
        sharded = (getattr(parallelism_config, "dp_shard_size", None) or 1) > 1
        for name, kind, allowed, why in (
            ("dp_shard_size", "FSDP2 sharding (HSDP)", fsdp2, " without fsdp_version=2"),
            # DDP (replication alone) is fine; replicas of a shard inside a group are not.
            ("dp_replicate_size", "HSDP inside a group", not sharded, " with dp_shard_size > 1"),
            ("tp_size", "tensor parallelism", False, ""),
            ("cp_size", "context parallelism", False, ""),
            ("sp_size", "sequence parallelism", False, ""),
            ("pp_size", "pipeline parallelism", False, ""),
        ):
            if (getattr(parallelism_config, name, None) or 1) > 1 and not allowed:
                found.setdefault(kind, (name, why))
    if found:
        named = ", ".join(f"{kind} ({how}){why}" for kind, (how, why) in found.items())
        raise ValueError(
            f"fault tolerance (replica group {config.replica_group}) cannot train with {named} "
            f"inside a replica group: Cadence supports {SUPPORTED_INSIDE_A_GROUP}. Drop that "
            "setting, or train without --fault_tolerance (docs: Training through failures, limits)"
        )


def resolve_fault_tolerance(
    handler: FaultToleranceConfig | None, launch: dict[str, Any]
) -> FaultToleranceConfig | None:
    """The plugin passed in code, else the launch record's `fault_tolerance`, else None (off).

    Refuses fault tolerance without torchft before anything starts.
    """
    found = resolve("fault_tolerance", explicit=handler, launch=launch)
    if found.value is None:
        return None
    config = (
        found.value
        if isinstance(found.value, FaultToleranceConfig)
        else FaultToleranceConfig.from_record(dict(found.value))
    )
    missing = torchft_missing_message("fault tolerance (FaultToleranceConfig / --fault_tolerance)")
    if missing:
        raise ImportError(missing)
    return config
