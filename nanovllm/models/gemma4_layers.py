"""What Gemma 4's decoder has beyond the options of `blocks`, read from its config once.

Gemma 4 (transformers' Gemma4TextConfig) mixes two attention shapes: sliding
layers of head_dim and num_key_value_heads, and full-attention ones of
global_head_dim with, where attention_k_eq_v is set, num_global_key_value_heads
and V taken from the K projection. transformers resolves these into its
`per_layer_config` (a view, or `{"5": {...}}` in a saved config.json); a config
read from the original config.json names global_head_dim and
num_global_key_value_heads instead. The last num_kv_shared_layers layers keep no
K/V of their own and attend over those of the last earlier layer of their type
(their MLP twice as wide where use_double_wide_mlp is set). Per-layer input
embeddings (hidden_size_per_layer_input wide) feed each layer's residual, and
with enable_moe_block each layer runs experts beside its dense MLP (ModelConfig's
expert fields, `expert_fields`).

This module imports neither torch nor transformers.
"""

import copy
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Gemma4Layers:
    """Gemma 4's traits of a model, per layer where they differ by layer."""

    attention_k_eq_v: bool  # the full-attention layers have no v_proj: V is the K projection's output
    # per layer, the earlier layer whose K/V it attends over (None: it computes and keeps its own)
    kv_sources: tuple[int | None, ...]
    mlp_sizes: tuple[int, ...]  # per layer, the dense MLP's width
    hidden_size_per_layer_input: int  # each layer's slice of the per-layer input embeddings (0: none)
    vocab_size_per_layer_input: int


def with_global_fields(hf_config):
    """`hf_config`, or a copy of it that gives its global head_dim and num_key_value_heads (the sliding
    layers') where transformers would refuse them as fields that vary by layer; the per-layer values are
    read apart (`layer_shapes`)."""
    if getattr(hf_config, "per_layer_config", None) is None or not hasattr(
        hf_config, "allow_global_per_layer_attribute_access"
    ):
        return hf_config
    view = copy.copy(hf_config)
    view.allow_global_per_layer_attribute_access = True
    return view


def _get(hf_config, name: str, default):
    value = getattr(hf_config, name, None)
    return default if value is None else value


def read_gemma4_layers(hf_config, layer_types: tuple[str, ...], intermediate_size: int) -> Gemma4Layers:
    """Gemma 4's traits of `hf_config` (its text config); ValueError for a setting the engine cannot run."""
    num_layers = len(layer_types)
    kv_sources = _kv_sources(layer_types, _get(hf_config, "num_kv_shared_layers", 0))
    double = bool(_get(hf_config, "use_double_wide_mlp", False))
    mlp_sizes = tuple(intermediate_size * (2 if double and source is not None else 1) for source in kv_sources)
    per_layer = _get(hf_config, "hidden_size_per_layer_input", 0)
    assert len(mlp_sizes) == num_layers
    return Gemma4Layers(
        attention_k_eq_v=bool(_get(hf_config, "attention_k_eq_v", False)),
        kv_sources=kv_sources,
        mlp_sizes=mlp_sizes,
        hidden_size_per_layer_input=per_layer,
        vocab_size_per_layer_input=_get(hf_config, "vocab_size_per_layer_input", 0) if per_layer else 0,
    )


def expert_fields(hf_config) -> dict:
    """The mixture-of-experts fields of ModelConfig for Gemma 4: with enable_moe_block, num_experts experts of
    moe_intermediate_size beside every layer's dense MLP (so that no layer's MLP is replaced: `moe_layers`
    empty), top_k_experts a token, their weights renormalised; none without. ValueError for a missing size."""
    fields = dict(
        num_experts=0,
        num_experts_per_tok=0,
        moe_intermediate_size=0,
        norm_topk_prob=False,
        moe_layers=(),
        shared_expert_intermediate_size=0,
    )
    if not _get(hf_config, "enable_moe_block", False):
        return fields
    sizes = {name: _get(hf_config, name, None) for name in ("num_experts", "top_k_experts", "moe_intermediate_size")}
    unset = [
        name for name, value in sizes.items() if isinstance(value, bool) or not isinstance(value, int) or value <= 0
    ]
    if unset:
        raise ValueError(f"enable_moe_block needs {', '.join(unset)} (positive whole numbers) in the config")
    if sizes["top_k_experts"] > sizes["num_experts"]:
        raise ValueError(
            f"top_k_experts ({sizes['top_k_experts']}) must be at most num_experts ({sizes['num_experts']})"
        )
    return dict(
        fields,
        num_experts=sizes["num_experts"],
        num_experts_per_tok=sizes["top_k_experts"],
        moe_intermediate_size=sizes["moe_intermediate_size"],
        norm_topk_prob=True,
    )


def _kv_sources(layer_types: tuple[str, ...], num_shared: int) -> tuple[int | None, ...]:
    """Per layer, the layer whose K/V it reads: for each of the last `num_shared` layers, the last layer of
    its type before them; None for the others. ValueError where a shared layer's type has no such layer."""
    first_shared = len(layer_types) - num_shared
    if not 0 <= num_shared < len(layer_types):
        raise ValueError(
            f"num_kv_shared_layers ({num_shared}) must be at least 0 and below num_hidden_layers ({len(layer_types)})"
        )
    last_of_type = {layer_type: i for i, layer_type in enumerate(layer_types[:first_shared])}
    sources: list[int | None] = [None] * first_shared
    for layer_type in layer_types[first_shared:]:
        if layer_type not in last_of_type:
            raise ValueError(
                f"a KV-shared {layer_type} layer needs a {layer_type} layer before the last {num_shared} layers "
                f"(num_kv_shared_layers) to read its K/V from"
            )
        sources.append(last_of_type[layer_type])
    return tuple(sources)


def layer_shapes(
    hf_config, layer_types: tuple[str, ...], num_kv_heads: int, head_dim: int
) -> tuple[tuple[int, int], ...]:
    """Per layer, (KV heads, head_dim): transformers' per_layer_config where the config has one, else the
    full-attention layers' global_head_dim (512 unless given) and, with attention_k_eq_v,
    num_global_key_value_heads."""
    per_layer = getattr(hf_config, "per_layer_config", None)
    if per_layer is not None:
        return tuple(_override(per_layer, i, num_kv_heads, head_dim) for i in range(len(layer_types)))
    k_eq_v = bool(_get(hf_config, "attention_k_eq_v", False))
    global_heads = (_get(hf_config, "num_global_key_value_heads", None) if k_eq_v else None) or num_kv_heads
    global_shape = (global_heads, _get(hf_config, "global_head_dim", 512))
    return tuple(global_shape if t == "full_attention" else (num_kv_heads, head_dim) for t in layer_types)


def _override(per_layer, layer: int, num_kv_heads: int, head_dim: int) -> tuple[int, int]:
    """Layer `layer`'s (KV heads, head_dim) in a per_layer_config: a saved config.json's dict of overrides by
    layer, or transformers' view, which gives every layer's values."""
    if isinstance(per_layer, Mapping):
        entry = per_layer.get(str(layer), per_layer.get(layer, {}))
        return entry.get("num_key_value_heads") or num_kv_heads, entry.get("head_dim") or head_dim
    entry = per_layer[layer]
    return _get(entry, "num_key_value_heads", num_kv_heads), _get(entry, "head_dim", head_dim)
