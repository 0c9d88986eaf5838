"""The bf16 forward wrapper: autocast inside, fp32 out, and the autocast state restored exactly, also
when the wrapped forward is re-entered or runs in several threads at once (it reuses its context)."""

from __future__ import annotations

import threading

import torch

from cadence.precision.policy import AutocastPrecision, remove_forward_wrapper


class Recursive(torch.nn.Module):
    """A forward that calls itself (through the wrapped `self.forward`) `depth` times."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.seen: list[tuple[bool, torch.dtype]] = []

    def forward(self, x: torch.Tensor, depth: int = 0) -> torch.Tensor:
        out = self.linear(x)
        self.seen.append((torch.is_autocast_enabled("cpu"), out.dtype))
        if depth:
            inner = self.forward(x, depth - 1)
            assert inner.dtype == torch.float32  # the inner call is wrapped too: fp32 out
            # Back in the outer call: still under autocast.
            self.seen.append((torch.is_autocast_enabled("cpu"), self.linear(x).dtype))
        return out


def test_outputs_are_fp32_and_the_autocast_state_is_restored():
    model = Recursive()
    AutocastPrecision("bf16", "cpu").wrap_forward(model)
    output = model(torch.randn(2, 4))
    assert output.dtype == torch.float32
    assert model.seen == [(True, torch.bfloat16)]
    assert not torch.is_autocast_enabled("cpu")
    for _ in range(3):  # the reused context gives the same every time
        assert model(torch.randn(2, 4)).dtype == torch.float32
        assert not torch.is_autocast_enabled("cpu")
    remove_forward_wrapper(model)
    assert model(torch.randn(2, 4)).dtype == torch.float32
    assert model.seen[-1] == (False, torch.float32)


def test_a_reentered_forward_restores_autocast_at_each_level():
    model = Recursive()
    AutocastPrecision("bf16", "cpu").wrap_forward(model)
    assert model(torch.randn(2, 4), depth=2).dtype == torch.float32
    assert model.seen == [(True, torch.bfloat16)] * 5
    assert not torch.is_autocast_enabled("cpu")


def test_threads_sharing_the_wrapper_each_restore_their_state():
    model = Recursive()
    AutocastPrecision("bf16", "cpu").wrap_forward(model)
    barrier = threading.Barrier(4)
    after: list[bool] = []

    def work() -> None:
        barrier.wait()
        for _ in range(20):
            assert model(torch.randn(2, 4), depth=1).dtype == torch.float32
        after.append(torch.is_autocast_enabled("cpu"))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert after == [False] * 4
    assert set(model.seen) == {(True, torch.bfloat16)} and len(model.seen) == 4 * 20 * 3
    assert not torch.is_autocast_enabled("cpu")
