"""ParallelismConfig and its per-dimension settings behave as the reference documents them: the device
mesh carries the flattened `dp`, `dp_shard_cp` and `dp_cp` dimensions (checked on 4 real gloo
processes), and bad settings fail with the reference's key phrases."""

from __future__ import annotations

import pytest


def mesh_dimensions(sizes: dict[str, int]) -> dict[str, object]:
    import torch.distributed as dist

    from cadence.plugins import ParallelismConfig

    config = ParallelismConfig(**sizes)
    mesh = config.build_device_mesh("cpu")
    flattened = {}
    for name in ("dp", "dp_shard_cp", "dp_cp"):
        sub = mesh[name]
        flattened[name] = (sub.size(), sub.get_local_rank())
    return {
        "rank": dist.get_rank(),
        "shape": tuple(mesh.shape),
        "names": tuple(mesh.mesh_dim_names),
        "flattened": flattened,
    }


def test_hsdp_mesh_flattens_the_data_parallel_dimensions(dist_pool):
    results = dist_pool(4).run(mesh_dimensions, {"dp_replicate_size": 2, "dp_shard_size": 2})
    for result in results:
        assert result["shape"] == (2, 2)
        assert result["names"] == ("dp_replicate", "dp_shard")
        rank = result["rank"]
        # dp = replicate x shard: every rank has its own data-parallel coordinate
        assert result["flattened"]["dp"] == (4, rank)
        # without context parallelism, dp_shard_cp is the shard dimension alone and dp_cp is dp
        assert result["flattened"]["dp_shard_cp"] == (2, rank % 2)
        assert result["flattened"]["dp_cp"] == (4, rank)


def test_fsdp_with_context_parallel_mesh_joins_shard_and_cp(dist_pool):
    results = dist_pool(4).run(mesh_dimensions, {"dp_shard_size": 2, "cp_size": 2})
    for result in results:
        assert result["shape"] == (2, 2)
        assert result["names"] == ("dp_shard", "cp")
        rank = result["rank"]
        # the ranks of one cp group see the same batch: dp is the shard dimension alone
        assert result["flattened"]["dp"] == (2, rank // 2)
        assert result["flattened"]["dp_shard_cp"] == (4, rank)
        assert result["flattened"]["dp_cp"] == (4, rank)


@pytest.mark.parametrize("strategy", ["invalid", "ring"])
def test_bad_cp_comm_strategy_names_the_value(strategy, monkeypatch):
    from cadence.plugins import ParallelismConfig
    from cadence.utils import TorchContextParallelConfig

    with pytest.raises(ValueError, match=f"Invalid cp_comm_strategy: {strategy}"):
        TorchContextParallelConfig(cp_comm_strategy=strategy)
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", strategy)
    with pytest.raises(ValueError, match=f"Invalid cp_comm_strategy: {strategy}"):
        ParallelismConfig(cp_size=2)


def test_cp_comm_strategy_from_the_environment(monkeypatch):
    from cadence.plugins import ParallelismConfig

    monkeypatch.setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "alltoall")
    assert ParallelismConfig(cp_size=2).cp_handler.cp_comm_strategy == "alltoall"


@pytest.mark.parametrize("name", ["foobar", "eager", "flex_attention", "someone/other-kernel"])
def test_sequence_parallel_rejects_attention_it_cannot_run(name, monkeypatch):
    from cadence.utils import DeepSpeedSequenceParallelConfig

    with pytest.raises(ValueError, match=f"Invalid sp_attn_implementation: {name}"):
        DeepSpeedSequenceParallelConfig(sp_attn_implementation=name)
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION", name)
    with pytest.raises(ValueError, match="Invalid sp_attn_implementation"):
        DeepSpeedSequenceParallelConfig()


@pytest.mark.parametrize(
    "name",
    [None, "sdpa", "flash_attention_2", "flash_attention_3", "kernels-community/flash-attn2"],
)
def test_sequence_parallel_accepts_flash_and_sdpa_attention(name):
    from cadence.utils import DeepSpeedSequenceParallelConfig

    config = DeepSpeedSequenceParallelConfig(sp_attn_implementation=name)
    assert config.sp_attn_implementation == name
    assert config.sp_seq_length_is_variable is True  # the documented default
