"""save_model / load_checkpoint_in_model: weights in (sharded) safetensors with an index.

File names and the index format are those of Accelerate and transformers:
`model.safetensors`, or `model-00001-of-00003.safetensors` ... plus `model.safetensors.index.json`
holding `{"metadata": {"total_size": N}, "weight_map": {name: file}}` (and the `pytorch_model*.bin`
equivalents without safetensors). Shards are filled greedily in state-dict order; a weight larger
than the limit gets a shard of its own; tensors sharing memory stay in one shard, and for
safetensors exact aliases (tied weights) are stored once.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from ..bigmodel.loading import load_checkpoint_in_model as load_with_device_map
from .fs import write_file_atomically
from .serialization import (
    _storage_key,
    dedupe_shared_tensors,
    read_safetensors,
    read_torch,
    save,
)

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

WEIGHTS_NAME = "pytorch_model.bin"
WEIGHTS_PATTERN_NAME = "pytorch_model{suffix}.bin"
WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"
SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_PATTERN_NAME = "model{suffix}.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"

_DECIMAL_UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_BINARY_UNITS = {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SHARD_RE = re.compile(r"^(.*?)-\d{5}-of-\d{5}$")


def parse_shard_size(size: Union[int, str]) -> int:
    """Bytes in a shard-size limit: an int, or digits and a unit like "5MB" / "1.5GB".

    KB/MB/GB/TB are decimal (1MB = 1,000,000 bytes), case-insensitive, as in Accelerate's
    save_model; KiB/MiB/GiB/TiB are binary.
    """
    if isinstance(size, bool):
        raise TypeError(f"max_shard_size must be an int or a string like '5GB', got {size!r}")
    if isinstance(size, int):
        if size < 0:
            raise ValueError(f"max_shard_size must be >= 0 bytes, got {size}")
        return size
    if not isinstance(size, str):
        raise TypeError(f"max_shard_size must be an int or a string like '5GB', got {size!r}")
    text = size.strip().upper()
    for units, width in ((_BINARY_UNITS, 3), (_DECIMAL_UNITS, 2)):
        unit = text[-width:]
        if unit in units:
            try:
                value = float(text[:-width].strip())
            except ValueError:
                break
            if value < 0:
                break
            return int(value * units[unit])
    raise ValueError(
        f"max_shard_size {size!r} is not a size: use an int (bytes) or digits followed by a unit "
        "among KB, MB, GB, TB (decimal) or KiB, MiB, GiB, TiB (binary), like '5GB'."
    )


def _tensor_storage_size(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().nbytes()
    except (NotImplementedError, RuntimeError):
        return tensor.numel() * tensor.element_size()


@dataclass
class ShardPlan:
    """How a state dict is split into weight files: files to keys, keys to files, total size."""

    filename_to_keys: dict[str, list[str]]
    key_to_filename: dict[str, str]
    total_size: int
    is_sharded: bool = field(init=False)

    def __post_init__(self) -> None:
        self.is_sharded = len(self.filename_to_keys) > 1

    def index(self) -> dict[str, Any]:
        """The index of a sharded checkpoint: total size and the weight map."""
        return {"metadata": {"total_size": self.total_size}, "weight_map": self.key_to_filename}


def plan_shards(
    state_dict: Mapping[str, Any], max_shard_size: Union[int, str], filename_pattern: str
) -> ShardPlan:
    """Split a state dict into shards of at most `max_shard_size` bytes, in key order.

    A tensor bigger than the limit gets its own shard; tensors sharing memory go to the shard of the
    first of them and are counted once; non-tensor values (strings) are skipped.
    """
    import torch

    limit = parse_shard_size(max_shard_size)
    shards: list[dict[str, None]] = []
    current: dict[str, None] = {}
    current_size = 0
    total = 0
    groups: dict[Any, list[str]] = {}
    for name, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor):
            continue
        key = _storage_key(tensor) if tensor.device.type != "meta" else None
        if key is not None:
            if key in groups:
                groups[key].append(name)
                continue
            groups[key] = [name]
        size = _tensor_storage_size(tensor)
        total += size
        if size > limit:
            shards.append({name: None})
            continue
        if current_size + size > limit:
            shards.append(current)
            current, current_size = {}, 0
        current[name] = None
        current_size += size
    if current:
        shards.append(current)
    for names in groups.values():
        for shard in shards:
            if names[0] in shard:
                for n in names[1:]:
                    shard[n] = None
                break
    if len(shards) == 1:
        filename = filename_pattern.format(suffix="")
        keys = list(shards[0])
        return ShardPlan({filename: keys}, dict.fromkeys(keys, filename), total)
    filename_to_keys: dict[str, list[str]] = {}
    key_to_filename: dict[str, str] = {}
    for i, shard in enumerate(shards):
        filename = filename_pattern.format(suffix=f"-{i + 1:05d}-of-{len(shards):05d}")
        filename_to_keys[filename] = list(shard)
        key_to_filename.update(dict.fromkeys(shard, filename))
    return ShardPlan(filename_to_keys, key_to_filename, total)


def save_model(
    model_or_state_dict: torch.nn.Module | Mapping[str, torch.Tensor],
    save_directory: str | os.PathLike,
    max_shard_size: Union[int, str] = "10GB",
    safe_serialization: bool = True,
) -> ShardPlan | None:
    """Write weights to `save_directory` as one file or shards plus an index.

    Shard files from an earlier save that this one does not rewrite are deleted; each file is
    written atomically and the index last. Returns the plan (None for an empty state dict).
    """
    import torch

    save_directory = Path(os.path.expanduser(os.fspath(save_directory)))
    if save_directory.is_file():
        raise NotADirectoryError(
            f"save_model: {save_directory} is a file; pass a folder path (it is created if needed)."
        )
    parse_shard_size(max_shard_size)  # bad sizes fail before anything is written
    if isinstance(model_or_state_dict, torch.nn.Module):
        state_dict = model_or_state_dict.state_dict()
    elif isinstance(model_or_state_dict, Mapping):
        state_dict = dict(model_or_state_dict)
    else:
        raise TypeError(
            f"save_model expects a torch.nn.Module or a state dict, got {type(model_or_state_dict).__name__}"
        )
    on_meta = [k for k, v in state_dict.items() if isinstance(v, torch.Tensor) and v.is_meta]
    if on_meta:
        raise RuntimeError(
            f"Cannot save the model: {len(on_meta)} tensor(s) are on the meta device (no data), "
            f"e.g. {on_meta[:3]}. Load or materialize the weights first."
        )
    if safe_serialization:
        state_dict, _ = dedupe_shared_tensors(state_dict)
        weights_name, pattern, index_name = (
            SAFE_WEIGHTS_NAME,
            SAFE_WEIGHTS_PATTERN_NAME,
            SAFE_WEIGHTS_INDEX_NAME,
        )
    else:
        weights_name, pattern, index_name = WEIGHTS_NAME, WEIGHTS_PATTERN_NAME, WEIGHTS_INDEX_NAME
    plan = plan_shards(state_dict, max_shard_size, pattern)
    if not plan.filename_to_keys:
        logger.warning("save_model: the state dict holds no tensors; nothing was written.")
        return None
    save_directory.mkdir(parents=True, exist_ok=True)
    _remove_stale_shards(save_directory, weights_name, set(plan.filename_to_keys))
    for filename, keys in plan.filename_to_keys.items():
        shard = {k: state_dict[k] for k in keys}
        save(shard, save_directory / filename, safe_serialization=safe_serialization)
    index_path = save_directory / index_name
    if plan.is_sharded:
        text = json.dumps(plan.index(), indent=2, sort_keys=True) + "\n"
        write_file_atomically(index_path, text.encode("utf-8"), durable=False)
        logger.info(
            "The model is bigger than max_shard_size (%s): split in %d shards; the index is %s.",
            max_shard_size,
            len(plan.filename_to_keys),
            index_path,
        )
    else:
        index_path.unlink(missing_ok=True)  # a stale index would point at deleted shards
    return plan


def _remove_stale_shards(directory: Path, weights_name: str, keep: set[str]) -> None:
    stem, suffix = os.path.splitext(weights_name)
    for entry in directory.iterdir():
        if not entry.is_file() or entry.name in keep or not entry.name.endswith(suffix):
            continue
        base = entry.name[: -len(suffix)]
        m = _SHARD_RE.fullmatch(base)
        if m and m.group(1) == stem:
            entry.unlink()


# --------------------------------------------------------------------------- loading
def _checkpoint_files(checkpoint: str | os.PathLike) -> list[Path]:
    path = Path(os.path.expanduser(os.fspath(checkpoint)))
    index_file = None
    if path.is_file():
        if path.name.endswith(".json"):
            index_file = path
        else:
            return [path]
    elif path.is_dir():
        for single in (WEIGHTS_NAME, SAFE_WEIGHTS_NAME):
            if (path / single).is_file():
                return [path / single]
        indexes = sorted(p for p in path.iterdir() if p.name.endswith(".index.json"))
        if not indexes:
            raise ValueError(
                f"{path} holds no {WEIGHTS_NAME}, no {SAFE_WEIGHTS_NAME} and no *.index.json of a "
                "sharded checkpoint; point `checkpoint` at the weights file or the folder save_model wrote."
            )
        if len(indexes) > 1:
            raise ValueError(
                f"{path} holds several index files ({', '.join(p.name for p in indexes)}); "
                "delete the ones that do not belong, or pass the index file itself."
            )
        index_file = indexes[0]
    else:
        raise ValueError(
            "`checkpoint` must be a weights file, the .index.json of a sharded checkpoint, or a folder "
            f"holding either, but {path} does not exist."
        )
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"Cannot read the shard index {index_file}: {e}") from e
    weight_map = index.get("weight_map", index) if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise ValueError(f"{index_file} is not a shard index (no 'weight_map' mapping).")
    files = [index_file.parent / f for f in sorted(set(weight_map.values()))]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(
            f"The shard index {index_file} lists file(s) that are missing: {', '.join(missing)}."
        )
    return files


def load_state_dict(
    checkpoint_file: str | os.PathLike,
    device_map: Mapping[str, Any] | None = None,
    *,
    allow_pickle: bool = False,
) -> dict[str, torch.Tensor]:
    """Read one weights file (safetensors, or torch.save loaded with weights_only=True) on CPU."""
    path = os.fspath(checkpoint_file)
    if path.endswith(".safetensors"):
        return read_safetensors(path, device="cpu")
    return read_torch(path, map_location="cpu", allow_pickle=allow_pickle)


def load_checkpoint_in_model(
    model: torch.nn.Module,
    checkpoint: str | os.PathLike,
    device_map: Mapping[str, Any] | None = None,
    offload_folder: str | os.PathLike | None = None,
    dtype: str | torch.dtype | None = None,
    offload_state_dict: bool = False,
    offload_buffers: bool = False,
    keep_in_fp32_modules: list[str] | None = None,
    offload_8bit_bnb: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
) -> None:
    """Load a weights file, an index file, or a folder written by save_model into `model`.

    strict=True refuses weights the model does not have (Accelerate's rule; keys the model has
    but the files lack, such as tied weights stored once, are left as they are).
    """
    import torch

    if (
        device_map is not None
        or offload_folder is not None
        or offload_state_dict
        or offload_buffers
    ):
        # device maps and CPU/disk offload: the big-model loader (issue 16)

        return load_with_device_map(
            model,
            checkpoint,
            device_map=device_map,
            offload_folder=offload_folder,
            dtype=dtype,
            offload_state_dict=offload_state_dict,
            offload_buffers=offload_buffers,
            keep_in_fp32_modules=keep_in_fp32_modules,
            offload_8bit_bnb=offload_8bit_bnb,
            strict=strict,
            full_state_dict=full_state_dict,
            broadcast_from_rank0=broadcast_from_rank0,
        )
    if offload_8bit_bnb:
        raise NotImplementedError(
            "load_checkpoint_in_model: 8-bit offloading (bitsandbytes) is not supported; "
            "pass offload_8bit_bnb=False."
        )
    if isinstance(dtype, str):
        name = dtype.replace("torch.", "")
        if not isinstance(getattr(torch, name, None), torch.dtype):
            raise ValueError(f"dtype {dtype!r} is not a torch dtype (e.g. 'float16').")
        dtype = getattr(torch, name)
    files = _checkpoint_files(checkpoint)
    model_keys = set(model.state_dict().keys())
    unexpected: set[str] = set()
    for file in files:
        state = load_state_dict(file)
        extra = set(state) - model_keys
        unexpected |= extra
        if strict and extra:
            raise RuntimeError(
                f"Error(s) in loading state_dict for {type(model).__name__}:\n\tUnexpected key(s) "
                f"in state_dict: {', '.join(repr(k) for k in sorted(extra))} (from {file})."
            )
        known = {k: v for k, v in state.items() if k in model_keys}
        if broadcast_from_rank0 and _rank() != 0:
            known = {}  # rank 0 reads the files and broadcasts
        _load_known(model, known, full_state_dict, broadcast_from_rank0)
    if unexpected:
        logger.warning(
            "Some weights of the checkpoint at %s were not used when initializing %s: %s. "
            "Check that the checkpoint matches the model definition.",
            checkpoint,
            type(model).__name__,
            sorted(unexpected),
        )


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _load_known(
    model: torch.nn.Module,
    state: Mapping[str, torch.Tensor],
    full_state_dict: bool,
    broadcast_from_rank0: bool,
) -> None:
    has_dtensor = False
    try:
        from torch.distributed.tensor import DTensor

        has_dtensor = any(isinstance(p, DTensor) for p in model.state_dict().values())
    except ImportError:
        pass
    if has_dtensor or broadcast_from_rank0:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(
            model,
            dict(state),
            options=StateDictOptions(
                full_state_dict=full_state_dict,
                strict=False,
                broadcast_from_rank0=broadcast_from_rank0,
            ),
        )
    else:
        model.load_state_dict(state, strict=False)
