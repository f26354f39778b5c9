"""What the engine's tests on a CUDA GPU share: prompts whose lengths straddle 16-token blocks, 32 greedy tokens."""

from nanovllm import SamplingParams

from helpers.prompts import random_prompts

GPU_GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
BLOCK_EDGE_LENGTHS = (1, 15, 16, 17, 40, 100, 257)


def gpu_prompts(seed: int = 0) -> list[list[int]]:
    """One random prompt of each of BLOCK_EDGE_LENGTHS, the last of them one token past 16 full blocks."""
    return random_prompts(BLOCK_EDGE_LENGTHS, seed)
