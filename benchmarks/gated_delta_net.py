"""Gated DeltaNet kernels on the GPU: our Triton kernels beside flash-linear-attention's, on one layer's shape.

The layer is Qwen3.5's linear attention as its 9B model has it: 16 key heads
and 32 value heads of 128 channels, a convolution 4 tokens wide over q, k and
v (8,192 channels), bf16 activations and fp32 states. Each case times, with
the L2 cache flushed:

- decode (one token per sequence, replayed in a CUDA graph as the engine runs
  it) at 1, 64 and 256 sequences: the causal
  convolution's update and the gated delta rule's one-token step, in place on
  the state slots; the limit is reading and writing every sequence's states
  once (48 KB of convolution state and 2 MB of recurrent state a sequence);
- prefill of one 16,384-token prompt and of 64 prompts of 256 tokens: the
  convolution over the packed prompts and the chunked gated delta rule, from
  and into the slots.

The peer is flash-linear-attention (PyPI `flash-linear-attention`, Triton):
`fused_recurrent_gated_delta_rule` for decode and `chunk_gated_delta_rule` for
prefill, both with the q/k norm, the decay and the write strength computed in
the kernel as ours are. It takes a batch's states as one tensor rather than
slots: the benchmark gathers them before timing, and the peer writes the final
states to a tensor of its own. Both read the same inputs; the largest
difference between their outputs is printed beside the times.

    python benchmarks/gated_delta_net.py
"""

import torch
import torch.nn.functional as F
import triton.testing
from throughput import hbm_bandwidth

from nanovllm.kernels.triton_causal_conv import conv_queries, conv_varlen
from nanovllm.kernels.triton_gated_delta_chunked import gated_delta_chunked
from nanovllm.kernels.triton_gated_delta_recurrent import gated_delta_recurrent

KEY_HEADS, HEADS, DK, DV, WIDTH = 16, 32, 128, 128, 4
CHANNELS = 2 * KEY_HEADS * DK + HEADS * DV
DTYPE = torch.bfloat16


def layer_inputs(tokens: int, num_seqs: int) -> dict:
    """Random projections of `tokens` tokens, the layer's parameters, and a state cache of `num_seqs` + 1 slots
    (the slots used in shuffled order)."""
    torch.manual_seed(0)
    mixed = torch.randn(tokens, CHANNELS + 2 * HEADS, device="cuda", dtype=DTYPE)
    return dict(
        mixed=mixed[:, :CHANNELS],
        a=mixed[:, CHANNELS : CHANNELS + HEADS],
        b=mixed[:, CHANNELS + HEADS :],
        weight=torch.randn(CHANNELS, WIDTH, device="cuda", dtype=DTYPE) * 0.5,
        A_log=torch.empty(HEADS, device="cuda").uniform_(1, 16).log(),
        dt_bias=torch.randn(HEADS, device="cuda"),
        conv_state=torch.randn(num_seqs + 1, CHANNELS, WIDTH - 1, device="cuda", dtype=DTYPE),
        state=torch.randn(num_seqs + 1, HEADS, DK, DV, device="cuda") * 0.1,
        slots=torch.randperm(num_seqs, device="cuda"),
    )


def split_qkv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v heads of convolved channels [tokens, CHANNELS]."""
    q, k, v = x.split([KEY_HEADS * DK, KEY_HEADS * DK, HEADS * DV], dim=-1)
    return q.unflatten(-1, (KEY_HEADS, DK)), k.unflatten(-1, (KEY_HEADS, DK)), v.unflatten(-1, (HEADS, DV))


def timed(fn) -> float:
    """Median milliseconds of `fn` with the L2 cache flushed before each call."""
    return triton.testing.do_bench(fn, warmup=25, rep=200)


def timed_in_graph(fn) -> float:
    """Median milliseconds of `fn` replayed in a CUDA graph, as the engine runs decode steps: without the
    host's launch time."""
    return triton.testing.do_bench_cudagraph(fn, rep=200)


def peer(rule, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, x: dict, cu_seqlens: torch.Tensor):
    """flash-linear-attention's `rule` over the packed tokens as one batch row, from the slots' states gathered
    beforehand, with the gates computed in its kernels as ours are."""
    initial = x["state"][x["slots"]].contiguous()
    return lambda: rule(
        q[None],
        k[None],
        v[None],
        g=x["a"][None],
        beta=x["b"][None],
        initial_state=initial,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True,
        A_log=x["A_log"],
        dt_bias=x["dt_bias"],
        use_beta_sigmoid_in_kernel=True,
        cu_seqlens=cu_seqlens.long(),
    )


def largest_difference(ours_rule, peer_rule, state: torch.Tensor) -> float:
    """The largest difference between the outputs of ours and the peer's, from the same states (ours updates
    `state` in place: it is put back before the peer runs)."""
    before = state.clone()
    ours = ours_rule()
    state.copy_(before)
    return (ours - peer_rule()[0][0].float()).abs().max().item()


def decode_case(num_seqs: int, bandwidth: float) -> None:
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    x = layer_inputs(num_seqs, num_seqs)
    q, k, v = split_qkv(F.silu(x["mixed"].float()).to(DTYPE))

    def ours_conv():
        return conv_queries(x["mixed"].view(num_seqs, 1, CHANNELS), x["weight"], x["conv_state"], x["slots"])

    def ours_rule():
        return gated_delta_recurrent(q, k, v, x["a"], x["b"], x["A_log"], x["dt_bias"], x["state"], x["slots"])

    peer_rule = peer(fused_recurrent_gated_delta_rule, q, k, v, x, torch.arange(num_seqs + 1, device="cuda"))

    difference = largest_difference(ours_rule, peer_rule, x["state"])
    state_bytes = num_seqs * (HEADS * DK * DV * 4 + CHANNELS * (WIDTH - 1) * 2) * 2
    conv_ms, rule_ms, peer_ms = timed_in_graph(ours_conv), timed_in_graph(ours_rule), timed_in_graph(peer_rule)
    limit_ms = state_bytes / bandwidth * 1e3
    print(
        f"decode, {num_seqs:>3} seqs: conv {conv_ms * 1e3:7.1f} us, rule {rule_ms * 1e3:7.1f} us "
        f"({state_bytes / rule_ms / 1e6:,.0f} GB/s); flash-linear-attention rule {peer_ms * 1e3:7.1f} us "
        f"(ours / peer {rule_ms / peer_ms:.2f}); states read and written once {limit_ms * 1e3:6.1f} us; "
        f"largest output difference {difference:.1e}"
    )


def prefill_case(lengths: list[int]) -> None:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    tokens, num_seqs = sum(lengths), len(lengths)
    x = layer_inputs(tokens, num_seqs)
    cu_seqlens = torch.tensor([0] + lengths, device="cuda").cumsum(0)
    cu32 = cu_seqlens.to(torch.int32)
    q, k, v = split_qkv(F.silu(x["mixed"].float()).to(DTYPE))

    def ours_conv():
        return conv_varlen(x["mixed"], x["weight"], x["conv_state"], x["slots"], cu32)

    def ours_rule():
        return gated_delta_chunked(
            q, k, v, x["a"], x["b"], x["A_log"], x["dt_bias"], x["state"], x["slots"], cu32, max(lengths)
        )

    peer_rule = peer(chunk_gated_delta_rule, q, k, v, x, cu_seqlens)

    difference = largest_difference(ours_rule, peer_rule, x["state"])
    conv_ms, rule_ms, peer_ms = timed(ours_conv), timed(ours_rule), timed(peer_rule)
    label = f"{num_seqs} x {lengths[0]:,}" if len(set(lengths)) == 1 else f"{num_seqs} prompts"
    print(
        f"prefill, {label:>10} tokens: conv {conv_ms:6.3f} ms, rule {rule_ms:6.3f} ms "
        f"({tokens / rule_ms / 1e3:,.0f}k tok/s); flash-linear-attention rule {peer_ms:6.3f} ms "
        f"(ours / peer {rule_ms / peer_ms:.2f}); largest output difference {difference:.1e}"
    )


def main() -> None:
    import fla

    bandwidth, source = hbm_bandwidth()
    print(
        f"machine: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
        f"flash-linear-attention {fla.__version__}; HBM {bandwidth / 1e12:.2f} TB/s ({source})"
    )
    print(f"layer: {KEY_HEADS} key heads, {HEADS} value heads, head dims {DK}/{DV}, conv width {WIDTH}, bf16")
    for num_seqs in (1, 64, 256):
        decode_case(num_seqs, bandwidth)
    prefill_case([16384])
    prefill_case([256] * 64)


if __name__ == "__main__":
    main()
