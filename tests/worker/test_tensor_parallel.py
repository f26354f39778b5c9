"""Tensor parallelism with N=2: over CPU processes (gloo) everywhere, and over two GPUs (NCCL) where
there are two (those tests are marked `gpu`)."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from multiprocessing.shared_memory import SharedMemory

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from nanovllm import LLM, SamplingParams, StructuredOutputsParams
from nanovllm.config import Config
from nanovllm.core.scheduler_output import SchedulerOutput
from nanovllm.sample.metadata import DecodeDraw
from nanovllm.worker import model_runner, tensor_parallel
from nanovllm.worker.model_runner import ModelRunner
from nanovllm.worker.rank_commands import CommandEncoder
from nanovllm.worker.tensor_parallel import channel_capacity

from helpers.near_ties import NEAR_TIE, gaps_where_greedy_diverges
from helpers.ports import free_port
from helpers.prompts import token_ids

GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
ENGINE = dict(device="cpu", block_size=16, num_kvcache_blocks=64, max_model_len=256)
needs_two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, needs_two_gpus])]


def random_prompts(seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(2, 512) for _ in range(n)] for n in (1, 5, 16, 17, 40)]


def segment_exists(name: str) -> bool:
    try:
        SharedMemory(name=name).close()
    except FileNotFoundError:
        return False
    return True


def process_gone(pid: int) -> bool:
    """True once `pid` has exited (a zombie waiting for its new parent counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_channel_holds_the_largest_step(qwen3_dir):
    # every sequence at full length is sent whole, e.g. a prefill behind a cached prefix
    config = Config(qwen3_dir, max_num_seqs=8, max_model_len=256, block_size=16)
    req_ids = [f"request-{2**63}-{i}" for i in range(8)]
    step = SchedulerOutput(
        req_ids,
        [[2**31 - 1] * 256] * 8,
        [2**31 - 1] * 8,
        [[[2**31 - 1] * 16]] * 8,  # one cache group
        [True] * 8,
        req_ids,
        [GREEDY] * 8,
        [2**31 - 1] * 8,
    )
    draw = DecodeDraw([0.1] * 8, False, 20)
    assert len(CommandEncoder().step(step, draw)) <= channel_capacity(config)


@pytest.fixture(scope="class")
def tp_qwen3(qwen3_dir):
    llm = LLM(qwen3_dir, tensor_parallel_size=2, **ENGINE)
    yield llm
    llm.close()


@pytest.mark.slow
class TestTwoRanks:
    """One N=2 engine shared by tests that only generate."""

    def test_greedy_matches_one_rank(self, qwen3_dir, tp_qwen3):
        expected = token_ids(LLM(qwen3_dir, **ENGINE).generate(random_prompts(), GREEDY, use_tqdm=False))
        assert token_ids(tp_qwen3.generate(random_prompts(), GREEDY, use_tqdm=False)) == expected

    def test_seeded_sampling_matches_one_rank(self, qwen3_dir, tp_qwen3):
        # rank 0 draws the sampling noise from this process's generator
        params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
        one = LLM(qwen3_dir, **ENGINE)
        torch.manual_seed(3)
        expected = token_ids(one.generate(random_prompts(1), params, use_tqdm=False))
        torch.manual_seed(3)
        assert token_ids(tp_qwen3.generate(random_prompts(1), params, use_tqdm=False)) == expected

    def test_a_constrained_request_beside_free_ones_matches_one_rank(self, qwen3_dir, tp_qwen3):
        # its steps launch rank 0's forward pass, read the step before back, then sample: the workers
        # must not be waited for in between
        pytest.importorskip("xgrammar")
        choice = SamplingParams(
            temperature=0.0, max_tokens=8, structured_outputs=StructuredOutputsParams(choice=["w5", "w7"])
        )
        params = [GREEDY, choice, GREEDY]
        prompts = random_prompts()[1:4]
        expected = LLM(qwen3_dir, **ENGINE).generate(prompts, params, use_tqdm=False)
        outputs = tp_qwen3.generate(prompts, params, use_tqdm=False)
        assert token_ids(outputs) == token_ids(expected)
        assert outputs[1].outputs[0].text.strip() in ("w5", "w7") and outputs[1].outputs[0].finish_reason == "stop"

    def test_a_second_split_engine_in_the_same_process_is_refused(self, qwen3_dir, tp_qwen3):
        with pytest.raises(RuntimeError, match="another engine with tensor_parallel_size > 1 is running"):
            LLM(qwen3_dir, tensor_parallel_size=2, **ENGINE)
        assert len(tp_qwen3.generate([[5]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == GREEDY.max_tokens

    def test_two_all_reduces_per_layer_and_one_gather(self, tp_qwen3, monkeypatch):
        calls = {"all_reduce": 0, "gather": 0}
        for name in calls:
            original = getattr(dist, name)

            def counting(*args, _name=name, _original=original, **kwargs):
                calls[_name] += 1
                return _original(*args, **kwargs)

            monkeypatch.setattr(dist, name, counting)
        steps = 3  # one prefill, two decodes
        tp_qwen3.generate(
            [[5, 6, 7], [8]], SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True), use_tqdm=False
        )
        layers = tp_qwen3.config.model_config.num_hidden_layers
        # per step: the embedding's, then attention's and the MLP's in every layer
        assert calls == {"all_reduce": steps * (2 * layers + 1), "gather": steps}


SLOW_STEP_S = 0.5


def run_slow_worker(config, rank, host, port, channel):
    """A worker that rests `SLOW_STEP_S` after each step, once its part in the step's collectives is over."""
    run_step = ModelRunner.run_step

    def run_step_then_rest(self, *args):
        run_step(self, *args)
        time.sleep(SLOW_STEP_S)

    ModelRunner.run_step = run_step_then_rest
    tensor_parallel.run_worker(config, rank, host, port, channel)


def run_worker_drawing_in_step(config, rank, host, port, channel):
    """A worker whose decode steps draw among its slice of the vocabulary on the CPU too (the Triton
    interpreter runs the sampling kernels), as on CUDA."""
    model_runner.ranks_draw_in_step = lambda device: True
    tensor_parallel.run_worker(config, rank, host, port, channel)


def two_ranks_drawing_in_step(model_dir, monkeypatch, **engine) -> LLM:
    """An engine of two CPU ranks that draw in the decode step, as CUDA ranks do."""
    monkeypatch.setattr(model_runner, "ranks_draw_in_step", lambda device: True)
    monkeypatch.setattr(tensor_parallel, "run_worker", run_worker_drawing_in_step)
    return LLM(model_dir, tensor_parallel_size=2, **ENGINE, **engine)


def test_ranks_that_draw_in_the_decode_step_match_one_rank(qwen3_dir, monkeypatch):
    # the CUDA path on the CPU: rank 0 sends how each step draws, every rank draws greedy rows itself, and
    # rank 0 gathers the logits for logprobs and for the full sampler (then sends its ids)
    pytest.importorskip("triton")
    cases = [
        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=8, ignore_eos=True),
    ]
    one = LLM(qwen3_dir, **ENGINE)
    expected = [one.generate(random_prompts(), params, use_tqdm=False) for params in cases]
    two = two_ranks_drawing_in_step(qwen3_dir, monkeypatch)
    try:
        assert two.client.core.executor.runner._decode_step.vocab_slice == (0, two.config.model_config.vocab_size)
        got = [two.generate(random_prompts(), params, use_tqdm=False) for params in cases]
    finally:
        two.close()
    assert [token_ids(outputs) for outputs in got] == [token_ids(outputs) for outputs in expected]
    for a, b in zip(got[1], expected[1]):
        for step_a, step_b in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            assert step_a.keys() == step_b.keys()
            for token_id in step_a:
                assert step_a[token_id].logprob == pytest.approx(step_b[token_id].logprob, abs=1e-4)


def test_ranks_that_draw_in_the_decode_step_check_drafts_as_one_rank(qwen3_dir, monkeypatch):
    # verify steps: every rank samples its queries and checks the n-gram drafts inside the decode step
    pytest.importorskip("triton")
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = [[7, 8, 9, 7, 8, 9, 7, 8], [5] * 12, random_prompts()[2]]
    expected = token_ids(LLM(qwen3_dir, **ENGINE).generate(prompts, params, use_tqdm=False))
    two = two_ranks_drawing_in_step(qwen3_dir, monkeypatch, speculative_config=ngram)
    try:
        drafted = []
        two.client.core.executor.runner.launch_forward = recording_drafts(
            two.client.core.executor.runner.launch_forward, drafted
        )
        assert token_ids(two.generate(prompts, params, use_tqdm=False)) == expected
    finally:
        two.close()
    assert any(drafted), "no step had drafts"


def recording_drafts(launch_forward, drafted: list):
    """`launch_forward` that notes whether each decode step it launches has drafts."""

    def launch(out, *args, **kwargs):
        if out.is_decode:
            drafted.append(out.draft_token_ids is not None)
        return launch_forward(out, *args, **kwargs)

    return launch


@pytest.mark.slow
def test_rank_0_does_not_wait_for_a_slow_worker(qwen3_dir, monkeypatch):
    # Over gloo a rank's collectives block until every rank joins them, so rank 0 can be at most a step
    # ahead: it finishes each step while the worker still rests after it, where it used to wait for that.
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    expected = token_ids(LLM(qwen3_dir, **ENGINE).generate(random_prompts(), params, use_tqdm=False))
    monkeypatch.setattr(tensor_parallel, "run_worker", run_slow_worker)
    llm = LLM(qwen3_dir, tensor_parallel_size=2, **ENGINE)
    try:
        executor = llm.client.core.executor
        launch_sampling, sampling_seconds = executor.launch_sampling, []

        def timed_launch_sampling(*args):
            start = time.monotonic()
            pending = launch_sampling(*args)
            sampling_seconds.append(time.monotonic() - start)
            return pending

        executor.launch_sampling = timed_launch_sampling
        outputs = llm.generate(random_prompts(), params, use_tqdm=False)
        marks = executor.channel.marks(0)
        start = time.monotonic()
        executor.synchronize()
        caught_up = time.monotonic() - start
        assert token_ids(outputs) == expected
        assert len(sampling_seconds) >= params.max_tokens and max(sampling_seconds) < SLOW_STEP_S / 2
        # rank 0 has every output while the worker still rests after the last step, which synchronize waits for
        assert executor.channel.marks(0) == marks + 1 and SLOW_STEP_S / 4 < caught_up < 2 * SLOW_STEP_S
    finally:
        llm.close()


@pytest.mark.slow
def test_preempted_requests_match_one_rank(qwen3_dir):
    # the workers hold the block tables of the step before and get only what changed: every request is
    # admitted, then some are preempted, leave the steps and come back with tables sent whole (without the
    # prefix cache, of blocks taken afresh)
    engine = {**ENGINE, "num_kvcache_blocks": 8, "schedule_conservativeness": 0.0, "enable_prefix_caching": False}
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    one = LLM(qwen3_dir, **engine)
    expected = token_ids(one.generate(random_prompts(), params, use_tqdm=False))
    assert one.client.core.scheduler.num_preemptions > 0
    two = LLM(qwen3_dir, tensor_parallel_size=2, **engine)
    try:
        assert token_ids(two.generate(random_prompts(), params, use_tqdm=False)) == expected
        assert two.client.core.scheduler.num_preemptions > 0
    finally:
        two.close()


@pytest.mark.slow
def test_llama_with_explicit_port_matches_one_rank(llama_dir):
    port = free_port()
    expected = token_ids(LLM(llama_dir, **ENGINE).generate(random_prompts(2), GREEDY, use_tqdm=False))
    llm = LLM(llama_dir, tensor_parallel_size=2, master_port=port, **ENGINE)
    try:
        assert llm.client.core.executor.port == port
        assert token_ids(llm.generate(random_prompts(2), GREEDY, use_tqdm=False)) == expected
    finally:
        llm.close()


@pytest.mark.slow
def test_deleting_the_engine_stops_workers_and_frees_shared_memory(qwen3_dir):
    llm = LLM(qwen3_dir, tensor_parallel_size=2, **ENGINE)
    llm.generate([[5, 6]], GREEDY, use_tqdm=False)
    runner = llm.client.core.executor
    processes, segment = runner.processes, runner.channel.name
    del runner
    assert all(p.is_alive() for p in processes) and segment_exists(segment)
    del llm
    assert [p.exitcode for p in processes] == [0]
    assert not segment_exists(segment)
    assert not dist.is_initialized()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.slow
def test_killed_worker_is_an_error_within_seconds(qwen3_dir, device):
    llm = LLM(qwen3_dir, tensor_parallel_size=2, **{**ENGINE, "device": device})
    worker = llm.client.core.executor.processes[0]
    segment = llm.client.core.executor.channel.name
    scheduler = llm.client.core.scheduler
    original, steps = scheduler.update, []

    def kill_after_three_steps(*args):
        outputs = original(*args)
        steps.append(1)
        if len(steps) == 3:
            os.kill(worker.pid, signal.SIGKILL)
        return outputs

    scheduler.update = kill_after_three_steps
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"worker 1 \(pid \d+\) exited unexpectedly with code -9"):
        llm.generate(random_prompts(), SamplingParams(temperature=0, max_tokens=200, ignore_eos=True), use_tqdm=False)
    assert time.monotonic() - start < 10
    assert not segment_exists(segment) and not dist.is_initialized()
    with pytest.raises(RuntimeError, match="shut down"):
        llm.generate([[5]], GREEDY, use_tqdm=False)


@pytest.mark.slow
def test_worker_error_is_reported_with_its_message(qwen3_dir, tmp_path):
    # rows 0..255 of the embedding (rank 0's half) exist, rank 1's half is cut short
    model_dir = str(shutil.copytree(qwen3_dir, tmp_path / "m"))
    path = os.path.join(model_dir, "model.safetensors")
    tensors = load_file(path)
    tensors["model.embed_tokens.weight"] = tensors["model.embed_tokens.weight"][:300].clone()
    save_file(tensors, path)
    with pytest.raises(RuntimeError, match=r"worker 1 failed: RuntimeError: .*size of tensor"):
        LLM(model_dir, tensor_parallel_size=2, **ENGINE)
    assert not dist.is_initialized()


@pytest.mark.gpu
@needs_two_gpus
@pytest.mark.whole_gpu
def test_two_gpus_match_one_on_a_dummy_qwen3_06b_in_fp32(qwen3_06b_shape_dir):
    rng = random.Random(0)
    prompts = [[rng.randrange(10000) for _ in range(n)] for n in (1, 17, 100, 300, 700)]
    engine = dict(
        device="cuda",
        load_format="dummy",
        dtype="float32",
        skip_tokenizer_init=True,
        max_model_len=1024,
        gpu_memory_utilization=0.5,
    )
    settings = dict(max_tokens=32, ignore_eos=True)
    cases = [
        (prompts, SamplingParams(temperature=0.0, **settings)),
        # a sequence alone: one row, whose products sum over the ranks themselves
        (prompts[3:4], SamplingParams(temperature=0.0, **settings)),
        # drawn in the decode step, every rank among its slice of the vocabulary
        (prompts, SamplingParams(temperature=0.8, **settings)),
        # the same draw, then logprobs from the logits gathered to rank 0
        (prompts[:2], SamplingParams(temperature=0.8, logprobs=2, **settings)),
        # the full sampler on rank 0, which sends the ids to the other rank
        (prompts, SamplingParams(temperature=0.8, top_p=0.9, seed=5, **settings)),
    ]
    one = LLM(qwen3_06b_shape_dir, **engine)
    expected = [token_ids(one.generate(batch, params, use_tqdm=False)) for batch, params in cases]
    del one
    torch.cuda.empty_cache()
    two = LLM(qwen3_06b_shape_dir, tensor_parallel_size=2, **engine)
    try:
        assert [token_ids(two.generate(batch, params, use_tqdm=False)) for batch, params in cases] == expected
    finally:
        two.close()


@pytest.mark.gpu
@needs_two_gpus
def test_two_gpus_match_one_in_bf16_but_at_near_ties(qwen3_dir, capsys):
    # the all-reduce sums the ranks' bf16 partial products in another order than one rank's matmul
    batch = [p for seed in range(4) for p in random_prompts(seed)][:16]
    engine = dict(device="cuda", dtype="bfloat16", block_size=16, max_model_len=256)
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, logprobs=2)
    expected = [o.outputs[0] for o in LLM(qwen3_dir, **engine).generate(batch, params, use_tqdm=False)]
    two = LLM(qwen3_dir, tensor_parallel_size=2, **engine)
    try:
        got = [o.outputs[0] for o in two.generate(batch, params, use_tqdm=False)]
    finally:
        two.close()
    gaps = gaps_where_greedy_diverges(got, expected)
    with capsys.disabled():
        print(
            f"\nbf16, two GPUs vs one: {16 - len(gaps)}/16 prompts equal for all {params.max_tokens} tokens; "
            f"top-2 logprob gaps where the others diverge: {[round(g, 4) for g in gaps]}"
        )
    assert all(gap <= NEAR_TIE for gap in gaps)


_ORPHANED_ENGINE = """
import json, sys, time
from nanovllm import LLM
if __name__ == "__main__":
    llm = LLM(sys.argv[1], tensor_parallel_size=2, device="cpu", block_size=16, num_kvcache_blocks=8,
              max_model_len=64)
    runner = llm.client.core.executor
    print(json.dumps({"pids": [p.pid for p in runner.processes], "segment": runner.channel.name,
                      "port": runner.port}), flush=True)
    time.sleep(600)
"""


@pytest.mark.slow
def test_two_engines_side_by_side_and_workers_exit_with_their_killed_caller(qwen3_dir, tmp_path):
    script = tmp_path / "engine.py"
    script.write_text(_ORPHANED_ENGINE)
    caller = subprocess.Popen([sys.executable, str(script), qwen3_dir], stdout=subprocess.PIPE, text=True)
    try:
        other = json.loads(caller.stdout.readline())
        # a second engine on the same host meets at its own port and segment
        llm = LLM(qwen3_dir, tensor_parallel_size=2, **ENGINE)
        runner = llm.client.core.executor
        assert (runner.port, runner.channel.name) != (other["port"], other["segment"])
        assert len(llm.generate([[5, 6]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == GREEDY.max_tokens
        llm.close()
    finally:
        caller.kill()
        caller.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (
        all(map(process_gone, other["pids"])) and not segment_exists(other["segment"])
    ):
        time.sleep(0.1)
    assert all(map(process_gone, other["pids"]))
    assert not segment_exists(other["segment"])
