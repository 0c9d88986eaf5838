"""Hooks around a module's forward: move inputs, weights and outputs between devices.

A hook is attached by replacing the instance's `forward` with a wrapper that calls
`hook.pre_forward`, the original forward (kept as `module._old_forward`) and `hook.post_forward`;
the hook itself is `module._hf_hook` (Accelerate's attribute names, which transformers reads).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Optional, Union

import torch
from torch import nn

from ..runtime.collectives import send_to_device
from ..runtime.state import PartialState
from .sizes import get_non_persistent_buffers, named_module_tensors
from .tensors import set_module_tensor_to_device, to_torch_device

# attributes dispatch_model puts on a model (warning wrappers); removing the hooks removes them
ADDED_ATTRIBUTES = ("to", "cuda", "npu", "xpu", "mlu", "sdaa", "musa", "neuron")


def find_device(data: Any) -> Optional[torch.device]:
    """The device of the first tensor found in a nested structure of lists, tuples and dicts."""
    if isinstance(data, Mapping):
        for value in data.values():
            device = find_device(value)
            if device is not None:
                return device
    elif isinstance(data, (tuple, list)):
        for value in data:
            device = find_device(value)
            if device is not None:
                return device
    elif isinstance(data, torch.Tensor):
        return data.device
    return None


class ModelHook:
    """Base class of the hooks: override the steps you need.

    `init_hook(module)` runs when the hook is attached, `pre_forward(module, *args, **kwargs)`
    returns the new `(args, kwargs)`, `post_forward(module, output)` the new output,
    `detach_hook(module)` runs when it is removed. With `no_grad = True` the forward runs
    under `torch.no_grad()`.
    """

    no_grad = False

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Run when the hook is attached to `module`; return the module to use.

        Example::

            from cadence.hooks import ModelHook, add_hook_to_module

            class PrintShapes(ModelHook):
                def pre_forward(self, module, *args, **kwargs):
                    print([getattr(a, "shape", None) for a in args])
                    return args, kwargs

            add_hook_to_module(model, PrintShapes())

        Args:
            module (nn.Module): The module the hook is being attached to.

        Returns:
            nn.Module: The module to use from now on (usually `module` itself).
        """
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        """Run just before the forward of `module`; return the `(args, kwargs)` to call it with.

        Args:
            module (nn.Module): The module about to run.
            *args: The positional inputs of its forward.
            **kwargs: The keyword inputs of its forward.

        Returns:
            tuple[tuple, dict]: The positional and keyword inputs to call the forward with.
        """
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        """Run just after the forward of `module`; return the output to hand back.

        Args:
            module (nn.Module): The module that just ran.
            output (Any): What its forward returned.

        Returns:
            The output to hand back to the caller.
        """
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Run when the hook is removed from `module`; return the module to keep.

        Args:
            module (nn.Module): The module the hook is being removed from.

        Returns:
            nn.Module: The module to keep.
        """
        return module


class SequentialHook(ModelHook):
    """Several hooks run one after the other (pre_forward and post_forward in the same order).

    Args:
        *hooks (ModelHook): The hooks, in the order they run.
    """

    def __init__(self, *hooks: ModelHook) -> None:
        self.hooks = hooks

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Apply every hook's `init_hook` in order, each to the previous one's result.

        Args:
            module (nn.Module): The module the hook is being attached to.

        Returns:
            nn.Module: The module to use from now on (usually `module` itself).
        """
        for hook in self.hooks:
            module = hook.init_hook(module)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        """Pass `(args, kwargs)` through every hook's `pre_forward` in order.

        Args:
            module (nn.Module): The module about to run.
            *args: The positional inputs of its forward.
            **kwargs: The keyword inputs of its forward.

        Returns:
            tuple[tuple, dict]: The positional and keyword inputs to call the forward with.
        """
        for hook in self.hooks:
            args, kwargs = hook.pre_forward(module, *args, **kwargs)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        """Pass the output through every hook's `post_forward` in order.

        Args:
            module (nn.Module): The module that just ran.
            output (Any): What its forward returned.

        Returns:
            The output to hand back to the caller.
        """
        for hook in self.hooks:
            output = hook.post_forward(module, output)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Apply every hook's `detach_hook` in order, each to the previous one's result.

        Args:
            module (nn.Module): The module the hook is being removed from.

        Returns:
            nn.Module: The module to keep.
        """
        for hook in self.hooks:
            module = hook.detach_hook(module)
        return module


def _hooked_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    hook = module._hf_hook
    args, kwargs = hook.pre_forward(module, *args, **kwargs)
    if hook.no_grad:
        with torch.no_grad():
            output = module._old_forward(*args, **kwargs)
    else:
        output = module._old_forward(*args, **kwargs)
    return hook.post_forward(module, output)


def _is_graph_module_impl(module: nn.Module) -> bool:
    # torch.fx regenerates forward on the class of a GraphModule; an instance attribute would freeze it
    return "GraphModuleImpl" in str(type(module))


def add_hook_to_module(module: nn.Module, hook: ModelHook, append: bool = False) -> nn.Module:
    """Attach `hook` to `module` (replacing its hook, or after it with `append=True`); returns the module.

    Example:
        >>> class Scale(ModelHook):
        ...     def post_forward(self, module, output):
        ...         return output * 2
        >>> layer = add_hook_to_module(torch.nn.Identity(), Scale())
        >>> layer(torch.ones(1))
        tensor([2.])

    Args:
        module (nn.Module): The module whose forward is wrapped.
        hook (ModelHook): The hook to attach.
        append (bool): Keep an existing hook and run this one after it (default False: replace it).

    Returns:
        nn.Module: The module, as the hook's `init_hook` returned it.
    """
    if append and getattr(module, "_hf_hook", None) is not None:
        previous = module._hf_hook
        remove_hook_from_module(module)
        hook = SequentialHook(previous, hook)
    if hasattr(module, "_hf_hook") and hasattr(module, "_old_forward"):
        old_forward = module._old_forward  # replacing a hook: keep the user's forward
    else:
        old_forward = module.forward
        module._old_forward = old_forward
    module = hook.init_hook(module)
    module._hf_hook = hook
    forward = functools.update_wrapper(functools.partial(_hooked_forward, module), old_forward)
    if _is_graph_module_impl(module):
        module.__class__.forward = forward
    else:
        module.forward = forward
    return module


def remove_hook_from_module(module: nn.Module, recurse: bool = False) -> nn.Module:
    """Detach the hook of `module` (and of its submodules with `recurse=True`), restoring its forward.

    Args:
        module (nn.Module): The module to clean.
        recurse (bool): Clean every submodule too (default False).

    Returns:
        nn.Module: The same module.
    """
    if hasattr(module, "_hf_hook"):
        module._hf_hook.detach_hook(module)
        del module._hf_hook
    if hasattr(module, "_old_forward"):
        old = module.__dict__.pop("_old_forward")
        if _is_graph_module_impl(module):
            module.__class__.forward = old
        elif getattr(old, "__self__", None) is module and getattr(old, "__func__", None) is getattr(
            type(module), "forward", None
        ):
            module.__dict__.pop("forward", None)  # back to the class's own forward
        else:
            module.forward = old
    for attr in ADDED_ATTRIBUTES:
        module.__dict__.pop(attr, None)
    if recurse:
        for child in module.children():
            remove_hook_from_module(child, recurse)
    return module


def remove_hook_from_submodules(module: nn.Module) -> None:
    """Remove the hooks of `module` and of every submodule.

    Args:
        module (nn.Module): The root of the modules to clean.
    """
    remove_hook_from_module(module, recurse=True)


class AlignDevicesHook(ModelHook):
    """Runs a module on `execution_device`: moves its inputs there and, with `offload=True`, brings
    its weights in from `weights_map` before the forward and drops them (to the meta device) after.

    `io_same_device=True` moves the outputs back to the device of the inputs; `place_submodules`
    makes the hook handle the submodules' weights too; `offload_buffers` offloads buffers as well
    (else they stay on `execution_device`); `skip_keys` are input/output keys never moved.

    Args:
        execution_device (int | str | torch.device | None): Where the module runs; None leaves inputs
            and weights where they are.
        offload (bool): Keep the weights off the device (on meta) between forwards (default False).
        io_same_device (bool): Move the outputs back to the device of the inputs (default False).
        weights_map (Mapping | None): Where offloaded weights are read from, by name relative to the
            module; None keeps a CPU copy of the module's own weights.
        offload_buffers (bool): Offload the buffers too (default False).
        place_submodules (bool): Handle the submodules' weights as well as the module's own.
        skip_keys (str | list[str] | None): Keys of dict inputs and outputs that are never moved.
        tied_params_map (dict[int, dict[torch.device, torch.Tensor]] | None): Shared by the hooks of a
            model, so that tied weights are loaded onto a device once: keyed by the offloaded tensor's
            data pointer, then by device.
    """

    def __init__(
        self,
        execution_device: Optional[Union[int, str, torch.device]] = None,
        offload: bool = False,
        io_same_device: bool = False,
        weights_map: Optional[Mapping] = None,
        offload_buffers: bool = False,
        place_submodules: bool = False,
        skip_keys: Optional[Union[str, list[str]]] = None,
        tied_params_map: Optional[dict[int, dict[torch.device, torch.Tensor]]] = None,
    ) -> None:
        self.execution_device = execution_device
        self.offload = offload
        self.io_same_device = io_same_device
        self.weights_map = weights_map
        self.offload_buffers = offload_buffers
        self.place_submodules = place_submodules
        self.skip_keys = skip_keys
        self.input_device: Optional[torch.device] = None
        self.param_original_devices: dict[str, torch.device] = {}
        self.buffer_original_devices: dict[str, torch.device] = {}
        self.original_devices: dict[str, torch.device] = {}
        self.tied_params_names: set[str] = set()
        self.tied_params_map = tied_params_map
        self.tied_pointers_to_remove: set[tuple[int, torch.device]] = set()

    def __repr__(self) -> str:
        return (
            f"AlignDevicesHook(execution_device={self.execution_device}, offload={self.offload}, "
            f"io_same_device={self.io_same_device}, offload_buffers={self.offload_buffers}, "
            f"place_submodules={self.place_submodules}, skip_keys={self.skip_keys!r})"
        )

    def _offloaded_tensors(self, module: nn.Module) -> list[str]:
        return [
            name
            for name, _ in named_module_tensors(
                module,
                include_buffers=self.offload_buffers,
                recurse=self.place_submodules,
                remove_non_persistent=True,
            )
        ]

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Place the module's tensors: on the execution device, or on meta when offloaded.

        Args:
            module (nn.Module): The module the hook is being attached to.

        Returns:
            nn.Module: The module to use from now on (usually `module` itself).
        """
        if (
            self.execution_device is not None
            and to_torch_device(self.execution_device).type == "meta"
        ):
            self.tied_params_map = None  # nothing real to share on the meta device
        if not self.offload and self.execution_device is not None:
            for name, _ in named_module_tensors(module, recurse=self.place_submodules):
                set_module_tensor_to_device(
                    module, name, self.execution_device, tied_params_map=self.tied_params_map
                )
        elif self.offload:
            self.original_devices = {
                name: t.device
                for name, t in named_module_tensors(module, recurse=self.place_submodules)
            }
            if self.weights_map is None:
                self.weights_map = {
                    name: t.to("cpu")
                    for name, t in named_module_tensors(
                        module, include_buffers=self.offload_buffers, recurse=self.place_submodules
                    )
                }
            for name in self._offloaded_tensors(module):
                tensor = _get_tensor(module, name)
                if self.tied_params_map is not None and tensor.data_ptr() in self.tied_params_map:
                    self.tied_params_names.add(name)
                set_module_tensor_to_device(module, name, "meta")
            if self.execution_device is not None:
                names = (
                    get_non_persistent_buffers(module, recurse=self.place_submodules)
                    if self.offload_buffers
                    else [n for n, _ in module.named_buffers(recurse=self.place_submodules)]
                )
                for name in names:
                    set_module_tensor_to_device(
                        module, name, self.execution_device, tied_params_map=self.tied_params_map
                    )
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        """Load offloaded weights onto the execution device and move the inputs there.

        Args:
            module (nn.Module): The module about to run.
            *args: The positional inputs of its forward.
            **kwargs: The keyword inputs of its forward.

        Returns:
            tuple[tuple, dict]: The positional and keyword inputs to call the forward with.
        """
        if self.io_same_device:
            self.input_device = find_device([args, kwargs])
        if self.offload:
            self.tied_pointers_to_remove = set()
            target = to_torch_device(self.execution_device)
            for name in self._offloaded_tensors(module):
                value = self.weights_map[name]
                statistics = None
                if "weight" in name and value.dtype == torch.int8:
                    scb = name.replace("weight", "SCB")
                    if scb in self.weights_map:
                        statistics = self.weights_map[scb]
                if self.tied_params_map is not None:
                    pointer = value.data_ptr()
                    if name in self.tied_params_names and pointer not in self.tied_params_map:
                        self.tied_params_map[pointer] = {}
                    if (
                        pointer in self.tied_params_map
                        and target not in self.tied_params_map[pointer]
                    ):
                        self.tied_pointers_to_remove.add((pointer, target))
                set_module_tensor_to_device(
                    module,
                    name,
                    self.execution_device,
                    value=value,
                    fp16_statistics=statistics,
                    tied_params_map=self.tied_params_map,
                    clear_cache=False,
                )
        return (
            send_to_device(args, self.execution_device),
            send_to_device(kwargs, self.execution_device, skip_keys=self.skip_keys),
        )

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        """Send offloaded weights back to meta; move the output to the input's device if asked.

        Args:
            module (nn.Module): The module that just ran.
            output (Any): What its forward returned.

        Returns:
            The output to hand back to the caller.
        """
        if self.offload:
            for name in self._offloaded_tensors(module):
                set_module_tensor_to_device(module, name, "meta", clear_cache=False)
            for pointer, device in self.tied_pointers_to_remove:
                self.tied_params_map.get(pointer, {}).pop(device, None)
            self.tied_pointers_to_remove = set()
        if self.io_same_device and self.input_device is not None:
            output = send_to_device(output, self.input_device, skip_keys=self.skip_keys)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Put offloaded tensors back on the devices they had before the hook was attached.

        Args:
            module (nn.Module): The module the hook is being removed from.

        Returns:
            nn.Module: The module to keep.
        """
        if self.offload:
            for name, device in self.original_devices.items():
                if device.type != "meta":
                    value = (
                        self.weights_map.get(name, None) if self.weights_map is not None else None
                    )
                    set_module_tensor_to_device(module, name, device, value=value)
        return module


def _get_tensor(module: nn.Module, name: str) -> torch.Tensor:
    owner_name, _, attr = name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    return getattr(owner, attr)


class CpuOffload(ModelHook):
    """Keeps a whole model on the CPU and moves it to `execution_device` for each forward.

    It stays there until `UserCpuOffloadHook.offload()` is called, typically by the next model's
    hook (`prev_module_hook`), so chained models take turns on the GPU.

    Args:
        execution_device (int | str | torch.device | None): Where the model runs; None means the
            process's default device.
        prev_module_hook (UserCpuOffloadHook | None): The handle of the model that runs before this one,
            offloaded when this one starts.
    """

    def __init__(
        self,
        execution_device: Optional[Union[int, str, torch.device]] = None,
        prev_module_hook: Optional[UserCpuOffloadHook] = None,
    ) -> None:
        self.prev_module_hook = prev_module_hook
        if execution_device is None:
            execution_device = PartialState().default_device
        self.execution_device = execution_device

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Move the module to the CPU.

        Args:
            module (nn.Module): The module the hook is being attached to.

        Returns:
            nn.Module: The module to use from now on (usually `module` itself).
        """
        return module.to("cpu")

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        """Offload the previous model, move this one and the inputs to the execution device.

        Args:
            module (nn.Module): The module about to run.
            *args: The positional inputs of its forward.
            **kwargs: The keyword inputs of its forward.

        Returns:
            tuple[tuple, dict]: The positional and keyword inputs to call the forward with.
        """
        if self.prev_module_hook is not None:
            self.prev_module_hook.offload()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        module.to(self.execution_device)
        return send_to_device(args, self.execution_device), send_to_device(
            kwargs, self.execution_device
        )


class UserCpuOffloadHook:
    """The handle `cpu_offload_with_hook` returns: `offload()` sends the model back to the CPU,
    `remove()` removes the hook.

    Args:
        model (nn.Module): The model the hook is attached to.
        hook (ModelHook): Its `CpuOffload` hook.
    """

    def __init__(self, model: nn.Module, hook: ModelHook) -> None:
        self.model = model
        self.hook = hook

    def offload(self) -> None:
        """Send the model back to the CPU."""
        self.hook.init_hook(self.model)

    def remove(self) -> None:
        """Remove the offload hook from the model."""
        remove_hook_from_module(self.model)


class LayerwiseCastingHook(ModelHook):
    """Stores a module's weights in `storage_dtype` (e.g. float8) and casts them to `compute_dtype`
    for the forward only.

    Args:
        storage_dtype (torch.dtype): The dtype the weights are kept in between forwards.
        compute_dtype (torch.dtype): The dtype they are cast to for the forward.
        non_blocking (bool): Cast asynchronously with respect to the host, where the device allows.
    """

    _is_stateful = False

    def __init__(
        self, storage_dtype: torch.dtype, compute_dtype: torch.dtype, non_blocking: bool
    ) -> None:
        self.storage_dtype = storage_dtype
        self.compute_dtype = compute_dtype
        self.non_blocking = non_blocking

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Cast the module's weights to the storage dtype.

        Args:
            module (nn.Module): The module the hook is being attached to.

        Returns:
            nn.Module: The module to use from now on (usually `module` itself).
        """
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        """Cast the module's weights to the compute dtype for the forward.

        Args:
            module (nn.Module): The module about to run.
            *args: The positional inputs of its forward.
            **kwargs: The keyword inputs of its forward.

        Returns:
            tuple[tuple, dict]: The positional and keyword inputs to call the forward with.
        """
        module.to(dtype=self.compute_dtype, non_blocking=self.non_blocking)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        """Cast the module's weights back to the storage dtype after the forward.

        Args:
            module (nn.Module): The module that just ran.
            output (Any): What its forward returned.

        Returns:
            The output to hand back to the caller.
        """
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return output
