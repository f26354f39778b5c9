"""The request-body cap: bodies up to it reach the application whole, larger ones get a 413."""

import asyncio

import httpx

from nanovllm.entrypoints.body_limit import BodyLimit


async def echo(scope, receive, send):
    """An application that answers with the body it read."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def post(content, max_bytes=100) -> httpx.Response:
    async def run():
        transport = httpx.ASGITransport(app=BodyLimit(echo, max_bytes))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post("/", content=content)

    return asyncio.run(run())


def chunks(*parts: bytes):
    async def generate():
        for part in parts:
            yield part

    return generate()


def test_a_body_up_to_the_cap_reaches_the_application_whole():
    assert post(b"x" * 100).content == b"x" * 100
    assert post(chunks(b"a" * 60, b"b" * 40)).content == b"a" * 60 + b"b" * 40


def test_a_larger_body_gets_413_declared_or_sent_in_chunks():
    declared = post(b"x" * 101)
    assert declared.status_code == 413 and "101 bytes" in declared.json()["error"]["message"]
    streamed = post(chunks(b"a" * 60, b"b" * 60))
    assert streamed.status_code == 413 and "120 bytes" in streamed.json()["error"]["message"]


def test_a_body_past_the_drain_limit_is_cut_off():
    response = post(chunks(*[b"z" * 100] * 20))
    assert response.status_code == 413 and "over 800 bytes" in response.json()["error"]["message"]
