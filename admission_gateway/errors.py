"""Errors as the OpenAI API shapes them: `{"error": {"message", "type", "param", "code"}}`.

Clients written for the OpenAI API (the official SDKs among them) read these bodies, so every error
the gateway itself produces, aiohttp's own 404 and 405 included, takes this shape.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web


class OpenAIError(Exception):
    """An error response; raise it from a handler and the middleware turns it into the reply."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        error_type: str,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.code = code
        self.param = param
        self.headers = dict(headers or {})

    def body(self) -> dict[str, dict[str, str | None]]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.status, headers=self.headers)


_HTTP_ERROR_TYPES = {404: "not_found_error", 405: "invalid_request_error"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Render OpenAIError, and aiohttp's HTTP errors, as OpenAI-style JSON bodies."""
    try:
        return await handler(request)
    except OpenAIError as error:
        return error.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return OpenAIError(
            exc.status,
            exc.reason,
            error_type=_HTTP_ERROR_TYPES.get(exc.status, "invalid_request_error"),
            headers={k: v for k, v in exc.headers.items() if k.lower() == "allow"},
        ).response()
