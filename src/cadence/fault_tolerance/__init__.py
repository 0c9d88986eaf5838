"""Per-step fault tolerance on torchft: replica groups that keep training when one of them fails.

`FaultToleranceConfig` is the plugin a script may pass in `kwargs_handlers`; `cadence launch
--fault_tolerance` writes the same settings into the launch record, which `Accelerator()` reads.
The session (torchft's Manager, the cross-group gradient average, the commit gate, the heal) and the
exactly-once loader load only when fault tolerance is on, so torchft stays an optional dependency.
"""

from __future__ import annotations

from ..core.lazy_exports import lazy_exports

# Resolved on first use: the launcher's parser reads `defaults` without importing torch.
_EXPORTS = {
    "FaultToleranceConfig": "cadence.fault_tolerance.config",
    "resolve_fault_tolerance": "cadence.fault_tolerance.config",
    "torchft_missing_message": "cadence.fault_tolerance.config",
    "start_fault_tolerance": "cadence.fault_tolerance.start",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "FaultToleranceConfig",
    "resolve_fault_tolerance",
    "start_fault_tolerance",
    "torchft_missing_message",
]
