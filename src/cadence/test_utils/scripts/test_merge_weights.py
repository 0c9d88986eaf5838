"""A sharded FSDP checkpoint merges back into the whole model, through `merge_fsdp_weights` and
through the `cadence merge-weights` command, as safetensors and as a pickle."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import torch

from cadence import Accelerator, FullyShardedDataParallelPlugin
from cadence.runtime.state import PartialState
from cadence.test_utils.scripts._checks import check
from cadence.utils import merge_fsdp_weights


class TinyModel(torch.nn.Module):
    """Two linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.linear1 = torch.nn.Linear(16, 16)
        self.activation = torch.nn.ReLU()
        self.linear2 = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Linear, activation, linear."""
        return self.linear2(self.activation(self.linear1(x)))


def train_and_save(directory: str) -> dict[str, torch.Tensor]:
    """Train a tiny FSDP2 model two steps, save its sharded state, return its full state dict."""
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
    accelerator = Accelerator(fsdp_plugin=plugin)
    torch.manual_seed(0)
    model = TinyModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    for _ in range(2):
        loss = model(torch.randn(4, 16, device=accelerator.device)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    accelerator.save_state(directory)
    full = accelerator.get_state_dict(model)
    return {k: v.cpu() for k, v in full.items()}


def check_weights(
    merged: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], what: str
) -> None:
    """Check that merged weights have the expected keys and values."""
    check(sorted(merged) == sorted(expected), f"{what}: keys {sorted(merged)}")
    for name, tensor in expected.items():
        check(torch.allclose(merged[name].float(), tensor.float()), f"{what}: {name} differs")


def main() -> None:
    """Run every check of this script on this process; the first failure raises."""
    state = PartialState()
    with tempfile.TemporaryDirectory() as tmp:
        from cadence.utils import broadcast_object_list

        # Every process writes into the main process's folder (they share this machine's disk).

        directory = broadcast_object_list([tmp])[0]
        expected = train_and_save(os.path.join(directory, "checkpoint"))
        sharded = os.path.join(directory, "checkpoint", "pytorch_model_fsdp_0")
        state.wait_for_everyone()
        if state.is_main_process:
            from safetensors.torch import load_file

            merge_fsdp_weights(
                sharded, os.path.join(directory, "merged_safe"), safe_serialization=True
            )
            check_weights(
                load_file(os.path.join(directory, "merged_safe", "model.safetensors")),
                expected,
                "safetensors",
            )
            merge_fsdp_weights(
                sharded, os.path.join(directory, "merged_bin"), safe_serialization=False
            )
            loaded = torch.load(
                os.path.join(directory, "merged_bin", "pytorch_model.bin"), weights_only=True
            )
            check_weights(loaded, expected, "pytorch_model.bin")
            command = [
                sys.executable,
                "-m",
                "cadence.commands.cli",
                "merge-weights",
                sharded,
                os.path.join(directory, "merged_cli"),
            ]
            subprocess.run(command, check=True, capture_output=True)
            check_weights(
                load_file(os.path.join(directory, "merged_cli", "model.safetensors")),
                expected,
                "merge-weights command",
            )
            print("All merge-weights checks passed.")
        state.wait_for_everyone()


if __name__ == "__main__":
    main()
