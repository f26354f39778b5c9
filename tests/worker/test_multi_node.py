"""Tensor parallelism over two "nodes" on one machine: node 0 in the test process (or a server), node 1 a
`nanovllm serve --headless` process, meeting on 127.0.0.1 over gloo; and the checks of the node options."""

import json
import os
import signal
import subprocess
import threading
import time

import httpx
import pytest
import torch.distributed as dist

from nanovllm import LLM, SamplingParams
from nanovllm.config import Config

from helpers.ports import free_port
from helpers.processes import alive, child_processes
from helpers.prompts import random_prompts, token_ids
from helpers.serve_command import SERVE_ENGINE_ARGS, nanovllm_command, start_server

GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
ENGINE = dict(device="cpu", block_size=16, num_kvcache_blocks=64, max_model_len=256)


def headless_node(model: str, port: int, engine: dict) -> subprocess.Popen:
    """Node 1 of two, one rank of two each, meeting node 0 at 127.0.0.1:`port`; `engine` as node 0's."""
    engine_flags = [f"--{name.replace('_', '-')}={value}" for name, value in engine.items()]
    return subprocess.Popen(
        nanovllm_command()
        + ["serve", model, "--headless", "--nnodes=2", "--node-rank=1", "--tensor-parallel-size=2"]
        + [f"--master-port={port}", "--master-addr=127.0.0.1", *engine_flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(map(alive, pids))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(tensor_parallel_size=3, nnodes=2), "tensor_parallel_size=3 must be divisible by nnodes=2"),
        (dict(tensor_parallel_size=2, nnodes=2, node_rank=2), r"node_rank must be in \[0, nnodes - 1\]"),
        (dict(nnodes=0), "nnodes must be >= 1"),
        (dict(tensor_parallel_size=2, nnodes=2), "nnodes > 1 needs a fixed master_port"),
        (dict(data_parallel_size=0), "data_parallel_size must be >= 1"),
        (dict(data_parallel_size=2, data_parallel_rank=2), r"data_parallel_rank must be in \[0, data_parallel_size"),
        (dict(tensor_parallel_size=2, nnodes=2, master_port=1234, data_parallel_size=2), "replicas on one machine"),
    ],
)
def test_node_options_are_checked(qwen3_dir, monkeypatch, options, message):
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(ValueError, match=message):
        Config(qwen3_dir, **options)


def test_ranks_are_placed_node_by_node(qwen3_dir):
    # the tiny model splits two ways at most
    node1 = Config(qwen3_dir, tensor_parallel_size=2, nnodes=2, node_rank=1, master_port=1234)
    assert (node1.ranks_per_node, list(node1.rank_range()), node1.device_index(1)) == (1, [1], 0)
    one_node = Config(qwen3_dir, tensor_parallel_size=2)
    assert (one_node.ranks_per_node, list(one_node.rank_range()), one_node.device_index(1)) == (2, [0, 1], 1)
    second_replica = Config(qwen3_dir, tensor_parallel_size=2, data_parallel_size=2, data_parallel_rank=1)
    assert [second_replica.device_index(rank) for rank in second_replica.rank_range()] == [2, 3]


def test_an_engine_on_a_node_other_than_0_is_refused(qwen3_dir):
    with pytest.raises(ValueError, match="--headless --node-rank"):
        LLM(qwen3_dir, tensor_parallel_size=2, nnodes=2, node_rank=1, master_port=1234, **ENGINE)


@pytest.mark.slow
def test_two_nodes_of_one_rank_match_one_node_of_two(qwen3_dir):
    prompts = random_prompts((1, 5, 16, 17, 40))
    one_node = LLM(qwen3_dir, tensor_parallel_size=2, **ENGINE)
    expected = token_ids(one_node.generate(prompts, GREEDY, use_tqdm=False))
    one_node.close()
    port = free_port()
    node1 = headless_node(qwen3_dir, port, ENGINE)
    try:
        llm = LLM(qwen3_dir, tensor_parallel_size=2, nnodes=2, master_port=port, **ENGINE)
        [remote] = llm.client.core.executor.remote_ranks
        assert (remote.rank, remote.node, llm.client.core.executor.processes) == (1, 1, [])
        assert token_ids(llm.generate(prompts, GREEDY, use_tqdm=False)) == expected
        llm.close()
        # node 1 ends, cleanly, with node 0's engine
        assert node1.wait(timeout=20) == 0, node1.stdout.read()
    finally:
        node1.kill()
        node1.wait()
    assert not dist.is_initialized()


@pytest.mark.slow
def test_a_killed_headless_node_fails_the_serving_nodes_requests(qwen3_dir):
    port = free_port()
    node1 = headless_node(qwen3_dir, port, {**SERVE_ENGINE_ARGS, "device": "cpu"})
    server = None
    try:
        flags = ["--tensor-parallel-size=2", "--nnodes=2", f"--master-port={port}", "--device=cpu"]
        server, url = start_server(qwen3_dir, *flags)
        answers = []

        def long_request():
            body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 200, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
                events = [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]
                answers.append(json.loads(events[-1]) if events[-1] != "[DONE]" else events[-2])

        thread = threading.Thread(target=long_request)
        thread.start()
        time.sleep(1.0)  # the request is running
        node1_ranks = child_processes(node1.pid)
        killed = time.monotonic()
        os.kill(node1.pid, signal.SIGKILL)
        thread.join(timeout=30)
        assert not thread.is_alive() and time.monotonic() - killed < 30
        assert (
            answers[0]["error"]["code"] == 500 and "failed while running this request" in answers[0]["error"]["message"]
        )
        server_processes = child_processes(server.pid)
        assert server.wait(timeout=30) != 0
        log = server.stdout.read()
        assert "tensor-parallel rank 1 on node 1" in log, log
        assert wait_gone(node1_ranks + server_processes, 15)
    finally:
        for process in (node1, server):
            if process is not None:
                process.kill()
                process.wait()
