"""SIGKILL during saves: the newest complete checkpoint always verifies and loads.

A server process (this file run as a script) imports torch once and forks a saver per trial; the
saver saves in a loop (with rotation, or replacing one folder) until the test kills it with SIGKILL
after a random delay, so kills land while writing files, fsyncing, writing the manifest, renaming
or pruning. After every kill the test checks what a resuming job would see.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

TOTAL_LIMIT = 2
MAX_SAVER_SECONDS = 20  # a saver nobody kills (the test died) stops by itself


# ----------------------------------------------------------------------------- saver side
def _save_once(writer, iteration: int) -> None:
    import torch

    from cadence.checkpointing import capture_rng_state

    value = float(iteration)
    writer.save_tensors(
        "model.safetensors", {"w": torch.full((256, 512), value), "b": torch.full((512,), value)}
    )
    writer.save_object(
        "optimizer.bin",
        {"state": {0: {"exp_avg": torch.full((128, 1024), value)}}, "step": iteration},
    )
    writer.save_object("random_states_0.pkl", capture_rng_state(step=iteration))
    writer.save_json("meta.json", {"iteration": iteration})


def _rotate_forever(project: Path, log: Path) -> None:
    from cadence.checkpointing import (
        automatic_checkpoint_dir,
        begin_checkpoint,
        checkpoints_dir,
        cleanup_checkpoints_dir,
        next_iteration,
        prune_checkpoints,
    )

    root = checkpoints_dir(project)
    cleanup_checkpoints_dir(root)
    iteration = next_iteration(root)
    deadline = time.monotonic() + MAX_SAVER_SECONDS
    with open(log, "a") as out:
        while time.monotonic() < deadline:
            # As save_state does: prune before writing too, so that saves killed between their
            # commit and their pruning, trial after trial, never leave more than total_limit + 1.
            prune_checkpoints(root, total_limit=TOTAL_LIMIT)
            writer = begin_checkpoint(automatic_checkpoint_dir(project, iteration))
            _save_once(writer, iteration)
            writer.commit(metadata={"iteration": iteration})
            out.write(f"{iteration}\n")
            out.flush()
            prune_checkpoints(root, total_limit=TOTAL_LIMIT)
            iteration += 1


def _replace_forever(folder: Path, log: Path) -> None:
    from cadence.checkpointing import begin_checkpoint, is_complete, open_checkpoint

    iteration = 0
    if folder.exists() or folder.parent.exists():
        try:
            with open_checkpoint(folder, verify="sizes") as ckpt:
                iteration = ckpt.read_json("meta.json")["iteration"] + 1
        except Exception:
            assert not is_complete(folder)
    deadline = time.monotonic() + MAX_SAVER_SECONDS
    with open(log, "a") as out:
        while time.monotonic() < deadline:
            writer = begin_checkpoint(folder)
            _save_once(writer, iteration)
            writer.commit()
            out.write(f"{iteration}\n")
            out.flush()
            iteration += 1


def serve() -> None:
    """Read 'rotate|replace DIR LOG' lines; fork a saver for each, report its pid and its end."""
    import tempfile

    import torch

    from cadence.checkpointing import begin_checkpoint

    # Import and warm up once here; every forked saver inherits it and starts saving at once.
    # One thread: no OpenMP pool exists at fork time.
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        writer = begin_checkpoint(Path(scratch) / "warmup")
        _save_once(writer, 0)
        writer.commit()

    for line in sys.stdin:
        mode, target, log = line.split()
        pid = os.fork()
        if pid == 0:
            try:
                (_rotate_forever if mode == "rotate" else _replace_forever)(Path(target), Path(log))
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                os._exit(1)
        print(f"pid {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"exited {status}", flush=True)


# ----------------------------------------------------------------------------- test side
def _committed(log: Path) -> list[int]:
    return [int(x) for x in log.read_text().split()] if log.exists() else []


def _check_loadable(path: Path, expected_iteration: int | None = None) -> int:
    import torch

    from cadence.checkpointing import open_checkpoint, verify

    manifest = verify(path, "full")
    with open_checkpoint(path) as ckpt:
        weights = ckpt.load_tensors("model.safetensors")
        optim = ckpt.load_object("optimizer.bin")
        rng = ckpt.load_object("random_states_0.pkl")
        meta = ckpt.read_json("meta.json")
        ckpt.finish()
    iteration = meta["iteration"]
    if expected_iteration is not None:
        assert iteration == expected_iteration
    assert torch.equal(weights["w"], torch.full((256, 512), float(iteration)))
    assert torch.equal(weights["b"], torch.full((512,), float(iteration)))
    assert optim["step"] == iteration and rng["step"] == iteration
    assert torch.equal(optim["state"][0]["exp_avg"], torch.full((128, 1024), float(iteration)))
    assert set(manifest.files) == {
        "model.safetensors",
        "optimizer.bin",
        "random_states_0.pkl",
        "meta.json",
    }
    return iteration


def _kill_trials(server, mode: str, target: Path, log: Path, trials: int, rng: random.Random):
    """Yield after each kill; the saver was killed at a random point of its save loop."""
    for _ in range(trials):
        server.stdin.write(f"{mode} {target} {log}\n")
        server.stdin.flush()
        reply = server.stdout.readline().split()
        assert reply and reply[0] == "pid", f"server said {reply!r}"
        time.sleep(rng.uniform(0.0, 0.4))
        os.kill(int(reply[1]), signal.SIGKILL)
        exited = server.stdout.readline().split()
        assert exited[0] == "exited"
        yield


def test_sigkill_during_saves_never_exposes_a_partial_checkpoint(tmp_path):
    from cadence.checkpointing import checkpoints_dir, latest_checkpoint, list_checkpoints

    server = subprocess.Popen(
        [sys.executable, __file__, "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        # A CPU storage test: the forked savers must not touch CUDA (a fork cannot re-initialise it).
        env={**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""},
    )
    rng = random.Random(1234)
    try:
        # Rotation with automatic naming and total_limit.
        project, log = tmp_path / "project", tmp_path / "rotate.log"
        root = checkpoints_dir(project)
        interrupted = 0
        for _ in _kill_trials(server, "rotate", project, log, 16, rng):
            interrupted += any(p.name.startswith(".") for p in root.glob(".checkpoint_*"))
            committed = _committed(log)
            entries = list_checkpoints(root)
            # A checkpoint name only ever appears on a complete folder.
            assert all(e.complete for e in entries), entries
            if not committed:
                continue
            assert 1 <= len(entries) <= TOTAL_LIMIT + 1  # +1: killed between commit and prune
            latest = latest_checkpoint(root)
            assert latest is not None, "rotation left no complete checkpoint"
            index = int(latest.name.split("_")[1])
            assert index >= committed[-1]  # a save reported as committed is never lost
            assert _check_loadable(latest) == index
        assert len(_committed(log)) >= 3, "the saver never got far enough to test rotation"
        assert interrupted >= 1, "no kill landed inside a save"

        # Saving again and again into one explicit folder, replacing it each time.
        folder, log = tmp_path / "explicit" / "out", tmp_path / "replace.log"
        for _ in _kill_trials(server, "replace", folder, log, 8, rng):
            committed = _committed(log)
            if not committed:
                continue
            from cadence.checkpointing import open_checkpoint

            open_checkpoint(folder).close()  # finishes an interrupted replacement, if any
            assert _check_loadable(folder) >= committed[-1]
        assert len(_committed(log)) >= 3
    finally:
        server.stdin.close()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    serve()
