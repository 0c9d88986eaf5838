"""`cadence merge-weights CHECKPOINT_DIR OUTPUT_PATH`: turn a sharded FSDP checkpoint (a
`torch.distributed.checkpoint` folder such as `pytorch_model_fsdp_0/`) into one safetensors file
(`OUTPUT_PATH/model.safetensors`, or `pytorch_model.bin` with --unsafe_serialization). Runs in one process;
it needs enough memory for the whole state dict."""

from __future__ import annotations

import argparse
import sys
from typing import Any

DESCRIPTION = (
    "Merge the shards of a sharded FSDP checkpoint (SHARDED_STATE_DICT) into one set of weights, saved "
    "to OUTPUT_PATH/model.safetensors (or pytorch_model.bin). CPU only; needs RAM for the whole model."
)


def register(subparsers: Any) -> None:
    """Add the `merge-weights` subcommand to `subparsers`."""
    parser = subparsers.add_parser(
        "merge-weights",
        help="Merge a sharded FSDP checkpoint into one weights file.",
        description=DESCRIPTION,
    )
    parser.add_argument(
        "checkpoint_directory",
        help="Folder of sharded weights written by FSDP (e.g. pytorch_model_fsdp_0).",
    )
    parser.add_argument(
        "output_path", help="Folder to write the merged weights to (created if needed)."
    )
    parser.add_argument(
        "--unsafe_serialization",
        action="store_true",
        help="Write pytorch_model.bin (pickle) instead of model.safetensors.",
    )
    parser.add_argument(
        "--remove_checkpoint_dir",
        action="store_true",
        help="Delete the sharded checkpoint folder after merging.",
    )
    parser.set_defaults(func=merge_command)


def merge_command(args: argparse.Namespace) -> int:
    """Run `cadence merge-weights`; prints where the merged weights went.

    Args:
        args (argparse.Namespace): The parsed `merge-weights` arguments.

    Returns:
        int: The exit code.
    """
    from ..checkpointing.merge import (
        merge_fsdp_weights,
    )  # deferred: loaded when the command runs (keeps `cadence --help` fast)

    try:
        target = merge_fsdp_weights(
            args.checkpoint_directory,
            args.output_path,
            safe_serialization=not args.unsafe_serialization,
            remove_checkpoint_dir=args.remove_checkpoint_dir,
        )
    except (FileNotFoundError, ValueError) as error:
        print(f"cadence merge-weights: {error}", file=sys.stderr)
        return 1
    except TypeError as error:  # an optimizer folder: nested state, not a flat dict of tensors
        print(
            f"cadence merge-weights: {error}\nOptimizer checkpoints need --unsafe_serialization.",
            file=sys.stderr,
        )
        return 1
    print(f"Merged weights written to {target}")
    return 0
