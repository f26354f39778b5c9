"""The OpenAI-compatible server: a real uvicorn server on 127.0.0.1, driven by the `openai` client."""

import asyncio
import json
import logging
import random
import time

import httpx
import openai
import pytest

from nanovllm import LLM, SamplingParams
from nanovllm.entrypoints.api_server import ServerSettings
from nanovllm.frontend.chat import load_chat_template

from helpers.api_servers import BLOCK, ENGINE_ARGS, MODEL, RunningServer, error_of, wait_until

KEY = "sesame"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def model_dir(chat_model_dir):
    return chat_model_dir


@pytest.fixture(scope="module")
def server(model_dir):
    running = RunningServer(model_dir, ServerSettings(MODEL), step_seconds=0.005)
    yield running
    running.close()


@pytest.fixture(scope="module")
def offline(model_dir):
    return LLM(model_dir, **ENGINE_ARGS)


def greedy_text(offline, prompt, max_tokens):
    [out] = offline.generate([prompt], SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False)
    return out


def test_completion_matches_offline_greedy_and_stream_matches_it(server, offline):
    client = server.client()
    want = greedy_text(offline, "w5 w6 w7", 12)
    response = client.completions.create(model=MODEL, prompt="w5 w6 w7", max_tokens=12, temperature=0)
    [choice] = response.choices
    assert choice.text == want.outputs[0].text
    assert choice.finish_reason == ("length" if len(want.outputs[0].token_ids) == 12 else "stop")
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (3, len(want.outputs[0].token_ids))
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="w5 w6 w7",
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert len([c for c in chunks if c.choices]) > 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert chunks[-1].usage.completion_tokens == response.usage.completion_tokens


def test_stop_string_cuts_the_text_streamed_or_not(server, offline):
    client = server.client()
    full = greedy_text(offline, "w5 w6 w7", 12).outputs[0].text
    stop = " ".join(full.split()[3:5])
    want = full[: full.index(stop)]
    response = client.completions.create(model=MODEL, prompt="w5 w6 w7", max_tokens=12, temperature=0, stop=stop)
    assert (response.choices[0].text, response.choices[0].finish_reason) == (want, "stop")
    chunks = list(
        client.completions.create(
            model=MODEL, prompt="w5 w6 w7", max_tokens=12, temperature=0, stop=[stop, "w999"], stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == want and chunks[-1].choices[0].finish_reason == "stop"


def test_completion_takes_token_ids(server, offline):
    want = greedy_text(offline, [9, 8, 7, 6], 10)
    response = server.client().completions.create(model=MODEL, prompt=[9, 8, 7, 6], max_tokens=10, temperature=0)
    assert response.choices[0].text == want.outputs[0].text


def test_chat_uses_template_and_stream_matches(server, offline):
    client = server.client()
    messages = [
        {"role": "system", "content": "w20"},
        {"role": "user", "content": [{"type": "text", "text": "w5 "}, {"type": "text", "text": "w6"}]},
    ]
    # the template renders 'w20 w5 w6 w3'
    want = greedy_text(offline, [20, 5, 6, 3], 10)
    response = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0)
    message = response.choices[0].message
    assert message.role == "assistant" and message.content == want.outputs[0].text
    assert response.usage.prompt_tokens == 4
    chunks = list(
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0, stream=True)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == message.content
    assert chunks[-1].choices[0].finish_reason == response.choices[0].finish_reason


@pytest.mark.slow
def test_64_concurrent_streams_each_match_their_plain_answer_and_offline_generate(server, offline):
    rng = random.Random(1)
    prompts = [[rng.randrange(2, 512) for _ in range(rng.randint(1, 30))] for _ in range(64)]
    # half as text, so the server tokenizes while the engine thread detokenizes
    prompts = [" ".join(f"w{t}" for t in p) if i % 2 else p for i, p in enumerate(prompts)]
    lengths = [rng.randint(4, 24) for _ in prompts]
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in lengths]
    want = [o.outputs[0].text for o in offline.generate(prompts, params, use_tqdm=False)]

    async def streamed(client, prompt, max_tokens):
        stream = await client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True
        )
        return "".join([chunk.choices[0].text async for chunk in stream])

    async def plain(client, prompt, max_tokens):
        response = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0)
        return response.choices[0].text

    async def all_of_them():
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client:
            return await asyncio.gather(
                *(way(client, p, n) for way in (streamed, plain) for p, n in zip(prompts, lengths))
            )

    texts = asyncio.run(all_of_them())
    assert texts[:64] == texts[64:] == want


def test_disconnect_mid_stream_cancels_and_frees_blocks(server):
    aborted_before = server.metric("nanovllm:request_success_total", finished_reason="abort")
    generated_before = server.metric("nanovllm:generation_tokens_total")
    body = {"model": MODEL, "prompt": "w5 w6", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        wait_until(lambda: server.online.stats().kv_cache_usage > 0)
    wait_until(lambda: server.online.stats().num_running == 0)
    assert server.metric("nanovllm:request_success_total", finished_reason="abort") == aborted_before + 1
    assert server.metric("nanovllm:generation_tokens_total") - generated_before < 1000
    assert server.metric("nanovllm:kv_cache_usage_perc") == 0.0


def test_metrics_count_tokens_and_latencies(server):
    prompt_before = server.metric("nanovllm:prompt_tokens_total")
    generated_before = server.metric("nanovllm:generation_tokens_total")
    ttft_before = server.metric("nanovllm:time_to_first_token_seconds_count")
    server.client().completions.create(
        model=MODEL, prompt="w5 w6 w7", max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
    )
    assert server.metric("nanovllm:prompt_tokens_total") == prompt_before + 3
    assert server.metric("nanovllm:generation_tokens_total") == generated_before + 6
    assert server.metric("nanovllm:time_to_first_token_seconds_count") == ttft_before + 1
    assert server.metric("nanovllm:inter_token_latency_seconds_count") >= 5
    for gauge in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert server.metric(f"nanovllm:{gauge}") == 0.0


def test_models_and_health(server):
    assert [m.id for m in server.client().models.list()] == [MODEL]
    assert httpx.get(f"{server.url}/health").status_code == 200


@pytest.mark.parametrize(
    "body, message",
    [
        ({"model": MODEL, "prompt": "w5 " * 1100}, "max_model_len"),
        ({"model": MODEL, "prompt": ""}, "empty"),
        ({"model": MODEL, "prompt": [70000]}, "outside the vocabulary"),
        ({"model": MODEL, "prompt": ["w5", "w6 \ud800"]}, "lone surrogate"),
        ({"model": MODEL, "prompt": "w5", "temperature": -1}, "temperature"),
        ({"model": MODEL, "prompt": "w5", "max_tokens": 0}, "max_tokens"),
        ({"model": MODEL, "prompt": "w5", "max_tokens": "many"}, "max_tokens"),
        ({"model": MODEL, "prompt": "w5 w6", "max_tokens": 1_000_000_000}, "maximum context length is 1024"),
        ({"model": MODEL, "prompt": "w5 w6", "max_tokens": 1e9}, "maximum context length is 1024"),
        ({"model": MODEL, "prompt": "w5", "n": 129}, "limit of 128"),
        ({"model": MODEL, "prompt": "w5", "n": 0}, "n must be"),
        ({"model": MODEL, "prompt": "w5", "n": 3, "best_of": 2}, "best_of"),
        ({"model": MODEL, "prompt": "w5", "n": 2, "best_of": 3, "stream": True}, "streaming"),
        ({"model": MODEL, "prompt": "w5", "logprobs": 21}, "at most 20"),
        ({"model": MODEL, "prompt": "w5", "logit_bias": {"600": 1}}, "outside the vocabulary"),
        ({"model": MODEL, "prompt": "w5", "logit_bias": {"5": 1000}}, "logit_bias"),
        ({"model": MODEL, "prompt": "w5", "top_p": 0}, "top_p"),
        ({"model": MODEL, "prompt": "w5", "stop": [""]}, "stop"),
        ({"model": MODEL, "prompt": "w5", "stop": ["w6", "\ud800"]}, "a stop string is not valid Unicode"),
        ({"model": MODEL, "prompt": "w5", "suffix": "w6"}, "suffix is not supported"),
        ({"model": MODEL, "prompt": "w5", "prompt_logprobs": 1, "stream": True}, "not available when streaming"),
        ({"model": MODEL, "prompt": "w5", "prompt_logprobs": 21}, "at most 20"),
        ({"model": MODEL, "prompt": "w5", "stop_token_ids": [600]}, "outside the vocabulary"),
        ({"model": MODEL}, "prompt"),
    ],
)
def test_bad_completion_requests_get_400(server, body, message):
    # json.dumps escapes a lone surrogate as the JSON text \ud800, which httpx's own encoder refuses to send
    response = httpx.post(
        f"{server.url}/v1/completions", content=json.dumps(body), headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    error = error_of(response)
    assert error["type"] == "invalid_request_error" and message in error["message"]


def test_bad_chat_requests_get_400(server):
    client = server.client()
    with pytest.raises(openai.BadRequestError, match="conversation is empty"):
        client.chat.completions.create(model=MODEL, messages=[])
    with pytest.raises(openai.BadRequestError, match="role"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "robot", "content": "w5"}])
    with pytest.raises(openai.BadRequestError, match="assistant cannot speak first"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "assistant", "content": "w5"}])
    with pytest.raises(openai.BadRequestError, match="image_url"):
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}],
        )


def test_non_finite_numbers_get_400(server):
    body = b'{"model": "tiny", "prompt": "w5", "temperature": NaN}'
    response = httpx.post(f"{server.url}/v1/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400 and "temperature" in error_of(response)["message"]


def test_malformed_json_gets_400(server):
    response = httpx.post(
        f"{server.url}/v1/completions",
        content=b'{"model": "tiny", "prompt": ',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400 and "not valid JSON" in error_of(response)["message"]


def test_unknown_route_is_404_in_openai_shape(server):
    response = httpx.get(f"{server.url}/v1/nothing")
    assert response.status_code == 404 and error_of(response)["code"] == 404
    response = httpx.get(f"{server.url}/v1/completions")
    assert response.status_code == 405 and error_of(response)["type"] == "invalid_request_error"


@pytest.fixture(scope="module")
def keyed_server(model_dir):
    running = RunningServer(model_dir, ServerSettings(MODEL, api_key=KEY, max_waiting=1), step_seconds=0.002)
    yield running
    running.close()


@pytest.mark.slow
def test_api_key_is_required_except_for_health(keyed_server):
    with pytest.raises(openai.AuthenticationError):
        keyed_server.client().models.list()
    with pytest.raises(openai.AuthenticationError):
        keyed_server.client(api_key="wrong").completions.create(model=MODEL, prompt="w5", max_tokens=2)
    assert httpx.get(f"{keyed_server.url}/metrics").status_code == 401
    # the key is checked before the body
    response = httpx.post(f"{keyed_server.url}/v1/chat/completions", content=b"{")
    assert response.status_code == 401 and error_of(response)["type"] == "authentication_error"
    assert httpx.get(f"{keyed_server.url}/health").status_code == 200
    client = keyed_server.client(api_key=KEY)
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.completions.create(model=MODEL, prompt="w5", max_tokens=2).usage.prompt_tokens == 1
    assert keyed_server.metric("nanovllm:num_requests_running", AUTH) == 0.0


def test_full_waiting_queue_gets_503_and_bad_requests_do_not_disturb_others(keyed_server, offline):
    """A 600-token request holds most of the 64 blocks, so a second one waits; the limit is 1 waiting."""
    client = keyed_server.client(api_key=KEY)
    want = greedy_text(offline, "w5 w6 w7", 300)
    body = {"model": MODEL, "prompt": [7] * 600, "max_tokens": 300, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{keyed_server.url}/v1/completions", json=body, headers=AUTH):
        # not its first chunk: sampled tokens may have no text (a skipped special one) and hold it back
        wait_until(lambda: keyed_server.online.stats().num_running == 1)
        waiter = client.completions.create(model=MODEL, prompt=[8] * 600, max_tokens=5, stream=True)
        wait_until(lambda: keyed_server.online.stats().num_waiting == 1)
        with pytest.raises(openai.APIStatusError) as refused:
            client.completions.create(model=MODEL, prompt="w5", max_tokens=5)
        assert refused.value.status_code == 503 and "busy" in refused.value.message
        waiter.close()
    wait_until(lambda: keyed_server.online.stats().num_running == keyed_server.online.stats().num_waiting == 0)
    # after the queue drained, a long request runs to the end while bad ones are refused beside it
    stream = client.completions.create(model=MODEL, prompt="w5 w6 w7", max_tokens=300, temperature=0, stream=True)
    for bad in ({"model": MODEL, "prompt": "w5", "temperature": "hot"}, {"model": MODEL, "prompt": [-1]}):
        assert httpx.post(f"{keyed_server.url}/v1/completions", json=bad, headers=AUTH).status_code == 400
    assert "".join(c.choices[0].text for c in stream) == want.outputs[0].text


def test_client_that_gives_up_on_a_plain_request_cancels_it(server):
    aborted_before = server.metric("nanovllm:request_success_total", finished_reason="abort")
    body = {"model": MODEL, "prompt": "w5 w6", "max_tokens": 1000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=0.3)
    wait_until(lambda: server.metric("nanovllm:request_success_total", finished_reason="abort") == aborted_before + 1)
    wait_until(lambda: server.online.stats().num_running == 0)
    assert server.online.stats().kv_cache_usage == 0.0


@pytest.mark.slow
def test_engine_failure_is_a_500_then_health_and_new_requests_are_503(model_dir):
    failing = RunningServer(model_dir, ServerSettings(MODEL), failing_step=3)
    try:
        response = httpx.post(f"{failing.url}/v1/completions", json={"model": MODEL, "prompt": "w5", "max_tokens": 8})
        assert response.status_code == 500 and error_of(response)["type"] == "server_error"
        wait_until(lambda: httpx.get(f"{failing.url}/health").status_code == 503, timeout=5)
        with pytest.raises(openai.APIStatusError) as refused:
            failing.client().completions.create(model=MODEL, prompt="w5", max_tokens=2)
        assert refused.value.status_code == 503 and "simulated failure" in refused.value.message
    finally:
        failing.close()


@pytest.mark.slow
def test_a_burst_the_engine_can_run_at_once_is_not_refused_as_waiting(model_dir):
    # requests in flight to the core are not waiting yet: only those it holds without running them count
    burst = RunningServer(model_dir, ServerSettings(MODEL, max_waiting=2), step_seconds=0.005, max_num_seqs=8)
    try:

        async def all_at_once():
            async with openai.AsyncOpenAI(base_url=f"{burst.url}/v1", api_key="unused", max_retries=0) as client:
                return await asyncio.gather(
                    *(client.completions.create(model=MODEL, prompt=[5 + i], max_tokens=4) for i in range(8))
                )

        assert all(response.usage.completion_tokens > 0 for response in asyncio.run(all_at_once()))
    finally:
        burst.close()


@pytest.mark.slow
def test_a_10_mb_body_is_refused_at_once_while_32_streams_go_on(server):
    body = {"model": MODEL, "prompt": [5, 6], "max_tokens": 150, "ignore_eos": True, "stream": True}
    huge = json.dumps({"model": MODEL, "prompt": "w5 " * 3_500_000}).encode()  # 10.5 MB
    gaps, ends, finish_reasons, refusal = [], [], [], {}

    async def stream(client):
        last, chunk = None, None
        async with client.stream("POST", f"{server.url}/v1/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    now = time.monotonic()
                    if last is not None:
                        gaps.append(now - last)
                    last, chunk = now, json.loads(line[6:])
        ends.append(time.monotonic())
        finish_reasons.append(chunk["choices"][0]["finish_reason"])

    async def refused(client):
        await asyncio.sleep(0.3)  # while every stream runs
        start = time.monotonic()
        response = await client.post(
            f"{server.url}/v1/completions", content=huge, headers={"content-type": "application/json"}
        )
        refusal.update(
            status=response.status_code, start=start, end=time.monotonic(), message=error_of(response)["message"]
        )

    async def main():
        async with httpx.AsyncClient(timeout=60) as client:
            await asyncio.gather(refused(client), *(stream(client) for _ in range(32)))

    asyncio.run(main())
    assert refusal["status"] == 413 and "--max-request-bytes" in refusal["message"]
    # answered while the streams still ran (each takes at least 150 steps of 5 ms), and they all went on
    assert refusal["end"] < min(ends)
    assert finish_reasons == ["length"] * 32
    gaps.sort()
    p99 = gaps[int(0.99 * len(gaps))]
    print(
        f"10 MB body refused in {(refusal['end'] - refusal['start']) * 1e3:.0f} ms; 32 streams' inter-token p99 "
        f"{p99 * 1e3:.0f} ms"
    )


def test_a_text_too_long_for_the_context_is_refused_before_tokenizing(server):
    # 30,000 characters: no 4-character words (the vocabulary's longest entry is 5) fit in 1,024 tokens
    response = httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, "prompt": "w5 " * 10_000})
    assert response.status_code == 400 and "characters long" in error_of(response)["message"]


def test_batched_prompts_and_n_choices_are_indexed_as_openai_does(server, offline):
    client = server.client()
    response = client.completions.create(
        model=MODEL, prompt=["w5 w6", "w7"], n=2, max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
    )
    assert [c.index for c in response.choices] == [0, 1, 2, 3]
    first, second = (greedy_text(offline, p, 4).outputs[0].text for p in ("w5 w6", "w7"))
    assert [c.text for c in response.choices] == [first, first, second, second]
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (3, 16)


def test_seeded_n_completions_repeat_and_streams_carry_every_choice(server):
    client = server.client()
    body = dict(
        model=MODEL, prompt="w5 w6 w7", n=3, seed=5, temperature=1.0, max_tokens=6, extra_body={"ignore_eos": True}
    )
    first, again = (client.completions.create(**body) for _ in range(2))
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    assert len({c.text for c in first.choices}) > 1
    chunks = list(client.completions.create(**body, stream=True))
    streamed = {
        i: "".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i) for i in range(3)
    }
    assert streamed == {c.index: c.text for c in first.choices}
    messages = [{"role": "user", "content": "w5"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, n=2, seed=5, temperature=1.0, max_tokens=5)
    chat_chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=messages, n=2, seed=5, temperature=1.0, max_tokens=5, stream=True
        )
    )
    for choice in chat.choices:
        mine = [c.choices[0] for c in chat_chunks if c.choices[0].index == choice.index]
        assert mine[0].delta.role == "assistant"
        assert "".join(c.delta.content or "" for c in mine) == choice.message.content


def test_best_of_returns_the_most_likely_completions(server, offline):
    response = server.client().completions.create(
        model=MODEL,
        prompt="w5 w6",
        n=2,
        best_of=4,
        seed=1,
        temperature=1.0,
        max_tokens=5,
        extra_body={"ignore_eos": True},
    )
    params = SamplingParams(temperature=1.0, n=2, best_of=4, seed=1, max_tokens=5, ignore_eos=True)
    want = offline.generate("w5 w6", params, use_tqdm=False)[0].outputs
    assert [(c.index, c.text) for c in response.choices] == [(c.index, c.text) for c in want]


def test_completion_logprobs_in_the_legacy_shape_match_offline(server, offline):
    response = server.client().completions.create(
        model=MODEL, prompt="w5 w6 w7", max_tokens=4, temperature=0, logprobs=2, extra_body={"ignore_eos": True}
    )
    choice = response.choices[0]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=2)
    [completion] = offline.generate("w5 w6 w7", params, use_tqdm=False)[0].outputs
    logprobs = choice.logprobs
    assert logprobs.tokens == [f"w{t}" for t in completion.token_ids]
    assert logprobs.token_logprobs == pytest.approx(
        [p[t].logprob for t, p in zip(completion.token_ids, completion.logprobs)]
    )
    assert [len(top) for top in logprobs.top_logprobs] == [len(p) for p in completion.logprobs]
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(4)]


def test_echo_puts_the_prompt_and_its_logprobs_first(server, offline):
    response = server.client().completions.create(
        model=MODEL,
        prompt="w5 w6 w7",
        max_tokens=3,
        temperature=0,
        echo=True,
        logprobs=1,
        extra_body={"ignore_eos": True},
    )
    choice = response.choices[0]
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, prompt_logprobs=1)
    out = offline.generate("w5 w6 w7", params, use_tqdm=False)[0]
    assert choice.text == "w5 w6 w7" + out.outputs[0].text
    assert choice.logprobs.token_logprobs[0] is None and choice.logprobs.top_logprobs[0] is None
    assert choice.logprobs.token_logprobs[1:3] == pytest.approx(
        [p[t].logprob for t, p in zip([6, 7], out.prompt_logprobs[1:])]
    )
    assert len(choice.logprobs.tokens) == 6 and choice.logprobs.text_offset[3] == len("w5 w6 w7")


def test_chat_logprobs_with_top_alternatives_streamed_or_not(server):
    client = server.client()
    messages = [{"role": "user", "content": "w5 w6"}]
    response = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    content = response.choices[0].logprobs.content
    assert len(content) == 4 and all(len(entry.top_logprobs) == 2 for entry in content)
    assert all(entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob for entry in content)
    assert [entry.token for entry in content] == response.choices[0].message.content.split()
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=4,
            temperature=0,
            logprobs=True,
            top_logprobs=2,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    streamed = [entry for c in chunks if c.choices[0].logprobs for entry in c.choices[0].logprobs.content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content])
    with pytest.raises(openai.BadRequestError, match="top_logprobs needs logprobs"):
        client.chat.completions.create(model=MODEL, messages=messages, top_logprobs=2)


def test_fields_the_openai_client_sends_as_null_or_false_are_accepted(server):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "w5"}],
        "max_tokens": 2,
        "logit_bias": None,
        "logprobs": False,
        "top_logprobs": None,
        "n": None,
    }
    assert httpx.post(f"{server.url}/v1/chat/completions", json=body).status_code == 200


def test_logit_bias_forces_a_token(server):
    response = server.client().completions.create(
        model=MODEL, prompt="w5", max_tokens=3, temperature=0, logit_bias={"42": 100}
    )
    assert response.choices[0].text == " w42 w42 w42"


def test_completions_without_max_tokens_make_16_tokens_and_chat_fills_the_context(server):
    client = server.client()
    response = client.completions.create(model=MODEL, prompt="w5 w6", temperature=0, extra_body={"ignore_eos": True})
    assert response.usage.completion_tokens == 16 and response.choices[0].finish_reason == "length"
    body = {"model": MODEL, "prompt": "w5 w6", "max_tokens": None, "ignore_eos": True}
    assert httpx.post(f"{server.url}/v1/completions", json=body).json()["usage"]["completion_tokens"] == 16
    # the default gives way to the context; a limit the client set does not
    near_the_end = client.completions.create(model=MODEL, prompt=[7] * 1010, extra_body={"ignore_eos": True})
    assert near_the_end.usage.completion_tokens == 14
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model=MODEL, prompt=[7] * 1010, max_tokens=16)
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "w7 " * 1000}], extra_body={"ignore_eos": True}
    )
    assert chat.usage.prompt_tokens == 1001 and chat.usage.completion_tokens == 23


def test_chat_template_options_reach_the_template(server):
    def prompt_tokens(**extra):
        return (
            server.client()
            .chat.completions.create(model=MODEL, messages=messages, max_tokens=1, extra_body=extra)
            .usage.prompt_tokens
        )

    messages = [{"role": "user", "content": "w5 w6"}]
    assert prompt_tokens() == 3
    assert prompt_tokens(add_generation_prompt=False) == 2
    assert prompt_tokens(chat_template_kwargs={"shout": True}) == 4
    assert prompt_tokens(reasoning_effort="high") == 4
    assert prompt_tokens(reasoning_effort="high", chat_template_kwargs={"reasoning_effort": None}) == 3
    with pytest.raises(openai.BadRequestError, match="reasoning_effort"):
        prompt_tokens(reasoning_effort="max")
    messages.append({"role": "assistant", "content": "w9"})
    assert prompt_tokens(add_generation_prompt=False, continue_final_message=True) == 3


def test_unknown_fields_are_ignored_with_a_warning(server, caplog):
    with caplog.at_level(logging.WARNING, logger="nanovllm.entrypoints.protocol"):
        response = httpx.post(
            f"{server.url}/v1/completions",
            json={
                "model": MODEL,
                "prompt": "w5",
                "max_tokens": 2,
                "frobnicate": 1,
                "stream_options": {"include_usage": True, "pace": 1},
            },
        )
    assert response.status_code == 200
    assert "ignoring unknown field(s) frobnicate, stream_options.pace" in caplog.text


def test_a_reply_sent_back_as_the_openai_library_dumps_it_is_accepted(server, caplog):
    """The history holds `message.model_dump()` (refusal, annotations, audio, function_call: None, ...), and
    the stream asks for vLLM's continuous usage: the answer comes, with the token counts in every chunk."""
    client = server.client()
    messages = [{"role": "user", "content": "w5"}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3, temperature=0)
    messages += [reply.choices[0].message.model_dump(), {"role": "user", "content": "w6"}]
    with caplog.at_level(logging.WARNING, logger="nanovllm.entrypoints.protocol"):
        chunks = list(
            client.chat.completions.create(
                model=MODEL,
                messages=messages,
                max_tokens=4,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True, "continuous_usage_stats": True},
                extra_body={"ignore_eos": True},
            )
        )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    [warning] = [r.getMessage() for r in caplog.records if "ignoring unknown" in r.getMessage()]
    assert "messages.1.refusal" in warning and "messages.1.audio" in warning
    assert all(c.usage is not None for c in chunks)
    assert [c.usage.completion_tokens for c in chunks][-1] == 4


def test_an_unknown_model_is_a_404_model_not_found_and_model_may_be_left_out(server):
    response = httpx.post(f"{server.url}/v1/completions", json={"model": "gpt-4", "prompt": "w5", "max_tokens": 1})
    assert response.status_code == 404
    error = error_of(response)
    assert (error["code"], error["param"], error["type"]) == ("model_not_found", "model", "invalid_request_error")
    assert "'gpt-4'" in error["message"] and "'tiny'" in error["message"]
    with pytest.raises(openai.NotFoundError, match="unknown model"):
        server.client().chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "w5"}])
    for route, body in (
        ("v1/completions", {"prompt": "w5"}),
        ("v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}]}),
    ):
        answer = httpx.post(f"{server.url}/{route}", json={**body, "max_tokens": 1})
        assert answer.status_code == 200 and answer.json()["model"] == MODEL


def test_echo_with_max_tokens_0_scores_the_prompt(server, offline):
    client = server.client()
    response = client.completions.create(model=MODEL, prompt="w5 w6 w7", max_tokens=0, echo=True, logprobs=1)
    [choice] = response.choices
    out = offline.generate("w5 w6 w7", SamplingParams(max_tokens=1, prompt_logprobs=1), use_tqdm=False)[0]
    assert (choice.text, choice.finish_reason, response.usage.completion_tokens) == ("w5 w6 w7", "length", 0)
    assert choice.logprobs.tokens == ["w5", "w6", "w7"] and choice.logprobs.token_logprobs[0] is None
    assert choice.logprobs.token_logprobs[1:] == pytest.approx(
        [p[t].logprob for t, p in zip([6, 7], out.prompt_logprobs[1:])]
    )
    chunks = list(
        client.completions.create(
            model=MODEL, prompt="w5 w6 w7", max_tokens=0, echo=True, stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "w5 w6 w7"
    assert chunks[-1].usage.completion_tokens == 0


def test_prompt_logprobs_come_back_as_vllm_shapes_them(server, offline):
    client = server.client()
    out = offline.generate("w5 w6 w7", SamplingParams(max_tokens=1, prompt_logprobs=2), use_tqdm=False)[0]
    want = [None] + [
        {
            str(t): {"logprob": pytest.approx(lp.logprob), "rank": lp.rank, "decoded_token": lp.decoded_token}
            for t, lp in position.items()
        }
        for position in out.prompt_logprobs[1:]
    ]
    response = client.completions.create(
        model=MODEL, prompt="w5 w6 w7", max_tokens=2, extra_body={"prompt_logprobs": 2}
    )
    assert response.choices[0].prompt_logprobs == want
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "w5 w6"}], max_tokens=1, extra_body={"prompt_logprobs": 0}
    )
    assert [sorted(p) if p else p for p in chat.prompt_logprobs] == [None, ["6"], ["3"]]  # 'w5 w6 w3'
    assert not hasattr(client.completions.create(model=MODEL, prompt="w5", max_tokens=1).choices[0], "prompt_logprobs")


def test_chat_template_per_request_and_tool_calls_in_the_history_reach_it(server):
    """The request's template renders the earlier call's arguments ({"n": 42} as 'w42'), which its prompt
    log-probabilities show."""
    template = (
        "{% for m in messages %}{% for c in m.tool_calls or [] %}w{{ c.function.arguments.n }} {% endfor %}"
        "{{ m.content }} {% endfor %}w3"
    )
    messages = [
        {"role": "user", "content": "w5"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"n": 42}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "w6"},
    ]
    chat = server.client().chat.completions.create(
        model=MODEL, messages=messages, max_tokens=1, extra_body={"chat_template": template, "prompt_logprobs": 0}
    )
    assert [list(p) if p else p for p in chat.prompt_logprobs] == [None, ["42"], ["6"], ["3"]]


def test_auto_tool_choice_with_a_template_that_ignores_tools_warns_once(server, caplog):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with caplog.at_level(logging.WARNING, logger="nanovllm.entrypoints.generation"):
        for _ in range(2):
            server.client().chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "w5"}], tools=[tool], max_tokens=1
            )
    assert len([r for r in caplog.records if "does not show the tools" in r.getMessage()]) == 1


@pytest.mark.parametrize(
    "extra",
    [
        {"messages": [{"role": "user", "content": "w5 \ud800"}]},
        {"messages": [{"role": "user", "content": "w5"}], "stop": "w6\udfff"},
    ],
)
def test_surrogate_in_a_chat_message_or_stop_string_is_a_400(server, extra):
    # the openai client cannot send a lone surrogate; json.dumps escapes it as the JSON text \ud800
    body = json.dumps({"model": MODEL, **extra})
    response = httpx.post(
        f"{server.url}/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400 and "lone surrogate" in error_of(response)["message"]


def test_tokenize_detokenize_version_and_model_retrieval(server):
    tokens = httpx.post(f"{server.url}/tokenize", json={"model": MODEL, "prompt": "w5 w6"}).json()
    assert tokens == {"count": 2, "max_model_len": 1024, "tokens": [5, 6]}
    chat = httpx.post(f"{server.url}/tokenize", json={"messages": [{"role": "user", "content": "w5"}]}).json()
    assert chat["tokens"] == [5, 3]
    assert httpx.post(f"{server.url}/detokenize", json={"tokens": [5, 6]}).json() == {"prompt": "w5 w6"}
    assert httpx.post(f"{server.url}/detokenize", json={"tokens": [600]}).status_code == 400
    assert httpx.post(f"{server.url}/tokenize", json={}).status_code == 400
    assert httpx.get(f"{server.url}/version").json()["version"]
    assert server.client().models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        server.client().models.retrieve("gpt-4")


def test_metrics_report_latency_prefix_cache_and_preemptions(server):
    e2e_before = server.metric("nanovllm:e2e_request_latency_seconds_count")
    hits_before = server.metric("nanovllm:prefix_cache_hits_total")
    prompt = [9] * (2 * BLOCK + 1)
    for _ in range(2):
        server.client().completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    assert server.metric("nanovllm:e2e_request_latency_seconds_count") == e2e_before + 2
    assert server.metric("nanovllm:prefix_cache_hits_total") >= hits_before + 2 * BLOCK
    assert server.metric("nanovllm:prefix_cache_queries_total") >= server.metric("nanovllm:prefix_cache_hits_total")
    assert server.metric("nanovllm:num_preemptions_total") >= 0.0


@pytest.mark.slow
def test_the_servers_chat_template_serves_a_tokenizer_without_one(qwen3_dir, tmp_path):
    path = tmp_path / "template.jinja"
    path.write_text("{% for m in messages %}{{ m['content'] }} {% endfor %}w4")
    running = RunningServer(qwen3_dir, ServerSettings(MODEL, chat_template=load_chat_template(str(path))))
    try:

        def prompt_tokens(**extra) -> list[str]:
            chat = running.client().chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "w5"}],
                max_tokens=1,
                extra_body={"prompt_logprobs": 0, **extra},
            )
            return [next(iter(p)) for p in chat.prompt_logprobs[1:]]

        assert prompt_tokens() == ["4"]  # 'w5 w4'
        assert prompt_tokens(chat_template="{{ messages[0]['content'] }} w9") == ["9"]
        tokens = httpx.post(f"{running.url}/tokenize", json={"messages": [{"role": "user", "content": "w5"}]})
        assert tokens.json()["tokens"] == [5, 4]
    finally:
        running.close()


def test_a_request_is_checked_once(server, monkeypatch):
    from nanovllm.frontend import input_processor

    calls = []
    real = input_processor.grammar_of
    monkeypatch.setattr(input_processor, "grammar_of", lambda spec: calls.append(spec) or real(spec))
    response = server.client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "w5"}],
        max_tokens=32,
        temperature=0,
        extra_body={"structured_outputs": {"choice": ["w5", "w7"]}},
    )
    assert response.choices[0].message.content.strip() in ("w5", "w7")
    assert len(calls) == 1  # the grammar is parsed once in the front end (the core compiles it for itself)
