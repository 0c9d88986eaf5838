"""Weights offloaded to disk: one raw `<name>.dat` file per tensor plus `index.json`.

The layout is Accelerate's, so an offload folder written by either library reads in the other:
`index.json` maps each name to `{"dtype": numpy dtype name or "bfloat16"/"float8_*", "shape": [...]}`,
and `<name>.dat` holds the tensor's bytes in C order (0-d tensors are stored as shape (1,)). Reads
memory-map the file copy-on-write, so a weight is paged in from the page cache without an extra
copy and is dropped as soon as nothing refers to it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any, Optional, Union

import torch
from torch import nn

from .tensors import set_module_tensor_to_device

OFFLOAD_INDEX_NAME = "index.json"
# dtypes numpy has no name for are stored reinterpreted as a same-width integer
_VIEW_AS = {"bfloat16": torch.int16}


def _storage_dtype(name: str) -> torch.dtype:
    if name in _VIEW_AS:
        return _VIEW_AS[name]
    if name.startswith("float8_"):
        return torch.int8
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"The offload index names an unknown dtype {name!r}.")
    return dtype


def _index_dtype(dtype: torch.dtype) -> str:
    name = str(dtype).replace("torch.", "")
    # numpy's names for the same dtypes, as the reference writes them
    return {"float": "float32", "double": "float64", "half": "float16", "long": "int64"}.get(
        name, name
    )


def offload_weight(
    weight: torch.Tensor,
    weight_name: str,
    offload_folder: Union[str, os.PathLike],
    index: Optional[dict[str, Any]] = None,
) -> Optional[dict[str, Any]]:
    """Write `weight` to `offload_folder/<weight_name>.dat` and record it in `index` (returned).

    Args:
        weight (torch.Tensor): The tensor to write (any device).
        weight_name (str): Its name, also the file's name.
        offload_folder (str | os.PathLike): An existing folder to write into.
        index (dict[str, Any] | None): The index to add the entry to; None records nothing.

    Returns:
        dict[str, Any] | None: `index`, with the new entry.
    """
    name = _index_dtype(weight.dtype)
    data = weight.detach()
    if name in _VIEW_AS or name.startswith("float8_"):
        data = data.view(_storage_dtype(name))
    data = data.to("cpu").contiguous()
    if data.ndim == 0:
        data = data.reshape(1)
    path = os.path.join(os.fspath(offload_folder), f"{weight_name}.dat")
    with open(path, "wb") as f:
        # the raw bytes: what numpy.memmap of the same dtype and shape reads back
        f.write(memoryview(data.view(torch.uint8).numpy()) if data.numel() else b"")
    if index is not None:
        index[weight_name] = {"dtype": name, "shape": list(weight.shape)}
    return index


def load_offloaded_weight(
    weight_file: Union[str, os.PathLike], weight_info: Mapping[str, Any]
) -> torch.Tensor:
    """The tensor stored in `weight_file`, described by its `index.json` entry `weight_info`.

    The result is backed by a copy-on-write memory map of the file: writing to it never changes
    the file.

    Args:
        weight_file (str | os.PathLike): The `.dat` file.
        weight_info (Mapping[str, Any]): Its index entry, with "dtype" and "shape".

    Returns:
        torch.Tensor: The weight, on the CPU.

    Raises:
        ValueError: A file shorter than its entry says (a damaged folder).
    """
    import numpy as np  # lazy: a core dependency, kept out of `import cadence`

    shape = tuple(weight_info["shape"])
    dtype_name = weight_info["dtype"]
    storage = _storage_dtype(dtype_name)
    numel = 1
    for dim in shape:
        numel *= dim
    if numel == 0:
        return torch.empty(shape, dtype=getattr(torch, dtype_name))
    raw = np.memmap(os.fspath(weight_file), dtype=np.uint8, mode="c")
    expected = numel * torch.empty((), dtype=storage).element_size()
    if raw.size < expected:
        raise ValueError(
            f"The offloaded weight {weight_file} holds {raw.size} bytes but its index entry "
            f"({dtype_name}, shape {list(shape)}) needs {expected}; the offload folder is damaged: "
            "delete it and offload again."
        )
    tensor = torch.from_numpy(raw[:expected]).view(storage).reshape(shape)
    if storage != getattr(torch, dtype_name, storage):
        tensor = tensor.view(getattr(torch, dtype_name))
    return tensor


def save_offload_index(
    index: Optional[dict[str, Any]], offload_folder: Union[str, os.PathLike]
) -> None:
    """Merge `index` into `offload_folder/index.json` (nothing happens for an empty index).

    Args:
        index (dict[str, Any] | None): Entries to add (name -> dtype and shape).
        offload_folder (str | os.PathLike): The folder whose `index.json` is written.
    """
    if not index:
        return
    path = os.path.join(os.fspath(offload_folder), OFFLOAD_INDEX_NAME)
    current: dict[str, Any] = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            current = json.load(f)
    current.update(index)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(current, f, indent=2)


def offload_state_dict(
    save_dir: Union[str, os.PathLike], state_dict: Mapping[str, torch.Tensor]
) -> None:
    """Write every tensor of `state_dict` into the folder `save_dir` (created) with its index.

    Example:
        >>> offload_state_dict("offload", {"weight": torch.ones(2)})
        >>> sorted(os.listdir("offload"))
        ['index.json', 'weight.dat']

    Args:
        save_dir (str | os.PathLike): The folder to write (created when missing).
        state_dict (Mapping[str, torch.Tensor]): The tensors, by name.
    """
    os.makedirs(save_dir, exist_ok=True)
    index: dict[str, Any] = {}
    for name, tensor in state_dict.items():
        offload_weight(tensor, name, save_dir, index=index)
    save_offload_index(index, save_dir)


class PrefixedDataset(Mapping):
    """A read-only view of `dataset` where key `k` means `prefix + k` (the weights of one submodule).

    Example:
        >>> PrefixedDataset({"block.weight": 1}, "block.")["weight"]
        1

    Args:
        dataset (Mapping): The whole mapping (the weights of the model).
        prefix (str): What is put before every key, e.g. "encoder.layer.0.".
    """

    def __init__(self, dataset: Mapping, prefix: str) -> None:
        self.dataset = dataset
        self.prefix = prefix

    def __getitem__(self, key: str) -> Any:
        return self.dataset[f"{self.prefix}{key}"]

    def __iter__(self) -> Iterator[str]:
        return iter([k for k in self.dataset if k.startswith(self.prefix)])

    def __len__(self) -> int:
        return len(self.dataset)


class OffloadedWeightsLoader(Mapping):
    """One mapping over weights held in memory (`state_dict`) and weights offloaded to `save_folder`.

    Weights on disk are read when asked for; with `device` they are moved there. An index entry may
    also point into a safetensors file (`{"safetensors_file": ..., "weight_name": ..., "dtype": ...}`),
    which is read directly instead of a `.dat` copy.

    Args:
        state_dict (dict[str, torch.Tensor] | None): Weights kept in memory.
        save_folder (str | os.PathLike | None): The offload folder (with its `index.json`) holding the
            other weights.
        index (Mapping[str, Any] | None): The folder's index, if already read; None reads it from
            `save_folder`.
        device (Any): Where weights read from disk are moved; None leaves them on the CPU.

    Raises:
        ValueError: None of `state_dict`, `save_folder` and `index`.
        FileNotFoundError: A `save_folder` without an `index.json`.
    """

    def __init__(
        self,
        state_dict: Optional[dict[str, torch.Tensor]] = None,
        save_folder: Union[str, os.PathLike, None] = None,
        index: Optional[Mapping[str, Any]] = None,
        device: Any = None,
    ) -> None:
        if state_dict is None and save_folder is None and index is None:
            raise ValueError(
                "Need either a `state_dict` or a `save_folder` containing offloaded weights."
            )
        self.state_dict = {} if state_dict is None else state_dict
        self.save_folder = save_folder
        if index is None and save_folder is not None:
            path = os.path.join(os.fspath(save_folder), OFFLOAD_INDEX_NAME)
            if not os.path.isfile(path):
                raise FileNotFoundError(
                    f"{save_folder} holds no {OFFLOAD_INDEX_NAME}: it is not an offload folder. Offload the "
                    "weights there first (offload_state_dict / disk_offload) or pass the right folder."
                )
            with open(path, encoding="utf-8") as f:
                index = json.load(f)
        self.index = {} if index is None else index
        self.all_keys = list(self.state_dict)
        self.all_keys.extend(k for k in self.index if k not in self.state_dict)
        self.device = device

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self.state_dict:
            return self.state_dict[key]
        info = self.index[key]
        if info.get("safetensors_file") is not None:
            from safetensors import (
                safe_open,  # lazy: a core dependency, kept out of `import cadence`
            )

            device = "cpu" if self.device is None else str(self.device)
            with safe_open(info["safetensors_file"], framework="pt", device=device) as f:
                tensor = f.get_tensor(info.get("weight_name", key))
            if "dtype" in info:
                tensor = tensor.to(getattr(torch, info["dtype"]))
            return tensor
        tensor = load_offloaded_weight(
            os.path.join(os.fspath(self.save_folder), f"{key}.dat"), info
        )
        return tensor if self.device is None else tensor.to(self.device)

    def __iter__(self) -> Iterator[str]:
        return iter(self.all_keys)

    def __len__(self) -> int:
        return len(self.all_keys)


def extract_submodules_state_dict(
    state_dict: Mapping[str, torch.Tensor], submodule_names: list[str]
) -> dict[str, torch.Tensor]:
    """The entries of `state_dict` that belong to one of `submodule_names` (or are one of them).

    Args:
        state_dict (Mapping[str, torch.Tensor]): The state dict of the whole model.
        submodule_names (list[str]): Names of submodules (or of tensors); "" selects everything.

    Returns:
        dict[str, torch.Tensor]: The selected entries, with their full names.
    """
    result = {}
    for name in submodule_names:
        prefix = f"{name}." if name else ""
        for key, tensor in state_dict.items():
            if key == name or key.startswith(prefix):
                result[key] = tensor
    return result


def load_offloaded_weights(
    model: nn.Module, index: Mapping[str, Any], offload_folder: Union[str, os.PathLike]
) -> None:
    """Read every weight listed in `index` from `offload_folder` back into `model`, on CPU.

    Args:
        model (nn.Module): The model whose tensors are set.
        index (Mapping[str, Any]): The offload index: tensor names and their dtype and shape.
        offload_folder (str | os.PathLike): The folder holding the `.dat` files.
    """
    if not index:
        return
    for name, info in index.items():
        tensor = load_offloaded_weight(os.path.join(os.fspath(offload_folder), f"{name}.dat"), info)
        # clone: the folder may be deleted right after (offload_state_dict's temporary folder)
        set_module_tensor_to_device(model, name, "cpu", value=tensor.clone(), dtype=tensor.dtype)
