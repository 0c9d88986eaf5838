"""Pipeline parallelism (`ParallelismConfig(pp_size=N)`): the model cut into stages (split), the stage
modules (stages), the prepared model whose forward runs torch's schedule (model) and the strategy
that builds them (strategy). Loaded only when pp_size > 1; torch.distributed.pipelining with it."""
