"""The blocks choose their fusions themselves: for a one-row step (what goes through the Triton GEMV on
CUDA; here forced on the CPU, under the Triton interpreter) an RMSNorm goes into the first projection
and the gated activation into the down projection, one kernel each; for a few rows both into the gate/up
projection, the down projection plain (up to a number of inputs); another norm takes the plain path, and so do
more rows."""

import functools
from types import SimpleNamespace

import pytest
import torch
from torch import nn

pytest.importorskip("triton")
# the one-row kernels are sent CPU tensors, which only the Triton interpreter (conftest's choice without a GPU) runs
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="runs the Triton kernels interpreted, on the CPU")
from nanovllm.kernels import triton_gemv  # noqa: E402
from nanovllm.layers import fused_projection, linear  # noqa: E402
from nanovllm.layers.layernorm import RMSNorm  # noqa: E402
from nanovllm.models import blocks  # noqa: E402
from nanovllm.models.blocks import DecoderLayer, GatedMLP, SparseMoeBlock, rotary_embeddings  # noqa: E402
from nanovllm.models.model_config import ModelConfig  # noqa: E402

CONFIG_FIELDS = SimpleNamespace(
    architectures=["Qwen3ForCausalLM"],
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_hidden_layers=1,
    max_position_embeddings=64,
)
CONFIG = ModelConfig.from_hf(CONFIG_FIELDS)


@pytest.fixture
def launches(monkeypatch):
    """Counts of the GEMV kernels launched, with the products they take on CUDA sent to them on the CPU too."""
    counts = {"rms_norm_gemv": 0, "gated_gemv": 0, "gemv": 0}

    def counting(name):
        kernel = getattr(triton_gemv, name)

        def launch(*args, **kwargs):
            counts[name] += 1
            return kernel(*args, **kwargs)

        return launch

    for name in counts:
        monkeypatch.setattr(triton_gemv, name, counting(name))
    for module in (fused_projection, blocks):
        monkeypatch.setattr(module, "one_row_on_cuda", lambda x: x.size(0) == 1)
    for module in (fused_projection, linear):
        monkeypatch.setattr(module, "uses_gemv", lambda x: x.size(0) <= linear.GEMV_MAX_ROWS)
    return counts


def random_mlp(norm: nn.Module, config: ModelConfig = CONFIG) -> GatedMLP:
    torch.manual_seed(0)
    mlp = GatedMLP(config, norm)
    for p in [*mlp.parameters(), *norm.parameters()]:
        p.data.uniform_(-0.5, 0.5)
    return mlp


def plain_mlp(mlp: GatedMLP, norm: nn.Module, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    gate, up = (norm(x + residual) @ mlp.gate_up_proj.weight.T).chunk(2, dim=-1)
    return (nn.functional.silu(gate) * up) @ mlp.down_proj.weight.T


def test_rms_norm_and_silu_are_fused_into_the_projections_of_a_one_row_step(launches):
    norm = RMSNorm(CONFIG.hidden_size, CONFIG.rms_norm_eps)
    mlp = random_mlp(norm)
    x, residual = torch.randn(1, 64), torch.randn(1, 64)
    y, next_residual = mlp(x, residual)
    assert launches == {"rms_norm_gemv": 1, "gated_gemv": 1, "gemv": 0}
    torch.testing.assert_close(y, plain_mlp(mlp, norm, x, residual), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(next_residual, x + residual, atol=0, rtol=0)


def test_geglu_is_fused_into_the_down_projection_too(launches):
    config = ModelConfig.from_hf(SimpleNamespace(**{**vars(CONFIG_FIELDS), "hidden_act": "gelu_pytorch_tanh"}))
    norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
    mlp = random_mlp(norm, config)
    x, residual = torch.randn(1, 64), torch.randn(1, 64)
    y, _ = mlp(x, residual)
    assert launches == {"rms_norm_gemv": 1, "gated_gemv": 1, "gemv": 0}
    gate, up = (norm(x + residual) @ mlp.gate_up_proj.weight.T).chunk(2, dim=-1)
    want = (nn.functional.gelu(gate, approximate="tanh") * up) @ mlp.down_proj.weight.T
    torch.testing.assert_close(y, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("hidden_act", ["silu", "gelu_pytorch_tanh"])
@pytest.mark.parametrize("rows, fused", [(3, 1), (linear.GEMV_MAX_ROWS + 1, 0)])
def test_several_rows_read_the_norm_and_the_activation_in_the_gate_up_projection(launches, rows, fused, hidden_act):
    # a few rows: norm, gate/up and activation in one GEMV of a few rows, then a plain one; more: in PyTorch
    config = ModelConfig.from_hf(SimpleNamespace(**{**vars(CONFIG_FIELDS), "hidden_act": hidden_act}))
    norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
    mlp = random_mlp(norm, config)
    x, residual = torch.randn(rows, 64), torch.randn(rows, 64)
    y, next_residual = mlp(x, residual)
    assert launches == {"rms_norm_gemv": fused, "gated_gemv": 0, "gemv": fused}
    gate, up = (norm(x + residual) @ mlp.gate_up_proj.weight.T).chunk(2, dim=-1)
    activation = (
        nn.functional.silu if hidden_act == "silu" else functools.partial(nn.functional.gelu, approximate="tanh")
    )
    torch.testing.assert_close(y, (activation(gate) * up) @ mlp.down_proj.weight.T, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(next_residual, x + residual, atol=0, rtol=0)


def test_several_rows_of_many_inputs_run_the_norm_and_the_activation_apart(launches, monkeypatch):
    monkeypatch.setattr(fused_projection, "ROWS_FUSION_MAX_INPUTS", CONFIG.hidden_size - 1)
    norm = RMSNorm(CONFIG.hidden_size, CONFIG.rms_norm_eps)
    mlp = random_mlp(norm)
    x, residual = torch.randn(3, 64), torch.randn(3, 64)
    y, next_residual = mlp(x, residual)
    assert launches == {"rms_norm_gemv": 0, "gated_gemv": 0, "gemv": 2}
    torch.testing.assert_close(y, plain_mlp(mlp, norm, x, residual), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(next_residual, x + residual, atol=0, rtol=0)


def test_a_norm_without_a_fused_kernel_takes_the_plain_path(launches):
    norm = nn.LayerNorm(CONFIG.hidden_size)
    mlp = random_mlp(norm)
    x, residual = torch.randn(1, 64), torch.randn(1, 64)
    y, next_residual = mlp(x, residual)
    assert launches["rms_norm_gemv"] == 0 and launches["gated_gemv"] == 1
    torch.testing.assert_close(y, plain_mlp(mlp, norm, x, residual), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(next_residual, x + residual, atol=0, rtol=0)


def test_a_biased_projection_keeps_the_fused_kernels_and_adds_its_bias(launches):
    config = ModelConfig.from_hf(SimpleNamespace(**{**vars(CONFIG_FIELDS), "mlp_bias": True}))
    norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
    mlp = random_mlp(norm, config)
    x, residual = torch.randn(1, 64), torch.randn(1, 64)
    y, _ = mlp(x, residual)
    assert launches == {"rms_norm_gemv": 1, "gated_gemv": 1, "gemv": 0}
    gate, up = (norm(x + residual) @ mlp.gate_up_proj.weight.T + mlp.gate_up_proj.bias).chunk(2, dim=-1)
    want = (nn.functional.silu(gate) * up) @ mlp.down_proj.weight.T + mlp.down_proj.bias
    torch.testing.assert_close(y, want, atol=1e-5, rtol=1e-5)


def test_a_moe_block_runs_its_norm_inside_the_router_projection_of_a_one_row_step(launches):
    config = ModelConfig.from_hf(
        SimpleNamespace(
            **{
                **vars(CONFIG_FIELDS),
                "architectures": ["Qwen3MoeForCausalLM"],
                "num_experts": 6,
                "num_experts_per_tok": 2,
            }
        )
    )
    norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
    torch.manual_seed(0)
    block = SparseMoeBlock(config, norm)
    for p in [*block.parameters(), *norm.parameters()]:
        p.data.uniform_(-0.5, 0.5)
    rows, residuals = torch.randn(3, 64), torch.randn(3, 64)
    want, want_residual = block(rows, residuals)  # several rows: the norm, then the router
    assert launches["rms_norm_gemv"] == 0
    for row in range(3):
        y, next_residual = block(rows[row : row + 1], residuals[row : row + 1])
        torch.testing.assert_close(y, want[row : row + 1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(next_residual, want_residual[row : row + 1], atol=0, rtol=0)
    assert launches["rms_norm_gemv"] == 3


def test_a_layer_owns_its_norms_under_the_checkpoint_names():
    names = [
        name for name, _ in DecoderLayer(CONFIG, 0, rotary_embeddings(CONFIG)["full_attention"]).named_parameters()
    ]
    assert [n for n in names if "layernorm" in n] == ["input_layernorm.weight", "post_attention_layernorm.weight"]
    assert "self_attn.q_norm.weight" in names and "self_attn.k_norm.weight" in names  # Qwen3's q/k norm


def test_a_norm_scaling_by_one_plus_its_weight_loads_as_that_scale_and_stays_fused(launches):
    # Gemma's checkpoint weight w scales by 1 + w: loaded as 1 + w, the fused kernels compute it as any norm
    norm = RMSNorm(CONFIG.hidden_size, CONFIG.rms_norm_eps, unit_offset=True)
    mlp = random_mlp(norm)
    checkpoint_weight = torch.rand(CONFIG.hidden_size) - 0.5
    norm.weight.weight_loader(norm.weight, checkpoint_weight)
    x, residual = torch.randn(1, 64), torch.randn(1, 64)
    y, _ = mlp(x, residual)
    assert launches == {"rms_norm_gemv": 1, "gated_gemv": 1, "gemv": 0}
    s = x + residual
    normed = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + CONFIG.rms_norm_eps) * (1 + checkpoint_weight)
    gate, up = (normed @ mlp.gate_up_proj.weight.T).chunk(2, dim=-1)
    want = (nn.functional.silu(gate) * up) @ mlp.down_proj.weight.T
    torch.testing.assert_close(y, want, atol=1e-5, rtol=1e-5)


def test_a_gemma2_layer_owns_four_norms_under_the_checkpoint_names():
    config = ModelConfig.from_hf(SimpleNamespace(**{**vars(CONFIG_FIELDS), "architectures": ["Gemma2ForCausalLM"]}))
    names = [
        name for name, _ in DecoderLayer(config, 0, rotary_embeddings(config)["sliding_attention"]).named_parameters()
    ]
    assert sorted(n for n in names if "layernorm" in n) == [
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
        "post_feedforward_layernorm.weight",
        "pre_feedforward_layernorm.weight",
    ]
