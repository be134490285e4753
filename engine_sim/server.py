"""The emulator's HTTP server: vLLM's OpenAI-compatible API and /metrics over an AsyncEngine.

Endpoints: POST /v1/completions and /v1/chat/completions (streamed or not), GET /v1/models,
/health, /version and /metrics; and the emulator's own: POST /sim/reset-peak (restart the
high-water mark of requests inside the engine) and /sim/chat-script. A request whose client goes
away is aborted in the engine, as vLLM does: the server runs with aiohttp's handler cancellation,
so a vanished client cancels its handler even while it only waits for tokens, and the handler's
`finally` aborts the request. That is how a gateway pauses a streamed request; it resumes it with
a completion whose prompt is the prompt's ids plus the output's (return_token_ids gives both),
which generates what the paused request would have (engine_sim/tokens.py) and finds its computed
blocks in the prefix cache (engine_sim/engine_core.py).

With engine_sim.api_key_file the API routes need a key, as vLLM's with --api-key
(vllm/entrypoints/serve/middleware/authenticate.py, 0.32): a request whose path starts with
/v1 and that lacks `Authorization: Bearer KEY` with one of the file's keys gets 401
`{"error": "Unauthorized"}`; OPTIONS and every other path (/health, /metrics, /version,
/tokenize, /sim/...) stay open.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import uuid
from collections.abc import Awaitable, Callable, Sequence
from http import HTTPStatus

from aiohttp import web
from opentelemetry import trace
from prometheus_client import CONTENT_TYPE_LATEST

from engine_sim import openai_api
from engine_sim.chat_script import ChatScript, ChatScriptError, ScriptedReply
from engine_sim.engine_core import FinishedRequest, FinishReason, RequestSpec
from engine_sim.engine_loop import AsyncEngine, RequestStream
from engine_sim.openai_api import (
    ApiError,
    GenerationRequest,
    PromptTokensDetails,
    ResponseIdentity,
)
from engine_sim.profiles import EngineProfile
from engine_sim.tokens import token_text
from engine_sim.tracing import llm_request_span, record_finished
from slotshift.aiotasks import Supervisor
from slotshift.clock import Clock, SystemClock
from slotshift.config import EngineSimConfig, read_secret_tokens

MAX_BODY_BYTES = 64 * 1024 * 1024
"""Largest request body accepted (a max_model_len prompt of text fits many times over)."""

GUARDED_PREFIXES = ("/v1",)
"""The paths an API key guards: vLLM's GUARDED_PREFIX ("/v1", "/v2", "/inference",
"/cohere") less the routes the emulator does not serve."""

UNAUTHORIZED_BODY = b'{"error":"Unauthorized"}'
"""vLLM's answer to a request without a valid key, byte for byte (starlette's JSONResponse of
`{"error": "Unauthorized"}`)."""

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def api_key_middleware(keys: Sequence[str]) -> Callable[..., Awaitable[web.StreamResponse]]:
    """An aiohttp middleware that refuses, as vLLM's AuthenticationMiddleware does, a request to
    a GUARDED_PREFIXES path whose Authorization is not `Bearer` (any case) and one of `keys`:
    401 with vLLM's body. Keys are compared by their SHA-256 digests in constant time, as vLLM
    does. ValueError when `keys` is empty (that would refuse everyone)."""
    if not keys:
        raise ValueError("an API key middleware needs at least one key")
    digests = [hashlib.sha256(key.encode()).digest() for key in keys]

    def allowed(authorization: str | None) -> bool:
        if not authorization:
            return False
        scheme, _, offered = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(offered.encode()).digest()
        matched = False
        for expected in digests:
            # Every key is compared, so that the time taken says nothing of which matched.
            matched |= secrets.compare_digest(digest, expected)
        return matched

    @web.middleware
    async def require_api_key(request: web.Request, handler: _Handler) -> web.StreamResponse:
        if (
            request.method != "OPTIONS"
            and request.path.startswith(GUARDED_PREFIXES)
            and not allowed(request.headers.get("Authorization"))
        ):
            return web.Response(
                status=HTTPStatus.UNAUTHORIZED,
                body=UNAUTHORIZED_BODY,
                content_type="application/json",
            )
        return await handler(request)

    return require_api_key


class EngineSim:
    """An in-process vLLM emulator: start() on the configured host and port (0 picks one).

    tracer_provider: where its "llm_request" spans go (see tracing.py); no-op by default.
    """

    def __init__(
        self,
        config: EngineSimConfig,
        *,
        clock: Clock | None = None,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        self._config = config
        provider = tracer_provider if tracer_provider is not None else trace.NoOpTracerProvider()
        self._tracer = provider.get_tracer("slotshift.engine_sim")
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._engine = AsyncEngine(config, self._clock)
        self._supervisor = Supervisor("engine_sim")
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self._stopping = False
        self.chat_script = ChatScript()
        """Scripted chat answers (see engine_sim/chat_script.py)."""

    # --- what tests and the entrypoint read -------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the emulator has not started")
        return self._port

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:8000 (the OpenAI API is under /v1)."""
        return f"http://{self._config.host}:{self.port}"

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    @property
    def profile(self) -> EngineProfile:
        """The emulated GPU and model: the configured profile with the config's overrides."""
        return self._engine.core.profile

    @property
    def num_running(self) -> int:
        """Requests in the running batch now."""
        return self._engine.core.num_running

    @property
    def num_waiting(self) -> int:
        """Requests queued inside the engine now."""
        return self._engine.core.num_waiting

    @property
    def peak_in_server(self) -> int:
        """Most requests inside the server (running + waiting) at once since start or reset."""
        return self._engine.core.peak_in_engine

    def reset_peak(self) -> int:
        """Start measuring peak_in_server afresh from the present number of requests; returns the
        peak that ended."""
        return self._engine.core.reset_peak()

    @property
    def completed_count(self) -> int:
        """Requests that finished normally (finished_reason stop or length)."""
        core = self._engine.core
        return core.finished_count(FinishReason.STOP) + core.finished_count(FinishReason.LENGTH)

    @property
    def aborted_count(self) -> int:
        """Requests aborted because their client went away (or the emulator stopped)."""
        return self._engine.core.finished_count(FinishReason.ABORT)

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Read the API keys (engine_sim.api_key_file; ConfigError when unreadable or empty),
        start the step loop and listen."""
        if self._runner is not None:
            raise RuntimeError("already started")
        middlewares = []
        if (key_file := self._config.api_key_file) is not None:
            keys = await asyncio.to_thread(
                read_secret_tokens, key_file, field="engine_sim.api_key_file"
            )
            middlewares.append(api_key_middleware(keys))
        self._supervisor.spawn("steps", self._engine.run())
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=middlewares)
        app.add_routes(
            [
                web.post("/v1/completions", self._completions),
                web.post("/v1/chat/completions", self._chat_completions),
                web.get("/v1/models", self._models),
                web.post("/tokenize", self._tokenize),
                web.get("/health", self._health),
                web.get("/version", self._version),
                web.get("/metrics", self._metrics),
                web.post("/sim/reset-peak", self._reset_peak),
                web.post("/sim/chat-script", self._script_chat),
                web.delete("/sim/chat-script", self._clear_chat_script),
            ]
        )
        runner = web.AppRunner(
            app,
            handler_cancellation=True,
            shutdown_timeout=self._config.shutdown_grace_s,
            access_log=None,
        )
        await runner.setup()
        self._runner = runner
        site = web.TCPSite(runner, self._config.host, self._config.port)
        try:
            await site.start()
        except OSError:
            await self.stop()
            raise
        self._port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        """Refuse new work, give running requests shutdown_grace_s, abort the rest, stop."""
        self._stopping = True
        if self._runner is not None:
            # Closes the listener, then waits for in-flight handlers (the step loop still runs,
            # so they can finish) and cancels those still running after the grace period.
            await self._runner.cleanup()
        await self._supervisor.stop()
        self._engine.abort_all()

    # --- handlers --------------------------------------------------------------------------

    async def _health(self, _: web.Request) -> web.Response:
        if self._stopping:
            return web.Response(status=HTTPStatus.SERVICE_UNAVAILABLE)
        return web.Response(status=HTTPStatus.OK)

    async def _version(self, _: web.Request) -> web.Response:
        return web.json_response({"version": openai_api.EMULATED_VLLM_VERSION})

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(
            body=self._engine.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response(
            openai_api.models_response(
                self.profile.model_name,
                int(self._clock.wall()),
                self._config.max_model_len,
                f"modelperm-{uuid.uuid4().hex}",
            )
        )

    async def _tokenize(self, request: web.Request) -> web.Response:
        try:
            body = openai_api.parse_json_body(await request.read())
            return web.json_response(openai_api.tokenize_response(body, self._config))
        except ApiError as exc:
            return _error_response(exc)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        scripted = self.chat_script.next_reply()
        if scripted is not None:
            return await self._scripted_reply(scripted)
        return await self._generate(request, chat=True)

    async def _scripted_reply(self, reply: ScriptedReply) -> web.Response:
        if reply.delay_ms:
            # The scripted answer's own latency: modelling a slow model, not waiting on a test.
            await asyncio.sleep(reply.delay_ms / 1000)
        if reply.status != HTTPStatus.OK:
            return _error_response(
                ApiError(HTTPStatus(reply.status), reply.content or "scripted error")
            )
        identity = ResponseIdentity(
            f"chatcmpl-{uuid.uuid4().hex}", int(self._clock.wall()), self.profile.model_name, True
        )
        tokens = max(1, len(reply.content) // 4)
        return web.json_response(
            openai_api.full_response(
                identity,
                text=reply.content,
                finish_reason="stop",
                prompt_tokens=1,
                completion_tokens=tokens,
            )
        )

    async def _script_chat(self, request: web.Request) -> web.Response:
        try:
            queued = self.chat_script.extend(await request.json())
        except (ValueError, ChatScriptError) as exc:
            return _error_response(ApiError(HTTPStatus.BAD_REQUEST, str(exc)))
        return web.json_response({"queued": queued})

    async def _reset_peak(self, _: web.Request) -> web.Response:
        ended = self.reset_peak()
        return web.json_response({"peak": ended, "in_engine": self._engine.core.num_in_engine})

    async def _clear_chat_script(self, _: web.Request) -> web.Response:
        self.chat_script.clear()
        return web.json_response({"queued": 0})

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            if self._stopping:
                raise ApiError(HTTPStatus.SERVICE_UNAVAILABLE, "The server is shutting down.")
            body = openai_api.parse_json_body(await request.read())
            if chat:
                generation = openai_api.parse_chat_request(body, self._config)
            else:
                generation = openai_api.parse_completion_request(body, self._config)
        except ApiError as exc:
            return _error_response(exc)

        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        model = self.profile.model_name
        with llm_request_span(
            self._tracer, request.headers, request_id=request_id, model=model, generation=generation
        ) as span:
            stream = self._engine.submit(
                RequestSpec(
                    request_id,
                    generation.prompt_token_ids,
                    generation.max_tokens,
                    ignore_eos=generation.ignore_eos,
                    min_tokens=generation.min_tokens,
                )
            )
            reply = _Reply(
                ResponseIdentity(request_id, int(self._clock.wall()), model, chat),
                generation,
                details=self._config.enable_prompt_tokens_details,
            )
            try:
                if generation.stream:
                    return await reply.stream(request, stream)
                return await reply.collect(stream)
            finally:
                # No-op when the request finished; otherwise its client is gone (or the handler
                # was cancelled), and vLLM frees the request's batch slot and KV blocks at once.
                self._engine.abort(request_id)
                record_finished(span, stream.finished)


class _Reply:
    """Turns one request's token stream into vLLM's response or its server-sent events.

    details: report the cached prompt tokens in usage (vLLM's --enable-prompt-tokens-details).
    """

    def __init__(
        self, identity: ResponseIdentity, generation: GenerationRequest, *, details: bool
    ) -> None:
        self._identity = identity
        self._generation = generation
        self._details = details

    def _prompt_ids(self) -> list[int] | None:
        if not self._generation.return_token_ids:
            return None
        return list(self._generation.prompt_token_ids)

    def _prompt_details(self, finished: FinishedRequest) -> PromptTokensDetails | None:
        if not self._details:
            return None
        # vLLM's chat reports the tokens its request wrote to the cache; its completions do not.
        created = finished.cache_creation_tokens if self._identity.chat else None
        return PromptTokensDetails(finished.cached_tokens, created)

    async def collect(self, stream: RequestStream) -> web.Response:
        token_ids = [token.token_id async for token in stream.tokens()]
        finished = stream.finished
        if finished is None or finished.reason is FinishReason.ABORT:
            return _error_response(
                ApiError(HTTPStatus.SERVICE_UNAVAILABLE, "The request was aborted.")
            )
        return web.json_response(
            openai_api.full_response(
                self._identity,
                text="".join(token_text(token_id) for token_id in token_ids),
                finish_reason=finished.reason.value,
                prompt_tokens=self._generation.prompt_tokens,
                completion_tokens=finished.output_tokens,
                token_ids=token_ids if self._generation.return_token_ids else None,
                prompt_token_ids=self._prompt_ids(),
                details=self._prompt_details(finished),
            )
        )

    async def stream(self, request: web.Request, stream: RequestStream) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
            }
        )
        try:
            await response.prepare(request)
        except ConnectionResetError:
            # The client left before the first byte; the caller aborts the request in the engine.
            return response
        generation = self._generation
        prompt_tokens = generation.prompt_tokens
        continuous = generation.continuous_usage
        with_ids = generation.return_token_ids
        try:
            if self._identity.chat:
                opening = openai_api.role_chunk(
                    self._identity,
                    (prompt_tokens, 0) if continuous else None,
                    prompt_token_ids=self._prompt_ids(),
                )
                await response.write(openai_api.sse_event(opening))
            async for token in stream.tokens():
                chunk = openai_api.token_chunk(
                    self._identity,
                    text=token_text(token.token_id),
                    finish_reason=None
                    if token.finish_reason is None
                    else token.finish_reason.value,
                    usage_so_far=(prompt_tokens, token.index + 1) if continuous else None,
                    token_ids=[token.token_id] if with_ids else None,
                    prompt_token_ids=self._prompt_ids()
                    if token.index == 0 and not self._identity.chat
                    else None,
                )
                await response.write(openai_api.sse_event(chunk))
            finished = stream.finished
            if finished is None or finished.reason is FinishReason.ABORT:
                return response  # the emulator is stopping; the stream ends without [DONE]
            if generation.include_usage:
                final = openai_api.usage_chunk(
                    self._identity,
                    prompt_tokens=prompt_tokens,
                    completion_tokens=finished.output_tokens,
                    details=self._prompt_details(finished),
                )
                await response.write(openai_api.sse_event(final))
            await response.write(openai_api.sse_event("[DONE]"))
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away; the caller aborts the request
        return response


def _error_response(error: ApiError) -> web.Response:
    return web.json_response(error.body(), status=error.status)
