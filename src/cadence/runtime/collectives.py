"""Collectives and device moves over tensors nested in lists, tuples, dicts and namedtuples."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from ..core.enums import DistributedType
from ..core.input_errors import with_rank
from ..core.nested import UnsupportedType as _UnsupportedType
from ..core.nested import honor_type as honor_type
from ..core.nested import is_namedtuple as is_namedtuple
from ..core.nested import is_tensor as is_tensor
from ..core.nested import is_torch_tensor as is_torch_tensor
from ..core.nested import recursively_apply as recursively_apply
from ..diagnostics import ledger as _ledger_module
from ..diagnostics.errors import DistributedOperationException as DistributedOperationException
from ..diagnostics.precheck import check_collective
from ..diagnostics.signature import describe_dimensions
from ..xla import collectives as xla_collectives
from .state import PartialState

_ledger = _ledger_module.ledger

_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCTIONS = ("sum", "mean", "none", "max")


class _FastState:
    """The few PartialState fields a collective needs, read without constructing PartialState."""

    __slots__ = ()

    @property
    def _shared(self) -> dict[str, Any]:
        shared = PartialState._shared_state
        if not shared:
            PartialState()
        return shared

    @property
    def use_distributed(self) -> bool:
        return self._shared.get("num_processes", 1) > 1

    def __getattr__(self, name: str) -> Any:
        try:
            return self._shared[name]
        except KeyError:
            raise AttributeError(name) from None


def _state() -> Any:
    return _FAST_STATE


def _on_xla(state: Any) -> bool:
    # XLA replicas exchange through torch_xla (cadence.xla.collectives), not a gloo/NCCL group.
    return getattr(state, "distributed_type", None) == DistributedType.XLA


_FAST_STATE = _FastState()


def describe(data: Any) -> Any:
    """The structure of `data` with each tensor replaced by "dtype[shape]": what ranks must agree on."""
    return recursively_apply(
        lambda t: f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}",
        data,
        test_type=is_tensor,
    )


# -- device moves ------------------------------------------------------------------------------
def send_to_device(
    tensor: Any, device: Any, non_blocking: bool = False, skip_keys: list[str] | str | None = None
) -> Any:
    """Move every tensor (or object with `.to`) of a nested structure to `device`.

    Args:
        tensor (Any): A tensor, or lists, tuples, dicts and dataclasses of them.
        device (torch.device | str | int): The target device.
        non_blocking (bool): Copy with `non_blocking=True` (default False).
        skip_keys (str | list[str] | None): Keys of dicts whose values stay where they are.

    Returns:
        The same structure on `device`.

    Example:
        >>> import torch
        >>> from cadence.utils import send_to_device
        >>> send_to_device({"x": torch.ones(2), "n": 3}, "cpu")["x"].device
        device(type='cpu')
    """
    if isinstance(skip_keys, str):
        skip_keys = [skip_keys]
    if isinstance(tensor, (tuple, list)):
        return honor_type(
            tensor, (send_to_device(t, device, non_blocking, skip_keys) for t in tensor)
        )
    if isinstance(tensor, Mapping):
        skip = skip_keys or ()
        return type(tensor)(
            {
                k: v if k in skip else send_to_device(v, device, non_blocking, skip_keys)
                for k, v in tensor.items()
            }
        )
    if is_tensor(tensor):
        return tensor.to(device, non_blocking=non_blocking)
    if hasattr(tensor, "to") and callable(tensor.to):
        try:
            return tensor.to(device, non_blocking=non_blocking)
        except TypeError:
            return tensor.to(device)
    return tensor


# -- collectives -------------------------------------------------------------------------------
def _gather_one(tensor: torch.Tensor, num_processes: int) -> torch.Tensor:
    # Gathered values carry no autograd history (as in the reference); a tensor that requires grad
    # would otherwise make the collective's in-place write into the output views fail.
    tensor = tensor.detach()
    if tensor.ndim == 0:
        tensor = tensor.reshape(1)
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    out = torch.empty(
        (num_processes * tensor.shape[0], *tensor.shape[1:]),
        dtype=tensor.dtype,
        device=tensor.device,
    )
    _all_gather_flat(out, tensor)
    return out


def gather(tensor: Any) -> Any:
    """Concatenate every process's tensors along the first dimension; every process gets the result.

    Tensors must have the same shape on every process except the first dimension being equal too (use
    `pad_across_processes` first otherwise); 0-d tensors become 1-d.

    Args:
        tensor (torch.Tensor | list | tuple | dict): A tensor or a nested structure of tensors.

    Returns:
        The same structure, each tensor `num_processes` times longer, in rank order.

    Example:
        >>> import torch
        >>> from cadence.utils import gather
        >>> gather(torch.tensor([1, 2])).tolist()  # on 2 processes: [1, 2, 1, 2]
        [1, 2]
    """
    state = _state()
    try:
        if not state.use_distributed:
            recursively_apply(lambda t: t, tensor, error_on_other_type=True)
            return tensor
        if _on_xla(state):
            return recursively_apply(xla_collectives.gather_one, tensor, error_on_other_type=True)
        with _ledger.entered("gather", tensor) as entry:
            check_collective(entry, state)
            return recursively_apply(
                _gather_one, tensor, state.num_processes, error_on_other_type=True
            )
    except _UnsupportedType as error:
        raise TypeError(f"{error} Use gather_object for other Python objects.") from None


def gather_object(object: Any) -> Any:
    """Gather picklable objects from every process; lists and tuples are concatenated in rank order.

    Args:
        object (Any): A picklable object (a list of results, usually).

    Returns:
        list: Every process's items, in rank order.

    Example:
        >>> from cadence.utils import gather_object
        >>> gather_object(["a", "b"])  # on 2 processes: ['a', 'b', 'a', 'b']
        ['a', 'b']
    """
    state = _state()
    if not state.use_distributed:
        return object
    if _on_xla(state):
        everyone = xla_collectives.gather_object(object, state.num_processes, state.device)
        if all(isinstance(o, (list, tuple)) for o in everyone):
            return [item for part in everyone for item in part]
        return everyone
    with _ledger.entered("gather_object") as entry:
        check_collective(entry, state, signature="any object")
        everyone: list[Any] = [None] * state.num_processes
        dist.all_gather_object(everyone, object)
    if all(isinstance(o, (list, tuple)) for o in everyone):
        return [item for part in everyone for item in part]
    return everyone


def _reduce_one(tensor: torch.Tensor, reduction: str, num_processes: int) -> torch.Tensor:
    result = tensor.clone()
    op = dist.ReduceOp.MAX if reduction == "max" else dist.ReduceOp.SUM
    dist.all_reduce(result, op)
    if reduction == "mean":
        if not (result.is_floating_point() or result.is_complex()):
            raise TypeError(
                with_rank(
                    f"reduce(..., reduction='mean') needs floating-point tensors, got {result.dtype}; "
                    "convert with .float() first."
                )
            )
        result /= num_processes
    return result


def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """Reduce tensors across processes; every process gets the result.

    Args:
        tensor (torch.Tensor | list | tuple | dict): A tensor or a nested structure of tensors.
        reduction (str): "mean" (this function's default), "sum", or "none" (sums without dividing,
            as Accelerate does). `Accelerator.reduce` defaults to "sum".
        scale (float): A factor applied after the reduction, on XLA devices only (as documented by
            Accelerate; default 1.0).

    Returns:
        The reduced data, of the same structure.

    Example:
        >>> import torch
        >>> from cadence.utils import reduce
        >>> reduce(torch.tensor([2.0, 4.0]), reduction="sum").tolist()
        [2.0, 4.0]
    """
    if reduction not in REDUCTIONS:
        raise ValueError(
            with_rank(
                f"Unknown reduction {reduction!r}: use one of {', '.join(map(repr, REDUCTIONS))}."
            )
        )
    state = _state()
    if _on_xla(state):  # `scale` applies here, on one device too
        return recursively_apply(
            xla_collectives.reduce_one, tensor, reduction, float(scale), state.num_processes,
            error_on_other_type=True,
        )  # fmt: skip
    if not state.use_distributed:
        return recursively_apply(torch.Tensor.clone, tensor, error_on_other_type=True)
    with _ledger.entered("reduce", tensor) as entry:
        check_collective(entry, state, arguments=f"reduction={reduction!r}")
        return recursively_apply(
            _reduce_one, tensor, reduction, state.num_processes, error_on_other_type=True
        )


def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """Overwrite every process's tensors, in place, with those of process `from_process`.

    Args:
        tensor (torch.Tensor | list | tuple | dict): A tensor or a nested structure of tensors, of the
            same shapes on every process.
        from_process (int): The rank whose values are sent (default 0).

    Returns:
        The same structure, holding `from_process`'s values.
    """
    state = _state()
    if not state.use_distributed:
        return tensor
    _check_rank(from_process, state)

    def one(t: torch.Tensor) -> torch.Tensor:
        dist.broadcast(t, src=from_process)
        return t

    if _on_xla(state):
        return recursively_apply(
            xla_collectives.broadcast_one, tensor, from_process, error_on_other_type=True
        )

    with _ledger.entered("broadcast", tensor) as entry:
        check_collective(entry, state, arguments=f"from_process={from_process}")
        return recursively_apply(one, tensor, error_on_other_type=True)


def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Replace the items of `object_list`, in place, with those of process `from_process`.

    Args:
        object_list (list): A list of picklable objects, of the same length on every process.
        from_process (int): The rank whose items are sent (default 0).

    Returns:
        list: `object_list`, updated.
    """
    state = _state()
    if not isinstance(object_list, list):
        raise TypeError(
            f"broadcast_object_list needs a list (it fills it in place), got {type(object_list).__name__}."
        )
    if not state.use_distributed:
        return object_list
    _check_rank(from_process, state)
    if _on_xla(state):
        xla_collectives.broadcast_object_list(object_list, from_process, state.device)
        return object_list
    with _ledger.entered("broadcast_object_list") as entry:
        check_collective(
            entry,
            state,
            signature=f"list of {len(object_list)}",
            arguments=f"from_process={from_process}",
        )
        dist.broadcast_object_list(object_list, src=from_process)
    return object_list


def _check_rank(rank: int, state: Any) -> None:
    if not isinstance(rank, int) or not 0 <= rank < state.num_processes:
        raise ValueError(
            with_rank(
                f"from_process={rank!r} is not a rank of this job (0 to {state.num_processes - 1})."
            )
        )


class CannotPadNestedTensorWarning(UserWarning):
    """Warned when `pad_across_processes` meets a nested tensor, which it cannot pad."""


def _warn_nested(tensor: torch.Tensor) -> torch.Tensor:
    if getattr(tensor, "is_nested", False):
        warnings.warn(
            "Cannot pad nested tensors: a nested tensor has no single size along `dim`; it is "
            "returned unpadded. Pad its components before nesting them to gather them.",
            CannotPadNestedTensorWarning,
            stacklevel=4,
        )
    return tensor


def _pad_one(tensor: torch.Tensor, dim: int, pad_index: Any, pad_first: bool) -> torch.Tensor:
    if getattr(tensor, "is_nested", False) or not -tensor.ndim <= dim < tensor.ndim:
        return tensor
    dim = dim % tensor.ndim
    sizes = gather(torch.tensor(tensor.shape, device=tensor.device)[None]).cpu()
    max_size = int(sizes[:, dim].max())
    if max_size == tensor.shape[dim]:
        return tensor
    new_shape = list(tensor.shape)
    new_shape[dim] = max_size
    padded = tensor.new_zeros(new_shape) + pad_index
    start = max_size - tensor.shape[dim] if pad_first else 0
    padded.narrow(dim, start, tensor.shape[dim]).copy_(tensor)
    return padded


def pad_across_processes(
    tensor: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False
) -> Any:
    """Pad each tensor along `dim` to the largest size any process has, so that they can be gathered.

    Args:
        tensor (torch.Tensor | list | tuple | dict): A tensor or a nested structure of tensors.
        dim (int): The dimension to pad (default 0).
        pad_index (int | float): The padding value (default 0).
        pad_first (bool): Pad at the start instead of the end (default False).

    Returns:
        The padded data, of the same structure.
    """
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(
            with_rank(f"pad_across_processes(dim=...) must be an integer, got {dim!r}.")
        )
    # nested tensors are left as they are, with a warning, on one process as on several
    recursively_apply(_warn_nested, tensor, error_on_other_type=True)
    state = _state()
    if not state.use_distributed:
        return tensor
    with _ledger.entered("pad_across_processes", tensor) as entry:
        check_collective(
            entry, state, signature=describe_dimensions(tensor), arguments=f"dim={dim}"
        )
        return recursively_apply(
            _pad_one, tensor, dim, pad_index, pad_first, error_on_other_type=True
        )


def concatenate(data: list[Any], dim: int = 0) -> Any:
    """Concatenate a list of equally nested structures of tensors along `dim`.

    Args:
        data (list): Structures of the same shape (tensors, or lists/tuples/dicts of them).
        dim (int): The dimension to concatenate along (default 0).

    Returns:
        One structure of that shape, each tensor the concatenation of the corresponding ones.
    """
    if not isinstance(data, (list, tuple)) or not data:
        raise TypeError("concatenate needs a non-empty list of tensors or of nested structures.")
    first = data[0]
    if isinstance(first, (tuple, list)):
        return honor_type(
            first, (concatenate([d[i] for d in data], dim) for i in range(len(first)))
        )
    if isinstance(first, Mapping):
        return type(first)({k: concatenate([d[k] for d in data], dim) for k in first})
    if not is_tensor(first):
        if len(data) == 1:
            return first  # a single batch needs no joining, whatever it holds (as the reference)
        raise TypeError(f"Can only concatenate tensors, got {type(first).__name__}.")
    return torch.cat(list(data), dim=dim)
