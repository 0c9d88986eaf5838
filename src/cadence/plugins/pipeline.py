"""The pipeline-parallel options of a `ParallelismConfig` (Cadence's extension of Accelerate's config):
which of torch's schedules runs, into how many micro-batches a batch is cut, how many stages each
process holds, where the model is split, and the loss the last stage computes.

Only values are checked here (no process state, no torch.distributed.pipelining import): the model's
split and the schedule are built when the model is prepared (`cadence.strategies.pipeline`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.settings import plugin_env_text

# torch.distributed.pipelining's names (`get_schedule_class`), with the stages each process holds.
SINGLE_STAGE_SCHEDULES = ("GPipe", "1F1B")
LOOPED_SCHEDULES = ("Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble")
SCHEDULES = SINGLE_STAGE_SCHEDULES + LOOPED_SCHEDULES


def canonical_schedule(name: str) -> str:
    """The schedule's name as torch spells it, whatever its case; ValueError for an unknown one."""
    by_lower = {known.lower(): known for known in SCHEDULES}
    if not isinstance(name, str) or name.lower() not in by_lower:
        raise ValueError(
            f"Unknown pipeline schedule {name!r}: use one of {', '.join(SCHEDULES)} "
            "(torch.distributed.pipelining's names)."
        )
    return by_lower[name.lower()]


@dataclass
class PipelineParallelConfig:
    """How `ParallelismConfig(pp_size=N)` runs its pipeline (Cadence only; Accelerate has no pipeline
    training).

    Args:
        schedule (str | None): One of "GPipe", "1F1B" (one stage per process), "Interleaved1F1B",
            "InterleavedZeroBubble", "ZBVZeroBubble" (several stages per process), in any case. None
            reads `PARALLELISM_CONFIG_PP_SCHEDULE`, else "1F1B".
        n_microbatches (int | None): Micro-batches each batch is cut into (along its first dimension,
            which they must divide evenly). None: the number of stages in the pipeline.
        stages_per_process (int | None): Stages each process holds. None: 1 for GPipe and 1F1B, 2
            for the looped schedules (ZBVZeroBubble needs exactly 2).
        split_points (Sequence[str] | None): Names of the modules where a new stage begins, e.g.
            `["layers.8", "layers.16"]` (one fewer than the number of stages). None balances the
            stages: a transformers causal LM's decoder layers by count; the children of an
            `nn.Sequential`, or another model's children in order (lists expanded), by parameters.
        loss_fn (Callable | None): `loss_fn(output, labels)` computed by the last stage on each
            micro-batch, mean-reduced. None: a transformers causal LM's next-token cross-entropy; any
            other model needs one.

    Raises:
        ValueError: An unknown schedule, a size below 1, `stages_per_process` that does not fit the
            schedule, or split points that are not distinct module names.
    """

    schedule: str | None = None
    n_microbatches: int | None = None
    stages_per_process: int | None = None
    split_points: Sequence[str] | None = None
    loss_fn: Callable[[Any, Any], Any] | None = None

    def __post_init__(self) -> None:
        if self.schedule is None:
            self.schedule = plugin_env_text("PARALLELISM_CONFIG_PP_SCHEDULE", "1F1B")
        self.schedule = canonical_schedule(self.schedule)
        for name in ("n_microbatches", "stages_per_process"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                raise ValueError(
                    f"PipelineParallelConfig.{name} must be an integer of at least 1, got {value!r}."
                )
        if self.stages_per_process is None:
            self.stages_per_process = 1 if self.schedule in SINGLE_STAGE_SCHEDULES else 2
        if self.schedule in SINGLE_STAGE_SCHEDULES and self.stages_per_process != 1:
            raise ValueError(
                f"The {self.schedule} schedule runs one stage per process, got stages_per_process="
                f"{self.stages_per_process}: use 'Interleaved1F1B' or 'InterleavedZeroBubble' for "
                "several stages per process."
            )
        if self.schedule == "ZBVZeroBubble" and self.stages_per_process != 2:
            raise ValueError(
                f"The ZBVZeroBubble schedule needs exactly 2 stages per process, got "
                f"stages_per_process={self.stages_per_process}."
            )
        if self.split_points is not None:
            points = list(self.split_points)
            if isinstance(self.split_points, str) or not all(
                isinstance(p, str) and p for p in points
            ):
                raise ValueError(
                    "split_points must be a list of module names such as ['layers.8', 'layers.16'], "
                    f"got {self.split_points!r}."
                )
            if len(set(points)) != len(points):
                raise ValueError(f"split_points names a module twice: {points}.")
            self.split_points = points
        if self.loss_fn is not None and not callable(self.loss_fn):
            raise ValueError(
                f"loss_fn must be callable as loss_fn(output, labels), got {self.loss_fn!r}."
            )

    def stage_count(self, pp_size: int) -> int:
        """The number of stages in a pipeline over `pp_size` processes."""
        return pp_size * self.stages_per_process

    def microbatches(self, pp_size: int) -> int:
        """The number of micro-batches per batch (the pipeline's stage count unless set)."""
        return self.n_microbatches or self.stage_count(pp_size)

    def check_against(self, pp_size: int) -> None:
        """Refuse what the pipeline over `pp_size` processes cannot run (before any process starts it).

        Raises:
            ValueError: Split points that do not make `pp_size * stages_per_process` stages; fewer
                micro-batches than stages for 1F1B; a micro-batch count the interleaved schedules
                cannot loop over.
        """
        stages = self.stage_count(pp_size)
        if self.split_points is not None and len(self.split_points) != stages - 1:
            raise ValueError(
                f"split_points has {len(self.split_points)} names, which make "
                f"{len(self.split_points) + 1} stages; pp_size={pp_size} x stages_per_process="
                f"{self.stages_per_process} needs {stages} stages, so {stages - 1} split points."
            )
        n = self.microbatches(pp_size)
        if self.schedule == "1F1B" and n < stages:
            raise ValueError(
                f"The 1F1B schedule needs at least as many micro-batches as stages: n_microbatches={n} "
                f"< {stages} stages. Raise n_microbatches or use 'GPipe'."
            )
        if self.schedule in LOOPED_SCHEDULES and n % pp_size:
            raise ValueError(
                f"The {self.schedule} schedule needs n_microbatches to be a multiple of pp_size: "
                f"n_microbatches={n}, pp_size={pp_size}."
            )

    def to_json(self) -> dict[str, Any]:
        """The options as a dict that `json.dumps` accepts (the loss function by its name)."""
        return {
            "schedule": self.schedule,
            "n_microbatches": self.n_microbatches,
            "stages_per_process": self.stages_per_process,
            "split_points": None if self.split_points is None else list(self.split_points),
            "loss_fn": None if self.loss_fn is None else getattr(self.loss_fn, "__name__", "?"),
        }
