"""Several DeepSpeed configurations in one job (e.g. a trained student and a frozen teacher):
`Accelerator(deepspeed_plugins={...})`, `state.select_deepspeed_plugin(name)` before preparing each
model, and both models usable afterwards. Needs DeepSpeed."""

from __future__ import annotations

import sys

import torch

from cadence.core.availability import is_deepspeed_available
from cadence.test_utils.scripts._checks import check


def main() -> None:
    """Run every check of this script on this process; the first failure raises."""
    if not is_deepspeed_available():
        sys.exit("test_ds_multiple_model needs DeepSpeed: pip install deepspeed")
    from cadence import Accelerator, DeepSpeedPlugin
    from cadence.utils import get_active_deepspeed_plugin

    plugins = {
        "student": DeepSpeedPlugin(zero_stage=2, gradient_clipping=0.0),
        # The teacher is prepared without a dataloader, so its config names the micro-batch size.
        "teacher": DeepSpeedPlugin(
            hf_ds_config={
                "train_micro_batch_size_per_gpu": 4,
                "gradient_clipping": 0.0,
                "zero_optimization": {"stage": 3},
            }
        ),
    }
    accelerator = Accelerator(deepspeed_plugins=plugins)
    check(
        get_active_deepspeed_plugin(accelerator.state) is plugins["student"],
        "the first plugin starts active",
    )
    torch.manual_seed(0)
    student = torch.nn.Linear(8, 8)
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(
        torch.randn(8 * accelerator.num_processes, 8), batch_size=4
    )
    student, optimizer, loader = accelerator.prepare(student, optimizer, loader)

    accelerator.state.select_deepspeed_plugin("teacher")
    check(
        get_active_deepspeed_plugin(accelerator.state) is plugins["teacher"],
        "select_deepspeed_plugin('teacher')",
    )
    teacher = accelerator.prepare(torch.nn.Linear(8, 8))
    accelerator.state.select_deepspeed_plugin("student")

    for x in loader:
        with torch.no_grad():
            target = teacher(x)
        accelerator.backward((student(x) - target).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
    if accelerator.is_main_process:
        print("Multiple DeepSpeed models checks passed.")


if __name__ == "__main__":
    main()
