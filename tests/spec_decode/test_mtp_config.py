"""Method "mtp" read and checked against the target: the checkpoint's multi-token-prediction layer is built and
loaded, its K/V one more full-attention layer of the cache layout; a family without one, or a checkpoint
without its weights, is refused by name."""

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from nanovllm.config import Config
from nanovllm.spec_decode.speculative_config import SpeculativeConfig
from nanovllm.worker.model_loading import build_model

from helpers.mtp_layers import MTP_FILE
from helpers.qwen3_5_models import save_qwen3_5
from helpers.tiny_models import save_tiny_model

MTP = {"method": "mtp", "num_speculative_tokens": 2}


@pytest.fixture(scope="module")
def qwen3_5_dir(tmp_path_factory):
    return save_qwen3_5(tmp_path_factory.mktemp("tiny-qwen3_5"))


def test_mtp_settings_are_read_with_vllms_names():
    assert SpeculativeConfig.from_dict(MTP) == SpeculativeConfig("mtp", 2)


@pytest.mark.parametrize("extra", [{"model": "/d"}, {"prompt_lookup_max": 3}])
def test_mtp_takes_no_draft_model_nor_lookup(extra):
    with pytest.raises(ValueError, match="method 'mtp' drafts with the target model's own layer and takes no"):
        SpeculativeConfig.from_dict({**MTP, **extra})


def test_the_mtp_layer_is_built_loaded_and_keeps_kv_as_one_more_full_attention_layer(qwen3_5_dir):
    config = Config(qwen3_5_dir, speculative_config=MTP, device="cpu")
    assert config.model_config.with_mtp
    num_layers = config.model_config.num_hidden_layers
    assert [group.layers for group in config.kv_layout.groups] == [(3, 7, num_layers)]
    model = build_model(config, torch.device("cpu"), 0, 1)
    # its decoder layer is loaded from the checkpoint's mtp.layers.0 (the norm with its unit offset)
    saved = load_file(os.path.join(qwen3_5_dir, MTP_FILE))
    torch.testing.assert_close(
        model.mtp.layers[0].self_attn.o_proj.weight, saved["mtp.layers.0.self_attn.o_proj.weight"]
    )
    torch.testing.assert_close(model.mtp.norm.weight, 1 + saved["mtp.norm.weight"])
    assert Config(qwen3_5_dir, device="cpu").model_config.with_mtp is False


def test_a_checkpoint_without_mtp_weights_is_refused_by_name(qwen3_5_dir, tmp_path):
    model_dir = shutil.copytree(qwen3_5_dir, tmp_path / "no-mtp")
    os.remove(model_dir / MTP_FILE)
    with pytest.raises(ValueError, match=r"method 'mtp' needs the multi-token-prediction weights \('mtp\.\*'"):
        Config(str(model_dir), speculative_config=MTP, device="cpu")


def test_a_family_without_mtp_is_refused_by_name(tmp_path):
    save_tiny_model(tmp_path)
    with pytest.raises(ValueError, match="method 'mtp' .* which Qwen3ForCausalLM models do not have"):
        Config(str(tmp_path), speculative_config=MTP, device="cpu")


def test_more_than_one_mtp_layer_is_refused(qwen3_5_dir, tmp_path):
    model_dir = shutil.copytree(qwen3_5_dir, tmp_path / "two-mtp")
    config = json.loads((model_dir / "config.json").read_text())
    config["mtp_num_hidden_layers"] = 2
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="mtp_num_hidden_layers=2"):
        Config(str(model_dir), speculative_config=MTP, device="cpu")
