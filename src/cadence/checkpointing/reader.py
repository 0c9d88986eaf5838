"""Reading a committed checkpoint, checking each file against the manifest while it loads.

Opening checks the manifest and every file's size (a stat each), so a truncated or incomplete
checkpoint fails before anything is read. With verify="full", each file's checksum is recomputed in
a background thread while the caller deserializes it; `finish()` waits and raises if any file read
was corrupt. Load everything first, call `finish()`, then apply: nothing is applied half-way.

    with open_checkpoint(path) as ckpt:
        weights = ckpt.load_tensors("model.safetensors")
        optim = ckpt.load_object("optimizer.bin")
        ckpt.finish()
    model.load_state_dict(weights); optimizer.load_state_dict(optim)
"""

from __future__ import annotations

import json
import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .atomic import recover_interrupted_commit
from .errors import CheckpointCorruptError, CheckpointIncompleteError, describe_problems
from .manifest import MANIFEST_NAME, Manifest, VerifyMode, check_files, read_manifest
from .serialization import read_safetensors, read_torch

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


class CheckpointReader:
    def __init__(self, path: Path, manifest: Manifest | None, verify: VerifyMode) -> None:
        self.path = path
        self.manifest = manifest
        self.verify_mode = verify
        self._checks: dict[str, Future] = {}
        self._pool: ThreadPoolExecutor | None = None

    # ---------------------------------------------------------------- files
    def has(self, name: str) -> bool:
        if self.manifest is None:
            return (self.path / name).is_file()
        return name in self.manifest.files

    def names(self) -> list[str]:
        if self.manifest is None:
            return sorted(
                p.relative_to(self.path).as_posix() for p in self.path.rglob("*") if p.is_file()
            )
        return sorted(self.manifest.files)

    def file(self, name: str) -> Path:
        """Path of a checkpoint file; starts its checksum check in the background (verify='full')."""
        if not self.has(name):
            raise CheckpointIncompleteError(
                f"Checkpoint {self.path} has no file {name!r}"
                + (f" (it holds: {', '.join(self.names())})" if self.manifest is not None else "")
                + ". Was it saved with the same models, optimizers and registered objects?",
                path=self.path,
                problems=[f"{name}: missing"],
            )
        if self.verify_mode == "full" and self.manifest is not None and name not in self._checks:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="cadence-verify")
            self._checks[name] = self._pool.submit(
                check_files, self.path, self.manifest, [name], "full", 1
            )
        return self.path / name

    def _guarded(self, name: str, load):
        path = self.file(name)
        try:
            return load(path)
        except CheckpointCorruptError:
            raise
        except Exception as e:
            future = self._checks.get(name)
            if future is not None and future.exception() is not None:
                raise future.exception() from e
            raise

    def load_object(
        self, name: str, map_location: Any = None, *, allow_pickle: bool = False, **kwargs: Any
    ) -> Any:

        return self._guarded(
            name, lambda p: read_torch(p, map_location, allow_pickle=allow_pickle, **kwargs)
        )

    def load_tensors(self, name: str, device: str | int = "cpu") -> dict[str, torch.Tensor]:

        return self._guarded(name, lambda p: read_safetensors(p, device=device))

    def read_bytes(self, name: str) -> bytes:
        return self._guarded(name, lambda p: p.read_bytes())

    def read_json(self, name: str) -> Any:
        return self._guarded(name, lambda p: json.loads(p.read_text(encoding="utf-8")))

    # ---------------------------------------------------------------- finishing
    def finish(self) -> None:
        """Wait for the checksum checks of every file read so far; raise one error naming all bad files."""
        problems = []
        for future in self._checks.values():
            error = future.exception()
            if error is not None:
                problems.extend(getattr(error, "problems", None) or [str(error)])
        self.close()
        if problems:
            raise CheckpointCorruptError(
                describe_problems(
                    f"Checkpoint {self.path} is corrupt; nothing from it should be used:", problems
                ),
                path=self.path,
                problems=problems,
            )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_checkpoint(
    path: str | os.PathLike, *, verify: VerifyMode = "full", allow_unverified: bool = False
) -> CheckpointReader:
    """Open a checkpoint folder for loading.

    verify: "full" (sizes now, checksums of the files read, in the background), "sizes" or "none".
    allow_unverified: accept a folder without manifest (e.g. written by another tool) with a
    warning instead of the CheckpointIncompleteError.
    """
    path = Path(os.path.expanduser(os.fspath(path)))
    if not path.exists():
        recover_interrupted_commit(path)
    if not path.is_dir():
        raise CheckpointIncompleteError(
            f"Checkpoint folder {path} does not exist"
            + (" (it is a file)" if path.exists() else "")
            + ".",
            path=path,
        )
    if verify not in ("full", "sizes", "none"):
        raise ValueError(f"verify must be 'full', 'sizes' or 'none', got {verify!r}")
    try:
        manifest = read_manifest(path)
    except CheckpointIncompleteError:
        if not allow_unverified:
            raise
        logger.warning(
            "Loading %s without verification: it has no %s (not written by Cadence's save_state, "
            "or its save was interrupted).",
            path,
            MANIFEST_NAME,
        )
        return CheckpointReader(path, None, "none")
    if verify != "none":
        check_files(path, manifest, manifest.files, "sizes")
    return CheckpointReader(path, manifest, verify)
