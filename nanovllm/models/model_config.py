"""What a model is: the one place a Hugging Face config is read.

`ModelConfig.from_hf(hf_config)` names every field a model, its layers or the
engine read, each with its family's default where the config leaves it out
(those of transformers' own config classes, which the family's `FamilySpec`
declares beside its fixed traits), and refuses at load time what the engine
cannot honour. Everything after it (models, layers, the runner, the
scheduler) reads a `ModelConfig`, never the Hugging Face config.

This module imports neither torch nor transformers.
"""

from dataclasses import dataclass, field

from nanovllm.cache.specs import CacheSpec, FullAttention, RecurrentState, SharedKV, SlidingWindow
from nanovllm.models.families import family_of, supported_architecture
from nanovllm.models.family_spec import (
    CheckpointNames,
    ExpertDefaults,
    FamilySpec,
    HFDefaults,
    LinearAttentionDefaults,
    SlidingLayers,
)
from nanovllm.models.gemma4_layers import (
    Gemma4Layers,
    expert_fields,
    layer_shapes,
    read_gemma4_layers,
    with_global_fields,
)
from nanovllm.models.quantization_config import Fp8Weights, Mxfp4Experts, read_quantization

_SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
_LAYER_TYPES = ("full_attention", "sliding_attention")
_HYBRID_LAYER_TYPES = ("linear_attention", "full_attention")
# transformers' older names of the layer types of hybrid models -> theirs now
_LEGACY_LAYER_TYPES = {"linear": "linear_attention", "mamba": "linear_attention", "attention": "full_attention"}
# the Gated DeltaNet layers' sizes, config fields of ModelConfig's names
_LINEAR_ATTENTION_SIZES = (
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
)
_SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "proportional")
# the keys each rope type needs besides rope_theta (and original_max_position_embeddings, which defaults)
_ROPE_KEYS = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
    "yarn": ("factor",),
    "longrope": ("short_factor", "long_factor"),
    "proportional": (),
}
# the types that stretch a model trained at original_max_position_embeddings
_EXTENDED_CONTEXT_TYPES = ("llama3", "yarn", "longrope")
# Mixture-of-experts settings of other families that the router here (softmax, top-k, no shared expert but in
# a family whose spec declares one) does not honour: config field -> the values that change nothing
_UNSUPPORTED_MOE_SETTINGS = {
    "shared_expert_intermediate_size": (0,),  # Qwen2-MoE, Qwen3-Next: an expert every token runs through
    "n_shared_experts": (0,),  # DeepSeek
    "num_shared_experts": (0,),
    "scoring_func": ("softmax",),  # DeepSeek-V3 scores experts with a sigmoid
    "topk_method": ("greedy",),  # DeepSeek's group-limited choices
    "n_group": (1,),
    "routed_scaling_factor": (1.0,),
}


@dataclass(frozen=True)
class ModelConfig:
    """A checkpoint's architecture as the engine builds it (whole-model sizes, before any tensor-parallel split)."""

    architecture: str  # the entry of `architectures` that picks the family
    architectures: tuple[str, ...]
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rotary_dim: int  # the leading dims of each head that rotary turns (partial_rotary_factor); the others pass through
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    # at least rope_type (one of _SUPPORTED_ROPE_TYPES) and rope_theta, and the keys the type needs
    rope_parameters: dict = field(hash=False)
    sliding_rope_parameters: dict = field(hash=False)  # the same for the sliding layers
    qkv_bias: bool  # a bias on the q, k and v projections
    o_proj_bias: bool  # a bias on the attention's output projection
    mlp_bias: bool
    hidden_act: str
    tie_word_embeddings: bool
    qk_norm: bool  # RMSNorm on each q and k head before rotary (Qwen3, Gemma 3)
    sliding_window: int | None  # the sliding layers attend over at most this many tokens (None: no layer slides)
    # per layer, "sliding_attention" (over sliding_window tokens), "full_attention" (the whole sequence) or
    # "linear_attention" (a Gated DeltaNet: a recurrent state in place of K/V)
    layer_types: tuple[str, ...]
    layer_specs: tuple[CacheSpec, ...]  # per layer, the cache it needs (with the model's KV heads, not one rank's)
    attention_scale: float  # multiplies q.k: query_pre_attn_scalar ** -0.5 (head_dim ** -0.5 but for Gemma 2)
    attn_logit_softcapping: float | None  # each attention score s becomes c * tanh(s / c) (None: uncapped)
    final_logit_softcapping: float | None  # each logit likewise
    norm_unit_offset: bool  # RMSNorm scales by 1 + weight, in fp32 (Gemma)
    sandwich_norms: bool  # RMSNorm also on the attention's and the MLP's outputs (Gemma 2)
    embed_scale: float | None  # token embeddings are multiplied by it, in the model's dtype (Gemma: sqrt(hidden))
    num_experts: int  # experts per mixture-of-experts layer (0: a dense model)
    num_experts_per_tok: int  # the top-k experts each token runs through
    moe_intermediate_size: int  # each expert's MLP width
    norm_topk_prob: bool  # the chosen experts' weights are renormalised to sum to 1
    # the layers whose MLP is a mixture of experts; the others' is dense (Gemma 4's experts sit beside every
    # layer's dense MLP, and this is empty)
    moe_layers: tuple[int, ...]
    # the width of the shared expert beside each layer's routed ones, scaled by sigmoid(shared_expert_gate) (0: none)
    shared_expert_intermediate_size: int
    attn_output_gate: bool  # q_proj also gives each head a gate: attention's output times sigmoid(gate) (Qwen3.5)
    attention_sinks: bool  # a learned logit per head joins each row's softmax sum (gpt-oss)
    expert_bias: bool  # the router and every expert's projections add a bias (gpt-oss)
    expert_act: str  # the experts' gated activation (hidden_act but where the family fixes its own; "" if dense)
    # the Gated DeltaNet layers' sizes (0 where no layer is "linear_attention"): value head h reads key head
    # h * linear_num_key_heads // linear_num_value_heads; the convolution spans linear_conv_kernel_dim tokens
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    # the multi-token-prediction layers the config declares (mtp_num_hidden_layers; 1 where a family with them
    # leaves it out, as Qwen3-Next's configs may); 0 for a family without them
    mtp_num_hidden_layers: int
    dtype: str | None  # the checkpoint's dtype as torch names it ("bfloat16"), None if unsaid
    weight_quantization: Fp8Weights | None  # how an FP8 checkpoint stores its linear weights (None: unquantized)
    expert_quantization: Mxfp4Experts | None  # how an MXFP4 checkpoint stores its experts (None: unquantized)
    eos_token_id: int | tuple[int, ...] | None
    checkpoint_names: CheckpointNames = field(hash=False)  # how the family's checkpoints name their tensors
    # the model builds and loads its multi-token-prediction layer (`models/mtp.py`), whose K/V one more
    # full-attention layer keeps (`cache_specs`): set for speculative method "mtp" only
    with_mtp: bool = False
    # Gemma 4's traits (`gemma4_layers`): two attention shapes, K/V shared by the last layers, per-layer input
    # embeddings, experts beside the MLP; None for every other family
    gemma4: Gemma4Layers | None = None

    @property
    def cache_specs(self) -> tuple[CacheSpec, ...]:
        """The cache each paged or recurrent layer needs: the decoder layers' (`layer_specs`), then with the
        multi-token-prediction layer its full attention's."""
        if not self.with_mtp:
            return self.layer_specs
        return (*self.layer_specs, FullAttention(self.num_key_value_heads, self.head_dim))

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of decoder layer `layer` (None: it attends over the whole sequence); a layer that
        reads another's K/V has that layer's."""
        spec = self.layer_specs[layer]
        if isinstance(spec, SharedKV):
            spec = self.layer_specs[spec.source_layer]
        return spec.window if isinstance(spec, SlidingWindow) else None

    def rope_parameters_of(self, layer_type: str) -> dict:
        """The rope settings of the layers of `layer_type` (one of layer_types)."""
        return self.sliding_rope_parameters if layer_type == "sliding_attention" else self.rope_parameters

    @classmethod
    def from_hf(cls, hf_config) -> "ModelConfig":
        """The fields of `hf_config` (a transformers PretrainedConfig or anything with its attributes),
        with the family's defaults; ValueError for an architecture or a setting the engine cannot run."""
        architectures = tuple(_get(hf_config, "architectures", None) or ())
        architecture = supported_architecture(architectures)
        family = family_of(architecture)
        defaults = family.defaults
        if family.language_model_in_text_config:
            hf_config = _get(hf_config, "text_config", hf_config)
        if family.gemma4_layers:
            hf_config = with_global_fields(hf_config)

        def read(name: str):
            return _get(hf_config, name, getattr(defaults, name))

        hidden_size, num_heads = read("hidden_size"), read("num_attention_heads")
        head_dim = read("head_dim") or hidden_size // num_heads
        rotary_dim = _rotary_dim(hf_config, head_dim, defaults.partial_rotary_factor)
        activation_key = family.activation_key
        hidden_act = _get(hf_config, activation_key, defaults.hidden_act)
        if hidden_act not in _SUPPORTED_ACTIVATIONS:
            raise ValueError(
                f"{activation_key} {hidden_act!r} is not supported; supported: {', '.join(_SUPPORTED_ACTIVATIONS)}"
            )
        # "vision" (Gemma 4) lets image tokens see each other, which text alone never has
        if _get(hf_config, "use_bidirectional_attention", False) not in (False, "vision"):
            raise ValueError(
                "use_bidirectional_attention=True is not supported: a causal LM attends only to earlier "
                "tokens; use a checkpoint without it"
            )
        if _get(hf_config, "use_sliding_window", False):
            raise ValueError(
                "use_sliding_window=True is not supported: the windows it puts on the layers from "
                "max_window_layers on (Qwen2, Qwen3) are not read here; use a checkpoint without it"
            )
        quantization = read_quantization(_get(hf_config, "quantization_config", None))
        if isinstance(quantization, Mxfp4Experts):
            _check_mxfp4_experts(architecture, family)
        dtype = _get(hf_config, "dtype", None)
        eos = _get(hf_config, "eos_token_id", None)
        attention_bias = bool(read("attention_bias"))
        num_layers = read("num_hidden_layers")
        num_kv_heads = read("num_key_value_heads") or num_heads
        sliding_window, layer_types = _sliding_layers(hf_config, family, num_layers)
        linear = _linear_attention_fields(hf_config, family.linear_attention)
        if family.linear_attention is not None:
            layer_types = _hybrid_layer_types(hf_config, family.linear_attention, num_layers)
        max_position_embeddings = read("max_position_embeddings")
        rope, sliding_rope = _layer_rope_parameters(hf_config, family, max_position_embeddings, rotary_dim)
        intermediate_size = read("intermediate_size")
        gemma4, shapes = None, ((num_kv_heads, head_dim),) * num_layers
        experts = _moe_fields(hf_config, family.experts, intermediate_size, num_layers)
        expert_act = _expert_act(family.experts, hidden_act)
        if family.gemma4_layers:
            gemma4 = read_gemma4_layers(hf_config, layer_types, intermediate_size)
            shapes = layer_shapes(hf_config, layer_types, num_kv_heads, head_dim)
            experts = expert_fields(hf_config)
            expert_act = hidden_act if experts["num_experts"] else ""
        return cls(
            architecture=architecture,
            architectures=architectures,
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=head_dim,
            rotary_dim=rotary_dim,
            vocab_size=read("vocab_size"),
            max_position_embeddings=max_position_embeddings,
            rms_norm_eps=read("rms_norm_eps"),
            rope_parameters=rope,
            sliding_rope_parameters=sliding_rope,
            qkv_bias=attention_bias or family.bias_on_qkv_only,
            o_proj_bias=attention_bias and not family.bias_on_qkv_only,
            mlp_bias=bool(read("mlp_bias")),
            hidden_act=hidden_act,
            tie_word_embeddings=bool(read("tie_word_embeddings")),
            qk_norm=family.qk_norm,
            sliding_window=sliding_window,
            layer_types=layer_types,
            layer_specs=_layer_specs(
                layer_types, shapes, sliding_window, linear, gemma4.kv_sources if gemma4 else None
            ),
            attention_scale=_positive("query_pre_attn_scalar", read("query_pre_attn_scalar") or head_dim) ** -0.5,
            attn_logit_softcapping=_softcap(hf_config, "attn_logit_softcapping", defaults),
            final_logit_softcapping=_softcap(hf_config, "final_logit_softcapping", defaults),
            norm_unit_offset=family.norm_unit_offset,
            sandwich_norms=family.sandwich_norms,
            embed_scale=hidden_size**0.5 if family.scaled_embeddings else None,
            **experts,
            attn_output_gate=family.attn_output_gate,
            attention_sinks=family.attention_sinks,
            expert_bias=family.experts is not None and family.experts.biased,
            expert_act=expert_act,
            **linear,
            mtp_num_hidden_layers=_mtp_layers(hf_config, family),
            dtype=None if dtype is None else str(dtype).removeprefix("torch."),
            weight_quantization=quantization if isinstance(quantization, Fp8Weights) else None,
            expert_quantization=quantization if isinstance(quantization, Mxfp4Experts) else None,
            eos_token_id=tuple(eos) if isinstance(eos, (list, tuple)) else eos,
            checkpoint_names=family.checkpoint,
            gemma4=gemma4,
        )


def _mtp_layers(hf_config, family: FamilySpec) -> int:
    """The multi-token-prediction layers of a family that has them: the config's mtp_num_hidden_layers (or
    num_nextn_predict_layers), 1 where it names neither; 0 for any other family."""
    if not family.multi_token_prediction:
        return 0
    return _get(hf_config, "mtp_num_hidden_layers", _get(hf_config, "num_nextn_predict_layers", 1))


def _get(hf_config, name: str, default):
    """`hf_config.name`, or `default` where it is missing or None (transformers keeps unset fields as None)."""
    value = getattr(hf_config, name, None)
    return default if value is None else value


def _positive(name: str, value):
    """`value` (read from the config's `name`), or a ValueError unless it is a positive number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value!r} in the model's config")
    return value


def _softcap(hf_config, name: str, defaults: HFDefaults) -> float | None:
    """The soft-cap `name` of the config, None where the family has none or the config says null."""
    default = getattr(defaults, name)
    if default is None:
        return None
    # a config that says null caps nothing: only one that leaves the field out takes the default
    value = getattr(hf_config, name, default)
    return None if value is None else float(_positive(name, value))


def _check_mxfp4_experts(architecture: str, family: FamilySpec) -> None:
    """ValueError unless the family's checkpoints store MXFP4 experts as the loader reads them: stacked, their
    values and scales in `_blocks` and `_scales` tensors (gpt-oss)."""
    if "gate_up_proj_blocks" not in family.checkpoint.stacked_expert_weights:
        raise ValueError(
            f"MXFP4 checkpoints (quant_method 'mxfp4') load for gpt-oss only, whose experts are stored in "
            f"blocks and scales; {architecture} is not: use a full-precision checkpoint of it"
        )


def _expert_act(experts: ExpertDefaults | None, hidden_act: str) -> str:
    """The experts' gated activation: the family's own where it fixes one, else hidden_act ("" for a dense
    family)."""
    if experts is None:
        return ""
    return experts.activation or hidden_act


def _moe_fields(hf_config, experts: ExpertDefaults | None, intermediate_size: int, num_layers: int) -> dict:
    """The mixture-of-experts fields of ModelConfig: none for a dense family (`experts` None); for the others
    the config's, with the layers that have experts chosen as transformers chooses them (every
    decoder_sparse_step-th, but those in mlp_only_layers). ValueError for a setting the router here does not
    honour."""
    if experts is None:
        return dict(
            num_experts=0,
            num_experts_per_tok=0,
            moe_intermediate_size=0,
            norm_topk_prob=False,
            moe_layers=(),
            shared_expert_intermediate_size=0,
        )

    def read(name: str):
        return _get(hf_config, name, getattr(experts, name))

    def read_layout(name: str):
        return read(name) if experts.config_sets_layout else getattr(experts, name)

    shared = 0
    if experts.shared_expert_intermediate_size is not None:  # a family whose layers have a shared expert
        shared = _whole("shared_expert_intermediate_size", read("shared_expert_intermediate_size"))
    for name, honoured in _UNSUPPORTED_MOE_SETTINGS.items():
        if name == "shared_expert_intermediate_size" and shared:
            continue
        value = _get(hf_config, name, honoured[0])
        if value not in honoured:
            raise ValueError(
                f"{name}={value!r} is not supported: experts are chosen by a softmax over the router's "
                f"logits and its top-k, with no shared expert; use a checkpoint without it"
            )
    # Qwen3-MoE's configs name it num_experts, Mixtral's (and what transformers 5 writes for both) num_local_experts
    num_experts = _whole("num_experts", _get(hf_config, "num_experts", None) or read("num_local_experts"))
    top_k = _whole("num_experts_per_tok", read("num_experts_per_tok"))
    if top_k > num_experts:
        raise ValueError(f"num_experts_per_tok ({top_k}) must be at most the number of experts ({num_experts})")
    step = _whole("decoder_sparse_step", read_layout("decoder_sparse_step"))
    dense = set(read_layout("mlp_only_layers"))
    return dict(
        num_experts=num_experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=_whole("moe_intermediate_size", read("moe_intermediate_size") or intermediate_size),
        norm_topk_prob=bool(read_layout("norm_topk_prob")),
        moe_layers=tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0),
        shared_expert_intermediate_size=shared,
    )


def _whole(name: str, value) -> int:
    """`value` (read from the config's `name`), or a ValueError unless it is a positive whole number."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive whole number, got {value!r} in the model's config")
    return value


def _sliding_layers(hf_config, family: FamilySpec, num_layers: int) -> tuple[int | None, tuple[str, ...]]:
    """The sliding window and each layer's type (as `family.sliding_layers` says); every layer is full
    attention where the family or the config has no window."""
    full = ("full_attention",) * num_layers
    if family.sliding_layers is SlidingLayers.NONE:
        return None, full
    # a config that says null has no window: only one that leaves the field out takes the default
    window = getattr(hf_config, "sliding_window", family.defaults.sliding_window)
    if window is None:
        return None, full
    window = _positive("sliding_window", window)
    if not isinstance(window, int):
        raise ValueError(f"sliding_window must be a whole number of tokens, got {window!r} in the model's config")
    if family.sliding_layers is SlidingLayers.ALL:
        return window, ("sliding_attention",) * num_layers
    pattern = _get(hf_config, "sliding_window_pattern", family.defaults.sliding_window_pattern)
    layer_types = _get(hf_config, "layer_types", None) or [
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)
    ]
    unknown = sorted(set(layer_types) - set(_LAYER_TYPES))
    if unknown or len(layer_types) != num_layers:
        raise ValueError(
            f"layer_types must name {num_layers} layers (num_hidden_layers), each one of "
            f"{', '.join(_LAYER_TYPES)}; got {list(layer_types)}"
        )
    return window, tuple(layer_types)


def _layer_specs(
    layer_types: tuple[str, ...],
    shapes: tuple[tuple[int, int], ...],
    window: int | None,
    linear: dict,
    kv_sources: tuple[int | None, ...] | None = None,
) -> tuple[CacheSpec, ...]:
    """The cache each layer needs: paged K/V (of its (KV heads, head_dim) in `shapes`) over its window for a
    sliding layer, over every token for a full-attention one, a Gated DeltaNet's states
    (`_gated_delta_net_state`, of the sizes in `linear`) for a linear-attention one, and none for a layer
    that reads another's K/V (`kv_sources`, Gemma 4)."""

    def spec(layer: int, layer_type: str) -> CacheSpec:
        if kv_sources is not None and kv_sources[layer] is not None:
            return SharedKV(kv_sources[layer])
        if layer_type == "sliding_attention":
            return SlidingWindow(*shapes[layer], window)
        if layer_type == "linear_attention":
            return _gated_delta_net_state(**linear)
        return FullAttention(*shapes[layer])

    return tuple(spec(layer, layer_type) for layer, layer_type in enumerate(layer_types))


def _gated_delta_net_state(
    linear_num_key_heads: int,
    linear_num_value_heads: int,
    linear_key_head_dim: int,
    linear_value_head_dim: int,
    linear_conv_kernel_dim: int,
) -> RecurrentState:
    """A Gated DeltaNet layer's states: the last kernel - 1 inputs of its convolution over q, k and v
    ([channels, kernel - 1], in the model's dtype), and the recurrent state of each value head ([value heads,
    key_head_dim, value_head_dim], in float32). Both split across ranks by their first dimension: a rank
    holds its own heads' channels, q, k and v (`layers/gated_delta_net.py`)."""
    channels = 2 * linear_num_key_heads * linear_key_head_dim + linear_num_value_heads * linear_value_head_dim
    return RecurrentState(
        shapes=(
            (channels, linear_conv_kernel_dim - 1),
            (linear_num_value_heads, linear_key_head_dim, linear_value_head_dim),
        ),
        dtypes=(None, "float32"),
    )


def _linear_attention_fields(hf_config, defaults: LinearAttentionDefaults | None) -> dict:
    """The Gated DeltaNet sizes of ModelConfig: zeros for a family without linear attention (`defaults`
    None), else the config's with the family's defaults. ValueError for sizes the layer cannot run."""
    if defaults is None:
        return dict.fromkeys(_LINEAR_ATTENTION_SIZES, 0)
    fields = {name: _whole(name, _get(hf_config, name, getattr(defaults, name))) for name in _LINEAR_ATTENTION_SIZES}
    if fields["linear_num_value_heads"] % fields["linear_num_key_heads"]:
        raise ValueError(
            f"linear_num_value_heads ({fields['linear_num_value_heads']}) must be a multiple of "
            f"linear_num_key_heads ({fields['linear_num_key_heads']}): value heads share key heads in equal groups"
        )
    if fields["linear_conv_kernel_dim"] < 2:
        raise ValueError(
            f"linear_conv_kernel_dim must be at least 2 (a convolution over earlier tokens), got "
            f"{fields['linear_conv_kernel_dim']}"
        )
    return fields


def _hybrid_layer_types(hf_config, defaults: LinearAttentionDefaults, num_layers: int) -> tuple[str, ...]:
    """Each layer's type in a family of Gated DeltaNet and full-attention layers: the config's layer_types
    (under transformers' current names), else every full_attention_interval-th layer attends."""
    interval = _whole(
        "full_attention_interval", _get(hf_config, "full_attention_interval", defaults.full_attention_interval)
    )
    layer_types = _get(hf_config, "layer_types", None) or [
        "linear_attention" if (i + 1) % interval else "full_attention" for i in range(num_layers)
    ]
    layer_types = tuple(_LEGACY_LAYER_TYPES.get(t, t) for t in layer_types)
    unknown = sorted(set(layer_types) - set(_HYBRID_LAYER_TYPES))
    if unknown or len(layer_types) != num_layers:
        problem = (
            f"{', '.join(unknown)} {'is not a layer type' if len(unknown) == 1 else 'are not layer types'} of "
            f"this hybrid decoder"
            if unknown
            else f"it names {len(layer_types)}"
        )
        raise ValueError(
            f"layer_types must name {num_layers} layers (num_hidden_layers), each one of linear_attention "
            f"(Gated DeltaNet) or full_attention; got {list(layer_types)}: {problem}"
        )
    return layer_types


def _given_rope_parameters(hf_config) -> dict:
    """A copy of the config's rope dict: rope_parameters (transformers 5) or rope_scaling (older configs)."""
    return dict(_get(hf_config, "rope_parameters", None) or _get(hf_config, "rope_scaling", None) or {})


def _rotary_dim(hf_config, head_dim: int, default_factor: float) -> int:
    """The leading dimensions of each head that rotary turns, int(head_dim * partial_rotary_factor), the factor
    read where transformers 5 reads it: from the rope dict, else from the config's top level, else the family's
    `default_factor`."""
    factor = _given_rope_parameters(hf_config).get("partial_rotary_factor")
    factor = _get(hf_config, "partial_rotary_factor", default_factor) if factor is None else factor
    rotary_dim = int(head_dim * factor)
    if not 0 < factor <= 1 or rotary_dim % 2:
        raise ValueError(
            f"partial_rotary_factor {factor} turns {rotary_dim} of the {head_dim} dimensions of a head; it must "
            f"be above 0 and at most 1 and turn an even number of them"
        )
    return rotary_dim


def _layer_rope_parameters(
    hf_config, family: FamilySpec, max_position_embeddings: int, rotary_dim: int
) -> tuple[dict, dict]:
    """The rope settings of the full-attention layers and of the sliding ones: one dict per layer type where
    the config gives them so (transformers 5's Gemma 3), else the config's for the full layers and, for the
    sliding ones, the same unless the family rotates them at a base of its own (sliding_rope_theta)."""
    given = _given_rope_parameters(hf_config)
    if given and set(given) <= set(_LAYER_TYPES):
        full = dict(given.get("full_attention") or {})
        sliding = dict(given.get("sliding_attention") or full)
        return tuple(
            _rope_parameters(hf_config, family, max_position_embeddings, rotary_dim, params)
            for params in (full, sliding)
        )
    full = _rope_parameters(hf_config, family, max_position_embeddings, rotary_dim, given)
    if family.sliding_rope_theta is None:
        return full, full
    local = {
        "rope_type": "default",
        "rope_theta": _get(hf_config, "rope_local_base_freq", family.sliding_rope_theta),
    }
    return full, _rope_parameters(hf_config, family, max_position_embeddings, rotary_dim, local)


def _rope_parameters(
    hf_config, family: FamilySpec, max_position_embeddings: int, rotary_dim: int, params: dict
) -> dict:
    """The rope settings `params` (a copy of a rope dict of the config) as one dict with at least `rope_type`
    and `rope_theta`, the latter from the config's top level where the dict leaves it out, and the keys
    the type needs, those the config may leave out filled in as transformers fills them. The partial
    rotary factor is read apart (`_rotary_dim`), but for the "proportional" type, which keeps it."""
    params.setdefault("rope_theta", _get(hf_config, "rope_theta", family.defaults.rope_theta))
    rope_type = params.get("rope_type", params.get("type", "default"))
    params["rope_type"] = family.rope_type_aliases.get(rope_type, rope_type)
    factor = params.pop("partial_rotary_factor", None)
    if params["rope_type"] == "proportional":
        # the share of the head's dimension pairs that turn, which this type reads itself (over the whole head)
        params["partial_rotary_factor"] = 1.0 if factor is None else factor
    if params["rope_type"] not in _SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_type {params['rope_type']!r} is not supported; supported: {', '.join(_SUPPORTED_ROPE_TYPES)}"
        )
    if params["rope_type"] in _EXTENDED_CONTEXT_TYPES:
        params["original_max_position_embeddings"] = _original_context(
            hf_config, params, family.defaults, max_position_embeddings
        )
    missing = [k for k in _ROPE_KEYS[params["rope_type"]] if params.get(k) is None]
    if missing:
        raise ValueError(
            f"rope_type {params['rope_type']!r} needs {', '.join(missing)} in the config's rope parameters"
        )
    if params["rope_type"] == "longrope":
        _complete_longrope(params, max_position_embeddings, rotary_dim)
    return params


def _original_context(hf_config, params: dict, defaults: HFDefaults, max_position_embeddings: int) -> int:
    """The context a scaled rotary extends, where transformers 5 finds it: the config's top-level
    original_max_position_embeddings (Phi-3's class has one, 4096 unless given), else the rope dict's,
    else max_position_embeddings."""
    top_level = _get(hf_config, "original_max_position_embeddings", defaults.original_max_position_embeddings)
    return top_level or params.get("original_max_position_embeddings") or max_position_embeddings


def _complete_longrope(params: dict, max_position_embeddings: int, rotary_dim: int) -> None:
    """Check LongRoPE's factor lists (one value per rotated frequency) and fill in its `factor`, the model's
    context over the original one unless the config gives it (its attention factor derives from it)."""
    for key in ("short_factor", "long_factor"):
        if len(params[key]) != rotary_dim // 2:
            raise ValueError(
                f"rope_type 'longrope' needs one {key} value per rotated frequency, {rotary_dim // 2} "
                f"({rotary_dim} dimensions of each head turn); the config gives {len(params[key])}"
            )
    if params.get("factor") is None:
        params["factor"] = max_position_embeddings / params["original_max_position_embeddings"]
