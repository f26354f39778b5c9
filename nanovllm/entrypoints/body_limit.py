"""A cap on request bodies: a larger one is answered 413 before the server parses or keeps it."""

import json

from nanovllm.entrypoints.protocol import error_body

# A body over the cap is still read to its end (and dropped), up to this many times the cap, so that
# the client, which is still sending, can read the 413; a larger one is cut off at once.
_DRAIN_FACTOR = 8


class BodyLimit:
    """ASGI middleware that reads each HTTP request body, up to `max_bytes`, before the application
    sees it. A larger body is answered 413 and never kept: it is read and dropped, or, past
    `_DRAIN_FACTOR` times the cap (declared or sent), refused without reading further."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        drain_limit = _DRAIN_FACTOR * self.max_bytes
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > drain_limit:
            await self._refuse(send, f"{int(declared)} bytes")
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending it all
                return
            size += len(message.get("body", b""))
            if size <= self.max_bytes:
                chunks.append(message.get("body", b""))
            if size > drain_limit or not message.get("more_body", False):
                break
        if size > self.max_bytes:
            await self._refuse(send, f"{size} bytes" if size <= drain_limit else f"over {drain_limit} bytes")
            return
        body, replayed = b"".join(chunks), False

        async def replay():
            # the whole body once, then whatever the client sends next (its disconnect)
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, send, size: str) -> None:
        message = f"the request body is {size}; this server takes at most {self.max_bytes} (--max-request-bytes)"
        payload = json.dumps(error_body(message, "invalid_request_error", 413)).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})
