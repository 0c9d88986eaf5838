"""Pipeline-parallel inference: one model split in stages over the processes (`prepare_pippy`).

Built on `torch.distributed.pipelining`: the model is traced, cut at the split points, each process
keeps one stage, and a GPipe schedule streams micro-batches through the stages. The first process
feeds the inputs; the last one gets the outputs (every process with `gather_output=True`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import MethodType
from typing import Any, Optional, Union

import torch
from torch import nn

from ..runtime.collectives import send_to_device
from ..runtime.state import PartialState
from .device_map import infer_auto_device_map
from .sizes import calculate_maximum_sizes


def is_pippy_available() -> bool:
    """True when this torch has `torch.distributed.pipelining` (2.4 and later)."""
    try:
        import torch.distributed.pipelining  # noqa: F401  optional dependency (torch >= 2.4)
    except ImportError:
        return False
    return True


def generate_device_map(
    model: nn.Module,
    num_processes: int = 1,
    no_split_module_classes: Optional[list[str]] = None,
    max_memory: Optional[dict] = None,
) -> dict[str, Union[int, str]]:
    """A device map cutting `model` into `num_processes` stages of about equal size (device i = stage i).

    Without `max_memory` each stage may hold 1.1x an equal share (plus the biggest layer), rounded up.
    The map is not cleaned, so its first entry on each device is a module the model can be cut at.

    Args:
        model (nn.Module): The model to split.
        num_processes (int): The number of stages (default 1).
        no_split_module_classes (list[str] | None): Class names of modules that must stay in one stage.
        max_memory (dict | None): Bytes allowed per stage (device index -> size); None computes equal
            shares as described above.

    Returns:
        dict[str, int | str]: Module names and their stage.
    """
    if num_processes == 1:
        return infer_auto_device_map(
            model, no_split_module_classes=no_split_module_classes, clean_result=False
        )
    if max_memory is None:
        total, (largest, _) = calculate_maximum_sizes(model)
        share = math.ceil((total + largest) / num_processes * 1.1)
        max_memory = dict.fromkeys(range(num_processes), share)
    return infer_auto_device_map(
        model,
        max_memory=max_memory,
        no_split_module_classes=no_split_module_classes,
        clean_result=False,
    )


def _batch_size(value: Any) -> Optional[int]:
    if isinstance(value, torch.Tensor):
        return value.shape[0] if value.ndim else None
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _batch_size(item)
            if found is not None:
                return found
    if isinstance(value, dict):
        for item in value.values():
            found = _batch_size(item)
            if found is not None:
                return found
    return None


def find_pippy_batch_size(args: Any, kwargs: Any) -> Optional[int]:
    """The first dimension of the first tensor in `args`, else in `kwargs` (None when there is none).

    Args:
        args (Any): The positional inputs.
        kwargs (Any): The keyword inputs.

    Returns:
        int | None: The batch size.
    """
    found = _batch_size(list(args or ()))
    if found is None and kwargs:
        found = _batch_size(dict(kwargs))
    return found


def pad_input_tensors(tensor: Any, batch_size: int, num_processes: int, dim: int = 0) -> Any:
    """Pad every tensor along `dim` (repeating zeros) so `batch_size` becomes a multiple of
    `num_processes`; when the batch is smaller than `num_processes`, up to `num_processes`."""
    if isinstance(tensor, (list, tuple)):
        return type(tensor)(pad_input_tensors(t, batch_size, num_processes, dim) for t in tensor)
    if isinstance(tensor, dict):
        return {k: pad_input_tensors(v, batch_size, num_processes, dim) for k, v in tensor.items()}
    if not isinstance(tensor, torch.Tensor) or tensor.ndim == 0 or batch_size % num_processes == 0:
        return tensor
    target = max(num_processes, math.ceil(batch_size / num_processes) * num_processes)
    pad_shape = list(tensor.shape)
    pad_shape[dim] = target - tensor.shape[dim]
    return torch.cat([tensor, tensor.new_zeros(pad_shape)], dim=dim)


def build_pipeline(
    model: nn.Module, split_points: list[str], args: tuple, kwargs: Optional[dict], num_chunks: int
) -> Any:
    """Trace `model` with the example inputs, cut it before each of `split_points`, and return this
    process's GPipe schedule over its stage.

    Args:
        model (nn.Module): The model to split.
        split_points (list[str]): Names of the modules each new stage starts at.
        args (tuple): Example positional inputs of one micro-batch, for tracing.
        kwargs (dict | None): Example keyword inputs of one micro-batch.
        num_chunks (int): The number of micro-batches per batch.

    Returns:
        The `torch.distributed.pipelining.ScheduleGPipe` of this process's stage.
    """
    from torch.distributed.pipelining import (  # optional dependency
        ScheduleGPipe,
        SplitPoint,
        pipeline,
    )

    state = PartialState()
    pipe = pipeline(
        model,
        mb_args=tuple(args or ()),
        mb_kwargs=kwargs or None,
        split_spec=dict.fromkeys(split_points, SplitPoint.BEGINNING),
    )
    stage = pipe.build_stage(state.local_process_index, device=state.device)
    return ScheduleGPipe(stage, num_chunks)


def copy_tensor_to_devices(tensor: Any = None) -> Any:
    """The last process's `tensor` (any picklable structure) on every process, on its device."""
    import torch.distributed as dist

    state = PartialState()
    if state.num_processes == 1 or not dist.is_initialized():
        return tensor
    box = [send_to_device(tensor, "cpu") if state.is_last_process else None]
    dist.broadcast_object_list(box, src=state.num_processes - 1)
    return send_to_device(box[0], state.device)


def pippy_forward(
    forward: Callable, num_chunks: int, gather_output: bool, *args: Any, **kwargs: Any
) -> Any:
    """Run one step of the schedule: the first process feeds the batch (padded to a multiple of
    `num_chunks`), the last returns the output, the others return None (or the output with
    `gather_output`).

    Args:
        forward (Callable): The schedule's `step`.
        num_chunks (int): The number of micro-batches per batch.
        gather_output (bool): Send the last stage's output to every process.
        *args: The positional inputs (used on the first process).
        **kwargs: The keyword inputs (used on the first process).

    Returns:
        The output on the last process (everywhere with `gather_output`); None elsewhere.

    Raises:
        ValueError: Inputs with no tensor to find the batch size from.
    """

    state = PartialState()
    output = None
    if state.num_processes == 1:
        output = forward(*args, **kwargs)
    elif state.is_local_main_process:
        batch = find_pippy_batch_size(args, kwargs)
        if batch is None:
            raise ValueError("Could not find batch size from args or kwargs")
        if batch != num_chunks:
            args = pad_input_tensors(args, batch, num_chunks)
            kwargs = pad_input_tensors(kwargs, batch, num_chunks)
        forward(*args, **kwargs)
    elif state.is_last_process:
        output = forward()
    else:
        forward()
    if gather_output:
        output = copy_tensor_to_devices(output)
    return output


def prepare_pippy(
    model: nn.Module,
    split_points: Union[str, list[str], None] = "auto",
    no_split_module_classes: Optional[list[str]] = None,
    example_args: Optional[tuple[Any]] = (),
    example_kwargs: Optional[dict[str, Any]] = None,
    num_chunks: Optional[int] = None,
    gather_output: Optional[bool] = False,
) -> nn.Module:
    """Split `model` into one pipeline stage per process, for inference; returns it with a new forward.

    Every process calls the model with the same arguments; the first process's inputs go through the
    stages in `num_chunks` micro-batches, and the last process gets the output (the others get None
    unless `gather_output=True`).

    Args:
        model (torch.nn.Module): The model, whole on every process.
        split_points (str | list[str] | None): Module names where a new stage begins, or "auto"
            (default) to cut the model into stages of equal size.
        no_split_module_classes (list[str] | None): With "auto", module classes never cut in two.
        example_args (tuple): Positional inputs of one micro-batch, used to trace the model (on CPU).
        example_kwargs (dict | None): Keyword inputs of one micro-batch.
        num_chunks (int | None): Micro-batches in flight; None means the number of processes.
        gather_output (bool): Send the output to every process (default False).

    Returns:
        torch.nn.Module: The model, its forward running this process's stage.

    Raises:
        ImportError: `torch.distributed.pipelining` is missing (PyTorch older than 2.4).

    Example:
        >>> model = prepare_pippy(model, split_points="auto", example_args=(example_input,))  # doctest: +SKIP
        >>> with torch.no_grad():  # doctest: +SKIP
        ...     output = model(batch)  # on every process
        >>> if PartialState().is_last_process:  # doctest: +SKIP
        ...     print(output)
    """
    if not is_pippy_available():
        raise ImportError("Using `torch.distributed.pipelining` requires PyTorch 2.4.0 or later.")

    state = PartialState()
    example_args = send_to_device(example_args, "cpu")
    example_kwargs = send_to_device(example_kwargs, "cpu")
    if num_chunks is None:
        num_chunks = state.num_processes
    if split_points == "auto":
        device_map = generate_device_map(
            model, num_chunks, no_split_module_classes=no_split_module_classes
        )
        split_points = []
        for stage_index in range(1, num_chunks):
            first = next(
                (name for name, device in device_map.items() if device == stage_index), None
            )
            if first is None:
                raise ValueError(
                    f"Could not cut the model in {num_chunks} stages of equal size (stage {stage_index} got no "
                    "module); pass split_points explicitly."
                )
            split_points.append(first)
    elif (
        split_points is None
        or isinstance(split_points, str)
        or not isinstance(split_points, (list, tuple))
    ):
        raise ValueError(
            f'split_points must be "auto" or a list of module names, got {split_points!r}.'
        )
    split_points = list(split_points)
    if len(split_points) != state.num_processes - 1:
        raise ValueError(
            f"{len(split_points)} split point(s) make {len(split_points) + 1} stages, but {state.num_processes} "
            "processes run: give one split point fewer than the number of processes."
        )
    known = {name for name, _ in model.named_modules()}
    unknown = [p for p in split_points if p not in known]
    if unknown:
        raise ValueError(
            f"split_points {unknown} are not modules of {type(model).__name__}; use names from model.named_modules()."
        )
    schedule = build_pipeline(model, split_points, example_args, example_kwargs, num_chunks)
    model._original_forward = model.forward
    model._original_call = model.__call__
    model.pippy_stage = schedule
    model.hf_split_points = split_points

    def forward(*args: Any, **kwargs: Any) -> Any:
        return pippy_forward(schedule.step, num_chunks, gather_output, *args, **kwargs)

    # like a decorator's __wrapped__: unwrapping the model finds its own forward again
    forward.__wrapped__ = MethodType(model._original_forward.__func__, model)  # type: ignore[attr-defined]
    model.forward = forward
    return model
