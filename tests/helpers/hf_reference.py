"""Hugging Face transformers on the same weights: the reference for engine outputs."""

import torch
from transformers import AutoConfig, AutoModelForCausalLM, Mxfp4Config


def _model(model_dir: str):
    # eager: transformers' sdpa attention leaves out Gemma 2's attention soft-cap
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager", **_dequantized(model_dir)
    )
    # MXFP4 experts are dequantized to bf16 whatever the dtype asked (exactly: their values fit it); the
    # experts then run in fp32 as the rest of the model does
    return model.float()


def _dequantized(model_dir: str) -> dict:
    """For an MXFP4 checkpoint, transformers' loading that dequantizes its experts, as it does on a CPU, also on
    a GPU (where it would run them in kernels fetched from the Hub)."""
    quantization = getattr(AutoConfig.from_pretrained(model_dir), "quantization_config", None) or {}
    return {"quantization_config": Mxfp4Config(dequantize=True)} if quantization.get("quant_method") == "mxfp4" else {}


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
