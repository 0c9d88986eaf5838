"""Pipeline parallelism (ParallelismConfig(pp_size=N)) on real gloo processes: the model is cut into
stages, each process trains only its own on torch's schedule, and the loss on every rank and the
weights after several AdamW steps equal one process training the same global batches (every pp rank
reads the same batch: the first stage its inputs, the last its labels)."""

from __future__ import annotations

import pytest
import torch

GLOBAL_BATCH = 16
FEATURES, WIDTH, OUTPUTS = 6, 8, 2
MAX_STEPS = 8


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


class Net(torch.nn.Module):
    """Not a Sequential: its forward is its children in order, the list expanded (8 units).
    `tp_plan` splits each block's two layers (pp x tp)."""

    tp_plan = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(FEATURES, WIDTH)
        self.blocks = torch.nn.ModuleList([Block(WIDTH) for _ in range(6)])
        self.out = torch.nn.Linear(WIDTH, OUTPUTS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


def make_model(kind: str = "net") -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "sequential":
        return torch.nn.Sequential(
            torch.nn.Linear(FEATURES, WIDTH),
            *[Block(WIDTH) for _ in range(6)],
            torch.nn.Linear(WIDTH, OUTPUTS),
        )
    return Net()


def make_data(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first `steps` global batches of one fixed dataset."""
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(MAX_STEPS * GLOBAL_BATCH, FEATURES, generator=generator)
    y = torch.tanh(x @ torch.randn(FEATURES, OUTPUTS, generator=generator))
    return x[: steps * GLOBAL_BATCH], y[: steps * GLOBAL_BATCH]


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(output, target)


def make_optimizer(model: torch.nn.Module, sgd: bool = False) -> torch.optim.Optimizer:
    """AdamW; SGD for bf16 (Adam turns a rounding-sized gradient into a whole step of either sign)."""
    if sgd:
        return torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.01)


def make_scheduler(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    """The learning rate falls by a quarter at every optimizer step."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.75**step)


def reference(
    steps: int,
    kind: str = "net",
    accumulation: int = 1,
    clip: float | None = None,
    mixed_precision: str = "no",
    dp: int = 1,
):
    """One process, plain PyTorch, on the whole global batches: (losses, weights, the first batch's
    loss evaluated after training). The scheduler advances `dp` steps per optimizer step, as a
    prepared one does over `dp` data-parallel replicas (Accelerate's rule: each replica's batch is
    the batch the schedule was written for)."""
    model = make_model(kind)
    optimizer = make_optimizer(model, sgd=mixed_precision == "bf16")
    scheduler = make_scheduler(optimizer)
    x, y = make_data(steps)
    losses = []
    for step in range(steps):
        batch = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed_precision == "bf16"):
            output = model(x[batch])
        loss = loss_fn(output.float(), y[batch])
        losses.append(loss.item())
        # a shorter last window is averaged over its own micro-batches (Cadence's reweighting)
        window = min(accumulation, steps - step // accumulation * accumulation)
        (loss / window).backward()
        if (step + 1) % accumulation == 0 or step + 1 == steps:
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            for _ in range(dp):
                scheduler.step()
            optimizer.zero_grad()
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=mixed_precision == "bf16"):
        evaluated = loss_fn(model(x[:GLOBAL_BATCH]).float(), y[:GLOBAL_BATCH]).item()
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}, evaluated


def train_pp(
    steps: int,
    pp_size: int = 2,
    schedule: str = "1F1B",
    kind: str = "net",
    dp_replicate_size: int = 1,
    dp_shard_size: int = 1,
    tp_size: int = 1,
    accumulation: int = 1,
    clip: float | None = None,
    n_microbatches: int | None = None,
    split_points=None,
    mixed_precision: str = "no",
):
    """Train through the Accelerator under pp; returns (losses seen on this rank, whole state dict on
    rank 0, this rank's parameter count, (its DTensor parameters, its parameters), its first batch's
    loss evaluated under no_grad after training)."""
    from cadence import Accelerator
    from cadence.plugins import ParallelismConfig, PipelineParallelConfig

    handler = PipelineParallelConfig(
        schedule=schedule, n_microbatches=n_microbatches, split_points=split_points, loss_fn=loss_fn
    )
    config = ParallelismConfig(
        pp_size=pp_size,
        dp_replicate_size=dp_replicate_size,
        dp_shard_size=dp_shard_size,
        tp_size=tp_size,
        pp_handler=handler,
    )
    from cadence.plugins import FullyShardedDataParallelPlugin

    acc = Accelerator(
        parallelism_config=config,
        gradient_accumulation_steps=accumulation,
        mixed_precision=mixed_precision,
        # with dp_shard, as a script for FSDP2 would say it: each stage is sharded with FSDP2
        fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2) if dp_shard_size > 1 else None,
    )
    model = make_model(kind)
    optimizer = make_optimizer(model, sgd=mixed_precision == "bf16")
    dp = dp_replicate_size * dp_shard_size
    x, y = make_data(steps)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=GLOBAL_BATCH // dp
    )
    scheduler = make_scheduler(optimizer)
    model, optimizer, loader, scheduler = acc.prepare(model, optimizer, loader, scheduler)
    losses, first = [], None
    for xb, yb in loader:
        first = first or (xb, yb)
        with acc.accumulate(model):
            loss = model(xb, labels=yb)
            acc.backward(loss)
            losses.append(loss.item())
            if clip is not None and acc.sync_gradients:
                acc.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            scheduler.step()  # advances once per optimizer step and data-parallel replica
            optimizer.zero_grad()
    try:
        with torch.no_grad():  # the schedule's forward only
            evaluated = model(first[0], labels=first[1]).item()
    except ValueError as error:  # ZBVZeroBubble: refused
        evaluated = str(error)
    from torch.distributed.tensor import DTensor

    local = sum(p.numel() for p in model.parameters())
    params = list(model.parameters())
    sharded = (sum(isinstance(p, DTensor) for p in params), len(params))
    return losses, acc.get_state_dict(model), local, sharded, evaluated


def check_against_reference(results, steps, dp=1, tolerance=1e-5, **options):
    losses, weights, evaluated = reference(steps, dp=dp, **options)
    for rank_losses, _, _, _, rank_evaluated in results:
        # with dp replicas, each rank's loss is its replica's share of the batch (checked apart)
        if dp == 1:
            assert rank_losses == pytest.approx(losses, abs=tolerance), (rank_losses, losses)
            if isinstance(rank_evaluated, str):
                assert "ZBVZeroBubble" in rank_evaluated, rank_evaluated
            else:
                assert rank_evaluated == pytest.approx(evaluated, abs=tolerance)
    state = results[0][1]
    assert sorted(state) == sorted(weights)
    worst = max((state[k] - weights[k]).abs().max().item() for k in weights)
    assert worst < tolerance, worst


@pytest.mark.parametrize(
    "schedule", ["GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble"]
)
def test_each_schedule_matches_one_process(dist_pool, schedule):
    results = dist_pool(2).run(train_pp, 4, schedule=schedule, timeout=180)
    check_against_reference(results, 4)


def test_a_shorter_last_accumulation_window(dist_pool):
    results = dist_pool(2).run(train_pp, 6, accumulation=4, timeout=180)
    check_against_reference(results, 6, accumulation=4)


def test_bf16_autocast_per_stage(dist_pool):
    # Each stage runs under autocast and hands its output on in fp32 (Accelerate's fp32 outputs),
    # where one process keeps the residual stream in bf16 across that boundary: equal to bf16's
    # rounding only.
    results = dist_pool(2).run(train_pp, 4, mixed_precision="bf16", timeout=180)
    check_against_reference(results, 4, tolerance=1e-2, mixed_precision="bf16")


def test_four_stages_and_looped_eight_stages_on_four_processes(dist_pool):
    pool = dist_pool(4)
    for schedule in ("1F1B", "Interleaved1F1B"):
        results = pool.run(
            train_pp, 4, pp_size=4, schedule=schedule, kind="sequential", timeout=180
        )
        check_against_reference(results, 4, kind="sequential")


def test_accumulation_clipping_and_split_points(dist_pool):
    results = dist_pool(2).run(
        train_pp, 6, accumulation=2, clip=0.05, split_points=["blocks.4"], timeout=180
    )
    check_against_reference(results, 6, accumulation=2, clip=0.05)
    # split after blocks.3: rank 0 holds inp and blocks 0-3, rank 1 blocks 4-5 and out
    assert [r[2] for r in results] == [56 + 4 * 280, 2 * 280 + 18]


def test_pipeline_with_tensor_parallel_on_four_processes(dist_pool):
    results = dist_pool(4).run(train_pp, 4, tp_size=2, accumulation=2, clip=0.05, timeout=180)
    check_against_reference(results, 4, accumulation=2, clip=0.05)
    for *_, (dtensors, count), _ in results:  # the blocks' layers split; the input and output whole
        assert 0 < dtensors < count


@pytest.mark.parametrize("dims", [{"dp_replicate_size": 2}, {"dp_shard_size": 2}], ids=str)
def test_pipeline_with_data_parallel_on_four_processes(dist_pool, dims):
    results = dist_pool(4).run(train_pp, 4, accumulation=2, clip=0.05, **dims, timeout=180)
    check_against_reference(results, 4, dp=2, accumulation=2, clip=0.05)
    for *_, (dtensors, count), _ in results:  # FSDP2 shards each stage
        assert dtensors == (count if "dp_shard_size" in dims else 0)
    # the mesh is (pp, dp), pp outermost: ranks 0 and 1 are the two replicas of stage 0, each
    # seeing half of every batch, so their losses' mean is the batch's loss
    reference_losses, _, _ = reference(4, accumulation=2, clip=0.05, dp=2)
    for step, expected in enumerate(reference_losses):
        halves = [results[0][0][step], results[1][0][step]]
        assert sum(halves) / 2 == pytest.approx(expected, abs=1e-5)


def _prepared(pp_size, schedule="1F1B", dp_shard_size=1, kind="net"):
    from cadence import Accelerator
    from cadence.plugins import ParallelismConfig, PipelineParallelConfig

    config = ParallelismConfig(
        pp_size=pp_size,
        dp_shard_size=dp_shard_size,
        pp_handler=PipelineParallelConfig(schedule=schedule, loss_fn=loss_fn),
    )
    acc = Accelerator(parallelism_config=config)
    model = make_model(kind)
    optimizer = make_optimizer(model)
    return acc, acc.prepare(model, optimizer, make_scheduler(optimizer))


def _steps(acc, objects, first, count):
    model, optimizer, scheduler = objects
    x, y = make_data(first + count)
    for step in range(first, first + count):
        batch = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
        acc.backward(model(x[batch], labels=y[batch]))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


def save_then_resume(folder, pp_size, schedule, resume_pp_size, resume_schedule):
    """2 steps, save_state (each stage writes its own part), 2 steps; then a fresh Accelerator on
    `resume_pp_size` loads the state and trains the same 2 steps."""
    import torch.distributed as dist

    from cadence.state import reset_state

    acc, objects = _prepared(pp_size, schedule)
    _steps(acc, objects, 0, 2)
    acc.save_state(folder)
    _steps(acc, objects, 2, 2)
    straight = acc.get_state_dict(objects[0])
    acc.save_model(objects[0], folder + "-model")  # the whole model's safetensors, from every stage
    reset_state()
    dist.barrier()
    acc, objects = _prepared(resume_pp_size, resume_schedule)
    acc.load_state(folder)
    _steps(acc, objects, 2, 2)
    return straight, acc.get_state_dict(objects[0])


@pytest.mark.parametrize(
    "resume", [("1F1B", 2, "1F1B"), ("GPipe", 2, "Interleaved1F1B")], ids=["same", "resplit"]
)
def test_save_state_per_stage_and_resume(dist_pool, tmp_path, resume):
    schedule, resume_pp, resume_schedule = resume
    results = dist_pool(2).run(
        save_then_resume,
        str(tmp_path / "ckpt"),
        2,
        schedule,
        resume_pp,
        resume_schedule,
        timeout=180,
    )
    straight, resumed = results[0]
    _, weights, _ = reference(4)
    from safetensors.torch import load_file

    saved_model = load_file(str(tmp_path / "ckpt-model" / "model.safetensors"))
    for state in (straight, resumed, saved_model):
        assert sorted(state) == sorted(weights)
        assert max((state[k] - weights[k]).abs().max().item() for k in weights) < 1e-5
    # the stages' parts of the checkpoint merge into the whole model as it was after 2 steps
    from cadence.checkpointing.merge import merge_fsdp_weights

    merge_fsdp_weights(str(tmp_path / "ckpt" / "pytorch_model_fsdp_0"), str(tmp_path / "merged"))
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    _, after_two, _ = reference(2)
    assert sorted(merged) == sorted(after_two)
    assert max((merged[k] - after_two[k]).abs().max().item() for k in after_two) < 1e-5


def make_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def llama_batches(steps: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(7)
    return torch.randint(0, 64, (steps, GLOBAL_BATCH // 2, 8), generator=generator)


def train_llama_pp(steps: int, pp_size: int, schedule: str, split_points=None):
    """A tiny transformers Llama under pp, its loss computed by the default causal LM loss."""
    from cadence import Accelerator
    from cadence.plugins import ParallelismConfig, PipelineParallelConfig

    handler = PipelineParallelConfig(schedule=schedule, split_points=split_points)
    config = ParallelismConfig(pp_size=pp_size, pp_handler=handler)
    acc = Accelerator(parallelism_config=config)
    model = make_llama()
    optimizer = make_optimizer(model)
    model, optimizer = acc.prepare(model, optimizer)
    assert model.config.vocab_size == 64  # the transformers config stays readable
    losses = []
    for ids in llama_batches(steps):
        outputs = model(input_ids=ids, labels=ids, attention_mask=torch.ones_like(ids))
        acc.backward(outputs.loss)
        losses.append(outputs.loss.item())
        acc.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    try:
        getattr(outputs, "logits")  # noqa: B009 - the attribute read is what is tested
    except AttributeError as error:
        refusal = str(error)
    return losses, acc.get_state_dict(model), refusal


@pytest.mark.parametrize(
    "schedule,split_points",
    [("1F1B", None), ("Interleaved1F1B", None), ("GPipe", ["model.layers.1"])],
)
def test_tiny_llama_matches_one_process(dist_pool, schedule, split_points):
    pytest.importorskip("transformers")
    results = dist_pool(2).run(train_llama_pp, 3, 2, schedule, split_points, timeout=180)
    model = make_llama()
    optimizer = make_optimizer(model)
    losses = []
    for ids in llama_batches(3):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.item())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    for rank_losses, _, refusal in results:
        assert rank_losses == pytest.approx(losses, abs=1e-5)
        assert "returns only the loss, not 'logits'" in refusal
    state, weights = results[0][1], model.state_dict()
    assert sorted(state) == sorted(weights)
    assert max((state[k] - weights[k]).abs().max().item() for k in weights) < 1e-5


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda c: c.ParallelismConfig(pp_size=2, sp_size=2), "cannot be combined with sequence"),
        (lambda c: c.ParallelismConfig(pp_size=2, cp_size=2, dp_shard_size=2), "with context"),
        (lambda c: c.ParallelismConfig(pp_size=0), "pp_size must be an integer"),
        (lambda c: c.PipelineParallelConfig(schedule="Zigzag"), "Unknown pipeline schedule"),
        (
            lambda c: c.PipelineParallelConfig(schedule="GPipe", stages_per_process=2),
            "runs one stage per process",
        ),
        (
            lambda c: c.PipelineParallelConfig(schedule="ZBVZeroBubble", stages_per_process=3),
            "exactly 2 stages per process",
        ),
        (lambda c: c.PipelineParallelConfig(split_points="layers.4"), "list of module names"),
        (
            lambda c: c.ParallelismConfig(
                pp_size=2, pp_handler=c.PipelineParallelConfig(split_points=["a", "b"])
            ),
            "needs 2 stages, so 1 split points",
        ),
        (
            lambda c: c.ParallelismConfig(
                pp_size=4, pp_handler=c.PipelineParallelConfig(n_microbatches=2)
            ),
            "at least as many micro-batches as stages",
        ),
        (
            lambda c: c.ParallelismConfig(
                pp_size=2, pp_handler=c.PipelineParallelConfig("Interleaved1F1B", n_microbatches=3)
            ),
            "multiple of pp_size",
        ),
    ],
)
def test_config_refusals(make, message):
    import cadence.plugins as plugins

    with pytest.raises(ValueError, match=message):
        make(plugins)


def test_sizes_must_multiply_to_the_world_size():
    from cadence.core.enums import DistributedType
    from cadence.plugins import ParallelismConfig

    config = ParallelismConfig(pp_size=2, dp_shard_size=2)
    assert config.total_size == 4 and config.active_mesh_dims == ["pp", "dp_shard"]
    assert config.to_json()["pp_handler"]["schedule"] == "1F1B"
    with pytest.raises(ValueError, match=r"total_size \(4 = pp 2 x"):
        config.validate(2, DistributedType.MULTI_CPU, False, True)


def refusals_on_two_processes():
    """Each bad use, refused in words on every rank; returns the messages in order."""
    from cadence import Accelerator
    from cadence.plugins import ParallelismConfig, PipelineParallelConfig
    from cadence.state import reset_state

    def attempt(action):
        try:
            action()
        except (ValueError, TypeError) as error:
            return str(error)
        return "no error"

    def accelerator(**options):
        reset_state()  # each attempt with its own configuration
        handler = PipelineParallelConfig(**options)
        return Accelerator(parallelism_config=ParallelismConfig(pp_size=2, pp_handler=handler))

    messages = [attempt(lambda: accelerator().prepare(make_model()))]  # no loss function
    tied = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(), torch.nn.Linear(WIDTH, WIDTH)
    )
    tied[2].weight = tied[0].weight
    messages.append(attempt(lambda: accelerator(loss_fn=loss_fn).prepare(tied)))
    messages.append(
        attempt(
            lambda: accelerator(loss_fn=loss_fn, split_points=["blocks.9"]).prepare(make_model())
        )
    )
    acc = accelerator(loss_fn=loss_fn)
    model = acc.prepare(make_model())
    x, y = make_data(1)
    messages.append(attempt(lambda: model(x)))  # no labels
    messages.append(attempt(lambda: model(x[:3], labels=y[:3])))  # 3 samples, 2 micro-batches
    messages.append(attempt(lambda: acc.backward(x.sum() * torch.ones((), requires_grad=True))))
    return messages


def test_refusals_on_two_processes(dist_pool):
    results = dist_pool(2).run(refusals_on_two_processes, timeout=120)
    expected = [
        "the last stage computes the loss",
        "is tied to",
        "split_points names 'blocks.9'",
        "computes the loss itself",
        "does not divide into 2 equal micro-batches",
        "already ran the backward pass",
    ]
    for rank, messages in enumerate(results):
        assert len(messages) == len(expected)
        for message, words in zip(messages, expected):
            assert words in message and f"[rank {rank}]" in message, message


def meta_model_loads_a_checkpoint(folder):
    """A model built with init_empty_weights gets real weights for this process's stages only; after
    load_state of a checkpoint written after 2 steps it trains on as one process does."""
    import torch.distributed as dist

    from cadence import init_empty_weights
    from cadence.state import reset_state

    acc, objects = _prepared(2)
    _steps(acc, objects, 0, 2)
    acc.save_state(folder)
    reset_state()
    dist.barrier()
    from cadence import Accelerator
    from cadence.plugins import ParallelismConfig, PipelineParallelConfig

    config = ParallelismConfig(pp_size=2, pp_handler=PipelineParallelConfig(loss_fn=loss_fn))
    acc = Accelerator(parallelism_config=config)
    with init_empty_weights():
        model = make_model()
    optimizer = make_optimizer(model)  # built on the meta parameters, as a script would
    whole = sum(p.numel() for p in model.parameters())
    objects = acc.prepare(model, optimizer, make_scheduler(optimizer))
    model, optimizer, _ = objects
    real = sum(p.numel() for p in model.parameters() if not p.is_meta)
    in_optimizer = sum(p.numel() for g in optimizer.param_groups for p in g["params"])
    acc.load_state(folder)
    _steps(acc, objects, 2, 2)
    return whole, real, in_optimizer, acc.get_state_dict(model)


def test_a_meta_device_model_builds_only_its_stages(dist_pool, tmp_path):
    results = dist_pool(2).run(meta_model_loads_a_checkpoint, str(tmp_path / "init"), timeout=180)
    _, weights, _ = reference(4)
    for whole, real, in_optimizer, _ in results:
        assert real == in_optimizer < whole  # this rank's stages only, and the optimizer follows
    assert results[0][1] + results[1][1] == results[0][0]
    state = results[0][3]
    assert max((state[k] - weights[k]).abs().max().item() for k in weights) < 1e-5


def meta_llama_trains():
    from cadence import Accelerator, init_empty_weights
    from cadence.plugins import ParallelismConfig

    acc = Accelerator(parallelism_config=ParallelismConfig(pp_size=2))
    with init_empty_weights(include_buffers=True):  # the rotary frequencies on meta too
        model = make_llama()
    optimizer = make_optimizer(model)
    model, optimizer = acc.prepare(model, optimizer)
    ids = llama_batches(1)[0]
    losses = []
    for _ in range(2):
        loss = model(input_ids=ids, labels=ids).loss
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, any(p.is_meta for p in model.parameters())


def test_a_meta_device_llama_is_initialized_per_stage(dist_pool):
    pytest.importorskip("transformers")
    results = dist_pool(2).run(meta_llama_trains, timeout=180)
    for losses, meta in results:
        assert not meta and losses == results[0][0]
        # a fresh initialization predicts about uniformly over the 64 tokens, then learns
        assert abs(losses[0] - torch.log(torch.tensor(64.0)).item()) < 0.2 and losses[1] < losses[0]


def save_sequential(folder):
    acc, objects = _prepared(2, kind="sequential")
    _steps(acc, objects, 0, 2)
    acc.save_state(folder)


def resume_sequential(folder):
    acc, objects = _prepared(4, kind="sequential")
    acc.load_state(folder)
    _steps(acc, objects, 2, 2)
    return acc.get_state_dict(objects[0])


def test_resume_on_another_pp_size(dist_pool, tmp_path):
    """Saved by pp 2 on 2 processes, loaded by pp 4 on 4: each stage reads its own parameters."""
    folder = str(tmp_path / "ckpt")
    dist_pool(2).run(save_sequential, folder, timeout=120)
    state = dist_pool(4).run(resume_sequential, folder, timeout=120)[0]
    _, weights, _ = reference(4, kind="sequential")
    assert max((state[k] - weights[k]).abs().max().item() for k in weights) < 1e-5


def gradients_of_one_batch(schedule, dp_shard_size=1, tp_size=1):
    """Every parameter's gradient after one batch (before the optimizer), gathered on rank 0."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from cadence import Accelerator
    from cadence.plugins import ParallelismConfig, PipelineParallelConfig

    config = ParallelismConfig(
        pp_size=2,
        dp_shard_size=dp_shard_size,
        tp_size=tp_size,
        pp_handler=PipelineParallelConfig(schedule=schedule, loss_fn=loss_fn),
    )
    acc = Accelerator(parallelism_config=config)
    model = acc.prepare(make_model())
    x, y = make_data(1)
    share = GLOBAL_BATCH // dp_shard_size
    dp_rank = acc.process_index % dp_shard_size  # the mesh is (pp, dp_shard) or (pp, tp)
    if tp_size > 1:
        dp_rank = 0
    begin = dp_rank * share
    acc.backward(model(x[begin : begin + share], labels=y[begin : begin + share]))
    grads = {}
    for name, param in model.module.named_parameters():
        grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
        grads[name] = grad.detach().clone()
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, grads)
    return {k: v for part in gathered for k, v in part.items()}


@pytest.mark.parametrize(
    "processes,options",
    [
        (2, {"schedule": "1F1B"}),
        (2, {"schedule": "ZBVZeroBubble"}),
        (4, {"schedule": "GPipe", "dp_shard_size": 2}),
        (4, {"schedule": "1F1B", "tp_size": 2}),
    ],
    ids=["1F1B", "ZBV", "dp_shard", "tp"],
)
def test_every_gradient_equals_one_process(dist_pool, processes, options):
    grads = dist_pool(processes).run(gradients_of_one_batch, **options, timeout=120)[0]
    model = make_model()
    x, y = make_data(1)
    loss_fn(model(x), y).backward()
    expected = {name: p.grad for name, p in model.named_parameters()}
    assert sorted(grads) == sorted(expected)
    assert max((grads[k] - expected[k]).abs().max().item() for k in expected) < 1e-6
