"""Data parallelism: two engine replicas, each a core process with its own KV cache, behind one online
engine on the tiny model."""

import os
import threading

import pytest

from nanovllm import LLM, SamplingParams
from nanovllm.config import Config
from nanovllm.engine.data_parallel_client import DataParallelClient, combined_stats, replica_config
from nanovllm.engine.messages import EngineStats
from nanovllm.frontend.online_engine import OnlineEngine

from helpers.processes import child_processes
from helpers.prompts import random_prompts, token_ids

ENGINE = dict(device="cpu", block_size=16, num_kvcache_blocks=24, max_model_len=256)
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def test_stats_are_summed_and_the_cache_use_averaged():
    one = EngineStats(1, 2, 0.5, 10, 4, 1, spec_decode_num_accepted_tokens_per_pos=[3, 1])
    two = EngineStats(3, 0, 0.25, 6, 6, 0, spec_decode_num_accepted_tokens_per_pos=[2, 2])
    assert combined_stats([one, two]) == EngineStats(
        4, 2, 0.375, 16, 10, 1, spec_decode_num_accepted_tokens_per_pos=[5, 3]
    )


def test_each_replica_gets_its_own_gpus_and_port(qwen3_dir):
    config = Config(qwen3_dir, tensor_parallel_size=2, data_parallel_size=2, master_port=29600)
    second = replica_config(config, 1)
    assert (second.data_parallel_rank, second.master_port, [second.device_index(r) for r in (0, 1)]) == (
        1,
        29601,
        [2, 3],
    )
    assert replica_config(Config(qwen3_dir, data_parallel_size=2), 1).master_port == 0  # each takes a free one


@pytest.mark.slow
def test_concurrent_requests_spread_over_two_replicas_and_match_one(qwen3_dir):
    prompts = random_prompts((3, 9, 17, 30, 5, 12))
    expected = token_ids(LLM(qwen3_dir, **ENGINE).generate(prompts, GREEDY, use_tqdm=False))
    online = OnlineEngine(qwen3_dir, data_parallel_size=2, **ENGINE)
    try:
        client = online.client
        assert isinstance(client, DataParallelClient)
        cores = [replica.process.pid for replica in client.replicas]
        assert len(set(cores)) == 2
        results = [None] * len(prompts)

        def run(i):
            results[i] = [t for output in online.add_request(prompts[i], GREEDY) for t in output.outputs[0].token_ids]

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert results == expected
        assert sum(client.requests_sent) == len(prompts) and min(client.requests_sent) >= 2
        stats = online.stats()
        assert stats.num_running == stats.num_waiting == 0
        assert stats.prefix_cache_queries > 0
    finally:
        online.shutdown()
    assert not set(cores) & set(child_processes(os.getpid()))
