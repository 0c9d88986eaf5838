"""The Accelerator's experiment tracking and profiling methods (a mixin of Accelerator)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any


class TrackingMethods:
    """init_trackers / log / get_tracker / end_training / profile, delegating to cadence.tracking."""

    # -- experiment tracking, profiling ----------------------------------------------------------------
    @property
    def trackers(self) -> list[Any]:
        return self._tracker_hub.trackers

    @property
    def log_with(self) -> list[Any]:
        return self._tracker_hub.log_with

    def init_trackers(
        self, project_name: str, config: dict | None = None, init_kwargs: dict | None = None
    ) -> None:
        """Start a run named `project_name` on every tracker (main process only by default)."""
        self._tracker_hub.init_trackers(project_name, config, init_kwargs)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker called `name` (its own run object with `unwrap=True`); a no-op stand-in elsewhere."""
        return self._tracker_hub.get_tracker(name, unwrap)

    def log(self, values: dict, step: int | None = None, log_kwargs: dict | None = None) -> None:
        """Log `values` at `step` to every tracker."""
        self._tracker_hub.log(values, step, log_kwargs)

    def end_training(self) -> None:
        """Finish the trackers, wait for pending checkpoint writes, and destroy the process group."""
        self._tracker_hub.end_training()
        from .checkpoint_flow import wait_for_async_save

        wait_for_async_save(self)
        self.state.destroy_process_group()

    @contextmanager
    def profile(self, profile_handler: Any = None):
        """Profile the block with torch.profiler; writes a Chrome trace per rank if output_trace_dir is set."""
        from .profiling import profile

        with profile(profile_handler or self.profile_handler, self.state) as profiler:
            yield profiler
