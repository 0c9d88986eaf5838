"""A small transformer-like language model for the big-model tests (embedding, blocks, tied head)."""

from __future__ import annotations

import os
import subprocess
import sys

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)
        self.norm = nn.LayerNorm(d)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.norm(self.down(torch.relu(self.up(x)))) * self.scale


class TinyLM(nn.Module):
    """Token ids (batch, seq) -> logits (batch, seq, vocab); the head shares the embedding's weight."""

    def __init__(self, d: int = 16, n_blocks: int = 4, vocab: int = 32, tie: bool = True) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([Block(d) for _ in range(n_blocks)])
        self.final = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        if tie:
            self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.final(x))


def greedy_generate(model: nn.Module, ids: torch.Tensor, steps: int) -> torch.Tensor:
    """`generate`-style use: call the model repeatedly on its own growing output."""
    with torch.no_grad():
        for _ in range(steps):
            next_token = model(ids)[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, next_token.to(ids.device)], dim=1)
    return ids


def trained_model(seed: int = 0, **kwargs) -> TinyLM:
    torch.manual_seed(seed)
    model = TinyLM(**kwargs)
    with torch.no_grad():
        for block in model.blocks:  # non-trivial buffers and norms
            block.norm.weight.uniform_(0.5, 1.5)
    return model.eval()


def run_python(code: str, timeout: float = 300) -> str:
    """Run `code` in a fresh interpreter (this one's, with this test run's sys.path); its stdout."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), OMP_NUM_THREADS="1"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


# Measured in the child: the peak resident set (VmHWM) and the current one (VmRSS), in bytes.
RSS_SNIPPET = """
def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)

def reset_peak():
    # writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")

def rss():
    return _status("VmRSS")

def peak():
    return _status("VmHWM")
"""
