"""`tqdm`: a progress bar shown once per machine instead of once per process."""

from __future__ import annotations

from typing import Any

from .state import PartialState


def tqdm(*args: Any, main_process_only: bool = True, **kwargs: Any) -> Any:
    """`tqdm.auto.tqdm(*args, **kwargs)`, disabled on every process but the local main one.

    Args:
        *args: Passed to tqdm: the iterable first, by position.
        main_process_only: `False` shows the bar on every process.
        **kwargs: Passed to tqdm (total, desc, disable ...).

    Returns:
        The progress bar.

    Raises:
        ValueError: A bool as the first argument (the old place of `main_process_only`).
        ImportError: tqdm is not installed.
    """
    if args and isinstance(args[0], bool):
        raise ValueError(
            "cadence.runtime.tqdm no longer takes `main_process_only` as its first argument: pass it by "
            "keyword, e.g. tqdm(range(n), main_process_only=False)."
        )
    try:
        from tqdm.auto import tqdm as progress_bar
    except ImportError as error:
        raise ImportError(
            "cadence.runtime.tqdm needs the tqdm package: pip install tqdm."
        ) from error
    disable = kwargs.pop("disable", False)
    if main_process_only and not disable:
        disable = PartialState().local_process_index != 0
    return progress_bar(*args, disable=disable, **kwargs)
