"""Merge a sharded FSDP checkpoint (a `torch.distributed.checkpoint` folder) into one weights file."""

from __future__ import annotations

import shutil
from pathlib import Path

from ..strategies.sharded_state import merge_sharded_checkpoint
from .model_io import SAFE_WEIGHTS_NAME, WEIGHTS_NAME
from .serialization import save


def _explain_missing(directory: Path) -> str:
    message = f"{directory} is not a sharded checkpoint folder (no .metadata file found)."
    candidates = [
        directory / name
        for name in ("pytorch_model_fsdp_0", "optimizer_0")
        if (directory / name).is_dir()
    ]
    if candidates:
        message += " Pass one of these instead: " + ", ".join(str(c) for c in candidates) + "."
    return message


def merge_fsdp_weights(
    checkpoint_dir: str,
    output_path: str,
    safe_serialization: bool = True,
    remove_checkpoint_dir: bool = False,
) -> Path:
    """Merge `checkpoint_dir` into `output_path/model.safetensors` (or `pytorch_model.bin`).

    Example::

        merge_fsdp_weights("ckpt/pytorch_model_fsdp_0", "merged")  # -> merged/model.safetensors

    Args:
        checkpoint_dir (str): The sharded checkpoint folder (torch.distributed.checkpoint's format, with
            its `.metadata` file), e.g. `ckpt/pytorch_model_fsdp_0`.
        output_path (str): The folder to write the merged file into (created when missing).
        safe_serialization (bool): Write safetensors (default True); False writes a torch pickle.
        remove_checkpoint_dir (bool): Delete `checkpoint_dir` afterwards (default False).

    Returns:
        Path: The file written.

    Raises:
        FileNotFoundError: `checkpoint_dir` is not a sharded checkpoint folder.
    """
    directory = Path(checkpoint_dir)
    if not (directory / ".metadata").is_file():
        raise FileNotFoundError(_explain_missing(directory))
    state = merge_sharded_checkpoint(directory)
    out = Path(output_path)
    out.mkdir(parents=True, exist_ok=True)
    target = out / (SAFE_WEIGHTS_NAME if safe_serialization else WEIGHTS_NAME)
    save(state, target, safe_serialization=safe_serialization)
    if remove_checkpoint_dir:
        shutil.rmtree(directory)
    return target
