"""Moving one parameter or buffer of a module, and keeping tied weights tied while doing it."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any, Optional, Union

import torch
from torch import nn

from .sizes import as_dtype, is_integer_dtype, named_module_tensors

logger = logging.getLogger(__name__)

DeviceLike = Union[int, str, torch.device]


def to_torch_device(device: DeviceLike) -> torch.device:
    """A torch.device for a device-map value: an int is a GPU index, a string or device as is."""
    if isinstance(device, torch.device):
        return device
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cuda", device)
    return torch.device(device)


def check_device_same(first_device: torch.device, second_device: torch.device) -> bool:
    """True when both are the same device, "cuda" and "cuda:0" counting as the same.

    Args:
        first_device (torch.device): A device.
        second_device (torch.device): Another device.

    Returns:
        bool: Whether they name the same device.
    """
    if first_device.type != second_device.type:
        return False
    if first_device.type == "cuda" and (first_device.index is None or second_device.index is None):
        # "cuda" alone means the current device
        current = torch.cuda.current_device() if torch.cuda.is_available() else 0
        return (first_device.index or current) == (second_device.index or current)
    return first_device == second_device


def _split_tensor_name(module: nn.Module, tensor_name: str) -> tuple[nn.Module, str]:
    if "." in tensor_name:
        *path, tensor_name = tensor_name.split(".")
        for part in path:
            child = getattr(module, part, None)
            if child is None:
                raise ValueError(f"{module} has no attribute {part}.")
            module = child
    if tensor_name not in module._parameters and tensor_name not in module._buffers:
        raise ValueError(f"{module} does not have a parameter or a buffer named {tensor_name}.")
    return module, tensor_name


def set_module_tensor_to_device(
    module: nn.Module,
    tensor_name: str,
    device: DeviceLike,
    value: Optional[torch.Tensor] = None,
    dtype: Union[str, torch.dtype, None] = None,
    fp16_statistics: Optional[torch.HalfTensor] = None,
    tied_params_map: Optional[dict[int, dict[torch.device, torch.Tensor]]] = None,
    non_blocking: bool = False,
    clear_cache: bool = True,
) -> None:
    """Put the parameter or buffer `tensor_name` (a dotted path) of `module` on `device`.

    With `value`, its content replaces the tensor's (shapes must match; cast to `dtype`, or to the
    current dtype when `dtype` is None; integer values are never cast). Without `value` the tensor
    is moved, which needs real data unless `device` is "meta". A parameter stays a Parameter of the
    same class with the same `requires_grad`. `tied_params_map` ({data_ptr: {device: tensor}})
    lets tied weights share one copy per device.

    Example:
        >>> model = torch.nn.Linear(2, 2, device="meta")
        >>> set_module_tensor_to_device(model, "weight", "cpu", value=torch.ones(2, 2))
        >>> model.weight.device
        device(type='cpu')

    Args:
        module (nn.Module): The module holding the tensor.
        tensor_name (str): The tensor's path from `module`, e.g. "layer.0.weight".
        device (DeviceLike): Where the tensor goes.
        value (torch.Tensor | None): New content; None moves the current one.
        dtype (str | torch.dtype | None): The dtype to give `value`; None keeps the tensor's own.
        fp16_statistics (torch.HalfTensor | None): bitsandbytes' int8 statistics (`SCB`), set on the
            new parameter.
        tied_params_map (dict[int, dict[torch.device, torch.Tensor]] | None): Copies of tied weights
            already placed, by data pointer then device.
        non_blocking (bool): Copy asynchronously with respect to the host (default False).
        clear_cache (bool): Empty the CUDA cache after a move to CUDA (default True).

    Raises:
        ValueError: A meta tensor moved to a real device without `value`, or a `value` of another
            shape.
    """
    module, tensor_name = _split_tensor_name(module, tensor_name)
    dtype = as_dtype(dtype)
    is_buffer = tensor_name in module._buffers
    old_value = getattr(module, tensor_name)
    target = to_torch_device(device)

    if (
        value is not None
        and tied_params_map is not None
        and value.data_ptr() in tied_params_map
        and target in tied_params_map[value.data_ptr()]
    ):
        # a tied weight already placed on this device: share that copy instead of another one
        module._parameters[tensor_name] = tied_params_map[value.data_ptr()][target]
        return
    if (
        tied_params_map is not None
        and old_value.data_ptr() in tied_params_map
        and target in tied_params_map[old_value.data_ptr()]
    ):
        module._parameters[tensor_name] = tied_params_map[old_value.data_ptr()][target]
        return

    if old_value.device.type == "meta" and target.type != "meta" and value is None:
        raise ValueError(
            f"{tensor_name} is on the meta device, we need a `value` to put in on {device}."
        )
    if value is not None:
        if not isinstance(value, torch.Tensor):
            value = torch.tensor(value)
        if old_value.shape != value.shape:
            raise ValueError(
                f'Trying to set a tensor of shape {value.shape} in "{tensor_name}" (which has shape '
                f"{old_value.shape}), this looks incorrect."
            )
        if dtype is None:
            # like nn.Module.load_state_dict: the module's dtype wins
            value = value.to(old_value.dtype, non_blocking=non_blocking)
        elif not is_integer_dtype(value.dtype):
            value = value.to(dtype, non_blocking=non_blocking)

    param = module._parameters.get(tensor_name)
    param_cls = type(param) if param is not None else None
    with torch.no_grad():
        if value is None:
            new_value = old_value.to(target, non_blocking=non_blocking)
            if (
                dtype is not None
                and target.type == "meta"
                and not is_integer_dtype(old_value.dtype)
            ):
                new_value = new_value.to(dtype)
        else:
            new_value = value.to(target, non_blocking=non_blocking)
        if is_buffer:
            module._buffers[tensor_name] = new_value
        elif (
            value is not None
            or not check_device_same(target, param.device)
            or new_value.dtype != param.dtype
        ):
            if param_cls is nn.Parameter or param_cls is None:
                new_param = nn.Parameter(new_value, requires_grad=old_value.requires_grad)
            else:  # a Parameter subclass: rebuild the same class
                new_param = param_cls(new_value, requires_grad=old_value.requires_grad)
            module._parameters[tensor_name] = new_param
            if fp16_statistics is not None:
                new_param.SCB = fp16_statistics.to(target)
    if clear_cache and target.type == "cuda" and value is None:
        torch.cuda.empty_cache()
    if (
        value is not None
        and tied_params_map is not None
        and value.data_ptr() in tied_params_map
        and target not in tied_params_map[value.data_ptr()]
    ):
        tied_params_map[value.data_ptr()][target] = module._parameters.get(tensor_name, new_value)
    elif (
        value is None
        and tied_params_map is not None
        and old_value.data_ptr() in tied_params_map
        and target not in tied_params_map[old_value.data_ptr()]
    ):
        tied_params_map[old_value.data_ptr()][target] = module._parameters.get(
            tensor_name, new_value
        )


def find_tied_parameters(model: nn.Module, **kwargs: Any) -> list[list[str]]:
    """Groups of parameter names that are the same Parameter object (tied weights), sorted.

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
        >>> model[1].weight = model[0].weight
        >>> find_tied_parameters(model)
        [['0.weight', '1.weight']]

    Args:
        model (nn.Module): The model to inspect.
        **kwargs: Ignored; accepted for Accelerate's signature.

    Returns:
        list[list[str]]: Each group's names, sorted.
    """
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return sorted(sorted(names) for names in groups.values() if len(names) > 1)


def retie_parameters(model: nn.Module, tied_params: list[list[str]]) -> None:
    """Make every name of each group in `tied_params` point to one Parameter again.

    The Parameter kept is the first of the group that holds data (not on the meta device).

    Args:
        model (nn.Module): The model to fix.
        tied_params (list[list[str]]): Groups of parameter names that must be one Parameter.
    """
    for group in tied_params:
        chosen = None
        for name in group:
            param = model.get_parameter(name)
            if param.device.type != "meta":
                chosen = param
                break
        if chosen is None:
            chosen = model.get_parameter(group[0])
        for name in group:
            owner_name, _, attr = name.rpartition(".")
            owner = model.get_submodule(owner_name) if owner_name else model
            owner._parameters[attr] = chosen


def _param_device(name: str, device_map: Mapping[str, Any]) -> Any:
    while name and name not in device_map:
        name = name.rpartition(".")[0]
    return device_map.get(name)


def check_tied_parameters_on_same_device(
    tied_params: list[list[str]], device_map: Mapping[str, Any]
) -> None:
    """Warn when a device map puts weights that are tied on different devices.

    Args:
        tied_params (list[list[str]]): Groups of tied parameter names, as `find_tied_parameters` returns.
        device_map (Mapping[str, Any]): Module names and their devices.
    """
    for group in tied_params:
        devices = {name: _param_device(name, device_map) for name in group}
        if len(set(map(str, devices.values()))) > 1:
            logger.warning(
                "Tied parameters are on different devices: %s. Please modify your custom device map "
                "or set `device_map='auto'`.",
                devices,
            )


def check_tied_parameters_in_config(model: nn.Module) -> bool:
    """True when a transformers-style `model.config` says its word embeddings are tied.

    Args:
        model (nn.Module): The model; its `config` is read when it has one.

    Returns:
        bool: True when the config ties the embeddings and the model has output embeddings.
    """
    config = getattr(model, "config", None)
    if config is None:
        return False
    tie = getattr(config, "tie_word_embeddings", False) or getattr(
        config, "tie_encoder_decoder", False
    )
    return bool(tie) and hasattr(model, "get_output_embeddings")


def id_tensor_storage(tensor: torch.Tensor) -> tuple[torch.device, int, int]:
    """(device, storage start, storage end): equal for tensors that share memory.

    Args:
        tensor (torch.Tensor): The tensor.

    Returns:
        tuple[torch.device, int, int]: Its device and the byte range of its storage.
    """
    if tensor.device.type == "meta":
        return tensor.device, 0, 0
    storage = tensor.untyped_storage()
    return tensor.device, storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def is_peft_model(model: Any) -> bool:
    """True for a `peft.PeftModel`, without importing peft when it is not installed.

    Args:
        model (Any): Any object.

    Returns:
        bool: Whether it is a `peft.PeftModel`.
    """
    import sys

    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def has_offloaded_params(module: nn.Module) -> bool:
    """True when `module` has an AlignDevicesHook that offloads its weights (they live elsewhere).

    Args:
        module (nn.Module): The module to inspect.

    Returns:
        bool: Whether its hook offloads its weights.
    """
    hook = getattr(module, "_hf_hook", None)
    return hook is not None and bool(getattr(hook, "offload", False))


@contextlib.contextmanager
def align_module_device(
    module: nn.Module, execution_device: Optional[torch.device] = None
) -> Iterator[None]:
    """Inside the block the weights of `module` are real tensors (onloaded from their offload
    storage if needed), on `execution_device` when given; they go back afterwards.

    Args:
        module (nn.Module): The module whose direct weights are needed.
        execution_device (torch.device | None): Where to put them for the block; None leaves weights
            that are not offloaded where they are.
    """
    hook = getattr(module, "_hf_hook", None)
    if has_offloaded_params(module):
        original = hook.execution_device
        if execution_device is not None:
            hook.execution_device = execution_device
        try:
            hook.pre_forward(module)
            yield
        finally:
            hook.post_forward(module, None)
            hook.execution_device = original
    elif execution_device is not None:
        devices = {name: p.device for name, p in module.named_parameters(recurse=False)}
        try:
            for name in devices:
                set_module_tensor_to_device(module, name, execution_device)
            yield
        finally:
            for name, device in devices.items():
                set_module_tensor_to_device(module, name, device)
    else:
        yield


def get_state_dict_from_offload(
    module: nn.Module,
    module_name: str,
    state_dict: dict[str, torch.Tensor],
    device_to_put_offload: DeviceLike = "cpu",
) -> dict[str, torch.Tensor]:
    """Add the weights of an offloaded `module` (read back onto `device_to_put_offload`) to
    `state_dict` under `module_name.`.

    Args:
        module (nn.Module): The offloaded module.
        module_name (str): Its name in the model ("" for the model itself).
        state_dict (dict[str, torch.Tensor]): The state dict to complete; only keys already in it are
            replaced.
        device_to_put_offload (DeviceLike): Where the weights are read back to (default "cpu").

    Returns:
        dict[str, torch.Tensor]: `state_dict`.
    """
    with align_module_device(module, device_to_put_offload):
        for name, tensor in module.state_dict().items():
            key = f"{module_name}.{name}" if module_name else name
            if key in state_dict:
                state_dict[key] = tensor.detach().to(device_to_put_offload)
    return state_dict


def get_state_dict_offloaded_model(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full state dict of a dispatched model, weights offloaded to CPU or disk included, on CPU.

    Modules are onloaded one at a time, so CPU memory must hold the result plus one module.

    Args:
        model (nn.Module): The dispatched model.

    Returns:
        dict[str, torch.Tensor]: Its state dict, on the CPU.

    Raises:
        MemoryError: A module that does not fit in CPU memory.
    """
    state: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        direct = [n for n, _ in named_module_tensors(module, remove_non_persistent=True)]
        if not direct:
            continue
        try:
            with align_module_device(module, "cpu"):
                for key in direct:
                    tensor = getattr(module, key)
                    if tensor.device.type != "meta":
                        state[f"{name}.{key}" if name else key] = tensor.detach().to("cpu")
        except MemoryError:
            raise MemoryError(
                "Offloaded module must fit in CPU memory to call save_model!"
            ) from None
    for key in [k for k in model.state_dict() if k not in state]:
        # held by the hook of a parent that loads its whole subtree (preload_module_classes)
        owner_name = key.rpartition(".")[0]
        owner = model.get_submodule(owner_name) if owner_name else model
        while owner_name and not has_offloaded_params(owner):
            owner_name = owner_name.rpartition(".")[0]
            owner = model.get_submodule(owner_name) if owner_name else model
        with align_module_device(owner, "cpu"):
            tensor = model.get_submodule(key.rpartition(".")[0]).__getattr__(key.rpartition(".")[2])
            if tensor.device.type != "meta":
                state[key] = tensor.detach().to("cpu")
    return {k: state[k] for k in model.state_dict() if k in state}
