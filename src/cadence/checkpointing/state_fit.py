"""Does a loaded state fit the object it goes into? And applying several states all-or-nothing.

`load_state` reads every file, then asks these checks about every state (keys, shapes, dtypes,
optimizer param-group structure, dataloader and RNG layouts) and raises one CheckpointMismatchError
naming all problems before any object changes. `apply_all` then applies the states in order; if one
still fails (a custom load_state_dict raising), the ones already applied are restored from
snapshots taken just before, so an object is never left half-loaded.

Every function takes the objects and states explicitly: no Accelerator.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import CheckpointMismatchError, describe_problems
from .serialization import _storage_key, _view_key

if TYPE_CHECKING:
    import torch

# Per-parameter optimizer states of torch.optim's built-in optimizers that have the parameter's shape.
_PARAM_SHAPED_STATES = {
    "exp_avg",
    "exp_avg_sq",
    "max_exp_avg_sq",
    "momentum_buffer",
    "square_avg",
    "acc_delta",
    "sum",
    "ax",
    "prev",
    "grad_avg",
    "exp_inf",
    "mu_product",
}


def _kind(dtype) -> str:
    if dtype.is_complex:
        return "complex"
    if dtype.is_floating_point:
        return "floating"
    return "bool" if str(dtype) == "torch.bool" else "integer"


def _storage_aliases(own: Mapping[str, Any]) -> dict[str, list[str]]:

    groups: dict[Any, list[str]] = {}
    for name, tensor in own.items():
        key = _storage_key(tensor) if hasattr(tensor, "untyped_storage") else None
        if key is not None:
            groups.setdefault((key, _view_key(tensor)), []).append(name)
    return {n: names for names in groups.values() for n in names}


def model_state_problems(
    model: torch.nn.Module, state: Any, strict: bool = True, label: str = "model"
) -> list[str]:
    """What keeps `state` from loading into `model` (with load_state_dict(strict)): one line each."""
    import torch

    if not isinstance(state, Mapping):
        return [f"{label}: the saved weights are a {type(state).__name__}, not a dict of tensors"]
    own = model.state_dict(keep_vars=True)
    aliases = _storage_aliases({k: v for k, v in own.items() if isinstance(v, torch.Tensor)})
    problems = []
    if strict:
        missing = [
            k for k in own if k not in state and not any(a in state for a in aliases.get(k, ()))
        ]
        unexpected = [k for k in state if k not in own]
        if missing:
            problems.append(f"{label}: missing key(s) in the checkpoint: {', '.join(missing[:10])}")
        if unexpected:
            problems.append(
                f"{label}: unexpected key(s) in the checkpoint: {', '.join(map(str, unexpected[:10]))}"
            )
    for key, value in state.items():
        target = own.get(key)
        if not isinstance(target, torch.Tensor):
            continue
        if not isinstance(value, torch.Tensor):
            problems.append(
                f"{label}: {key} is a {type(value).__name__} in the checkpoint, not a tensor"
            )
        elif tuple(value.shape) != tuple(target.shape):
            problems.append(
                f"{label}: {key} has shape {tuple(value.shape)} in the checkpoint, "
                f"{tuple(target.shape)} in the model"
            )
        elif _kind(value.dtype) != _kind(target.dtype):
            problems.append(
                f"{label}: {key} is {value.dtype} in the checkpoint, {target.dtype} in the model"
            )
    return problems


def optimizer_state_problems(
    optimizer: torch.optim.Optimizer, state: Any, label: str = "optimizer"
) -> list[str]:
    """What keeps `state` from loading into `optimizer`: structure, group sizes, per-parameter shapes."""
    import torch

    if (
        not isinstance(state, Mapping)
        or not isinstance(state.get("state"), Mapping)
        or not isinstance(state.get("param_groups"), Sequence)
    ):
        return [f"{label}: the saved state is not an optimizer state dict (state, param_groups)"]
    groups = state["param_groups"]
    own_groups = optimizer.param_groups
    if len(groups) != len(own_groups):
        return [
            f"{label}: loaded state dict has a different number of parameter groups "
            f"({len(groups)} saved, {len(own_groups)} in the optimizer)"
        ]
    problems = []
    id_to_param: dict[Any, Any] = {}
    for index, (group, own) in enumerate(zip(groups, own_groups)):
        params = group.get("params") if isinstance(group, Mapping) else None
        if not isinstance(params, Sequence):
            problems.append(f"{label}: parameter group {index} has no list of params")
            continue
        if len(params) != len(own["params"]):
            problems.append(
                f"{label}: parameter group {index} holds {len(params)} parameters in the "
                f"checkpoint, {len(own['params'])} in the optimizer"
            )
            continue
        for saved_id, param in zip(params, own["params"]):
            id_to_param[saved_id] = param
    if problems:
        return problems
    for saved_id, entry in state["state"].items():
        param = id_to_param.get(saved_id)
        if param is None:
            problems.append(f"{label}: state for parameter {saved_id!r}, which no group lists")
            continue
        if not isinstance(entry, Mapping):
            problems.append(f"{label}: state of parameter {saved_id!r} is not a dict")
            continue
        live = optimizer.state.get(param, {})
        for key, value in entry.items():
            if not isinstance(value, torch.Tensor):
                continue
            expected = None
            if isinstance(live.get(key), torch.Tensor) and live[key].dim() > 0:
                expected = tuple(live[key].shape)
            elif key in _PARAM_SHAPED_STATES and value.dim() > 0:
                expected = tuple(param.shape)
            if expected is not None and tuple(value.shape) != expected:
                problems.append(
                    f"{label}: {key} of parameter {saved_id!r} has shape {tuple(value.shape)}, "
                    f"expected {expected}"
                )
            elif (
                value.dim() > 0
                and _kind(value.dtype) != _kind(param.dtype)
                and key in _PARAM_SHAPED_STATES
            ):
                problems.append(f"{label}: {key} of parameter {saved_id!r} is {value.dtype}")
    return problems


def _lengths(state: Mapping, keys=("base_lrs", "_last_lr")) -> dict[str, int]:
    return {k: len(state[k]) for k in keys if isinstance(state.get(k), (list, tuple))}


def scheduler_state_problems(scheduler: Any, state: Any, label: str = "scheduler") -> list[str]:
    """A scheduler state must be a dict with one learning rate per parameter group of the scheduler."""
    if not isinstance(state, Mapping) or not all(isinstance(k, str) for k in state):
        return [f"{label}: the saved state is not a dict with string keys"]
    try:
        own = scheduler.state_dict()
    except Exception:  # a scheduler that cannot describe itself: nothing to compare with
        return []
    if not isinstance(own, Mapping):
        return []
    problems = []
    mine = _lengths(own)
    for key, n in _lengths(state).items():
        if key in mine and mine[key] != n:
            problems.append(
                f"{label}: {key} has {n} entries in the checkpoint, {mine[key]} for this scheduler's "
                "parameter groups"
            )
    return problems


def loader_checkpoint_state(loader: Any) -> Any:
    """What a checkpoint holds for `loader`: its `checkpoint_state_dict()` (a prepared loader's, which
    keeps Cadence's exact position beside a stateful loader's torchdata state), else `state_dict()`."""
    own = getattr(loader, "checkpoint_state_dict", None)
    return own() if callable(own) else loader.state_dict()


def loader_state_problems(loader: Any, state: Any, label: str = "dataloader") -> list[str]:
    """A dataloader position must have the layout of this loader's own checkpoint state."""
    import torch

    if not isinstance(state, Mapping):
        return [f"{label}: the saved position is a {type(state).__name__}, not a dict"]
    try:
        own = loader_checkpoint_state(loader)
    except Exception:
        return []
    exact = "_cadence_position"  # a stateful loader's exact position, beside torchdata's state
    if isinstance(own, Mapping) and isinstance(own.get(exact), Mapping) and exact in state:
        own, state = own[exact], state[exact]
        if not isinstance(state, Mapping):
            return [f"{label}: the saved exact position is a {type(state).__name__}, not a dict"]
    if not isinstance(own, Mapping) or "generator_names" not in own:
        return []  # not a Cadence loader: its load_state_dict checks its own format
    problems = []
    for key in ("epoch", "batches_yielded"):
        value = state.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            problems.append(f"{label}: '{key}' must be a non-negative int, got {str(value)[:40]}")
    if not isinstance(state.get("in_epoch"), bool):
        problems.append(f"{label}: 'in_epoch' must be true or false")
    saved_world = (state.get("global") or {}).get("num_processes")
    if saved_world is not None and saved_world != (own.get("global") or {}).get("num_processes"):
        # Saved on another number of processes: a single process shuffles without the generator
        # several share; the loader adopts it when loading (data/elastic.py).
        return problems
    if list(state.get("generator_names") or []) != list(own["generator_names"]):
        problems.append(
            f"{label}: the checkpoint has random generators {state.get('generator_names')!r}, "
            f"this loader {own['generator_names']!r} (different sampler or shuffle setting?)"
        )
    saved = state.get("generator_states")
    if not isinstance(saved, Sequence) or len(saved) != len(own["generator_states"]):
        problems.append(f"{label}: 'generator_states' does not match this loader's generators")
    else:
        for mine, theirs in zip(own["generator_states"], saved):
            if not isinstance(theirs, torch.Tensor) or theirs.shape != mine.shape:
                problems.append(f"{label}: a generator state has the wrong layout")
                break
    return problems


def rng_state_problems(state: Any, label: str = "RNG state") -> list[str]:
    """The layout of capture_rng_state()'s dict: python, numpy and torch generator states."""
    import torch

    if not isinstance(state, Mapping):
        return [f"{label}: not a dict"]
    problems = []
    py = state.get("random_state")
    internal = py[1] if isinstance(py, (list, tuple)) and len(py) == 3 else None
    if (
        internal is None
        or not isinstance(internal, (list, tuple))
        or len(internal) != len(random.getstate()[1])
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in internal)
    ):
        problems.append(f"{label}: 'random_state' is not a Python random state")
    own_torch = torch.get_rng_state()
    value = state.get("torch_manual_seed")
    if (
        not isinstance(value, torch.Tensor)
        or value.dtype != torch.uint8
        or value.shape != own_torch.shape
    ):
        problems.append(f"{label}: 'torch_manual_seed' is not a torch generator state")
    if "numpy_random_seed" in state:
        np_state = state["numpy_random_seed"]
        if not (
            isinstance(np_state, (list, tuple))
            and len(np_state) == 5
            and isinstance(np_state[0], str)
            and hasattr(np_state[1], "shape")
            and tuple(np_state[1].shape) == (624,)
        ):
            problems.append(f"{label}: 'numpy_random_seed' is not a numpy random state")
    step = state.get("step", 0)
    if isinstance(step, bool) or not isinstance(step, int):
        problems.append(f"{label}: 'step' must be an int")
    return problems


def raise_if_problems(path: Any, problems: list[str]) -> None:
    """One CheckpointMismatchError naming every problem (before anything is applied)."""
    if problems:
        raise CheckpointMismatchError(
            describe_problems(
                f"Checkpoint {path} does not fit the objects it would be loaded into; nothing "
                "was changed:",
                problems,
            )
            + "\nLoad it into the same models, optimizers, schedulers and dataloaders it was saved from.",
            path=path,
            problems=problems,
        )


# --------------------------------------------------------------------------- all-or-nothing apply
@dataclass
class ApplyStep:
    """One object's state: `apply()` loads it; `snapshot()` is called just before and returns a
    function that puts the object back as it was."""

    label: str
    apply: Callable[[], Any]
    snapshot: Callable[[], Callable[[], Any]]


def apply_all(steps: Sequence[ApplyStep], path: Any = None) -> None:
    """Apply every step in order; if one fails, restore the applied ones (newest first) and raise
    CheckpointMismatchError naming the step, chained to its error."""
    undo: list[tuple[str, Callable[[], Any]]] = []
    for step in steps:
        restore = step.snapshot()
        try:
            step.apply()
        except Exception as e:
            own_reset = ""
            try:
                restore()  # the failing object may have changed before it failed
            except Exception as again:
                own_reset = f" Resetting the {step.label} state itself failed too ({again})."
            failures = []
            for label, back in reversed(undo):
                try:
                    back()
                except Exception as again:  # keep restoring the others
                    failures.append(f"{label} ({again})")
            note = (
                " Every object applied before it was restored."
                if not failures
                else f" Could not restore: {', '.join(failures)}."
            )
            raise CheckpointMismatchError(
                f"Loading checkpoint {path} failed while applying the {step.label} state "
                f"({type(e).__name__}: {e}).{note}{own_reset}",
                path=path,
                problems=[f"{step.label}: {e}"],
            ) from e
        undo.append((step.label, restore))


def snapshot_state_dict(obj: Any) -> Callable[[], Any]:
    """Snapshot by a deep copy of obj.state_dict(); restore with obj.load_state_dict(copy)."""
    saved = copy.deepcopy(obj.state_dict())
    return lambda: obj.load_state_dict(saved)


def snapshot_loader(loader: Any) -> Callable[[], Any]:
    """Snapshot a dataloader by a copy of its checkpoint state (its exact position included)."""
    saved = copy.deepcopy(loader_checkpoint_state(loader))
    return lambda: loader.load_state_dict(saved)


def snapshot_optimizer(optimizer: Any) -> Callable[[], Any]:
    """Optimizer.load_state_dict replaces its state tensors instead of writing into them, so the
    current ones (referenced, not copied) are a snapshot for free."""
    saved = optimizer.state_dict()
    saved = {
        "state": {k: dict(v) for k, v in saved["state"].items()},
        "param_groups": copy.deepcopy(saved["param_groups"]),
    }
    return lambda: optimizer.load_state_dict(saved)


def _loads_plainly(model: Any) -> bool:
    import torch

    base = torch.nn.Module._load_from_state_dict
    for module in model.modules():
        if type(module)._load_from_state_dict is not base:
            return False
        if getattr(module, "_load_state_dict_pre_hooks", None) or getattr(
            module, "_load_state_dict_post_hooks", None
        ):
            return False
    return True


def snapshot_model(model: Any) -> Callable[[], Any]:
    """A restore function for `model`. Plain modules whose state was checked cannot fail half-way,
    so no copy is made for them; modules with their own loading code get a full copy."""
    if _loads_plainly(model):
        return lambda: None
    saved = {
        k: v.detach().clone() if hasattr(v, "detach") else copy.deepcopy(v)
        for k, v in model.state_dict().items()
    }
    return lambda: model.load_state_dict(saved, strict=False)
