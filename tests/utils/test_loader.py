"""Weight loading from safetensors folders, and the errors for broken ones."""

import json
import os
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from nanovllm import LLM
from nanovllm.config import Config
from nanovllm.models import model_class
from nanovllm.utils import loader
from nanovllm.utils.loader import load_dummy_weights, load_model
from nanovllm.utils.parallel import tensor_parallel


def copy_model(src, dst):
    shutil.copytree(src, dst)
    return str(dst)


def build(model_dir, rank=0, size=1):
    config = Config(model_dir)
    with tensor_parallel(rank, size):
        return model_class(config.model_config)(config.model_config)


def rows(tensor, rank, size, dim=0):
    """Rank `rank`'s equal share of `tensor` along `dim`."""
    return tensor.chunk(size, dim)[rank]


def shard_of(whole, rank, size):
    """What rank `rank` of `size` should hold of each parameter of the unsplit model `whole`."""
    layer, embed = whole.model.layers[0], whole.model.embed_tokens.weight
    q, k, v = layer.self_attn.qkv_proj.weight.split([64, 32, 32])
    gate, up = layer.mlp.gate_up_proj.weight.chunk(2)
    return {
        "model.layers.0.self_attn.qkv_proj.weight": torch.cat([rows(t, rank, size) for t in (q, k, v)]),
        "model.layers.0.self_attn.o_proj.weight": rows(layer.self_attn.o_proj.weight, rank, size, dim=1),
        "model.layers.0.mlp.gate_up_proj.weight": torch.cat([rows(gate, rank, size), rows(up, rank, size)]),
        "model.layers.0.mlp.down_proj.weight": rows(layer.mlp.down_proj.weight, rank, size, dim=1),
        "model.layers.0.input_layernorm.weight": layer.input_layernorm.weight,
        "model.embed_tokens.weight": rows(embed, rank, size),
        "lm_head.weight": rows(whole.lm_head.weight, rank, size),
    }


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
    llm = LLM(model_dir, load_format="dummy", block_size=16, num_kvcache_blocks=8)
    weight = llm.client.core.executor.model.model.layers[0].mlp.down_proj.weight
    assert 0 < weight.abs().max() <= 1e-3
    [out] = llm.generate([[5, 6, 7]], use_tqdm=False)
    assert len(out.outputs[0].token_ids) >= 1


class CountingSafeOpen:
    """safe_open that counts the elements read through slices and refuses whole-tensor reads."""

    read = 0

    def __init__(self, *args, **kwargs):
        self.file = safe_open(*args, **kwargs)

    def __enter__(self):
        self.opened = self.file.__enter__()
        return self

    def __exit__(self, *exc):
        return self.file.__exit__(*exc)

    def keys(self):
        return self.opened.keys()

    def get_tensor(self, name):
        raise AssertionError(f"{name} was read whole")

    def get_slice(self, name):
        piece = self.opened.get_slice(name)

        class Counted:
            def __getitem__(_, index):
                tensor = piece[index]
                CountingSafeOpen.read += tensor.numel()
                return tensor

            def get_dtype(_):  # the loader checks for float8 tensors
                return piece.get_dtype()

        return Counted()


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_loads_and_reads_only_its_slices(qwen3_dir, rank, monkeypatch):
    whole = build(qwen3_dir)
    load_model(whole, qwen3_dir)
    monkeypatch.setattr(CountingSafeOpen, "read", 0)
    monkeypatch.setattr(loader, "safe_open", CountingSafeOpen)
    part = build(qwen3_dir, rank, 2)
    load_model(part, qwen3_dir)
    params = dict(part.named_parameters())
    for name, expected in shard_of(whole, rank, 2).items():
        assert torch.equal(params[name], expected), name
    # only the norms are read by both ranks
    assert CountingSafeOpen.read == sum(p.numel() for p in part.parameters())
    assert CountingSafeOpen.read < 0.55 * sum(p.numel() for p in whole.parameters())


def test_dummy_weights_are_cut_from_the_same_full_tensors(qwen3_dir):
    model_config = Config(qwen3_dir).model_config
    whole = build(qwen3_dir)
    load_dummy_weights(whole, model_config, seed=5)
    for rank in (0, 1):
        part = build(qwen3_dir, rank, 2)
        load_dummy_weights(part, model_config, seed=5)
        params = dict(part.named_parameters())
        for name, expected in shard_of(whole, rank, 2).items():
            assert torch.equal(params[name], expected), name
    other_seed = build(qwen3_dir)
    load_dummy_weights(other_seed, model_config, seed=6)
    assert not torch.equal(other_seed.lm_head.weight, whole.lm_head.weight)
