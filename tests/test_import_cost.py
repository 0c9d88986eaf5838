"""`from cadence import Accelerator` loads only what constructing an Accelerator needs: the heavy
subsystems load when first used (ARCHITECTURE.md, "What `from cadence import Accelerator` loads").
Checked in a fresh interpreter, so what other tests imported does not count."""

from __future__ import annotations

import json
import subprocess
import sys

# Subsystems that a training script which never uses them must not pay for.
DEFERRED_SUBSYSTEMS = (
    "cadence.checkpointing",  # checkpoint storage: loads at the first save/load
    "cadence.bigmodel",  # big-model loading, dispatch and offload
    "cadence.plugins.deepspeed",
    "cadence.plugins.fsdp",
    "cadence.plugins.megatron",
    "cadence.diagnostics.watchdog",  # the watchdog: only with several processes
    "cadence.diagnostics.hooks",  # diagnostics beyond the ledger the watchdog reads
    "cadence.diagnostics.channel",
    "cadence.diagnostics.verdict",
    "cadence.diagnostics.failure_report",
    "cadence.diagnostics.signing",
    "cadence.fault_tolerance",  # fault tolerance: only when a script or its launch turns it on
    "cadence.strategies.context_parallel",  # context parallelism: only with cp_size > 1
    "cadence.strategies.deepspeed_ulysses",  # sequence parallelism (DeepSpeed's Ulysses)
    "cadence.strategies.tp",
    "cadence.tracking.registry",  # the tracker classes: only with log_with
    "cadence.tracking.wandb",
    "cadence.tracking.tensorboard",
    "cadence.precision.fp8",
    "cadence.training.join",
    "cadence.commands",
    "cadence.launch",
    "cadence.data",
    "cadence.strategies.ddp",
    "cadence.strategies.fsdp",
    "cadence.strategies.deepspeed",
    "cadence.strategies.pipeline",  # pipeline parallelism: only with pp_size > 1
    "torch.distributed.pipelining",
    "cadence.utils",
)

# Optional packages that `from cadence import Accelerator` may not load (beyond what torch loads).
OPTIONAL_PACKAGES = ("deepspeed", "transformers", "safetensors", "yaml", "psutil", "tqdm", "wandb")


def _loaded_after(code: str) -> set[str]:
    script = f"import sys, json\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True
    )
    return set(json.loads(result.stdout.splitlines()[-1]))


def _offenders(loaded: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in loaded for n in names if m == n or m.startswith(n + "."))


def test_from_cadence_import_accelerator_leaves_heavy_subsystems_unloaded():
    loaded = _loaded_after("from cadence import Accelerator")
    assert "cadence.accelerator.facade" in loaded  # the import did happen
    assert not _offenders(loaded, DEFERRED_SUBSYSTEMS)
    assert not _offenders(loaded - _loaded_after("import torch"), OPTIONAL_PACKAGES)


# What an Accelerator that does not ask for them does not load either (issue 46).
UNUSED_BY_A_PLAIN_ACCELERATOR = (
    "cadence.fault_tolerance",
    "cadence.strategies.context_parallel",
    "cadence.strategies.deepspeed",
    "cadence.strategies.deepspeed_ulysses",
    "cadence.tracking.registry",
    "torchft",
    "deepspeed",
)


def test_a_plain_accelerator_leaves_fault_tolerance_and_parallelism_unloaded():
    loaded = _loaded_after(
        "import torch\n"
        "from cadence import Accelerator\n"
        "acc = Accelerator(cpu=True)\n"
        "model, opt = acc.prepare(torch.nn.Linear(2, 2), torch.optim.SGD([torch.zeros(1)], lr=0.1))"
    )
    assert not _offenders(loaded, UNUSED_BY_A_PLAIN_ACCELERATOR)


def test_import_cadence_loads_only_the_namespace():
    loaded = _loaded_after("import cadence")
    assert sorted(m for m in loaded if m.startswith("cadence")) == [
        "cadence",
        "cadence.core",
        "cadence.core.lazy_exports",
    ]


def test_deferred_subsystems_load_when_used(tmp_path):
    # A single-process Accelerator on the CPU saves a checkpoint: storage is loaded then, and works.
    code = (
        "import torch\n"
        "from cadence import Accelerator\n"
        "acc = Accelerator(cpu=True)\n"
        "model = acc.prepare(torch.nn.Linear(2, 2))\n"
        "assert 'cadence.checkpointing' not in sys.modules\n"
        f"acc.save_state({str(tmp_path / 'ckpt')!r})\n"
    )
    loaded = _loaded_after(code)
    assert "cadence.checkpointing.checkpointer" in loaded and "cadence.bigmodel" in loaded
    assert (tmp_path / "ckpt").is_dir()


# What a resume does not use: the writing side of checkpoint storage and the model exporter, which
# the first load_state in a new process would otherwise import (and, without bytecode caches,
# compile) before its first byte is read (issue 46, item 2).
UNUSED_BY_A_RESUME = (
    "cadence.checkpointing.async_writer",
    "cadence.checkpointing.space",
    "cadence.checkpointing.writer_lock",
    "cadence.checkpointing.model_io",
    "cadence.checkpointing.custom_state",
    "cadence.bigmodel.loading",
    "cadence.bigmodel.offload",
)


def test_a_resume_loads_only_the_reading_side_of_checkpoint_storage(tmp_path):
    setup = (
        "import torch\n"
        "from cadence import Accelerator\n"
        "torch.manual_seed(0)\n"
        "acc = Accelerator(cpu=True)\n"
        "model = torch.nn.Linear(3, 3)\n"
        "opt = torch.optim.AdamW(model.parameters())\n"
        "model, opt = acc.prepare(model, opt)\n"
    )
    folder = str(tmp_path / "ckpt")
    saved = _loaded_after(
        setup + "model(torch.ones(1, 3)).sum().backward(); opt.step()\n"
        f"acc.save_state({folder!r})\n"
        f"torch.save(model.weight.detach().clone(), {str(tmp_path / 'w.pt')!r})\n"
    )
    assert "cadence.checkpointing.async_writer" in saved  # the save did use the writing side
    resumed = _loaded_after(
        setup + f"acc.load_state({folder!r})\n"
        f"assert torch.equal(model.weight, torch.load({str(tmp_path / 'w.pt')!r}))\n"
    )
    assert "cadence.checkpointing.reader" in resumed  # it did load, verified (the assert ran)
    assert not _offenders(resumed, UNUSED_BY_A_RESUME)
