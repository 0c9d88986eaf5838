"""Names of the files in a save_state folder (Accelerate's names, so folders look the same).

Index 0 has no suffix, later ones `_<i>`: model.safetensors, model_1.safetensors, optimizer.bin,
optimizer_1.bin, ... Every file except model weights is written with torch.save and read back with
weights_only=True; the `.pkl` suffixes are kept for compatibility but nothing is unpickled.
"""

from __future__ import annotations

MODEL_NAME = "pytorch_model"
SAFE_MODEL_NAME = "model"
OPTIMIZER_NAME = "optimizer"
SCHEDULER_NAME = "scheduler"
SAMPLER_NAME = "sampler"
DATALOADER_STATE_NAME = "dl_state_dict"
SCALER_NAME = "scaler.pt"
RNG_STATE_NAME = "random_states"
CUSTOM_STATE_NAME = "custom_checkpoint"


def _indexed(stem: str, index: int, extension: str) -> str:
    if index < 0:
        raise ValueError(f"index must be >= 0, got {index}")
    return f"{stem}{'' if index == 0 else f'_{index}'}{extension}"


def model_file(index: int = 0, safe_serialization: bool = True) -> str:
    """File name of the `index`-th model weights file (safetensors or `.bin`)."""
    if safe_serialization:
        return _indexed(SAFE_MODEL_NAME, index, ".safetensors")
    return _indexed(MODEL_NAME, index, ".bin")


def optimizer_file(index: int = 0) -> str:
    """File name of the `index`-th optimizer state file."""
    return _indexed(OPTIMIZER_NAME, index, ".bin")


def scheduler_file(index: int = 0) -> str:
    """File name of the `index`-th scheduler state file."""
    return _indexed(SCHEDULER_NAME, index, ".bin")


def sampler_file(index: int = 0) -> str:
    """File name of the `index`-th sampler state file."""
    return _indexed(SAMPLER_NAME, index, ".bin")


def dataloader_state_file(index: int = 0) -> str:
    """File name of the `index`-th dataloader state file."""
    return _indexed(DATALOADER_STATE_NAME, index, ".bin")


def scaler_file() -> str:
    """File name of the gradient scaler state file."""
    return SCALER_NAME


def rng_state_file(process_index: int) -> str:
    """File name of the random-number-generator states of process `process_index`."""
    return f"{RNG_STATE_NAME}_{process_index}.pkl"


def custom_state_file(index: int) -> str:
    """File name of the `index`-th registered custom object's state."""
    return f"{CUSTOM_STATE_NAME}_{index}.pkl"
