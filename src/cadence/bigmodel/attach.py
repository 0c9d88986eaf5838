"""Attaching the device hooks to a model's modules: one per module holding weights, or one per block
of a device map (what `dispatch_model` and `cpu_offload` build on; the hooks are in `hooks.py`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Optional, Union

import torch
from torch import nn

from .hooks import AlignDevicesHook, add_hook_to_module
from .offload import PrefixedDataset
from .sizes import named_module_tensors


def attach_execution_device_hook(
    module: nn.Module,
    execution_device: Union[int, str, torch.device],
    skip_keys: Optional[Union[str, list[str]]] = None,
    preload_module_classes: Optional[list[str]] = None,
    tied_params_map: Optional[dict[int, dict[torch.device, torch.Tensor]]] = None,
) -> None:
    """Give `module` and its submodules that hold weights a hook moving their inputs to `execution_device`
    (modules that already have a hook keep it).

    Args:
        module (nn.Module): The root of the modules to hook.
        execution_device (int | str | torch.device): Where their inputs are moved.
        skip_keys (str | list[str] | None): Keys of dict inputs and outputs that are never moved.
        preload_module_classes (list[str] | None): Class names of modules whose whole subtree is loaded by
            one hook at their forward (for modules that use their children's weights directly).
        tied_params_map (dict[int, dict[torch.device, torch.Tensor]] | None): Shared by the hooks of a
            model, so that tied weights are loaded onto a device once: keyed by the offloaded tensor's
            data pointer, then by device.
    """
    if not hasattr(module, "_hf_hook") and len(module.state_dict()) > 0:
        add_hook_to_module(
            module,
            AlignDevicesHook(
                execution_device, skip_keys=skip_keys, tied_params_map=tied_params_map
            ),
        )
    if preload_module_classes and module.__class__.__name__ in preload_module_classes:
        return  # its hook places the whole subtree
    for child in module.children():
        attach_execution_device_hook(
            child, execution_device, skip_keys, preload_module_classes, tied_params_map
        )


def _attach_to_children(
    attach: Callable[..., None], module: nn.Module, module_name: str, **options: Any
) -> None:
    """Run `attach` on each child of `module`, naming the child by its path from the root."""
    for child_name, child in module.named_children():
        attach(
            child,
            module_name=f"{module_name}.{child_name}" if module_name else child_name,
            **options,
        )


def attach_align_device_hook(
    module: nn.Module,
    execution_device: Optional[torch.device] = None,
    offload: bool = False,
    weights_map: Optional[Mapping] = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: Optional[Union[str, list[str]]] = None,
    preload_module_classes: Optional[list[str]] = None,
    tied_params_map: Optional[dict[int, dict[torch.device, torch.Tensor]]] = None,
) -> None:
    """Attach an AlignDevicesHook to every submodule of `module` that holds weights directly.

    `weights_map` holds the weights of the whole of `module` (names relative to it, under
    `module_name` when it is a submodule of the map's model). A module whose class is in
    `preload_module_classes` gets one hook loading its whole subtree at once.

    Args:
        module (nn.Module): The root of the modules to hook.
        execution_device (torch.device | None): Where the modules run.
        offload (bool): Keep the weights off the device between forwards (default False).
        weights_map (Mapping | None): The offloaded weights, as described above.
        offload_buffers (bool): Offload the buffers too (default False).
        module_name (str): The name of `module` inside the model `weights_map` belongs to ("" for the
            model itself).
        skip_keys (str | list[str] | None): Keys of dict inputs and outputs that are never moved.
        preload_module_classes (list[str] | None): Class names of modules whose whole subtree is loaded by
            one hook at their forward (for modules that use their children's weights directly).
        tied_params_map (dict[int, dict[torch.device, torch.Tensor]] | None): Shared by the hooks of a
            model, so that tied weights are loaded onto a device once: keyed by the offloaded tensor's
            data pointer, then by device.
    """
    has_direct = any(True for _ in named_module_tensors(module))
    full_offload = (
        offload
        and preload_module_classes is not None
        and module.__class__.__name__ in preload_module_classes
    )
    if has_direct or full_offload:
        prefixed = None
        if weights_map is not None:
            prefixed = PrefixedDataset(weights_map, f"{module_name}." if module_name else "")
        hook = AlignDevicesHook(
            execution_device=execution_device,
            offload=offload,
            weights_map=prefixed,
            offload_buffers=offload_buffers,
            place_submodules=full_offload,
            skip_keys=skip_keys,
            tied_params_map=tied_params_map,
        )
        add_hook_to_module(module, hook, append=True)
    if full_offload:
        return
    _attach_to_children(
        attach_align_device_hook, module, module_name,
        execution_device=execution_device, offload=offload, weights_map=weights_map,
        offload_buffers=offload_buffers, skip_keys=skip_keys,
        preload_module_classes=preload_module_classes, tied_params_map=tied_params_map,
    )  # fmt: skip


def attach_align_device_hook_on_blocks(
    module: nn.Module,
    execution_device: Optional[Union[torch.device, dict[str, torch.device]]] = None,
    offload: Union[bool, dict[str, bool]] = False,
    weights_map: Optional[Mapping] = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: Optional[Union[str, list[str]]] = None,
    preload_module_classes: Optional[list[str]] = None,
    tied_params_map: Optional[dict[int, dict[torch.device, torch.Tensor]]] = None,
) -> None:
    """Attach the hooks of a dispatched model: one per block of `execution_device` / `offload`
    (dicts keyed by module name, as a device map).

    A block that is not offloaded gets its weights moved to its device once; an offloaded block
    gets hooks bringing its weights in for each forward. The top module moves outputs back to the
    device of the inputs.

    Args:
        module (nn.Module): The model (or block) to hook.
        execution_device (torch.device | dict[str, torch.device] | None): One device for all, or a device
            per block name.
        offload (bool | dict[str, bool]): One flag for all, or whether each block name is offloaded.
        weights_map (Mapping | None): The offloaded weights, by name relative to the model.
        offload_buffers (bool): Offload the buffers too (default False).
        module_name (str): The name of `module` inside the model ("" for the model itself).
        skip_keys (str | list[str] | None): Keys of dict inputs and outputs that are never moved.
        preload_module_classes (list[str] | None): Class names of modules whose whole subtree is loaded by
            one hook at their forward (for modules that use their children's weights directly).
        tied_params_map (dict[int, dict[torch.device, torch.Tensor]] | None): Shared by the hooks of a
            model, so that tied weights are loaded onto a device once: keyed by the offloaded tensor's
            data pointer, then by device.
    """
    if not isinstance(execution_device, Mapping) and not isinstance(offload, dict):
        if not offload:
            add_hook_to_module(
                module,
                AlignDevicesHook(
                    execution_device=execution_device,
                    io_same_device=True,
                    skip_keys=skip_keys,
                    place_submodules=True,
                    tied_params_map=tied_params_map,
                ),
            )
        else:
            attach_align_device_hook(
                module,
                execution_device=execution_device,
                offload=True,
                weights_map=weights_map,
                offload_buffers=offload_buffers,
                module_name=module_name,
                skip_keys=skip_keys,
                tied_params_map=tied_params_map,
            )
        return
    if not isinstance(execution_device, Mapping):
        execution_device = dict.fromkeys(offload, execution_device)
    if not isinstance(offload, Mapping):
        offload = dict.fromkeys(execution_device, offload)

    if module_name in execution_device and module_name in offload and not offload[module_name]:
        add_hook_to_module(
            module,
            AlignDevicesHook(
                execution_device=execution_device[module_name],
                offload_buffers=offload_buffers,
                io_same_device=(module_name == ""),
                place_submodules=True,
                skip_keys=skip_keys,
                tied_params_map=tied_params_map,
            ),
        )
        attach_execution_device_hook(
            module,
            execution_device[module_name],
            skip_keys=skip_keys,
            tied_params_map=tied_params_map,
        )
    elif module_name in execution_device and module_name in offload:
        attach_align_device_hook(
            module,
            execution_device=execution_device[module_name],
            offload=True,
            weights_map=weights_map,
            offload_buffers=offload_buffers,
            module_name=module_name,
            skip_keys=skip_keys,
            preload_module_classes=preload_module_classes,
            tied_params_map=tied_params_map,
        )
        if not hasattr(module, "_hf_hook"):
            add_hook_to_module(
                module,
                AlignDevicesHook(
                    execution_device=execution_device[module_name],
                    io_same_device=(module_name == ""),
                    skip_keys=skip_keys,
                    tied_params_map=tied_params_map,
                ),
            )
        attach_execution_device_hook(
            module,
            execution_device[module_name],
            skip_keys=skip_keys,
            preload_module_classes=preload_module_classes,
            tied_params_map=tied_params_map,
        )
    elif module_name == "":
        add_hook_to_module(
            module,
            AlignDevicesHook(
                execution_device=execution_device.get(""),
                io_same_device=True,
                skip_keys=skip_keys,
                tied_params_map=tied_params_map,
            ),
        )
    _attach_to_children(
        attach_align_device_hook_on_blocks, module, module_name,
        execution_device=execution_device, offload=offload, weights_map=weights_map,
        offload_buffers=offload_buffers, skip_keys=skip_keys,
        preload_module_classes=preload_module_classes, tied_params_map=tied_params_map,
    )  # fmt: skip
