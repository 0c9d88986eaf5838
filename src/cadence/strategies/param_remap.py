"""Re-point an optimizer at the parameters that replaced the originals when a model was sharded.

`fully_shard` and tensor parallelism swap every parameter for a new `nn.Parameter` holding a DTensor;
an optimizer built before `prepare` still holds the old objects and would train nothing. The map is
keyed by parameter name (wrapper prefixes removed), and holds the old parameters only weakly, so a
model prepared without its optimizer does not keep a second full copy of its weights alive.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

_WRAPPER_PARTS = ("_checkpoint_wrapped_module", "_fsdp_wrapped_module", "_orig_mod")


def canonical_name(name: str) -> str:
    """A parameter name without the segments added by checkpoint / FSDP / compile wrappers."""
    return ".".join(part for part in name.split(".") if part not in _WRAPPER_PARTS)


def named_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The model's parameters by name, with wrapper segments stripped from the names."""
    return {
        canonical_name(name): param
        for name, param in model.named_parameters(remove_duplicate=False)
    }


class ParameterRemap:
    """Old parameter -> new parameter, for every model sharded by one strategy."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref, torch.nn.Parameter]] = {}

    def record(
        self, before: dict[str, torch.nn.Parameter], after: dict[str, torch.nn.Parameter]
    ) -> None:
        """Remember which parameters were replaced, matching `before` and `after` by name."""
        missing = [name for name in before if name not in after]
        if missing:
            raise RuntimeError(
                f"After sharding, these parameters could not be found again by name: {missing[:5]}. "
                "Tied parameters with different names on different ranks are not supported."
            )
        for name, old in before.items():
            new = after[name]
            if new is not old:
                self._entries[id(old)] = (weakref.ref(old), new)

    def lookup(self, param: torch.Tensor) -> torch.Tensor:
        """The parameter that replaced `param`, or `param` itself if none did."""
        entry = self._entries.get(id(param))
        if entry is not None and entry[0]() is param:
            return entry[1]
        return param

    def apply(self, optimizer: torch.optim.Optimizer) -> int:
        """Swap the optimizer's parameters in place; returns how many were swapped."""
        swapped = 0
        for group in optimizer.param_groups:
            params = []
            for param in group["params"]:
                new = self.lookup(param)
                swapped += new is not param
                params.append(new)
            group["params"] = params
        if swapped and optimizer.state:
            optimizer.state = _remap_state(optimizer.state, self)
        return swapped


def _remap_state(state: Any, remap: ParameterRemap) -> Any:
    from collections import defaultdict

    fresh: defaultdict = defaultdict(dict)
    for param, value in state.items():
        fresh[remap.lookup(param)] = value
    return fresh
