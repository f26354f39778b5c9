"""The one-launch q/k RMSNorm + rotary kernel against the plain-PyTorch reference (on the CPU under
the Triton interpreter, which conftest selects, on small shapes)."""

import pytest
import torch

pytest.importorskip("triton")
from nanovllm.kernels.triton_norm_rotary import norm_rotate_qk  # noqa: E402
from nanovllm.layers.rotary_embedding import RotaryEmbedding, norm_rotate_qk_reference  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
# (tokens, heads, kv_heads, head_dim): Qwen3-0.6B's heads at one and many tokens; uneven head_dims
SHAPES = [(1, 16, 8, 128), (300, 16, 8, 128), (7, 4, 2, 64), (5, 3, 1, 24)] if ON_GPU else \
         [(1, 4, 2, 16), (6, 3, 1, 24)]
DTYPES = [torch.float32, torch.bfloat16] if ON_GPU else [torch.float32]


def qkv_views(tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype):
    """q and k as the strided views of one QKV projection output that attention passes."""
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device=DEVICE, dtype=dtype)
    q = qkv[:, :heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim:(heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    return q, k


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_equals_the_torch_reference(shape, dtype, norm):
    tokens, heads, kv_heads, head_dim = shape
    torch.manual_seed(0)
    rotary = RotaryEmbedding(head_dim, 4096, {"rope_theta": 1e6, "rope_type": "default"}).to(DEVICE)
    q, k = qkv_views(tokens, heads, kv_heads, head_dim, dtype)
    positions = torch.randint(0, 4096, (tokens,), device=DEVICE)
    positions[0] = 4095  # the table's last row
    weights = (None, None, 0.0)
    if norm:
        weights = (torch.rand(head_dim, device=DEVICE, dtype=dtype) + 0.5,
                   torch.rand(head_dim, device=DEVICE, dtype=dtype) + 0.5, 1e-6)
    got = norm_rotate_qk(positions, q, k, rotary.cos_sin, *weights)
    want = norm_rotate_qk_reference(positions, q.double(), k.double(), rotary.cos_sin.double(),
                                    *[w if w is None or isinstance(w, float) else w.double() for w in weights])
    tolerance = 3e-2 if dtype == torch.bfloat16 else 1e-5
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == dtype and g.is_contiguous()
        torch.testing.assert_close(g, w.to(dtype), atol=tolerance, rtol=tolerance)


def test_no_tokens_gives_empty_outputs():
    q, k = qkv_views(0, 4, 2, 16, torch.float32)
    rotary = RotaryEmbedding(16, 64, {"rope_theta": 1e4, "rope_type": "default"}).to(DEVICE)
    got_q, got_k = norm_rotate_qk(torch.zeros(0, dtype=torch.int64, device=DEVICE), q, k, rotary.cos_sin,
                                  None, None, 0.0)
    assert got_q.shape == (0, 4, 16) and got_k.shape == (0, 2, 16)
