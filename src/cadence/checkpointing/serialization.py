"""Safe reading and writing of tensors and state.

Weights go to safetensors (no code can hide in them). Everything else goes through `torch.save` and
comes back through `torch.load(weights_only=True)`, which rebuilds tensors, containers and plain
values only (numpy arrays and dtypes are allowed too: they are data). A file that needs real
unpickling is refused unless the caller opts in with `allow_pickle=True`.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import random
import threading
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..xla import runtime as xla_runtime
from .checksums import new_hasher
from .errors import CheckpointCorruptError, UnsafeCheckpointError
from .safe_io import RandomAccessFile, buffer_view

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

SAFETENSORS_METADATA = {"format": "pt"}


# --------------------------------------------------------------------------- shared tensors
def _storage_key(tensor: torch.Tensor):
    try:
        storage = tensor.untyped_storage()
        return (tensor.device, storage.data_ptr(), storage.nbytes())
    except (NotImplementedError, RuntimeError):
        return None  # meta or tensor subclasses without storage: never treated as shared


def _view_key(tensor: torch.Tensor):
    return (tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)


def dedupe_shared_tensors(
    state_dict: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, str]]:
    """Make a state dict storable by safetensors, which refuses tensors that share memory.

    Exact aliases (tied weights: same memory, same view) keep only their first name, as the
    reference does; the returned map says which name each dropped one aliased. Tensors that share
    memory but are different views (slices of one buffer) are copied instead of dropped, so no data
    is lost.
    """
    import torch

    out: dict[str, Any] = {}
    removed: dict[str, str] = {}
    first_by_storage: dict[Any, dict[Any, str]] = {}
    for name, value in state_dict.items():
        if not isinstance(value, torch.Tensor) or value.device.type == "meta":
            out[name] = value
            continue
        key = _storage_key(value)
        if key is None:
            out[name] = value
            continue
        views = first_by_storage.setdefault(key, {})
        view = _view_key(value)
        if view in views:
            removed[name] = views[view]
            continue
        if views:  # a different view of memory already stored: store a copy
            value = value.clone()
        views[view] = name
        out[name] = value
    if removed:
        # Debug, not a warning: tied weights are normal (every language model ties its embeddings).
        logger.debug(
            "Removed shared tensor(s) %s while saving (they alias %s); they are restored from "
            "the tensor they share memory with when loaded into the same model.",
            sorted(removed),
            sorted(set(removed.values())),
        )
    return out, removed


# --------------------------------------------------------------------------- safetensors
def _is_tensor_dict(obj: Any) -> bool:
    import torch

    return isinstance(obj, Mapping) and all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()
    )


def write_safetensors(
    path: str | os.PathLike,
    tensors: Mapping[str, torch.Tensor],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write a dict of tensors as safetensors (aliases removed, views made contiguous)."""
    from safetensors.torch import save_file

    if not _is_tensor_dict(tensors):
        bad = (
            type(tensors).__name__
            if not isinstance(tensors, Mapping)
            else ", ".join(
                f"{k!r}: {type(v).__name__}"
                for k, v in tensors.items()
                if not isinstance(k, str) or type(v).__module__.split(".")[0] != "torch"
            )[:300]
        )
        raise TypeError(
            f"safetensors stores a dict of str -> torch.Tensor only; got {bad}. Save other state "
            "with safe_serialization=False (torch.save, loaded back with weights_only=True)."
        )
    clean, _ = dedupe_shared_tensors(tensors)
    clean = {k: v if v.is_contiguous() else v.contiguous() for k, v in clean.items()}
    meta = dict(SAFETENSORS_METADATA if metadata is None else metadata)
    save_file(clean, os.fspath(path), metadata=meta)


def read_safetensors(path: str | os.PathLike, device: str | int = "cpu") -> dict[str, torch.Tensor]:
    """Load the tensors of a safetensors file onto `device`; a bad file raises a clear error."""
    from safetensors.torch import load_file

    try:
        return load_file(os.fspath(path), device=device)
    except FileNotFoundError:
        raise
    except Exception as e:  # safetensors raises its own error types for bad headers
        raise CheckpointCorruptError(
            f"Cannot read safetensors file {path}: {e}", path=Path(path).parent
        ) from e


# --------------------------------------------------------------------------- torch.save / load
@contextmanager
def _torch_save_without_crc():
    """Our manifest checksums the whole file, so torch's per-record CRC is redundant and slow."""
    try:
        from torch.utils.serialization import config
    except ImportError:
        yield
        return
    with config.patch({"save.compute_crc32": False}):
        yield


def write_torch(path: str | os.PathLike, obj: Any) -> None:
    """torch.save into a checkpoint folder (the folder-level manifest replaces torch's CRC)."""
    import torch

    with _torch_save_without_crc():
        torch.save(obj, os.fspath(path))


class _HashingWriter:
    """The file object torch.save writes to: each chunk goes to the file and into the hasher,
    so the file's checksum is computed from the bytes written, in the same pass."""

    def __init__(self, fd: int, hasher: Any) -> None:
        self._fd = fd
        self._hasher = hasher
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._hasher.update(view)
        done = 0
        while done < len(view):
            done += os.write(self._fd, view[done : done + (64 << 20)])
        self.size += len(view)
        return len(view)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        # torch's zip writer only skips forward over padding: write the zeros (they are hashed)
        target = offset if whence == io.SEEK_SET else self.size + offset
        if target < self.size:
            raise io.UnsupportedOperation("the checkpoint writer only moves forward")
        if target > self.size:
            self.write(bytes(target - self.size))
        return self.size

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        pass


def write_torch_hashed(path: str | os.PathLike, obj: Any, algorithm: str) -> tuple[int, str]:
    """torch.save `obj` to `path` (torch's CRC off, as write_torch) and return (size, checksum of
    `algorithm`) of the bytes written, hashed while they are written. Not fsynced."""
    import torch

    hasher = new_hasher(algorithm)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        out = _HashingWriter(fd, hasher)
        with _torch_save_without_crc():
            torch.save(obj, out)
    finally:
        os.close(fd)
    return out.size, hasher.hexdigest()


def _numpy_safe_globals() -> list:
    try:
        import numpy as np
    except ImportError:
        return []
    core = getattr(np, "_core", None) or np.core
    allowed = [np.ndarray, np.dtype, core.multiarray._reconstruct, core.multiarray.scalar]
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        allowed += [getattr(dtypes, n) for n in dir(dtypes) if n.endswith("DType")]
    return allowed


def _describe_source(f) -> str:
    return os.fspath(f) if isinstance(f, (str, os.PathLike)) else repr(f)


def read_torch(
    f: str | os.PathLike | io.IOBase,
    map_location: Any = None,
    *,
    allow_pickle: bool = False,
    source: str | None = None,
    **torch_load_kwargs: Any,
) -> Any:
    """torch.load with weights_only=True; arbitrary unpickling only with `allow_pickle=True`.

    Passing weights_only=False in `torch_load_kwargs` counts as the opt-in too (it is what
    `load_state(load_kwargs={"weights_only": False})` passes down). `source` names the file in
    errors when `f` is an in-memory buffer.
    """
    import torch

    weights_only = torch_load_kwargs.pop("weights_only", None)
    if weights_only is False:
        allow_pickle = True
    source = source or _describe_source(f)
    if allow_pickle:
        torch_load_kwargs.pop("mmap", None)
        try:
            return torch.load(f, map_location=map_location, weights_only=False, **torch_load_kwargs)
        except (pickle.UnpicklingError, EOFError) as e:
            raise CheckpointCorruptError(f"Cannot read {source}: {e}") from e
        except RuntimeError as e:
            if "PytorchStreamReader" in str(e) or "zip archive" in str(e):
                raise CheckpointCorruptError(f"Cannot read {source}: {e}") from e
            raise
    return _read_with(
        lambda f, m, weights_only: torch.load(
            f, map_location=m, weights_only=True, **torch_load_kwargs
        ),
        f,
        map_location,
        source,
    )


def _read_with(load, f: Any, map_location: Any, source: str) -> Any:
    """load(f, map_location, weights_only=True) with numpy's data types allowed, every failure
    turned into a CheckpointCorruptError, and a refused Python object into UnsafeCheckpointError."""
    import torch

    try:
        with torch.serialization.safe_globals(_numpy_safe_globals()):
            return load(f, map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        if "Weights only load failed" not in str(e):
            raise CheckpointCorruptError(f"Cannot read {source}: {e}") from e
        unsafe = _unsafe_globals(f)
        raise UnsafeCheckpointError(
            f"Refusing to load {source}: it holds Python objects"
            + (f" ({', '.join(unsafe[:5])})" if unsafe else "")
            + " that only full unpickling can restore, and unpickling can run arbitrary code. "
            "If you trust this file, opt in with allow_pickle=True (for Accelerator.load_state: "
            "load_state(..., allow_pickle=True), or load_kwargs={'weights_only': False}).",
            path=Path(source).parent,
        ) from e
    except (EOFError, UnicodeDecodeError, KeyError, IndexError, TypeError, AttributeError) as e:
        raise CheckpointCorruptError(f"Cannot read {source}: {type(e).__name__}: {e}") from e
    except (RuntimeError, ValueError) as e:
        # weights_only=True: any failure is a malformed file, not a bug to surface as is
        raise CheckpointCorruptError(f"Cannot read {source}: {e}") from e


class BufferFile(RandomAccessFile):
    """A read-only, seekable file over a memoryview, without copying it (io.BytesIO would)."""

    def __init__(self, view: memoryview) -> None:
        self._view = view.cast("B") if view.format != "B" else view
        super().__init__(len(self._view))

    def readinto(self, b) -> int:
        chunk = self._view[self._pos : self._pos + len(b)]
        n = len(chunk)
        memoryview(b).cast("B")[:n] = chunk
        self._pos += n
        return n


def _zero_copy_loader():
    """torch's internal loader that takes the storage tensors are cut from (what mmap=True uses);
    None when this torch has no such parameter (then records are copied out of the buffer)."""
    import inspect

    import torch

    load = getattr(torch.serialization, "_load", None)
    try:
        if load is not None and "overall_storage" in inspect.signature(load).parameters:
            return load
    except (TypeError, ValueError):
        pass
    return None


def read_torch_buffer(
    buffer: torch.Tensor,
    map_location: Any = None,
    *,
    source: str,
    allow_pickle: bool = False,
    **torch_load_kwargs: Any,
) -> Any:
    """What torch.save wrote, deserialized from `buffer` (a uint8 tensor holding the whole, already
    verified file, or a verified torch_file.SegmentedFile) with weights_only=True unless `allow_pickle`.

    The tensors of a weights-only load are views of `buffer` (no copy, nothing maps the file), the
    way torch.load(mmap=True) cuts them out of a mapping; other loads copy them out of it.
    """
    import torch

    # One uint8 tensor holding the file, or a SegmentedFile (records in tensors of their own).
    whole = isinstance(buffer, torch.Tensor)

    def as_file() -> Any:
        return BufferFile(buffer_view(buffer)) if whole else buffer.open()

    loader = _zero_copy_loader()
    plain_cpu = map_location in (None, "cpu") or map_location == torch.device("cpu")
    if allow_pickle or torch_load_kwargs or loader is None or not plain_cpu:
        return read_torch(
            as_file(), map_location, allow_pickle=allow_pickle, source=source, **torch_load_kwargs
        )
    try:
        reader = torch._C.PyTorchFileReader(as_file())
    except RuntimeError as e:
        raise CheckpointCorruptError(f"Cannot read {source}: {e}") from e

    def weights_only_load(f, map_location, weights_only, **_):
        try:
            return loader(
                reader,
                map_location,
                torch._weights_only_unpickler,
                overall_storage=buffer.untyped_storage() if whole else buffer.storage(),
                encoding="utf-8",
            )
        except pickle.UnpicklingError as e:
            # the wording read_torch recognises (and torch.load uses) for a refused global
            raise pickle.UnpicklingError(f"Weights only load failed. {e}") from None

    return _read_with(weights_only_load, as_file(), map_location, source)


def _unsafe_globals(f) -> list[str]:
    import torch

    try:
        if not isinstance(f, (str, os.PathLike)):
            f.seek(0)
            return list(torch.serialization.get_unsafe_globals_in_checkpoint(f))
        return list(torch.serialization.get_unsafe_globals_in_checkpoint(os.fspath(f)))
    except Exception:
        return []


# --------------------------------------------------------------------------- public save / load
def save(obj: Any, f: str | os.PathLike | io.IOBase, safe_serialization: bool = False) -> None:
    """Write `obj` to `f` in place of torch.save; safetensors when `safe_serialization`.

    A path is written atomically (temporary file, then rename), so readers never see half a file.
    Who writes (once per machine or per node) is the caller's decision.
    """
    import torch

    if (
        xla_runtime.loaded()
    ):  # as the reference's xm.save: files hold CPU tensors, readable anywhere
        obj = _xla_tensors_to_cpu(obj)
    if safe_serialization:
        if not _is_tensor_dict(obj):
            raise TypeError(
                "save(..., safe_serialization=True) stores a dict of str -> torch.Tensor only, "
                f"got {type(obj).__name__}. Use safe_serialization=False for other objects."
            )
        if isinstance(f, (str, os.PathLike)):
            _replace_atomically(f, lambda tmp: write_safetensors(tmp, obj))
        else:
            from safetensors.torch import save as to_bytes

            clean, _ = dedupe_shared_tensors(obj)
            clean = {k: v.contiguous() for k, v in clean.items()}
            f.write(to_bytes(clean, metadata=dict(SAFETENSORS_METADATA)))
        return
    if isinstance(f, (str, os.PathLike)):
        _replace_atomically(f, lambda tmp: torch.save(obj, tmp))
    else:
        torch.save(obj, f)


def _xla_tensors_to_cpu(obj: Any) -> Any:
    """`obj` with every tensor on an XLA device replaced by a CPU copy (nesting kept)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu") if obj.device.type == "xla" else obj
    if isinstance(obj, Mapping):
        return type(obj)({key: _xla_tensors_to_cpu(value) for key, value in obj.items()})
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_xla_tensors_to_cpu(item) for item in obj)
    return obj


def _replace_atomically(path: str | os.PathLike, write) -> None:
    """Call write(temporary path) next to `path`, then rename over `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}-{threading.get_ident()}")
    try:
        write(os.fspath(tmp))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load(
    f: str | os.PathLike | io.IOBase,
    map_location: Any = None,
    *,
    allow_pickle: bool = False,
    **torch_load_kwargs: Any,
) -> Any:
    """Read what `save` wrote: safetensors files by their suffix, others via read_torch."""
    if isinstance(f, (str, os.PathLike)) and os.fspath(f).endswith(".safetensors"):
        device = "cpu" if map_location is None else map_location
        return read_safetensors(f, device=str(device) if not isinstance(device, int) else device)
    return read_torch(f, map_location, allow_pickle=allow_pickle, **torch_load_kwargs)


# --------------------------------------------------------------------------- model weights
def apply_model_state(
    model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor], strict: bool = True
) -> tuple[list[str], list[str]]:
    """model.load_state_dict that knows tied weights: a key missing from the file because it aliases
    another parameter of the model (dropped at save time) is filled from that parameter's entry.

    Returns (missing_keys, unexpected_keys) like load_state_dict.
    """
    own = model.state_dict(keep_vars=True)
    state = dict(state_dict)
    by_storage: dict[Any, list[str]] = {}
    for name, tensor in own.items():
        key = _storage_key(tensor)
        if key is not None:
            by_storage.setdefault((key, _view_key(tensor)), []).append(name)
    for names in by_storage.values():
        present = [n for n in names if n in state]
        if present:
            for n in names:
                state.setdefault(n, state[present[0]])
    result = model.load_state_dict(state, strict=strict)
    return list(result.missing_keys), list(result.unexpected_keys)


# --------------------------------------------------------------------------- RNG state
def numpy_rng_record(numpy_state: tuple[Any, ...]) -> tuple[str, Any, int, int, float]:
    """numpy's `RandomState.get_state()` as a checkpoint stores it: the key array as an int64 tensor,
    so that the file loads with weights_only=True and no numpy global."""
    import numpy as np
    import torch

    kind, keys, pos, has_gauss, cached = numpy_state
    keys = torch.from_numpy(keys.astype(np.int64))
    return str(kind), keys, int(pos), int(has_gauss), float(cached)


def capture_rng_state(step: int | None = None) -> dict[str, Any]:
    """RNG states of this process (python, numpy, torch, accelerators) as tensors and plain values.

    Same keys as Accelerate's random_states file, but loadable with weights_only=True without
    any numpy global: the numpy key array is stored as a tensor.
    """
    import torch

    state: dict[str, Any] = {}
    if step is not None:
        state["step"] = int(step)
    state["random_state"] = random.getstate()
    try:
        import numpy as np

        state["numpy_random_seed"] = numpy_rng_record(np.random.get_state())
    except ImportError:
        pass
    state["torch_manual_seed"] = torch.get_rng_state()
    for device_type in _accelerator_types():
        module = getattr(torch, device_type)
        state[f"torch_{device_type}_manual_seed"] = module.get_rng_state_all()
    if xla_runtime.loaded():  # the XLA generator, under the reference's key
        state["xm_seed"] = xla_runtime.get_rng_state()
    return state


def _accelerator_types() -> list[str]:
    import torch

    found = []
    for device_type in ("cuda", "xpu", "mlu", "npu", "musa", "hpu"):
        module = getattr(torch, device_type, None)
        try:
            if module is not None and module.is_available():
                found.append(device_type)
        except Exception:
            continue
    return found


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Inverse of capture_rng_state. Accelerator states are restored when the device is present."""
    import torch

    version, internal, gauss = state["random_state"]
    random.setstate((version, tuple(internal), gauss))
    if "numpy_random_seed" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy_random_seed"]
        keys = keys.numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
        np.random.set_state((kind, keys.astype(np.uint32), int(pos), int(has_gauss), float(cached)))
    torch.set_rng_state(state["torch_manual_seed"])
    if "xm_seed" in state:
        if xla_runtime.loaded():
            xla_runtime.set_rng_state(int(state["xm_seed"]))
        else:
            logger.warning("Checkpoint has an XLA RNG state but torch_xla is not in use; skipped.")
    for key, value in state.items():
        if key.startswith("torch_") and key.endswith("_manual_seed") and key != "torch_manual_seed":
            device_type = key[len("torch_") : -len("_manual_seed")]
            module = getattr(torch, device_type, None)
            try:
                available = module is not None and module.is_available()
            except Exception:
                available = False
            if available:
                module.set_rng_state_all(value)
            else:
                logger.warning(
                    "Checkpoint has %s RNG state but no %s device is available; skipped.",
                    device_type,
                    device_type,
                )
