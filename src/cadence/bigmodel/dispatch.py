"""Putting a model on several devices: `dispatch_model`, CPU/disk offload, `load_checkpoint_and_dispatch`."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any, Optional, Union

import torch
from torch import nn

from .attach import (
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
)
from .device_map import get_balanced_memory, infer_auto_device_map, validate_device_map
from .hooks import (
    AlignDevicesHook,
    CpuOffload,
    LayerwiseCastingHook,
    UserCpuOffloadHook,
    add_hook_to_module,
)
from .loading import load_checkpoint_in_model
from .offload import (
    OFFLOAD_INDEX_NAME,
    OffloadedWeightsLoader,
    extract_submodules_state_dict,
    offload_state_dict,
)
from .tensors import find_tied_parameters, retie_parameters, to_torch_device

logger = logging.getLogger(__name__)

DeviceMap = dict[str, Union[int, str, torch.device]]
_AUTO_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
# layers whose weights can be stored in a low-precision dtype and upcast for the forward
SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING = (
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
    nn.Linear,
)


def _first_device(model: nn.Module) -> torch.device:
    for param in model.parameters():
        return param.device
    return torch.device("cpu")


def cpu_offload(
    model: nn.Module,
    execution_device: Optional[torch.device] = None,
    offload_buffers: bool = False,
    state_dict: Optional[dict[str, torch.Tensor]] = None,
    preload_module_classes: Optional[list[str]] = None,
) -> nn.Module:
    """Keep every weight of `model` on the CPU and bring each submodule's weights to `execution_device`
    only while it runs.

    The GPU then holds one layer's weights at a time: slow, but a model bigger than the GPU runs.

    Args:
        model (torch.nn.Module): The model, on the CPU.
        execution_device (torch.device | None): Where the forward runs; None means the device of the
            model's first parameter.
        offload_buffers (bool): Offload buffers too (default False: buffers move to
            `execution_device` once).
        state_dict (dict[str, torch.Tensor] | None): The weights to keep on the CPU; None takes the
            model's own state dict.
        preload_module_classes (list[str] | None): Names of module classes whose weights are all brought
            in before their forward (for modules that use their submodules' weights directly).

    Returns:
        torch.nn.Module: The same model, with hooks attached.

    Example:
        >>> import torch
        >>> from cadence import cpu_offload
        >>> model = cpu_offload(torch.nn.Linear(4, 2), execution_device="cpu")
        >>> model(torch.ones(1, 4)).shape
        torch.Size([1, 2])
    """
    if execution_device is None:
        execution_device = _first_device(model)
    if state_dict is None:
        state_dict = {name: t.to("cpu") for name, t in model.state_dict().items()}
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    attach_align_device_hook(
        model,
        execution_device=execution_device,
        offload=True,
        offload_buffers=offload_buffers,
        weights_map=state_dict,
        preload_module_classes=preload_module_classes,
    )
    return model


def cpu_offload_with_hook(
    model: nn.Module,
    execution_device: Optional[Union[int, str, torch.device]] = None,
    prev_module_hook: Optional[UserCpuOffloadHook] = None,
) -> tuple[nn.Module, UserCpuOffloadHook]:
    """Keep `model` on the CPU and move it whole to `execution_device` when it runs, until `hook.offload()`.

    Faster than `cpu_offload` for pipelines of several models used one after another: each runs at
    full speed, and chaining them with `prev_module_hook` sends the previous one back to the CPU when
    the next one starts.

    Args:
        model (torch.nn.Module): The model, on the CPU.
        execution_device (int | str | torch.device | None): Where it runs; None means this process's
            default device (its GPU when there is one, else the CPU).
        prev_module_hook (UserCpuOffloadHook | None): The hook of the model that runs before this one;
            it is offloaded when this model's forward starts.

    Returns:
        tuple[torch.nn.Module, UserCpuOffloadHook]: The model and its hook (`hook.offload()` sends it
        back to the CPU; `hook.remove()` removes the hook).

    Example:
        >>> import torch
        >>> from cadence import cpu_offload_with_hook
        >>> encoder, encoder_hook = cpu_offload_with_hook(torch.nn.Linear(4, 4), "cpu")
        >>> decoder, decoder_hook = cpu_offload_with_hook(
        ...     torch.nn.Linear(4, 2), "cpu", prev_module_hook=encoder_hook
        ... )
        >>> decoder(encoder(torch.ones(1, 4))).shape  # the encoder leaves as the decoder arrives
        torch.Size([1, 2])
        >>> decoder_hook.offload()
    """
    hook = CpuOffload(execution_device=execution_device, prev_module_hook=prev_module_hook)
    add_hook_to_module(model, hook, append=True)
    return model, UserCpuOffloadHook(model, hook)


def _has_offload_index(folder: Union[str, os.PathLike]) -> bool:
    return os.path.isdir(folder) and os.path.isfile(os.path.join(folder, OFFLOAD_INDEX_NAME))


def disk_offload(
    model: nn.Module,
    offload_dir: Union[str, os.PathLike],
    execution_device: Optional[torch.device] = None,
    offload_buffers: bool = False,
    preload_module_classes: Optional[list[str]] = None,
) -> nn.Module:
    """Write the weights of `model` to `offload_dir` and read each submodule's weights from there only
    while it runs.

    Args:
        model (torch.nn.Module): The model.
        offload_dir (str | os.PathLike): The folder for the weights (written unless it already holds an
            offload index).
        execution_device (torch.device | None): Where the forward runs; None means the device of the
            model's first parameter.
        offload_buffers (bool): Offload buffers too (default False).
        preload_module_classes (list[str] | None): Module classes whose weights are all brought in
            before their forward.

    Returns:
        torch.nn.Module: The same model, with hooks attached.

    Example:
        >>> import torch
        >>> from cadence import disk_offload
        >>> model = disk_offload(torch.nn.Linear(4, 2), offload_dir="offload", execution_device="cpu")
        >>> model(torch.ones(1, 4)).shape
        torch.Size([1, 2])
    """
    if not _has_offload_index(offload_dir):
        offload_state_dict(offload_dir, model.state_dict())
    if execution_device is None:
        execution_device = _first_device(model)
    weights_map = OffloadedWeightsLoader(save_folder=offload_dir)
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    attach_align_device_hook(
        model,
        execution_device=execution_device,
        offload=True,
        offload_buffers=offload_buffers,
        weights_map=weights_map,
        preload_module_classes=preload_module_classes,
    )
    return model


def _warn_on_move(method: Callable, model: nn.Module) -> Callable:
    """Wrap `model.to` / `model.cuda`: moving a dispatched model is warned about, and refused when
    some weights are offloaded (on meta)."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        message = "You shouldn't move a model that is dispatched using accelerate hooks."
        if method.__name__ == "to":
            device = torch._C._nn._parse_to(*args, **kwargs)[0]
            if device is not None:
                logger.warning(message)
        else:
            logger.warning(message)
        if any(p.device.type == "meta" for p in model.parameters()):
            raise RuntimeError(
                "You can't move a model that has some modules offloaded to cpu or disk."
            )
        return method(*args, **kwargs)

    return wrapper


def _retie_after_forward(
    model: nn.Module, args: Any, output: Any, tied_params: list[list[str]]
) -> None:
    retie_parameters(model, tied_params)


def dispatch_model(
    model: nn.Module,
    device_map: dict[str, Union[str, int, torch.device]],
    main_device: Optional[torch.device] = None,
    state_dict: Optional[dict[str, torch.Tensor]] = None,
    offload_dir: Union[str, os.PathLike, None] = None,
    offload_index: Optional[dict[str, str]] = None,
    offload_buffers: bool = False,
    skip_keys: Optional[Union[str, list[str]]] = None,
    preload_module_classes: Optional[list[str]] = None,
    force_hooks: bool = False,
) -> nn.Module:
    """Place `model` following `device_map` and attach the hooks that make its forward work across devices.

    Modules mapped to a device are moved there; modules mapped to "cpu" (when a GPU is the main device)
    or "disk" keep their weights there and bring them to the main device for their forward (disk
    weights are written to `offload_dir` unless it already holds an offload index). Inputs follow the
    weights from block to block and the outputs come back to the device of the inputs. The model gets
    an `hf_device_map` attribute. With a single device and no `force_hooks`, the model is just moved.

    Args:
        model (torch.nn.Module): The model (its weights loaded, or on meta for the modules mapped to
            "disk" with an existing offload).
        device_map (dict[str, int | str | torch.device]): Module names (as in `named_modules`; "" for
            the whole model) to a GPU index, "cpu", "mps", "disk" or a `torch.device`. It must cover
            every parameter and name only modules the model has (ValueError otherwise).
        main_device (torch.device | None): Where offloaded modules run; None means the first device of
            the map that is not "cpu" or "disk".
        state_dict (dict[str, torch.Tensor] | None): The CPU-offloaded weights; None takes them from the
            model.
        offload_dir (str | os.PathLike | None): The folder for "disk" weights; required when the map
            uses "disk" and `offload_index` is not given.
        offload_index (dict[str, str] | None): An existing offload index, instead of writing one.
        offload_buffers (bool): Offload the buffers of offloaded modules too (default False).
        skip_keys (str | list[str] | None): Output keys not moved between devices (caches kept in place).
        preload_module_classes (list[str] | None): Module classes whose weights are all brought in
            before their forward.
        force_hooks (bool): Attach the hooks even when the whole model is on one device (default False).

    Returns:
        torch.nn.Module: The dispatched model.

    Raises:
        ValueError: An invalid device map, or "disk" without `offload_dir` or `offload_index`.

    Example:
        >>> import torch
        >>> from cadence import dispatch_model
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        >>> model = dispatch_model(model, {"0": "cpu", "1": "disk"}, offload_dir="offload")
        >>> model(torch.ones(1, 4)).shape
        torch.Size([1, 2])
    """
    validate_device_map(model, device_map)
    devices = set(device_map.values())
    if len({str(d) for d in devices}) > 1 or "disk" in devices or force_hooks:
        if main_device is None:
            real = [d for d in device_map.values() if d not in ("cpu", "disk")]
            main_device = real[0] if real else "cpu"
        if main_device != "cpu":
            cpu_modules = [name for name, device in device_map.items() if device == "cpu"]
            if state_dict is None and cpu_modules:
                state_dict = extract_submodules_state_dict(model.state_dict(), cpu_modules)
        disk_modules = [name for name, device in device_map.items() if device == "disk"]
        if offload_dir is None and offload_index is None and disk_modules:
            raise ValueError(
                "We need an `offload_dir` to dispatch this model according to this `device_map`, the "
                f"following submodules need to be offloaded: {', '.join(disk_modules)}."
            )
        if disk_modules and offload_index is None and not _has_offload_index(offload_dir):
            offload_state_dict(
                offload_dir, extract_submodules_state_dict(model.state_dict(), disk_modules)
            )
        execution_device = {
            name: main_device if device in ("cpu", "disk") else device
            for name, device in device_map.items()
        }
        execution_device[""] = main_device
        offloaded = ("disk",) if main_device in ("cpu", "mps") else ("cpu", "disk")
        offload = {name: device in offloaded for name, device in device_map.items()}
        save_folder = offload_dir if disk_modules else None
        weights_map = None
        if state_dict is not None or save_folder is not None or offload_index is not None:
            weights_map = OffloadedWeightsLoader(
                state_dict=state_dict,
                save_folder=save_folder,
                index=offload_index,
                device=main_device if offload_index is not None else None,
            )
        tied_params = find_tied_parameters(model)
        # one copy per device of each tied weight held in memory, keyed by its data pointer
        tied_params_map: dict[int, dict[torch.device, torch.Tensor]] = {}
        for group in tied_params:
            for name in group:
                param = model.get_parameter(name)
                if param.device.type != "meta":
                    tied_params_map[param.data_ptr()] = {}
        attach_align_device_hook_on_blocks(
            model,
            execution_device=execution_device,
            offload=offload,
            offload_buffers=offload_buffers,
            weights_map=weights_map,
            skip_keys=skip_keys,
            preload_module_classes=preload_module_classes,
            tied_params_map=tied_params_map,
        )
        offloaded_to = " and ".join(
            sorted({d for d in device_map.values() if d in ("cpu", "disk")})
        )
        if offloaded_to:
            logger.warning(
                "Some parameters are on the meta device because they were offloaded to the %s.",
                offloaded_to,
            )
        retie_parameters(model, tied_params)  # hooks replace Parameters: tie them again
        if tied_params and any(offload.values()):
            # offload hooks give each module its own copy of a weight while it runs, which unties the
            # group; tie it again once the forward is over. A torch forward hook, so `_hf_hook` stays
            # the AlignDevicesHook other libraries look for.
            model.register_forward_hook(
                functools.partial(_retie_after_forward, tied_params=tied_params)
            )
        model.to = _warn_on_move(model.to, model)
        model.cuda = _warn_on_move(model.cuda, model)
    else:
        device = next(iter(devices))
        model.to(to_torch_device(device))
    model.hf_device_map = dict(device_map)
    return model


def load_checkpoint_and_dispatch(
    model: nn.Module,
    checkpoint: Union[str, os.PathLike],
    device_map: Union[str, DeviceMap, None] = None,
    max_memory: Optional[dict[Union[int, str], Union[int, str]]] = None,
    no_split_module_classes: Optional[list[str]] = None,
    offload_folder: Union[str, os.PathLike, None] = None,
    offload_buffers: bool = False,
    dtype: Union[str, torch.dtype, None] = None,
    offload_state_dict: Optional[bool] = None,
    skip_keys: Optional[Union[str, list[str]]] = None,
    preload_module_classes: Optional[list[str]] = None,
    force_hooks: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
) -> nn.Module:
    """Load a checkpoint into a (usually empty) model and spread it over the available devices.

    It runs `load_checkpoint_in_model`, then `dispatch_model`. With a named `device_map` the map is
    computed from `max_memory` with `infer_auto_device_map`: the usual way to run a model bigger than
    one GPU, or bigger than the CPU's memory, for inference.

    Args:
        model (torch.nn.Module): The model, typically built under `init_empty_weights`.
        checkpoint (str | os.PathLike): A weights file (safetensors, or a torch file read with
            `weights_only=True`), the `.index.json` of a sharded checkpoint, or a folder holding either.
        device_map (str | dict | None): Where each module goes: a dict as for `dispatch_model`, or
            "auto"/"balanced" (spread evenly over the GPUs, then CPU, then disk), "balanced_low_0" (GPU 0
            keeps room for `generate`), "sequential" (fill GPU 0 first). None loads everything where the
            model is. Another string raises ValueError.
        max_memory (dict[int | str, int | str] | None): The most each device may hold (`{0: "10GiB",
            "cpu": "30GiB"}`); None means the free memory of each.
        no_split_module_classes (list[str] | None): Module classes kept whole on one device (blocks with
            residual connections, e.g. `["GPTJBlock"]`).
        offload_folder (str | os.PathLike | None): Where weights mapped to "disk" are written.
        offload_buffers (bool): Offload buffers with their modules (default False).
        dtype (str | torch.dtype | None): Cast floating-point weights to this dtype while loading.
        offload_state_dict (bool | None): Park CPU weights on disk while loading, to keep peak memory
            low; None means True when part of the model goes to disk.
        skip_keys (str | list[str] | None): Output keys not moved between devices.
        preload_module_classes (list[str] | None): Module classes whose weights are all brought in
            before their forward.
        force_hooks (bool): Attach the dispatch hooks even on a single device (default False).
        strict (bool): Raise when the checkpoint and the model do not hold the same weights (default
            False: a warning lists them).
        full_state_dict (bool): For a sharded (DTensor) model, the checkpoint holds full tensors
            (default True).
        broadcast_from_rank0 (bool): For a sharded model on several processes, only rank 0 reads the
            file and sends the weights to the others (default False).

    Returns:
        torch.nn.Module: The loaded, dispatched model.

    Raises:
        ValueError: An unknown `device_map` name, an invalid map, or weights that do not match with
            `strict=True`.

    Example:
        >>> import torch
        >>> from cadence import init_empty_weights, load_checkpoint_and_dispatch
        >>> from safetensors.torch import save_file
        >>> save_file(torch.nn.Linear(4, 2).state_dict(), "weights.safetensors")
        >>> with init_empty_weights():
        ...     model = torch.nn.Linear(4, 2)
        >>> model = load_checkpoint_and_dispatch(model, "weights.safetensors", device_map={"": "cpu"})
        >>> model.weight.device
        device(type='cpu')
    """
    if isinstance(device_map, str) and device_map not in _AUTO_MAPS:
        raise ValueError(
            "If passing a string for `device_map`, please choose 'auto', 'balanced', 'balanced_low_0' or "
            "'sequential'."
        )
    if isinstance(device_map, str):
        if device_map != "sequential":
            max_memory = get_balanced_memory(
                model,
                max_memory=max_memory,
                no_split_module_classes=no_split_module_classes,
                dtype=dtype,
                low_zero=(device_map == "balanced_low_0"),
            )
        device_map = infer_auto_device_map(
            model,
            max_memory=max_memory,
            no_split_module_classes=no_split_module_classes,
            dtype=dtype,
            offload_buffers=offload_buffers,
        )
    if offload_state_dict is None:
        offload_state_dict = device_map is not None and "disk" in device_map.values()
    load_checkpoint_in_model(
        model,
        checkpoint,
        device_map=device_map,
        offload_folder=offload_folder,
        dtype=dtype,
        offload_state_dict=offload_state_dict,
        offload_buffers=offload_buffers,
        strict=strict,
        full_state_dict=full_state_dict,
        broadcast_from_rank0=broadcast_from_rank0,
    )
    if device_map is None:
        return model
    return dispatch_model(
        model,
        device_map=device_map,
        offload_dir=offload_folder,
        offload_buffers=offload_buffers,
        skip_keys=skip_keys,
        preload_module_classes=preload_module_classes,
        force_hooks=force_hooks,
    )


def attach_layerwise_casting_hooks(
    module: nn.Module,
    storage_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    skip_modules_pattern: Union[str, tuple[str, ...], None] = None,
    skip_modules_classes: Optional[tuple[type[nn.Module], ...]] = None,
    non_blocking: bool = False,
) -> None:
    """Store the weights of the Linear and Conv layers of `module` in `storage_dtype` and compute in `compute_dtype`.

    Each such layer gets a `LayerwiseCastingHook`: its weights are cast up before its forward and back
    down after, so a model stored in a small dtype (float8) computes in a precise one (bfloat16).

    Args:
        module (torch.nn.Module): The model.
        storage_dtype (torch.dtype): The dtype the weights are kept in between forwards.
        compute_dtype (torch.dtype): The dtype each layer computes in.
        skip_modules_pattern (str | tuple[str, ...] | None): Regular expressions; layers whose name
            matches one keep their dtype (None: no layer is skipped by name).
        skip_modules_classes (tuple[type[torch.nn.Module], ...] | None): Layer classes that keep their
            dtype.
        non_blocking (bool): Cast with `non_blocking=True` (default False).

    Example:
        >>> import torch
        >>> from cadence.big_modeling import attach_layerwise_casting_hooks
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4))
        >>> attach_layerwise_casting_hooks(
        ...     model, storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16
        ... )
        >>> model[0].weight.dtype, model(torch.ones(1, 4, dtype=torch.bfloat16)).dtype
        (torch.float8_e4m3fn, torch.bfloat16)
    """
    import re

    patterns = (
        (skip_modules_pattern,)
        if isinstance(skip_modules_pattern, str)
        else skip_modules_pattern or ()
    )

    def visit(current: nn.Module, name: str) -> None:
        skipped = (
            skip_modules_classes is not None and isinstance(current, skip_modules_classes)
        ) or any(re.search(p, name) for p in patterns)
        if skipped:
            return
        if isinstance(current, SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING):
            add_hook_to_module(
                current,
                LayerwiseCastingHook(storage_dtype, compute_dtype, non_blocking),
                append=True,
            )
            return
        for child_name, child in current.named_children():
            visit(child, f"{name}.{child_name}" if name else child_name)

    visit(module, "")
