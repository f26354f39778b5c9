"""The one-launch q/k RMSNorm + rotary + K/V store kernel against the plain-PyTorch reference (on the
CPU under the Triton interpreter, which conftest selects, on small shapes)."""

import pytest
import torch

pytest.importorskip("triton")
from nanovllm.kernels.fp8_kv import FP8_DTYPE  # noqa: E402
from nanovllm.kernels.torch_attention import store_kvcache  # noqa: E402
from nanovllm.kernels.triton_norm_rotary_store import norm_rotate_store  # noqa: E402
from nanovllm.layers.rotary_embedding import RotaryEmbedding, norm_rotate_qk_reference  # noqa: E402
from nanovllm.worker.kv_cache import LayerKVCache  # noqa: E402

from helpers.paged_cases import spread_blocks  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
# on a GPU every test here runs there, so the GPU suite (`scripts/gpu_test.sh`, marker `gpu`) takes them all
pytestmark = pytest.mark.gpu if DEVICE == "cuda" else []
# (tokens, heads, kv_heads, head_dim): Qwen3-0.6B's heads at one and many tokens, Gemma 2's head_dim 256;
# uneven head_dims; up to 16 tokens a program takes one KV head and its query heads, past that one token's heads
SHAPES = (
    [
        (1, 16, 8, 128),
        (300, 16, 8, 128),
        (1, 16, 8, 256),
        (40, 16, 8, 256),
        (7, 4, 2, 64),
        (5, 3, 1, 24),
        (40, 6, 2, 24),
    ]
    if ON_GPU
    else [(1, 4, 2, 16), (6, 3, 1, 24), (20, 6, 2, 24)]
)
DTYPES = [torch.float32, torch.bfloat16] if ON_GPU else [torch.float32]
# the share of each head that turns: all of it, or Phi-4-mini's 0.75 (12 of 16, 18 of 24: an odd half,
# 96 of 128), whose other dimensions pass through
ROTARY_FACTORS = [1.0, 0.75]
# (shape, rotary factor, seed). The interpreter's float8 conversion drops a rounding carry into the next
# power of two (124.0 -> 64, not 128): on the CPU the FP8 store is checked on draws with no such value.
FP8_CASES = (
    [(shape, factor, 3) for shape in SHAPES for factor in ROTARY_FACTORS]
    if ON_GPU
    else [(SHAPES[0], 1.0, 3), (SHAPES[1], 1.0, 3), (SHAPES[0], 0.75, 3), (SHAPES[1], 0.75, 5)]
)
BLOCK_SIZE = 16


def qkv_views(tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype):
    """q, k and v as the strided views of one QKV projection output that attention passes."""
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device=DEVICE, dtype=dtype)
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    v = qkv[:, (heads + kv_heads) * head_dim :].view(tokens, kv_heads, head_dim)
    return q, k, v


def rotary_and_weights(head_dim: int, dtype: torch.dtype, norm: bool, rotary_factor: float = 1.0):
    params = {"rope_theta": 1e6, "rope_type": "default"}
    rotary = RotaryEmbedding(head_dim, 4096, params, rotary_dim=int(head_dim * rotary_factor)).to(DEVICE)
    weights = (None, None, 0.0)
    if norm:
        weights = (
            torch.rand(head_dim, device=DEVICE, dtype=dtype) + 0.5,
            torch.rand(head_dim, device=DEVICE, dtype=dtype) + 0.5,
            1e-6,
        )
    return rotary, weights


def scattered_slots(tokens: int, num_slots: int) -> torch.Tensor:
    """Distinct slots in no order, every third -1 (a padded row or an already cached token)."""
    slots = torch.randperm(num_slots, device=DEVICE)[:tokens]
    slots[::3] = -1
    return slots


def store_inputs(shape: tuple, dtype: torch.dtype, seed: int, rotary_factor: float):
    """A normalising rotary layer, positions, q/k/v views, and how many blocks of BLOCK_SIZE hold twice
    the tokens."""
    tokens, heads, kv_heads, head_dim = shape
    torch.manual_seed(seed)
    rotary, weights = rotary_and_weights(head_dim, dtype, norm=True, rotary_factor=rotary_factor)
    qkv = qkv_views(tokens, heads, kv_heads, head_dim, dtype)
    positions = torch.randint(0, 4096, (tokens,), device=DEVICE)
    return rotary, weights, positions, qkv, (2 * tokens + BLOCK_SIZE - 1) // BLOCK_SIZE


@pytest.mark.parametrize("rotary_factor", ROTARY_FACTORS)
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_equals_the_torch_reference(shape, dtype, norm, rotary_factor):
    tokens, heads, kv_heads, head_dim = shape
    torch.manual_seed(0)
    rotary, weights = rotary_and_weights(head_dim, dtype, norm, rotary_factor)
    q, k, _ = qkv_views(tokens, heads, kv_heads, head_dim, dtype)
    positions = torch.randint(0, 4096, (tokens,), device=DEVICE)
    positions[0] = 4095  # the table's last row
    got = norm_rotate_store(positions, q, k, rotary.cos_sin, *weights)
    want = norm_rotate_qk_reference(
        positions,
        q.double(),
        k.double(),
        rotary.cos_sin.double(),
        *[w if w is None or isinstance(w, float) else w.double() for w in weights],
    )
    tolerance = 3e-2 if dtype == torch.bfloat16 else 1e-5
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == dtype and g.is_contiguous()
        torch.testing.assert_close(g, w.to(dtype), atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("rotary_factor", ROTARY_FACTORS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_stores_the_rotated_k_and_v_at_their_slots_and_nothing_else(shape, dtype, rotary_factor):
    tokens, heads, kv_heads, head_dim = shape
    rotary, weights, positions, (q, k, v), num_blocks = store_inputs(shape, dtype, 1, rotary_factor)
    k_cache = torch.randn(num_blocks, BLOCK_SIZE, kv_heads, head_dim, device=DEVICE, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    slots = scattered_slots(tokens, num_blocks * BLOCK_SIZE)
    want_k_cache, want_v_cache = k_cache.clone(), v_cache.clone()
    got_q, got_k = norm_rotate_store(positions, q, k, rotary.cos_sin, *weights, v, k_cache, v_cache, slots)
    # the cache holds exactly the rotated k the kernel returns, and v unchanged
    store_kvcache(got_k, v, want_k_cache, want_v_cache, slots)
    assert torch.equal(k_cache, want_k_cache) and torch.equal(v_cache, want_v_cache)
    assert torch.equal(got_q, norm_rotate_store(positions, q, k, rotary.cos_sin, *weights)[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, rotary_factor, seed", FP8_CASES)
def test_quantizes_into_an_fp8_cache_as_the_torch_store_does(shape, rotary_factor, seed, dtype):
    tokens, heads, kv_heads, head_dim = shape
    rotary, weights, positions, (q, k, v), num_blocks = store_inputs(shape, dtype, seed, rotary_factor)
    v[-1] = 0  # an all-zero head gets scale 1
    caches = [torch.zeros(num_blocks, BLOCK_SIZE, kv_heads, head_dim, device=DEVICE, dtype=FP8_DTYPE) for _ in range(2)]
    scales = [torch.full((num_blocks, kv_heads, BLOCK_SIZE), -1.0, device=DEVICE) for _ in range(2)]
    slots = scattered_slots(tokens, num_blocks * BLOCK_SIZE)
    want_caches, want_scales = [c.clone() for c in caches], [c.clone() for c in scales]
    _, got_k = norm_rotate_store(positions, q, k, rotary.cos_sin, *weights, v, *caches, slots, *scales)
    store_kvcache(got_k, v, *want_caches, slots, *want_scales)
    for got, want in zip(scales, want_scales):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    # the same fp8 values, but for a rare rounding tie broken the other way (one step of e4m3)
    for got, want in zip(caches, want_caches):
        differ = got.view(torch.uint8) != want.view(torch.uint8)
        assert differ.float().mean() < 1e-3
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-3, atol=2**-9)
    assert (scales[1] > 0).sum() == (slots >= 0).sum() * kv_heads


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("shape", [shape for shape in SHAPES if shape[0] > BLOCK_SIZE])  # several blocks
def test_stores_into_blocks_that_lie_apart_as_into_contiguous_ones(shape, fp8):
    # a layer's view in a cache whose blocks hold two layers side by side: the other halves stay NaN
    tokens, heads, kv_heads, head_dim = shape
    rotary, weights, positions, (q, k, v), num_blocks = store_inputs(shape, torch.float32, 3, 1.0)
    dtype = FP8_DTYPE if fp8 else torch.float32
    dense = [torch.zeros(num_blocks, BLOCK_SIZE, kv_heads, head_dim, device=DEVICE, dtype=dtype) for _ in range(2)]
    dense += [torch.ones(num_blocks, kv_heads, BLOCK_SIZE, device=DEVICE) for _ in range(2)] if fp8 else []
    apart = [spread_blocks(x) for x in dense]
    slots = scattered_slots(tokens, num_blocks * BLOCK_SIZE)
    norm_rotate_store(positions, q, k, rotary.cos_sin, *weights, v, *dense[:2], slots, *dense[2:])
    norm_rotate_store(positions, q, k, rotary.cos_sin, *weights, v, *apart[:2], slots, *apart[2:])
    for got, want in zip(apart, dense):
        assert torch.equal(got.float(), want.float())
        assert torch.isnan(got._base.float()).sum() == got.numel()


@pytest.mark.parametrize("shape", SHAPES)
def test_a_partial_rotary_turns_the_leading_dimensions_as_a_full_rotary_of_their_size(shape):
    # independent of the reference: the first rotary_dim dimensions of each head come out as a whole
    # head of that size does from a full rotary with the same frequencies, the others unchanged
    tokens, heads, kv_heads, head_dim = shape
    rotary_dim = int(head_dim * 0.75)
    torch.manual_seed(4)
    partial, _ = rotary_and_weights(head_dim, torch.float32, norm=False, rotary_factor=0.75)
    full, _ = rotary_and_weights(rotary_dim, torch.float32, norm=False)
    q, k, _ = qkv_views(tokens, heads, kv_heads, head_dim, torch.float32)
    positions = torch.randint(0, 4096, (tokens,), device=DEVICE)
    got_q, got_k = norm_rotate_store(positions, q, k, partial.cos_sin, None, None, 0.0)
    want_q, want_k = norm_rotate_store(
        positions, q[..., :rotary_dim], k[..., :rotary_dim], full.cos_sin, None, None, 0.0
    )
    for got, want, given in ((got_q, want_q, q), (got_k, want_k, k)):
        assert torch.equal(got[..., rotary_dim:], given[..., rotary_dim:])
        torch.testing.assert_close(got[..., :rotary_dim], want, atol=1e-6, rtol=1e-6)
        assert not torch.allclose(got[..., :rotary_dim], given[..., :rotary_dim])


def test_the_layers_cpu_path_stores_what_the_kernel_stores():
    # the attention layer's plain-PyTorch path (the rotary layer, then the cache's store) against the kernel
    tokens, heads, kv_heads, head_dim = 6, 3, 1, 24
    torch.manual_seed(2)
    rotary, _ = rotary_and_weights(head_dim, torch.float32, norm=False)
    q, k, v = qkv_views(tokens, heads, kv_heads, head_dim, torch.float32)
    positions = torch.randint(0, 4096, (tokens,), device=DEVICE)
    slots = scattered_slots(tokens, 2 * BLOCK_SIZE)
    kernel_caches = [torch.zeros(2, BLOCK_SIZE, kv_heads, head_dim, device=DEVICE) for _ in range(2)]
    layer_caches = [torch.zeros(2, BLOCK_SIZE, kv_heads, head_dim) for _ in range(2)]
    kernel = norm_rotate_store(positions, q, k, rotary.cos_sin, None, None, 0.0, v, *kernel_caches, slots)
    cpu = lambda *tensors: [t.cpu() for t in tensors]
    layer = rotary.cpu()(*cpu(positions, q, k))
    LayerKVCache(*layer_caches).store(layer[1], v.cpu(), slots.cpu())
    for got, want in zip(cpu(*kernel, *kernel_caches), [*layer, *layer_caches]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert layer_caches[0].count_nonzero() == (slots >= 0).sum() * kv_heads * head_dim


def test_no_tokens_gives_empty_outputs():
    q, k, _ = qkv_views(0, 4, 2, 16, torch.float32)
    rotary = RotaryEmbedding(16, 64, {"rope_theta": 1e4, "rope_type": "default"}).to(DEVICE)
    got_q, got_k = norm_rotate_store(
        torch.zeros(0, dtype=torch.int64, device=DEVICE), q, k, rotary.cos_sin, None, None, 0.0
    )
    assert got_q.shape == (0, 4, 16) and got_k.shape == (0, 2, 16)
