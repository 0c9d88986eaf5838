"""Execution control across processes: barriers, who-goes-first, per-rank decorators, splitting, triggers."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist

from ..core.input_errors import with_rank
from ..diagnostics.ledger import ledger
from ..diagnostics.precheck import check_collective
from ..xla import runtime as xla_runtime


class ProcessInfo(Protocol):
    """What these functions read of the process state (ProcessInfo provides it)."""

    backend: str | None
    device: torch.device
    num_processes: int
    process_index: int
    local_process_index: int
    debug: bool
    use_distributed: bool
    is_main_process: bool
    is_local_main_process: bool


# Per-machine process groups for local_main_process_first, created on first use (a collective call).
_node_groups: dict[str, Any] = {}


def forget_groups() -> None:
    """Forget the cached per-machine process groups (with `reset_state`)."""
    _node_groups.clear()


def _barrier_kwargs(state: ProcessInfo) -> dict[str, Any]:
    if state.backend == "nccl":
        return {"device_ids": [state.device.index]}
    return {}


def barrier(
    state: ProcessInfo, timeout: float | timedelta | None = None, group: Any = None
) -> None:
    """Block until every process (of `group`) gets here; with `timeout`, fail after that long."""
    if timeout is not None:  # checked on one process too, so the mistake shows before scaling up
        timeout = _checked_timeout(timeout)
    if not state.use_distributed:
        return
    if timeout is not None and not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    seconds = None if timeout is None else timeout.total_seconds()
    if state.backend == xla_runtime.XLA_BACKEND and group is None:
        xla_runtime.rendezvous("cadence.wait_for_everyone")  # XLA replicas meet through torch_xla
        return
    with ledger.entered("wait_for_everyone", None, timeout=seconds) as entry:
        if timeout is not None and state.backend == "gloo":
            dist.monitored_barrier(group=group, timeout=timeout, wait_all_ranks=True)
        elif group is not None or not check_collective(entry, state, signature="barrier"):
            # (on gloo the check's handshake is itself a barrier: no second round trip)
            dist.barrier(group=group, **_barrier_kwargs(state))


def _checked_timeout(timeout: Any) -> timedelta:
    try:
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise ValueError(
            with_rank(
                f"wait_for_everyone(timeout={timeout!r}): the timeout must be a positive number of "
                "seconds or a timedelta (or None to wait as long as the process group allows)."
            )
        )
    return timeout if isinstance(timeout, timedelta) else timedelta(seconds=seconds)


def _node_group(state: ProcessInfo) -> Any:
    """The process group of this machine's ranks (None = the whole world, when there is one machine)."""
    topology = state.topology
    if topology.num_nodes <= 1 or topology.world_size != state.num_processes:
        return None
    if "mine" not in _node_groups:
        per_node = topology.local_world_size
        ranks = [list(range(n * per_node, (n + 1) * per_node)) for n in range(topology.num_nodes)]
        mine, _ = dist.new_subgroups_by_enumeration(ranks)
        _node_groups["mine"] = mine
    return _node_groups["mine"]


@contextmanager
def go_first(state: ProcessInfo, local: bool):
    """Context manager: the (local) main process runs the block before the others."""
    first = state.is_local_main_process if local else state.is_main_process
    group = _node_group(state) if local and state.use_distributed else None
    if not first:
        barrier(state, group=group)
    yield
    if first:
        barrier(state, group=group)


def take_local_index_alias(local_process_index: int | None, kwargs: dict[str, Any]) -> int | None:
    # The spec's own example spells it `local_process_idx`.
    """Return `local_process_index`, accepting the `local_process_idx` spelling too."""
    if "local_process_idx" in kwargs:
        alias = kwargs.pop("local_process_idx")
        if local_process_index is None:
            local_process_index = alias
    if kwargs:
        raise TypeError(f"on_local_process() got unexpected arguments: {', '.join(kwargs)}")
    return local_process_index


def run_only_if(
    function: Callable[..., Any] | None,
    predicate: Callable[[], bool],
    required_index: Any = True,
) -> Any:
    """Decorate `function` to run only where `predicate()` holds (it is asked at each call)."""
    if required_index is None:
        raise ValueError(
            "This decorator needs the index of the process to run on, e.g. "
            "`@accelerator.on_process(process_index=0)`."
        )
    if function is None:
        return lambda fn: run_only_if(fn, predicate)
    if not callable(function):
        raise TypeError(f"Expected a function to decorate, got {type(function).__name__}.")

    @functools.wraps(function)
    def only_there(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs) if predicate() else None

    return only_there


def _is_sliceable(value: Any) -> bool:
    return (
        hasattr(value, "__len__")
        and hasattr(value, "__getitem__")
        and not isinstance(value, (str, bytes, Mapping))
    )


def _split_values(value: Any, start: int, end: int, target_len: int, apply_padding: bool) -> Any:
    if isinstance(value, Mapping):
        return type(value)(
            (k, _split_values(v, start, end, target_len, apply_padding)) for k, v in value.items()
        )
    if hasattr(value, "select") and hasattr(value, "column_names"):  # a datasets.Dataset
        return value.select(range(start, min(end, len(value))))
    if not _is_sliceable(value):
        return value
    part = value[start:end]  # empty for the ranks past the end (padding fills them)
    if apply_padding and len(value) > 0 and len(part) < target_len:
        missing = target_len - len(part)
        if isinstance(part, torch.Tensor):
            filler = value[-1:].expand(missing, *value.shape[1:]).to(part.device)
            part = torch.cat([part, filler], dim=0)
        elif isinstance(part, tuple):
            part = part + (value[-1],) * missing
        elif isinstance(part, list):
            part = part + [value[-1]] * missing
        else:
            part = list(part) + [value[-1]] * missing
    return part


def split_for_process(
    inputs: Any, num_processes: int, process_index: int, apply_padding: bool
) -> Any:
    """Contiguous share of `inputs` for one process; the first `len % n` processes get one extra item."""
    if num_processes == 1:
        return inputs
    if isinstance(inputs, Mapping):
        lengths = {k: len(v) for k, v in inputs.items() if _is_sliceable(v)}
        if len(set(lengths.values())) > 1:
            raise ValueError(
                f"split_between_processes: all values of the dict must have the same length, got {lengths}."
            )
        length = next(iter(lengths.values()), 0)
    elif _is_sliceable(inputs):
        length = len(inputs)
    else:
        raise TypeError(
            f"split_between_processes cannot split a {type(inputs).__name__}: pass a list, tuple, "
            "tensor, dict of those, or an object with len() and slicing."
        )
    per_process, extras = divmod(length, num_processes)
    start = process_index * per_process + min(process_index, extras)
    end = start + per_process + (1 if process_index < extras else 0)
    target_len = per_process + (1 if extras > 0 else 0)
    return _split_values(inputs, start, end, target_len, apply_padding)


def _trigger_tensor(state: ProcessInfo) -> torch.Tensor:
    flag = state.__dict__.get("_trigger_flag")
    if flag is None:
        flag = torch.tensor(0, device=state.device)
        state.__dict__["_trigger_flag"] = flag
    return flag


def set_trigger(state: ProcessInfo) -> None:
    """Raise this process's trigger flag, seen by the next `check_trigger`."""
    state.__dict__["_trigger_flag"] = torch.tensor(1, device=state.device)


def check_trigger(state: ProcessInfo) -> bool:
    """True on every rank if any rank called set_trigger since the last check; then resets."""
    flag = _trigger_tensor(state)
    total = flag
    if state.use_distributed:
        total = flag.clone()
        with ledger.entered("reduce", flag) as entry:
            check_collective(entry, state, arguments="reduction=sum")
            dist.all_reduce(total, op=dist.ReduceOp.SUM)
    if int(total.item()) >= 1:
        state.__dict__["_trigger_flag"] = torch.tensor(0, device=state.device)
        return True
    return False
