"""Asking an LLM for an allocation, through any OpenAI-compatible chat endpoint.

The control loop calls `ChatAdvisor.advise` before the agent policy decides; it never takes longer
than the configured deadline, and never raises for anything the endpoint does: every failure
comes back as an Advice with `error` set, so that the policy falls back and says why.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from typing import Any

import aiohttp

from controlplane.core.snapshot import Advice, PoolSnapshot
from slotshift.apportion import nominal_shares
from slotshift.config import AgentPolicyConfig, PoolConfig, reveal
from slotshift.tls import client_ssl_context

SYSTEM_PROMPT = (
    "You allocate the concurrent-request slots of one LLM inference server among tenants. "
    "The total is fixed: your limits must sum to the budget exactly, and each tenant's limit must "
    "lie within its floor and ceiling. Maximise completed work; give slots to tenants with demand "
    "(in flight plus queued); keep tenants within their latency SLOs; a tenant asking for no more "
    "than its nominal share should get what it asks. Answer with JSON only, matching the schema."
)


def answer_schema(pool: PoolConfig) -> dict[str, Any]:
    """The JSON schema the answer must match (sent as the response format, too)."""
    return {
        "type": "object",
        "properties": {
            "limits": {
                "type": "object",
                "properties": {
                    t.name: {
                        "type": "integer",
                        "minimum": t.floor_slots,
                        "maximum": pool.ceiling_of(t),
                    }
                    for t in pool.tenants
                },
                "required": [t.name for t in pool.tenants],
                "additionalProperties": False,
            },
            "reason": {"type": "string"},
        },
        "required": ["limits", "reason"],
        "additionalProperties": False,
    }


def state_document(snapshot: PoolSnapshot, pool: PoolConfig) -> dict[str, Any]:
    """What the LLM is shown: the pool, each tenant's bounds and load, the engine's state."""
    nominal = nominal_shares(pool)
    tenants = []
    for tenant in pool.tenants:
        load = snapshot.tenants.get(tenant.name)
        tenants.append(
            {
                "name": tenant.name,
                "floor": tenant.floor_slots,
                "ceiling": pool.ceiling_of(tenant),
                "nominal": nominal[tenant.name],
                "weight": tenant.weight,
                "current_limit": snapshot.current_limits.get(tenant.name),
                "in_flight": load.in_flight if load else 0,
                "queued": load.queued if load else 0,
                "ttft_p99_ms": load.ttft.p99_ms if load and load.ttft.count else None,
                "e2e_p99_ms": load.e2e.p99_ms if load and load.e2e.count else None,
                "ttft_slo_ms": tenant.ttft_slo_ms,
                "e2e_slo_ms": tenant.e2e_slo_ms,
            }
        )
    telemetry = snapshot.telemetry
    engine = None
    if telemetry is not None:
        engine = {
            "fresh": telemetry.fresh,
            "kv_cache_usage": telemetry.kv_cache_usage_perc,
            "running": telemetry.num_requests_running,
            "waiting": telemetry.num_requests_waiting,
            "gpu_utilization_pct": telemetry.gpu_utilization_pct
            if telemetry.gpu_available
            else None,
        }
    return {"pool": pool.name, "budget": pool.budget_slots, "tenants": tenants, "engine": engine}


class ChatAdvisor:
    """One per agent-policy pool; owns its HTTP session."""

    def __init__(self, pool: PoolConfig, settings: AgentPolicyConfig) -> None:
        self._pool = pool
        self._settings = settings
        self._session: aiohttp.ClientSession | None = None

    def use_pool(self, pool: PoolConfig) -> None:
        """Describe `pool` from the next question on (its tenants changed at run time)."""
        self._pool = pool

    async def advise(self, snapshot: PoolSnapshot) -> Advice:
        """The LLM's answer, or an Advice saying why there is none; never past the deadline."""
        settings = self._settings
        started = time.perf_counter()
        try:
            async with asyncio.timeout(settings.deadline_ms / 1000):
                content = await self._ask(snapshot)
        except TimeoutError:
            return Advice(error=f"late: no answer within {settings.deadline_ms:.0f} ms")
        except (aiohttp.ClientError, _EndpointError) as exc:
            return Advice(error=f"failed: {exc}", latency_ms=_since(started))
        return _parse(content, _since(started))

    async def _ask(self, snapshot: PoolSnapshot) -> str:
        if self._session is None:
            tls = self._settings.tls
            checked: ssl.SSLContext | bool = (
                True if tls is None else await asyncio.to_thread(client_ssl_context, tls)
            )
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=checked))
        settings = self._settings
        headers = {}
        if settings.api_key is not None:
            headers["Authorization"] = f"Bearer {reveal(settings.api_key)}"
        body = {
            "model": settings.model,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {
                    "role": "user",
                    "content": json.dumps(
                        {
                            "state": state_document(snapshot, self._pool),
                            "answer_schema": answer_schema(self._pool),
                        }
                    ),
                },
            ],
            "temperature": settings.temperature,
            "max_tokens": settings.max_tokens,
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "allocation",
                    "schema": answer_schema(self._pool),
                    "strict": True,
                },
            },
        }
        url = settings.url.rstrip("/") + "/chat/completions"
        async with self._session.post(url, json=body, headers=headers) as response:
            if response.status != 200:
                text = (await response.text())[:200]
                raise _EndpointError(f"HTTP {response.status}: {text}")
            try:
                reply = await response.json(content_type=None)
                return str(reply["choices"][0]["message"]["content"])
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                raise _EndpointError(f"not a chat completion: {exc!r}") from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class _EndpointError(Exception):
    """The endpoint answered, but not with a chat completion."""


def _parse(content: str, latency_ms: float) -> Advice:
    text = content.strip()
    if text.startswith("```"):
        # Models often fence JSON even when asked not to.
        text = text.strip("`").removeprefix("json").strip()
    try:
        answer = json.loads(text)
    except ValueError:
        return Advice(error=f"unparseable: {content[:80]!r}", latency_ms=latency_ms)
    if not isinstance(answer, dict) or not isinstance(answer.get("limits"), dict):
        return Advice(error="unparseable: no limits object", latency_ms=latency_ms)
    reason = answer.get("reason")
    return Advice(
        limits=answer["limits"],
        reason=reason if isinstance(reason, str) else "",
        latency_ms=latency_ms,
    )


def _since(started: float) -> float:
    return (time.perf_counter() - started) * 1000
