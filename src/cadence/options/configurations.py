"""The configurations of how a run reads its data (`DataLoaderConfiguration`) and where it keeps its
files (`ProjectConfiguration`). Re-exported by `cadence.options.dataclasses`.
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass


@dataclass
class DataLoaderConfiguration:
    """How `prepare()` shards, feeds and resumes dataloaders.

    Args:
        split_batches (bool): False (default): every process reads batches of the dataloader's
            `batch_size`, so the global batch is `batch_size * num_processes`. True: each batch of the
            dataloader is split among the processes, so the global batch stays `batch_size` (it must
            divide evenly).
        dispatch_batches (bool | None): True: the main process reads each batch and sends every process
            its part (for datasets only one process can read). None: True for iterable datasets, False
            otherwise.
        even_batches (bool): True (default): when the dataset does not divide evenly, the last batches
            are completed with samples from its start so every process gets as many batches
            (`gather_for_metrics` drops the extra samples). False: processes may get different numbers
            of batches.
        use_seedable_sampler (bool): Shuffle with a sampler seeded by `set_seed`, so the order is the
            same from run to run and resumes exactly (default False).
        data_seed (int | None): The seed of that sampler; None uses the seed given to `set_seed`. A
            non-integer raises TypeError.
        non_blocking (bool): Copy batches to the GPU with `non_blocking=True` (default False; useful
            with `pin_memory=True`).
        use_stateful_dataloader (bool): Build torchdata `StatefulDataLoader`s, whose position is saved
            and restored by `save_state` / `load_state` (default False; needs torchdata).
        resume_exact_order (bool): Cadence only: a dataloader resumed mid-epoch continues the saved epoch
            with the same samples in the same order (default True). False resumes as Accelerate does:
            the order is drawn again. See "Differences from Accelerate".

    Raises:
        TypeError: A string given for a True/False field, or a non-integer `data_seed`.

    Example:
        >>> import torch
        >>> from cadence import Accelerator, DataLoaderConfiguration
        >>> config = DataLoaderConfiguration(split_batches=True)
        >>> accelerator = Accelerator(dataloader_config=config)
        >>> loader = accelerator.prepare(torch.utils.data.DataLoader(torch.arange(8), batch_size=4))
        >>> next(iter(loader)).tolist()  # on 2 processes: [0, 1] and [2, 3]
        [0, 1, 2, 3]
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False
    resume_exact_order: bool = True

    def __post_init__(self) -> None:
        for name in (
            "split_batches",
            "dispatch_batches",
            "even_batches",
            "use_seedable_sampler",
            "non_blocking",
            "use_stateful_dataloader",
            "resume_exact_order",
        ):
            if isinstance(getattr(self, name), (str, bytes)):
                raise TypeError(
                    f"DataLoaderConfiguration({name}={getattr(self, name)!r}) takes True or False, not "
                    "a string (any non-empty string would count as True)."
                )
        seed = self.data_seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
            raise TypeError(
                f"DataLoaderConfiguration(data_seed=...) must be an integer or None, got {seed!r}."
            )


@dataclass
class ProjectConfiguration:
    """Where a run keeps its files: the project and logging folders, how checkpoints are named and kept.

    Args:
        project_dir (str | os.PathLike | None): The project folder. With automatic naming, checkpoints
            go to `<project_dir>/checkpoints/checkpoint_<n>`. A non-path raises TypeError.
        logging_dir (str | os.PathLike | None): Where trackers write; None means `project_dir`.
        automatic_checkpoint_naming (bool): Name checkpoints `checkpoint_0`, `checkpoint_1`, ... under
            the project folder, so `save_state()` and `load_state()` need no folder (default False).
        total_limit (int | None): With automatic naming, how many checkpoints to keep; older ones are
            removed once a new one is committed. A negative or non-integer value raises ValueError.
        iteration (int): The number of the next automatically named checkpoint (default 0;
            `load_state()` sets it to continue after the checkpoint it loaded).
        save_on_each_node (bool): Write the files that are saved once per job on every machine's main
            process instead (for machines without a shared file system; default False).

    Raises:
        TypeError: A folder that is not a path.
        ValueError: A bad `total_limit`.

    Example:
        >>> from cadence import Accelerator
        >>> from cadence.utils import ProjectConfiguration
        >>> config = ProjectConfiguration(project_dir="runs", automatic_checkpoint_naming=True, total_limit=2)
        >>> accelerator = Accelerator(project_config=config)
        >>> for _ in range(3):
        ...     _ = accelerator.save_state()
        >>> import os; sorted(os.listdir("runs/checkpoints"))
        ['checkpoint_1', 'checkpoint_2']
    """

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def set_directories(self, project_dir: str | os.PathLike | None = None) -> None:
        """Set `project_dir`, and `logging_dir` to the same folder when it was not given.

        Args:
            project_dir (str | os.PathLike | None): The project folder.
        """
        self.project_dir = os.fspath(project_dir) if project_dir is not None else None
        if self.logging_dir is None:
            self.logging_dir = self.project_dir

    def __post_init__(self) -> None:
        for name in ("project_dir", "logging_dir"):
            path = getattr(self, name)
            if path is not None and not isinstance(path, (str, os.PathLike)):
                raise TypeError(
                    f"ProjectConfiguration({name}=...) must be a path (str or os.PathLike), got "
                    f"{type(path).__name__}."
                )
        if self.project_dir is not None:
            self.project_dir = os.fspath(self.project_dir)
        self.set_directories(self.project_dir)
        if self.total_limit is not None and (
            not isinstance(self.total_limit, int) or self.total_limit < 0
        ):
            raise ValueError(
                f"total_limit must be a non-negative integer, got {self.total_limit!r}."
            )
