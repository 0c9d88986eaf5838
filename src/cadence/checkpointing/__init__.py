"""Checkpoint storage: atomic commit, verification, rotation, safe serialization, async saving.

This layer knows nothing of the Accelerator or torch.distributed: callers pass ranks, tokens and
flags, and place barriers themselves. torch is imported only by the functions that need it.
"""

from .async_writer import (
    AsyncCheckpointSaver,
    commit_checkpoint,
    write_and_commit,
    write_files,
    write_rank_files,
)
from .atomic import (
    CheckpointWriter,
    begin_checkpoint,
    cleanup_stale_siblings,
    new_token,
    recover_interrupted_commit,
    temporary_dir_for,
)
from .custom_state import (
    load_accelerator_state,
    load_custom_state,
    save_accelerator_state,
    save_custom_state,
)
from .errors import (
    CheckpointCommitError,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointIncompleteError,
    CheckpointMismatchError,
    SharedVerificationError,
    UnsafeCheckpointError,
)
from .manifest import MANIFEST_NAME, FileRecord, Manifest, is_complete, read_manifest, verify
from .model_io import load_checkpoint_in_model, load_state_dict, parse_shard_size, save_model
from .node_verify import hashed_bytes
from .reader import CheckpointReader, open_checkpoint
from .rotation import (
    CheckpointEntry,
    automatic_checkpoint_dir,
    checkpoint_index,
    checkpoints_dir,
    cleanup_checkpoints_dir,
    latest_checkpoint,
    list_checkpoints,
    next_iteration,
    prune_checkpoints,
)
from .serialization import (
    apply_model_state,
    capture_rng_state,
    dedupe_shared_tensors,
    load,
    read_safetensors,
    read_torch,
    restore_rng_state,
    save,
    write_safetensors,
    write_torch,
)
from .writer_lock import WriterLockedError

__all__ = [
    "SharedVerificationError",
    "hashed_bytes",
    "MANIFEST_NAME",
    "AsyncCheckpointSaver",
    "CheckpointCommitError",
    "CheckpointCorruptError",
    "CheckpointEntry",
    "CheckpointError",
    "CheckpointIncompleteError",
    "CheckpointMismatchError",
    "CheckpointReader",
    "CheckpointWriter",
    "FileRecord",
    "Manifest",
    "UnsafeCheckpointError",
    "WriterLockedError",
    "apply_model_state",
    "automatic_checkpoint_dir",
    "begin_checkpoint",
    "capture_rng_state",
    "checkpoint_index",
    "checkpoints_dir",
    "cleanup_checkpoints_dir",
    "cleanup_stale_siblings",
    "commit_checkpoint",
    "dedupe_shared_tensors",
    "is_complete",
    "latest_checkpoint",
    "list_checkpoints",
    "load",
    "load_accelerator_state",
    "load_checkpoint_in_model",
    "load_custom_state",
    "load_state_dict",
    "new_token",
    "next_iteration",
    "open_checkpoint",
    "parse_shard_size",
    "prune_checkpoints",
    "read_manifest",
    "read_safetensors",
    "read_torch",
    "recover_interrupted_commit",
    "restore_rng_state",
    "save",
    "save_accelerator_state",
    "save_custom_state",
    "save_model",
    "temporary_dir_for",
    "verify",
    "write_and_commit",
    "write_files",
    "write_rank_files",
    "write_safetensors",
    "write_torch",
]
