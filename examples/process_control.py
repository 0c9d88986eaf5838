"""Process control on several processes: run with `cadence launch --num_processes 2 examples/process_control.py`
(or `python -m torch.distributed.run --nproc_per_node 2 examples/process_control.py`)."""

import torch

from cadence import Accelerator

accelerator = Accelerator()
print(
    f"rank {accelerator.process_index} of {accelerator.num_processes} "
    f"({accelerator.distributed_type.value}, backend {accelerator.state.backend}, device {accelerator.device})",
    flush=True,
)

gathered = accelerator.gather(torch.tensor([accelerator.process_index], device=accelerator.device))
accelerator.print(f"gather of every rank's index: {gathered.tolist()}")

with accelerator.main_process_first():
    print(f"rank {accelerator.process_index} inside main_process_first", flush=True)

accelerator.wait_for_everyone()
accelerator.print("everyone is here")
