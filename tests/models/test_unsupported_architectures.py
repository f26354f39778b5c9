"""Bad input refused at load time: a hybrid or linear-attention architecture whose layers the engine does not
implement is refused by name with the layers it lacks and the hybrid models it runs; a hybrid config whose
layer_types name another kind of layer is refused naming it."""

import re
from types import SimpleNamespace

import pytest
import transformers

from nanovllm.config import Config
from nanovllm.models.families import FAMILIES, UNSUPPORTED_LAYERS, family_of, supported_architecture
from nanovllm.models.model_config import ModelConfig

HYBRID = [name for name in FAMILIES if family_of(name).linear_attention is not None]


def refusal(architecture: str) -> str:
    """The start of the message that refuses `architecture`, as a pattern."""
    return re.escape(
        f"{architecture} uses {UNSUPPORTED_LAYERS[architecture]}, which this engine does not implement; the "
        f"hybrid linear-attention models it runs (Gated DeltaNet layers beside full attention) are "
        f"{', '.join(HYBRID)}; supported: "
    )


@pytest.mark.parametrize(
    "architecture, layers",
    [
        ("KimiLinearForCausalLM", "Kimi Delta Attention, a linear-attention layer"),
        ("Mamba2ForCausalLM", "Mamba-2 state-space layers"),
        ("MambaForCausalLM", "Mamba state-space layers"),
        ("NemotronHForCausalLM", "Mamba-2 state-space layers"),
        ("FalconH1ForCausalLM", "Mamba-2 state-space layers"),
        ("JambaForCausalLM", "Mamba state-space layers"),
        ("GraniteMoeHybridForCausalLM", "Mamba-2 state-space layers"),
        ("Lfm2ForCausalLM", "gated short convolutions"),
        ("RecurrentGemmaForCausalLM", "RG-LRU recurrent layers"),
        ("RwkvForCausalLM", "RWKV's time-mixing recurrence"),
    ],
)
def test_an_architecture_with_layers_the_engine_lacks_is_refused_naming_them(architecture, layers):
    assert UNSUPPORTED_LAYERS[architecture] == layers
    with pytest.raises(ValueError, match=refusal(architecture)):
        ModelConfig.from_hf(SimpleNamespace(architectures=[architecture]))


def test_the_refusal_lists_the_hybrid_families_it_runs_and_every_supported_one():
    assert "Qwen3_5ForCausalLM" in HYBRID and "Qwen3ForCausalLM" not in HYBRID
    with pytest.raises(ValueError, match=refusal("KimiLinearForCausalLM") + re.escape(", ".join(FAMILIES)) + "$"):
        supported_architecture(["KimiLinearForCausalLM"])


@pytest.mark.parametrize("config_class", ["KimiLinearConfig", "Mamba2Config", "Lfm2Config", "RwkvConfig"])
def test_a_checkpoint_folder_of_one_is_refused_when_its_config_is_read(tmp_path, config_class):
    hf_config = getattr(transformers, config_class)()
    architecture = config_class.removesuffix("Config") + "ForCausalLM"
    hf_config.architectures = [architecture]
    hf_config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=refusal(architecture)):
        Config(str(tmp_path))


def test_every_unsupported_entry_is_a_transformers_class_and_no_supported_family():
    assert not set(UNSUPPORTED_LAYERS) & set(FAMILIES)
    assert all(hasattr(transformers, name) for name in UNSUPPORTED_LAYERS)


def test_a_supported_architecture_beside_an_unsupported_one_is_chosen():
    assert supported_architecture(["KimiLinearForCausalLM", "Qwen3_5ForCausalLM"]) == "Qwen3_5ForCausalLM"


def test_an_architecture_of_no_known_kind_gets_the_list_of_supported_ones():
    with pytest.raises(ValueError, match=r"unsupported architecture \['MysteryForCausalLM'\]; supported: Gemma2"):
        supported_architecture(["MysteryForCausalLM"])


@pytest.mark.parametrize(
    "layer_types, message",
    [
        (
            ["linear_attention", "sliding_attention"],
            r"layer_types must name 2 layers \(num_hidden_layers\), each one of linear_attention \(Gated DeltaNet\) "
            r"or full_attention; got \['linear_attention', 'sliding_attention'\]: sliding_attention is not a layer "
            r"type of this hybrid decoder",
        ),
        (
            ["mamba2", "chunked_attention"],
            r"got \['mamba2', 'chunked_attention'\]: chunked_attention, mamba2 are not layer types of this hybrid "
            r"decoder",
        ),
        (["full_attention"], r"layer_types must name 2 layers .* got \['full_attention'\]: it names 1$"),
    ],
)
def test_hybrid_layer_types_naming_another_kind_of_layer_are_refused_naming_it(layer_types, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf(
            SimpleNamespace(architectures=["Qwen3_5ForCausalLM"], num_hidden_layers=2, layer_types=layer_types)
        )
