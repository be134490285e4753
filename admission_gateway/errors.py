"""Errors as the OpenAI API shapes them: `{"error": {"message", "type", "param", "code"}}`.

Clients written for the OpenAI API (the official SDKs among them) read these bodies, so every error
the gateway itself produces, the HTTP server's own 404 and 405 included, takes this shape.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Mapping

from admission_gateway.http_server import HttpError, Response, StreamResponse, json_response

logger = logging.getLogger(__name__)


class OpenAIError(HttpError):
    """An error response; raise it from a handler and the server answers with it."""

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

    def response(self) -> Response:
        return json_response(self.body(), status=self.status, headers=self.headers)


def upstream_timeout() -> OpenAIError:
    """504: the engine did not answer within upstream_timeout_s."""
    return OpenAIError(
        504,
        "The engine did not finish the request in time.",
        error_type="timeout_error",
        code="upstream_timeout",
    )


def upstream_unavailable(detail: str = "") -> OpenAIError:
    """502: the engine could not be reached, dropped the connection, or ended a stream early."""
    return OpenAIError(
        502,
        f"The engine could not be reached or closed the connection. {detail}".strip(),
        error_type="upstream_error",
        code="upstream_unavailable",
    )


def engine_failed(status: int, content: bytes) -> OpenAIError:
    """The engine's own error answer (an OpenAI error body's message, or the start of whatever
    else it sent, such as a crashed handler's plain text) with its status, 502 if that was not
    an error status."""
    message = content[:200].decode(errors="replace").strip()
    with contextlib.suppress(ValueError, KeyError, TypeError):
        message = str(json.loads(content)["error"]["message"])
    return OpenAIError(
        status if status >= 400 else 502,
        f"The engine failed: {message}" if message else "The engine failed.",
        error_type="upstream_error",
        code="engine_error",
    )


def sse_error_event(error: OpenAIError) -> bytes:
    """`error` as the event that ends a stream already under way (vLLM's shape)."""
    return b"data: " + json.dumps(error.body()).encode() + b"\n\n"


async def write_quietly(response: StreamResponse, data: bytes) -> None:
    """Write to a client's stream, saying nothing if the client has gone."""
    try:
        await response.write(data)
    except ConnectionResetError:
        logger.debug("client went away before the end of its stream")


_HTTP_ERROR_TYPES = {404: "not_found_error", 405: "invalid_request_error", 500: "server_error"}


def server_error(status: int, message: str, headers: Mapping[str, str]) -> Response:
    """The answer to a request the HTTP server refuses itself (a route that does not exist, a
    method it does not take, a request it cannot read, a handler's unexpected failure)."""
    return OpenAIError(
        status,
        message,
        error_type=_HTTP_ERROR_TYPES.get(status, "invalid_request_error"),
        headers=headers,
    ).response()
