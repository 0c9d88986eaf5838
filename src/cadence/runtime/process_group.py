"""This process's device and torch.distributed process group: choosing, starting, owning, ending.

`PartialState` decides what the process joins (launch settings, topology); this module does it. It
chooses the device, starts gloo (CPU) or NCCL (one GPU per local rank), or torch_xla's group, and
destroys at exit only a group Cadence started, never one the script or another library created.
"""

from __future__ import annotations

import atexit
import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..core.enums import DistributedType
from ..core.settings import device_from_env, env_text
from ..core.torch_compat import group_destructor_releases_gil
from ..xla import runtime as xla_runtime
from .topology import Topology

DEFAULT_PROCESS_GROUP_TIMEOUT = timedelta(minutes=30)

# Whether Cadence started the process group (and so must destroy it at exit); survives reset_state().
_owns_process_group = False


def destroy_owned_group() -> None:
    """Destroy the process group if Cadence started it (registered to run at exit)."""
    if _owns_process_group and dist.is_available() and dist.is_initialized():
        destroy_default_group()
    disown_group()


def destroy_default_group() -> None:
    """`dist.destroy_process_group()`, with the group's native worker threads joined while the GIL
    is free on every declared torch release.

    Before torch 2.8 the ProcessGroup's Python wrapper runs its destructor, which joins the backends'
    worker threads, while holding the GIL. A gloo worker that is still dropping a finished
    collective's tensors needs the GIL for that (their Python objects are owned by the tensors once
    Python let go of them), so the join waited forever: a rank hung at exit after its work was done.
    The backends' own wrappers release the GIL in their destructor, so there they are held while the
    group goes, and dropped last (torch_compat: "ProcessGroup destructor releases the GIL").
    """
    if group_destructor_releases_gil():
        dist.destroy_process_group()
        return
    group = dist.distributed_c10d._get_default_group()
    backends = []
    for device in ("cpu", "cuda"):
        try:
            backends.append(group._get_backend(torch.device(device)))
        except RuntimeError:  # no backend for that device
            pass
    dist.destroy_process_group()
    del group  # the wrapper's destructor now ends nothing: the backends are still held
    backends.clear()  # the last references: joined with the GIL released


def disown_group() -> None:
    """Forget that Cadence started the current group (it was destroyed, or is someone else's now)."""
    global _owns_process_group
    _owns_process_group = False


def _own_group() -> None:
    global _owns_process_group
    _owns_process_group = True


atexit.register(destroy_owned_group)


def choose_device(cpu: bool, local_rank: int, world_size: int) -> torch.device:
    """The device of this process: the environment's choice, else its GPU, MPS or the CPU."""
    chosen = device_from_env()  # CADENCE_TORCH_DEVICE / ACCELERATE_TORCH_DEVICE win, cpu=True too
    if chosen is not None:
        if chosen.type == "cuda" and chosen.index is not None:
            torch.cuda.set_device(chosen)
        return chosen
    if not cpu and torch.cuda.is_available():
        count = torch.cuda.device_count()
        if world_size > 1 and local_rank >= count:
            raise RuntimeError(
                f"Local rank {local_rank} has no GPU: this machine has {count}. Start at most {count} "
                "processes per machine, or pass cpu=True / `cadence launch --cpu`."
            )
        device = torch.device("cuda", local_rank % count)
        torch.cuda.set_device(device)
        return device
    if not cpu and world_size == 1:
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
    # Several CPU processes get `cpu:0`, one `cpu`: what the reference reports.
    return torch.device("cpu", 0) if world_size > 1 else torch.device("cpu")


def start_process_group(
    topology: Topology, device: torch.device, launch: dict[str, Any], kwargs: dict[str, Any]
) -> str:
    """Join the world `topology` describes (NCCL on CUDA, else gloo, unless `kwargs` names a
    backend); the timeout comes from `kwargs`, the launch record, else 30 minutes. Returns the backend."""
    backend = kwargs.get("backend") or ("nccl" if device.type == "cuda" else "gloo")
    timeout = (
        as_timeout(kwargs.get("timeout"))
        or as_timeout(launch.get("process_group_timeout"))
        or DEFAULT_PROCESS_GROUP_TIMEOUT
    )
    init_method = kwargs.get("init_method") or "env://"
    if init_method == "env://":
        os.environ.setdefault("MASTER_ADDR", topology.master_addr)
        os.environ.setdefault("MASTER_PORT", str(topology.master_port))
    extra: dict[str, Any] = {}
    if backend == "nccl":
        extra["device_id"] = device
    store = _agent_store_of_this_attempt(init_method, timeout)
    if store is not None:
        extra["store"] = store
    else:
        extra["init_method"] = init_method
    dist.init_process_group(
        backend=backend,
        rank=topology.rank,
        world_size=topology.world_size,
        timeout=timeout,
        **extra,
    )
    _own_group()
    return backend


def _agent_store_of_this_attempt(init_method: str, timeout: timedelta) -> dist.Store | None:
    """Under torch elastic's agent (env://): the agent's store, its keys under this restart's own
    prefix; None elsewhere (torch builds the store from `init_method`).

    torch 2.13 connects the workers to the agent's store without the `/worker/attempt_N` prefix it
    used to add ("a new TCPStore for every retry"), but the static rendezvous keeps one store for
    the agent's life: after a restart the workers then read the previous attempt's keys, and gloo
    connected to the addresses of ranks that are gone ("Connection refused" in connectFullMesh,
    depending on which rank wrote first). Every torch release gets the per-attempt prefix here.
    """
    if init_method != "env://" or env_text("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    attempt = env_text("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"/worker/attempt_{attempt}", launcher_store_client(timeout))


def launcher_store_client(timeout: timedelta = dist.default_pg_timeout) -> dist.TCPStore:
    """A client of the store the launcher serves at MASTER_ADDR:MASTER_PORT, at its root (no
    prefix: the default group's store adds "default_pg/")."""
    return dist.TCPStore(
        host_name=str(env_text("MASTER_ADDR")),
        port=int(env_text("MASTER_PORT") or 0),
        world_size=int(env_text("WORLD_SIZE", "1") or 1),
        is_master=False,
        timeout=timeout,
        wait_for_workers=False,
    )


def start_single_process_group(device: torch.device) -> None:
    """A process group of world size 1 (NCCL on CUDA, else gloo), owned and destroyed by Cadence.

    Its store lives in this process (no address, no port): nothing else can join a world of one.
    """
    extra: dict[str, Any] = {}
    backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl":
        extra["device_id"] = device
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, **extra)
    _own_group()


def start_xla_group(num_processes: int) -> str | None:
    """torch_xla's process group when several replicas run; returns its backend (None for one)."""
    if num_processes <= 1:
        return None
    xla_runtime.start_process_group()
    _own_group()
    return xla_runtime.XLA_BACKEND


def distributed_type_for(backend: str | None, world_size: int) -> DistributedType:
    """MULTI_GPU on NCCL, MULTI_CPU on gloo, NO for a world of one."""
    if world_size <= 1:
        return DistributedType.NO
    return DistributedType.MULTI_GPU if backend == "nccl" else DistributedType.MULTI_CPU


def as_timeout(value: Any) -> timedelta | None:
    """`value` (seconds, a timedelta or None) as a timedelta."""
    if value is None or isinstance(value, timedelta):
        return value
    return timedelta(seconds=float(value))
