"""The tensor-parallel split layers are built for, the sizes it must divide, and where ranks meet."""

from types import SimpleNamespace

import pytest

from nanovllm.layers.linear import QKVParallelLinear, RowParallelLinear
from nanovllm.models.model_config import ModelConfig
from nanovllm.utils.parallel import check_divisible, rendezvous_address, tensor_parallel, tp_rank, tp_size


def test_layers_built_inside_the_scope_hold_their_share():
    with tensor_parallel(1, 2):
        assert (tp_rank(), tp_size()) == (1, 2)
        qkv = QKVParallelLinear(hidden_size=8, head_dim=4, num_heads=4, num_kv_heads=2)
        o = RowParallelLinear(16, 8)
    assert (tp_rank(), tp_size()) == (0, 1)
    # q: 2 of 4 heads, k and v: 1 of 2 heads, 4 wide each
    assert qkv.weight.shape == (2 * 4 + 4 + 4, 8)
    assert o.weight.shape == (8, 8) and (o.tp_rank, o.tp_size) == (1, 2)
    assert RowParallelLinear(16, 8).weight.shape == (8, 16)


def qwen3_moe(**fields) -> ModelConfig:
    return ModelConfig.from_hf(SimpleNamespace(architectures=["Qwen3MoeForCausalLM"], num_hidden_layers=4, **fields))


def test_the_experts_width_must_split_and_a_dense_width_only_where_a_layer_is_dense():
    with pytest.raises(ValueError, match=r"must divide the model's expert MLP width \(moe_intermediate_size\) = 34"):
        check_divisible(qwen3_moe(moe_intermediate_size=34), 4)
    check_divisible(qwen3_moe(intermediate_size=6), 4)  # no layer is dense: its width is never split
    with pytest.raises(ValueError, match=r"must divide the model's MLP width \(intermediate_size\) = 6"):
        check_divisible(qwen3_moe(intermediate_size=6, mlp_only_layers=[0]), 4)


def test_rendezvous_defaults_to_localhost_and_a_free_port(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    assert rendezvous_address(0) == ("127.0.0.1", 0)


def test_rendezvous_honours_the_environment_and_an_explicit_port(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")
    monkeypatch.setenv("MASTER_PORT", "29555")
    assert rendezvous_address(0) == ("10.1.2.3", 29555)
    assert rendezvous_address(31000) == ("10.1.2.3", 31000)
