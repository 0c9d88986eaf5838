"""The reference's module-level checkpoint functions: custom objects' state (real) and whole
accelerator state (done by `Accelerator.save_state` / `load_state` in Cadence).

Like the rest of this package it does not use torch.distributed: which process writes is read
from the launcher's RANK / LOCAL_RANK variables.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from ..core.settings import env_text
from .layout import custom_state_file
from .serialization import load, save

logger = logging.getLogger(__name__)

_USE_ACCELERATOR = (
    "Cadence writes and reads whole checkpoints (verified, atomic) with `Accelerator.save_state(output_dir)` "
    "and `Accelerator.load_state(input_dir)`; use those."
)


def _writes(save_on_each_node: bool) -> bool:
    variable = "LOCAL_RANK" if save_on_each_node else "RANK"
    return int(env_text(variable, "0") or "0") == 0


def save_custom_state(
    obj: Any, path: str | os.PathLike, index: int = 0, save_on_each_node: bool = False
) -> None:
    """Write `obj.state_dict()` to `<path>/custom_checkpoint_<index>.pkl`, once per job (or per machine).

    `save_state` uses it for the objects given to `register_for_checkpointing`.

    Args:
        obj (Any): An object with `state_dict()`.
        path (str | os.PathLike): The checkpoint folder (it must exist).
        index (int): The object's number in the file name (default 0).
        save_on_each_node (bool): Write on each machine's main process, not only on the job's (default
            False).

    Example:
        >>> import os, torch
        >>> from cadence.checkpointing import save_custom_state, load_custom_state
        >>> scheduler = torch.optim.lr_scheduler.StepLR(torch.optim.SGD([torch.zeros(1)], lr=1.0), 5)
        >>> os.makedirs("ckpt")
        >>> save_custom_state(scheduler, "ckpt", index=0)
        >>> load_custom_state(scheduler, "ckpt", index=0)
    """
    target = Path(path) / custom_state_file(index)
    logger.info(f"Saving the state of {type(obj).__name__} to {target}")
    if _writes(save_on_each_node):
        save(obj.state_dict(), target)


def load_custom_state(obj: Any, path: str | os.PathLike, index: int = 0) -> None:
    """Load `<path>/custom_checkpoint_<index>.pkl` into `obj` with `obj.load_state_dict`.

    The file is a pickle written by `save_custom_state`: load only checkpoints you trust.

    Args:
        obj (Any): An object with `load_state_dict()`.
        path (str | os.PathLike): The checkpoint folder.
        index (int): The object's number in the file name (default 0).
    """
    source = Path(path) / custom_state_file(index)
    logger.info(f"Loading the state of {type(obj).__name__} from {source}")
    obj.load_state_dict(load(source, map_location="cpu", allow_pickle=True))


def save_accelerator_state(
    output_dir: str,
    model_states: list[dict],
    optimizers: list,
    schedulers: list,
    dataloaders: list,
    process_index: int,
    step: int,
    scaler: Any = None,
    save_on_each_node: bool = False,
    safe_serialization: bool = True,
) -> Path:
    """Write a whole training state (Accelerate's internal step of `save_state`).

    Cadence does not provide this internal step of Accelerate's checkpointing: calling it raises
    NotImplementedError. Use `Accelerator.save_state` / `Accelerator.load_state`, which write and read
    the same layout atomically and verified.

    Args:
        output_dir (str): The checkpoint folder.
        model_states (list[dict]): The models' state dicts.
        optimizers (list): The optimizers.
        schedulers (list): The schedulers.
        dataloaders (list): The dataloaders.
        process_index (int): This process's rank.
        step (int): The accumulation step.
        scaler (torch.amp.GradScaler | None): The fp16 scaler.
        save_on_each_node (bool): Write on each machine.
        safe_serialization (bool): Write safetensors.

    Raises:
        NotImplementedError: Always.
    """
    raise NotImplementedError(f"`save_accelerator_state` is not provided. {_USE_ACCELERATOR}")


def load_accelerator_state(
    input_dir: str,
    models: list,
    optimizers: list,
    schedulers: list,
    dataloaders: list,
    process_index: int,
    scaler: Any = None,
    map_location: Any = None,
    load_kwargs: dict | None = None,
    **load_model_func_kwargs: Any,
) -> dict:
    """Read a whole training state (Accelerate's internal step of `load_state`).

    Cadence does not provide this internal step of Accelerate's checkpointing: calling it raises
    NotImplementedError. Use `Accelerator.save_state` / `Accelerator.load_state`, which write and read
    the same layout atomically and verified.

    Args:
        input_dir (str): The checkpoint folder.
        models (list): The models.
        optimizers (list): The optimizers.
        schedulers (list): The schedulers.
        dataloaders (list): The dataloaders.
        process_index (int): This process's rank.
        scaler (torch.amp.GradScaler | None): The fp16 scaler.
        map_location (Any): Where to load tensors.
        load_kwargs (dict | None): Options of the reads.
        **load_model_func_kwargs: Options of the model loads.

    Raises:
        NotImplementedError: Always.
    """
    raise NotImplementedError(f"`load_accelerator_state` is not provided. {_USE_ACCELERATOR}")
