"""Quality of FP8 weights quantized at load (quantization="fp8") against full precision, on real weights.

The bundled SmolLM2-135M-Instruct reads a public-domain text, the Preamble and
Article I of the US Constitution (benchmarks/texts/, about 3,000 tokens), as one
prompt, teacher-forced, once with full-precision weights and once with FP8 ones,
on the same device. Prints each perplexity over the text, the share of positions
whose most likely next token is the same in both, and whether the targets are
met (perplexity within +2% of full precision, top-1 agreement >= 0.93).

    python benchmarks/fp8_weight_quality.py [--device cpu|cuda]
"""

import argparse
import math
import os
import platform

import torch

from nanovllm import LLM, SamplingParams
from nanovllm.default_model import default_model_dir

TEXT = os.path.join(os.path.dirname(__file__), "texts", "us_constitution_article_1.txt")
PERPLEXITY_TARGET = 1.02  # at most this times full precision's
AGREEMENT_TARGET = 0.93


def teacher_forced(device: str, quantization: str, text: str) -> tuple[list[int], list[float], int]:
    """The most likely next token at each position of `text` after the first, the log-probability of
    the text's own next token there, and the text's length in tokens."""
    llm = LLM(default_model_dir(), device=device, max_model_len=4096, quantization=quantization)
    prompt = llm.tokenizer.encode(text)
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    (output,) = llm.generate([prompt], params, use_tqdm=False)
    llm.close()
    positions = output.prompt_logprobs[1:]
    top = [next(t for t, lp in position.items() if lp.rank == 1) for position in positions]
    return top, [position[token].logprob for token, position in zip(prompt[1:], positions)], len(prompt)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    device = parser.parse_args().device
    with open(TEXT) as f:
        text = f.read()
    full_top, full_logprobs, num_tokens = teacher_forced(device, "auto", text)
    fp8_top, fp8_logprobs, _ = teacher_forced(device, "fp8", text)
    full_ppl = math.exp(-sum(full_logprobs) / len(full_logprobs))
    fp8_ppl = math.exp(-sum(fp8_logprobs) / len(fp8_logprobs))
    agreement = sum(a == b for a, b in zip(full_top, fp8_top)) / len(full_top)
    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({platform.processor() or platform.machine()})"
    print(f"machine: {name}, torch {torch.__version__}; SmolLM2-135M-Instruct (bfloat16 checkpoint)")
    print(f"text: Preamble and Article I of the US Constitution, {num_tokens} tokens, teacher-forced")
    print(f"perplexity: full precision {full_ppl:.4f}, fp8 weights {fp8_ppl:.4f} ({fp8_ppl / full_ppl - 1:+.2%})")
    print(f"top-1 agreement with full precision: {agreement:.4f}")
    ppl_met, agreement_met = fp8_ppl <= PERPLEXITY_TARGET * full_ppl, agreement >= AGREEMENT_TARGET
    print(
        f"targets: perplexity within +{PERPLEXITY_TARGET - 1:.0%}: {'met' if ppl_met else 'NOT met'}; "
        f"agreement >= {AGREEMENT_TARGET}: {'met' if agreement_met else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
