"""Random token-id prompts for the tiny models, and the token ids engines return for them."""

import random


def random_prompts(lengths, seed: int = 0) -> list[list[int]]:
    """One prompt of each length in `lengths`, of ids drawn from the tiny models' words (2 ... 511)."""
    rng = random.Random(seed)
    return [[rng.randrange(2, 512) for _ in range(n)] for n in lengths]


def token_ids(outputs) -> list[list[int]]:
    """The first completion's token ids of each RequestOutput."""
    return [o.outputs[0].token_ids for o in outputs]


def repetitive_prompts(lengths: list[int], seed: int) -> list[list[int]]:
    """Prompts of mixed lengths that repeat a short phrase of their own, so that n-grams recur."""
    rng = random.Random(seed)
    prompts = []
    for n in lengths:
        phrase = [rng.randrange(2, 512) for _ in range(rng.randrange(2, 6))]
        prompts.append([rng.randrange(2, 512) for _ in range(n % 4)] + (phrase * n)[:n])
    return prompts
