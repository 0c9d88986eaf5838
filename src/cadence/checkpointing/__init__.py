"""Checkpoint storage: atomic commit, verification, rotation, safe serialization, async saving.

This layer knows nothing of the Accelerator or torch.distributed: callers pass ranks, tokens and
flags, and place barriers themselves. torch is imported only by the functions that need it.

The names below load their module on first use: a `load_state` imports the reading side only
(not the async writer, rotation, the writer lock or the model exporter), which is most of what
the first load in a new process pays beyond a later one (issue 46).
"""

from __future__ import annotations

from cadence.core.lazy_exports import lazy_exports

_EXPORTS = {
    "AsyncCheckpointSaver": "cadence.checkpointing.async_writer",
    "commit_checkpoint": "cadence.checkpointing.async_writer",
    "write_and_commit": "cadence.checkpointing.async_writer",
    "write_files": "cadence.checkpointing.async_writer",
    "write_rank_files": "cadence.checkpointing.async_writer",
    "CheckpointWriter": "cadence.checkpointing.atomic",
    "begin_checkpoint": "cadence.checkpointing.atomic",
    "cleanup_stale_siblings": "cadence.checkpointing.atomic",
    "new_token": "cadence.checkpointing.atomic",
    "recover_interrupted_commit": "cadence.checkpointing.atomic",
    "temporary_dir_for": "cadence.checkpointing.atomic",
    "load_accelerator_state": "cadence.checkpointing.custom_state",
    "load_custom_state": "cadence.checkpointing.custom_state",
    "save_accelerator_state": "cadence.checkpointing.custom_state",
    "save_custom_state": "cadence.checkpointing.custom_state",
    "CheckpointCommitError": "cadence.checkpointing.errors",
    "CheckpointCorruptError": "cadence.checkpointing.errors",
    "CheckpointError": "cadence.checkpointing.errors",
    "CheckpointIncompleteError": "cadence.checkpointing.errors",
    "CheckpointMismatchError": "cadence.checkpointing.errors",
    "SharedVerificationError": "cadence.checkpointing.errors",
    "UnsafeCheckpointError": "cadence.checkpointing.errors",
    "FileRecord": "cadence.checkpointing.manifest",
    "MANIFEST_NAME": "cadence.checkpointing.manifest",
    "Manifest": "cadence.checkpointing.manifest",
    "is_complete": "cadence.checkpointing.manifest",
    "read_manifest": "cadence.checkpointing.manifest",
    "verify": "cadence.checkpointing.manifest",
    "load_checkpoint_in_model": "cadence.checkpointing.model_io",
    "load_state_dict": "cadence.checkpointing.model_io",
    "parse_shard_size": "cadence.checkpointing.model_io",
    "save_model": "cadence.checkpointing.model_io",
    "hashed_bytes": "cadence.checkpointing.node_verify",
    "CheckpointReader": "cadence.checkpointing.reader",
    "open_checkpoint": "cadence.checkpointing.reader",
    "CheckpointEntry": "cadence.checkpointing.rotation",
    "automatic_checkpoint_dir": "cadence.checkpointing.rotation",
    "checkpoint_index": "cadence.checkpointing.rotation",
    "checkpoints_dir": "cadence.checkpointing.rotation",
    "cleanup_checkpoints_dir": "cadence.checkpointing.rotation",
    "latest_checkpoint": "cadence.checkpointing.rotation",
    "list_checkpoints": "cadence.checkpointing.rotation",
    "next_iteration": "cadence.checkpointing.rotation",
    "prune_checkpoints": "cadence.checkpointing.rotation",
    "apply_model_state": "cadence.checkpointing.serialization",
    "capture_rng_state": "cadence.checkpointing.serialization",
    "dedupe_shared_tensors": "cadence.checkpointing.serialization",
    "load": "cadence.checkpointing.serialization",
    "read_safetensors": "cadence.checkpointing.serialization",
    "read_torch": "cadence.checkpointing.serialization",
    "restore_rng_state": "cadence.checkpointing.serialization",
    "save": "cadence.checkpointing.serialization",
    "write_safetensors": "cadence.checkpointing.serialization",
    "write_torch": "cadence.checkpointing.serialization",
    "WriterLockedError": "cadence.checkpointing.writer_lock",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
