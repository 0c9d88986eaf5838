"""Every public exception of Cadence, in one place, with its reference-compatible base class.

The classes are defined next to the code that raises them; this module re-exports them (on first use,
so importing it stays cheap).

| exception | base | raised when |
| --- | --- | --- |
| `DistributedOperationException` | RuntimeError | ranks called a collective with incompatible inputs |
| `CheckpointError` | ValueError | a checkpoint folder cannot be used (Accelerate raises ValueError) |
| `CheckpointIncompleteError` | CheckpointError | the save never finished |
| `CheckpointCorruptError` | CheckpointError | a committed file changed since |
| `UnsafeCheckpointError` | CheckpointError | a file needs unpickling and no opt-in was given |
| `CheckpointCommitError` | CheckpointError | committing a save failed |
| `SharedVerificationError` | CheckpointError, RuntimeError | a process died or failed while the processes of a machine verified a checkpoint together |
| `NotCheckpointableError` | TypeError, ValueError | an object without state_dict/load_state_dict was registered |
| `LaunchEnvironmentError` | RuntimeError | the launch environment (RANK, WORLD_SIZE, ...) is half set |
| `LaunchConfigError` | RuntimeError | the launcher's settings record is unreadable |
| `LaunchPlanError` | ValueError | `cadence launch` flags, variables or config file conflict |
| `ConfigFileError` | ValueError | a config file cannot be read |
| `WorkerProcessesFailed` | torch's ChildFailedError, RuntimeError | a worker of notebook_launcher / debug_launcher failed |

Example::

    from cadence.errors import CheckpointError
"""

from __future__ import annotations

from cadence.core.lazy_exports import lazy_exports

_EXPORTS = {
    "DistributedOperationException": "cadence.diagnostics.errors",
    "CheckpointError": "cadence.checkpointing.errors",
    "CheckpointIncompleteError": "cadence.checkpointing.errors",
    "CheckpointCorruptError": "cadence.checkpointing.errors",
    "UnsafeCheckpointError": "cadence.checkpointing.errors",
    "CheckpointCommitError": "cadence.checkpointing.errors",
    "SharedVerificationError": "cadence.checkpointing.errors",
    "NotCheckpointableError": "cadence.checkpointing.checkpointer",
    "LaunchEnvironmentError": "cadence.runtime.topology",
    "LaunchConfigError": "cadence.core.settings",
    "LaunchPlanError": "cadence.launch.settings",
    "ConfigFileError": "cadence.launch.config_file",
    "WorkerProcessesFailed": "cadence.launch.launchers",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
