"""Accelerate's module-level checkpoint functions: custom objects' state and a whole training
state (`save_accelerator_state` / `load_accelerator_state`), in Accelerate's file layout.

Like the rest of this package it does not use torch.distributed: which process writes is read
from the launcher's RANK / LOCAL_RANK variables.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from ..core.settings import env_text
from .layout import (
    custom_state_file,
    dataloader_state_file,
    model_file,
    optimizer_file,
    rng_state_file,
    scaler_file,
    scheduler_file,
)
from .serialization import apply_model_state, capture_rng_state, load, restore_rng_state, save

logger = logging.getLogger(__name__)


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
    output_dir: str | os.PathLike,
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
    """Write a training state into `output_dir` in Accelerate's layout, as its function of this name
    does: the main process (each node's with `save_on_each_node=True`) writes the model states
    (`model.safetensors`, `model_1.safetensors`, ... or `pytorch_model.bin`, ...), the optimizers'
    and schedulers' states (`optimizer.bin`, `scheduler.bin`, ...), the states of stateful dataloaders
    (`dl_state_dict.bin`, ...) and the scaler's (`scaler.pt`); every process writes its RNG states
    with `step` (`random_states_{process_index}.pkl`). Each file is replaced atomically.

    Unlike `Accelerator.save_state`, the folder gets no manifest (nothing commits it as a whole):
    use this for a hand-made training loop, `Accelerator.save_state` for a checkpoint.

    Args:
        output_dir (str | os.PathLike): The folder to write into (created if missing).
        model_states (list[dict]): The models' state dicts, in the order they were prepared.
        optimizers (list): The optimizers whose `state_dict()` is saved.
        schedulers (list): The learning-rate schedulers whose `state_dict()` is saved.
        dataloaders (list): The dataloaders; only stateful ones (torchdata) have a state to save.
        process_index (int): This process's rank: it names its RNG file.
        step (int): The step counter saved with the RNG states (`load_accelerator_state` returns it).
        scaler (torch.amp.GradScaler | None): The fp16 loss scaler, if any (None by default).
        save_on_each_node (bool): Write the shared files on each machine's main process instead of
            the job's main process only (False by default).
        safe_serialization (bool): Write the models as safetensors (True, the default) or with
            `torch.save` (`pytorch_model.bin`).

    Returns:
        Path: `output_dir`.

    Example:
        >>> import tempfile, torch
        >>> model = torch.nn.Linear(2, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> folder = save_accelerator_state(tempfile.mkdtemp(), [model.state_dict()], [opt], [], [], 0, step=10)
        >>> sorted(p.name for p in folder.iterdir())
        ['model.safetensors', 'optimizer.bin', 'random_states_0.pkl']
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if _writes(save_on_each_node):
        for i, state in enumerate(model_states):
            target = output_dir / model_file(i, safe_serialization)
            save(state, target, safe_serialization=safe_serialization)
        for i, optimizer in enumerate(optimizers):
            save(optimizer.state_dict(), output_dir / optimizer_file(i))
        for i, scheduler in enumerate(schedulers):
            save(scheduler.state_dict(), output_dir / scheduler_file(i))
        for i, loader in enumerate(dataloaders):
            if getattr(loader, "use_stateful_dataloader", False):
                save(loader.state_dict(), output_dir / dataloader_state_file(i))
        if scaler is not None:
            save(scaler.state_dict(), output_dir / scaler_file())
    save(capture_rng_state(step=step), output_dir / rng_state_file(process_index))
    logger.info(f"Training state saved in {output_dir}")
    return output_dir


def load_accelerator_state(
    input_dir: str | os.PathLike,
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
    """Load what `save_accelerator_state` (Cadence's or Accelerate's) wrote in `input_dir` into the
    given objects; returns the attributes to set on the Accelerator (`{"step": ...}` when the RNG
    file has it).

    `map_location`: where the model weights and optimizer states go, None or "cpu" (the CPU) or
    "on_device" (this process's device); `load_kwargs` go to the loading of the optimizer,
    scheduler and dataloader files, `load_model_func_kwargs` (`strict`) to the model's loading.
    Missing RNG states are logged and skipped, as in Accelerate.

    Args:
        input_dir (str | os.PathLike): The folder `save_accelerator_state` wrote into.
        models (list): The models to load into, in the order they were saved.
        optimizers (list): The optimizers to load into.
        schedulers (list): The learning-rate schedulers to load into.
        dataloaders (list): The dataloaders; stateful ones (torchdata) get their saved state.
        process_index (int): This process's rank: it names the RNG file read.
        scaler (torch.amp.GradScaler | None): The fp16 loss scaler to load into, if any.
        map_location (str | None): Where model weights and optimizer states go: None or "cpu" (the
            CPU) or "on_device" (this process's device); anything else raises TypeError.
        load_kwargs (dict | None): Keyword arguments for loading the optimizer, scheduler and
            dataloader files.
        **load_model_func_kwargs: `strict` for the models' `load_state_dict`; any other name
            raises TypeError.

    Returns:
        dict: The attributes to set on the Accelerator (`{"step": ...}` when the RNG file has it).

    Raises:
        TypeError: An unknown `map_location` or model-loading keyword.

    Example:
        >>> import tempfile, torch
        >>> model = torch.nn.Linear(2, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> folder = save_accelerator_state(tempfile.mkdtemp(), [model.state_dict()], [opt], [], [], 0, step=10)
        >>> load_accelerator_state(folder, [model], [opt], [], [], 0)
        {'step': 10}
    """
    if map_location not in (None, "cpu", "on_device"):
        raise TypeError(
            "Unsupported optimizer map location passed, please choose one of `None`, `'cpu'`, "
            "or `'on_device'`"
        )
    unknown = set(load_model_func_kwargs) - {"strict"}
    if unknown:
        raise TypeError(
            f"load_accelerator_state passes only `strict` to the models' loading, got "
            f"{sorted(unknown)}."
        )
    if map_location == "on_device":
        from ..runtime.state import (
            PartialState,  # deferred: the process state is needed for "on_device" only
        )

        device: Any = PartialState().device
    else:
        device = "cpu"
    load_kwargs = dict(load_kwargs or {})
    input_dir = Path(input_dir)
    override: dict[str, Any] = {}
    for i, model in enumerate(models):
        target = input_dir / model_file(i, safe_serialization=True)
        if not target.exists():
            target = input_dir / model_file(i, safe_serialization=False)
        strict = load_model_func_kwargs.get("strict", True)
        apply_model_state(model, load(target, map_location=device), strict=strict)
    for i, optimizer in enumerate(optimizers):
        optimizer.load_state_dict(
            load(input_dir / optimizer_file(i), map_location=device, **load_kwargs)
        )
    for i, scheduler in enumerate(schedulers):
        scheduler.load_state_dict(load(input_dir / scheduler_file(i), **load_kwargs))
    for i, loader in enumerate(dataloaders):
        source = input_dir / dataloader_state_file(i)
        if getattr(loader, "use_stateful_dataloader", False) and source.exists():
            loader.load_state_dict(load(source, **load_kwargs))
    if scaler is not None:
        scaler.load_state_dict(load(input_dir / scaler_file()))
    try:
        states = load(input_dir / rng_state_file(process_index))
        if "step" in states:
            override["step"] = states["step"]
        restore_rng_state(states)
    except Exception as err:  # as in Accelerate: a run without RNG states still loads
        logger.info(f"Could not load random states ({err})")
    return override
