"""The experts of a mixture-of-experts layer, their weights stacked, computed on CUDA by the fused Triton
kernels (`kernels/triton_moe.py`) and elsewhere in plain PyTorch, which is those kernels' reference.

Weights: w13 [experts, 2 * I, hidden] (each expert's gate rows, then its up rows) and w2 [experts,
hidden, I], I being an expert's width. Tensor parallelism splits every expert as a dense MLP is split:
each rank holds the same slice of every expert's I (of gate, of up, and of down's input features), every
rank routes every token alike (the router is replicated), and one all-reduce sums the partial outputs.

A checkpoint holds the experts one tensor each (published checkpoints: an expert's gate and up
[I, hidden], its down [hidden, I]) or stacked as here (transformers 5's layout); each parameter's loader
takes both, reading only this rank's slices. gpt-oss stacks them inputs first ([experts, hidden, 2 * I] with
gate and up interleaved column by column, down [experts, I, hidden]; `inputs_first`), read whole and laid out
as here. Its experts also add biases (w13_bias [experts, 2 * I], w2_bias [experts, hidden], the latter added by
rank 0 alone, as the ranks' outputs are summed).

MXFP4 experts (`mxfp4`, gpt-oss's published checkpoints; `kernels/mxfp4.py` has the format) stay as stored,
4.25 bits a weight, and are dequantized inside the kernels (on the CPU, one expert at a time): w13 [experts,
2 * I, hidden / 2] and w2 [experts, hidden, I / 2] uint8 values with w13_scale [experts, 2 * I, hidden / 32]
and w2_scale [experts, hidden, I / 32] uint8 scales. The checkpoint stacks them outputs first as blocks of
32 (`gate_up_proj_blocks` [experts, 2 * I, hidden / 32, 16], `gate_up_proj_scales` [experts, 2 * I,
hidden / 32], with gate and up rows interleaved; `down_proj_blocks` [experts, hidden, I / 32, 16] and its
scales), so a rank's slice of I must be whole blocks of 32.
"""

import torch
import torch.nn.functional as F
from torch import nn

from nanovllm.kernels.mxfp4 import BLOCK, dequantize
from nanovllm.layers.activation import gated_activation
from nanovllm.layers.all_reduce import all_reduce
from nanovllm.layers.layernorm import RMSNorm
from nanovllm.layers.linear import divide, one_row_on_cuda
from nanovllm.layers.moe_routing import group_by_expert, route
from nanovllm.utils.loader import shard
from nanovllm.utils.parallel import tp_rank, tp_size


def moe_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    hidden_act: str,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """For each token t, the sum over its choices j of weights[t, j] * down(act(gate(x_t)) * up(x_t)) of
    expert ids[t, j] (each projection adding its bias, where given). Each expert runs once, over the tokens
    routed to it; each weighted choice is rounded to x's dtype (the kernels write them so: half the bytes of
    fp32) and their sum is taken in fp32. With `w13_scale` and `w2_scale` the weights are MXFP4, each
    expert's dequantized to x's dtype when it runs (exactly: the values fit bf16).

    x: [tokens, hidden]; w13: [experts, 2 * I, hidden]; w2: [experts, hidden, I]; w13_bias: [experts, 2 * I];
    w2_bias: [experts, hidden]; weights, ids: [tokens, top_k] -> [tokens, hidden] in x's dtype. MXFP4: w13
    [experts, 2 * I, hidden / 2], w2 [experts, hidden, I / 2] uint8; w13_scale [experts, 2 * I, hidden / 32],
    w2_scale [experts, hidden, I / 32] uint8
    """
    top_k = ids.size(1)
    order, counts = group_by_expert(ids, w13.size(0))
    tokens = order // top_k  # [tokens * top_k]: the token of each slot, slots grouped by expert
    grouped = x[tokens]  # [tokens * top_k, hidden]
    out = torch.empty_like(grouped)
    start = 0
    # the group sizes are read on the host: a sync, which no CUDA graph can capture
    for expert, count in enumerate(counts.tolist()):
        if count:
            rows = slice(start, start + count)
            w_gate_up = _expert_weight(w13, w13_scale, expert, x.dtype)  # [2 * I, hidden]
            gate_up = F.linear(grouped[rows], w_gate_up, None if w13_bias is None else w13_bias[expert])
            h = gated_activation(gate_up, hidden_act)  # [count, I]
            w_down = _expert_weight(w2, w2_scale, expert, x.dtype)  # [hidden, I]
            out[rows] = F.linear(h, w_down, None if w2_bias is None else w2_bias[expert])
        start += count
    weighted = (out.float() * weights.flatten()[order, None]).to(x.dtype).float()  # [tokens * top_k, hidden]
    summed = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    return summed.index_add_(0, tokens, weighted).to(x.dtype)


def _expert_weight(w: torch.Tensor, scale: torch.Tensor | None, expert: int, dtype: torch.dtype) -> torch.Tensor:
    """Expert `expert`'s weight in `dtype`: `w`'s own, or its MXFP4 values times `scale`."""
    return w[expert] if scale is None else dequantize(w[expert], scale[expert], dtype)


class FusedMoE(nn.Module):
    """`num_experts` gated MLPs of width `intermediate_size`, each token through the `top_k` its router
    logits choose (`route`), their outputs weighted and summed; this rank's slice of every expert. With
    `bias` each projection adds one; `inputs_first`: the checkpoint stacks them as gpt-oss does; `mxfp4`: its
    experts are MXFP4, as gpt-oss's published checkpoints store them. With `shared_expert`, one more slot
    after the routed experts holds a shared expert of the same width (`take_shared_expert` fills it once
    loaded), which every token runs as one more choice, weighted by the sigmoid of the router logits' last
    column, its gate: the kernels then run it beside the routed ones instead of in launches of its own."""

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        hidden_act: str,
        renormalize: bool,
        bias: bool = False,
        inputs_first: bool = False,
        mxfp4: bool = False,
        shared_expert: bool = False,
    ):
        super().__init__()
        assert not (shared_expert and (mxfp4 or bias or inputs_first))
        self.has_shared_expert = shared_expert
        self.inputs_first = inputs_first
        self.top_k, self.renormalize, self.hidden_act = top_k, renormalize, hidden_act
        self.tp_rank, self.tp_size = tp_rank(), tp_size()
        self.intermediate_size = intermediate_size  # an expert's whole width, as the checkpoint holds it
        width = divide(intermediate_size, self.tp_size, "expert MLP width")
        self.w13_scale = self.w2_scale = None
        if mxfp4:
            self._make_mxfp4_weights(num_experts, hidden_size, width)
        else:
            slots = num_experts + shared_expert
            self.w13 = nn.Parameter(torch.empty(slots, 2 * width, hidden_size), requires_grad=False)
            self.w2 = nn.Parameter(torch.empty(slots, hidden_size, width), requires_grad=False)
            self.w13.weight_loader, self.w2.weight_loader = self._load_w13, self._load_w2
            # the one-expert checkpoint tensors each parameter is made of, which the loader checks it got
            self.w13.shard_ids = [(e, part) for e in range(num_experts) for part in ("gate", "up")]
            self.w2.shard_ids = [(e, "down") for e in range(num_experts)]
            # the whole tensors' shapes in the checkpoint, which dummy weights take
            if inputs_first:
                self.w13.checkpoint_shape = (num_experts, hidden_size, 2 * intermediate_size)
                self.w2.checkpoint_shape = (num_experts, intermediate_size, hidden_size)
            elif shared_expert:
                self.w13.checkpoint_shape = (num_experts, 2 * intermediate_size, hidden_size)
                self.w2.checkpoint_shape = (num_experts, hidden_size, intermediate_size)
        self.w13_bias = self.w2_bias = None
        if bias:
            self.w13_bias = nn.Parameter(torch.empty(num_experts, 2 * width), requires_grad=False)
            self.w2_bias = nn.Parameter(torch.empty(num_experts, hidden_size), requires_grad=False)
            self.w13_bias.weight_loader, self.w2_bias.weight_loader = self._load_w13_bias, self._load_w2_bias

    def _make_mxfp4_weights(self, num_experts: int, hidden: int, width: int) -> None:
        """MXFP4 values and scales of this rank's slice (`width`) of every expert."""
        if hidden % BLOCK or width % BLOCK:
            raise ValueError(
                f"MXFP4 experts are split in blocks of {BLOCK} inputs, which hidden_size ({hidden}) and each "
                f"rank's share of the expert width ({self.intermediate_size} / tensor_parallel_size "
                f"{self.tp_size} = {width}) must be whole multiples of: use a tensor_parallel_size that "
                f"leaves each rank whole blocks"
            )
        whole = self.intermediate_size
        self.w13 = _uint8_param(num_experts, 2 * width, hidden // 2)
        self.w13_scale = _uint8_param(num_experts, 2 * width, hidden // BLOCK)
        self.w2 = _uint8_param(num_experts, hidden, width // 2)
        self.w2_scale = _uint8_param(num_experts, hidden, width // BLOCK)
        # the checkpoint's whole tensors, which dummy weights take: blocks of 16 bytes (32 values)
        self.w13.checkpoint_shape = (num_experts, 2 * whole, hidden // BLOCK, BLOCK // 2)
        self.w2.checkpoint_shape = (num_experts, hidden, whole // BLOCK, BLOCK // 2)
        self.w13_scale.checkpoint_shape = (num_experts, 2 * whole, hidden // BLOCK)
        self.w2_scale.checkpoint_shape = (num_experts, hidden, whole // BLOCK)
        for param in (self.w13, self.w13_scale):
            param.weight_loader = self._load_w13_mxfp4
        for param in (self.w2, self.w2_scale):
            param.weight_loader = self._load_w2_mxfp4
        # dummy weights: any values, and scales of 2^-11 to 2^-10, so that the weights are as small as other
        # layers' dummy ones (`utils/loader.load_dummy_weights`)
        self.w13.dummy_range = self.w2.dummy_range = (0, 256)
        self.w13_scale.dummy_range = self.w2_scale.dummy_range = (116, 118)

    def _load_w13_mxfp4(self, param: nn.Parameter, loaded) -> None:
        """Every expert's gate | up MXFP4 values ([experts, 2 * I, hidden / 32, 16]) or scales ([experts, 2 * I,
        hidden / 32]), gate and up rows interleaved: this rank's rows, every gate row before every up row."""
        width = param.size(1) // 2
        # [experts, 2 * width, ...]: this rank's gate and up rows, interleaved
        rows = _uint8(shard(loaded, 1, 2 * self.tp_rank * width, 2 * width), "gate_up_proj")
        param.data.copy_(torch.cat([rows[:, 0::2], rows[:, 1::2]], dim=1).flatten(2))

    def _load_w2_mxfp4(self, param: nn.Parameter, loaded) -> None:
        """Every expert's down MXFP4 values ([experts, hidden, I / 32, 16]) or scales ([experts, hidden,
        I / 32]): this rank's blocks of I."""
        blocks = self.w2_scale.size(2)
        param.data.copy_(_uint8(shard(loaded, 2, self.tp_rank * blocks, blocks), "down_proj").flatten(2))

    def _halves_first(self, loaded) -> torch.Tensor:
        """A gpt-oss stacked gate | up tensor ([experts, hidden, 2 * I], interleaved) as [experts, 2 * I, hidden]
        with every gate row before every up row; or its bias ([experts, 2 * I]) likewise."""
        whole = loaded[:]
        halves = torch.cat([whole[..., 0::2], whole[..., 1::2]], dim=-1)
        return halves.transpose(1, 2) if halves.dim() == 3 else halves

    def _load_w13(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        """Every expert's gate | up ([experts, 2 * I, hidden], shard_id None), or one expert's gate or up
        ([I, hidden], shard_id (expert, "gate" or "up")): this rank's rows of each."""
        if shard_id is None:
            self._copy_gate_up(self._routed(param), self._halves_first(loaded) if self.inputs_first else loaded)
            return
        expert = param.data[shard_id[0]]  # [2 * width, hidden]
        width = expert.size(0) // 2
        half = ("gate", "up").index(shard_id[1])
        expert.narrow(0, half * width, width).copy_(shard(loaded, 0, self.tp_rank * width, width))

    def _copy_gate_up(self, dest: torch.Tensor, whole) -> None:
        """This rank's part of the gate half and of the up half of `whole` (every expert's gate | up along
        dimension 1, the checkpoint's whole width: weights or biases) into `dest`, gate | up of this rank."""
        width = dest.size(1) // 2
        for half in (0, 1):
            start = half * self.intermediate_size + self.tp_rank * width
            dest.narrow(1, half * width, width).copy_(shard(whole, 1, start, width))

    def _load_w2(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        """Every expert's down ([experts, hidden, I], shard_id None), or one expert's ([hidden, I], shard_id
        (expert, "down")): this rank's columns."""
        assert shard_id is None or shard_id[1] == "down"
        if shard_id is None and self.inputs_first:
            loaded = loaded[:].transpose(1, 2)  # gpt-oss's [experts, I, hidden]
        experts = self._routed(param) if shard_id is None else param.data[shard_id[0]]  # [(experts,) hidden, width]
        width = param.size(2)
        experts.copy_(shard(loaded, experts.dim() - 1, self.tp_rank * width, width))

    def _routed(self, param: nn.Parameter) -> torch.Tensor:
        """The routed experts' part of a stacked weight: all of it but the shared expert's slot."""
        return param.data[: param.size(0) - self.has_shared_expert]

    def take_shared_expert(self, gate_up: torch.Tensor, down: torch.Tensor) -> None:
        """Copy this rank's slice of the shared expert (gate | up [2 * width, hidden], down [hidden, width],
        as `SharedExpert` holds them) into the last slot."""
        self.w13.data[-1].copy_(gate_up)
        self.w2.data[-1].copy_(down)

    def _load_w13_bias(self, param: nn.Parameter, loaded) -> None:
        """Every expert's gate | up bias ([experts, 2 * I], interleaved where `inputs_first`): this rank's part
        of each half."""
        self._copy_gate_up(param.data, self._halves_first(loaded) if self.inputs_first else loaded)

    def _load_w2_bias(self, param: nn.Parameter, loaded) -> None:
        """Every expert's down bias ([experts, hidden]), on rank 0; zeros on the others, whose outputs are
        summed with rank 0's."""
        param.data.copy_(loaded[:] if self.tp_rank == 0 else torch.zeros_like(param))

    def forward(
        self,
        x: torch.Tensor,
        router_logits: torch.Tensor,
        input_norm: RMSNorm | None = None,
        shared: torch.Tensor | None = None,
        expert_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The experts' weighted sum for each token, summed over the ranks. With `input_norm`, x is the norm's
        input and the experts run on input_norm(x): a single row on CUDA is normalised inside the experts'
        first kernel (one launch fewer in a one-sequence step), anything else first. `shared`, this rank's
        partial output of a shared expert (`SharedExpert`), is added before the sum, which then sums both.
        `expert_scale` [experts] multiplies each choice's weight by its expert's scale, after the top-k's
        renormalisation (Gemma 4's per_expert_scale). With a shared expert in the last slot, router_logits
        end with its gate's logit."""
        # x: [tokens, hidden]; router_logits: [tokens, experts (+ 1)]; shared: [tokens, hidden] -> [tokens, hidden]
        norm_in_kernel = input_norm is not None and one_row_on_cuda(x)
        if input_norm is not None and not norm_in_kernel:
            x = input_norm(x)
        if x.is_cuda:  # Triton is needed on CUDA only
            from nanovllm.kernels.triton_moe import fused_experts
            from nanovllm.kernels.triton_moe_routing import route_experts

            norm = dict(norm_weight=input_norm.weight, eps=input_norm.eps) if norm_in_kernel else {}
            routing = route_experts(router_logits, self.top_k, self.renormalize, self.has_shared_expert)
            weights, ids = _scaled(*routing, expert_scale)
            y = fused_experts(x, self.w13, self.w2, weights, ids, self.hidden_act, **norm, **self._extras())
        else:
            weights, ids = _scaled(
                *route(router_logits, self.top_k, self.renormalize, self.has_shared_expert), expert_scale
            )
            y = moe_experts(x, self.w13, self.w2, weights, ids, self.hidden_act, **self._extras())
        if shared is not None:
            y = y + shared
        return all_reduce(y) if self.tp_size > 1 else y

    def _extras(self) -> dict:
        """The biases and MXFP4 scales the experts' products take beside their weights (None where absent)."""
        return dict(w13_bias=self.w13_bias, w2_bias=self.w2_bias, w13_scale=self.w13_scale, w2_scale=self.w2_scale)


def _scaled(
    weights: torch.Tensor, ids: torch.Tensor, expert_scale: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The routing weights [tokens, top_k] times their experts' scales (as they are without scales)."""
    return (weights if expert_scale is None else weights * expert_scale[ids]), ids


def _uint8_param(*shape: int) -> nn.Parameter:
    """An unfilled parameter of bytes."""
    return nn.Parameter(torch.empty(shape, dtype=torch.uint8), requires_grad=False)


def _uint8(t: torch.Tensor, name: str) -> torch.Tensor:
    """`t`, checked to be MXFP4 bytes: a checkpoint whose config says MXFP4 but whose experts are not."""
    if t.dtype != torch.uint8:
        raise ValueError(
            f"the experts' {name} is {t.dtype}, not MXFP4 (uint8 blocks and scales) as the checkpoint's "
            "quantization_config says: remove the quantization_config or use the MXFP4 checkpoint"
        )
    return t
