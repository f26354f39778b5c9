"""An engine over a model with recurrent layers (the tiny Qwen3 followed by decaying-sum layers, whose running
sums change its tokens): the core gets the runner's state slots, counts them in its concurrency and logs them;
batched requests and a request that starts from a cached prefix's state snapshot give the tokens each gives
alone without a prefix cache; on a GPU, the decode graphs (padded rows on the scratch slot) give the eager
engine's tokens."""

import logging

import pytest

from nanovllm import LLM, SamplingParams

from helpers.engine_probes import engine
from helpers.prompts import random_prompts, token_ids
from helpers.recurrent_models import with_recurrent_layers

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def record_restores(llm: LLM) -> list[tuple[int, int]]:
    """A list that fills with the state restores of every step the engine runs."""
    runner, restores = llm.client.core.executor, []
    launch_forward = runner.launch_forward
    runner.launch_forward = lambda out, *args: restores.extend(out.state_restores) or launch_forward(out, *args)
    return restores


def test_the_core_gets_the_state_slots_counts_them_in_its_concurrency_and_logs_them(qwen3_dir, monkeypatch, caplog):
    with_recurrent_layers(monkeypatch)
    caplog.set_level(logging.INFO, logger="nanovllm")
    llm = engine(qwen3_dir, max_num_seqs=4)
    core = llm.client.core
    info = llm.client.info
    # 64 blocks hold four sequences of 256 tokens, the 12 slots (three per sequence) twelve: the blocks bound it
    assert core.executor.num_state_slots == info.num_state_slots == 12
    assert core.scheduler.kv_cache.states.num_slots == 12
    assert info.max_concurrency == 4.0
    report = info.start_up
    assert report.state_cache_bytes == core.executor.state_cache.nbytes > 0
    state_lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("state cache:")]
    assert state_lines == [f"state cache: 12 slots ({report.state_cache_bytes / (1 << 20):.1f} MiB)"]
    # a budget that leaves three slots beside the 64 blocks: their three sequences bound the concurrency
    budget = 64 * core.executor.kv_cache_spec.block_bytes + 3 * core.executor.state_cache_spec.slot_bytes
    assert not [r for r in caplog.records if r.levelname == "WARNING" and "state cache holds" in r.getMessage()]
    small = engine(qwen3_dir, max_num_seqs=4, cpu_kvcache_gb=budget / (1 << 30))
    assert small.client.info.num_state_slots == 3 and small.client.info.max_concurrency == 3.0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert (
        "the state cache holds 3 recurrent-state slots, fewer than max_num_seqs=4: at most 3 sequences run at once "
        "(beyond 1, some without the snapshot that prefix caching reuses); raise cpu_kvcache_gb for more, "
        "or set max_num_seqs=3 to say so"
    ) in warnings


def test_batched_requests_give_the_tokens_each_gives_alone(qwen3_dir, monkeypatch):
    with_recurrent_layers(monkeypatch)
    prompts = random_prompts([5, 40, 17, 70], seed=11)
    alone = [token_ids(engine(qwen3_dir).generate([p], GREEDY, use_tqdm=False))[0] for p in prompts]
    batched = engine(qwen3_dir, max_num_batched_tokens=48)  # long prompts run in chunks beside decodes
    assert token_ids(batched.generate(prompts, GREEDY, use_tqdm=False)) == alone


def test_a_request_that_starts_from_a_cached_state_snapshot_gives_the_tokens_it_gives_without_one(
    qwen3_dir, monkeypatch
):
    with_recurrent_layers(monkeypatch)
    first, second, other = random_prompts([36, 20, 50], seed=12)
    shared = first[:32] + second  # the first's first two blocks, then others
    expected = token_ids(engine(qwen3_dir, enable_prefix_caching=False).generate([shared], GREEDY, use_tqdm=False))
    assert len(set(expected[0])) > 2  # the recurrent layers leave the tokens varied
    llm = engine(qwen3_dir)
    # the snapshot after the first's 32 tokens is cached; another request's state is left in the slots freed
    for prompt in (first, other):
        llm.generate([prompt], GREEDY, use_tqdm=False)
    restores = record_restores(llm)
    assert token_ids(llm.generate([shared], GREEDY, use_tqdm=False)) == expected
    assert llm.client.core.scheduler.stats().prefix_cache_hits == 32
    assert len(restores) == 1 and restores[0][0] >= 0  # its live slot began as the snapshot after 32 tokens


@pytest.mark.gpu
def test_on_a_gpu_the_decode_graphs_give_the_eager_tokens_with_a_prefix_hit(qwen3_dir, monkeypatch):
    with_recurrent_layers(monkeypatch)
    first, *prompts = random_prompts([36, 5, 40, 17], seed=13)
    prompts[1] = first[:32] + prompts[1]  # starts from the first's snapshot once the first has run

    def tokens(llm: LLM) -> list[list[int]]:
        token_ids(llm.generate([first], GREEDY, use_tqdm=False))
        return token_ids(llm.generate(prompts, GREEDY, use_tqdm=False))

    expected = tokens(engine(qwen3_dir, device="cuda", enforce_eager=True))
    llm = engine(qwen3_dir, device="cuda", max_num_seqs=8)
    runner = llm.client.core.executor
    assert runner.graphs is not None and runner.decode_buffers.scratch_state_slot == runner.num_state_slots
    replays = []
    replay = runner.graphs.replay
    runner.graphs.replay = lambda size, queries=1: replays.append(size) or replay(size, queries)
    assert tokens(llm) == expected
    assert 4 in replays  # three sequences padded to four
    llm.close()
