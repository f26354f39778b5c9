"""Gemma 4's decoder, from the layers the other families use, as transformers' Gemma4ForCausalLM computes it.

A layer, for the residual stream h (`config.gemma4` names what a checkpoint has):

    a = o_proj(attention(input_layernorm(h)))                 q/k RMSNorm per head, V by an unweighted one
    h = h + post_attention_layernorm(a)
    m = mlp(pre_feedforward_layernorm(h))                     GeGLU, twice as wide in KV-shared layers when set
    with experts: m = post_feedforward_layernorm_1(m)
                    + post_feedforward_layernorm_2(experts(pre_feedforward_layernorm_2(h)))
                  routed by router(h): softmax of proj(rms(h) * scale / sqrt(hidden)), top-k renormalised,
                  each weight times its expert's per_expert_scale
    h = h + post_feedforward_layernorm(m)
    with per-layer inputs p_i: h = h + post_per_layer_input_norm(per_layer_projection(gelu(gate(h)) * p_i))
    h = h * layer_scalar

The per-layer inputs of a token are (norm(W e / sqrt(hidden)) + E_pl[token] * sqrt(P)) / sqrt(2), e its scaled
embedding and P hidden_size_per_layer_input, one slice of P per layer. Sliding and global layers have their
own head size and KV heads (a cache block holds as many layers of one shape as fit); a global layer with
attention_k_eq_v has no v_proj, its V being the K projection's output (normalised without weight, not
rotated, so it differs from K and is stored beside it). A KV-shared layer projects queries only and attends
over its source layer's K/V (`Attention`'s kv_source). Norms scale by their weight; attention scores are not
scaled.
"""

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from nanovllm.cache.specs import SharedKV
from nanovllm.layers.attention import Attention
from nanovllm.layers.embed_head import VocabParallelEmbedding
from nanovllm.layers.fused_moe import FusedMoE
from nanovllm.layers.layernorm import RMSNorm, rms_normalize
from nanovllm.layers.linear import FusedColumnParallelLinear, ReplicatedLinear, RowParallelLinear, divide
from nanovllm.layers.rotary_embedding import RotaryEmbedding
from nanovllm.models.blocks import DecoderForCausalLM, GatedMLP, rounded_to
from nanovllm.models.model_config import ModelConfig
from nanovllm.utils.parallel import tp_size


class Gemma4Attention(nn.Module):
    """q (and, but in a KV-shared layer, k and v: v from k's projection with attention_k_eq_v in a global
    layer) in one projection, q/k RMSNorm per head, an unweighted RMSNorm on v, rotary, paged attention, the
    output projection. `source`: the layer whose K/V a KV-shared layer reads."""

    def __init__(self, config: ModelConfig, index: int, rotary: RotaryEmbedding, source: "Gemma4Attention | None"):
        super().__init__()
        spec = config.layer_specs[index]
        shape_layer = spec.source_layer if isinstance(spec, SharedKV) else index
        shape = config.layer_specs[shape_layer]
        heads, kv_heads, self.head_dim = config.num_attention_heads, shape.num_kv_heads, shape.head_dim
        ranks = tp_size()
        self.num_heads = divide(heads, ranks, "attention heads")
        self.num_kv_heads = divide(kv_heads, ranks, "KV heads")
        self.eps = config.rms_norm_eps
        shards = {"q": heads * self.head_dim}
        if source is None:
            shards["k"] = kv_heads * self.head_dim
            if not (config.gemma4.attention_k_eq_v and config.layer_types[index] == "full_attention"):
                shards["v"] = kv_heads * self.head_dim
        self.splits = [size // ranks for size in shards.values()]
        self.qkv_proj = FusedColumnParallelLinear(config.hidden_size, shards, bias=config.qkv_bias)
        self.qkv_proj.weight.shard_ids = list(shards)  # the checkpoint tensors it is made of, which the loader checks
        self.o_proj = RowParallelLinear(heads * self.head_dim, config.hidden_size, bias=config.o_proj_bias)
        self.q_norm = RMSNorm(self.head_dim, self.eps)
        self.k_norm = RMSNorm(self.head_dim, self.eps) if source is None else None
        self.attn = Attention(
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            config.attention_scale,
            rotary,
            window=config.layer_window(index),
            kv_source=None if source is None else source.attn,
        )

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        # x: [tokens, hidden] (normalised) -> [tokens, hidden]
        parts = self.qkv_proj(x).split(self.splits, dim=-1)
        q = parts[0].view(-1, self.num_heads, self.head_dim)
        if self.k_norm is None:
            return self.o_proj(self.attn(positions, q, None, None, self.q_norm))
        k = parts[1].view(-1, self.num_kv_heads, self.head_dim)
        v = k if len(parts) == 2 else parts[2].view(-1, self.num_kv_heads, self.head_dim)
        return self.o_proj(self.attn(positions, q, k, rms_normalize(v, self.eps), self.q_norm, self.k_norm))


class Gemma4Router(nn.Module):
    """The experts' router: logits proj(rms(h) * scale / sqrt(hidden)), and per_expert_scale, which multiplies
    each chosen expert's weight."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        num_experts = config.num_experts
        self.eps, self.root = config.rms_norm_eps, config.hidden_size**-0.5
        self.proj = ReplicatedLinear(config.hidden_size, num_experts)
        self.scale = nn.Parameter(torch.ones(config.hidden_size), requires_grad=False)
        self.per_expert_scale = nn.Parameter(torch.ones(num_experts), requires_grad=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        # h: [tokens, hidden] -> router logits [tokens, experts]
        return self.proj(rms_normalize(h, self.eps) * self.scale * self.root)


class Gemma4DecoderLayer(nn.Module):
    """One layer (the module docstring's formulas), its norms under the checkpoint's names."""

    def __init__(self, config: ModelConfig, index: int, rotary: RotaryEmbedding, source: Gemma4Attention | None):
        super().__init__()
        gemma4 = config.gemma4

        def norm(size: int = config.hidden_size) -> RMSNorm:
            return RMSNorm(size, config.rms_norm_eps)

        self.input_layernorm = norm()
        self.self_attn = Gemma4Attention(config, index, rotary, source)
        self.post_attention_layernorm = norm()
        self.pre_feedforward_layernorm = norm()
        self.mlp = GatedMLP(
            dataclasses.replace(config, intermediate_size=gemma4.mlp_sizes[index]), self.pre_feedforward_layernorm
        )
        self.post_feedforward_layernorm = norm()
        self.router = self.experts = None
        if config.num_experts:
            self.router = Gemma4Router(config)
            self.experts = FusedMoE(
                config.num_experts,
                config.num_experts_per_tok,
                config.hidden_size,
                config.moe_intermediate_size,
                config.expert_act,
                config.norm_topk_prob,
            )
            self.pre_feedforward_layernorm_2 = norm()
            self.post_feedforward_layernorm_1 = norm()
            self.post_feedforward_layernorm_2 = norm()
        self.per_layer_input_gate = None
        if gemma4.hidden_size_per_layer_input:
            size = gemma4.hidden_size_per_layer_input
            self.per_layer_input_gate = ReplicatedLinear(config.hidden_size, size)
            self.per_layer_projection = ReplicatedLinear(size, config.hidden_size)
            self.post_per_layer_input_norm = norm()
        self.layer_scalar = nn.Parameter(torch.ones(1), requires_grad=False)

    def forward(self, positions: torch.Tensor, h: torch.Tensor, per_layer_input: torch.Tensor | None) -> torch.Tensor:
        # h: [tokens, hidden]; per_layer_input: [tokens, hidden_size_per_layer_input] -> [tokens, hidden]
        a = self.self_attn(positions, self.input_layernorm(h))
        m, h = self.mlp(self.post_attention_layernorm(a), h)  # the MLP of pre_feedforward_layernorm(h + ...)
        if self.experts is not None:
            y = self.experts(
                self.pre_feedforward_layernorm_2(h), self.router(h), expert_scale=self.router.per_expert_scale
            )
            m = self.post_feedforward_layernorm_1(m) + self.post_feedforward_layernorm_2(y)
        h = h + self.post_feedforward_layernorm(m)
        if self.per_layer_input_gate is not None:
            gated = F.gelu(self.per_layer_input_gate(h), approximate="tanh") * per_layer_input
            h = h + self.post_per_layer_input_norm(self.per_layer_projection(gated))
        return h * self.layer_scalar


class Gemma4Model(nn.Module):
    """Scaled embedding, per-layer inputs (where the checkpoint has them), decoder layers, final norm."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.embed_scale = config.embed_scale
        self.per_layer_size = config.gemma4.hidden_size_per_layer_input
        if self.per_layer_size:
            width = config.num_hidden_layers * self.per_layer_size
            self.embed_tokens_per_layer = VocabParallelEmbedding(config.gemma4.vocab_size_per_layer_input, width)
            self.per_layer_model_projection = ReplicatedLinear(config.hidden_size, width)
            self.per_layer_projection_norm = RMSNorm(self.per_layer_size, config.rms_norm_eps)
            self.projection_scale = config.hidden_size**-0.5
        rotary = {}
        for index, layer_type in enumerate(config.layer_types):
            spec = config.layer_specs[index]
            if layer_type not in rotary and not isinstance(spec, SharedKV):
                rotary[layer_type] = RotaryEmbedding(
                    spec.head_dim, config.max_position_embeddings, config.rope_parameters_of(layer_type)
                )
        layers: list[Gemma4DecoderLayer] = []
        for index, (layer_type, source) in enumerate(zip(config.layer_types, config.gemma4.kv_sources)):
            source_attention = None if source is None else layers[source].self_attn
            layers.append(Gemma4DecoderLayer(config, index, rotary[layer_type], source_attention))
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # input_ids, positions: [tokens] -> [tokens, hidden]
        h = self.embed_tokens(input_ids)
        h = h * rounded_to(self.embed_scale, h.dtype)
        per_layer = self._per_layer_inputs(input_ids, h) if self.per_layer_size else None
        for i, layer in enumerate(self.layers):
            h = layer(positions, h, None if per_layer is None else per_layer[:, i])
        return self.norm(h)

    def _per_layer_inputs(self, input_ids: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """Each layer's slice of the per-layer inputs: (norm(W e / sqrt(hidden)) + E_pl[token] * sqrt(P)) /
        sqrt(2) for a token of scaled embedding e."""
        # input_ids: [tokens]; embeds: [tokens, hidden] -> [tokens, layers, P]
        size = self.per_layer_size
        weight = self.embed_tokens_per_layer.weight
        tokens = self.embed_tokens_per_layer(input_ids) * rounded_to(size**0.5, weight.dtype)
        projected = self.per_layer_model_projection(embeds) * self.projection_scale
        projected = self.per_layer_projection_norm(projected.view(embeds.size(0), -1, size))
        return (projected + tokens.view(embeds.size(0), -1, size)) * 2.0**-0.5


class Gemma4ForCausalLM(DecoderForCausalLM):
    """Gemma 4's decoder and its LM head (tied to the embedding unless the config says not), the logits
    soft-capped where the config says."""

    decoder_class = Gemma4Model

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        # a KV-shared layer's own K/V projections and norm, which checkpoints may hold but it never runs
        self.unused_checkpoint_tensors = frozenset(
            f"model.layers.{i}.self_attn.{name}.weight"
            for i, source in enumerate(config.gemma4.kv_sources)
            if source is not None
            for name in ("k_proj", "v_proj", "k_norm")
        )
