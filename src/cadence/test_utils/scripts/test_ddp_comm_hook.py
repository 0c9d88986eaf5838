"""DDP communication hooks (fp16 / bf16 compression, PowerSGD and their wrappers): training with a
hook gives gradients close to those without one."""

from __future__ import annotations

import torch

from cadence import Accelerator, DDPCommunicationHookType, DistributedDataParallelKwargs
from cadence.runtime.state import AcceleratorState, GradientState
from cadence.test_utils.scripts._checks import check


class MockModel(torch.nn.Module):
    """A linear layer with fixed weights, so every hook setting starts from the same model."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.p = torch.nn.Parameter(torch.randn(40, 20))

    def forward(self, x: torch.Tensor, rank: int) -> torch.Tensor:
        """Return `p * x ** (1 + rank)`, so gradients differ per rank."""
        return self.p * (x ** (1 + rank))


def _run_and_get_grads(model: torch.nn.Module, rank: int) -> torch.Tensor:
    torch.manual_seed(2024)
    x = torch.rand(40, 20)
    model(x, rank).mean().backward()
    return model.module.p.grad.detach().clone()


def test_ddp_comm_hook(
    comm_hook: DDPCommunicationHookType,
    comm_wrapper: DDPCommunicationHookType,
    comm_state_option: dict,
) -> None:
    """Check ddp comm hook (raises AssertionError on failure)."""
    handler = DistributedDataParallelKwargs(
        comm_hook=comm_hook, comm_wrapper=comm_wrapper, comm_state_option=comm_state_option
    )
    accelerator = Accelerator(kwargs_handlers=[handler], cpu=True)
    hooked = accelerator.prepare(MockModel())
    hooked_grads = _run_and_get_grads(hooked, accelerator.local_process_index)
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True)
    plain = accelerator.prepare(MockModel())
    plain_grads = _run_and_get_grads(plain, accelerator.local_process_index)
    check(
        torch.allclose(hooked_grads, plain_grads, rtol=1e-2, atol=1e-2),
        f"hook {comm_hook}/{comm_wrapper}: gradients differ by {(hooked_grads - plain_grads).abs().max().item()}",
    )
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def main() -> None:
    """Run every check of this script on this process; the first failure raises."""
    cases = [
        (DDPCommunicationHookType.NO, DDPCommunicationHookType.NO, {}),
        (DDPCommunicationHookType.FP16, DDPCommunicationHookType.NO, {}),
        (DDPCommunicationHookType.BF16, DDPCommunicationHookType.NO, {}),
        (DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.NO, {}),
        (DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.FP16, {}),
        (DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.BF16, {}),
        (
            DDPCommunicationHookType.POWER_SGD,
            DDPCommunicationHookType.NO,
            {"matrix_approximation_rank": 2},
        ),
        (DDPCommunicationHookType.BATCHED_POWER_SGD, DDPCommunicationHookType.NO, {}),
    ]
    for comm_hook, comm_wrapper, option in cases:
        test_ddp_comm_hook(comm_hook, comm_wrapper, option)
    from cadence.runtime.state import PartialState

    if PartialState().is_main_process:
        print("All DDP communication hook checks passed.")


if __name__ == "__main__":
    main()
