"""Greedy completions from Hugging Face transformers: the reference for engine outputs."""

import torch
from transformers import AutoModelForCausalLM


def hf_greedy(model_dir: str, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy completion of each prompt on its own (no padding), fp32, exactly max_new_tokens each.

    End-of-sequence tokens neither stop nor get masked, which is what the
    engine's `ignore_eos=True` does (transformers' `min_new_tokens` would
    instead forbid them and change the greedy choice).
    """
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.generation_config.eos_token_id = None
    outs = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=0)
            outs.append(ids[0, len(prompt):].tolist())
    return outs
