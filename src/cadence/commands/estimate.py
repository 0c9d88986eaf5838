"""The reference's `estimate-memory` command module: memory arithmetic and the table are real;
building a model from the Hub to size it is not available in Cadence yet."""

from __future__ import annotations

import argparse
from typing import Any

from .parser_compat import run_parser

_NEEDS_HUB_MODEL = (
    "`{name}` builds an empty model from the Hugging Face Hub to size it, which needs the big-model "
    "inference helpers (init_empty_weights) that Cadence does not provide yet."
)


def verify_on_hub(repo: str, token: str | None = None) -> Any:
    """The Hub's model info for `repo`, or "gated" / "repo" when it is gated or does not exist."""
    from huggingface_hub import model_info  # optional dependency
    from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError

    try:
        return model_info(repo, token=token)
    except RepositoryNotFoundError:
        return "repo"
    except (OSError, GatedRepoError):
        return "gated"


def check_has_model(error: BaseException) -> str:
    """Which library ("timm", "transformers" or "unknown") raised `error` for a model it lacks."""
    from ..availability import (  # deferred: loaded when the command runs (keeps `cadence --help` fast)
        is_timm_available,
        is_transformers_available,
    )

    message = str(error)
    if is_timm_available() and (
        (isinstance(error, RuntimeError) and "Unknown model" in message)
        or type(error).__name__ == "EntryNotFoundError"
        or (isinstance(error, KeyError) and "architecture" in message)
    ):
        return "timm"
    if (
        is_transformers_available()
        and isinstance(error, (OSError, ValueError))
        and (
            "does not appear to have a file named" in message or "Unrecognized model in" in message
        )
    ):
        return "transformers"
    return "unknown"


def add_timm_hub_prefix(model_name: str) -> str:
    """`org/name` -> `hf-hub:org/name` (what timm needs for Hub ids); other names unchanged.

    Example:
        >>> add_timm_hub_prefix("timm/resnet50.a1_in1k"), add_timm_hub_prefix("resnet50")
        ('hf-hub:timm/resnet50.a1_in1k', 'resnet50')
    """
    if ":" in model_name or "/" not in model_name:
        return model_name
    return f"hf-hub:{model_name}"


def create_empty_model(
    model_name: str,
    library_name: str,
    trust_remote_code: bool = False,
    access_token: str | None = None,
) -> Any:
    """A model of `model_name` with no memory allocated (not available in Cadence yet)."""
    raise NotImplementedError(_NEEDS_HUB_MODEL.format(name="create_empty_model"))


def create_ascii_table(headers: list[str], rows: list[list[str]], title: str) -> str:
    """A box-drawn table with a centred title, centred header and centred cells.

    Example:
        >>> print(create_ascii_table(["a", "b"], [["1", "2"]], "T"))  # doctest: +SKIP
    """
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers))]
    inner = sum(widths) + len(widths) - 1
    if len(title) > inner:
        widths[-1] += len(title) - inner
        inner = len(title)

    def line(left: str, middle: str, right: str) -> str:
        return left + middle.join("─" * width for width in widths) + right

    def row(cells: list[str]) -> str:
        return "│" + "│".join(str(cell).center(width) for cell, width in zip(cells, widths)) + "│"

    lines = [
        "┌" + "─" * inner + "┐",
        "│" + title.center(inner) + "│",
        line("├", "┬", "┤"),
        row(headers),
        line("├", "┼", "┤"),
        *(row(cells) for cells in rows),
        line("└", "┴", "┘"),
    ]
    return "\n".join(lines)


def estimate_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The `estimate-memory` parser: added to `subparsers` when given, standalone otherwise."""
    description = "Estimate the memory a Hub model needs for inference and training."
    if subparsers is not None:
        parser = subparsers.add_parser("estimate-memory", description=description)
    else:
        parser = argparse.ArgumentParser("cadence estimate-memory", description=description)
    parser.add_argument("model_name", type=str, help="The model name on the Hugging Face Hub.")
    parser.add_argument(
        "--library_name", type=str, choices=["timm", "transformers"], help="The model's library."
    )
    parser.add_argument(
        "--dtypes",
        type=str,
        nargs="+",
        default=["float32", "float16", "int8", "int4"],
        choices=["float32", "float16", "int8", "int4"],
        help="The dtypes to estimate for.",
    )
    parser.add_argument(
        "--trust_remote_code", action="store_true", default=False, help="Run the Hub repo's code."
    )
    parser.set_defaults(func=estimate_command)
    return parser


def estimate_training_usage(
    bytes: int, mixed_precision: str, msamp_config: str | None = None
) -> dict[str, int]:
    """Training memory (bytes) for batch size 1 of a model of `bytes` fp32 bytes with Adam:
    model, gradients, optimizer states and the optimizer step's peak. -1 where unknown.

    Example:
        >>> estimate_training_usage(100, "float32")
        {'model': 100, 'optimizer': 200, 'gradients': 100, 'step': 400}
    """
    sizes = {"model": -1, "optimizer": -1, "gradients": -1, "step": -1}
    half = bytes // 2
    if mixed_precision == "float32":
        sizes.update(model=bytes, gradients=bytes, optimizer=2 * bytes, step=4 * bytes)
    elif mixed_precision in ("float16", "bfloat16") or (
        mixed_precision == "fp8" and msamp_config is None
    ):
        # Mixed precision keeps fp32 master weights; gradients are computed in half precision then
        # accumulated in fp32 (1.5x), Adam keeps two fp32 states.
        sizes.update(model=bytes, gradients=bytes + half, optimizer=2 * bytes, step=2 * bytes)
    return sizes


def gather_data(args: argparse.Namespace) -> list[list[Any]]:
    """Sizes of the model of `args` per dtype (not available in Cadence yet)."""
    raise NotImplementedError(_NEEDS_HUB_MODEL.format(name="gather_data"))


def estimate_command(args: argparse.Namespace) -> None:
    """Print the memory table for `args.model_name` (not available in Cadence yet)."""
    raise NotImplementedError(_NEEDS_HUB_MODEL.format(name="estimate-memory"))


def main() -> int:
    """Run `estimate-memory` with the process arguments."""
    return run_parser(estimate_command_parser())
