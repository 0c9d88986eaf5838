"""Accelerate's `estimate-memory` command module: build a Hub model with empty weights (through
`transformers` or `timm`, optional), measure it, and print its memory for inference and training."""

from __future__ import annotations

import argparse
from typing import Any

from .parser_compat import run_parser


def verify_on_hub(repo: str, token: str | None = None) -> Any:
    """The Hub's model info for `repo`, or "gated" / "repo" when it is gated or does not exist.

    Args:
        repo (str): The model's Hub id.
        token (str | None): The Hub token, for gated or private repos.

    Returns:
        The `ModelInfo`, or "gated" or "repo".
    """
    from huggingface_hub import model_info  # optional dependency
    from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError

    try:
        return model_info(repo, token=token)
    except RepositoryNotFoundError:
        return "repo"
    except (OSError, GatedRepoError):
        return "gated"


def check_has_model(error: BaseException) -> str:
    """Which library ("timm", "transformers" or "unknown") raised `error` for a model it lacks.

    Args:
        error (BaseException): The error raised while building the model.

    Returns:
        str: The library's name, or "unknown".
    """
    from ..core.availability import (  # deferred: loaded when the command runs (keeps `cadence --help` fast)
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

    Args:
        model_name (str): A timm model name or a Hub id.

    Returns:
        str: The name timm loads.
    """
    if ":" in model_name or "/" not in model_name:
        return model_name
    return f"hf-hub:{model_name}"


def _without_hub(model_name: str) -> bool:
    """Whether to size `model_name` without asking the Hub: a local folder, or the Hub is off
    (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE) and the model must come from the cache."""
    import os

    offline = any(
        os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )
    return offline or os.path.isdir(model_name)


def create_empty_model(
    model_name: str,
    library_name: str,
    trust_remote_code: bool = False,
    access_token: str | None = None,
) -> Any:
    """A model of `model_name` (a Hub id) built with empty weights, so nothing is allocated.

    `library_name` ("transformers" or "timm") defaults to the library the Hub names for the repo.
    Raises OSError when the repo is gated or missing, ValueError for an unknown library, ImportError
    when the library is not installed.

    Args:
        model_name (str): The model's Hub id (or a timm name).
        library_name (str): "transformers" or "timm"; None asks the Hub.
        trust_remote_code (bool): Run the repo's own model code (Transformers only; default False).
        access_token (str | None): The Hub token, for gated or private repos.

    Returns:
        The model, on the meta device.
    """
    import torch

    from ..big_modeling import (  # deferred: the big-model helpers load only for this command
        init_empty_weights,
    )

    local = _without_hub(model_name)
    info = None if local else verify_on_hub(model_name, access_token)
    if local and library_name is None:
        library_name = "transformers"  # a local folder or a cached model: its config.json
    if info == "gated":
        raise OSError(
            f"Repo for model `{model_name}` is gated: log in with `huggingface-cli login` (with an "
            "account that was granted access) and try again."
        )
    if info == "repo":
        raise OSError(
            f"Repo for model `{model_name}` does not exist on the Hub. Check the name; for a private "
            "repo, log in with `huggingface-cli login` with an account that can read it."
        )
    if library_name is None:
        library_name = getattr(info, "library_name", None)
        if not library_name:
            raise ValueError(
                f"Model `{model_name}` does not have any library metadata on the Hub: pass "
                "`--library_name transformers` (or `timm`)."
            )
    if library_name == "transformers":
        try:
            import transformers  # optional dependency
        except ImportError as err:
            raise ImportError(
                f"Sizing `{model_name}` needs `transformers`: `pip install transformers`."
            ) from err
        config_info = {} if local else getattr(info, "config", None)
        if config_info is None:
            raise RuntimeError(
                f"Tried to load `{model_name}` with `transformers`, but its repo has no config metadata."
            )
        print(f"Loading the config of `{model_name}` with `transformers`...")
        config = transformers.AutoConfig.from_pretrained(
            model_name, trust_remote_code=trust_remote_code, token=access_token
        )
        auto_map = config_info.get("auto_map") if isinstance(config_info, dict) else None
        auto_map = auto_map or getattr(config, "auto_map", None)
        # Remote code may name its own AutoModelFor... class; the first one found builds the model.
        names = [key for key in (auto_map or {}) if key.startswith("AutoModelFor")]
        constructor = getattr(transformers, names[0]) if names else transformers.AutoModel
        with init_empty_weights():
            # fp32 explicitly: the sizes are reported per dtype from the fp32 size
            return constructor.from_config(
                config, torch_dtype=torch.float32, trust_remote_code=trust_remote_code
            )
    if library_name == "timm":
        try:
            import timm  # optional dependency
        except ImportError as err:
            raise ImportError(f"Sizing `{model_name}` needs `timm`: `pip install timm`.") from err
        print(f"Loading the config of `{model_name}` with `timm`...")
        with init_empty_weights():
            return timm.create_model(add_timm_hub_prefix(model_name), pretrained=False)
    raise ValueError(
        f"Library `{library_name}` is not supported yet: estimate-memory can size `transformers` "
        "and `timm` models (pass `--library_name`)."
    )


def create_ascii_table(headers: list[str], rows: list[list[str]], title: str) -> str:
    """A box-drawn table with a centred title, centred header and centred cells.

    Example:
        >>> print(create_ascii_table(["a", "b"], [["1", "2"]], "T"))  # doctest: +SKIP

    Args:
        headers (list[str]): The column titles.
        rows (list[list[str]]): The cells, row by row.
        title (str): The table's title.

    Returns:
        str: The table, lines joined by newlines.
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
    """The `estimate-memory` parser: added to `subparsers` when given, standalone otherwise.

    Args:
        subparsers (Any): The subparsers action of the `cadence` parser; None builds a standalone parser.

    Returns:
        argparse.ArgumentParser: The parser.
    """
    description = "Estimate the memory a Hub model needs for inference and training."
    if subparsers is not None:
        parser = subparsers.add_parser(
            "estimate-memory",
            help="Estimate the memory a model needs to load and to train, per dtype.",
            description=description,
        )
    else:
        parser = argparse.ArgumentParser("cadence estimate-memory", description=description)
    parser.add_argument(
        "model_name",
        type=str,
        help="The model name on the Hugging Face Hub, a local folder with its config.json, or a "
        "cached model (with HF_HUB_OFFLINE=1).",
    )
    parser.add_argument(
        "--library_name",
        "--library-name",
        type=str,
        choices=["timm", "transformers"],
        help="The model's library.",
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
        "--trust_remote_code",
        "--trust-remote-code",
        action="store_true",
        default=False,
        help="Run the Hub repo's code.",
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

    Args:
        bytes (int): The model's size in fp32.
        mixed_precision (str): "float32", "float16", "bfloat16", "fp8" ...
        msamp_config (str | None): The MS-AMP optimisation level used with fp8; with one, nothing is
            estimated (-1 everywhere).

    Returns:
        dict[str, int]: Bytes for "model", "optimizer", "gradients" and "step".
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
    """One row per dtype of `args.dtypes`: [dtype, largest layer bytes, total bytes, training sizes].

    Args:
        args (argparse.Namespace): The parsed `estimate-memory` arguments.

    Returns:
        list[list[Any]]: One row per dtype: the dtype, the largest layer's bytes, the model's bytes and
        the training sizes (as `estimate_training_usage` returns them).
    """
    from ..utils.modeling import (  # deferred: the big-model helpers load only for this command
        calculate_maximum_sizes,
    )

    try:
        model = create_empty_model(
            args.model_name,
            library_name=args.library_name,
            trust_remote_code=args.trust_remote_code,
        )
    except (RuntimeError, OSError, ValueError, KeyError) as err:
        library = check_has_model(err)
        if library != "unknown":
            raise RuntimeError(
                f"Tried to load `{args.model_name}` with `{library}` but a possible model to load "
                "was not found inside the repo: check the name and `--library_name`."
            ) from err
        raise
    total, (largest, _names) = calculate_maximum_sizes(model)
    shrink = {"float32": 1, "float16": 2, "int8": 4, "int4": 8}  # bytes per parameter vs fp32
    return [
        [
            dtype,
            largest / shrink[dtype],
            total / shrink[dtype],
            estimate_training_usage(total, dtype),
        ]
        for dtype in args.dtypes
    ]


def estimate_command(args: argparse.Namespace) -> None:
    """Print the memory table for `args.model_name`: per dtype, the largest layer, the whole model,
    and the peak of a training step with Adam ("N/A" where it is not estimated).

    Args:
        args (argparse.Namespace): The parsed `estimate-memory` arguments.
    """
    from ..training.model_helpers import convert_bytes  # deferred: loaded when the command runs

    rows = []
    for dtype, largest, total, training in gather_data(args):
        peak = max(training.values())
        rows.append(
            [dtype, convert_bytes(largest), convert_bytes(total)]
            + [convert_bytes(peak) if peak != -1 else "N/A"]
        )
    headers = ["dtype", "Largest Layer", "Total Size", "Training using Adam"]
    print(create_ascii_table(headers, rows, f"Memory Usage for loading `{args.model_name}`"))


def register(subparsers: Any) -> None:
    """Add the `estimate-memory` subcommand to `subparsers`."""
    estimate_command_parser(subparsers)


def main() -> int:
    """Run `estimate-memory` with the process arguments."""
    return run_parser(estimate_command_parser())
