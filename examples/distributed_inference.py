"""Distributed inference, two ways: run with `cadence launch --cpu --num_processes 2 examples/distributed_inference.py`.

1. Data parallel (`split_between_processes`): every process holds the whole model and scores its
   share of the inputs; `gather_object` collects the results on every process, in input order.
2. Pipeline parallel (`prepare_pippy`): the model is cut into one stage per process and the batch
   flows through the stages; with `gather_output=True` every process gets the output.
"""

import torch
from torch import nn

from cadence import PartialState, prepare_pippy
from cadence.utils import gather_object


class Scorer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(8, 8) for _ in range(4)])
        self.score = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.score(torch.relu(self.layers(x)))


state = PartialState()
torch.manual_seed(0)  # the same weights on every process
model = Scorer().eval()
prompts = [torch.full((8,), float(i)) for i in range(5)]

# 1. each process takes a contiguous share of the prompts (the first ones get one more when uneven)
with state.split_between_processes(list(range(len(prompts)))) as my_indices:
    with torch.no_grad():
        my_scores = [(i, model(prompts[i]).item()) for i in my_indices]
    print(f"rank {state.process_index} scored prompts {list(my_indices)}", flush=True)
all_scores = gather_object(my_scores)
in_order = [i for i, _ in all_scores] == list(range(len(prompts)))
state.print(f"all {len(all_scores)} scores gathered in prompt order: {in_order}")

# 2. the same model split in stages; example_args is one micro-batch, used to trace the model
batch = torch.stack(prompts[: state.num_processes])
with torch.no_grad():
    expected = torch.cat([model(row[None]) for row in batch])
pipelined = prepare_pippy(model, split_points="auto", example_args=(batch[:1],), gather_output=True)
with torch.no_grad():
    output = pipelined(batch)
state.print(f"pipeline output matches the plain model: {torch.allclose(output, expected)}")
