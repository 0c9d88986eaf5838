"""Available memory per device and device maps: which submodule goes to which GPU, the CPU or disk.

A device map is `{module or tensor name: device}` where a device is a GPU index (int), "cpu", "mps"
or "disk"; a name covers everything under it, "" is the whole model.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Optional, Union

import torch
from torch import nn

from .sizes import (
    compute_module_sizes,
    convert_file_size_to_int,
    get_max_layer_size,
    get_module_leaves,
)
from .tensors import find_tied_parameters

logger = logging.getLogger(__name__)

_NAMED_DEVICES = ("mps", "cpu", "disk")


def _cpu_available_bytes() -> int:
    try:
        import psutil  # optional dependency

        return int(psutil.virtual_memory().available)
    except ImportError:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def get_max_memory(
    max_memory: Optional[dict[Union[int, str], Union[int, str]]] = None,
) -> dict[Union[int, str], int]:
    """Bytes usable on each device: measured free memory, or `max_memory` with its sizes turned into integers.

    Args:
        max_memory (dict[int | str, int | str] | None): Devices (GPU indices, "mps", "cpu", "disk") to
            sizes ("10GiB", "500MB" or bytes); None measures the free memory of every GPU and the CPU.

    Returns:
        dict[int | str, int]: Devices to bytes, GPUs first.

    Example:
        >>> get_max_memory({"cpu": "1GB"})
        {'cpu': 1000000000}
    """
    if max_memory is None:
        found: dict[Union[int, str], int] = {}
        if torch.cuda.is_available():
            for index in range(torch.cuda.device_count()):
                found[index] = int(torch.cuda.mem_get_info(index)[0])
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            found["mps"] = _cpu_available_bytes()
        found["cpu"] = _cpu_available_bytes()
        return found
    gpus = sorted(k for k in max_memory if isinstance(k, int) and not isinstance(k, bool))
    ordered = gpus + [k for k in _NAMED_DEVICES if k in max_memory]
    for key in max_memory:
        if key not in ordered:
            raise ValueError(
                f"Device {key} is not recognized, available devices are integers(for GPU/XPU), 'mps', "
                "'cpu' and 'disk'"
            )
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for index in gpus:
        if index < 0 or index >= count:
            logger.warning(
                "Device %s is not available, available devices are %s", index, list(range(count))
            )
    # The caller's dict is converted in place, as the reference does: transformers compares its own
    # dict with the returned one afterwards and relies on both holding ints.
    for key, value in list(max_memory.items()):
        if isinstance(value, str):
            max_memory[key] = convert_file_size_to_int(value)
    return {k: max_memory[k] for k in ordered}


def _gpu_indices(max_memory: Mapping[Any, int]) -> list[int]:
    return [k for k in max_memory if isinstance(k, int) and max_memory[k] > 0]


def get_balanced_memory(
    model: nn.Module,
    max_memory: Optional[dict[Union[int, str], Union[int, str]]] = None,
    no_split_module_classes: Optional[list[str]] = None,
    dtype: Union[str, torch.dtype, None] = None,
    special_dtypes: Optional[dict[str, Union[str, torch.device]]] = None,
    low_zero: bool = False,
) -> dict[Union[int, str], int]:
    """A `max_memory` that spreads the model evenly over the GPUs instead of filling GPU 0 first.

    Each GPU but the last gets the model's size divided by the number of GPUs, plus a margin for the
    largest unsplittable layer; with `low_zero`, GPU 0 gets only what the others cannot hold. Without
    GPUs, `max_memory` is returned as it is.

    Args:
        model (torch.nn.Module): The model.
        max_memory (dict[int | str, int | str] | None): The most each device may hold; None means
            their free memory.
        no_split_module_classes (list[str] | None): Module classes kept whole.
        dtype (str | torch.dtype | None): Size the weights as if in this dtype.
        special_dtypes (dict[str, str | torch.dtype] | None): Per-weight dtypes.
        low_zero (bool): Keep GPU 0 as free as possible (for `generate`'s outputs; default False).

    Returns:
        dict[int | str, int]: Bytes per device.
    """
    user_set = max_memory is not None
    max_memory = get_max_memory(max_memory)
    gpus = _gpu_indices(max_memory)
    if not gpus:
        return max_memory
    if len(gpus) == 1:
        low_zero = False  # nothing to balance; keep a margin for the activations
        if not user_set:
            max_memory[gpus[0]] = int(max_memory[gpus[0]] * 0.9)
        return max_memory
    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    share = sizes[""] // (len(gpus) - 1 if low_zero else len(gpus))
    no_split = no_split_module_classes or []
    if isinstance(no_split, str):
        no_split = [no_split]
    biggest_block = max(
        (sizes[name] for name, m in model.named_modules() if m.__class__.__name__ in no_split),
        default=0,
    )
    # the modules just above the tensors: the typical size of one layer
    inner = {n: v for n, v in sizes.items() if n not in set(get_module_leaves(sizes))}
    layers = get_module_leaves(inner)
    mean_layer = int(sum(inner[n] for n in layers) / max(len(layers), 1))
    share += int(1.25 * max(biggest_block, mean_layer))
    for index in gpus[:-1]:
        limit = max_memory[gpus[0]] if low_zero and index == gpus[0] else share
        max_memory[index] = min(limit, max_memory[index])
    if low_zero:
        rest = sum(max_memory[i] for i in gpus[1:])
        max_memory[gpus[0]] = min(max(0, sizes[""] - rest), max_memory[gpus[0]])
    return max_memory


def clean_device_map(
    device_map: dict[str, Union[int, str, torch.device]], module_name: str = ""
) -> dict[str, Union[int, str, torch.device]]:
    """Merge the entries under one module into a single entry when they all name the same device.

    Args:
        device_map (dict[str, int | str | torch.device]): The map (changed in place).
        module_name (str): The module whose entries to merge ("" for the whole model).

    Returns:
        dict[str, int | str | torch.device]: The map.

    Example:
        >>> clean_device_map({"a.0": "cpu", "a.1": "cpu", "b": 0})
        {'a': 'cpu', 'b': 0}
    """
    prefix = f"{module_name}." if module_name else ""
    keys = [k for k in device_map if k.startswith(prefix)]
    values = [device_map[k] for k in keys]
    if len(keys) > 1 and len({str(v) for v in values}) == 1:
        # rebuild in place, the merged entry where the first of its parts was
        merged = OrderedDict()
        for key, value in device_map.items():
            if key in keys:
                if module_name not in merged:
                    merged[module_name] = values[0]
            else:
                merged[key] = value
        device_map.clear()
        device_map.update(merged)
    depth = len(module_name.split(".")) + 1 if module_name else 1
    children = {
        ".".join(k.split(".")[:depth])
        for k in device_map
        if k.startswith(prefix) and len(k) > len(module_name)
    }
    for child in sorted(children):
        clean_device_map(device_map, module_name=child)
    return device_map


def get_module_size_with_ties(
    tied_params: list[str],
    module_size: int,
    module_sizes: dict[str, int],
    modules_to_treat: list[tuple[str, Any]],
) -> tuple[int, list[str], list[Any]]:
    """Size of a module together with the not-yet-placed modules it shares (tied) weights with.

    `tied_params` are the names, outside the module, of the weights tied to one of its weights.
    Returns (combined size, names of those modules, the modules).

    Args:
        tied_params (list[str]): The names, outside the module, of weights tied to its own.
        module_size (int): The module's bytes.
        module_sizes (dict[str, int]): Bytes by name, as `compute_module_sizes` returns them.
        modules_to_treat (list[tuple[str, Any]]): The modules not yet placed, with their names.

    Returns:
        tuple[int, list[str], list[Any]]: As described above.
    """
    if not tied_params:
        return module_size, [], []
    names, modules = [], []
    for tied in tied_params:
        for index, (name, _) in enumerate(modules_to_treat):
            if name and (tied == name or tied.startswith(name + ".")) and name not in names:
                names.append(name)
                modules.append(modules_to_treat[index][1])
                break
    size = module_size
    for name in names:
        shared = sum(
            module_sizes.get(t, 0) for t in tied_params if t.startswith(name + ".") or t == name
        )
        size += module_sizes[name] - shared
    return size, names, modules


def _tied_outside(name: str, tied_groups: list[list[str]]) -> list[str]:
    """Names of the weights tied to a weight of module `name` that live outside it."""
    prefix = f"{name}."
    outside: list[str] = []
    for group in tied_groups:
        if any(p.startswith(prefix) or p == name for p in group):
            outside.extend(p for p in group if not (p.startswith(prefix) or p == name))
    return outside


def _expand(name: str, module: Any) -> list[tuple[str, Any]]:
    """The direct parameters, children and buffers of `module` under `name.`."""
    prefix = f"{name}." if name else ""
    parts = list(module.named_parameters(recurse=False)) + list(module.named_children())
    parts += list(module.named_buffers(recurse=False))
    return [(prefix + n, m) for n, m in parts]


def fallback_allocate(
    modules: list[tuple[str, nn.Module]],
    module_sizes: dict[str, int],
    size_limit: Union[int, str],
    no_split_module_classes: Optional[list[str]] = None,
    tied_parameters: Optional[list[list[str]]] = None,
) -> tuple[Optional[str], Optional[nn.Module], list[tuple[str, nn.Module]]]:
    """Find, breadth first, one module among `modules` (or inside them) that fits in `size_limit`.

    Returns (its name, the module, the remaining modules to place with that one taken out), or
    (None, None, `modules`) when nothing fits.

    Args:
        modules (list[tuple[str, nn.Module]]): The modules still to place, with their names.
        module_sizes (dict[str, int]): Bytes by name, as `compute_module_sizes` returns them.
        size_limit (int | str): The room left, in bytes or as "5GB".
        no_split_module_classes (list[str] | None): Class names of modules that must stay whole.
        tied_parameters (list[list[str]] | None): Groups of tied parameter names; a module is measured
            with the modules it shares weights with.

    Returns:
        tuple[str | None, nn.Module | None, list[tuple[str, nn.Module]]]: As described above.
    """
    limit = convert_file_size_to_int(size_limit)
    no_split = no_split_module_classes or []
    tied = tied_parameters or []
    queue = list(modules)
    while queue:
        name, module = queue.pop(0)
        outside = _tied_outside(name, tied)
        size, _, _ = get_module_size_with_ties(outside, module_sizes[name], module_sizes, modules)
        if size <= limit:
            remaining = []
            for other_name, other in modules:
                if other_name == name:
                    continue
                if name.startswith(other_name + "."):
                    # open up the parent that contains it, leaving the chosen module out
                    remaining.extend(_open_path(other_name, other, name))
                else:
                    remaining.append((other_name, other))
            return name, module, remaining
        if isinstance(module, nn.Module) and module.__class__.__name__ not in no_split:
            queue.extend(_expand(name, module))
    return None, None, list(modules)


def _open_path(parent_name: str, parent: nn.Module, target: str) -> list[tuple[str, Any]]:
    """The parts of `parent`, opened up along the path to `target`, with `target` left out."""
    result: list[tuple[str, Any]] = []
    pending = [(parent_name, parent)]
    while pending:
        name, module = pending.pop(0)
        for part_name, part in _expand(name, module):
            if part_name == target:
                continue
            if target.startswith(part_name + "."):
                pending.append((part_name, part))
            else:
                result.append((part_name, part))
    return result


def _has_children(module: Any) -> bool:
    return isinstance(module, nn.Module) and any(True for _ in module.children())


def _modules_only(parts: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    return [(n, m) for n, m in parts if isinstance(m, nn.Module)]


def infer_auto_device_map(
    model: nn.Module,
    max_memory: Optional[dict[Union[int, str], Union[int, str]]] = None,
    no_split_module_classes: Optional[list[str]] = None,
    dtype: Union[str, torch.dtype, None] = None,
    special_dtypes: Optional[dict[str, Union[str, torch.dtype]]] = None,
    verbose: bool = False,
    clean_result: bool = True,
    offload_buffers: bool = False,
    fallback_allocation: bool = False,
) -> dict[str, Union[int, str]]:
    """A device map that fills the GPUs in order, then the CPU, then the disk, within `max_memory`.

    Modules are placed whole, in definition order; one that does not fit in what is left of a device is
    split into its children unless its class is in `no_split_module_classes`, else it goes to the next
    device. The first GPU (and the CPU, when something goes to disk) keeps room for the largest layer,
    so that an offloaded layer can be brought in to run. Tied weights go with the module that uses them
    first. Works on a model on the meta device.

    Args:
        model (torch.nn.Module): The model (its weights need not exist).
        max_memory (dict[int | str, int | str] | None): The most each device may hold (`{0: "10GiB",
            "cpu": "30GiB"}`); None means the free memory of each GPU and of the CPU.
        no_split_module_classes (list[str] | None): Module classes kept whole on one device.
        dtype (str | torch.dtype | None): Size the weights as if in this dtype.
        special_dtypes (dict[str, str | torch.dtype] | None): Per-weight dtypes that override `dtype`.
        verbose (bool): Log each placement decision (default False).
        clean_result (bool): Merge the entries of a module whose parts all go to one device (default
            True).
        offload_buffers (bool): Count buffers of offloaded modules as offloaded too (default False).
        fallback_allocation (bool): When the next module does not fit on a device that holds
            nothing yet, place there the first module (searched breadth first) that fits, instead
            of moving on to the next device (default False).

    Returns:
        dict[str, int | str]: Module names to a GPU index, "cpu" or "disk".

    Example:
        >>> import torch
        >>> from cadence import init_empty_weights
        >>> with init_empty_weights():
        ...     model = torch.nn.Sequential(*[torch.nn.Linear(1000, 1000) for _ in range(3)])
        >>> # 4 MB per layer; the CPU keeps room for one offloaded layer to run
        >>> infer_auto_device_map(model, max_memory={"cpu": "9MB"})
        {'0': 'cpu', '1': 'disk', '2': 'disk'}
    """
    max_memory = get_max_memory(max_memory)
    no_split = list(no_split_module_classes or [])
    devices: list[Union[int, str]] = list(max_memory)
    if "disk" not in devices:
        devices.append("disk")
    gpus = [d for d in devices if d not in ("cpu", "disk")]
    main_devices = [gpus[0], "cpu"] if gpus else ["cpu"]
    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    tied_groups = find_tied_parameters(model)
    device_map: dict[str, Union[int, str]] = OrderedDict()
    to_place = _expand("", model)
    max_layer, max_layer_names = get_max_layer_size([(n, m) for n, m in to_place], sizes, no_split)
    current = 0
    used = 0
    buffers_kept_on_main = 0
    used_by_device: dict[Union[int, str], int] = {}  # bytes placed (and reserved) per device left
    nothing_fits: dict[Union[int, str], int] = {}  # devices left empty: the bytes they would need
    while to_place:
        name, module = to_place.pop(0)
        if verbose:
            logger.info("Treating module %s.", name)
        # the biggest layer stays reserved on the main devices until it is placed itself
        max_layer_names = [n for n in max_layer_names if n != name and not n.startswith(name + ".")]
        if not max_layer_names:
            max_layer, max_layer_names = get_max_layer_size(
                _modules_only(to_place), sizes, no_split
            )
        device = devices[current]
        limit = None if device == "disk" else max_memory[device]
        if limit is not None and device in main_devices:
            limit -= max_layer
        outside = _tied_outside(name, tied_groups)
        size, tied_names, tied_modules = get_module_size_with_ties(
            outside, sizes[name], sizes, to_place
        )
        if limit is None or used + size <= limit:
            if verbose:
                logger.info("Putting %s (size=%d) on %s.", name, size, device)
            device_map[name] = device
            used += size
            for tied_name in tied_names:
                device_map[tied_name] = device
            to_place = [(n, m) for n, m in to_place if n not in tied_names]
            if not offload_buffers and device in ("cpu", "disk") and isinstance(module, nn.Module):
                buffers_kept_on_main += sum(b.numel() * b.element_size() for b in module.buffers())
            continue
        if tied_names and used + sizes[name] <= limit:
            # the module fits alone: open up one of the modules it shares weights with, and retry
            opened = False
            for tied_name, tied_module in zip(tied_names, tied_modules):
                if not _has_children(tied_module) or tied_module.__class__.__name__ in no_split:
                    continue
                at = next(i for i, (n, _) in enumerate(to_place) if n == tied_name)
                to_place = (
                    [(name, module)]
                    + to_place[:at]
                    + _expand(tied_name, tied_module)
                    + to_place[at + 1 :]
                )
                max_layer, max_layer_names = get_max_layer_size(
                    _modules_only(to_place), sizes, no_split
                )
                opened = True
                break
            if opened:
                continue
        if (
            used + sizes[name] >= limit
            and _has_children(module)
            and module.__class__.__name__ not in no_split
        ):
            if verbose:
                logger.info("Module %s does not fit on %s: splitting it.", name, device)
            to_place = _expand(name, module) + to_place
            max_layer, max_layer_names = get_max_layer_size(
                _modules_only(to_place), sizes, no_split
            )
            continue
        if fallback_allocation and used == 0:
            found, found_module, rest = fallback_allocate(
                [(name, module)] + to_place, sizes, max(limit - used, 0), no_split, tied_groups
            )
            if found is not None:
                to_place = [(found, found_module)] + rest
                continue
        if verbose:
            logger.info("Module %s does not fit on %s: next device.", name, device)
        reserved = max_layer if device in main_devices else 0
        if used == 0:
            nothing_fits[device] = size + reserved
        used_by_device[device] = used + reserved
        to_place = [(name, module)] + to_place
        current += 1
        used = 0
    used_by_device.setdefault(devices[current], used)
    _report_allocation(max_memory, gpus, used_by_device, nothing_fits, buffers_kept_on_main)
    if clean_result:
        device_map = clean_device_map(device_map)
    return dict(device_map)


def _report_allocation(
    max_memory: Mapping[Union[int, str], int],
    gpus: list[Union[int, str]],
    used_by_device: Mapping[Union[int, str], int],
    nothing_fits: Mapping[Union[int, str], int],
    offloaded_buffers: int,
) -> None:
    """Say which devices got nothing, and warn when the buffers of offloaded modules (which stay
    on a GPU while the model runs, unless offload_buffers=True) fit in no GPU's remaining memory."""
    if nothing_fits:
        logger.info(
            "No module could be placed on %s: insufficient memory for this allocation (%s). Give "
            "these devices more memory in max_memory, or split the model differently.",
            ", ".join(map(str, nothing_fits)),
            ", ".join(
                f"{device} needs at least {size} bytes" for device, size in nothing_fits.items()
            ),
        )
    if offloaded_buffers and gpus:
        if not any(max_memory[g] >= offloaded_buffers + used_by_device.get(g, 0) for g in gpus):
            warnings.warn(
                f"The buffers of the offloaded modules ({offloaded_buffers} bytes) stay on a GPU while "
                "the model runs, and they fit in no GPU's remaining memory; pass offload_buffers=True "
                "if you run out of memory.",
                stacklevel=3,
            )


def check_device_map(
    model: nn.Module, device_map: Mapping[str, Union[int, str, torch.device]]
) -> None:
    """Raise when `device_map` leaves a parameter or buffer of `model` without a device.

    Keys that name nothing in `model` are ignored with a UserWarning.

    Args:
        model (torch.nn.Module): The model.
        device_map (Mapping[str, int | str | torch.device]): Module names to devices.

    Raises:
        ValueError: Some tensors have no device (the message names them).
    """
    known = {name for name, _ in model.named_modules()} | set(model.state_dict())
    unknown = [key for key in device_map if key != "" and key not in known]
    if unknown:
        warnings.warn(
            f"device_map keys do not match any submodules of {type(model).__name__}: {unknown}; "
            "they are ignored. Use names from model.named_modules() (or parameter names).",
            UserWarning,
            stacklevel=2,
        )
    remaining = uncovered_tensors(model, device_map)
    if remaining:
        raise ValueError(
            "The device_map provided does not give any device for the following parameters: "
            + ", ".join(remaining)
        )


def uncovered_tensors(model: nn.Module, device_map: Mapping[str, Any]) -> list[str]:
    """The names in `model.state_dict()` that no key of `device_map` gives a device to."""
    remaining = list(model.state_dict().keys())
    for module_name in device_map:
        if module_name == "":
            return []
        remaining = [
            n for n in remaining if n != module_name and not n.startswith(module_name + ".")
        ]
    return remaining


def _device_exists(device: Any) -> bool:
    if isinstance(device, bool):
        return False
    if isinstance(device, int):
        return torch.cuda.is_available() and 0 <= device < torch.cuda.device_count()
    if device in ("disk", "cpu", "meta"):
        return True
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        return False
    if parsed.type in ("cpu", "meta"):
        return True
    if parsed.type == "cuda":
        return torch.cuda.is_available() and (parsed.index or 0) < torch.cuda.device_count()
    if parsed.type == "mps":
        return (
            getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
        )
    module = getattr(torch, parsed.type, None)
    return bool(module is not None and getattr(module, "is_available", lambda: False)())


def validate_device_map(
    model: nn.Module, device_map: Mapping[str, Any], loading: bool = False
) -> None:
    """Every check a device map gets before anything is loaded or moved.

    Raises ValueError when `device_map` is not a dict, names a module or tensor that `model` does not
    have, uses a device that does not exist on this machine, or leaves a tensor without a device
    (with `loading`, worded as Accelerate's load_checkpoint_in_model words it: "<name> doesn't have
    any device set.", then every such tensor).
    """
    if not isinstance(device_map, Mapping):
        raise ValueError(
            f"device_map must be a dict {{module name: device}} (or one of 'auto', 'balanced', "
            f"'balanced_low_0', 'sequential' where accepted), got {type(device_map).__name__}."
        )
    known = {name for name, _ in model.named_modules()}
    known.update(name for name, _ in model.named_parameters(remove_duplicate=False))
    known.update(name for name, _ in model.named_buffers(remove_duplicate=False))
    unknown = [name for name in device_map if name not in known]
    if unknown:
        raise ValueError(
            f"device_map names module(s) that {type(model).__name__} does not have: {unknown}. Keys must "
            'be names from model.named_modules() or model.named_parameters() ("" for the whole model); '
            "check for typos or a map made for another model."
        )
    missing = [
        f"{name!r}: {device!r}" for name, device in device_map.items() if not _device_exists(device)
    ]
    if missing:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        gpus = f"GPU indices 0..{count - 1}" if count else "no GPU"
        raise ValueError(
            f"device_map uses device(s) that do not exist on this machine ({', '.join(missing)}); "
            f"available: 'cpu', 'disk' and {gpus}. Change the map or build it with infer_auto_device_map."
        )
    uncovered = uncovered_tensors(model, device_map)
    if uncovered:
        # check_device_map's words; loading also leads with Accelerate's load_checkpoint_in_model's.
        first = f"{uncovered[0]} doesn't have any device set. " if loading else ""
        raise ValueError(
            f"{first}The device_map provided does not give any device for the following "
            f"parameters: {', '.join(uncovered)}"
        )
