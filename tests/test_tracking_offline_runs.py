"""A 2-process job logs to every installed tracker, offline; each tracker's output is then read back
with that tracker's own reader: the config, the scalars at their steps, and one run only.

Trackers run offline: W&B (`WANDB_MODE=offline`), MLflow (local file store), Comet (`online=False`
archive), ClearML (`CLEARML_OFFLINE_MODE`), SwanLab (`mode="offline"`); TensorBoard, Aim, DVCLive and
Trackio only write local files. Every file, caches and settings included, goes under the test's tmp dir.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import struct
import subprocess
import sys
import textwrap
import zipfile
from typing import Any

import pytest

from harness import free_port

CONFIG = {"learning_rate": 0.01, "batch_size": 16, "optimizer": "adamw"}
LOSSES = {0: 1.5, 3: 0.5}  # step -> loss, logged on both ranks
PROJECT = "cadence_run"

JOB = textwrap.dedent(
    """
    import importlib.util, json, os, sys

    import torch

    torch.set_num_threads(1)
    from cadence.state import PartialState
    from cadence.tracking import GeneralTracker, NoOpTracker, TrackerHub

    out = sys.argv[1]
    config = json.loads(sys.argv[2])
    losses = {int(step): loss for step, loss in json.loads(sys.argv[3]).items()}
    state = PartialState()


    class EveryRank(GeneralTracker):
        name = "every_rank"
        requires_logging_directory = False
        main_process_only = False

        def __init__(self):
            super().__init__()
            self.logged = []

        @property
        def tracker(self):
            return self.logged

        def log(self, values, step=None, **kwargs):
            self.logged.append([step, values])

        def finish(self):
            path = os.path.join(out, f"every_rank_{state.process_index}.json")
            with open(path, "w") as handle:
                json.dump(self.logged, handle)


    hub = TrackerHub(["all", EveryRank()], logging_dir=os.path.join(out, "logs"))
    hub.init_trackers(
        sys.argv[4],
        config=config,
        init_kwargs={
            "comet_ml": {"online": False},
            "dvclive": {"dir": os.path.join(out, "dvclive"), "save_dvc_exp": False},
            "swanlab": {"mode": "offline", "logdir": os.path.join(out, "swanlog")},
            "aim": {"system_tracking_interval": None, "capture_terminal_logs": False},
            "trackio": {"auto_log_cpu": False, "auto_log_gpu": False},
            "clearml": {
                "auto_resource_monitoring": False,
                "auto_connect_frameworks": False,
                "auto_connect_streams": False,
            },
        },
    )
    for step, loss in losses.items():
        hub.log({"loss": loss}, step=step)
    report = {"trackers": sorted(tracker.name for tracker in hub.trackers)}
    # Only the installed trackers take part: a machine without W&B or TensorBoard runs the rest.
    if importlib.util.find_spec("wandb") is not None:
        report["wandb_is_stand_in"] = isinstance(hub.get_tracker("wandb"), NoOpTracker)
    if importlib.util.find_spec("tensorboard") is not None:
        report["unwrapped_call"] = hub.get_tracker("tensorboard", unwrap=True).add_scalar("x", 1.0, 0)
    hub.end_training()
    with open(os.path.join(out, f"report_{state.process_index}.json"), "w") as handle:
        json.dump(report, handle)
    """
)


def _offline_env(root: str) -> dict[str, str]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # two CPU workers: never 2 ranks on one GPU
    for variable in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(variable, None)
    home = os.path.join(root, "home")
    os.makedirs(home, exist_ok=True)
    clearml_config = os.path.join(home, "clearml.conf")
    with open(clearml_config, "w") as handle:
        # Report from a thread, not a subprocess that closing the task waits ~10 s for.
        handle.write("sdk { development { report_use_subprocess: false } }\n")
    env.update(
        HOME=home,
        XDG_CACHE_HOME=os.path.join(home, ".cache"),
        XDG_CONFIG_HOME=os.path.join(home, ".config"),
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_DIR=root,
        WANDB_CACHE_DIR=os.path.join(root, "wandb_cache"),
        WANDB_CONFIG_DIR=os.path.join(root, "wandb_config"),
        WANDB_DATA_DIR=os.path.join(root, "wandb_data"),
        MLFLOW_TRACKING_URI="file://" + os.path.join(root, "mlruns"),
        MLFLOW_ALLOW_FILE_STORE="true",
        MLFLOW_DISABLE_TELEMETRY="true",
        DO_NOT_TRACK="1",
        ITERATIVE_DO_NOT_TRACK="1",
        TRACKIO_DIR=os.path.join(root, "trackio"),
        COMET_OFFLINE_DIRECTORY=os.path.join(root, "comet"),
        COMET_DISABLE_AUTO_LOGGING="1",
        CLEARML_OFFLINE_MODE="1",
        CLEARML_CONFIG_FILE=clearml_config,
        CLEARML_CACHE_DIR=os.path.join(root, "clearml"),
        OMP_NUM_THREADS="1",
    )
    return env


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """Run the 2-process job once; the tests below each read one tracker's output."""
    root = str(tmp_path_factory.mktemp("tracking_job"))
    script = os.path.join(root, "job.py")
    with open(script, "w") as handle:
        handle.write(JOB)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        f"--master_port={free_port()}",
        script,
        root,
        json.dumps(CONFIG),
        json.dumps(LOSSES),
        PROJECT,
    ]
    completed = subprocess.run(
        command, cwd=root, env=_offline_env(root), capture_output=True, text=True, timeout=300
    )
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-8000:]
    return root


def _expected_scalars() -> list[tuple[int, float]]:
    return sorted(LOSSES.items())


# -- what each rank did ------------------------------------------------------------------------------


def test_trackers_run_on_the_main_process_and_every_rank_tracker_on_both(job):
    with open(os.path.join(job, "report_0.json")) as handle:
        main = json.load(handle)
    with open(os.path.join(job, "report_1.json")) as handle:
        other = json.load(handle)
    assert "every_rank" in main["trackers"]
    assert other["trackers"] == ["every_rank"]
    if importlib.util.find_spec("tensorboard") is not None:
        assert "tensorboard" in main["trackers"] and other["unwrapped_call"] is None
    if importlib.util.find_spec("wandb") is not None:
        assert other["wandb_is_stand_in"] and not main["wandb_is_stand_in"]
    for rank in (0, 1):
        with open(os.path.join(job, f"every_rank_{rank}.json")) as handle:
            assert json.load(handle) == [[step, {"loss": loss}] for step, loss in LOSSES.items()]


# -- TensorBoard -------------------------------------------------------------------------------------


def test_tensorboard(job):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = os.path.join(job, "logs", PROJECT)
    assert len(glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))) == 1  # one writer
    events = EventAccumulator(run_dir)
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == _expected_scalars()
    assert len(glob.glob(os.path.join(run_dir, "*", "hparams.yml"))) == 1


# -- Weights & Biases --------------------------------------------------------------------------------


def _wandb_records(path):
    """The protobuf records of a `.wandb` run file (a LevelDB-style log of 32 KiB blocks)."""
    from wandb.proto import wandb_internal_pb2

    block, header = 32 * 1024, 7
    with open(path, "rb") as handle:
        data = handle.read()
    assert data[:4] == b":W&B"
    position, pending = header, b""
    while position + header <= len(data):
        room = block - position % block
        if room < header:
            position += room
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[position : position + header])
        if length == 0 and kind == 0:
            position += room
            continue
        chunk = data[position + header : position + header + length]
        position += header + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def test_wandb_offline_run(job):
    pytest.importorskip("wandb")
    runs = glob.glob(os.path.join(job, "wandb", "offline-run-*"))
    assert len(runs) == 1
    [run_file] = glob.glob(os.path.join(runs[0], "run-*.wandb"))
    config, history = {}, []
    for record in _wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            assert record.run.project == PROJECT
            config.update(
                {item.key: json.loads(item.value_json) for item in record.run.config.update}
            )
        elif kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
        elif kind == "history":
            values = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            if "loss" in values:
                history.append((values["_step"], values["loss"]))
    assert {key: config[key] for key in CONFIG} == CONFIG
    assert history == _expected_scalars()


# -- MLflow ------------------------------------------------------------------------------------------


def _read_in_subprocess(job: str, code: str, *args: str) -> Any:
    """Run a reader in a process with the job's environment: some readers read their settings
    when imported, and their side files (telemetry, caches) then stay under the job's folder."""
    output = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=_offline_env(job),
    )
    assert output.returncode == 0, output.stderr[-4000:]
    return json.loads(output.stdout.strip().splitlines()[-1])


def test_mlflow_file_store(job):
    pytest.importorskip("mlflow")
    code = """
        import json, sys
        from mlflow.tracking import MlflowClient

        client = MlflowClient()
        experiment = client.get_experiment_by_name(sys.argv[1])
        runs = client.search_runs([experiment.experiment_id])
        history = client.get_metric_history(runs[0].info.run_id, "loss")
        print(json.dumps({
            "runs": len(runs),
            "params": runs[0].data.params,
            "status": runs[0].info.status,
            "loss": [[metric.step, metric.value] for metric in history],
        }))
        """
    result = _read_in_subprocess(job, code, PROJECT)
    assert result["runs"] == 1
    assert result["params"] == {key: str(value) for key, value in CONFIG.items()}
    assert [tuple(point) for point in result["loss"]] == _expected_scalars()
    assert result["status"] == "FINISHED"


# -- Aim ---------------------------------------------------------------------------------------------


def test_aim_repository(job):
    pytest.importorskip("aim")
    code = """
        import json, sys
        from aim import Repo
        from aim.sdk.index_manager import RepoIndexManager

        repo = Repo.from_path(sys.argv[1])
        for run_hash in repo.list_all_runs():  # runs are listed once indexed
            RepoIndexManager.get_index_manager(repo).index(run_hash)
        runs = []
        for run in repo.iter_runs():
            [loss] = [metric for metric in run.metrics() if metric.name == "loss"]
            runs.append({
                "name": run.name,
                "hparams": run["hparams"],
                "loss": [[step, row[0]] for step, row in loss.data.items()],
            })
        print(json.dumps(runs))
        """
    [run] = _read_in_subprocess(job, code, os.path.join(job, "logs"))
    assert run["name"] == PROJECT
    assert run["hparams"] == CONFIG
    assert [tuple(point) for point in run["loss"]] == _expected_scalars()


# -- DVCLive -----------------------------------------------------------------------------------------


def test_dvclive_files(job):
    pytest.importorskip("dvclive")
    from dvclive.serialize import load_yaml
    from dvclive.utils import parse_json, parse_tsv

    folder = os.path.join(job, "dvclive")
    assert load_yaml(os.path.join(folder, "params.yaml")) == CONFIG
    rows = parse_tsv(os.path.join(folder, "plots", "metrics", "loss.tsv"))
    assert [(int(row["step"]), float(row["loss"])) for row in rows] == _expected_scalars()
    last_step, last_loss = _expected_scalars()[-1]
    assert parse_json(os.path.join(folder, "metrics.json")) == {
        "loss": last_loss,
        "step": last_step,
    }


# -- Trackio -----------------------------------------------------------------------------------------


def test_trackio_database(job):
    pytest.importorskip("trackio")
    code = """
        import json, sys
        from trackio.sqlite_storage import SQLiteStorage

        project = sys.argv[1]
        runs = SQLiteStorage.get_runs(project)
        print(json.dumps({
            "runs": runs,
            "config": SQLiteStorage.get_run_config(project, runs[0]),
            "loss": [[log["step"], log["loss"]] for log in SQLiteStorage.get_logs(project, runs[0])],
        }))
        """
    result = _read_in_subprocess(job, code, PROJECT)
    assert len(result["runs"]) == 1
    assert {key: result["config"][key] for key in CONFIG} == CONFIG
    assert [tuple(point) for point in result["loss"]] == _expected_scalars()


# -- SwanLab -----------------------------------------------------------------------------------------


def test_swanlab_offline_run(job):
    pytest.importorskip("swanlab")
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    runs = glob.glob(os.path.join(job, "swanlog", "run-*"))
    assert len(runs) == 1
    [run_file] = glob.glob(os.path.join(runs[0], "run-*.swanlab"))
    reader = DataStoreReader()
    reader.open(run_file)
    project, scalars = None, []
    for data in reader:
        record = Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "start":
            project = record.start.project
        elif kind == "scalar" and record.scalar.key == "loss":
            scalars.append((record.scalar.step, record.scalar.value.number))
    reader.close()
    assert project == PROJECT
    assert scalars == _expected_scalars()
    import yaml

    with open(os.path.join(runs[0], "files", "config.yaml")) as handle:
        stored = yaml.safe_load(handle)
    assert {key: stored[key]["value"] for key in CONFIG} == CONFIG


# -- Comet ---------------------------------------------------------------------------------------------


def test_comet_offline_archive(job):
    pytest.importorskip("comet_ml")
    archives = glob.glob(os.path.join(job, "comet", "*.zip"))
    assert len(archives) == 1
    with zipfile.ZipFile(archives[0]) as archive:
        experiment = json.loads(archive.read("experiment.json"))
        messages = [json.loads(line) for line in archive.read("messages.json").splitlines()]
    assert experiment["project_name"] == PROJECT
    params = {
        m["payload"]["param"]["paramName"]: m["payload"]["param"]["paramValue"]
        for m in messages
        if m["type"] == "parameter_msg"
    }
    assert {key: params[key] for key in CONFIG} == CONFIG
    losses = [
        (m["payload"]["metric"]["step"], m["payload"]["metric"]["metricValue"])
        for m in messages
        if m["type"] == "metric_msg" and m["payload"]["metric"]["metricName"] == "loss"
    ]
    assert losses == _expected_scalars()


# -- ClearML -----------------------------------------------------------------------------------------


def test_clearml_offline_session(job):
    pytest.importorskip("clearml")
    sessions = [
        path
        for path in glob.glob(os.path.join(job, "clearml", "offline", "*"))
        if os.path.isdir(path)
    ]
    assert len(sessions) == 1
    with open(os.path.join(sessions[0], "task.json")) as handle:
        task = json.load(handle)
    assert (task["project_name"], task["name"]) == (PROJECT, PROJECT)
    stored = task["configuration"]["General"]["value"]
    for key, value in CONFIG.items():
        assert f"{key} = {value}" in stored.replace('"', "")
    with open(os.path.join(sessions[0], "metrics.jsonl")) as handle:
        events = [event for line in handle for event in json.loads(line)]
    losses = [(e["iter"], e["value"]) for e in events if e.get("metric") == "loss"]
    assert losses == _expected_scalars()
