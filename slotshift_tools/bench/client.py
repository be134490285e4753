"""One streaming completion through a gateway, timed chunk by chunk as `vllm bench serve` does.

The request is vLLM's /v1/completions with a prompt of token ids, max_tokens with ignore_eos (so
the output length is exact), and stream_options.include_usage (so the server says how many tokens
it sent). TTFT is the arrival of the first chunk with text; every later text chunk adds a gap to
the ITLs; the end is the [DONE] event.

A request whose shape is not streamed (a replayed one recorded so) asks for the whole answer at
once: no TTFT and no ITLs then, its end is the answer's arrival, its length the answer's usage.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from slotshift.clock import Clock
from slotshift_tools.bench.arrivals import RequestShape
from slotshift_tools.bench.trace import RequestStatus, RequestTrace

ERROR_TEXT_CHARS = 200
"""How much of a refusal's body a trace keeps."""


class StreamingClient:
    """Sends completions and records what happened to each in its RequestTrace."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        model: str,
        clock: Clock,
        origin_s: float,
        timeout_s: float,
    ) -> None:
        """origin_s: the clock reading that traces measure their times from."""
        self._session = session
        self._model = model
        self._clock = clock
        self._origin_s = origin_s
        self._timeout_s = timeout_s

    def now_s(self) -> float:
        """Seconds since the origin."""
        return self._clock.monotonic() - self._origin_s

    def payload(self, shape: RequestShape) -> dict[str, Any]:
        """The body of `shape`'s request."""
        body: dict[str, Any] = {
            "model": self._model,
            "prompt": shape.prompt_token_ids,
            "max_tokens": shape.max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": shape.streamed,
        }
        if shape.streamed:
            body["stream_options"] = {"include_usage": True}
        return body

    async def send(
        self, trace: RequestTrace, gateway_url: str, api_key: str, shape: RequestShape
    ) -> None:
        """Send one request (trace.start_s is set now) and fill its trace; never raises for a
        failed request, only CancelledError (the trace is then marked cancelled)."""
        trace.start_s = self.now_s()
        headers = {"Authorization": f"Bearer {api_key}"}
        try:
            async with (
                asyncio.timeout(self._timeout_s),
                self._session.post(
                    f"{gateway_url}/v1/completions", json=self.payload(shape), headers=headers
                ) as response,
            ):
                if response.status != 200:
                    body = await response.text(errors="replace")
                    trace.fail(
                        self.now_s(),
                        f"HTTP {response.status}: {body[:ERROR_TEXT_CHARS]}",
                        response.status,
                    )
                    return
                trace.http_status = response.status
                if shape.streamed:
                    await self._read_stream(response, trace)
                else:
                    await self._read_answer(response, trace)
        except TimeoutError:
            trace.fail(self.now_s(), f"no complete answer within {self._timeout_s:g} s")
        except aiohttp.ClientError as exc:
            trace.fail(self.now_s(), f"{type(exc).__name__}: {exc}")
        except asyncio.CancelledError:
            trace.status = RequestStatus.CANCELLED
            trace.end_s = self.now_s()
            raise

    async def _read_answer(self, response: aiohttp.ClientResponse, trace: RequestTrace) -> None:
        """A whole (not streamed) answer: its end now, its length from its usage."""
        raw = await response.read()
        received_s = self.now_s()
        try:
            answer = json.loads(raw)
            tokens = answer["usage"]["completion_tokens"]
        except (ValueError, KeyError, TypeError):
            trace.fail(received_s, f"unreadable answer: {raw[:ERROR_TEXT_CHARS]!r}")
            return
        if not isinstance(tokens, int):
            trace.fail(received_s, f"unreadable answer: {raw[:ERROR_TEXT_CHARS]!r}")
            return
        trace.status = RequestStatus.OK
        trace.end_s = received_s
        trace.output_tokens = tokens

    async def _read_stream(self, response: aiohttp.ClientResponse, trace: RequestTrace) -> None:
        last_chunk_s: float | None = None
        text_chunks = 0
        reported_tokens: int | None = None
        async for raw in response.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue  # blank separators, comments, other SSE fields
            data = line[len(b"data:") :].strip()
            received_s = self.now_s()
            if data == b"[DONE]":
                trace.status = RequestStatus.OK
                trace.end_s = received_s
                trace.output_tokens = text_chunks if reported_tokens is None else reported_tokens
                return
            try:
                event = json.loads(data)
            except ValueError:
                trace.fail(received_s, f"unreadable event: {data[:ERROR_TEXT_CHARS]!r}")
                return
            if not isinstance(event, dict):
                trace.fail(received_s, f"unexpected event: {data[:ERROR_TEXT_CHARS]!r}")
                return
            if "error" in event:
                trace.fail(received_s, f"error event: {json.dumps(event['error'])[:200]}")
                return
            usage = event.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                reported_tokens = usage["completion_tokens"]
            choices = event.get("choices")
            if choices and isinstance(choices[0], dict) and choices[0].get("text"):
                if last_chunk_s is None:
                    trace.first_token_s = received_s
                else:
                    trace.itl_s.append(received_s - last_chunk_s)
                last_chunk_s = received_s
                text_chunks += 1
        trace.fail(self.now_s(), "the stream ended without [DONE]")
