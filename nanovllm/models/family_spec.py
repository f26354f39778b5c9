"""What sets a model family apart, as one typed spec that its family file declares.

A family file (`llama.py`, `gemma2.py`, ...) declares a `FamilySpec`: the
defaults of transformers' config class for the fields a config.json may leave
out (`HFDefaults`), and the traits the family fixes whatever its config says
(norms, activation key, which layers slide, rotary of the sliding layers,
experts, linear-attention layers, checkpoint names). `ModelConfig.from_hf` reads the spec of the
checkpoint's architecture; every family runs on the decoder of `blocks`.

This module imports neither torch nor transformers, so reading a config loads
neither.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum


@dataclass(frozen=True)
class HFDefaults:
    """The values of transformers' config class of a family for the fields a config.json may leave out;
    those given here are LlamaConfig's, which a family's spec overrides where its class differs."""

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None  # None: num_attention_heads
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"  # read from the config field FamilySpec.activation_key names
    tie_word_embeddings: bool = False
    sliding_window: int | None = None  # read only where FamilySpec.sliding_layers is not NONE
    # where the layers slide per layer type and the config has no layer_types, every pattern-th layer is global
    sliding_window_pattern: int | None = None
    query_pre_attn_scalar: float | None = None  # None: head_dim (the attention scale is its inverse square root)
    # None: the family has no such soft-cap, and the config's field is not read
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    # the context a scaled rotary extends; None: the rope dict's, else max_position_embeddings
    original_max_position_embeddings: int | None = None
    # the share of each head that rotary turns, where neither the rope dict nor the config's top level gives it
    partial_rotary_factor: float = 1.0


@dataclass(frozen=True)
class ExpertDefaults:
    """A mixture-of-experts family's defaults for its experts, which sit in every decoder_sparse_step-th
    layer but those in mlp_only_layers (those keep a dense MLP of intermediate_size)."""

    num_local_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int | None = None  # None: intermediate_size
    norm_topk_prob: bool = False  # the chosen experts' weights are renormalised to sum to 1
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    # the width of the one expert every token also runs through, its output scaled by a sigmoid gate (Qwen3.5-MoE);
    # None: the family has none, and a config that sets one is refused
    shared_expert_intermediate_size: int | None = None
    # False where transformers' class for the family ignores the config's norm_topk_prob, decoder_sparse_step
    # and mlp_only_layers: the defaults above then hold whatever the config says
    config_sets_layout: bool = True
    biased: bool = False  # the router and each expert's projections add a bias (gpt-oss)
    # the experts' gated activation, fixed by the family whatever hidden_act says (gpt-oss: "gpt_oss_swiglu", a
    # clamped SwiGLU); None: hidden_act
    activation: str | None = None


@dataclass(frozen=True)
class LinearAttentionDefaults:
    """A hybrid family's defaults for its Gated DeltaNet (linear attention) layers, which sit where the
    config's layer_types say "linear_attention", else in every layer but each full_attention_interval-th
    (those attend over the whole sequence). Each value head reads key head h * num_key_heads //
    num_value_heads."""

    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int  # the causal depthwise convolution's width, over q, k and v
    full_attention_interval: int


class SlidingLayers(Enum):
    """Which decoder layers attend over the config's sliding_window tokens, when it sets one."""

    NONE = "none"  # no layer slides; the config's sliding_window is not read
    ALL = "all"  # every layer (Mistral v0.1, Phi-3, Mixtral)
    # as the config's layer_types say, else every sliding_window_pattern-th layer is global (Gemma 2 and 3)
    PER_LAYER_TYPE = "per_layer_type"


# transformers' checkpoint names of the projections our fused ones hold -> (our fused parameter, shard id)
SEPARATE_PROJECTIONS = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
# one expert's projections, named after `experts.{e}.` -> (our stacked parameter, the part it fills)
EXPERT_PROJECTIONS = {"gate_proj": ("w13", "gate"), "up_proj": ("w13", "up"), "down_proj": ("w2", "down")}
# every expert's projections stacked (transformers 5's layout), named after `experts.` -> our parameter
STACKED_EXPERT_PROJECTIONS = {"gate_up_proj": "w13", "down_proj": "w2"}


@dataclass(frozen=True)
class CheckpointNames:
    """How a family's checkpoints name their tensors, against the decoder's parameters (the weight loader
    reads these from the model)."""

    # a checkpoint name's prefix -> ours; None: tensors under it are not loaded (an image-text checkpoint's vision
    # tower)
    prefixes: Mapping[str, str | None] = field(default_factory=dict)
    renames: Mapping[str, str] = field(default_factory=dict)  # a part of a checkpoint name -> ours, wherever it occurs
    # the separate projections that fill our fused ones (empty where the checkpoint stores them fused: Phi-3)
    packed_modules: Mapping[str, tuple[str, str | int]] = field(default_factory=SEPARATE_PROJECTIONS.copy)
    expert_weights: Mapping[str, tuple[str, str]] = field(default_factory=EXPERT_PROJECTIONS.copy)
    stacked_expert_weights: Mapping[str, str] = field(default_factory=STACKED_EXPERT_PROJECTIONS.copy)
    # stacked experts stored inputs first, [experts, in, out], with gate and up interleaved column by column
    # (gpt-oss), rather than as transformers' other classes hold them ([experts, out, in], gate rows then up)
    experts_inputs_first: bool = False


@dataclass(frozen=True)
class FamilySpec:
    """A model family: its config defaults and the traits it fixes whatever its config says."""

    defaults: HFDefaults
    activation_key: str = "hidden_act"  # the config field that names the MLP's activation
    # a bias on q, k and v always and none on o_proj (Qwen2); otherwise attention_bias puts one on all four
    bias_on_qkv_only: bool = False
    qk_norm: bool = False  # RMSNorm on each q and k head before rotary
    norm_unit_offset: bool = False  # RMSNorm scales by 1 + weight, in fp32 (Gemma)
    sandwich_norms: bool = False  # RMSNorm also on the attention's and the MLP's outputs (Gemma 2 and 3)
    scaled_embeddings: bool = False  # token embeddings are multiplied by sqrt(hidden_size) (Gemma)
    sliding_layers: SlidingLayers = SlidingLayers.NONE
    # the rotary base of the sliding layers, which are then unscaled (the config's rope_local_base_freq overrides
    # it); None: they rotate as the full-attention layers do
    sliding_rope_theta: float | None = None
    rope_type_aliases: Mapping[str, str] = field(default_factory=dict)  # a rope type's other names -> its name
    experts: ExpertDefaults | None = None  # None: a dense family, whose config is read for no expert field
    # None: every layer attends, and the config is read for no linear-attention field
    linear_attention: LinearAttentionDefaults | None = None
    # q_proj also gives each head a gate: the attention's output times sigmoid(gate) goes to o_proj (Qwen3.5)
    attn_output_gate: bool = False
    attention_sinks: bool = False  # a learned logit per head joins each row's softmax sum (gpt-oss's `sinks`)
    language_model_in_text_config: bool = False  # the settings are in the config's text_config (image-text models)
    # the checkpoints may hold multi-token-prediction layers (mtp.*, as many as the config's mtp_num_hidden_layers):
    # a gated full-attention decoder layer that drafts the token after next (`models/mtp.py`)
    multi_token_prediction: bool = False
    # Gemma 4's decoder (`gemma4_decoder`, its traits read by `gemma4_layers`): two attention shapes, K/V shared
    # by the last layers, per-layer input embeddings, experts beside the dense MLP
    gemma4_layers: bool = False
    checkpoint: CheckpointNames = field(default_factory=CheckpointNames)
