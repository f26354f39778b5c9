"""Weight loading from safetensors folders, and the errors for broken ones."""

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from nanovllm import LLM
from nanovllm.config import Config
from nanovllm.models import model_class
from nanovllm.utils.loader import load_model


def copy_model(src, dst):
    shutil.copytree(src, dst)
    return str(dst)


def build(model_dir):
    config = Config(model_dir)
    return model_class(config.hf_config)(config.hf_config)


def test_fused_weights_are_the_checkpoint_tensors_stacked(qwen3_dir):
    model = build(qwen3_dir)
    load_model(model, qwen3_dir)
    ckpt = load_file(os.path.join(qwen3_dir, "model.safetensors"))
    attn = model.model.layers[1].self_attn
    prefix = "model.layers.1.self_attn."
    expected = torch.cat([ckpt[prefix + f"{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(attn.qkv_proj.weight, expected)
    mlp = model.model.layers[1].mlp
    expected = torch.cat([ckpt[f"model.layers.1.mlp.{p}_proj.weight"] for p in ("gate", "up")])
    assert torch.equal(mlp.gate_up_proj.weight, expected)
    assert torch.equal(attn.q_norm.weight, ckpt[prefix + "q_norm.weight"])


def test_weights_split_over_several_files_load(qwen3_dir, tmp_path):
    model_dir = copy_model(qwen3_dir, tmp_path / "m")
    tensors = load_file(os.path.join(model_dir, "model.safetensors"))
    os.remove(os.path.join(model_dir, "model.safetensors"))
    names = sorted(tensors)
    half = len(names) // 2
    save_file({n: tensors[n] for n in names[:half]}, os.path.join(model_dir, "part-1.safetensors"))
    save_file({n: tensors[n] for n in names[half:]}, os.path.join(model_dir, "part-2.safetensors"))
    model = build(model_dir)
    load_model(model, model_dir)
    assert torch.equal(model.model.norm.weight, tensors["model.norm.weight"])
    assert torch.equal(model.lm_head.weight, tensors["lm_head.weight"])


def test_tied_embeddings_share_one_tensor(llama_dir):
    model = build(llama_dir)
    load_model(model, llama_dir)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_no_weight_files(qwen3_dir, tmp_path):
    model_dir = copy_model(qwen3_dir, tmp_path / "m")
    os.remove(os.path.join(model_dir, "model.safetensors"))
    with pytest.raises(FileNotFoundError, match="safetensors"):
        LLM(model_dir, num_kvcache_blocks=4)


def test_missing_weight_is_named(qwen3_dir, tmp_path):
    model_dir = copy_model(qwen3_dir, tmp_path / "m")
    path = os.path.join(model_dir, "model.safetensors")
    tensors = load_file(path)
    del tensors["model.layers.0.self_attn.k_proj.weight"]
    save_file(tensors, path)
    with pytest.raises(ValueError, match=r"missing weights: model.layers.0.self_attn.qkv_proj.weight\[k\]"):
        LLM(model_dir, num_kvcache_blocks=4)


def test_unexpected_weight_is_named(qwen3_dir, tmp_path):
    model_dir = copy_model(qwen3_dir, tmp_path / "m")
    path = os.path.join(model_dir, "model.safetensors")
    tensors = load_file(path)
    tensors["model.layers.0.mystery.weight"] = torch.zeros(2)
    save_file(tensors, path)
    with pytest.raises(ValueError, match="mystery"):
        LLM(model_dir, num_kvcache_blocks=4)


def test_unsupported_architecture(qwen3_dir, tmp_path):
    model_dir = copy_model(qwen3_dir, tmp_path / "m")
    config_path = os.path.join(model_dir, "config.json")
    with open(config_path) as f:
        raw = json.load(f)
    raw["architectures"] = ["MysteryForCausalLM"]
    with open(config_path, "w") as f:
        json.dump(raw, f)
    with pytest.raises(ValueError, match="unsupported architecture.*Qwen3ForCausalLM"):
        LLM(model_dir, num_kvcache_blocks=4)


def test_missing_tokenizer(qwen3_dir, tmp_path):
    model_dir = copy_model(qwen3_dir, tmp_path / "m")
    for name in os.listdir(model_dir):
        if name.startswith(("tokenizer", "special_tokens")):
            os.remove(os.path.join(model_dir, name))
    with pytest.raises(FileNotFoundError, match="tokenizer"):
        LLM(model_dir, num_kvcache_blocks=4)


def test_dummy_format_needs_no_weights(qwen3_dir, tmp_path):
    model_dir = copy_model(qwen3_dir, tmp_path / "m")
    os.remove(os.path.join(model_dir, "model.safetensors"))
    llm = LLM(model_dir, load_format="dummy", kvcache_block_size=16, num_kvcache_blocks=8)
    weight = llm.model_runner.model.model.layers[0].mlp.down_proj.weight
    assert 0 < weight.abs().max() <= 1e-3
    [out] = llm.generate([[5, 6, 7]], use_tqdm=False)
    assert len(out["token_ids"]) >= 1
