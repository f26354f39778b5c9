"""ModelConfig.from_hf, the one reader of a Hugging Face config, and the lazy model registry."""

import subprocess
import sys
from types import SimpleNamespace

import pytest
from transformers import (
    AutoConfig,
    Gemma2Config,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

from nanovllm.cache.specs import FullAttention, SlidingWindow, group_layers
from nanovllm.config import Config
from nanovllm.models import model_class
from nanovllm.models.model_config import ModelConfig


def test_fields_left_out_take_the_llama_family_defaults():
    config = ModelConfig.from_hf(
        SimpleNamespace(architectures=["LlamaForCausalLM"], hidden_size=64, num_attention_heads=4)
    )
    assert (config.hidden_size, config.num_attention_heads) == (64, 4)
    assert config.head_dim == 16 and config.num_key_value_heads == 4  # hidden / heads; as many as the heads
    assert (config.vocab_size, config.intermediate_size, config.num_hidden_layers) == (32000, 11008, 32)
    assert (config.max_position_embeddings, config.rms_norm_eps) == (2048, 1e-6)
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}
    assert not (
        config.qkv_bias or config.o_proj_bias or config.mlp_bias or config.tie_word_embeddings or config.qk_norm
    )
    assert config.sliding_window is None and config.layer_types == ("full_attention",) * 32
    assert config.attention_scale == 16**-0.5 and config.layer_window(0) is None
    assert config.attn_logit_softcapping is None and config.final_logit_softcapping is None
    assert not (config.norm_unit_offset or config.sandwich_norms) and config.embed_scale is None
    assert config.hidden_act == "silu" and config.dtype is None and config.eos_token_id is None


def test_qwen3_family_defaults_include_its_head_dim_and_q_k_norm():
    config = ModelConfig.from_hf(SimpleNamespace(architectures=["Qwen3ForCausalLM"]))
    assert config.qk_norm and config.head_dim == 128  # transformers' Qwen3Config default, not hidden / heads
    assert (config.vocab_size, config.max_position_embeddings) == (151936, 32768)


def test_transformers_defaults_and_ours_agree():
    for hf in (
        Gemma2Config(architectures=["Gemma2ForCausalLM"]),
        LlamaConfig(architectures=["LlamaForCausalLM"]),
        MistralConfig(architectures=["MistralForCausalLM"]),
        Phi3Config(architectures=["Phi3ForCausalLM"]),
        Qwen2Config(architectures=["Qwen2ForCausalLM"]),
        Qwen3Config(architectures=["Qwen3ForCausalLM"]),
        Qwen3MoeConfig(architectures=["Qwen3MoeForCausalLM"]),
        MixtralConfig(architectures=["MixtralForCausalLM"]),
    ):
        family = ModelConfig.from_hf(SimpleNamespace(architectures=hf.architectures, eos_token_id=hf.eos_token_id))
        assert ModelConfig.from_hf(hf) == family


def test_qwen2_has_a_bias_on_q_k_v_only_and_qwen3_llama_on_all_four_when_asked():
    qwen2 = ModelConfig.from_hf(SimpleNamespace(architectures=["Qwen2ForCausalLM"]))
    assert qwen2.qkv_bias and not qwen2.o_proj_bias
    for arch in ("Qwen3ForCausalLM", "LlamaForCausalLM"):
        config = ModelConfig.from_hf(SimpleNamespace(architectures=[arch], attention_bias=True))
        assert config.qkv_bias and config.o_proj_bias


def test_mistral_takes_its_window_unless_the_config_says_null():
    assert ModelConfig.from_hf(SimpleNamespace(architectures=["MistralForCausalLM"])).sliding_window == 4096
    phi3 = SimpleNamespace(architectures=["Phi3ForCausalLM"], sliding_window=2047)
    assert ModelConfig.from_hf(phi3).sliding_window == 2047
    config = ModelConfig.from_hf(SimpleNamespace(architectures=["MistralForCausalLM"], sliding_window=None))
    assert config.sliding_window is None


def test_gemma2_family_defaults():
    config = ModelConfig.from_hf(SimpleNamespace(architectures=["Gemma2ForCausalLM"]))
    assert (config.head_dim, config.attention_scale, config.hidden_act) == (256, 256**-0.5, "gelu_pytorch_tanh")
    assert (config.attn_logit_softcapping, config.final_logit_softcapping) == (50.0, 30.0)
    assert config.norm_unit_offset and config.sandwich_norms and config.tie_word_embeddings
    assert config.embed_scale == 2304**0.5
    # Gemma 2's convention where the config has no layer_types: even layers slide, odd ones are global
    assert [config.layer_window(i) for i in range(4)] == [4096, None, 4096, None]


def test_gemma2_reads_layer_types_its_scalar_and_null_soft_caps():
    config = ModelConfig.from_hf(
        SimpleNamespace(
            architectures=["Gemma2ForCausalLM"],
            num_hidden_layers=3,
            sliding_window=512,
            layer_types=["full_attention", "sliding_attention", "sliding_attention"],
            query_pre_attn_scalar=144,
            attn_logit_softcapping=None,
            final_logit_softcapping=None,
        )
    )
    assert [config.layer_window(i) for i in range(3)] == [None, 512, 512]
    assert config.attention_scale == 144**-0.5
    assert config.attn_logit_softcapping is None and config.final_logit_softcapping is None


def test_mistral_and_phi3_slide_on_every_layer():
    config = ModelConfig.from_hf(SimpleNamespace(architectures=["MistralForCausalLM"], num_hidden_layers=2))
    assert [config.layer_window(i) for i in range(2)] == [4096, 4096]
    assert ModelConfig.from_hf(SimpleNamespace(architectures=["Phi3ForCausalLM"])).layer_window(5) is None


def test_head_dim_given_wins_over_hidden_over_heads():
    config = ModelConfig.from_hf(
        SimpleNamespace(architectures=["LlamaForCausalLM"], hidden_size=64, num_attention_heads=4, head_dim=32)
    )
    assert config.head_dim == 32


def test_tiny_llama_fields(llama_dir):
    config = Config(llama_dir).model_config
    assert config.architecture == "LlamaForCausalLM" and config.architectures == ("LlamaForCausalLM",)
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (64, 128, 2)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 16)
    assert (config.vocab_size, config.max_position_embeddings) == (512, 1024)
    assert config.rope_parameters["rope_type"] == "default" and config.rope_parameters["rope_theta"] == 500000.0
    assert config.tie_word_embeddings and not config.qk_norm
    assert config.dtype == "float32" and config.eos_token_id == 1


def test_tiny_qwen3_fields(qwen3_dir):
    config = Config(qwen3_dir).model_config
    assert config.architecture == "Qwen3ForCausalLM"
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 16)
    assert config.rope_parameters["rope_theta"] == 10000.0
    assert config.qk_norm and not config.tie_word_embeddings
    assert model_class(config).__name__ == "DecoderForCausalLM"


def test_rope_theta_of_an_older_config_is_read():
    config = ModelConfig.from_hf(
        SimpleNamespace(
            architectures=["LlamaForCausalLM"],
            rope_theta=500000.0,
            rope_scaling={
                "type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        )
    )
    assert config.rope_parameters["rope_type"] == "llama3" and config.rope_parameters["rope_theta"] == 500000.0


def test_the_partial_rotary_factor_is_read_where_transformers_reads_it():
    # Phi-4-mini: 0.75 of a 128-dimension head at the config's top level (transformers 5 moves it into
    # the rope dict, which wins when both say)
    phi4 = dict(architectures=["Phi3ForCausalLM"], hidden_size=3072, num_attention_heads=24)
    assert ModelConfig.from_hf(SimpleNamespace(**phi4, partial_rotary_factor=0.75)).rotary_dim == 96
    rope = {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}
    config = ModelConfig.from_hf(SimpleNamespace(**phi4, partial_rotary_factor=0.75, rope_parameters=rope))
    assert config.rotary_dim == 64 and "partial_rotary_factor" not in config.rope_parameters
    assert ModelConfig.from_hf(Phi3Config(**phi4, partial_rotary_factor=0.75)).rotary_dim == 96
    assert ModelConfig.from_hf(SimpleNamespace(**phi4)).rotary_dim == 128


def longrope(n: int, **extra) -> dict:
    """A longrope dict with n short and n long factors (transformers keeps it in rope_parameters)."""
    return {"rope_type": "longrope", "short_factor": [1.0] * n, "long_factor": [4.0] * n, **extra}


def test_phi4_mini_longrope_takes_its_original_context_from_the_top_level_and_derives_its_factor():
    # Phi-4-mini's config: 131072 positions, 4096 of them original, a quarter of each head not rotated
    phi4 = dict(
        architectures=["Phi3ForCausalLM"],
        hidden_size=3072,
        num_attention_heads=24,
        max_position_embeddings=131072,
        original_max_position_embeddings=4096,
        partial_rotary_factor=0.75,
    )
    rope = ModelConfig.from_hf(SimpleNamespace(**phi4, rope_scaling=longrope(48))).rope_parameters
    assert rope["original_max_position_embeddings"] == 4096 and rope["factor"] == 32.0
    # transformers' Phi3Config puts the top-level value over the rope dict's, and reads "su" as longrope
    given = longrope(48, type="su", original_max_position_embeddings=1024, factor=8.0)
    hf = Phi3Config(**phi4, rope_scaling=given)
    assert hf.rope_parameters["original_max_position_embeddings"] == 4096
    rope = ModelConfig.from_hf(hf).rope_parameters
    assert (rope["rope_type"], rope["original_max_position_embeddings"], rope["factor"]) == ("longrope", 4096, 8.0)


def test_a_llama_longrope_takes_its_original_context_from_the_rope_dict_else_its_own():
    llama = dict(architectures=["LlamaForCausalLM"], hidden_size=64, num_attention_heads=4)
    params = longrope(8, rope_theta=1e4, original_max_position_embeddings=512)
    rope = ModelConfig.from_hf(SimpleNamespace(**llama, rope_parameters=params)).rope_parameters
    assert rope["original_max_position_embeddings"] == 512 and rope["factor"] == 2048 / 512
    rope = ModelConfig.from_hf(SimpleNamespace(**llama, rope_parameters=longrope(8))).rope_parameters
    assert rope["original_max_position_embeddings"] == 2048 and rope["factor"] == 1.0


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported; supported: silu, gelu_pytorch_tanh"),
        ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e6}}, "rope_type 'dynamic' is not supported"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}}, "rope_type 'yarn' needs factor"),
        (
            {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e6, "factor": 8.0}},
            "rope_type 'llama3' needs low_freq_factor",
        ),
        ({"partial_rotary_factor": 1.5}, "partial_rotary_factor 1.5 turns 192 of the 128 dimensions"),
        ({"partial_rotary_factor": 0.0}, "partial_rotary_factor 0.0 turns 0 of the 128 dimensions"),
        ({"head_dim": 20, "partial_rotary_factor": 0.25}, "turns 5 of the 20 dimensions of a head; it must"),
        ({"rope_parameters": {"rope_type": "longrope"}}, "rope_type 'longrope' needs short_factor, long_factor"),
        (
            {"rope_parameters": longrope(64), "partial_rotary_factor": 0.75},
            r"needs one short_factor value per rotated frequency, 48 \(96 dimensions of each head turn\); the "
            "config gives 64",
        ),
        ({"use_sliding_window": True}, "use_sliding_window=True is not supported"),
        ({"quantization_config": {"quant_method": "awq"}}, "quant_method 'awq'"),
        (
            {"quantization_config": {"quant_method": "mxfp4"}},
            r"MXFP4 checkpoints \(quant_method 'mxfp4'\) load for gpt-oss only, whose experts are stored in blocks "
            "and scales; Qwen3ForCausalLM is not",
        ),
        (
            {"architectures": ["MysteryForCausalLM"]},
            r"unsupported architecture \['MysteryForCausalLM'\]; supported: Gemma2ForCausalLM, Gemma3ForCausalLM, "
            r"Gemma3ForConditionalGeneration, Gemma4ForCausalLM, Gemma4ForConditionalGeneration, GptOssForCausalLM, "
            r"LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM, Phi3ForCausalLM, Qwen2ForCausalLM, "
            r"Qwen3ForCausalLM, Qwen3MoeForCausalLM",
        ),
        ({"architectures": None}, r"unsupported architecture \(none in config.json\)"),
    ],
)
def test_what_the_engine_cannot_run_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf(SimpleNamespace(**{"architectures": ["Qwen3ForCausalLM"], **fields}))


def test_an_unsupported_activation_is_refused_when_the_config_loads(qwen3_dir):
    hf = AutoConfig.from_pretrained(qwen3_dir)
    hf.hidden_act = "relu"
    with pytest.raises(ValueError, match="hidden_act 'relu'"):
        ModelConfig.from_hf(hf)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"hidden_activation": "gelu"}, "hidden_activation 'gelu' is not supported"),
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention=True is not supported"),
        (
            {"num_hidden_layers": 2, "layer_types": ["sliding_attention", "chunked_attention"]},
            r"layer_types must name 2 layers .* got \['sliding_attention', 'chunked_attention'\]",
        ),
        ({"num_hidden_layers": 2, "layer_types": ["full_attention"]}, "layer_types must name 2 layers"),
        ({"sliding_window": 0}, "sliding_window must be a positive number, got 0"),
        ({"sliding_window": 4.5}, "sliding_window must be a whole number of tokens, got 4.5"),
        ({"query_pre_attn_scalar": -1}, "query_pre_attn_scalar must be a positive number, got -1"),
        ({"attn_logit_softcapping": 0.0}, "attn_logit_softcapping must be a positive number, got 0.0"),
        ({"final_logit_softcapping": "30"}, "final_logit_softcapping must be a positive number, got '30'"),
    ],
)
def test_a_gemma2_setting_the_engine_cannot_honour_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf(SimpleNamespace(architectures=["Gemma2ForCausalLM"], **fields))


def test_a_dense_family_has_no_experts_even_where_its_config_names_some():
    config = ModelConfig.from_hf(SimpleNamespace(architectures=["Qwen3ForCausalLM"], num_experts=8))
    assert (config.num_experts, config.moe_layers) == (0, ())


def test_qwen3_moe_puts_experts_in_every_sparse_step_but_the_dense_only_layers():
    config = ModelConfig.from_hf(
        SimpleNamespace(
            architectures=["Qwen3MoeForCausalLM"],
            num_hidden_layers=8,
            decoder_sparse_step=2,
            mlp_only_layers=[3, 5],
            num_experts=16,  # Qwen3-MoE's published configs' name
            num_experts_per_tok=4,
            moe_intermediate_size=96,
            norm_topk_prob=True,
        )
    )
    assert config.moe_layers == (1, 7)  # layers 1, 3, 5, 7 are every second; 3 and 5 stay dense
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size) == (16, 4, 96)
    assert config.norm_topk_prob and config.qk_norm


def test_mixtral_experts_are_intermediate_size_wide_in_every_layer_and_renormalised():
    config = ModelConfig.from_hf(
        SimpleNamespace(architectures=["MixtralForCausalLM"], num_hidden_layers=3, intermediate_size=48)
    )
    assert config.moe_layers == (0, 1, 2) and config.moe_intermediate_size == 48
    assert (config.num_experts, config.num_experts_per_tok, config.norm_topk_prob) == (8, 2, True)
    assert config.sliding_window is None  # Mixtral's default, unlike Mistral's 4096
    windowed = SimpleNamespace(architectures=["MixtralForCausalLM"], num_hidden_layers=2, sliding_window=64)
    assert ModelConfig.from_hf(windowed).layer_types == ("sliding_attention",) * 2


def test_mixtral_renormalises_and_puts_experts_in_every_layer_whatever_its_config_says():
    # transformers' Mixtral reads none of these fields: a stray one must not change the model
    config = ModelConfig.from_hf(
        SimpleNamespace(
            architectures=["MixtralForCausalLM"],
            num_hidden_layers=3,
            norm_topk_prob=False,
            decoder_sparse_step=2,
            mlp_only_layers=[0],
        )
    )
    assert config.norm_topk_prob and config.moe_layers == tuple(range(config.num_hidden_layers))


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"shared_expert_intermediate_size": 64}, "shared_expert_intermediate_size=64 is not supported"),
        ({"n_shared_experts": 1}, "n_shared_experts=1 is not supported: .* no shared expert"),
        ({"scoring_func": "sigmoid"}, "scoring_func='sigmoid' is not supported: experts are chosen by a softmax"),
        ({"topk_method": "noaux_tc"}, "topk_method='noaux_tc' is not supported"),
        ({"num_experts": 4, "num_experts_per_tok": 6}, r"num_experts_per_tok \(6\) must be at most .* \(4\)"),
        ({"num_experts_per_tok": 0}, "num_experts_per_tok must be a positive whole number, got 0"),
        ({"decoder_sparse_step": 0}, "decoder_sparse_step must be a positive whole number, got 0"),
        ({"moe_intermediate_size": 1.5}, "moe_intermediate_size must be a positive whole number, got 1.5"),
    ],
)
def test_a_mixture_of_experts_setting_the_engine_cannot_honour_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf(SimpleNamespace(architectures=["Qwen3MoeForCausalLM"], **fields))


@pytest.mark.slow
def test_reading_a_config_imports_only_its_family_file_and_no_torch_until_the_model_is_built():
    code = (
        "import sys\n"
        "import nanovllm.models as models\n"
        "from nanovllm.models.model_config import ModelConfig\n"
        "families = ('nanovllm.models.llama', 'nanovllm.models.qwen3', 'nanovllm.models.blocks')\n"
        "assert not any(f in sys.modules for f in families), [f for f in families if f in sys.modules]\n"
        "from types import SimpleNamespace\n"
        "config = ModelConfig.from_hf(SimpleNamespace(architectures=['LlamaForCausalLM']))\n"
        "assert 'nanovllm.models.llama' in sys.modules and 'nanovllm.models.qwen3' not in sys.modules\n"
        "assert 'torch' not in sys.modules and 'nanovllm.models.blocks' not in sys.modules\n"
        "cls = models.model_class(config)\n"
        "assert cls.__name__ == 'DecoderForCausalLM' and 'torch' in sys.modules\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_the_checkpoint_names_of_the_family_reach_the_model():
    mixtral = ModelConfig.from_hf(SimpleNamespace(architectures=["MixtralForCausalLM"]))
    assert mixtral.checkpoint_names.renames == {".block_sparse_moe.": ".mlp."}
    assert mixtral.checkpoint_names.expert_weights["w3"] == ("w13", "up")
    assert ModelConfig.from_hf(SimpleNamespace(architectures=["Phi3ForCausalLM"])).checkpoint_names.packed_modules == {}
    image_text = ModelConfig.from_hf(
        SimpleNamespace(architectures=["Gemma3ForConditionalGeneration"], text_config=SimpleNamespace(head_dim=32))
    )
    assert image_text.head_dim == 32 and image_text.checkpoint_names.prefixes["model.vision_tower."] is None
    llama = ModelConfig.from_hf(SimpleNamespace(architectures=["LlamaForCausalLM"])).checkpoint_names
    assert llama.packed_modules["k_proj"] == ("qkv_proj", "k") and not (llama.renames or llama.prefixes)


TINY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4)
FULL = FullAttention(num_kv_heads=2, head_dim=16)


@pytest.mark.parametrize(
    "architecture, fields, specs",
    [
        ("LlamaForCausalLM", {}, [FULL] * 4),
        ("Qwen2ForCausalLM", {}, [FULL] * 4),
        ("Qwen3ForCausalLM", {"head_dim": 32}, [FullAttention(2, 32)] * 4),
        ("Qwen3MoeForCausalLM", {}, [FULL] * 4),
        ("MistralForCausalLM", {}, [SlidingWindow(2, 16, 4096)] * 4),  # v0.1's window, on every layer
        ("MistralForCausalLM", {"sliding_window": None}, [FULL] * 4),  # later versions
        ("Phi3ForCausalLM", {}, [FULL] * 4),
        ("Phi3ForCausalLM", {"sliding_window": 2047}, [SlidingWindow(2, 16, 2047)] * 4),
        ("MixtralForCausalLM", {}, [FULL] * 4),
        ("MixtralForCausalLM", {"sliding_window": 64}, [SlidingWindow(2, 16, 64)] * 4),
        # Gemma 2: even layers slide; Gemma 3: five sliding layers to one global; else as layer_types say
        ("Gemma2ForCausalLM", {"head_dim": 16}, [SlidingWindow(2, 16, 4096), FULL] * 2),
        (
            "Gemma3ForCausalLM",
            {"head_dim": 16, "num_hidden_layers": 7},
            [SlidingWindow(2, 16, 4096)] * 5 + [FULL] + [SlidingWindow(2, 16, 4096)],
        ),
        (
            "Gemma3ForCausalLM",
            {"head_dim": 16, "sliding_window": 8, "layer_types": ["full_attention"] + ["sliding_attention"] * 3},
            [FULL] + [SlidingWindow(2, 16, 8)] * 3,
        ),
    ],
)
def test_each_layer_has_the_cache_spec_of_its_family_and_config(architecture, fields, specs):
    config = ModelConfig.from_hf(SimpleNamespace(architectures=[architecture], **{**TINY, **fields}))
    assert list(config.layer_specs) == specs
    windows = [spec.window if isinstance(spec, SlidingWindow) else None for spec in specs]
    assert [config.layer_window(i) for i in range(len(specs))] == windows


def test_an_image_text_gemma3_has_the_layer_specs_of_its_text_config():
    text_config = SimpleNamespace(**{**TINY, "head_dim": 16, "num_hidden_layers": 6, "sliding_window": 512})
    config = ModelConfig.from_hf(
        SimpleNamespace(architectures=["Gemma3ForConditionalGeneration"], text_config=text_config)
    )
    assert group_layers(config.layer_specs) == {SlidingWindow(2, 16, 512): (0, 1, 2, 3, 4), FULL: (5,)}
