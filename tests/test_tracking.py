"""Experiment tracking on one process: resolving `log_with`, the tracker contract, config conversion,
and TensorBoard files read back with TensorBoard's own reader."""

from __future__ import annotations

import enum
import glob
import os
import pathlib
import sys
import warnings

import pytest
import torch
import yaml

from cadence.core.enums import LoggerType
from cadence.state import reset_state
from cadence.tracking import (
    LOGGER_TYPE_TO_CLASS,
    GeneralTracker,
    NoOpTracker,
    TensorBoardTracker,
    TrackerHub,
    filter_trackers,
    get_available_trackers,
    register_tracker_class,
)
from cadence.tracking.values import flat_config, storable_config


@pytest.fixture(autouse=True)
def fresh_state():
    reset_state()
    yield
    reset_state()


class RecordingTracker(GeneralTracker):
    """A custom tracker that remembers every call, to check what the hub sends it."""

    name = "recording"
    requires_logging_directory = False

    def __init__(self, run_name: str = "", **kwargs):
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.calls: list[tuple] = []

    @property
    def tracker(self):
        return self.calls

    def start(self):
        self.calls.append(("start",))

    def store_init_configuration(self, values):
        self.calls.append(("config", dict(values)))

    def log(self, values, step=None, **kwargs):
        self.calls.append(("log", dict(values), step, kwargs))

    def finish(self):
        self.calls.append(("finish",))


# -- resolving log_with ------------------------------------------------------------------------------


def test_a_name_a_logger_type_and_an_instance_resolve_in_order(tmp_path):
    pytest.importorskip("wandb")
    pytest.importorskip("tensorboard")
    custom = RecordingTracker()
    resolved = filter_trackers(["wandb", LoggerType.TENSORBOARD, custom], tmp_path)
    assert resolved == [LoggerType.WANDB, LoggerType.TENSORBOARD, custom]
    assert isinstance(resolved[0], LoggerType)


def test_a_single_value_is_accepted_and_repeats_are_dropped(tmp_path):
    pytest.importorskip("mlflow")
    assert filter_trackers("mlflow") == [LoggerType.MLFLOW]
    assert filter_trackers(["mlflow", LoggerType.MLFLOW, "mlflow"]) == [LoggerType.MLFLOW]
    assert filter_trackers(None) == []


def test_all_gives_every_installed_tracker_plus_custom_instances(tmp_path):
    custom = RecordingTracker()
    resolved = filter_trackers(["all", custom], tmp_path)
    assert resolved[0] is custom
    installed = [
        LoggerType(name)
        for name in LOGGER_TYPE_TO_CLASS
        if name in LoggerType.list() and _importable(name)
    ]
    assert sorted(resolved[1:]) == sorted(installed)
    assert resolved[1:] == get_available_trackers()


def _importable(name: str) -> bool:
    import importlib.util

    module = {"tensorboard": "tensorboard"}.get(name, name)
    return importlib.util.find_spec(module) is not None


def test_all_without_a_logging_directory_leaves_out_directory_trackers_with_a_warning():
    pytest.importorskip("tensorboard")
    with pytest.warns(UserWarning, match="leaves out 'tensorboard'"):
        resolved = filter_trackers(LoggerType.ALL)
    assert LoggerType.TENSORBOARD not in resolved
    assert LoggerType.AIM not in resolved


def test_an_unknown_name_is_a_clear_error():
    with pytest.raises(ValueError, match="Unsupported logging capability: 'tensorbored'"):
        filter_trackers([RecordingTracker(), "tensorbored"], "/tmp")
    with pytest.raises(ValueError, match="Unsupported logging capability"):
        filter_trackers([42])


def test_a_tracker_needing_a_directory_without_one_is_a_clear_error():
    pytest.importorskip("tensorboard")
    # the reference's key phrase, then what to do
    with pytest.raises(
        ValueError, match="Logging with `tensorboard` requires a `logging_dir`.*project_dir"
    ):
        filter_trackers("tensorboard")


@pytest.mark.parametrize("tracker, package", [("aim", "aim"), ("wandb", "wandb")])
def test_a_tracker_whose_package_is_missing_names_the_package(monkeypatch, tracker, package):
    # `sys.modules[name] = None` is Python's documented way to make a module unimportable.
    monkeypatch.setitem(sys.modules, package, None)
    with pytest.raises(ImportError, match=f"pip install '{package}"):
        filter_trackers(tracker, "/tmp")
    assert LoggerType(tracker) not in filter_trackers("all", "/tmp")


def test_the_hub_warns_when_nothing_it_was_given_is_installed(monkeypatch):
    for name in [*LOGGER_TYPE_TO_CLASS, "tensorboardX"]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.warns(UserWarning, match="none of its trackers is installed"):
        hub = TrackerHub("all", "/tmp")
    assert hub.log_with == []


# -- the tracker contract ----------------------------------------------------------------------------


def test_a_tracker_class_missing_required_attributes_cannot_be_built():
    class Incomplete(GeneralTracker):
        pass

    with pytest.raises(
        NotImplementedError, match="`name`, `requires_logging_directory`, `tracker`"
    ):
        Incomplete()


def test_a_custom_tracker_gets_start_config_log_and_finish_in_order():
    custom = RecordingTracker()
    hub = TrackerHub([custom])
    hub.init_trackers("project", config={"lr": 0.1})
    hub.log({"loss": 1.0}, step=2, log_kwargs={"recording": {"commit": True}, "other": {"x": 1}})
    hub.end_training()
    assert custom.calls == [
        ("start",),
        ("config", {"lr": 0.1}),
        ("log", {"loss": 1.0}, 2, {"commit": True}),
        ("finish",),
    ]
    assert hub.get_tracker("recording") is custom
    assert hub.get_tracker("recording", unwrap=True) is custom.calls


def test_a_registered_tracker_class_is_built_by_name_with_its_init_kwargs():
    class Registered(RecordingTracker):
        name = "registered_for_test"

    register_tracker_class(Registered)
    try:
        hub = TrackerHub(["registered_for_test"])
        hub.init_trackers("my_project", init_kwargs={"registered_for_test": {"color": "red"}})
        tracker = hub.get_tracker("registered_for_test")
        assert isinstance(tracker, Registered)
        assert (tracker.run_name, tracker.init_kwargs) == ("my_project", {"color": "red"})
        assert tracker.calls == [("start",)]
    finally:
        LOGGER_TYPE_TO_CLASS.pop("registered_for_test")


def test_register_tracker_class_rejects_what_is_not_a_tracker_class():
    with pytest.raises(ValueError, match="subclass of GeneralTracker"):
        register_tracker_class(RecordingTracker())

    class Nameless(GeneralTracker):
        requires_logging_directory = False

    with pytest.raises(ValueError, match="non-empty `name`"):
        register_tracker_class(Nameless)


def test_get_tracker_before_init_gives_a_stand_in_and_an_unknown_name_after_init_raises():
    custom = RecordingTracker()
    hub = TrackerHub([custom])
    assert isinstance(hub.get_tracker("recording"), NoOpTracker)
    hub.init_trackers("p")
    with pytest.raises(ValueError, match="'wandb' is not one of the trackers"):
        hub.get_tracker("wandb")


def test_the_stand_in_accepts_any_call_and_unwraps_to_itself():
    stand_in = NoOpTracker("wandb")
    assert stand_in.log({"a": 1}, step=3) is None
    assert stand_in.log_images({"x": []}) is None
    assert stand_in.tracker is stand_in
    assert stand_in.tracker.add_scalar("loss", 1.0, 0) is None
    assert isinstance(stand_in, GeneralTracker)


def test_bad_values_and_kwargs_are_rejected_before_any_tracker_runs():
    custom = RecordingTracker()
    hub = TrackerHub([custom])
    with pytest.raises(TypeError, match="init_kwargs must be a dict"):
        hub.init_trackers("p", init_kwargs=["wandb"])
    with pytest.raises(TypeError, match="config must be a dict"):
        hub.init_trackers("p", config=[("lr", 1)])
    assert custom.calls == []
    hub.init_trackers("p")
    with pytest.raises(TypeError, match=r"log\(\) takes a dict"):
        hub.log(0.5, step=1)
    assert custom.calls == [("start",)]


# -- config values a tracker cannot store ------------------------------------------------------------


class Color(enum.Enum):
    RED = "red"


def test_storable_config_converts_what_json_cannot_hold_and_warns_for_lossy_conversions():
    with pytest.warns(UserWarning) as caught:
        stored = storable_config(
            {
                "lr": torch.tensor(0.5),
                "color": Color.RED,
                "path": pathlib.Path("/data/x"),
                "dtype": torch.float16,
                "layers": (1, 2),
                "nested": {"device": torch.device("cpu"), 3: None},
            },
            "Test",
        )
    assert stored == {
        "lr": 0.5,
        "color": "red",
        "path": "/data/x",
        "dtype": "torch.float16",
        "layers": [1, 2],
        "nested": {"device": "cpu", "3": None},
    }
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 2
    assert "'dtype'" in messages[0] and "torch.float16" in messages[0]
    assert "'nested.device'" in messages[1]


def test_flat_config_flattens_dicts_and_turns_lists_into_text():
    with pytest.warns(UserWarning, match="'model/sizes' \\(a list\\)"):
        flat = flat_config({"model": {"sizes": [4, 8], "act": "relu"}, "lr": 0.1}, "Test")
    assert flat == {"model/sizes": "[4, 8]", "model/act": "relu", "lr": 0.1}


def test_plain_config_needs_no_conversion_and_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert storable_config({"a": 1, "b": [1.5, "x"], "c": {"d": True}}, "Test") == {
            "a": 1,
            "b": [1.5, "x"],
            "c": {"d": True},
        }


# -- TensorBoard, for real ---------------------------------------------------------------------------


def _event_accumulator(path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(path))
    accumulator.Reload()
    return accumulator


def _tensorboard_hparams(run_dir):
    from tensorboard.plugins.hparams import plugin_data_pb2

    for folder in sorted(glob.glob(os.path.join(run_dir, "*"))):
        if not os.path.isdir(folder):
            continue
        try:
            content = _event_accumulator(folder).PluginTagToContent("hparams")
        except KeyError:
            continue
        data = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
        return {
            key: value.number_value if value.HasField("number_value") else value.string_value
            for key, value in data.session_start_info.hparams.items()
        }
    raise AssertionError(f"no hparams event file under {run_dir}")


def test_tensorboard_writes_scalars_texts_groups_and_hparams_that_tensorboard_reads(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.util import tensor_util

    hub = TrackerHub(["tensorboard"], logging_dir=lambda: str(tmp_path))
    with pytest.warns(UserWarning, match="'dtype'"):
        hub.init_trackers(
            "run_a",
            config={"lr": 0.01, "epochs": 3, "dtype": torch.bfloat16, "opt": {"name": "adam"}},
            init_kwargs={"tensorboard": {"flush_secs": 5}},
        )
    hub.log({"loss": torch.tensor(2.0), "note": "warming up"}, step=0)
    hub.log({"loss": 1.25, "acc": {"train": 0.5, "eval": 0.25}}, step=4)
    writer = hub.get_tracker("tensorboard", unwrap=True)
    assert writer.flush_secs == 5
    hub.end_training()

    run_dir = tmp_path / "run_a"
    events = _event_accumulator(run_dir)
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(0, 2.0), (4, 1.25)]
    [text] = events.Tensors("note/text_summary")
    assert (text.step, tensor_util.make_ndarray(text.tensor_proto).tolist()) == (0, [b"warming up"])
    grouped = _event_accumulator(run_dir / "acc_train").Scalars("acc")
    assert [(e.step, e.value) for e in grouped] == [(4, 0.5)]

    assert _tensorboard_hparams(run_dir) == {
        "lr": pytest.approx(0.01),
        "epochs": 3.0,
        "dtype": "torch.bfloat16",
        "opt/name": "adam",
    }
    [hparams_file] = glob.glob(str(run_dir / "*" / "hparams.yml"))
    with open(hparams_file) as handle:
        assert yaml.safe_load(handle) == {
            "lr": 0.01,
            "epochs": 3,
            "dtype": "torch.bfloat16",
            "opt": {"name": "adam"},
        }


def test_tensorboard_images_are_readable(tmp_path):
    pytest.importorskip("tensorboard")
    hub = TrackerHub("tensorboard", str(tmp_path))
    hub.init_trackers("images")
    images = torch.zeros(2, 3, 4, 5)
    images[:, 0] = 1.0
    hub.get_tracker("tensorboard").log_images({"samples": images}, step=7)
    hub.end_training()
    [record] = _event_accumulator(tmp_path / "images").Images("samples")
    # TensorBoard lays a batch out as a grid: 2 images of 4x5 side by side.
    assert (record.step, record.width, record.height) == (7, 2 * 5, 4)


def test_tensorboard_skips_values_it_cannot_log_with_a_warning(tmp_path):
    pytest.importorskip("tensorboard")
    tracker = TensorBoardTracker("skip", tmp_path)
    tracker.start()
    with pytest.warns(UserWarning, match="cannot log 'weights'"):
        tracker.log({"weights": torch.ones(3), "loss": 1.0}, step=1)
    tracker.finish()
    events = _event_accumulator(tmp_path / "skip")
    assert events.Tags()["scalars"] == ["loss"]
