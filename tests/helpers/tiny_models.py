"""Tiny random models saved with transformers, with a small word-level tokenizer."""

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

VOCAB_SIZE = 512
EOS_ID = 1


def save_tiny_tokenizer(path) -> None:
    """A word-level tokenizer: '<unk>', '<eos>', then 'w2' ... 'w511'."""
    vocab = {"<unk>": 0, "<eos>": EOS_ID, **{f"w{i}": i for i in range(2, VOCAB_SIZE)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<eos>")
    tokenizer.save_pretrained(path)


def tiny_config(max_positions: int = 1024) -> dict:
    """The config fields every tiny model shares: 2 layers, 4 query and 2 KV heads of 16, the tokenizer's vocabulary."""
    # A large init spread makes the logits peaked, so greedy choices are not
    # near-ties that fp32 rounding differences could flip.
    return dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=max_positions,
        initializer_range=0.1,
        eos_token_id=EOS_ID,
        bos_token_id=None,
        pad_token_id=None,
    )


def save_model(path, config_class, model_class, randomize_biases: bool = False, **fields) -> str:
    """A tiny random model of `model_class` (`tiny_config` and `fields`) in fp32 with its tokenizer; with
    `randomize_biases`, its biases drawn at random."""
    torch.manual_seed(0)
    model = model_class(config_class(**{**tiny_config(), **fields}))
    if randomize_biases:  # transformers starts biases at zero, which would hide a bias left out
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.data.normal_(0.0, 0.5)
    model.to(torch.float32).save_pretrained(path)
    save_tiny_tokenizer(path)
    return str(path)


def save_tiny_model(path, arch: str = "qwen3", tie: bool = False, seed: int = 0) -> None:
    """Save a random-init tiny model of `arch` ('qwen3' or 'llama') in fp32 with its tokenizer."""
    torch.manual_seed(seed)
    if arch == "qwen3":
        config = Qwen3Config(
            **tiny_config(), tie_word_embeddings=tie, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}
        )
        model = Qwen3ForCausalLM(config)
    else:
        config = LlamaConfig(
            **tiny_config(),
            tie_word_embeddings=tie,
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        )
        model = LlamaForCausalLM(config)
    model.to(torch.float32).save_pretrained(path)
    save_tiny_tokenizer(path)
