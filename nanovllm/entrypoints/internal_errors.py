"""A fault of the server's own answers 500 for that request only: the connection and every other request go on."""

import logging

from fastapi.responses import JSONResponse

from nanovllm.entrypoints.protocol import error_body

logger = logging.getLogger(__name__)


class InternalErrors:
    """ASGI middleware that turns an unexpected exception into a 500 in OpenAI's shape and logs it once.

    Starlette's own handler for `Exception` sends its response and then raises
    again, so that the server logs the traceback a second time and closes the
    connection under the client's next request. A response that had already
    started when the fault came cannot be answered anew; its connection is
    closed (streams end themselves with an error event before that can happen).
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched_send(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        except Exception:
            logger.exception("unexpected error while handling %s", scope.get("path"))
            if started:
                raise
            response = JSONResponse(error_body("internal server error", "server_error", 500), status_code=500)
            await response(scope, receive, send)
