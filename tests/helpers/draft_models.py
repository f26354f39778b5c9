"""Tiny draft models for a tiny target: a noisy copy of it (the same vocabulary and shape, different weights,
so that it guesses the target's next token often but not always) and config-only folders that differ from
the target's."""

import json
import os

import torch
from transformers import AutoModelForCausalLM

from helpers.tiny_models import save_tiny_tokenizer


def save_noisy_copy(target_dir: str, path: str, noise: float, seed: int = 0) -> None:
    """The target's weights, each tensor plus Gaussian noise of `noise` times its own spread."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(target_dir)
    with torch.no_grad():
        for weight in model.parameters():
            if weight.numel() > 1:
                weight.add_(torch.randn_like(weight) * noise * weight.std())
    model.save_pretrained(path)
    save_tiny_tokenizer(path)


def save_changed_config(target_dir: str, path: str, **changes) -> None:
    """The target's config.json alone, with `changes`: all that the check of a draft reads."""
    with open(os.path.join(target_dir, "config.json")) as f:
        config = json.load(f)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({**config, **changes}, f)
