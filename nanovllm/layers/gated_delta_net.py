"""Gated DeltaNet: linear attention whose cache is a fixed-size state per sequence (Qwen3.5's
"linear_attention" layers).

For y = input_norm(x + residual), one fused projection gives q, k, v (key and value heads), z (an output
gate per value channel), b and a (one each per value head). q, k and v run through a causal depthwise
convolution (kernel_size tokens wide, then the activation, SiLU); then the gated delta rule
(`kernels/torch_gated_delta.py`) reads and writes each value head's state with beta = sigmoid(b) and the
decay g = -exp(A_log) * softplus(a + dt_bias); each head's output is RMS-normalised and multiplied by
SiLU(z), and out_proj maps the heads back to the hidden size.

Tensor parallel by heads: a rank holds key heads and the value heads that read them (value head h reads
key head h // (value heads / key heads), so contiguous shares of both agree), the rows of the fused
projection, the convolution's channels, A_log and dt_bias that belong to them, and out_proj's columns
(one all-reduce). A rank's convolution channels are its q, k and v, in that order, as its states hold them.
Checkpoints that group the projection's rows per key head (Qwen3-Next's in_proj_qkvz and in_proj_ba) load
as those that hold them shard after shard (`InputProjection`).

The states, bound by the worker (`RecurrentLayer`): the convolution's last kernel_size - 1 inputs
[slots + 1, channels, kernel_size - 1] in the model's dtype, and the recurrent state [slots + 1, value
heads, key_head_dim, value_head_dim] in fp32. Each sequence starts from its slot (`Context.state_slots`)
and leaves its state there. With speculative decoding the worker also binds per-position states
[max_num_seqs, queries, ...] of each: a verify step writes the state after each query there instead of the
slot, and a varlen step the state after each of a sequence's first queries too, so that the runner can keep
the state after each request's last kept draft.

On CUDA, once the states are bound, Triton kernels run in place on the slots: the convolution
(`kernels/triton_causal_conv.py`), the chunked delta rule for prefill steps and the token-by-token one for
decode and verify steps and for varlen steps that keep per-position states, with the decay, write strength and
q/k norms computed inside them. The CPU, and every device before binding, runs the PyTorch references.
"""

import torch
import torch.nn.functional as F
from torch import nn

from nanovllm.kernels.torch_causal_conv import causal_conv_queries, causal_conv_varlen
from nanovllm.kernels.torch_gated_delta import gated_delta_rule
from nanovllm.layers.activation import ACTIVATIONS
from nanovllm.layers.fused_projection import NormedProjection
from nanovllm.layers.fusion import fused_on_cuda
from nanovllm.layers.layernorm import rms_norm
from nanovllm.layers.linear import FusedColumnParallelLinear, RowParallelLinear, divide, load_fused_rows
from nanovllm.layers.per_key_head import PerKeyHead
from nanovllm.layers.recurrent_state import RecurrentLayer
from nanovllm.utils.context import Context, get_context
from nanovllm.utils.loader import shard
from nanovllm.utils.parallel import tp_rank, tp_size


@fused_on_cuda
def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * RMSNorm(x) * SiLU(gate) over each head's values, x first rounded to the gate's dtype (the
    model's): the norm in fp32, the gate's product too (one generated kernel on CUDA rather than a dozen
    launches, a sizeable share of a one-sequence decode step)."""
    # x: [tokens, heads, head_dim] fp32; gate: [tokens, heads, head_dim] -> [tokens, heads, head_dim]
    x = x.to(gate.dtype)
    return (rms_norm(x, weight, eps) * F.silu(gate.float())).to(gate.dtype)


class GatedRMSNorm(nn.Module):
    """weight * RMSNorm(x) * SiLU(gate) over each head's values (`gated_rms_norm`)."""

    def __init__(self, head_dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(head_dim), requires_grad=False)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        # x: [tokens, heads, head_dim] fp32; gate: [tokens, heads, head_dim] -> [tokens, heads, head_dim]
        return gated_rms_norm(x, gate, self.weight, self.eps)


class KeyHeadGroupedRows:
    """A checkpoint tensor whose rows are grouped per key head (for each of `groups` key heads, its
    `part_rows[i]` rows of each part i in turn) seen part after part, each part's rows over every key head
    one after another: indexing rows [start, stop) reads only the checkpoint rows they are."""

    def __init__(self, loaded, part_rows: list[int], groups: int):
        self.loaded, self.part_rows, self.groups = loaded, part_rows, groups
        self.group_rows = sum(part_rows)

    def __getitem__(self, index) -> torch.Tensor:
        rows, *rest = index if isinstance(index, tuple) else (index,)
        start, stop, step = rows.indices(self.groups * self.group_rows)
        assert step == 1, "only contiguous rows are read"
        pieces, seen, in_group = [], 0, 0  # where the part begins, as seen and within a checkpoint group
        for rows_per_group in self.part_rows:
            row = max(start, seen) - seen  # the first row of this part that is wanted, counted within the part
            end = min(stop, seen + rows_per_group * self.groups) - seen
            while row < end:  # one read per key head
                group, within = divmod(row, rows_per_group)
                count = min(rows_per_group - within, end - row)
                first = group * self.group_rows + in_group + within
                pieces.append(self.loaded[first : first + count])
                row += count
            seen += rows_per_group * self.groups
            in_group += rows_per_group
        return torch.cat(pieces)[(slice(None), *rest)]


class InputProjection(FusedColumnParallelLinear):
    """A Gated DeltaNet's fused input projection (q | k | v | z, or b | a, each over all of its heads), which
    also loads a checkpoint tensor that groups its rows per key head (shard id `PerKeyHead`): seen shard after
    shard (`KeyHeadGroupedRows`), it loads as a tensor of those shards held so does, each rank reading only its
    own heads' rows."""

    def __init__(self, hidden_size: int, shard_sizes: dict[str, int], num_key_heads: int):
        super().__init__(hidden_size, shard_sizes)
        self.num_key_heads = num_key_heads  # every rank's

    def weight_loader(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        if isinstance(shard_id, PerKeyHead):
            # a block-FP8 scale holds one row per rows_per_entry rows of the weight, in the same groups
            unit = self.num_key_heads * getattr(param, "rows_per_entry", 1)
            part_rows = [self.shard_sizes[part] // unit for part in shard_id.shards]
            loaded, shard_id = KeyHeadGroupedRows(loaded, part_rows, self.num_key_heads), shard_id.shards
        super().weight_loader(param, loaded, shard_id)


class DepthwiseConvWeight(nn.Module):
    """The causal convolution's weight [channels of this rank, 1, kernel_size], as checkpoints hold it for every
    channel (q | k | v one after another): a rank loads its own q, k and v channels."""

    def __init__(self, channel_sizes: dict[str, int], kernel_size: int):
        super().__init__()
        self.channel_sizes, self.rank, self.ranks = channel_sizes, tp_rank(), tp_size()
        channels = sum(channel_sizes.values()) // self.ranks
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        load_fused_rows(param, loaded, self.channel_sizes, None, self.rank, self.ranks)


def _per_head(num_heads: int) -> nn.Parameter:
    """An fp32 parameter of one value per value head of this rank (A_log, dt_bias), whose loader copies the
    rank's share of the checkpoint's values of every head."""
    param = nn.Parameter(torch.empty(num_heads, dtype=torch.float32), requires_grad=False)
    start = tp_rank() * num_heads

    def load(target: nn.Parameter, loaded, shard_id=None) -> None:
        target.data.copy_(shard(loaded, 0, start, num_heads))

    param.weight_loader = load
    return param


class GatedDeltaNet(RecurrentLayer):
    """Gated DeltaNet over input_norm(x + residual); returns its output and x + residual, the next residual.
    `input_norm` (owned by the decoder layer) runs with the fused projection (`NormedProjection`)."""

    def __init__(
        self,
        hidden_size: int,
        num_key_heads: int,
        num_value_heads: int,
        key_head_dim: int,
        value_head_dim: int,
        conv_kernel_size: int,
        eps: float,
        activation: str,
        input_norm: nn.Module,
    ):
        super().__init__()
        ranks = tp_size()
        self.num_key_heads = divide(num_key_heads, ranks, "linear-attention key heads")
        self.num_value_heads = divide(num_value_heads, ranks, "linear-attention value heads")
        self.key_head_dim, self.value_head_dim = key_head_dim, value_head_dim
        key_dim, value_dim = num_key_heads * key_head_dim, num_value_heads * value_head_dim
        channel_sizes = {"q": key_dim, "k": key_dim, "v": value_dim}
        self.in_proj_qkvz = InputProjection(hidden_size, {**channel_sizes, "z": value_dim}, num_key_heads)
        # b and a, one row per value head each, in a projection of their own that stays in the model's dtype:
        # too few rows for whole 128-row FP8 blocks beside q, k, v and z, and a small share of the reads
        self.in_proj_ba = InputProjection(hidden_size, {"b": num_value_heads, "a": num_value_heads}, num_key_heads)
        self.in_proj_ba.keeps_full_precision = True
        self.conv1d = DepthwiseConvWeight(channel_sizes, conv_kernel_size)
        self.A_log = _per_head(self.num_value_heads)  # the decay rate of each head's state, as log(A)
        self.dt_bias = _per_head(self.num_value_heads)
        self.norm = GatedRMSNorm(value_head_dim, eps)
        self.out_proj = RowParallelLinear(value_dim, hidden_size)
        self.activation = ACTIVATIONS[activation]
        self.activation_is_silu = activation in ("silu", "swish")  # the one the convolution kernels fuse
        self.normed_qkvz = NormedProjection(input_norm, self.in_proj_qkvz)
        self.normed_ba = NormedProjection(input_norm, self.in_proj_ba)
        # this rank's q, k, v (the convolution's channels) and z, and b and a, as the projections give them
        rank_key_dim, rank_value_dim = self.num_key_heads * key_head_dim, self.num_value_heads * value_head_dim
        self.splits = [2 * rank_key_dim + rank_value_dim, rank_value_dim]
        self.channel_splits = [rank_key_dim, rank_key_dim, rank_value_dim]
        self.conv_state: torch.Tensor | None = None  # [slots + 1, channels, kernel_size - 1], the model's dtype
        self.recurrent_state: torch.Tensor | None = None  # [slots + 1, value heads, key_head_dim, value_head_dim], fp32
        # with speculative decoding, the states after each query: [max_num_seqs, queries, *the state's shape]
        self.conv_steps: torch.Tensor | None = None
        self.recurrent_steps: torch.Tensor | None = None

    def bind_state_cache(self, states: tuple[torch.Tensor, ...] | None) -> None:
        """Keep the convolution's and the recurrence's states, or with None let them go (`RecurrentLayer`)."""
        if states is None:
            self.conv_state = self.recurrent_state = None
            return
        conv_state, recurrent_state = states
        assert conv_state.shape[1:] == (self.splits[0], self.conv1d.weight.size(-1) - 1)
        assert recurrent_state.shape[1:] == (self.num_value_heads, self.key_head_dim, self.value_head_dim)
        self.conv_state, self.recurrent_state = conv_state, recurrent_state

    def bind_draft_states(self, step_states: tuple[torch.Tensor, ...]) -> None:
        """Keep the per-position states of steps with drafts (`RecurrentLayer`)."""
        conv_steps, recurrent_steps = step_states
        assert conv_steps.shape[2:] == (self.splits[0], self.conv1d.weight.size(-1) - 1)
        assert recurrent_steps.shape[2:] == (self.num_value_heads, self.key_head_dim, self.value_head_dim)
        self.conv_steps, self.recurrent_steps = conv_steps, recurrent_steps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        # x, residual: [tokens, hidden] -> [tokens, hidden], [tokens, hidden]
        projected, residual = self.normed_qkvz(x, residual)
        ba, _ = self.normed_ba(residual, None)  # the same norm of x + residual
        mixed, z = projected.split(self.splits, dim=-1)
        b, a = ba.chunk(2, dim=-1)
        context = get_context()
        q, k, v = self._convolve(mixed, context).split(self.channel_splits, dim=-1)
        tokens = x.size(0)
        q = q.view(tokens, self.num_key_heads, self.key_head_dim)
        k = k.view(tokens, self.num_key_heads, self.key_head_dim)
        v = v.view(tokens, self.num_value_heads, self.value_head_dim)
        out = self._recur(q, k, v, a, b, context)  # [tokens, value heads, value_head_dim] fp32
        out = self.norm(out, z.view_as(out))
        return self.out_proj(out.flatten(1)), residual

    def _slots(self, context: Context, num_seqs: int) -> torch.Tensor | None:
        """Each sequence's state slot, None before the states are bound (they then start from zeros)."""
        if self.conv_state is None:
            return None
        assert context.state_slots is not None and context.state_slots.numel() == num_seqs
        return context.state_slots

    def _num_seqs(self, context: Context, num_tokens: int) -> int:
        """The step's sequences: those `cu_seqlens_q` delimits, or a decode step's rows of
        `queries_per_seq` queries each."""
        return context.cu_seqlens_q.numel() - 1 if context.is_prefill else num_tokens // context.queries_per_seq

    def _step_states(self, steps: torch.Tensor | None, slots: torch.Tensor | None, context: Context, num_seqs: int):
        """The rows of per-position states `steps` ([max_num_seqs, queries, *shape]) the step writes: those of
        its sequences in a verify step or a varlen step once bound, else None."""
        if steps is None or slots is None or not (context.is_prefill or context.queries_per_seq > 1):
            return None
        assert context.is_prefill or context.queries_per_seq == steps.size(1)
        return steps[:num_seqs]

    def _convolve(self, mixed: torch.Tensor, context: Context) -> torch.Tensor:
        """The activated causal convolution of each sequence's new q, k and v channels, from its state, the
        state after its last token written back to its slot (in a verify step the state after each query to
        the per-position states instead)."""
        # mixed: [tokens, channels] -> [tokens, channels]
        weight = self.conv1d.weight[:, 0]  # [channels, kernel_size]
        num_seqs = self._num_seqs(context, mixed.size(0))
        slots = self._slots(context, num_seqs)
        step_states = self._step_states(self.conv_steps, slots, context, num_seqs)
        if self._on_kernels(mixed, slots) and self.activation_is_silu:
            from nanovllm.kernels.triton_causal_conv import conv_queries, conv_varlen  # Triton is needed on CUDA only

            if context.is_prefill:
                return conv_varlen(mixed, weight, self.conv_state, slots, context.cu_seqlens_q, step_states)
            queries = mixed.view(num_seqs, context.queries_per_seq, -1)
            return conv_queries(queries, weight, self.conv_state, slots, step_states).flatten(0, 1)
        if slots is None:
            states = mixed.new_zeros(num_seqs, mixed.size(1), weight.size(1) - 1)
        else:
            states = self.conv_state[slots]
        if context.is_prefill:
            out, states = causal_conv_varlen(mixed, weight, states, context.cu_seqlens_q, step_states)
        else:
            out, per_query = causal_conv_queries(mixed.view(num_seqs, context.queries_per_seq, -1), weight, states)
            out = out.flatten(0, 1)
            if context.queries_per_seq > 1:  # a verify step: the states after each query, the live ones untouched
                if step_states is not None:
                    step_states.copy_(per_query)
                return self.activation(out)
            states = per_query[:, -1]
        if slots is not None:
            self.conv_state[slots] = states.to(self.conv_state.dtype)
        return self.activation(out)

    def _on_kernels(self, x: torch.Tensor, slots: torch.Tensor | None) -> bool:
        """Whether this step runs the Triton kernels: on CUDA, once the states are bound."""
        return x.is_cuda and slots is not None

    def _recur(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor, context: Context
    ) -> torch.Tensor:
        """The gated delta rule over each sequence's new tokens from its state, the state after its last
        token written back to its slot (in a verify step the state after each query to the per-position
        states instead), with the decay -exp(A_log) softplus(a + dt_bias) and the write strength sigmoid(b);
        fp32 outputs [tokens, value heads, value_head_dim]."""
        num_seqs = self._num_seqs(context, q.size(0))
        slots = self._slots(context, num_seqs)
        if self._on_kernels(q, slots):
            return self._recur_on_kernels(q, k, v, a, b, context, slots)
        g = -self.A_log.exp() * F.softplus(a.float() + self.dt_bias)  # [tokens, value heads], <= 0
        beta = b.sigmoid()
        if not context.is_prefill:  # queries_per_seq tokens per sequence, one after another
            batch = (q.size(0) // context.queries_per_seq, context.queries_per_seq)
            return self._recur_batch(*(t.view(*batch, *t.shape[1:]) for t in (q, k, v, g, beta)), context).flatten(0, 1)
        # sequences padded to the longest: padding (g = 0, beta = 0) leaves a state as it is
        seq, step, num_seqs = _token_places(context, q.size(0))
        batch = (num_seqs, context.max_seqlen_q)
        return self._recur_batch(*(_padded(t, seq, step, batch) for t in (q, k, v, g, beta)), context)[seq, step]

    def _recur_on_kernels(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        context: Context,
        slots: torch.Tensor,
    ) -> torch.Tensor:
        """`_recur` in the Triton kernels: the chunked rule for a varlen step's prompts, token by token for the
        sequences of one query beside them (`Context.one_query`), where per-position states are kept (a varlen
        step with drafts) and in decode and verify steps."""
        # Triton is needed on CUDA only
        from nanovllm.kernels.triton_gated_delta_chunked import gated_delta_chunked
        from nanovllm.kernels.triton_gated_delta_recurrent import gated_delta_recurrent

        params = (a, b, self.A_log, self.dt_bias, self.recurrent_state, slots)
        step_states = self._step_states(self.recurrent_steps, slots, context, slots.numel())
        if not context.is_prefill:
            queries = context.queries_per_seq
            return gated_delta_recurrent(
                q, k, v, *params, queries_per_seq=queries, step_states=step_states, write_state=queries == 1
            )
        if step_states is not None:
            return gated_delta_recurrent(q, k, v, *params, cu_seqlens=context.cu_seqlens_q, step_states=step_states)
        one_query = context.one_query
        if one_query is None:
            return gated_delta_chunked(q, k, v, *params, context.cu_seqlens_q, context.max_seqlen_q)
        if one_query.num_others == 0:  # one token per sequence, in order: a decode step's layout
            return gated_delta_recurrent(q, k, v, *params)
        # the prompts in chunks; the decodes beside them in the one-token kernel, each a whole chunk's work there
        out = gated_delta_chunked(q, k, v, *params, context.cu_seqlens_q, context.max_seqlen_q, seqs=one_query.others)
        rows = one_query.rows
        out[rows] = gated_delta_recurrent(
            q[rows], k[rows], v[rows], a[rows], b[rows], *params[2:5], slots[one_query.seqs]
        )
        return out

    def _recur_batch(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, context: Context
    ) -> torch.Tensor:
        """`gated_delta_rule` over a batch of sequences, one per state slot, from their slots' states (zeros
        before binding), which it then updates (a verify step writes its per-position states instead)."""
        # q, k: [seqs, steps, key heads, dk]; v: [seqs, steps, value heads, dv]; g, beta: [seqs, steps, value heads]
        num_seqs = q.size(0)
        slots = self._slots(context, num_seqs)
        if slots is None:
            state = q.new_zeros(
                num_seqs, self.num_value_heads, self.key_head_dim, self.value_head_dim, dtype=torch.float32
            )
        else:
            state = self.recurrent_state[slots]
        step_states = self._step_states(self.recurrent_steps, slots, context, num_seqs)
        out, state = gated_delta_rule(q, k, v, g, beta, state, step_states)
        if slots is not None and (context.is_prefill or context.queries_per_seq == 1):
            self.recurrent_state[slots] = state
        return out


def _token_places(context: Context, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Each packed token's sequence and step within it (`cu_seqlens_q` delimits the sequences), and the
    number of sequences."""
    cu_seqlens = context.cu_seqlens_q
    num_seqs = cu_seqlens.numel() - 1
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    seq = torch.repeat_interleave(torch.arange(num_seqs, device=cu_seqlens.device), lengths, output_size=num_tokens)
    step = torch.arange(num_tokens, device=cu_seqlens.device) - cu_seqlens[seq]
    return seq, step, num_seqs


def _padded(x: torch.Tensor, seq: torch.Tensor, step: torch.Tensor, batch: tuple[int, int]) -> torch.Tensor:
    """Packed tokens' rows `x` [tokens, ...] placed at (sequence, step) of a zero tensor [*batch, ...]."""
    out = x.new_zeros(*batch, *x.shape[1:])
    out[seq, step] = x
    return out
