"""The online engine: requests added while the core process runs, per-request streams, aborts, failures."""

import gc
import os
import random
import signal
import threading
import time

import pytest

from nanovllm import LLM, SamplingParams
from nanovllm.engine.engine_client import EngineDeadError
from nanovllm.frontend.online_engine import OnlineEngine

from helpers.core_steps import core_steps
from helpers.processes import child_processes

BLOCK = 16
ENGINE_ARGS = dict(block_size=BLOCK, num_kvcache_blocks=24, max_model_len=256)


def greedy(max_tokens, ignore_eos=True):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)


def random_prompts(count, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(2, 512) for _ in range(rng.randint(1, 40))] for _ in range(count)]


@pytest.fixture(scope="module")
def online(qwen3_dir):
    engine = OnlineEngine(qwen3_dir, **ENGINE_ARGS)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def slow_online(qwen3_dir):
    """Its steps take 5 ms, as on a real model, so a test can act mid-generation."""
    with core_steps(seconds=0.005):
        engine = OnlineEngine(qwen3_dir, **ENGINE_ARGS)
    yield engine
    engine.shutdown()


def wait_until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def all_blocks_free(online):
    """Whether the core, as of its last report, runs nothing and holds no KV block."""
    stats = online.stats()
    return stats.num_running == stats.num_waiting == 0 and stats.kv_cache_usage == 0.0


@pytest.mark.slow
def test_requests_from_many_threads_match_offline_generate(qwen3_dir, online):
    prompts = random_prompts(12)
    # 24 blocks cannot hold all of them at once: preemption happens on the way
    params = [greedy(8 + 3 * i) for i in range(len(prompts))]
    expected = LLM(qwen3_dir, **ENGINE_ARGS).generate(prompts, params, use_tqdm=False)
    results = [None] * len(prompts)

    def client(i):
        time.sleep(0.005 * i)  # arrive while earlier requests are running
        outputs = list(online.add_request(prompts[i], params[i]))
        results[i] = outputs

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for outputs, want in zip(results, expected):
        assert [t for o in outputs for t in o.outputs[0].token_ids] == want.outputs[0].token_ids
        assert "".join(o.outputs[0].text for o in outputs) == want.outputs[0].text
        assert [o.outputs[0].finish_reason for o in outputs] == [None] * (len(outputs) - 1) + ["length"]
        assert [o.finished for o in outputs] == [False] * (len(outputs) - 1) + [True]
    wait_until(lambda: all_blocks_free(online))


def test_stop_token_finishes_with_stop(online):
    params = SamplingParams(temperature=0.0, max_tokens=10, stop_token_ids=list(range(512)))
    outputs = list(online.add_request([5, 6, 7], params))
    [completion] = [o.outputs[0] for o in outputs]
    assert completion.finish_reason == "stop" and len(completion.token_ids) == 1 and completion.text == ""


def test_stop_string_is_held_back_and_cut(qwen3_dir, online):
    [full] = LLM(qwen3_dir, **ENGINE_ARGS).generate([[5, 6, 7]], greedy(12), use_tqdm=False)
    words = full.outputs[0].text.split()
    stop = " ".join(words[4:6])
    params = SamplingParams(temperature=0.0, max_tokens=12, stop=stop)
    outputs = list(online.add_request([5, 6, 7], params))
    assert outputs[-1].outputs[0].finish_reason == "stop"
    text = full.outputs[0].text
    assert "".join(o.outputs[0].text for o in outputs) == text[: text.index(stop)]


@pytest.mark.slow
def test_abort_running_request_frees_its_blocks(slow_online):
    stream = slow_online.add_request([5, 6, 7], greedy(240))
    outputs = iter(stream)
    first = next(outputs)
    assert first.outputs[0].token_ids and not first.finished
    wait_until(lambda: slow_online.stats().kv_cache_usage > 0)
    slow_online.abort(stream.request_id)
    rest = list(outputs)
    assert rest[-1].outputs[0].finish_reason == "abort"
    assert sum(len(o.outputs[0].token_ids) for o in [first, *rest]) < 240
    wait_until(lambda: all_blocks_free(slow_online))


@pytest.mark.slow
def test_abort_waiting_request(slow_online):
    # each needs 13 of the 24 blocks, so the second waits for the first
    running = slow_online.add_request([5] * 200, greedy(8))
    waiting = slow_online.add_request([7] * 200, greedy(8))
    # the core reports its load after each step: wait for the step after the second request arrived
    wait_until(lambda: slow_online.stats().num_running == 1 and slow_online.stats().num_waiting == 1)
    assert slow_online.stats().num_waiting == 1
    slow_online.abort(waiting.request_id)
    [output] = list(waiting)
    assert output.outputs[0].finish_reason == "abort" and output.outputs[0].token_ids == []
    assert list(running)[-1].outputs[0].finish_reason == "length"


def test_bad_request_raises_in_caller_and_others_go_on(online):
    good = online.add_request([5, 6, 7], greedy(30))
    with pytest.raises(ValueError, match="max_model_len"):
        online.add_request([5] * 300, greedy(4))
    with pytest.raises(ValueError, match="empty"):
        online.add_request([], greedy(4))
    assert sum(len(o.outputs[0].token_ids) for o in good) == 30


@pytest.mark.slow
def test_failed_step_ends_live_requests_with_error_and_the_engine_is_dead(qwen3_dir):
    with core_steps(seconds=0.0, failing_call=3):
        engine = OnlineEngine(qwen3_dir, **ENGINE_ARGS)
    try:
        victim = list(engine.add_request([5, 6, 7], greedy(50)))
        assert victim[-1].outputs[0].finish_reason == "error"
        wait_until(lambda: engine.failure is not None)
        assert "simulated failure" in engine.failure and not engine.healthy
        with pytest.raises(EngineDeadError, match="simulated failure"):
            engine.add_request([5, 6, 7], greedy(5))
        assert engine.client.process.exitcode == 1
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_killed_core_ends_live_requests_with_error(qwen3_dir):
    with core_steps(seconds=0.005):
        engine = OnlineEngine(qwen3_dir, **ENGINE_ARGS)
    try:
        outputs = iter(engine.add_request([5, 6, 7], greedy(240)))
        next(outputs)
        engine.client.process.kill()
        assert list(outputs)[-1].outputs[0].finish_reason == "error"
        assert "exited unexpectedly" in engine.failure and not engine.healthy
    finally:
        engine.shutdown()
    # the dead engine, caught in a reference cycle (as one a traceback holds is), is collected without
    # waiting: a ZMQ context collected while a socket of it is still open waits for that socket forever
    # (this hung the next engine's start-up)
    cycle = [engine]
    cycle.append(cycle)
    del engine, outputs, cycle
    collector = threading.Thread(target=gc.collect, daemon=True)
    collector.start()
    collector.join(60)
    assert not collector.is_alive(), "collecting the dead engine hangs"


@pytest.mark.slow
def test_a_worker_killed_while_idle_makes_the_engine_dead_within_seconds(qwen3_dir):
    engine = OnlineEngine(qwen3_dir, tensor_parallel_size=2, **ENGINE_ARGS)
    try:
        [worker] = child_processes(engine.client.process.pid)  # the core's one tensor-parallel worker
        os.kill(worker, signal.SIGKILL)
        start = time.monotonic()
        wait_until(lambda: engine.failure is not None)
        assert time.monotonic() - start < 5 and not engine.healthy
        assert "worker 1" in engine.failure and "exited unexpectedly with code -9" in engine.failure
        engine.client.process.join(10)
        assert engine.client.process.exitcode == 1
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_shutdown_aborts_unfinished_requests(qwen3_dir):
    online = OnlineEngine(qwen3_dir, **ENGINE_ARGS)
    stream = online.add_request([5, 6, 7], greedy(240))
    online.shutdown()
    assert list(stream)[-1].outputs[0].finish_reason == "abort"
    with pytest.raises(EngineDeadError, match="shutting down"):
        online.add_request([5], greedy(1))
    assert not online.client.process.is_alive()
