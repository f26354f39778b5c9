"""Hugging Face transformers on the same weights: the reference for engine outputs."""

import torch
from transformers import AutoModelForCausalLM


def _model(model_dir: str):
    # eager: transformers' sdpa attention leaves out Gemma 2's attention soft-cap
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")


def hf_generate(model_dir: str, prompts: list[list[int]], eos_token_id=None, **kwargs) -> list[list[int]]:
    """Greedy completion of each prompt on its own (no padding), fp32; `kwargs` go to generate.

    Without `eos_token_id` nothing stops early and nothing is masked, which is
    what the engine's `ignore_eos=True` does.
    """
    model = _model(model_dir)
    model.generation_config.eos_token_id = eos_token_id
    outs = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = model.generate(torch.tensor([prompt]), do_sample=False, pad_token_id=0, **kwargs)
            outs.append(ids[0, len(prompt) :].tolist())
    return outs


def hf_greedy(model_dir: str, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Exactly max_new_tokens greedy tokens per prompt."""
    return hf_generate(model_dir, prompts, max_new_tokens=max_new_tokens)


def hf_logprobs(model_dir: str, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """log_softmax of the logits that chose each completion token: [len(completion), vocab]."""
    with torch.inference_mode():
        logits = _model(model_dir)(torch.tensor([prompt + completion])).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
