"""The one list of Accelerate's top-level module paths that Cadence keeps only as re-exports.

Each module named here is a thin re-export (its docstring starts with `Reference path: re-exports`, it
defines `__all__` and nothing else) of the Cadence module where the code lives. Accelerate's paths
that are packages of their own in Cadence (`cadence.accelerator`, `cadence.checkpointing`,
`cadence.commands`, `cadence.test_utils`, `cadence.tracking`, `cadence.utils`) are their own home.
tests/test_reference_paths_table.py checks that each path resolves to its home.
"""

from __future__ import annotations

# reference path -> the modules its names come from
REFERENCE_PATHS: dict[str, tuple[str, ...]] = {
    "cadence.state": ("cadence.runtime.state", "cadence.runtime.gradient_state"),
    "cadence.logging": ("cadence.runtime.logging",),
    "cadence.launchers": ("cadence.launch.launchers",),
    "cadence.optimizer": ("cadence.training.optimizer",),
    "cadence.scheduler": ("cadence.training.scheduler",),
    "cadence.local_sgd": ("cadence.accelerator.local_sgd",),
    "cadence.data_loader": ("cadence.data",),
    "cadence.parallelism_config": ("cadence.plugins.parallelism",),
    "cadence.memory_utils": ("cadence.runtime.memory",),
    "cadence.hooks": ("cadence.bigmodel",),
    "cadence.big_modeling": ("cadence.bigmodel",),
    "cadence.inference": ("cadence.bigmodel",),
    "cadence.utils.random": ("cadence.runtime.random",),
    "cadence.utils.memory": ("cadence.runtime.memory",),
    "cadence.utils.tqdm": ("cadence.runtime.tqdm",),
}

# The reference's paths that are Cadence packages holding their code.
REFERENCE_PACKAGES: tuple[str, ...] = (
    "cadence.accelerator",
    "cadence.checkpointing",
    "cadence.commands",
    "cadence.test_utils",
    "cadence.tracking",
    "cadence.utils",
)

MARK = "Reference path: re-exports"
