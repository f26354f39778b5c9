"""The overlapped step loop (on the CPU, and on a GPU where marked): step n+1 launches before step n is read
back, and nothing a user sees changes: stop tokens, stop strings, preemption, prefix hits and aborts give the
outputs of the plain loop that reads every step back before scheduling the next."""

import subprocess
import sys

import pytest

from nanovllm import LLM, SamplingParams

from helpers.engine_probes import BLOCK, engine, record_order, record_preemptions
from helpers.gpu_cases import GPU_GREEDY, gpu_prompts
from helpers.hf_reference import hf_greedy
from helpers.prompts import random_prompts, token_ids
from helpers.stepping import run_steps

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def plain_loop(llm: LLM, monkeypatch) -> LLM:
    """Make every step synchronous, as for penalties: the in-flight step is read back first."""
    monkeypatch.setattr(llm.client.core.scheduler, "needs_confirmed_tokens", lambda: True)
    return llm


def test_next_step_launches_before_the_previous_is_read_back(qwen3_dir):
    llm = engine(qwen3_dir)
    events = record_order(llm)
    llm.generate(random_prompts([5, 9]), SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    launches = [n for kind, n in events if kind == "launch"]
    assert len(launches) == 6  # the prompt step samples the first token, five decodes the rest
    for n in launches[:-1]:
        assert events.index(("launch", n + 1)) < events.index(("read", n))


def test_penalties_fall_back_to_reading_each_step_first(qwen3_dir):
    llm = engine(qwen3_dir)
    events = record_order(llm)
    params = SamplingParams(temperature=0.0, max_tokens=6, repetition_penalty=1.3, ignore_eos=True)
    llm.generate(random_prompts([5]), params, use_tqdm=False)
    for n in range(5):
        assert events.index(("read", n)) < events.index(("launch", n + 1))


def test_stop_tokens_mid_batch_leak_no_token_and_free_every_block(qwen3_dir):
    llm = engine(qwen3_dir)
    prompts = random_prompts([5, 17, 3, 30], seed=21)
    free = token_ids(llm.generate(prompts, GREEDY, use_tqdm=False))
    stops = [f[i] for f, i in zip(free, [2, 9, 0, 23])]
    outputs = llm.generate(
        prompts, [SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[s]) for s in stops], use_tqdm=False
    )
    assert token_ids(outputs) == [f[: f.index(s) + 1] for f, s in zip(free, stops)]
    assert [o.outputs[0].finish_reason for o in outputs] == ["stop"] * 4
    assert llm.client.core.scheduler.kv_cache.num_free_blocks == 64


def test_stop_strings_cut_as_in_the_plain_loop(qwen3_dir, monkeypatch):
    prompts = random_prompts([4, 11, 6], seed=22)
    free = engine(qwen3_dir).generate(prompts, GREEDY, use_tqdm=False)
    params = [
        SamplingParams(temperature=0.0, max_tokens=24, stop=" ".join(o.outputs[0].text.split()[k : k + 2]))
        for o, k in zip(free, [1, 4, 7])
    ]
    overlapped = engine(qwen3_dir).generate(prompts, params, use_tqdm=False)
    plain = plain_loop(engine(qwen3_dir), monkeypatch).generate(prompts, params, use_tqdm=False)
    assert overlapped == plain
    for out, f, p in zip(overlapped, free, params):
        free_text = f.outputs[0].text
        assert out.outputs[0].text == free_text[: free_text.index(p.stop[0])]
        assert out.outputs[0].finish_reason == "stop"


@pytest.mark.parametrize("chunked", [True, False])
def test_preemption_and_prefix_hits_give_the_plain_loops_outputs(qwen3_dir, monkeypatch, chunked):
    shared = random_prompts([3 * BLOCK], seed=23)[0]
    prompts = [shared + p for p in random_prompts([2, 9, 20, 5, 13, 1], seed=24)]
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    # admitted while prompts fit (no room kept for decoding), the requests outgrow the pool
    kwargs = dict(
        num_kvcache_blocks=14, enable_chunked_prefill=chunked, max_num_batched_tokens=256, schedule_conservativeness=0
    )
    overlapped = engine(qwen3_dir, **kwargs)
    preempted = record_preemptions(overlapped)
    plain = plain_loop(engine(qwen3_dir, **kwargs), monkeypatch)
    outputs = overlapped.generate(prompts, params, use_tqdm=False)
    assert preempted and any(o.num_cached_tokens for o in outputs)
    assert token_ids(outputs) == token_ids(plain.generate(prompts, params, use_tqdm=False))
    assert token_ids(outputs) == hf_greedy(qwen3_dir, prompts, params.max_tokens)


def test_abort_with_a_step_in_flight_drops_its_token_and_frees_its_blocks(qwen3_dir):
    llm = engine(qwen3_dir)
    kept, aborted = [llm.add_request(p, GREEDY) for p in random_prompts([6, 8], seed=25)]
    outputs = run_steps(llm, {}, steps=4)
    assert llm.client.core._in_flight is not None
    seen = len(outputs[aborted].outputs[0].token_ids)
    llm.abort(aborted)
    run_steps(llm, outputs)
    assert len(outputs[aborted].outputs[0].token_ids) == seen
    assert (
        outputs[kept].outputs[0].token_ids == hf_greedy(qwen3_dir, random_prompts([6], seed=25), GREEDY.max_tokens)[0]
    )
    assert llm.client.core.scheduler.kv_cache.num_free_blocks == 64


@pytest.mark.parametrize(
    "kwargs, name", [({}, "float32"), ({"dtype": "bfloat16"}, "bfloat16"), ({"kv_cache_dtype": "fp8"}, "fp8_e4m3")]
)
def test_info_names_the_kv_cache_dtype_start_up_chose(qwen3_dir, kwargs, name):
    llm = engine(qwen3_dir, **kwargs)
    assert llm.client.info.kv_cache_dtype == name
    assert llm.config.kv_cache_dtype == kwargs.get("kv_cache_dtype", "auto")  # the config is left as given


def test_the_engine_package_imports_without_torch():
    # the engine core and its clients load the device side only when a core starts
    code = (
        "import sys, nanovllm.engine.engine_core, nanovllm.engine.engine_client, nanovllm.engine.core_client, "
        "nanovllm.engine.core_process; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.gpu
def test_stop_tokens_mid_batch_leak_no_token_on_gpu(qwen3_dir):
    # Requests that stop at different steps while the next step is already launched:
    # each ends exactly at its stop token, and the others go on as if alone.
    llm = LLM(qwen3_dir, block_size=16, max_model_len=512)
    batch = gpu_prompts(seed=15)
    free = token_ids(llm.generate(batch, GPU_GREEDY, use_tqdm=False))
    stops = [f[i] for f, i in zip(free, [3, 7, 11, 31, 15, 1, 20])]
    params = [SamplingParams(temperature=0.0, max_tokens=32, stop_token_ids=[s]) for s in stops]
    outputs = llm.generate(batch, params, use_tqdm=False)
    assert token_ids(outputs) == [f[: f.index(s) + 1] for f, s in zip(free, stops)]
    assert all(out.outputs[0].finish_reason == "stop" for out in outputs)
    assert llm.client.core.scheduler.kv_cache.num_free_blocks == llm.client.info.num_kvcache_blocks
