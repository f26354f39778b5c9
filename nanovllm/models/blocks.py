"""The pre-norm decoder the model families are built from: attention, gated-MLP and mixture-of-experts
blocks, the decoder layer that owns their norms, the decoder stack and the causal-LM head.

What families add is an option of these parts, set by `ModelConfig`: a layer's
sliding window and score soft-cap, norms on the blocks' outputs too (Gemma 2's
"sandwich"), scaled embeddings, soft-capped logits, experts in place of a
layer's dense MLP (Qwen3-MoE, Mixtral; with biases and a clamped SwiGLU,
gpt-oss), attention sinks (gpt-oss), an output gate on attention and Gated
DeltaNet (linear attention) in place of it in some layers (Qwen3.5).

Each residual add is deferred into the next norm. Each block is given, when it
is built, the norm in front of it (its decoder layer owns the norm, so the
weight keeps the checkpoint's name) and chooses itself how to run it with its
first projection, and its activation with its last one (`fused_projection`).
"""

import functools

import torch
from torch import nn

from nanovllm.layers.activation import sigmoid_gated
from nanovllm.layers.attention import Attention
from nanovllm.layers.embed_head import ParallelLMHead, VocabParallelEmbedding
from nanovllm.layers.fused_moe import FusedMoE
from nanovllm.layers.fused_projection import NormedGatedProjections, NormedProjection
from nanovllm.layers.gated_delta_net import GatedDeltaNet
from nanovllm.layers.layernorm import RMSNorm
from nanovllm.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    one_row_on_cuda,
)
from nanovllm.layers.rotary_embedding import RotaryEmbedding
from nanovllm.layers.shared_expert import SharedExpert
from nanovllm.models.model_config import ModelConfig
from nanovllm.utils.loader import shard
from nanovllm.utils.parallel import kv_heads_per_rank, tp_rank, tp_size


class AttentionBlock(nn.Module):
    """input_norm(x + residual) -> fused QKV projection -> q/k RMSNorm per head (config.qk_norm) and rotary
    -> paged attention (over the last `window` tokens when given) -> output projection. With
    config.attn_output_gate the projection also gives each head a gate, and the attention's output is
    multiplied by sigmoid(gate) before the output projection. With config.attention_sinks each head has a
    learned sink logit (`sinks`, this rank's heads) in its softmax sum."""

    def __init__(
        self,
        config: ModelConfig,
        input_norm: nn.Module,
        rotary: RotaryEmbedding,
        window: int | None = None,
        sums_in_norms: bool = False,
    ):
        super().__init__()
        self.head_dim = config.head_dim
        self.num_heads = config.num_attention_heads // tp_size()
        self.num_kv_heads, _ = kv_heads_per_rank(config.num_key_value_heads, tp_size())
        self.output_gate = config.attn_output_gate
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            self.head_dim,
            config.num_attention_heads,
            config.num_key_value_heads,
            bias=config.qkv_bias,
            output_gate=self.output_gate,
        )
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * self.head_dim,
            config.hidden_size,
            bias=config.o_proj_bias,
            reduce_results=not sums_in_norms,
        )
        # this rank's q (and gates), k and v, as the projection gives them
        kv_size = self.num_kv_heads * self.head_dim
        self.splits = [self.num_heads * self.head_dim * (2 if self.output_gate else 1), kv_size, kv_size]
        qk_norm = functools.partial(RMSNorm, self.head_dim, config.rms_norm_eps, config.norm_unit_offset)
        self.q_norm = qk_norm() if config.qk_norm else None
        self.k_norm = qk_norm() if config.qk_norm else None
        self.sinks, self.tp_rank = None, tp_rank()
        if config.attention_sinks:
            self.sinks = nn.Parameter(torch.empty(self.num_heads), requires_grad=False)
            self.sinks.weight_loader = self._load_sinks
        self.attn = Attention(
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            config.attention_scale,
            rotary,
            window=window,
            softcap=config.attn_logit_softcapping,
            sinks=self.sinks,
        )
        self.normed_qkv = NormedProjection(input_norm, self.qkv_proj, partial_input=sums_in_norms)

    def _load_sinks(self, param: nn.Parameter, loaded) -> None:
        """This rank's heads' sink logits of the checkpoint's [num_attention_heads]."""
        param.data.copy_(shard(loaded, 0, self.tp_rank * self.num_heads, self.num_heads))

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention over input_norm(x + residual), and x + residual, the next residual."""
        # x, residual: [tokens, hidden]
        qkv, residual = self.normed_qkv(x, residual)
        q, k, v = qkv.split(self.splits, dim=-1)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if not self.output_gate:
            q = q.view(-1, self.num_heads, self.head_dim)
            return self.o_proj(self.attn(positions, q, k, v, self.q_norm, self.k_norm)), residual
        q, gate = q.view(-1, self.num_heads, 2, self.head_dim).unbind(2)  # [tokens, heads, head_dim] each
        o = self.attn(positions, q, k, v, self.q_norm, self.k_norm).view_as(gate)
        return self.o_proj(sigmoid_gated(o, gate).flatten(1)), residual


class GatedMLP(nn.Module):
    """down(act(gate(y)) * up(y)) for y = input_norm(x + residual), with gate and up in one projection."""

    def __init__(self, config: ModelConfig, input_norm: nn.Module, sums_in_norms: bool = False):
        super().__init__()
        bias = config.mlp_bias
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [config.intermediate_size] * 2, bias=bias)
        self.down_proj = RowParallelLinear(
            config.intermediate_size, config.hidden_size, bias=bias, reduce_results=not sums_in_norms
        )
        self.projections = NormedGatedProjections(
            input_norm, self.gate_up_proj, self.down_proj, config.hidden_act, partial_input=sums_in_norms
        )

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The MLP of input_norm(x + residual), and x + residual, the next residual."""
        return self.projections(x, residual)


class SparseMoeBlock(nn.Module):
    """Experts in place of the MLP: for y = input_norm(x + residual), the router (gate) scores every expert
    of each token, and the num_experts_per_tok best run on it, their outputs weighted (`FusedMoE`). Where
    config.shared_expert_intermediate_size is set, a shared expert's gated output is added (`SharedExpert`).
    A shared expert as wide as the routed ones (Qwen3.5/3.6-MoE, Qwen3-Next) loads as its own module, then
    moves into the experts' last slot and its gate into the router's last row (`finish_loading`): it runs
    inside the experts' kernels, which in a one-sequence step saves the launches of its products, gate and
    sum, and of the norm, which then runs inside the router's and the experts' first kernels."""

    def __init__(self, config: ModelConfig, input_norm: RMSNorm):
        super().__init__()
        # a bound method, not the module: the norm's weight stays registered (and named) in its decoder layer
        self.input_norm = input_norm.__call__
        self.gate = ReplicatedLinear(config.hidden_size, config.num_experts, bias=config.expert_bias)
        shared_width = config.shared_expert_intermediate_size
        # the experts' slots hold 16-bit weights: not an FP8 checkpoint's shared expert, nor MXFP4 experts
        shared_in_experts = (
            shared_width == config.moe_intermediate_size
            and config.weight_quantization is None
            and config.expert_quantization is None
        )
        self.experts = FusedMoE(
            config.num_experts,
            config.num_experts_per_tok,
            config.hidden_size,
            config.moe_intermediate_size,
            config.expert_act,
            config.norm_topk_prob,
            bias=config.expert_bias,
            inputs_first=config.checkpoint_names.experts_inputs_first,
            mxfp4=config.expert_quantization is not None,
            shared_expert=shared_in_experts,
        )
        self.normed_gate = NormedProjection(input_norm, self.gate)
        self.shared_expert = None
        if shared_width:
            self.shared_expert = SharedExpert(config.hidden_size, shared_width, config.hidden_act)

    def finish_loading(self) -> None:
        """Move a shared expert that the experts' last slot takes there, and its gate into the router."""
        if self.shared_expert is None or not self.experts.has_shared_expert:
            return
        shared = self.shared_expert
        self.experts.take_shared_expert(shared.gate_up_proj.weight, shared.down_proj.weight)
        # [experts + 1, hidden]: the router's logits end with the shared expert's gate
        router = torch.cat([self.gate.weight, shared.gate.weight])
        self.gate.weight = nn.Parameter(router, requires_grad=False)
        self.shared_expert = None

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The experts' output for input_norm(x + residual), and x + residual, the next residual."""
        # x, residual: [tokens, hidden]
        if one_row_on_cuda(x) and self.shared_expert is None:
            # one row on CUDA: the norm runs inside the router's GEMV and again inside the experts' first
            # kernel, each reading x + residual, rather than in a launch of its own between the two
            router_logits, residual = self.normed_gate(x, residual)
            return self.experts(residual, router_logits, self.normed_gate.norm), residual
        # with a shared expert the norm runs once: the router, the experts and the shared expert all read y
        y, residual = self.input_norm(x, residual)
        shared = None if self.shared_expert is None else self.shared_expert(y)
        return self.experts(y, self.gate(y), shared=shared), residual


def _norm(config: ModelConfig) -> RMSNorm:
    return RMSNorm(config.hidden_size, config.rms_norm_eps, config.norm_unit_offset)


def _gated_delta_net(config: ModelConfig, input_norm: RMSNorm) -> GatedDeltaNet:
    """The Gated DeltaNet of a "linear_attention" layer, behind `input_norm`; its convolution's activation is
    the model's hidden_act (SiLU in Qwen3.5), as transformers has it."""
    return GatedDeltaNet(
        config.hidden_size,
        config.linear_num_key_heads,
        config.linear_num_value_heads,
        config.linear_key_head_dim,
        config.linear_value_head_dim,
        config.linear_conv_kernel_dim,
        config.rms_norm_eps,
        config.hidden_act,
        input_norm,
    )


class DecoderLayer(nn.Module):
    """Pre-norm layer `index`: attention (a Gated DeltaNet, `linear_attn`, in a "linear_attention" layer),
    then the MLP (experts where config.moe_layers names the layer), each behind its RMSNorm. With
    config.sandwich_norms each block's output is normalised too before it joins the residual stream (Gemma 2);
    the checkpoint then names the norms input_layernorm, post_attention_layernorm (on the attention's output),
    pre_feedforward_layernorm and post_feedforward_layernorm. A layer beyond the decoder's (a
    multi-token-prediction layer) gives its `layer_type` and whether its MLP is `moe` itself. With
    `sums_in_norms` (attention and a dense MLP, no sandwich norms) its o and down projections leave their
    tensor-parallel sums to the norms after them: its output is this rank's part of a sum."""

    def __init__(
        self,
        config: ModelConfig,
        index: int,
        rotary: RotaryEmbedding | None,
        layer_type: str | None = None,
        moe: bool | None = None,
        sums_in_norms: bool = False,
    ):
        super().__init__()
        layer_type = layer_type or config.layer_types[index]
        moe = index in config.moe_layers if moe is None else moe
        self.input_layernorm = _norm(config)
        self.post_attention_layernorm = _norm(config)
        mlp_norm = self.post_attention_layernorm
        self.sandwich_norms = config.sandwich_norms
        if self.sandwich_norms:
            self.pre_feedforward_layernorm = mlp_norm = _norm(config)
            self.post_feedforward_layernorm = _norm(config)
        self.self_attn = self.linear_attn = None
        if layer_type == "linear_attention":
            self.linear_attn = _gated_delta_net(config, self.input_layernorm)
        else:
            window = config.layer_window(index) if index < len(config.layer_specs) else None
            self.self_attn = AttentionBlock(config, self.input_layernorm, rotary, window, sums_in_norms)
        if sums_in_norms:
            assert self.self_attn is not None and not moe and not self.sandwich_norms
            self.mlp = GatedMLP(config, mlp_norm, sums_in_norms)
        else:
            self.mlp = (SparseMoeBlock if moe else GatedMLP)(config, mlp_norm)

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.linear_attn is None:
            x, residual = self.self_attn(positions, x, residual)
        else:
            x, residual = self.linear_attn(x, residual)
        if not self.sandwich_norms:
            return self.mlp(x, residual)
        # the residual add stays deferred into the next norm: it adds the normalised output
        x, residual = self.mlp(self.post_attention_layernorm(x), residual)
        return self.post_feedforward_layernorm(x), residual


def rotary_embeddings(config: ModelConfig) -> dict[str, RotaryEmbedding]:
    """One rotary embedding per attention layer type, which the layers of that type share: its cos/sin table
    holds max_position_embeddings rows (268 MB in fp32 for Gemma 3's 131,072 positions and 256 dimensions), too
    much to repeat in every layer. Linear-attention layers rotate nothing."""
    return {
        layer_type: RotaryEmbedding(
            config.head_dim, config.max_position_embeddings, config.rope_parameters_of(layer_type), config.rotary_dim
        )
        for layer_type in dict.fromkeys(config.layer_types)
        if layer_type != "linear_attention"
    }


class DecoderModel(nn.Module):
    """Embedding (times config.embed_scale when set), decoder layers, final norm.

    With several ranks, where every layer is attention and a dense MLP with no norms on their outputs,
    each row-parallel projection leaves its sum to the norm after it, which sums, adds the residual and
    normalises in one kernel between the GPUs of one host (`RMSNorm`'s `reduce`): one launch and one pass
    over the rows fewer per sum."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.embed_scale = config.embed_scale
        rotary = rotary_embeddings(config)
        # (not registered here: the layers that rotate hold them) a multi-token-prediction layer shares them too
        self.rotary = rotary
        self.sums_in_norms = (
            tp_size() > 1
            and not config.sandwich_norms
            and not config.moe_layers
            and "linear_attention" not in config.layer_types
        )
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, rotary.get(layer_type), sums_in_norms=self.sums_in_norms)
            for i, layer_type in enumerate(config.layer_types)
        )
        self.norm = _norm(config)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x, residual = self.embed_tokens(input_ids), None
        if self.embed_scale is not None:
            x = x * rounded_to(self.embed_scale, x.dtype)
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        x, _ = self.norm(x, residual, reduce=self.sums_in_norms)
        return x


@functools.cache
def rounded_to(value: float, dtype: torch.dtype) -> float:
    """`value` as `dtype` holds it: Gemma's embedding scale is applied in the model's dtype (sqrt(3584) is
    59.75 in bfloat16), and the checkpoints expect that."""
    return torch.tensor(value, dtype=dtype).item()


class DecoderForCausalLM(nn.Module):
    """Decoder plus LM head (tied to the embedding when the config says so); logits soft-capped where the
    config says (config.final_logit_softcapping). Every family's model: what sets one apart comes in through
    `config`, its checkpoint's tensor names too (config.checkpoint_names, kept as the attributes the weight
    loader reads). A family with a decoder of its own names it in `decoder_class`."""

    decoder_class: type[nn.Module] = DecoderModel

    def __init__(self, config: ModelConfig):
        super().__init__()
        names = config.checkpoint_names
        self.checkpoint_prefixes = names.prefixes
        self.checkpoint_renames = names.renames
        self.packed_modules_mapping = names.packed_modules
        self.expert_weights = names.expert_weights
        self.stacked_expert_weights = names.stacked_expert_weights
        self.model = self.decoder_class(config)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        self.tie_word_embeddings = config.tie_word_embeddings
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.final_logit_softcapping = config.final_logit_softcapping

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # input_ids, positions: [tokens] -> hidden states [tokens, hidden]
        return self.model(input_ids, positions)

    def compute_logits(self, hidden_states: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor | None:
        """Logits [rows, vocab] of the hidden states on rank 0 (None on the other ranks, which join the gather);
        with one rank written into `out` when given."""
        return self.lm_head.gather(self.compute_local_logits(hidden_states, out))

    def compute_local_logits(self, hidden_states: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """This rank's slice of the logits [rows, vocab / ranks], written into `out` when given."""
        logits = self.lm_head(hidden_states, out)
        cap = self.final_logit_softcapping
        if cap is not None:
            logits.div_(cap).tanh_().mul_(cap)  # in place, so that `out` holds the capped logits
        return logits
