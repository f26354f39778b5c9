"""Where two greedy computations that round differently may part: at near-ties of the reference's logits."""

# Two greedy computations that round differently in bf16 may pick different tokens only where
# the reference's two best logits are this close: bf16 keeps 8 significant bits, so logits
# near 2 are stored in steps of 1/64, and about 5% of the tiny models' bf16 steps are exact ties.
NEAR_TIE = 1 / 16


def gaps_where_greedy_diverges(completions: list, references: list) -> list[float]:
    """For each completion that leaves its reference's tokens, the gap between the reference's two
    best logprobs at the first differing token (both generated with logprobs >= 2)."""
    gaps = []
    for completion, reference in zip(completions, references):
        pairs = zip(completion.token_ids, reference.token_ids)
        first = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
        if first is not None:
            best = sorted((lp.logprob for lp in reference.logprobs[first].values()), reverse=True)
            gaps.append(best[0] - best[1])
    return gaps
