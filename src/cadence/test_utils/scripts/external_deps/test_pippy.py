"""Pipeline-parallel inference with `prepare_pippy`: the pipelined model's outputs on the last
stage equal the whole model's outputs. `prepare_pippy` belongs to big-model inference; where this
Cadence build does not provide it the script says so and fails."""

from __future__ import annotations

import importlib.util
import sys

import torch

from cadence.runtime.state import PartialState
from cadence.test_utils.scripts._checks import check


class Stack(torch.nn.Module):
    """Four linear layers, split into one stage per process."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.Sequential(*(torch.nn.Linear(8, 8) for _ in range(4)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the stacked layers to `x`."""
        return self.layers(x)


def main() -> None:
    """Run every check of this script on this process; the first failure raises."""
    if importlib.util.find_spec("cadence.inference") is None:
        sys.exit(
            "test_pippy: cadence.inference.prepare_pippy (big-model inference) is not available in this build."
        )
    from cadence.inference import prepare_pippy

    state = PartialState()
    model = Stack().eval()
    inputs = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(inputs)
    pipelined = prepare_pippy(model, example_args=(inputs,), gather_output=True)
    with torch.no_grad():
        output = pipelined(inputs)
    check(
        output is not None and torch.allclose(output.cpu(), expected, atol=1e-5),
        "pipelined output differs",
    )
    if state.is_main_process:
        print("Pipeline-parallel inference matches the whole model.")


if __name__ == "__main__":
    main()
