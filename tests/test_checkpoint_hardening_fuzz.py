"""Fuzzing load_state with damaged and hostile checkpoint folders (issue 13, tests).

Hypothesis mutates a checkpoint that save_state wrote: truncation, byte flips, appended bytes,
missing and extra files, special files (FIFO, /dev/zero, folders, symlinks in and out of the
folder), type-confused manifest JSON (any field replaced by any JSON value), raw manifest damage,
and files rewritten consistently with their manifest entry (so only parsing and fit checks stand in
the way). Every outcome must be a correct load or a CheckpointError subclass with every object
untouched, and no load may hang (a 30 s alarm counts as a hang).

Counts are printed at the end (run with -s), and written as JSON to $CADENCE_FUZZ_REPORT if set.
$CADENCE_FUZZ_EXAMPLES sets the number of cases (default 300); $CADENCE_FUZZ_TRACE names a file
that receives each case before it runs.
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import signal
import tempfile

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

MANIFEST = "cadence_manifest.json"
FILES = [
    MANIFEST,
    "model.safetensors",
    "optimizer.bin",
    "scheduler.bin",
    "dl_state_dict_rank0.bin",
    "random_states_0.pkl",
]


_SCHEDULER_KEYS = set(
    torch.optim.lr_scheduler.StepLR(
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1), step_size=1
    ).state_dict()
)


class Hang(Exception):
    pass


def _alarm(*_):
    raise Hang()


def _build():
    from cadence import Accelerator

    torch.manual_seed(0)
    acc = Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Linear(5, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(2))
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4, shuffle=True
    )
    model, optimizer, loader, scheduler = acc.prepare(model, optimizer, loader, scheduler)
    for x, y in loader:
        acc.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    return acc, model, optimizer, loader, scheduler


def _state(acc, model, optimizer, loader, scheduler):
    import numpy as np

    # Scheduler keys of this torch version only: a consistently rewritten (so accepted) scheduler
    # file may add attributes that a later load does not remove.
    scheduler_state = {k: v for k, v in scheduler.state_dict().items() if k in _SCHEDULER_KEYS}
    return {
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "optimizer": copy.deepcopy(optimizer.state_dict()),
        "scheduler": copy.deepcopy(scheduler_state),
        "loader": copy.deepcopy(loader.state_dict()),
        "torch_rng": torch.get_rng_state().clone(),
        "python_rng": random.getstate(),
        "numpy_rng": np.random.get_state()[1].copy().tolist(),
        "step": acc.step,
    }


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return (
            isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(_same(x, y) for x, y in zip(a, b))
        )
    return a == b


def _perturb(acc, model, optimizer, scheduler, seed):
    """Make every object differ from the checkpoint, so an unwanted change shows."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
        for entry in optimizer.state.values():
            for value in entry.values():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    value.add_(0.25)
    scheduler.scheduler.last_epoch += 1
    torch.manual_seed(seed)
    random.seed(seed)
    acc.step += 1


# ----------------------------------------------------------------------------- mutations
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["/etc/passwd", "../x", "model.safetensors", "xxh3_128", "a/../../b"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
file_choice = st.sampled_from(FILES)
fraction = st.floats(min_value=0.0, max_value=1.0)
RAW_MANIFESTS = [
    "",
    "null",
    "{}",
    "[]",
    "[" * 100_000,
    '{"format": "cadence-checkpoint", "format_version": 1e400}',
    "\x00\x01\x02",
]
mutation = st.one_of(
    st.tuples(st.just("truncate"), file_choice, fraction),
    st.tuples(st.just("flip"), file_choice, fraction, st.integers(0, 7)),
    st.tuples(st.just("append"), file_choice, st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("delete"), file_choice),
    st.tuples(
        st.just("extra"),
        st.sampled_from(["x.bin", "sub/y.bin", ".hidden", "model.safetensors.tmp"]),
        st.binary(max_size=64),
    ),
    st.tuples(
        st.just("special"),
        file_choice,
        st.sampled_from(["fifo", "dev_zero", "folder", "link_outside", "link_inside"]),
    ),
    st.tuples(st.just("json"), st.lists(st.integers(0, 40), min_size=1, max_size=4), json_values),
    st.tuples(st.just("raw"), st.sampled_from(range(len(RAW_MANIFESTS)))),
    st.tuples(st.just("number"), st.sampled_from(["1e400", "-1", "9" * 30, "1.5", "true"])),
    st.tuples(st.just("consistent"), file_choice, fraction, st.integers(0, 7)),
)


def _flip(path, where, bit):
    data = bytearray(open(path, "rb").read())
    if data:
        i = min(int(where * len(data)), len(data) - 1)
        data[i] ^= 1 << bit
        open(path, "wb").write(bytes(data))


def _regular(path) -> bool:
    return os.path.isfile(path) and not os.path.islink(path)  # never open a FIFO made earlier


def _manifest(folder):
    if not _regular(os.path.join(folder, MANIFEST)):
        return None
    try:
        return json.loads(open(os.path.join(folder, MANIFEST)).read())
    except (OSError, ValueError, RecursionError):
        return None


def _write_manifest(folder, data=None, text=None):
    path = os.path.join(folder, MANIFEST)
    if os.path.lexists(path) and not _regular(path):
        return
    with open(path, "w") as f:
        f.write(text if text is not None else json.dumps(data))


def _replace_at(data, path, value):
    node = data
    for depth, index in enumerate(path):
        if isinstance(node, dict) and node:
            key = sorted(node)[index % len(node)]
        elif isinstance(node, list) and node:
            key = index % len(node)
        else:
            return data
        if depth == len(path) - 1 or not isinstance(node[key], (dict, list)) or not node[key]:
            node[key] = value
            return data
        node = node[key]
    return data


def _apply(folder, outside, op) -> bool:
    """Apply one mutation; True when it rewrote a file consistently with its manifest entry."""
    kind = op[0]
    path = os.path.join(folder, op[1]) if kind not in ("json", "raw", "number") else None
    regular = path is not None and _regular(path)
    if kind == "truncate" and regular:
        size = os.path.getsize(path)
        os.truncate(path, int(op[2] * size))
    elif kind == "flip" and regular:
        _flip(path, op[2], op[3])
    elif kind == "append" and regular:
        with open(path, "ab") as f:
            f.write(op[2])
    elif kind == "delete" and os.path.lexists(path):
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
    elif kind == "extra":
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.lexists(path):
            open(path, "wb").write(op[2])
    elif kind == "special" and os.path.lexists(path):
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
        how = op[2]
        if how == "fifo":
            os.mkfifo(path)
        elif how == "dev_zero":
            os.symlink("/dev/zero", path)
        elif how == "folder":
            os.mkdir(path)
        elif how == "link_outside":
            open(outside, "wb").write(b"outside" * 10)
            os.symlink(outside, path)
        else:
            os.symlink("scheduler.bin", path)
    elif kind == "json":
        data = _manifest(folder)
        if data is not None:
            _write_manifest(folder, _replace_at(data, op[1], op[2]))
    elif kind == "raw":
        _write_manifest(folder, text=RAW_MANIFESTS[op[1]])
    elif kind == "number":
        data = _manifest(folder)
        if isinstance(data, dict) and isinstance(data.get("files"), dict) and data["files"]:
            name = sorted(data["files"])[0]
            if isinstance(data["files"][name], dict):
                data["files"][name]["size"] = 777777
                _write_manifest(folder, text=json.dumps(data).replace("777777", op[1]))
    elif kind == "consistent" and regular and op[1] != MANIFEST:
        _flip(path, op[2], op[3])
        data = _manifest(folder)
        files = data.get("files") if isinstance(data, dict) else None
        entry = files.get(op[1]) if isinstance(files, dict) else None
        if isinstance(entry, dict) and data.get("checksum_algorithm") in ("xxh3_128", "sha256"):
            from cadence.checkpointing.checksums import new_hasher

            hasher = new_hasher(data["checksum_algorithm"])
            content = open(path, "rb").read()
            hasher.update(content)
            entry["checksum"], entry["size"] = hasher.hexdigest(), len(content)
            _write_manifest(folder, data)
            return True
    return False


# ----------------------------------------------------------------------------- the test
def test_fuzzed_checkpoints_load_correctly_or_fail_cleanly():
    from cadence.checkpointing import CheckpointError
    from cadence.state import reset_state

    reset_state()
    job = _build()
    acc, model, optimizer, loader, scheduler = job
    root = tempfile.mkdtemp(prefix="cadence-fuzz-")
    base = os.path.join(root, "base")
    acc.save_state(base)
    saved = _state(*job)
    counts = {"tried": 0, "loaded": 0, "refused": 0, "hangs": 0, "changed": 0, "other": 0}
    surprises: list[str] = []
    examples = int(os.environ.get("CADENCE_FUZZ_EXAMPLES", "300"))

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(mutation, min_size=1, max_size=3), st.integers(0, 2**16))
    def case(ops, seed):
        counts["tried"] += 1
        folder = os.path.join(root, f"case{counts['tried']}")
        shutil.copytree(base, folder)
        consistent = False
        for op in ops:
            consistent |= _apply(folder, os.path.join(root, "outside.bin"), op)
        trace = os.environ.get("CADENCE_FUZZ_TRACE")
        if trace:  # the case about to run, for finding one that hangs or crashes the process
            with open(trace, "a") as f:
                f.write(f"{counts['tried']} {ops!r}\n")
        _perturb(acc, model, optimizer, scheduler, seed)
        before = _state(*job)
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(30)
        outcome = None
        try:
            acc.load_state(folder)
            outcome = "loaded"
        except CheckpointError:
            outcome = "refused"
        except Hang:
            outcome = "hang"
        except Exception as e:  # any other type is a failure of the contract
            outcome = "other"
            surprises.append(f"{ops!r}: {type(e).__name__}: {str(e)[:200]}")
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        after = _state(*job)
        if outcome == "loaded":
            counts["loaded"] += 1
            # A consistent rewrite is another valid checkpoint: only its model may differ.
            expected = saved if not consistent else after
            differ = [k for k in after if not _same(after[k], expected[k])]
            if not consistent and differ:
                counts["changed"] += 1
                surprises.append(f"{ops!r}: loaded, but {differ} differ from the checkpoint")
        elif outcome == "refused":
            counts["refused"] += 1
            differ = [k for k in after if not _same(after[k], before[k])]
            if differ:
                counts["changed"] += 1
                surprises.append(f"{ops!r}: refused, but {differ} changed")
        elif outcome == "hang":
            counts["hangs"] += 1
            surprises.append(f"{ops!r}: hang")
        else:
            counts["other"] += 1
        shutil.rmtree(folder, ignore_errors=True)

    try:
        case()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nfuzz counts: {counts}")
    report = os.environ.get("CADENCE_FUZZ_REPORT")
    if report:
        with open(report, "w") as f:
            json.dump({"counts": counts, "surprises": surprises[:50]}, f, indent=1)
    assert counts["tried"] >= min(examples, 50)
    assert counts["refused"] > 0 and counts["loaded"] > 0
    assert not surprises, "\n".join(surprises[:20])
