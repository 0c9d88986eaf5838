"""The switches that turn Cadence's deliberate differences off (issue 12, part 4; docs/differences.md).

- `GradientAccumulationPlugin(adjust_last_window=False)`: every micro-step's loss is divided by
  `num_steps`, the last shorter window included, as the reference does.
- `DataLoaderConfiguration(resume_exact_order=False)`: a loader resumed mid-epoch draws its order
  again from the random state of the moment, as the reference does.

Expected values come from first principles (the reference's documented rule), not from a run.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset


# -- the last accumulation window ----------------------------------------------------------------
def accumulated_gradients(adjust_last_window: bool | None):
    from cadence import Accelerator
    from cadence.utils import GradientAccumulationPlugin

    options = {} if adjust_last_window is None else {"adjust_last_window": adjust_last_window}
    plugin = GradientAccumulationPlugin(num_steps=2, **options)
    acc = Accelerator(cpu=True, gradient_accumulation_plugin=plugin)
    model = torch.nn.Linear(1, 1, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    samples = torch.arange(1.0, 11.0).unsqueeze(1)  # 1..10
    loader = DataLoader(TensorDataset(samples), batch_size=1)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    weight = acc.unwrap_model(model).weight
    updates = []  # with SGD at lr 1, a step's update is the gradient the step used
    for (x,) in loader:
        with acc.accumulate(model):
            acc.backward(model(x).sum())  # d(w * x)/dw = x
            before = weight.item()
            optimizer.step()
            if acc.sync_gradients:
                updates.append(before - weight.item())
            optimizer.zero_grad()
    return updates


@pytest.mark.parametrize(
    ("adjust_last_window", "last"),
    [
        # Rank 0 reads 1, 3, 5, 7, 9 and rank 1 reads 2, 4, 6, 8, 10 (batch i goes to rank i % 2);
        # windows of two micro-steps, then a last window of one; DDP averages the two ranks.
        (None, (9 + 10) / 2),  # default: the last window is the mean of its one micro-batch
        (True, (9 + 10) / 2),
        (False, (9 / 2 + 10 / 2) / 2),  # the reference: divided by num_steps=2 all the same
    ],
)
def test_last_accumulation_window_switch(dist_pool, adjust_last_window, last):
    full_windows = [((1 + 3) / 2 + (2 + 4) / 2) / 2, ((5 + 7) / 2 + (6 + 8) / 2) / 2]
    results = dist_pool(2).run(accumulated_gradients, adjust_last_window)
    assert results == [pytest.approx([*full_windows, last])] * 2


def test_adjust_last_window_is_a_keyword_field_at_the_end():
    import dataclasses

    from cadence.utils import GradientAccumulationPlugin

    names = [field.name for field in dataclasses.fields(GradientAccumulationPlugin)]
    assert names[-1] == "adjust_last_window"
    # The reference's positional order is unchanged.
    assert names[:4] == ["num_steps", "adjust_scheduler", "sync_with_dataloader", "sync_each_batch"]
    assert GradientAccumulationPlugin(3).num_steps == 3
    assert GradientAccumulationPlugin().to_kwargs() == {}  # the default changes nothing


# -- resuming a shuffled epoch -------------------------------------------------------------------
def _save_then_resume(tmp_path, stateful: bool, exact: bool | None):
    """Run 1 reads 2 batches of a shuffled epoch and saves; run 2 loads and reads on. Returns the
    batches run 1 would have read next, run 2's batches, and the global RNG state at the save."""
    from cadence import Accelerator
    from cadence.state import reset_state
    from cadence.utils import DataLoaderConfiguration, set_seed

    options = {} if exact is None else {"resume_exact_order": exact}
    dataset = TensorDataset(torch.arange(12.0))

    def prepared():
        config = DataLoaderConfiguration(use_stateful_dataloader=stateful, **options)
        acc = Accelerator(cpu=True, dataloader_config=config)
        set_seed(0)
        return acc, acc.prepare(DataLoader(dataset, batch_size=2, shuffle=True))

    acc, loader = prepared()
    iterator = iter(loader)
    next(iterator), next(iterator)
    rng_at_save = torch.get_rng_state()
    acc.save_state(tmp_path / "ckpt")
    rest = [batch[0].tolist() for batch in iterator]
    reset_state()

    acc, loader = prepared()
    acc.load_state(tmp_path / "ckpt")
    resumed = [batch[0].tolist() for batch in loader]
    reset_state()
    return rest, resumed, rng_at_save


def _fresh_order_from(rng_state: torch.Tensor) -> list[list[float]]:
    """The batches a plain shuffled torch DataLoader draws from this global RNG state: what the
    reference's resumed loader reads (load_state restores the RNG as it was at the save)."""
    saved = torch.get_rng_state()
    torch.set_rng_state(rng_state)
    try:
        loader = DataLoader(TensorDataset(torch.arange(12.0)), batch_size=2, shuffle=True)
        return [batch[0].tolist() for batch in loader]
    finally:
        torch.set_rng_state(saved)


@pytest.mark.parametrize("stateful", [False, True])
@pytest.mark.parametrize("exact", [None, True])
def test_resume_is_exact_by_default(tmp_path, stateful, exact):
    if stateful:
        pytest.importorskip("torchdata.stateful_dataloader")
    rest, resumed, _ = _save_then_resume(tmp_path, stateful, exact)
    assert resumed == rest


def test_resume_like_the_reference_with_a_stateful_loader(tmp_path):
    pytest.importorskip("torchdata.stateful_dataloader")
    rest, resumed, rng_at_save = _save_then_resume(tmp_path, stateful=True, exact=False)
    # The reference's StatefulDataLoader skips the 2 batches handed out, of a freshly drawn order.
    assert resumed == _fresh_order_from(rng_at_save)[2:]
    assert resumed != rest  # the difference the switch exists for


def test_resume_like_the_reference_with_a_plain_loader(tmp_path):
    rest, resumed, rng_at_save = _save_then_resume(tmp_path, stateful=False, exact=False)
    # The reference saves no position for a plain DataLoader: the epoch starts over, freshly drawn.
    assert resumed == _fresh_order_from(rng_at_save)
    assert len(resumed) == 6 and len(rest) == 4


def test_resume_exact_order_is_a_keyword_field_at_the_end():
    import dataclasses

    from cadence.utils import DataLoaderConfiguration

    names = [field.name for field in dataclasses.fields(DataLoaderConfiguration)]
    assert names[-1] == "resume_exact_order"
    assert names[:-1] == [
        "split_batches",
        "dispatch_batches",
        "even_batches",
        "use_seedable_sampler",
        "data_seed",
        "non_blocking",
        "use_stateful_dataloader",
    ]
    with pytest.raises(TypeError, match="resume_exact_order"):
        DataLoaderConfiguration(resume_exact_order="no")


def test_the_differences_page_documents_both_switches():
    import dataclasses
    from pathlib import Path

    from cadence.utils import DataLoaderConfiguration, GradientAccumulationPlugin

    page = (Path(__file__).parent.parent / "docs" / "differences.md").read_text()
    for cls, field in (
        (GradientAccumulationPlugin, "adjust_last_window"),
        (DataLoaderConfiguration, "resume_exact_order"),
    ):
        assert field in {f.name for f in dataclasses.fields(cls)}
        assert f"{cls.__name__}(" in page and f"{field}=False" in page
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    assert "docs/differences.md" in readme
