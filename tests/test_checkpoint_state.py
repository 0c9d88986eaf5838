"""Accelerator.save_state / load_state on real processes: exact resume, rotation, hooks, safety."""

import os

import pytest
import torch

from harness import WorkerError


class Counter:
    """A user object registered for checkpointing."""

    def __init__(self):
        self.value = 0

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


class Opaque:
    pass


def build(
    project_dir=None, accumulation=2, mixed_precision="fp16", total_limit=None, automatic=False
):
    from cadence import Accelerator, GradScalerKwargs, ProjectConfiguration

    torch.manual_seed(0)
    config = ProjectConfiguration(
        project_dir=project_dir, automatic_checkpoint_naming=automatic, total_limit=total_limit
    )
    acc = Accelerator(
        gradient_accumulation_steps=accumulation,
        mixed_precision=mixed_precision,
        project_config=config,
        kwargs_handlers=[GradScalerKwargs(init_scale=256.0, growth_interval=2)],
    )
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(96, 4, generator=generator)
    y = x.sum(dim=1, keepdim=True)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=4, shuffle=True
    )
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.1), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.9)
    model, optimizer, loader, scheduler = acc.prepare(model, optimizer, loader, scheduler)
    return acc, model, optimizer, loader, scheduler


def run_batches(acc, model, optimizer, loader, scheduler, count, start_iterator=None):
    iterator = start_iterator if start_iterator is not None else iter(loader)
    seen = []
    for _ in range(count):
        try:
            x, y = next(iterator)
        except StopIteration:
            iterator = iter(loader)
            x, y = next(iterator)
        seen.append(x[0, 0].item())
        with acc.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            acc.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    return iterator, seen


def snapshot(acc, model):
    return {k: v.detach().clone() for k, v in acc.unwrap_model(model).state_dict().items()}


def resume_is_exact(directory):
    acc, model, optimizer, loader, scheduler = build()
    iterator, _ = run_batches(
        acc, model, optimizer, loader, scheduler, 10
    )  # mid-epoch, after a sync step
    acc.save_state(directory)
    _, seen_after = run_batches(
        acc, model, optimizer, loader, scheduler, 40, iterator
    )  # crosses an epoch
    expected = snapshot(acc, model)
    expected_scale = acc.scaler.get_scale()
    expected_lr = scheduler.get_last_lr()
    random_after = torch.rand(1).item()
    from cadence.state import reset_state

    reset_state()
    acc, model, optimizer, loader, scheduler = build()
    acc.load_state(directory)
    _, seen_resumed = run_batches(acc, model, optimizer, loader, scheduler, 40)
    resumed = snapshot(acc, model)
    return (
        all(torch.equal(expected[k], resumed[k]) for k in expected),
        seen_after == seen_resumed,
        expected_scale == acc.scaler.get_scale(),
        expected_lr == scheduler.get_last_lr(),
        random_after == torch.rand(1).item(),
    )


@pytest.mark.parametrize("n", [1, 2])
def test_resume_continues_exactly_where_the_save_was(dist_pool, tmp_path, n):
    for result in dist_pool(n).run(resume_is_exact, str(tmp_path / "ckpt")):
        assert result == (True, True, True, True, True)
    names = sorted(os.listdir(tmp_path / "ckpt"))
    assert "cadence_manifest.json" in names and "model.safetensors" in names
    assert "optimizer.bin" in names and "scheduler.bin" in names and "scaler.pt" in names
    assert [n_ for n_ in names if n_.startswith("random_states")] == [
        f"random_states_{r}.pkl" for r in range(n)
    ]


def rotation(project_dir):
    acc, model, optimizer, loader, scheduler = build(project_dir, automatic=True, total_limit=2)
    paths = []
    for _ in range(4):
        run_batches(acc, model, optimizer, loader, scheduler, 2)
        paths.append(acc.save_state())
    weights = snapshot(acc, model)
    run_batches(acc, model, optimizer, loader, scheduler, 3)
    acc.load_state()  # the newest complete checkpoint
    restored = snapshot(acc, model)
    next_path = acc.save_state()
    return (
        [os.path.basename(p) for p in paths],
        all(torch.equal(weights[k], restored[k]) for k in weights),
        os.path.basename(next_path),
    )


def test_automatic_naming_and_total_limit(dist_pool, tmp_path):
    names, restored, next_name = dist_pool(2).run(rotation, str(tmp_path))[0]
    assert names == ["checkpoint_0", "checkpoint_1", "checkpoint_2", "checkpoint_3"]
    assert restored and next_name == "checkpoint_4"
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["checkpoint_3", "checkpoint_4"]


def resume_numbering_after_restart(project_dir):
    acc, model, optimizer, loader, scheduler = build(project_dir, automatic=True)
    acc.save_state()
    acc.save_state()
    from cadence.state import reset_state

    reset_state()
    acc, model, optimizer, loader, scheduler = build(project_dir, automatic=True)
    acc.load_state()
    return os.path.basename(acc.save_state())


def test_resumed_run_continues_the_numbering(dist_pool, tmp_path):
    assert dist_pool(1).run(resume_numbering_after_restart, str(tmp_path))[0] == "checkpoint_2"


def hooks_and_custom_objects(directory):
    acc, model, optimizer, loader, scheduler = build()
    counter = Counter()
    acc.register_for_checkpointing(counter)
    calls = []

    def save_hook(models, weights, output_dir):
        calls.append(("save", len(models), sorted(weights[0]), os.path.isdir(output_dir)))
        with open(os.path.join(output_dir, "extra_config.json"), "w") as f:
            f.write("{}")

    def load_hook(models, input_dir):
        calls.append(("load", len(models), input_dir))

    save_handle = acc.register_save_state_pre_hook(save_hook)
    acc.register_load_state_pre_hook(load_hook)
    counter.value = 7
    acc.save_state(directory)
    names = sorted(os.listdir(directory))
    counter.value = 0
    acc.load_state(directory)
    save_handle.remove()
    acc.save_state(directory)  # no save hook any more
    try:
        acc.register_for_checkpointing(Opaque())
        refused = None
    except TypeError as error:
        refused = str(error)
    return counter.value, calls, refused, names


def test_hooks_and_registered_objects(dist_pool, tmp_path):
    directory = str(tmp_path / "ckpt")
    value, calls, refused, names = dist_pool(1).run(hooks_and_custom_objects, directory)[0]
    assert value == 7
    assert calls[0][0] == "save" and calls[0][1] == 1 and calls[0][3]
    assert calls[0][2] == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert calls[1] == ("load", 1, directory)
    assert len(calls) == 2
    assert "Opaque" in refused and "state_dict" in refused
    assert "extra_config.json" in names and "custom_checkpoint_0.pkl" in names


def corrupt_then_load(directory, damage):
    acc, model, optimizer, loader, scheduler = build()
    acc.save_state(directory)
    before = snapshot(acc, model)
    run_batches(acc, model, optimizer, loader, scheduler, 4)
    trained = snapshot(acc, model)
    path = os.path.join(directory, "optimizer.bin")
    if damage == "truncate":
        with open(path, "r+b") as f:
            f.truncate(10)
    elif damage == "flip":
        with open(path, "r+b") as f:
            f.seek(50)
            byte = f.read(1)
            f.seek(50)
            f.write(bytes([byte[0] ^ 0xFF]))
    elif damage == "manifest":
        os.remove(os.path.join(directory, "cadence_manifest.json"))
    try:
        acc.load_state(directory)
        message = None
    except Exception as error:  # noqa: BLE001
        message = f"{type(error).__name__}: {error}"
    unchanged = all(torch.equal(trained[k], snapshot(acc, model)[k]) for k in trained)
    return message, unchanged, all(torch.equal(before[k], trained[k]) for k in before)


@pytest.mark.parametrize(
    "damage, words",
    [("truncate", "optimizer.bin"), ("flip", "optimizer.bin"), ("manifest", "manifest")],
)
def test_damaged_checkpoint_is_refused_and_nothing_loads(dist_pool, tmp_path, damage, words):
    message, unchanged, _ = dist_pool(1).run(corrupt_then_load, str(tmp_path / "c"), damage)[0]
    assert message is not None and words in message.lower()
    assert unchanged


def pickle_refused(directory, allow):
    acc, model, optimizer, loader, scheduler = build()

    class Holder:
        def __init__(self):
            self.obj = None

        def state_dict(self):
            return {"obj": self.obj}

        def load_state_dict(self, state):
            self.obj = state["obj"]

    holder = Holder()
    holder.obj = Counter()  # an arbitrary class instance: needs pickle
    acc.register_for_checkpointing(holder)
    acc.save_state(directory)
    try:
        acc.load_state(directory, allow_pickle=allow)
        return "loaded", type(holder.obj).__name__
    except Exception as error:  # noqa: BLE001
        return type(error).__name__, str(error)


def test_pickles_need_an_explicit_opt_in(dist_pool, tmp_path):
    kind, message = dist_pool(1).run(pickle_refused, str(tmp_path / "a"), False)[0]
    assert kind != "loaded" and "custom_checkpoint_0.pkl" in message and "allow_pickle" in message
    assert dist_pool(1).run(pickle_refused, str(tmp_path / "b"), True)[0] == ("loaded", "Counter")


def bad_paths(tmp):
    from cadence import ProjectConfiguration

    acc, model, optimizer, loader, scheduler = build()
    errors = []
    for call in (
        lambda: acc.load_state(os.path.join(tmp, "missing")),
        lambda: acc.load_state(),
        lambda: acc.save_state(),
    ):
        try:
            call()
            errors.append(None)
        except Exception as error:  # noqa: BLE001
            errors.append(str(error))
    acc.project_configuration = ProjectConfiguration(project_dir=tmp, total_limit=2)
    try:
        acc.save_state(os.path.join(tmp, "x"))
    except ValueError as error:
        errors.append(str(error))
    return errors, os.listdir(tmp)


def test_bad_checkpoint_paths(dist_pool, tmp_path):
    errors, files = dist_pool(1).run(bad_paths, str(tmp_path))[0]
    assert "does not exist" in errors[0]
    assert "automatic checkpoint naming is disabled" in errors[1]
    assert "output_dir" in errors[2]
    assert "automatic_checkpoint_naming" in errors[3]
    assert files == []  # nothing was written


def async_then_load(directory):
    acc, model, optimizer, loader, scheduler = build()
    iterator, _ = run_batches(acc, model, optimizer, loader, scheduler, 5)
    saved = snapshot(acc, model)
    acc.save_state(directory, async_save=True)
    run_batches(acc, model, optimizer, loader, scheduler, 5, iterator)
    acc.load_state(directory)  # waits for the background save first
    restored = snapshot(acc, model)
    return all(torch.equal(saved[k], restored[k]) for k in saved)


def test_async_save_commits_and_loads(dist_pool, tmp_path):
    assert dist_pool(2).run(async_then_load, str(tmp_path / "async")) == [True, True]


def save_model_round_trip(directory):
    from cadence.checkpointing import load_checkpoint_in_model

    acc, model, optimizer, loader, scheduler = build(mixed_precision="no")
    acc.save_model(model, directory, max_shard_size=100)
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.1), torch.nn.Linear(8, 1))
    load_checkpoint_in_model(fresh, directory)
    original = acc.unwrap_model(model).state_dict()
    same = all(torch.equal(original[k], fresh.state_dict()[k]) for k in original)
    acc.save({"a": torch.ones(2)}, os.path.join(directory, "extra.pt"))
    return same, sorted(os.listdir(directory))


def test_save_model_shards_and_reloads(dist_pool, tmp_path):
    results = dist_pool(2).run(save_model_round_trip, str(tmp_path / "model"))
    same, names = results[0]
    assert same and results[1][0]
    assert "model.safetensors.index.json" in names and "extra.pt" in names
    assert len([n for n in names if n.startswith("model-")]) >= 2


def test_register_for_checkpointing_rejects_bad_objects(dist_pool):
    with pytest.raises(WorkerError, match="state_dict"):
        dist_pool(1).run(register_bad)


def register_bad():
    from cadence import Accelerator

    Accelerator().register_for_checkpointing(object())


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.head = torch.nn.Linear(3, 5, bias=False)
        self.head.weight = self.embed.weight


def tied_round_trip(directory):
    from cadence import Accelerator

    acc = Accelerator()
    model = acc.prepare(Tied())
    acc.save_state(directory)
    original = acc.unwrap_model(model).embed.weight.detach().clone()
    with torch.no_grad():
        acc.unwrap_model(model).embed.weight.zero_()
    acc.load_state(directory)
    inner = acc.unwrap_model(model)
    return torch.equal(inner.embed.weight, original), inner.head.weight is inner.embed.weight


def test_tied_weights_survive_a_strict_round_trip(dist_pool, tmp_path):
    assert dist_pool(1).run(tied_round_trip, str(tmp_path / "tied")) == [(True, True)]


def register_string():
    from cadence import Accelerator

    try:
        Accelerator().register_for_checkpointing("x")
    except ValueError as error:  # the reference's type (Cadence's error is also a TypeError)
        return isinstance(error, TypeError)
    return None


def test_register_for_checkpointing_error_is_a_value_error_too(dist_pool):
    assert dist_pool(1).run(register_string) == [True]
