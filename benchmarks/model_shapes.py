"""The model shapes the GPU benchmarks run with dummy weights: each shape's config.json, and what one decode
step of it reads from memory (every weight once, the input embedding table only at the step's tokens, and
each sequence's KV cache within each layer's window).

Qwen3-0.6B ("0.6b") and Qwen3-8B ("8b"), and one model of each other family
the engine loads, at the size people run: Qwen2.5-7B, Mistral-7B (v0.3: no
sliding window), Gemma-2-9B (every other layer over a 4,096-token window,
soft-capped attention and logits), Gemma-3-4B (five 1,024-token sliding layers
to one global), Phi-4-mini (partial rotary, LongRoPE), Qwen3-30B-A3B (128 experts, 8 per
token, on every layer), and the hybrids of three Gated DeltaNet layers to one gated full-attention layer:
Qwen3.5-9B, Qwen3.6-27B (also as its FP8 checkpoint: 128 x 128 blocks) and Qwen3.6-35B-A3B (256 experts, 8
per token, and a shared expert); and gpt-oss-20b (32 biased experts, 4 per token, sliding and full layers
in turn, attention sinks) in bf16 and, as published, with MXFP4 experts ("-mxfp4"), and gpt-oss-120b (36
layers, 128 experts) with MXFP4 experts; and Gemma 4 (`_gemma4_bytes` counts it layer by layer): E4B (KV-shared
last layers, per-layer inputs), 26B-A4B (experts beside each dense MLP) and 31B (global layers of 4 KV heads
of 512, V from K's projection). The values are
those of the published config.json files (of the hybrids, their text_config); LongRoPE's factor lists are
placeholders of the right length, which change no speed.

A Gated DeltaNet layer keeps no KV: each sequence's state (its convolution's last inputs in bf16, and
value heads x key_head_dim x value_head_dim in fp32) is read and written once per step, whatever the context.
"""

from dataclasses import dataclass

VOCAB_SIZE = 151936  # Qwen3's


def _qwen3(**shape) -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "hidden_act": "silu",
        "attention_bias": False,
        **shape,
    }


def _qwen3_5(**shape) -> dict:
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "vocab_size": 248320,
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25},
        "hidden_act": "silu",
        "attention_bias": False,
        "attn_output_gate": True,
        "head_dim": 256,
        "full_attention_interval": 4,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "mamba_ssm_dtype": "float32",
        "tie_word_embeddings": False,
        **shape,
    }


def _gemma4(num_hidden_layers: int, **shape) -> dict:
    """Gemma 4's text config: five sliding layers of head_dim 256 to one global of global_head_dim 512
    (proportional rotary over a quarter of its pairs), logits soft-capped at 30."""
    return {
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "vocab_size": 262144,
        "num_hidden_layers": num_hidden_layers,
        "layer_types": [
            "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(num_hidden_layers)
        ],
        "head_dim": 256,
        "global_head_dim": 512,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        "hidden_activation": "gelu_pytorch_tanh",
        "final_logit_softcapping": 30.0,
        "tie_word_embeddings": True,
        "use_bidirectional_attention": "vision",
        "attention_k_eq_v": False,
        "num_kv_shared_layers": 0,
        "hidden_size_per_layer_input": 0,
        "use_double_wide_mlp": False,
        "enable_moe_block": False,
        **shape,
    }


def _gpt_oss(num_hidden_layers: int, **shape) -> dict:
    return {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "vocab_size": 201088,
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 4096,
        },
        "hidden_act": "silu",
        "attention_bias": True,
        "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * (num_hidden_layers // 2),
        "num_experts_per_tok": 4,
        "swiglu_limit": 7.0,
        "tie_word_embeddings": False,
        **shape,
    }


_GPT_OSS_MXFP4 = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
}

_QWEN3_6_27B = dict(
    hidden_size=5120,
    intermediate_size=17408,
    num_hidden_layers=64,
    num_attention_heads=24,
    num_key_value_heads=4,
    linear_num_value_heads=48,
)

SHAPES = {
    "0.6b": _qwen3(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
    ),
    "8b": _qwen3(
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=False,
    ),
    "qwen2.5-7b": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": 152064,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
    },
    "mistral-7b": {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "vocab_size": 32768,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
    },
    "gemma-2-9b": {
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "vocab_size": 256000,
        "hidden_size": 3584,
        "intermediate_size": 14336,
        "num_hidden_layers": 42,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 256,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": True,
    },
    "gemma-3-4b": {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "vocab_size": 262208,
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "num_hidden_layers": 34,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "query_pre_attn_scalar": 256,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": True,
    },
    "phi-4-mini": {
        "architectures": ["Phi3ForCausalLM"],
        "model_type": "phi3",
        "vocab_size": 200064,
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 32,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "partial_rotary_factor": 0.75,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [4.0] * 48},
        "rms_norm_eps": 1e-5,
        "sliding_window": None,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
    },
    "qwen3-30b-a3b": _qwen3(
        architectures=["Qwen3MoeForCausalLM"],
        model_type="qwen3_moe",
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        num_experts=128,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        tie_word_embeddings=False,
    ),
    "qwen3.5-9b": _qwen3_5(
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=32,
        num_attention_heads=16,
        num_key_value_heads=4,
        linear_num_value_heads=32,
    ),
    "qwen3.6-27b": _qwen3_5(**_QWEN3_6_27B),
    # as the official FP8 checkpoint stores it: the decoder's projections in e4m3 with a scale per 128 x 128 block
    "qwen3.6-27b-fp8": _qwen3_5(
        **_QWEN3_6_27B,
        quantization_config={"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
    ),
    "qwen3.6-35b-a3b": _qwen3_5(
        architectures=["Qwen3_5MoeForCausalLM"],
        model_type="qwen3_5_moe_text",
        hidden_size=2048,
        num_hidden_layers=40,
        num_attention_heads=16,
        num_key_value_heads=2,
        linear_num_value_heads=32,
        num_experts=256,
        num_experts_per_tok=8,
        moe_intermediate_size=512,
        shared_expert_intermediate_size=512,
    ),
    # Gemma 4, the text config of google/gemma-4-E4B-it, -26B-A4B-it and -31B-it (their config.json's
    # text_config, as several public repositories quote it; the Hub itself was not reachable from here):
    # E4B's last 18 layers read earlier layers' K/V and every layer has a 256-wide per-layer input; 26B-A4B
    # and 31B's global layers have fewer KV heads and V from the K projection, 26B-A4B 128 experts of 704
    # (8 a token) beside each layer's dense MLP
    "gemma-4-e4b": _gemma4(
        num_hidden_layers=42,
        hidden_size=2560,
        intermediate_size=10240,
        num_attention_heads=8,
        num_key_value_heads=2,
        sliding_window=512,
        max_position_embeddings=131072,
        num_kv_shared_layers=18,
        hidden_size_per_layer_input=256,
        vocab_size_per_layer_input=262144,
    ),
    "gemma-4-26b-a4b": _gemma4(
        num_hidden_layers=30,
        hidden_size=2816,
        intermediate_size=2112,
        num_attention_heads=16,
        num_key_value_heads=8,
        num_global_key_value_heads=2,
        attention_k_eq_v=True,
        sliding_window=1024,
        max_position_embeddings=262144,
        enable_moe_block=True,
        num_experts=128,
        top_k_experts=8,
        moe_intermediate_size=704,
    ),
    "gemma-4-31b": _gemma4(
        num_hidden_layers=60,
        hidden_size=5376,
        intermediate_size=21504,
        num_attention_heads=32,
        num_key_value_heads=16,
        num_global_key_value_heads=4,
        attention_k_eq_v=True,
        sliding_window=1024,
        max_position_embeddings=262144,
    ),
    "gpt-oss-20b": _gpt_oss(num_hidden_layers=24, num_local_experts=32),
    # as the published checkpoints store them: the experts in MXFP4, every other weight bf16
    "gpt-oss-20b-mxfp4": _gpt_oss(num_hidden_layers=24, num_local_experts=32, quantization_config=_GPT_OSS_MXFP4),
    "gpt-oss-120b": _gpt_oss(num_hidden_layers=36, num_local_experts=128, quantization_config=_GPT_OSS_MXFP4),
}


def model_config(shape: str) -> dict:
    """config.json of a model of this shape, in bf16."""
    return {"torch_dtype": "bfloat16", "bos_token_id": 151643, "eos_token_id": 151645, **SHAPES[shape]}


@dataclass
class WeightRead:
    """The weight bytes a decode step reads: every dense weight once, and of each mixture-of-experts
    layer's experts those its sequences select, `num_experts_per_tok` each, spread evenly (as random
    weights route them): the expected number of distinct experts."""

    dense: int
    expert: int = 0  # bytes of one expert's gate, up and down, summed over the MoE layers
    num_experts: int = 0
    top_k: int = 0

    def bytes(self, num_seqs: int) -> int:
        """What a decode step of `num_seqs` sequences reads."""
        if not self.num_experts:
            return self.dense
        selected = self.num_experts * (1 - (1 - self.top_k / self.num_experts) ** num_seqs)
        return self.dense + round(selected * self.expert)


@dataclass
class KVRead:
    """The KV bytes a decode step reads per cached token of a sequence, by layer window (None: the layers
    that read the whole context), and the recurrent-state bytes each sequence reads and writes whatever its
    context (0 without Gated DeltaNet layers)."""

    per_token: dict[int | None, int]
    per_sequence: int = 0

    def bytes(self, context: int) -> int:
        """What one sequence with `context` cached tokens reads (and, of its states, writes)."""
        kv = sum(b * (context if w is None else min(context, w)) for w, b in self.per_token.items())
        return kv + self.per_sequence


def layer_types(shape: str) -> list[str]:
    """Each layer's type, as the engine reads the config: "linear_attention" (Gated DeltaNet),
    "sliding_attention" or "full_attention"."""
    s = SHAPES[shape]
    layers = s["num_hidden_layers"]
    if "full_attention_interval" in s:
        return [
            "full_attention" if (i + 1) % s["full_attention_interval"] == 0 else "linear_attention"
            for i in range(layers)
        ]
    return ["sliding_attention" if w is not None else "full_attention" for w in _attention_windows(s)]


def _attention_windows(s: dict) -> list[int | None]:
    layers, window = s["num_hidden_layers"], s.get("sliding_window")
    if "layer_types" in s:
        return [window if t == "sliding_attention" else None for t in s["layer_types"]]
    if s["model_type"] == "gemma2":
        return [window if i % 2 == 0 else None for i in range(layers)]
    if s["model_type"] == "gemma3_text":
        return [None if (i + 1) % s["sliding_window_pattern"] == 0 else window for i in range(layers)]
    return [window] * layers


def layer_windows(shape: str) -> list[int | None]:
    """Each attention layer's sliding window (None: global attention), as the engine reads the config; a
    Gated DeltaNet layer has none and is left out."""
    s = SHAPES[shape]
    if "full_attention_interval" in s:
        return [None for t in layer_types(shape) if t == "full_attention"]
    return _attention_windows(s)


def _gated_delta_net_sizes(s: dict) -> tuple[int, int, int, int]:
    """(rows of its input projection, other weight elements, fp32 elements, state bytes per sequence) of one
    Gated DeltaNet layer; its output projection is [hidden, value heads x value_head_dim]."""
    kernel = s["linear_conv_kernel_dim"]
    keys = s["linear_num_key_heads"] * s["linear_key_head_dim"]
    value_heads = s["linear_num_value_heads"]
    values = value_heads * s["linear_value_head_dim"]
    channels = 2 * keys + values  # the convolution's: q, k and v
    in_rows = channels + values + 2 * value_heads  # q, k, v, z, b and a
    other = channels * kernel + s["linear_value_head_dim"]  # the convolution and the gated norm's weight
    state = channels * (kernel - 1) * 2 + value_heads * s["linear_key_head_dim"] * s["linear_value_head_dim"] * 4
    return in_rows, other, 2 * value_heads, state  # A_log and dt_bias in fp32


def model_bytes(
    shape: str, kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1, quantization: str | None = None
) -> tuple[WeightRead, KVRead]:
    """(weight read, KV read) of a decode step of one rank of the bf16 model, the KV in bf16 or in FP8 with a
    4-byte scale per head; with quantization "fp8" the decoder's projections (attention's, the Gated DeltaNet's
    and the dense MLP's) in FP8 with a 4-byte scale per output row. A Gated DeltaNet layer's state is read and
    written once a step. A shape stored in FP8 blocks counts as "fp8" (its block scales are a 16,384th of its
    weights); one with MXFP4 experts reads 4.25 bits per expert weight (a byte per 32 of them its scale)."""
    s = SHAPES[shape]
    if s["model_type"] == "gemma4_text":
        return _gemma4_bytes(s, kv_cache_dtype, tensor_parallel_size)
    method = s.get("quantization_config", {}).get("quant_method")
    if method == "fp8":
        quantization = "fp8"
    h, d = s["hidden_size"], s.get("head_dim") or s["hidden_size"] // s["num_attention_heads"]
    q, kv = s["num_attention_heads"] * d, s["num_key_value_heads"] * d
    gated_q = 2 * q if s.get("attn_output_gate") else q  # q_proj gives each head its q and its gate
    gemma = s["model_type"].startswith("gemma")
    qk_norms = 2 * d if s["model_type"] in ("qwen3", "gemma3_text") or "full_attention_interval" in s else 0
    biases = q + 2 * kv if s["model_type"] == "qwen2" else 0
    experts = s.get("num_experts") or s.get("num_local_experts", 0)
    expert_width = s.get("moe_intermediate_size") or (s["intermediate_size"] if experts else 0)
    if s["model_type"] == "gpt_oss":  # q, k, v and o biases, a sink per head, the router's bias
        biases = q + 2 * kv + h + s["num_attention_heads"] + experts
    mlp = 0 if experts else 3 * h * s["intermediate_size"]
    shared = 3 * h * s.get("shared_expert_intermediate_size", 0)
    shared += h if shared else 0  # the shared expert's gate
    attention = h * (gated_q + 2 * kv) + q * h
    if quantization == "fp8":  # 1 byte each, and a 4-byte scale per output row: counted here in 2-byte units
        attention = attention // 2 + 2 * (gated_q + 2 * kv + h)
        mlp = mlp // 2 + 2 * (2 * s["intermediate_size"] + h) if mlp else 0
    per_layer = mlp + shared + (4 if gemma else 2) * h + h * experts  # the router: [experts, hidden]
    types = layer_types(shape)
    linear = types.count("linear_attention")
    in_rows, other, linear_fp32, state = _gated_delta_net_sizes(s) if linear else (0, 0, 0, 0)
    values = s.get("linear_num_value_heads", 0) * s.get("linear_value_head_dim", 0)
    projections = in_rows * h + values * h
    if quantization == "fp8":
        projections = projections // 2 + 2 * (in_rows + h)
    linear_weights = projections + other
    # the LM head is read whole; of the input embedding table, tied to it or not, a step reads only the rows
    # of its tokens (an untied Qwen3-8B table is 1.2 GB that no step reads)
    lm_head = s["vocab_size"] * h
    per_head = s["num_key_value_heads"] * (d + 4 if kv_cache_dtype == "fp8" else 2 * d)
    read: dict[int | None, int] = {}
    for window in layer_windows(shape):
        read[window] = read.get(window, 0) + 2 * per_head // tensor_parallel_size
    layers = s["num_hidden_layers"]
    decoder = layers * per_layer + (layers - linear) * (attention + qk_norms + biases)
    decoder += linear * (linear_weights + linear_fp32)
    dense = 2 * (lm_head + decoder + h) // tensor_parallel_size
    expert_weights = layers * 3 * h * expert_width
    # MXFP4: 4 bits a value and 8 a block of 32, 17 / 32 of a byte
    expert = (expert_weights * 17 // 32 if method == "mxfp4" else 2 * expert_weights) // tensor_parallel_size
    states = 2 * linear * state // tensor_parallel_size  # each read and written once
    if s["model_type"] == "gpt_oss":  # each expert's gate|up and down biases
        expert += 2 * layers * (2 * expert_width + h) // tensor_parallel_size
    return WeightRead(dense, expert, experts, s.get("num_experts_per_tok", 0)), KVRead(read, states)


def _gemma4_sources(s: dict) -> list[int]:
    """Each Gemma 4 layer's K/V layer: its own, or for the last num_kv_shared_layers the last earlier layer of
    their type."""
    types, first_shared = s["layer_types"], s["num_hidden_layers"] - s["num_kv_shared_layers"]
    last = {t: i for i, t in enumerate(types[:first_shared])}
    return [i if i < first_shared else last[t] for i, t in enumerate(types)]


def _gemma4_bytes(s: dict, kv_cache_dtype: str, tensor_parallel_size: int) -> tuple[WeightRead, KVRead]:
    """`model_bytes` of a Gemma 4 shape, layer by layer: a global layer's head size and KV heads (and, with
    attention_k_eq_v, no v_proj: V is the K projection's output, normalised but not rotated, and is still
    cached beside K); a KV-shared layer's q and o projections only, its K/V read from its source layer's
    cache (read again, stored once); per-layer inputs (a gate and a projection per layer, and one
    projection of the embedding into every layer's slice: of the per-layer table a step reads its tokens'
    rows only); experts beside the dense MLP with a router, its scales and three more norms."""
    h, heads, layers = s["hidden_size"], s["num_attention_heads"], s["num_hidden_layers"]
    per_layer_input = s["hidden_size_per_layer_input"]
    experts = s["num_experts"] if s["enable_moe_block"] else 0
    decoder = h * layers * per_layer_input + per_layer_input  # the embedding's projection and its norm
    read: dict[int | None, int] = {}
    sources = _gemma4_sources(s)
    for i, (layer_type, source) in enumerate(zip(s["layer_types"], sources)):
        full = layer_type == "full_attention"
        d = s["global_head_dim"] if full else s["head_dim"]
        k_eq_v = full and s["attention_k_eq_v"]
        kv_heads = s["num_global_key_value_heads"] if k_eq_v else s["num_key_value_heads"]
        q = heads * d
        own_kv = source == i
        attention = 2 * q * h + d  # q and o projections, q's norm
        if own_kv:
            attention += h * kv_heads * d * (1 if k_eq_v else 2) + d  # k (and v) projections, k's norm
        width = s["intermediate_size"] * (2 if s["use_double_wide_mlp"] and not own_kv else 1)
        norms = 4 * h + 1  # four norms and the layer's scalar
        if per_layer_input:
            norms += 2 * h * per_layer_input + h  # the per-layer input's gate, projection and norm
        if experts:
            norms += h * experts + h + experts + 3 * h  # the router, its scales and the experts' norms
        decoder += attention + 3 * h * width + norms
        per_head = kv_heads * (d + 4 if kv_cache_dtype == "fp8" else 2 * d)
        window = None if full else s["sliding_window"]
        read[window] = read.get(window, 0) + 2 * per_head // tensor_parallel_size
    dense = 2 * (s["vocab_size"] * h + decoder + h) // tensor_parallel_size
    expert = 2 * layers * 3 * h * s.get("moe_intermediate_size", 0) // tensor_parallel_size if experts else 0
    return WeightRead(dense, expert, experts, s.get("top_k_experts", 0) if experts else 0), KVRead(read)
