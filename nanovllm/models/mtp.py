"""The multi-token-prediction (MTP) layer that Qwen3.5 and Qwen3-Next checkpoints ship beside the decoder
(`mtp.*`): from a position's hidden state and the token after it, a guess at the token after next.

At position t, with h_t the decoder's hidden state there (after its final norm)
and e the embedding of token t + 1 (the decoder's embedding table):

    x = fc(cat([pre_fc_norm_embedding(e), pre_fc_norm_hidden(h_t)]))
    y = norm(layer(x))          (one gated full-attention decoder layer, rotary at position t)

and the decoder's LM head on y gives the logits of token t + 2. The layer's
attention reads the K/V of this layer at the earlier positions, so it runs at
every position the decoder computes. To guess further, y stands for the hidden
state at position t + 1 beside the guess for token t + 2 (vLLM feeds its MTP
drafts on the same way). Every norm scales by 1 + weight, as the decoder's do.
Rotary turns q and k by relative offsets, so reading the layer at position t or
t + 1 (as long as every position is read alike) gives the same drafts.

`DecoderWithMTP` is the model of speculative method "mtp": the decoder with
this layer (`models.model_class`).
"""

import torch
from torch import nn

from nanovllm.layers.layernorm import RMSNorm
from nanovllm.layers.linear import ReplicatedLinear
from nanovllm.layers.rotary_embedding import RotaryEmbedding
from nanovllm.models.blocks import DecoderForCausalLM, DecoderLayer
from nanovllm.models.model_config import ModelConfig


class MultiTokenPredictor(nn.Module):
    """The MTP layer, named as the checkpoint's `mtp.` tensors: fc, pre_fc_norm_embedding, pre_fc_norm_hidden,
    layers.0 (a full-attention decoder layer, its MLP the decoder's kind: experts with a shared expert in a
    mixture-of-experts model), norm. `rotary` is the decoder's full-attention rotary, shared."""

    PREFIX = "mtp."

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding):
        super().__init__()
        hidden, eps, offset = config.hidden_size, config.rms_norm_eps, config.norm_unit_offset
        self.fc = ReplicatedLinear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = RMSNorm(hidden, eps, offset)
        self.pre_fc_norm_hidden = RMSNorm(hidden, eps, offset)
        index = config.num_hidden_layers  # its K/V follow the decoder layers' (`ModelConfig.cache_specs`)
        self.layers = nn.ModuleList(
            [DecoderLayer(config, index, rotary, layer_type="full_attention", moe=config.num_experts > 0)]
        )
        self.norm = RMSNorm(hidden, eps, offset)

    def forward(self, embeddings: torch.Tensor, hidden_states: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # embeddings, hidden_states: [tokens, hidden]; positions: [tokens] -> [tokens, hidden]
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(embeddings), self.pre_fc_norm_hidden(hidden_states)], -1))
        x, residual = self.layers[0](positions, x, None)
        return self.norm(x, residual)[0]


class DecoderWithMTP(DecoderForCausalLM):
    """The decoder and LM head with the checkpoint's MTP layer (`mtp`, loaded from its `mtp.` tensors), built
    after them so that its attention comes last in module order, as its cache layer does in
    `ModelConfig.cache_specs`: the model of speculative method "mtp"."""

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.mtp = MultiTokenPredictor(config, self.model.rotary["full_attention"])
        prefix = MultiTokenPredictor.PREFIX
        self.checkpoint_prefixes = {p: ours for p, ours in self.checkpoint_prefixes.items() if p != prefix}

    def forward_mtp(self, next_ids: torch.Tensor, hidden_states: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The MTP layer at each position: from the token after it and the hidden state there (the decoder's,
        or this layer's own when it drafts on from its last draft), its hidden state, whose logits
        (`compute_logits`) predict the token after next."""
        # next_ids, positions: [tokens]; hidden_states: [tokens, hidden] -> [tokens, hidden]
        return self.mtp(self.model.embed_tokens(next_ids), hidden_states, positions)
