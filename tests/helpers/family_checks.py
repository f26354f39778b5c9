"""What the model families' tests share: a tiny engine's greedy tokens, and checks of them against
transformers' on the same weights with prefix-cache hits (a second turn among them), prefill chunks,
preemption and two ranks."""

from nanovllm import LLM, SamplingParams

from helpers.engine_probes import record_preemptions
from helpers.hf_reference import hf_greedy
from helpers.prompts import random_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
ENGINE = dict(block_size=16, num_kvcache_blocks=64, max_model_len=256)


def assert_cached_prefix_matches_transformers(model_dir: str, **engine) -> None:
    """A 61-token prompt sharing three 16-token blocks with a 60-token one run first (one of them outside a
    24-token window) reads those 48 tokens from the prefix cache and gives transformers' greedy tokens."""
    first = random_prompts([60], seed=1)[0]
    second = first[:48] + random_prompts([13], seed=2)[0]
    llm = LLM(model_dir, **{**ENGINE, **engine})
    llm.generate([first], GREEDY, use_tqdm=False)
    [output] = llm.generate([second], GREEDY, use_tqdm=False)
    llm.close()
    assert output.num_cached_tokens == 48
    assert output.outputs[0].token_ids == hf_greedy(model_dir, [second], GREEDY.max_tokens)[0]


def assert_second_turn_matches_transformers(model_dir: str, **engine) -> None:
    """A second turn that resends a 40-token first turn and its 24-token greedy answer, then 5 new tokens,
    gives transformers' greedy tokens in the same engine, and reads from the prefix cache every whole block
    whose K/V the first turn computed: its prompt and answer but the answer's last token, which was sampled
    and never fed back (63 tokens, 3 blocks of 16: a fourth block cached would be one that holds no K/V
    for its last token)."""
    settings = {**ENGINE, **engine}
    prompt, follow_up = random_prompts([40, 5], seed=7)
    llm = LLM(model_dir, **settings)
    [first] = llm.generate([prompt], GREEDY, use_tqdm=False)
    answer = first.outputs[0].token_ids
    second_turn = prompt + answer + follow_up
    [second] = llm.generate([second_turn], GREEDY, use_tqdm=False)
    llm.close()
    computed = len(prompt) + len(answer) - 1
    assert second.num_cached_tokens == computed // settings["block_size"] * settings["block_size"]
    assert second.outputs[0].token_ids == hf_greedy(model_dir, [second_turn], GREEDY.max_tokens)[0]


def greedy(model_dir: str, prompts, **engine) -> list[list[int]]:
    """Each prompt's GREEDY tokens from an engine of ENGINE's size (`engine` overrides its settings)."""
    llm = LLM(model_dir, **{**ENGINE, **engine})
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    llm.close()
    return [o.outputs[0].token_ids for o in outputs]


def assert_matches_transformers(model_dir: str, prompts: list[list[int]]) -> None:
    """Greedy tokens equal transformers' with the prompts prefilled in 16-token chunks, the later two reading
    the blocks they share from the prefix cache, and at two ranks."""
    expected = hf_greedy(model_dir, prompts, GREEDY.max_tokens)
    llm = LLM(model_dir, **{**ENGINE, "max_num_batched_tokens": 16})
    llm.generate(prompts[1:2], GREEDY, use_tqdm=False)  # caches the prefix the later prompts share
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    llm.close()
    assert [o.num_cached_tokens for o in outputs] == [0, 32, 32]
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert greedy(model_dir, prompts, tensor_parallel_size=2, device="cpu") == expected


def prompts_with_a_shared_prefix() -> list[list[int]]:
    """A short prompt, then two that share their first 33 tokens (two 16-token blocks to reuse)."""
    short, shared = random_prompts([5, 33], seed=3)
    return [short, shared + [7, 8, 9], shared + [10]]


def assert_preempted_requests_match_transformers(model_dir: str, num_blocks: int = 8) -> None:
    """Requests that outgrow a pool of `num_blocks` blocks (admitted while their prompts fit, no room kept for
    decoding: with 8 blocks of one cache group, about twice the 128 tokens per layer it holds together) are
    preempted and resume with transformers' tokens. A model with a sliding and a full group splits the pool
    between them and needs more for its longest request."""
    prompts = random_prompts([20, 30, 12, 25, 18, 40], seed=3)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    tight = LLM(model_dir, **{**ENGINE, "num_kvcache_blocks": num_blocks, "schedule_conservativeness": 0})
    preempted = record_preemptions(tight)
    outputs = [o.outputs[0].token_ids for o in tight.generate(prompts, params, use_tqdm=False)]
    tight.close()
    assert preempted
    assert outputs == hf_greedy(model_dir, prompts, params.max_tokens)
