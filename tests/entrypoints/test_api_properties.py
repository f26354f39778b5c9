"""Property-based test of the HTTP API: whatever a body holds, a malformed request is a 4xx, no request is
left hanging, and the next normal request is served.

Bodies look valid (the right endpoint's fields) but carry extreme values:
integers at and beyond the 64-bit bounds, NaN and infinities, empty and huge
lists, odd Unicode (lone surrogates included), wrong types. The number of
examples is bounded for CI; NANOVLLM_FUZZ_EXAMPLES raises it.
"""

import json
import os

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanovllm.entrypoints.api_server import ServerSettings

from helpers.api_servers import MODEL, RunningServer, wait_until

EXAMPLES = int(os.environ.get("NANOVLLM_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=os.environ.get("CI") == "true",
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

BOUNDS = [0, 1, -1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, 10**30, -(10**30)]
integers = st.one_of(st.sampled_from(BOUNDS), st.integers(-3, 40), st.integers(-(2**70), 2**70))
floats = st.one_of(
    st.sampled_from([float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1e308, -1e308, 5e-324]), st.floats(-5, 5)
)
texts = st.one_of(
    st.text(st.characters(codec=None), max_size=20),  # any code point, lone surrogates too
    st.sampled_from(["", "w5 w6", "\ud800", "\x00", "w5 " * 2000]),
)
scalars = st.one_of(st.none(), st.booleans(), integers, floats, texts)
token_ids = st.one_of(st.lists(integers, max_size=8), st.lists(st.integers(0, 600), max_size=8), st.just([5] * 20_000))
anything = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)),
    max_leaves=8,
)


def field(usual, extreme):
    """A field's value: a usual one, an extreme one (of the field's type), or one of the wrong type."""
    return st.one_of(usual, extreme, anything)


def whole(usual):
    return st.one_of(usual, integers, integers, anything)  # beyond-range integers are the likeliest fault


def real(usual):
    return field(usual, floats)


small = st.integers(1, 6)
unit = st.floats(0.05, 1)
flag = st.booleans()
prompts = field(
    st.just("w5 w6"), st.one_of(texts, token_ids, st.lists(texts, max_size=3), st.lists(token_ids, max_size=3))
)
contents = field(
    st.just("w5 w6"),
    st.one_of(texts, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": texts}), max_size=2)),
)
messages = field(
    st.lists(st.fixed_dictionaries({"role": st.just("user"), "content": contents}), min_size=1, max_size=2),
    st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["system", "user", "assistant", "tool", "robot"]), "content": contents}
        ),
        max_size=3,
    ),
)

SAMPLING_FIELDS = {
    "max_tokens": whole(small),
    "temperature": real(st.floats(0, 2)),
    "top_p": real(unit),
    "top_k": whole(st.integers(-1, 50)),
    "min_p": real(unit),
    "seed": whole(st.integers(0, 99)),
    "n": whole(st.integers(1, 4)),
    "presence_penalty": real(unit),
    "frequency_penalty": real(unit),
    "repetition_penalty": real(st.floats(0.5, 2)),
    "logit_bias": field(
        st.dictionaries(st.integers(0, 511).map(str), st.floats(-100, 100), max_size=3),
        st.dictionaries(st.one_of(integers.map(str), texts), floats, max_size=3),
    ),
    "stop": field(
        st.sampled_from(["w9", ["w9", "w10"]]), st.one_of(texts, st.lists(texts, max_size=3), st.just(["w9"] * 5000))
    ),
    "stop_token_ids": field(st.lists(st.integers(0, 511), max_size=3), token_ids),
    "min_tokens": whole(st.integers(0, 3)),
    "ignore_eos": field(flag, scalars),
    "include_stop_str_in_output": field(flag, scalars),
    "skip_special_tokens": field(flag, scalars),
    "stream": field(flag, scalars),
    "stream_options": field(
        st.fixed_dictionaries({"include_usage": flag}), st.fixed_dictionaries({"include_usage": scalars})
    ),
    "response_format": field(
        st.sampled_from([{"type": "json_object"}, {"type": "text"}]), st.just({"type": "json_schema"})
    ),
    "guided_choice": field(st.just(["w5", "w6 w7"]), st.lists(texts, max_size=3)),
    "guided_regex": field(st.just("(w5 )+"), texts),
    "user": field(texts, scalars),
    "model": field(st.just(MODEL), texts),
}
COMPLETION_FIELDS = {
    **SAMPLING_FIELDS,
    "prompt": prompts,
    "echo": field(flag, scalars),
    "logprobs": whole(st.integers(0, 5)),
    "best_of": whole(st.integers(1, 4)),
}
tools = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": st.sampled_from(["f", "g"]), "parameters": st.just({"type": "object"})}
        ),
    }
)
CHAT_FIELDS = {
    **SAMPLING_FIELDS,
    "messages": messages,
    "logprobs": field(flag, scalars),
    "top_logprobs": whole(st.integers(0, 5)),
    "max_completion_tokens": whole(small),
    "add_generation_prompt": field(flag, scalars),
    "tool_choice": field(st.sampled_from(["none", "auto", "required"]), texts),
    "tools": field(st.lists(tools, max_size=2), st.lists(anything, max_size=2)),
}


def bodies(fields: dict, base: dict) -> st.SearchStrategy[dict]:
    """A valid `base` body with one or two of the endpoint's fields set (or replaced), chosen uniformly."""
    chosen = st.tuples(st.permutations(sorted(fields)), st.integers(1, 2)).map(lambda drawn: drawn[0][: drawn[1]])
    return chosen.flatmap(lambda names: st.fixed_dictionaries({name: fields[name] for name in names})).map(
        lambda values: {**base, **values}
    )


@pytest.fixture(scope="module")
def server(chat_model_dir):
    # a short context and few completions per request, so that whatever a valid body asks for ends soon
    running = RunningServer(
        chat_model_dir, ServerSettings(MODEL, max_n=4, max_logprobs=5), max_model_len=64, num_kvcache_blocks=128
    )
    yield running
    running.close()


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def send(client: httpx.Client, path: str, body: dict) -> None:
    """Post `body` (JSON with NaN, infinities and lone surrogates as Python writes them) and check the answer:
    a 4xx in OpenAI's error shape, or a 200 whose stream, if any, ends without a server error."""
    content = json.dumps(body, allow_nan=True)
    response = client.post(path, content=content, headers={"content-type": "application/json"})
    assert response.status_code < 500, (response.status_code, response.text[:500], content[:500])
    if response.status_code != 200:
        assert "message" in response.json()["error"]
    elif response.headers["content-type"].startswith("text/event-stream"):
        payloads = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
        errors = [json.loads(p)["error"] for p in payloads if p != "[DONE]" and "error" in json.loads(p)]
        assert not errors and payloads[-1] == "[DONE]", (errors, content[:500])


def check_still_serving(server, client: httpx.Client) -> None:
    response = client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "w5 w6", "max_tokens": 4, "temperature": 0, "ignore_eos": True},
    )
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 4
    wait_until(lambda: server.online.stats().num_running == 0 and server.online.stats().num_waiting == 0, timeout=30)


@FUZZ
@given(body=bodies(COMPLETION_FIELDS, {"model": MODEL, "prompt": "w5 w6", "max_tokens": 4}))
@pytest.mark.slow
def test_any_completion_body_is_answered_and_the_server_goes_on(server, client, body):
    send(client, "/v1/completions", body)
    check_still_serving(server, client)


@FUZZ
@given(body=bodies(CHAT_FIELDS, {"model": MODEL, "messages": [{"role": "user", "content": "w5 w6"}], "max_tokens": 4}))
@pytest.mark.slow
def test_any_chat_body_is_answered_and_the_server_goes_on(server, client, body):
    send(client, "/v1/chat/completions", body)
    check_still_serving(server, client)
