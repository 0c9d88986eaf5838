"""Training on N processes ends where training on 1 process with the same global batches ends.

Expected values come from first principles: DDP averages the per-rank mean gradients, so with equal
per-rank batches one step on N processes equals one step on 1 process over the union of their batches.
"""

import pytest
import torch

DATASET_SIZE = 48
GLOBAL_BATCH = 12


def make_data():
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(DATASET_SIZE, 4, generator=generator)
    y = x @ torch.tensor([[1.5], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(
        DATASET_SIZE, 1, generator=generator
    )
    return torch.utils.data.TensorDataset(x, y)


def train(
    optimizer_name="sgd",
    split_batches=False,
    accumulation=1,
    mixed_precision="no",
    epochs=2,
    with_scheduler=False,
    shuffle=False,
):
    from cadence import Accelerator, DataLoaderConfiguration, GradScalerKwargs

    torch.manual_seed(0)
    acc = Accelerator(
        mixed_precision=mixed_precision,
        gradient_accumulation_steps=accumulation,
        dataloader_config=DataLoaderConfiguration(split_batches=split_batches),
        kwargs_handlers=[GradScalerKwargs(init_scale=2.0**6)],
    )
    micro_global = GLOBAL_BATCH // accumulation
    batch_size = micro_global if split_batches else micro_global // acc.num_processes
    loader = torch.utils.data.DataLoader(make_data(), batch_size=batch_size, shuffle=shuffle)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    if optimizer_name == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + 0.1 * step))
    if with_scheduler:
        model, optimizer, loader, scheduler = acc.prepare(model, optimizer, loader, scheduler)
    else:
        model, optimizer, loader = acc.prepare(model, optimizer, loader)
    losses = []
    for _ in range(epochs):
        for x, y in loader:
            with acc.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                acc.backward(loss)
                optimizer.step()
                if with_scheduler:
                    scheduler.step()
                optimizer.zero_grad()
            losses.append(loss.item())
    state = {k: v.detach().clone() for k, v in acc.unwrap_model(model).state_dict().items()}
    lr = scheduler.get_last_lr()[0] if with_scheduler else None
    return state, lr, len(loader)


def assert_same_weights(a, b, tol):
    for key in a:
        assert torch.allclose(a[key], b[key], atol=tol, rtol=tol), (key, a[key], b[key])


CASES = [
    pytest.param(dict(optimizer_name="sgd"), 1e-5, id="sgd"),
    pytest.param(dict(optimizer_name="adamw"), 1e-5, id="adamw"),
    pytest.param(dict(optimizer_name="sgd", split_batches=True), 1e-5, id="sgd-split"),
    pytest.param(dict(optimizer_name="adamw", split_batches=True, with_scheduler=True), 1e-5, id="adamw-split-sched"),
    pytest.param(dict(optimizer_name="sgd", accumulation=2), 1e-5, id="sgd-accumulate"),
    pytest.param(dict(optimizer_name="adamw", accumulation=2, split_batches=True), 1e-5, id="adamw-accumulate-split"),
    pytest.param(dict(optimizer_name="sgd", mixed_precision="bf16"), 3e-2, id="sgd-bf16"),
    pytest.param(dict(optimizer_name="adamw", mixed_precision="fp16"), 1e-2, id="adamw-fp16"),
]  # fmt: skip


@pytest.mark.parametrize("config, tol", CASES)
@pytest.mark.parametrize("n", [2, 3])
def test_n_processes_match_one_process(dist_pool, n, config, tol):
    reference = dist_pool(1).run(train, **config)[0]
    results = dist_pool(n).run(train, **config)
    for state, lr, _ in results:
        assert_same_weights(reference[0], state, tol)
        assert lr == reference[1]
    # every rank ends with the same weights
    for state, _, _ in results[1:]:
        assert_same_weights(results[0][0], state, 0)


def test_scheduler_advances_num_processes_steps_per_optimizer_step(dist_pool):
    # Without split_batches each optimizer step on N processes consumes N per-process batches, so the
    # scheduler advances N steps: after S optimizer steps lr = 1 / (1 + 0.1 * N * S).
    for n in (1, 2):
        _, lr, steps = dist_pool(n).run(train, with_scheduler=True, epochs=1)[0]
        assert steps == DATASET_SIZE // GLOBAL_BATCH
        assert lr == pytest.approx(0.05 / (1 + 0.1 * n * steps), rel=1e-9)


def trailing_window(accumulation, batch_size, size):
    from cadence import Accelerator

    torch.manual_seed(0)
    acc = Accelerator(gradient_accumulation_steps=accumulation)
    data = make_data()
    subset = torch.utils.data.Subset(data, range(size))
    loader = torch.utils.data.DataLoader(subset, batch_size=batch_size)
    model = torch.nn.Linear(4, 1)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    syncs = []
    for x, y in loader:
        with acc.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            acc.backward(loss)
            syncs.append(acc.sync_gradients)
            optimizer.step()
            optimizer.zero_grad()
    final = {k: v.detach().clone() for k, v in acc.unwrap_model(model).state_dict().items()}
    return initial, final, syncs


def test_trailing_partial_window_uses_the_mean_of_its_micro_batches(dist_pool):
    # 10 samples, batch 2 -> 5 micro-batches; windows of 3: [b0 b1 b2], [b3 b4].
    initial, final, syncs = dist_pool(1).run(trailing_window, 3, 2, 10)[0]
    assert syncs == [False, False, True, False, True]
    data = make_data()
    x, y = data.tensors[0][:10], data.tensors[1][:10]
    model = torch.nn.Linear(4, 1)
    model.load_state_dict(initial)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for window in ([0, 1, 2], [3, 4]):
        optimizer.zero_grad()
        for b in window:
            loss = torch.nn.functional.mse_loss(model(x[2 * b : 2 * b + 2]), y[2 * b : 2 * b + 2])
            (loss / len(window)).backward()
        optimizer.step()
    for key, value in model.state_dict().items():
        assert torch.allclose(final[key], value, atol=1e-6), key


def fp16_overflow():
    from cadence import Accelerator, GradScalerKwargs

    torch.manual_seed(0)
    acc = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)])
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = acc.prepare(model, optimizer, scheduler)
    before = acc.unwrap_model(model).weight.detach().clone()
    scale_before = acc.scaler.get_scale()
    loss = model(torch.ones(2, 4)).sum() * float("inf")  # an injected overflow
    acc.backward(loss)
    optimizer.step()
    scheduler.step()
    skipped = acc.optimizer_step_was_skipped
    after = acc.unwrap_model(model).weight.detach().clone()
    optimizer.zero_grad()
    loss = model(torch.ones(2, 4)).sum()
    acc.backward(loss)
    optimizer.step()
    scheduler.step()
    return (
        skipped, torch.equal(before, after), acc.scaler.get_scale() < scale_before,
        scheduler.get_last_lr()[0], acc.optimizer_step_was_skipped,
    )  # fmt: skip


@pytest.mark.parametrize("n", [1, 2])
def test_fp16_overflow_skips_the_step_and_the_scheduler(dist_pool, n):
    for skipped, unchanged, scale_decreased, lr, second_skipped in dist_pool(n).run(fp16_overflow):
        assert skipped and unchanged and scale_decreased and not second_skipped
        # the skipped step did not move the scheduler; the good one moved it n times (no split_batches)
        assert lr == pytest.approx(0.1 * 0.5**n)


def clipping(norm_type, mixed_precision):
    from cadence import Accelerator, GradScalerKwargs

    torch.manual_seed(0)
    acc = Accelerator(
        mixed_precision=mixed_precision, kwargs_handlers=[GradScalerKwargs(init_scale=256.0)]
    )
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = acc.prepare(model, optimizer)
    x = torch.arange(8.0).reshape(2, 4) * (1 + acc.process_index)
    acc.backward(model(x).pow(2).sum())
    params = list(model.parameters())
    grads = [p.grad.detach().clone() for p in params]
    if acc.scaler is not None:
        grads = [g / acc.scaler.get_scale() for g in grads]
    expected = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(g, norm_type) for g in grads]), norm_type
    )
    total = acc.clip_grad_norm_(model.parameters(), 1.0, norm_type=norm_type)
    clipped = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(p.grad, norm_type) for p in params]), norm_type
    )
    acc.clip_grad_value_(model.parameters(), 0.01)
    max_value = max(p.grad.abs().max().item() for p in params)
    return total.item(), expected.item(), clipped.item(), max_value


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
@pytest.mark.parametrize("mixed_precision", ["no", "fp16"])
def test_clip_grad_norm_unscales_and_clips(dist_pool, norm_type, mixed_precision):
    for total, expected, clipped, max_value in dist_pool(2).run(
        clipping, norm_type, mixed_precision
    ):
        assert total == pytest.approx(expected, rel=1e-3)
        assert clipped == pytest.approx(1.0, rel=1e-3)
        assert max_value <= 0.01 + 1e-7


def prepare_behaviour():
    from cadence import Accelerator

    acc = Accelerator()
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    prepared, opt, other = acc.prepare(model, optimizer, {"not": "prepared"})
    again = acc.prepare(model)
    unwrapped = acc.unwrap_model(prepared)
    return (
        type(prepared).__name__, type(opt).__name__, other, again is prepared,
        unwrapped is model, type(unwrapped).__name__,
    )  # fmt: skip


def test_prepare_passes_others_through_and_is_idempotent(dist_pool):
    results = dist_pool(2).run(prepare_behaviour)
    for r in results:
        assert r == (
            "DistributedDataParallel",
            "AcceleratedOptimizer",
            {"not": "prepared"},
            True,
            True,
            "Linear",
        )
    assert dist_pool(1).run(prepare_behaviour)[0][0] == "Linear"


def no_sync_then_trigger():
    from cadence import Accelerator

    acc = Accelerator()
    torch.manual_seed(0)
    model = acc.prepare(torch.nn.Linear(2, 1, bias=False))
    x = torch.ones(1, 2) * (acc.process_index + 1)
    with acc.no_sync(model):
        acc.backward(model(x).sum())
    local = model.module.weight.grad.clone()
    with acc.trigger_sync_in_backward(model):
        acc.backward(model(x).sum())
    return local.tolist(), model.module.weight.grad.tolist()


def test_no_sync_and_trigger_sync_in_backward(dist_pool):
    results = dist_pool(2).run(no_sync_then_trigger)
    # without sync each rank keeps its own gradient x = (r+1); the synced backward averages
    # (local + own new grad): ((1+1) + (2+2)) / 2 = 3
    assert results[0][0] == [[1.0, 1.0]] and results[1][0] == [[2.0, 2.0]]
    assert results[0][1] == [[3.0, 3.0]] and results[1][1] == [[3.0, 3.0]]


def bad_constructor_arguments():
    from cadence import Accelerator, GradientAccumulationPlugin

    errors = []
    for kwargs in (
        dict(
            gradient_accumulation_steps=2,
            gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2),
        ),
        dict(mixed_precision="fp12"),
        dict(gradient_accumulation_steps=0),
        dict(unknown_option=True),
        dict(kwargs_handlers=["not a handler"]),
        dict(rng_types=["dice"]),
        dict(mixed_precision="fp8"),
    ):
        try:
            Accelerator(**kwargs)
            errors.append(None)
        except (TypeError, ValueError, ImportError, RuntimeError, NotImplementedError) as error:
            errors.append(str(error))
        from cadence.state import reset_state

        reset_state()
    return errors


def test_bad_constructor_arguments_are_clear_errors(dist_pool):
    errors = dist_pool(1).run(bad_constructor_arguments)[0]
    assert "not both" in errors[0]
    assert "fp12" in errors[1]
    assert "positive integer" in errors[2]
    assert "unknown_option" in errors[3]
    assert "KwargsHandler" in errors[4]
    assert "dice" in errors[5]
    assert "fp8" in errors[6] and ("torchao" in errors[6] or "GPU" in errors[6])


def train_with_hook(hook, wrapper="no"):
    from cadence import Accelerator, DistributedDataParallelKwargs

    torch.manual_seed(0)
    handler = DistributedDataParallelKwargs(
        comm_hook=hook, comm_wrapper=wrapper, comm_state_option={"matrix_approximation_rank": 2}
    )
    acc = Accelerator(kwargs_handlers=[handler])
    loader = torch.utils.data.DataLoader(make_data(), batch_size=GLOBAL_BATCH // acc.num_processes)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    first = last = None
    for _ in range(3):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            acc.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            first = loss.item() if first is None else first
            last = loss.item()
    return (
        {k: v.detach().clone() for k, v in acc.unwrap_model(model).state_dict().items()},
        first,
        last,
    )


@pytest.mark.parametrize(
    "hook, wrapper, tol",
    [
        ("fp16", "no", 1e-2),
        ("bf16", "no", 5e-2),
        ("power_sgd", "no", None),
        ("batched_power_sgd", "fp16", None),
    ],
)
def test_ddp_communication_hooks_work_on_gloo(dist_pool, hook, wrapper, tol):
    reference, _, _ = dist_pool(1).run(train_with_hook, "no")[0]
    results = dist_pool(2).run(train_with_hook, hook, wrapper)
    for state, first, last in results:
        assert last < first  # it trains
        if tol is not None:  # plain compression: close to the uncompressed result
            assert_same_weights(reference, state, tol)
    assert_same_weights(results[0][0], results[1][0], 0)


def compiled_training():
    import torch._dynamo

    from cadence import Accelerator

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    acc = Accelerator(dynamo_backend="aot_eager")
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = acc.prepare(model, optimizer)
    x, y = make_data().tensors
    for _ in range(2):
        loss = torch.nn.functional.mse_loss(model(x[:8]), y[:8])
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    unwrapped = acc.unwrap_model(model, keep_torch_compile=False)
    return graphs, type(model).__name__, type(unwrapped).__name__


def test_dynamo_backend_really_compiles_under_ddp(dist_pool):
    for graphs, wrapper, unwrapped in dist_pool(2).run(compiled_training):
        assert graphs >= 1
        assert wrapper == "DistributedDataParallel" and unwrapped == "Sequential"
