"""Tiny models and datasets for testing training loops: y = a*x + b with noise."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class RegressionDataset:
    """`length` samples `{"x": x, "y": a*x + b + noise}` (float32 numpy scalars, noise std 0.1),
    reproducible with `seed`.

    Example:
        >>> RegressionDataset(length=4, seed=0)[0].keys()
        dict_keys(['x', 'y'])

    Args:
        a (float): The slope (default 2).
        b (float): The intercept (default 3).
        length (int): The number of samples (default 64).
        seed (int | None): The seed of numpy's generator; None draws different data each time.
    """

    def __init__(
        self, a: float = 2, b: float = 3, length: int = 64, seed: int | None = None
    ) -> None:
        generator = np.random.default_rng(seed)
        self.length = length
        self.x = generator.normal(size=(length,)).astype(np.float32)
        self.y = a * self.x + b + generator.normal(scale=0.1, size=(length,)).astype(np.float32)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": self.x[i], "y": self.y[i]}


class RegressionModel(torch.nn.Module):
    """`forward(x) = x * a + b` with scalar parameters `a` and `b`; prints the dtypes of the first
    batch it sees (what mixed-precision tests look at).

    Example:
        >>> RegressionModel(a=1, b=2)(torch.tensor([1.0]))  # doctest: +SKIP
        tensor([3.], grad_fn=<AddBackward0>)

    Args:
        a (float): The initial slope (default 0).
        b (float): The initial intercept (default 0).
        double_output (bool): Accepted for Accelerate's signature; the output is always single.
    """

    def __init__(self, a: float = 0, b: float = 0, double_output: bool = False) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(a).float())
        self.b = torch.nn.Parameter(torch.tensor(b).float())
        self.first_batch = True

    def forward(self, x: torch.Tensor | None = None) -> torch.Tensor:
        """Return `x * a + b`, printing the dtypes on the first batch.

        Args:
            x (torch.Tensor | None): The inputs.

        Returns:
            torch.Tensor: `x * a + b`.
        """
        if self.first_batch:
            print(f"Model dtype: {self.a.dtype}, {self.b.dtype}. Input dtype: {x.dtype}")
            self.first_batch = False
        return x * self.a + self.b


_NEEDS_MRPC = (
    "`{name}` builds GLUE MRPC dataloaders from the test sample files of Accelerate's repository and a "
    "Hub tokenizer (bert-base-cased); neither ships with Cadence. Build the dataloaders in your test instead."
)


def mocked_dataloaders(accelerator: object, batch_size: int = 16) -> Any:
    """MRPC train/eval dataloaders of Accelerate's test suite (not available in Cadence).

    Args:
        accelerator (object): The Accelerator.
        batch_size (int): The batch size (default 16).

    Raises:
        NotImplementedError: Always: the MRPC data and tokenizer are not shipped with Cadence.
    """
    raise NotImplementedError(_NEEDS_MRPC.format(name="mocked_dataloaders"))


def mocked_dataloaders_for_autoregressive_models(accelerator: object, batch_size: int = 16) -> Any:
    """Autoregressive-model dataloaders of Accelerate's test suite (not available in Cadence).

    Args:
        accelerator (object): The Accelerator.
        batch_size (int): The batch size (default 16).

    Raises:
        NotImplementedError: Always: the data and tokenizer are not shipped with Cadence.
    """
    raise NotImplementedError(
        _NEEDS_MRPC.format(name="mocked_dataloaders_for_autoregressive_models")
    )
