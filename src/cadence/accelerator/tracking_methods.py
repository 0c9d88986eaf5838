"""The Accelerator's experiment tracking and profiling (init_trackers, log, get_tracker, end_training,
profile), forwarding to the `TrackerHub`. A base class of `Accelerator`, kept apart so the façade stays
one screenful per concern.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..core.profiling import profile

if TYPE_CHECKING:
    from ..options.dataclasses import ProfileKwargs


class TrackingMethods:
    """Tracking and profiling methods of the Accelerator; they use its tracker hub, process state, fault
    tolerance and checkpointer (to finish them at `end_training`)."""

    # -- experiment tracking and profiling (the TrackerHub) ---------------------------------------
    trackers = property(
        lambda self: self._tracker_hub.trackers,
        doc="The started trackers (`GeneralTracker` objects); empty before `init_trackers`.",
    )
    log_with = property(
        lambda self: self._tracker_hub.log_with,
        doc="The trackers that were asked for with `log_with`, as given.",
    )

    def init_trackers(
        self, project_name: str, config: dict | None = None, init_kwargs: dict | None = None
    ) -> None:
        """Start a run named `project_name` on every tracker of `log_with` (on the main process).

        Args:
            project_name (str): The run's (or project's) name.
            config (dict | None): Hyperparameters to record with the run.
            init_kwargs (dict | None): Per-tracker keyword arguments for its start function, keyed by
                tracker name: `{"wandb": {"entity": "me"}}`.

        Example:
            >>> from cadence import Accelerator
            >>> accelerator = Accelerator(log_with="tensorboard", project_dir="runs")
            >>> accelerator.init_trackers("demo", config={"lr": 0.1})
            >>> accelerator.log({"loss": 0.5}, step=1)
            >>> accelerator.end_training()
        """
        self._tracker_hub.init_trackers(project_name, config, init_kwargs)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The started tracker called `name`.

        Args:
            name (str): The tracker's name, as in `log_with` ("wandb", "tensorboard", ...).
            unwrap (bool): Return the tracker's own run object (a `wandb.Run`, a `SummaryWriter`, ...)
                instead of Cadence's `GeneralTracker` (default False).

        Returns:
            The tracker; on processes that do not log, a stand-in whose methods do nothing.
        """
        return self._tracker_hub.get_tracker(name, unwrap)

    def log(self, values: dict, step: int | None = None, log_kwargs: dict | None = None) -> None:
        """Log `values` to every started tracker (on the processes that log: the main one by default).

        Args:
            values (dict): Names to values (numbers, strings, or what the tracker accepts).
            step (int | None): The step to log them at.
            log_kwargs (dict | None): Per-tracker keyword arguments for its log call, keyed by tracker name.
        """
        self._tracker_hub.log(values, step, log_kwargs)

    def end_training(self) -> None:
        """Finish: close the trackers, wait for a pending asynchronous checkpoint, end the process group.

        Call it at the end of a script that used trackers or `save_state(async_save=True)`.
        """
        self._tracker_hub.end_training()
        if self._fault_tolerance is not None:  # the script's end: the other groups are told
            self._fault_tolerance.finish()
        if "_checkpointer" in self.__dict__:  # nothing to wait for when nothing was saved
            self._checkpointer.wait_for_async_save()
        self.state.destroy_process_group()

    @contextmanager
    def profile(self, profile_handler: ProfileKwargs | None = None) -> Iterator[Any]:
        """Profile the block with `torch.profiler`; yields the profiler.

        With `ProfileKwargs(output_trace_dir=...)` each process writes a Chrome trace there when the block
        ends.

        Args:
            profile_handler (ProfileKwargs | None): Settings for this block; None uses the `ProfileKwargs`
                given to the Accelerator (or the defaults).

        Yields:
            torch.profiler.profile: The running profiler.
        """

        with profile(profile_handler or self.profile_handler, self.state) as profiler:
            yield profiler
