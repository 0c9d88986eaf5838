"""The package's layers, bottom to top: the one ordered list that ARCHITECTURE.md draws and
tests/test_layers.py checks (a module imports only its own layer and the layers below it).

A module belongs to the first entry that is its name or a package above it, so a package's
submodule named earlier would sit lower than the rest of its package (none does today).
"""

from __future__ import annotations

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # value types, the one settings resolver, availability, input errors; no process state. The
    # opt-in `accelerate` alias sits here too: it imports nothing of Cadence (its finder resolves
    # names when `accelerate.*` is imported), and the launcher's worker bootstrap installs it.
    (
        "foundation",
        (
            "cadence.core",
            "cadence.unsupported",
            "cadence.alias",
            "cadence._layers",
            "cadence._reference_paths",
        ),
    ),
    # XLA probes and plans (torch_xla imported only when used)
    ("xla", ("cadence.xla",)),
    # cross-rank diagnostics: the watchdog, the ledger, failure reports
    ("diagnostics", ("cadence.diagnostics",)),
    # option records and plugins
    ("options", ("cadence.options", "cadence.plugins")),
    # the requested precision, parsed and checked once into a PrecisionChoice, and the policies
    # that apply it (autocast, loss scaling, fp8); no process state
    ("precision", ("cadence.precision",)),
    # the process runtime: topology, process group, process state, collectives
    ("runtime", ("cadence.runtime",)),
    # policies and wrappers, given what they need
    ("policies", ("cadence.data", "cadence.bigmodel", "cadence.training")),
    # one strategy per backend, owning its precision
    ("strategies", ("cadence.strategies",)),
    # per-step fault tolerance across replica groups (torchft): the session, the commit gate, the
    # exactly-once loader; given the prepared objects by the façade's preparer
    ("fault_tolerance", ("cadence.fault_tolerance",)),
    # storage and trackers
    (
        "storage",
        (
            "cadence.checkpointing",
            "cadence.tracking",
            "cadence.constants",
            "cadence.process_helpers",
        ),
    ),
    # the façade and the launchers (everything below `cadence launch`'s command line)
    ("facade", ("cadence.accelerator", "cadence.launch", "cadence.fsdp_helpers", "cadence.errors")),
    # the CLI, the self-test, the testing helpers, the reference's paths and public namespaces
    (
        "surface",
        (
            "cadence.commands",
            "cadence.selftest",
            "cadence.test_utils",
            "cadence.utils",
            "cadence.state",
            "cadence.logging",
            "cadence.launchers",
            "cadence.optimizer",
            "cadence.scheduler",
            "cadence.local_sgd",
            "cadence.data_loader",
            "cadence.parallelism_config",
            "cadence.memory_utils",
            "cadence.hooks",
            "cadence.big_modeling",
            "cadence.inference",
            "cadence",
        ),
    ),
)
