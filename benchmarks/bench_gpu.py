"""Cadence on one NVIDIA GPU against the same loops written by hand in plain torch, interleaved in one
run (Cadence, hand-written, Cadence, ...; medians of the ratios). Without CUDA it says so and exits 0.

    python benchmarks/bench_gpu.py [--rounds 5] [--steps 20] [--skip-gpt]

Rows (time ratio: Cadence / hand-written, lower is better; throughput ratio: higher is better):

- GPT-2-small-sized step (124M parameters, 12 layers, width 768, sequence 1024, batch 8), AdamW:
  bf16 autocast, and fp8 through torchao (linears as Float8Linear, first and last kept in bf16) when
  torchao is installed and the GPU has compute capability 8.9+. Timed with CUDA events.
- tiny model (Linear(8, 1)) per-step overhead in fp32 and bf16, CUDA events around many steps.
- loader to GPU: 200k samples through the prepared DataLoader against a plain DataLoader loop with
  `.to(device)`, and against the tuned hand-written loop (`pin_memory=True`, `non_blocking=True`).

Targets (issue 15): GPT-2 bf16 <= 1.005x, tiny model <= 1.02x, prepared loader >= the pinned loop.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


# -- a GPT-2-small-sized model (no extra dependency) ----------------------------------------------
class Block(torch.nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.ln2 = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attention.transpose(1, 2).reshape(batch, length, width))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self, vocab=50304, width=768, layers=12, heads=12, length=1024) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Embedding(length, width)
        self.blocks = torch.nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def _gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT()


def _events_time(step, steps: int) -> float:
    """Milliseconds per step, measured with CUDA events around `steps` calls (after 3 warm-ups)."""
    for _ in range(3):
        step()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(steps):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / steps


def _fresh_accelerator(**kwargs):
    from cadence import Accelerator
    from cadence.state import reset_state

    reset_state(destroy_process_group=True)
    return Accelerator(**kwargs)


# -- GPT-2 small -----------------------------------------------------------------------------------
def gpt_hand_written(precision: str, steps: int, tokens: torch.Tensor) -> float:
    model = _gpt().cuda()
    if precision == "fp8":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        linears = [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
        edges = {linears[0], linears[-1]}  # kept in bf16, as Cadence's default filter does

        def keep_edges(module: torch.nn.Module, fqn: str) -> bool:
            if isinstance(module, torch.nn.Linear) and (
                module.in_features % 16 or module.out_features % 16
            ):
                return False
            return fqn not in edges

        convert_to_float8_training(
            model,
            module_filter_fn=keep_edges,
            config=Float8LinearConfig(pad_inner_dim=True, enable_fsdp_float8_all_gather=True),
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens)
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return _events_time(step, steps)


def gpt_cadence(precision: str, steps: int, tokens: torch.Tensor) -> float:
    accelerator = _fresh_accelerator(mixed_precision=precision)
    model = _gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    model, optimizer = accelerator.prepare(model, optimizer)

    def step():
        logits = model(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    elapsed = _events_time(step, steps)
    accelerator.free_memory()
    return elapsed


# -- tiny model ------------------------------------------------------------------------------------
def tiny_hand_written(precision: str, steps: int, x: torch.Tensor, y: torch.Tensor) -> float:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        if precision == "bf16":
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(x)
            out = out.float()
        else:
            out = model(x)
        F.mse_loss(out, y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return _events_time(step, steps)


def tiny_cadence(precision: str, steps: int, x: torch.Tensor, y: torch.Tensor) -> float:
    accelerator = _fresh_accelerator(mixed_precision=precision)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)

    def step():
        accelerator.backward(F.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    elapsed = _events_time(step, steps)
    accelerator.free_memory()
    return elapsed


# -- loader to GPU ---------------------------------------------------------------------------------
def _consume(loader, device, non_blocking: bool = False, move: bool = True) -> float:
    """Samples per second through `loader`, each batch used by a small kernel on the GPU."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    total, checksum = 0, torch.zeros((), device=device)
    torch.cuda.synchronize()
    start.record()
    for x, y in loader:
        if move:
            x, y = x.to(device, non_blocking=non_blocking), y.to(device, non_blocking=non_blocking)
        checksum = checksum + x.sum() + y.sum()  # the step that uses the batch
        total += x.shape[0]
    end.record()
    torch.cuda.synchronize()
    return total / (start.elapsed_time(end) / 1000)


def loader_rows(data: TensorDataset, rounds: int) -> list[tuple[str, str, float]]:
    device = torch.device("cuda")
    plain, pinned = [], []
    for _ in range(rounds):
        accelerator = _fresh_accelerator()
        ours = _consume(accelerator.prepare(DataLoader(data, batch_size=256)), device, move=False)
        plain.append(ours / _consume(DataLoader(data, batch_size=256), device))
        tuned = DataLoader(data, batch_size=256, pin_memory=True)
        pinned.append(ours / _consume(tuned, device, non_blocking=True))
    return [
        (
            "loader to GPU vs plain loop",
            "samples/s ratio (higher is better)",
            statistics.median(plain),
        ),
        (
            "loader to GPU vs pinned + non_blocking loop",
            "samples/s ratio (higher is better)",
            statistics.median(pinned),
        ),
    ]


def _fp8_available() -> tuple[bool, str]:
    import importlib.util

    if importlib.util.find_spec("torchao") is None:
        return False, "torchao is not installed"
    if torch.cuda.get_device_capability() < (8, 9):
        return False, f"compute capability {torch.cuda.get_device_capability()} < 8.9"
    return True, ""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="GPT-2 steps per timing")
    parser.add_argument("--tiny-steps", type=int, default=2000)
    parser.add_argument("--skip-gpt", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here, nothing to measure (skipped).")
        return
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    rows: list[tuple[str, str, float]] = []
    if not args.skip_gpt:
        tokens = torch.randint(0, 50304, (8, 1024), device="cuda")
        precisions = ["bf16"]
        fp8, why = _fp8_available()
        if fp8:
            precisions.append("fp8")
        else:
            print(f"fp8 rows skipped: {why}")
        for precision in precisions:
            ratios, times = [], []
            for _ in range(args.rounds):
                ours = gpt_cadence(precision, args.steps, tokens)
                theirs = gpt_hand_written(precision, args.steps, tokens)
                ratios.append(ours / theirs)
                times.append((ours, theirs))
            ms = statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)
            print(f"GPT-2 small {precision}: Cadence {ms[0]:.1f} ms/step, hand-written {ms[1]:.1f}")
            rows.append((f"GPT-2 small step, {precision}", "time ratio", statistics.median(ratios)))
    x, y = torch.randn(32, 8, device="cuda"), torch.randn(32, 1, device="cuda")
    for precision in ("no", "bf16"):
        ratios = []
        for _ in range(args.rounds):
            ours = tiny_cadence(precision, args.tiny_steps, x, y)
            ratios.append(ours / tiny_hand_written(precision, args.tiny_steps, x, y))
        label = "fp32" if precision == "no" else precision
        rows.append((f"tiny model step, {label}", "time ratio", statistics.median(ratios)))
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(200_000, 64, generator=generator), torch.randn(200_000, 1))
    rows.extend(loader_rows(data, args.rounds))
    width = max(len(row[0]) for row in rows)
    for name, unit, value in rows:
        print(f"{name:<{width}}  {value:6.3f}  {unit}")
    print(
        "time ratios: Cadence / hand-written (lower is better); targets: GPT-2 bf16 <= 1.005, tiny"
    )
    print("<= 1.02, loader vs the pinned loop >= 1.0")


if __name__ == "__main__":
    sys.exit(main())
