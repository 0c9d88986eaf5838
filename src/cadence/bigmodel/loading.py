"""Reading a checkpoint (one file, or shards with an index) into a model, following a device map.

Everything that can be checked before reading weights is checked first: the files exist, the map
names real modules and devices, and (for safetensors, whose headers are read without the data) the
names and shapes match the model. Safetensors files are memory-mapped and read one tensor at a
time, so host memory holds the model plus about one tensor, never a whole shard twice.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any, Optional, Union

import torch
from torch import nn

from .device_map import validate_device_map
from .offload import (
    load_offloaded_weight,
    load_offloaded_weights,
    offload_weight,
    save_offload_index,
)
from .sizes import as_dtype
from .tensors import (
    check_tied_parameters_in_config,
    check_tied_parameters_on_same_device,
    find_tied_parameters,
    retie_parameters,
    set_module_tensor_to_device,
)

logger = logging.getLogger(__name__)

WEIGHTS_NAME = "pytorch_model.bin"
SAFE_WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"


def resolve_checkpoint_files(
    checkpoint: Union[str, os.PathLike],
) -> tuple[list[str], Optional[dict[str, str]]]:
    """The weight files of `checkpoint` (a file, an `.index.json`, or a folder holding either) and the
    index's weight map (None for a single file). Every listed shard must exist."""
    checkpoint = os.fspath(checkpoint)
    index_file = None
    if os.path.isfile(checkpoint):
        if checkpoint.endswith(".json"):
            index_file = checkpoint
        else:
            return [checkpoint], None
    elif os.path.isdir(checkpoint):
        names = os.listdir(checkpoint)
        for single in (WEIGHTS_NAME, SAFE_WEIGHTS_NAME):
            if single in names:
                return [os.path.join(checkpoint, single)], None
        indexes = sorted(n for n in names if n.endswith(".index.json"))
        if not indexes:
            raise ValueError(
                f"{checkpoint} is not a folder containing a `.index.json` file or a {WEIGHTS_NAME} or a "
                f"{SAFE_WEIGHTS_NAME} file"
            )
        if len(indexes) > 1:
            raise ValueError(
                f"{checkpoint} containing more than one `.index.json` file, delete the irrelevant ones."
            )
        index_file = os.path.join(checkpoint, indexes[0])
    else:
        raise ValueError(
            "`checkpoint` should be the path to a file containing a whole state dict, or the index of a "
            f"sharded checkpoint, or a folder containing a sharded checkpoint or the whole state dict, but got "
            f"{checkpoint}."
        )
    try:
        with open(index_file, encoding="utf-8") as f:
            index = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"Cannot read the shard index {index_file}: {e}") from e
    weight_map = index.get("weight_map", index) if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(
            f"{index_file} is not a shard index: it needs a 'weight_map' of name -> file."
        )
    folder = os.path.dirname(index_file)
    files = [os.path.join(folder, name) for name in sorted(set(weight_map.values()))]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise FileNotFoundError(
            f"The shard index {index_file} lists file(s) that are missing: "
            f"{', '.join(os.path.basename(f) for f in missing)}. Download or copy the whole checkpoint."
        )
    return files, weight_map


def _safetensors_header(path: str) -> dict[str, tuple[str, list[int]]]:
    """{name: (dtype code, shape)} read from a safetensors header without touching the data."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise ValueError(f"{path} is not a safetensors file (shorter than its header).")
        size = int.from_bytes(raw, "little")
        try:
            header = json.loads(f.read(size))
        except ValueError as e:
            raise ValueError(f"{path} is not a safetensors file: unreadable header ({e}).") from e
    header.pop("__metadata__", None)
    return {k: (v["dtype"], list(v["shape"])) for k, v in header.items()}


def load_state_dict(
    checkpoint_file: Union[str, os.PathLike], device_map: Optional[Mapping[str, Any]] = None
) -> dict[str, torch.Tensor]:
    """All the tensors of one weights file: safetensors, or a torch file read with `weights_only=True`.

    Args:
        checkpoint_file (str | os.PathLike): The file.
        device_map (Mapping[str, Any] | None): With a map naming a single device, a safetensors file is
            read straight onto it; otherwise tensors are read to the CPU.

    Returns:
        dict[str, torch.Tensor]: Names to tensors.
    """
    path = os.fspath(checkpoint_file)
    if path.endswith(".safetensors"):
        from safetensors import safe_open  # lazy: a core dependency, kept out of `import cadence`

        device = "cpu"
        if device_map is not None and len({str(v) for v in device_map.values()}) == 1:
            only = next(iter(device_map.values()))
            if only not in ("disk", "meta"):
                device = f"cuda:{only}" if isinstance(only, int) else str(only)
        with safe_open(path, framework="pt", device=device) as f:
            metadata = f.metadata() or {"format": "pt"}
            if metadata.get("format", "pt") not in ("pt", "tf", "flax", "mlx"):
                raise OSError(
                    f"The safetensors archive passed at {path} does not contain the valid metadata. Make "
                    "sure you save your model with the `save_pretrained` method."
                )
            if metadata.get("format", "pt") != "pt":
                raise ValueError(
                    f"The checkpoint passed was saved with {metadata['format']}, we need a the pt format."
                )
            return {name: f.get_tensor(name) for name in f.keys()}
    return torch.load(path, map_location="cpu", weights_only=True)


def _torch_load(path: str) -> Any:
    """torch.load with weights_only=True, memory-mapped when the file's format allows it."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as e:
        if "mmap" not in str(e):
            raise
        # files written with the legacy (non-zip) format cannot be memory-mapped
        return torch.load(path, map_location="cpu", weights_only=True)


def _iter_file(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of one file; safetensors tensors are read one by one from a memory map."""
    if path.endswith(".safetensors"):
        from safetensors import safe_open  # lazy: a core dependency, kept out of `import cadence`

        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
        return
    state = _torch_load(path)
    if not isinstance(state, Mapping):
        raise ValueError(f"{path} does not hold a state dict (a mapping of names to tensors).")
    while state:
        # pop as we go so the file's tensors are released one at a time
        name = next(iter(state))
        yield name, state.pop(name)


def _precheck_keys(
    model: nn.Module,
    files: list[str],
    weight_map: Optional[dict[str, str]],
    strict: bool,
) -> None:
    """Names and shapes known before reading weights (index, safetensors headers) against the model."""
    state = model.state_dict(keep_vars=True)
    names: dict[str, Optional[list[int]]] = {}
    if weight_map is not None:
        names.update(dict.fromkeys(weight_map))
    for path in files:
        if path.endswith(".safetensors"):
            names.update({k: shape for k, (_, shape) in _safetensors_header(path).items()})
        elif weight_map is None:
            # a torch file: memory-mapped, so listing its names and shapes reads no weight data
            state_in_file = _torch_load(path)
            if isinstance(state_in_file, Mapping):
                names.update(
                    {
                        k: list(v.shape)
                        for k, v in state_in_file.items()
                        if isinstance(v, torch.Tensor)
                    }
                )
            del state_in_file
    wrong_shapes = [
        f'"{k}": checkpoint {shape} vs model {list(state[k].shape)}'
        for k, shape in names.items()
        if shape is not None and k in state and list(state[k].shape) != shape
    ]
    if wrong_shapes:
        raise ValueError(
            f"The checkpoint does not match {type(model).__name__}: tensor shapes differ for "
            f"{'; '.join(wrong_shapes[:10])}. Trying to set a tensor of a different shape looks incorrect: check "
            "that the model's config is the one the checkpoint was saved from."
        )
    if strict and names:
        _raise_on_key_mismatch(model, set(names), state)


def _raise_on_key_mismatch(model: nn.Module, found: set[str], state: Mapping[str, Any]) -> None:
    tied = {name: group for group in find_tied_parameters(model) for name in group}
    unexpected = sorted(found - set(state))
    # a tied weight stored once (safetensors dedupes aliases) is not missing
    missing = sorted(
        k for k in state if k not in found and not any(t in found for t in tied.get(k, []))
    )
    if unexpected or missing:
        lines = [f"Error(s) in loading state_dict for {type(model).__name__}:"]
        if missing:
            lines.append(f"\tMissing key(s) in state_dict: {', '.join(repr(k) for k in missing)}.")
        if unexpected:
            lines.append(
                f"\tUnexpected key(s) in state_dict: {', '.join(repr(k) for k in unexpected)}."
            )
        lines.append("Nothing was loaded. Pass strict=False to load the matching weights only.")
        raise RuntimeError("\n".join(lines))


def _device_of(name: str, device_map: Mapping[str, Any]) -> Any:
    module = name
    while module and module not in device_map:
        module = module.rpartition(".")[0]
    if module == "" and "" not in device_map:
        raise ValueError(f"{name} doesn't have any device set.")
    return device_map[module]


def _keeps_fp32(name: str, keep_in_fp32_modules: Optional[list[str]]) -> bool:
    return any(
        (key in name and f"{key}." in name) or key == name for key in keep_in_fp32_modules or []
    )


def load_checkpoint_in_model(
    model: nn.Module,
    checkpoint: Union[str, os.PathLike],
    device_map: Optional[dict[str, Union[int, str, torch.device]]] = None,
    offload_folder: Union[str, os.PathLike, None] = None,
    dtype: Union[str, torch.dtype, None] = None,
    offload_state_dict: bool = False,
    offload_buffers: bool = False,
    keep_in_fp32_modules: Optional[list[str]] = None,
    offload_8bit_bnb: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
) -> None:
    """Load a checkpoint into `model` (which may be on the meta device), each weight where `device_map` says.

    A weight mapped to a device is loaded there; one mapped to "disk" is written to `offload_folder`
    and left on the meta device for `dispatch_model`. Tied weights are tied again at the end.

    Args:
        model (torch.nn.Module): The model, often built under `init_empty_weights`.
        checkpoint (str | os.PathLike): A weights file (safetensors, or a torch file read with
            `weights_only=True`), the `.index.json` of a sharded checkpoint, or a folder holding either.
        device_map (dict[str, int | str | torch.device] | None): Module names to devices ("cpu", a GPU
            index, "disk"); None loads every weight where the model's parameter is (the CPU for a meta
            model).
        offload_folder (str | os.PathLike | None): Where weights mapped to "disk" are written; required
            when the map uses "disk".
        dtype (str | torch.dtype | None): Cast floating-point weights to this dtype.
        offload_state_dict (bool): Park CPU weights on disk while loading, so peak memory stays low
            (default False).
        offload_buffers (bool): Send the buffers of disk-mapped modules to disk too (default False).
        keep_in_fp32_modules (list[str] | None): Modules whose weights stay float32 when `dtype` is
            float16.
        offload_8bit_bnb (bool): Offload bitsandbytes 8-bit weights too (default False).
        strict (bool): Weights the model lacks, or that the checkpoint misses, are an error (raised
            before anything is loaded when the names are known from an index or safetensors headers);
            False (default) lists them in a warning.
        full_state_dict (bool): For a sharded (DTensor) model, the checkpoint holds full tensors (default
            True).
        broadcast_from_rank0 (bool): For a sharded model, only rank 0 reads the file and sends the
            weights to the others (default False).

    Raises:
        ValueError: An invalid device map, "disk" without `offload_folder`, or mismatched weights with
            `strict=True`.

    Example:
        >>> import torch
        >>> from cadence import init_empty_weights, load_checkpoint_in_model
        >>> from safetensors.torch import save_file
        >>> save_file(torch.nn.Linear(2, 2).state_dict(), "model.safetensors")
        >>> with init_empty_weights():
        ...     model = torch.nn.Linear(2, 2)
        >>> load_checkpoint_in_model(model, "model.safetensors", device_map={"": "cpu"})
        >>> model.weight.device
        device(type='cpu')
    """
    if offload_8bit_bnb:
        raise NotImplementedError(
            "offload_8bit_bnb=True needs bitsandbytes 8-bit quantization, which Cadence does not "
            "implement; load the model unquantized (offload_8bit_bnb=False)."
        )
    dtype = as_dtype(dtype)
    if device_map is not None:
        validate_device_map(model, device_map, loading=True)
    disk_used = device_map is not None and "disk" in device_map.values()
    if disk_used and offload_folder is None:
        raise ValueError(
            "At least one of the model submodule will be offloaded to disk, please pass along an "
            "`offload_folder`."
        )
    files, weight_map = resolve_checkpoint_files(checkpoint)
    _precheck_keys(model, files, weight_map, strict)

    tied_params = find_tied_parameters(model)
    if check_tied_parameters_in_config(model) and not tied_params:
        logger.warning(
            "The model weights are not tied. Please use the `tie_weights` method before using the "
            "`infer_auto_device` function."
        )
    if device_map is not None:
        check_tied_parameters_on_same_device(tied_params, device_map)
    if disk_used:
        os.makedirs(offload_folder, exist_ok=True)

    if device_map is None:
        _load_without_map(model, files, strict, full_state_dict, broadcast_from_rank0, checkpoint)
        retie_parameters(model, tied_params)
        return

    model_state = model.state_dict(keep_vars=True)
    buffer_names = {name for name, _ in model.named_buffers()}
    offload_index: dict[str, Any] = {}
    park_folder = tempfile.mkdtemp() if offload_state_dict else None
    park_index: dict[str, Any] = {}
    unexpected: set[str] = set()
    seen: set[str] = set()
    try:
        for path in files:
            for name, value in _iter_file(path):
                if "SCB" in name:
                    continue  # bitsandbytes statistics, not a weight
                if name not in model_state:
                    unexpected.add(name)
                    if not strict:
                        continue
                    raise RuntimeError(
                        f"Error(s) in loading state_dict for {type(model).__name__}:\n\tUnexpected key(s) in "
                        f"state_dict: {name!r} (from {path})."
                    )
                seen.add(name)
                device = _device_of(name, device_map)
                new_dtype = dtype
                if dtype is not None and torch.is_floating_point(value):
                    if dtype == torch.float16 and _keeps_fp32(name, keep_in_fp32_modules):
                        new_dtype = torch.float32
                if device == "disk":
                    if offload_buffers or name not in buffer_names:
                        target = new_dtype or value.dtype
                        set_module_tensor_to_device(model, name, "meta", dtype=target)
                        offload_weight(
                            value.to(target) if torch.is_floating_point(value) else value,
                            name,
                            offload_folder,
                            index=offload_index,
                        )
                        continue
                    device = "cpu"  # a disk module's buffer stays in memory
                if device == "cpu" and park_folder is not None:
                    target = new_dtype or value.dtype
                    set_module_tensor_to_device(model, name, "meta", dtype=target)
                    if torch.is_floating_point(value):
                        value = value.to(target)  # parked in the dtype it is loaded in
                    offload_weight(value, name, park_folder, index=park_index)
                    continue
                set_module_tensor_to_device(
                    model, name, device, value=value, dtype=new_dtype, clear_cache=False
                )
        if strict:
            _raise_on_key_mismatch(model, seen | unexpected, model_state)
        _complete_tied_weights(
            model,
            tied_params,
            device_map,
            (offload_folder, offload_index),
            (park_folder, park_index),
        )
        save_offload_index(offload_index, offload_folder)
        if park_folder is not None:
            load_offloaded_weights(model, park_index, park_folder)
    finally:
        if park_folder is not None:
            shutil.rmtree(park_folder, ignore_errors=True)
    if unexpected:
        _warn_unexpected(checkpoint, model, unexpected)
    retie_parameters(model, tied_params)


def _get_tensor(model: nn.Module, name: str) -> torch.Tensor:
    owner, _, attr = name.rpartition(".")
    return getattr(model.get_submodule(owner) if owner else model, attr)


def _complete_tied_weights(
    model: nn.Module,
    tied_params: list[list[str]],
    device_map: Mapping[str, Any],
    disk: tuple[Any, dict[str, Any]],
    parked: tuple[Any, dict[str, Any]],
) -> None:
    """Give every name of a tied group its weight where the map sends it.

    A checkpoint stores tied weights once (safetensors drops aliases), so the other names of the group
    got nothing: copy the stored one to their place (the offload folder, or the model's device).
    """
    for group in tied_params:
        source = None
        for name in group:
            tensor = _get_tensor(model, name)
            if not tensor.is_meta:
                source = tensor
                break
        for folder, index in (disk, parked):
            for name in group:
                if source is None and folder is not None and name in index:
                    source = load_offloaded_weight(
                        os.path.join(os.fspath(folder), f"{name}.dat"), index[name]
                    )
        if source is None:
            continue
        for name in group:
            device = _device_of(name, device_map)
            if device == "disk":
                if name not in disk[1]:
                    offload_weight(source, name, disk[0], index=disk[1])
            elif device == "cpu" and parked[0] is not None:
                if name not in parked[1]:
                    offload_weight(source, name, parked[0], index=parked[1])
            elif _get_tensor(model, name).is_meta:
                set_module_tensor_to_device(model, name, device, value=source.clone())


def _warn_unexpected(checkpoint: Any, model: nn.Module, unexpected: set[str]) -> None:
    logger.warning(
        "Some weights of the model checkpoint at %s were not used when initializing %s: %s. This may or "
        "may not be an issue - make sure that the checkpoint does not have unnecessary parameters, or that "
        "the model definition correctly corresponds to the checkpoint.",
        checkpoint,
        type(model).__name__,
        sorted(unexpected),
    )


def _has_dtensor(model: nn.Module) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return False
    return any(isinstance(t, DTensor) for t in model.state_dict().values())


def _load_without_map(
    model: nn.Module,
    files: list[str],
    strict: bool,
    full_state_dict: bool,
    broadcast_from_rank0: bool,
    checkpoint: Any,
) -> None:
    """No device map: each weight goes where the model's tensor is (the CPU for a meta tensor)."""
    import torch.distributed as dist

    model_state = model.state_dict(keep_vars=True)
    unexpected: set[str] = set()
    seen: set[str] = set()
    if broadcast_from_rank0 or _has_dtensor(model):
        # sharded or replicated across processes: torch's distributed state-dict API places the pieces
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        for path in files:
            loaded = load_state_dict(path) if not broadcast_from_rank0 or rank == 0 else {}
            unexpected |= set(loaded) - set(model_state)
            seen |= set(loaded)
            set_model_state_dict(
                model,
                {k: v for k, v in loaded.items() if k in model_state},
                options=StateDictOptions(
                    full_state_dict=full_state_dict,
                    strict=False,
                    broadcast_from_rank0=broadcast_from_rank0,
                ),
            )
    else:
        for path in files:
            for name, value in _iter_file(path):
                if name not in model_state:
                    unexpected.add(name)
                    continue
                seen.add(name)
                current = model_state[name]
                device = "cpu" if current.device.type == "meta" else current.device
                if current.device.type == "meta":
                    set_module_tensor_to_device(model, name, device, value=value, clear_cache=False)
                else:
                    with torch.no_grad():
                        current.copy_(value)  # in place: the optimizer's references stay valid
    if strict and not broadcast_from_rank0:  # with a broadcast only rank 0 sees the file
        _raise_on_key_mismatch(model, seen | unexpected, model_state)
    if unexpected:
        _warn_unexpected(checkpoint, model, unexpected)
