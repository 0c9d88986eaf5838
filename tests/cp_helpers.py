"""Pieces of the context-parallel tests: a small causal language model whose attention runs through
`scaled_dot_product_attention`, deterministic token batches, and the one-process reference (plain
PyTorch, the whole sequence) that a context-parallel run must match step by step."""

from __future__ import annotations

import torch
import torch.nn.functional as F

VOCAB, WIDTH, HEADS, LAYERS, MAX_POSITIONS = 32, 16, 2, 2, 64
BATCH = 2
LEARNING_RATE = 0.5


class SelfAttention(torch.nn.Module):
    """Causal multi-head attention; `attention_mask` is only there for the context-parallel hook."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor, attention_mask=None, is_causal: bool = True) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, HEADS, WIDTH // HEADS).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        mask = None if attention_mask is None else attention_mask.bool()
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return self.proj(out.transpose(1, 2).reshape(batch, length, WIDTH))


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.self_attn = SelfAttention()
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(WIDTH, 2 * WIDTH), torch.nn.GELU(), torch.nn.Linear(2 * WIDTH, WIDTH)
        )

    def forward(self, x: torch.Tensor, attention_mask=None) -> torch.Tensor:
        x = x + self.self_attn(self.norm(x), attention_mask=attention_mask)
        return x + self.mlp(x)


class TinyCausalLM(torch.nn.Module):
    """Token and position embeddings, two layers, a head: positions come in as `position_ids`."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.positions = torch.nn.Embedding(MAX_POSITIONS, WIDTH)
        self.layers = torch.nn.ModuleList([Layer() for _ in range(LAYERS)])
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, input_ids, position_ids=None, attention_mask=None) -> torch.Tensor:
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1]).expand_as(input_ids)
        x = self.embed(input_ids) + self.positions(position_ids)
        for layer in self.layers:
            x = layer(x, attention_mask=attention_mask)
        return self.head(x)


def make_tiny(seed: int = 0) -> TinyCausalLM:
    torch.manual_seed(seed)
    return TinyCausalLM()


def make_llama(seed: int = 0) -> torch.nn.Module:
    """A tiny transformers Llama with `attn_implementation="sdpa"`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=2 * WIDTH, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=MAX_POSITIONS,
        attn_implementation="sdpa",
    )  # fmt: skip
    return LlamaForCausalLM(config)


def step_tokens(step: int, length: int) -> torch.Tensor:
    """The BATCH sequences of `length` + 1 tokens of step `step`."""
    generator = torch.Generator().manual_seed(100 + step)
    return torch.randint(0, VOCAB, (BATCH, length + 1), generator=generator)


def batch(step: int, length: int, tokens: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Step `step`'s tokens (or `tokens`): inputs, labels already shifted (the next token), positions."""
    tokens = step_tokens(step, length) if tokens is None else tokens
    rows = tokens.shape[0]
    # Cloned: sliced from one row, `.contiguous()` would return views sharing memory.
    return {
        "input_ids": tokens[:, :-1].clone(),
        "labels": tokens[:, 1:].clone(),
        "position_ids": torch.arange(length).expand(rows, length).contiguous(),
    }


def logits_of(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    out = model(input_ids=inputs["input_ids"], position_ids=inputs["position_ids"])
    return out.logits if hasattr(out, "logits") else out


def loss_of(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))


def reference_steps(kind: str, lengths: list[int]) -> list[dict]:
    """One process, whole sequences: per step the loss and every parameter's gradient, then an SGD step."""
    model = make_tiny() if kind == "tiny" else make_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    records = []
    for step, length in enumerate(lengths):
        inputs = batch(step, length)
        loss = loss_of(logits_of(model, inputs), inputs["labels"])
        loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        records.append({"loss": loss.item(), "grads": grads})
        optimizer.step()
        optimizer.zero_grad()
    return records


def largest_differences(got: list[dict], expected: list[dict]) -> tuple[float, float]:
    """(largest loss difference, largest gradient difference) over all steps and parameters."""
    assert len(got) == len(expected)
    loss = max(abs(g["loss"] - e["loss"]) for g, e in zip(got, expected))
    grad = 0.0
    for g, e in zip(got, expected):
        assert g["grads"].keys() == e["grads"].keys(), sorted(set(g["grads"]) ^ set(e["grads"]))
        for name, value in e["grads"].items():
            grad = max(grad, (g["grads"][name] - value).abs().max().item())
    return loss, grad


# Sequence lengths of the CUDA test (cp=2): divisible by 2*cp, then by cp only.
LENGTHS_CUDA = [8, 6, 8]
