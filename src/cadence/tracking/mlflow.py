"""MLflow: a run in the experiment named after the project (`MLFLOW_TRACKING_URI` says where)."""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

from ..core.settings import env_text, parse_bool
from .base import GeneralTracker, on_main_process
from .values import plain_number, plain_values, warn_dropped


def _env_bool(name: str, value: Any) -> bool:
    return parse_bool(value, name)


class MLflowTracker(GeneralTracker):
    """Logs to an MLflow run. Environment variables win over the arguments of the same meaning.

    Args:
        experiment_name: the experiment (`MLFLOW_EXPERIMENT_NAME`); created if it does not exist.
        logging_dir: the artifact location of a newly created experiment.
        run_id: resume this run instead of starting one (`MLFLOW_RUN_ID`).
        tags: a dict, or its JSON text, of tags for the experiment and run (`MLFLOW_TAGS`).
        nested_run: start the run nested in the active one (`MLFLOW_NESTED_RUN`).
        run_name: the new run's name.
        description: the run's description.
    """

    name = "mlflow"
    requires_logging_directory = False

    def __init__(
        self,
        experiment_name: str | None = None,
        logging_dir: str | os.PathLike | None = None,
        run_id: str | None = None,
        tags: dict[str, Any] | str | None = None,
        nested_run: bool | None = False,
        run_name: str | None = None,
        description: str | None = None,
    ) -> None:
        super().__init__()
        tags = env_text("MLFLOW_TAGS", tags)
        self.experiment_name = env_text("MLFLOW_EXPERIMENT_NAME", experiment_name)
        self.logging_dir = logging_dir
        self.run_id = env_text("MLFLOW_RUN_ID", run_id)
        self.tags = json.loads(tags) if isinstance(tags, str) else tags
        self.nested_run = _env_bool(
            "MLFLOW_NESTED_RUN", env_text("MLFLOW_NESTED_RUN", bool(nested_run))
        )
        self.run_name = run_name
        self.description = description

    @on_main_process
    def start(self) -> None:
        """Find or create the experiment, then start (or resume) the run (main process only)."""
        import mlflow

        found = mlflow.search_experiments(filter_string=f"name = '{self.experiment_name}'")
        if len(found) > 1:
            warnings.warn(
                f"Several MLflow experiments are named {self.experiment_name!r}; using the first.",
                UserWarning,
                stacklevel=2,
            )
        if found:
            experiment_id = found[0].experiment_id
        else:
            experiment_id = mlflow.create_experiment(
                name=self.experiment_name,
                artifact_location=os.fspath(self.logging_dir) if self.logging_dir else None,
                tags=self.tags,
            )
        self.active_run = mlflow.start_run(
            run_id=self.run_id,
            experiment_id=experiment_id,
            run_name=self.run_name,
            nested=self.nested_run,
            tags=self.tags,
            description=self.description,
        )

    @property
    def tracker(self) -> Any:
        """The active `mlflow.ActiveRun`."""
        return self.active_run

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        """Stored as run params (text); values longer than MLflow's limit are skipped with a warning.

        Args:
            values (dict): The run's hyperparameters (nested dicts and lists allowed); tensors become
                numbers, enums their value, paths text, other objects their text with a warning.
        """
        import mlflow
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        params = []
        for key, value in values.items():
            value = plain_number(value)
            if len(str(value)) > MAX_PARAM_VAL_LENGTH:
                warnings.warn(
                    f"MLflow cannot store config value {key!r}: its text is longer than "
                    f"{MAX_PARAM_VAL_LENGTH} characters; it was skipped.",
                    UserWarning,
                    stacklevel=3,
                )
            else:
                params.append((key, value))
        for start in range(0, len(params), MAX_PARAMS_TAGS_PER_BATCH):
            mlflow.log_params(dict(params[start : start + MAX_PARAMS_TAGS_PER_BATCH]))

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Numbers become metrics; other values are skipped with a warning. `**kwargs` go to
        `mlflow.log_metrics`.

        Args:
            values (dict): Names and values to log; one-element tensors and NumPy scalars count as numbers.
            step (int | None): The training step they belong to; None lets the tracker pick.
            **kwargs: Passed to `mlflow.log_metrics` (synchronous, run_id ...).
        """
        import mlflow

        metrics = {}
        for key, value in plain_values(values).items():
            if isinstance(value, (int, float)):
                metrics[key] = value
            else:
                warn_dropped("MLflow", key, value, "numbers")
        mlflow.log_metrics(metrics, step=step, **kwargs)

    @on_main_process
    def log_figure(self, figure: Any, artifact_file: str, **save_kwargs: Any) -> None:
        """Save a matplotlib or plotly figure as the run artifact `artifact_file`.

        Args:
            figure (Any): A matplotlib or plotly figure.
            artifact_file (str): Its path inside the run's artifacts, extension included ("plots/loss.png").
            **save_kwargs: Passed to `mlflow.log_figure`.
        """
        import mlflow

        mlflow.log_figure(figure=figure, artifact_file=artifact_file, **save_kwargs)

    @on_main_process
    def log_artifacts(self, local_dir: str, artifact_path: str | None = None) -> None:
        """Copy the contents of `local_dir` into the run's artifacts (under `artifact_path`).

        Args:
            local_dir (str): The folder whose files are uploaded.
            artifact_path (str | None): The folder inside the run's artifacts; None puts them at their root.
        """
        import mlflow

        mlflow.log_artifacts(local_dir=local_dir, artifact_path=artifact_path)

    @on_main_process
    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        """Copy the file `local_path` into the run's artifacts (under `artifact_path`).

        Args:
            local_path (str): The file to upload.
            artifact_path (str | None): The folder inside the run's artifacts; None puts it at their root.
        """
        import mlflow

        mlflow.log_artifact(local_path=local_path, artifact_path=artifact_path)

    @on_main_process
    def finish(self) -> None:
        """End the MLflow run."""
        import mlflow

        mlflow.end_run()
