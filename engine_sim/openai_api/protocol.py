"""What the emulator's whole OpenAI-compatible protocol shares: the JSON object type, the vLLM
release it follows, and the error it answers a refused request with."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

JsonObject = dict[str, Any]

EMULATED_VLLM_VERSION = "0.11.0"
"""The vLLM release whose API and metric names the emulator follows (V1 engine)."""

# vLLM names an error's type after the exception class that raised it.
_ERROR_TYPES = {
    HTTPStatus.BAD_REQUEST: "BadRequestError",
    HTTPStatus.NOT_FOUND: "NotFoundError",
    HTTPStatus.SERVICE_UNAVAILABLE: "ServiceUnavailableError",
}


class ApiError(Exception):
    """A request the API refuses, with the HTTP status and the parameter at fault."""

    def __init__(self, status: HTTPStatus, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> JsonObject:
        """vLLM's ErrorResponse: {"error": {message, type, param, code}}, code = HTTP status."""
        return {
            "error": {
                "message": self.message,
                "type": _ERROR_TYPES.get(self.status, self.status.phrase),
                "param": self.param,
                "code": int(self.status),
            }
        }
