"""Checkpoint storage: atomic commit, verification, rotation, safe serialization, async saving.

This layer knows nothing of the Accelerator or torch.distributed: callers pass ranks, tokens and
flags, and place barriers themselves. torch is imported only by the functions that need it.

The names below load their module on first use: a `load_state` imports the reading side only
(not the async writer, the writer lock or the model exporter), which is most of what
the first load in a new process pays beyond a later one (issue 46).
"""

from __future__ import annotations

from cadence.core.lazy_exports import lazy_exports

# Each public name's module, loaded when the name is first used.
_HOMES = {
    "async_writer": (
        "AsyncCheckpointSaver",
        "commit_checkpoint",
        "write_and_commit",
        "write_files",
        "write_rank_files",
    ),
    "atomic": (
        "CheckpointWriter",
        "begin_checkpoint",
        "cleanup_stale_siblings",
        "new_token",
        "recover_interrupted_commit",
        "temporary_dir_for",
    ),
    "custom_state": (
        "load_accelerator_state",
        "load_custom_state",
        "save_accelerator_state",
        "save_custom_state",
    ),
    "errors": (
        "CheckpointCommitError",
        "CheckpointCorruptError",
        "CheckpointError",
        "CheckpointIncompleteError",
        "CheckpointMismatchError",
        "SharedVerificationError",
        "UnsafeCheckpointError",
    ),
    "manifest": (
        "FileRecord",
        "MANIFEST_NAME",
        "Manifest",
        "is_complete",
        "read_manifest",
        "verify",
    ),
    "model_io": ("load_checkpoint_in_model", "load_state_dict", "parse_shard_size", "save_model"),
    "node_verify": ("hashed_bytes",),
    "reader": ("CheckpointReader", "open_checkpoint"),
    "rotation": (
        "CheckpointEntry",
        "automatic_checkpoint_dir",
        "checkpoint_index",
        "checkpoints_dir",
        "cleanup_checkpoints_dir",
        "latest_checkpoint",
        "list_checkpoints",
        "next_iteration",
        "prune_checkpoints",
    ),
    "serialization": (
        "apply_model_state",
        "capture_rng_state",
        "dedupe_shared_tensors",
        "load",
        "read_safetensors",
        "read_torch",
        "restore_rng_state",
        "save",
        "write_safetensors",
        "write_torch",
    ),
    "writer_lock": ("WriterLockedError",),
}
_EXPORTS = {name: f"{__name__}.{home}" for home, names in _HOMES.items() for name in names}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
