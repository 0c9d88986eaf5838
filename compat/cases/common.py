"""Shared by the case scripts: the alias switch, tiny models from configs, digests, the result line.

The scripts use only the reference's name (`accelerate`) and the libraries built on it, so they run
unchanged with the reference installed or with Cadence under CADENCE_AS_ACCELERATE=1.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys


def ensure_alias() -> None:
    """Where CADENCE_AS_ACCELERATE is on but the wheel's startup hook is not installed (a source
    checkout on PYTHONPATH), do what the hook does; elsewhere (the reference's venv) nothing."""
    on = os.environ.get("CADENCE_AS_ACCELERATE", "").strip().lower() in ("1", "true", "yes", "on")
    if on and not any(type(f).__name__ == "AccelerateAliasFinder" for f in sys.meta_path):
        import cadence.alias.startup  # noqa: F401


def quiet() -> None:
    """Keep the libraries' progress bars and advice out of the output."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    import warnings

    warnings.filterwarnings("ignore")


def digest(state_dict) -> str:
    """sha256 of every tensor's bytes, in name order (bit-identical weights <=> equal digests)."""
    h = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().cpu().contiguous()
        h.update(name.encode())
        h.update(str(tensor.dtype).encode())
        h.update(tensor.view(-1).view(dtype=__import__("torch").uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def tiny_gpt2_config(**overrides):
    """A 2-layer GPT-2 of width 32 with no dropout (so resumed runs can match bit for bit)."""
    import transformers

    settings = dict(
        n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    settings.update(overrides)
    return transformers.GPT2Config(**settings)


class TokenDataset:
    """`count` random sequences of `length` tokens (fixed seed), labels = inputs (causal LM)."""

    def __init__(self, count: int = 32, length: int = 16, seed: int = 0) -> None:
        import torch

        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, 64, (count, length), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int):
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def report(result: dict) -> None:
    """Print the result line the tests and compat/run.py read (on the main process only)."""
    if int(os.environ.get("RANK", "0")) == 0:
        print("RESULT " + json.dumps(result, sort_keys=True), flush=True)
