"""Each tenant's tokens in one pool, from its gateways' full reports (docs/operations.md,
"Tokens per tenant").

A gateway counts its tenants' prompt and completion tokens from the engine's usage and sends its
counters (each since it started, per tenant and model) in every full report, acknowledgement
and hello, not in deltas. The ledger keeps each gateway's two newest samples: the totals are the
newest counters summed over the gateways the pool counts; the rate is each gateway's increase
between its two newest samples over the time between them (the control plane's clock, as they
arrived), summed over the gateways. A counter that fell (the gateway restarted under the same id)
counts its new value as the increase. A gateway is forgotten when its lease ends, as its other
figures are. The cost is proportional to the tokens a report names.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TokenCount:
    """One tenant's tokens for one model at one gateway, since that gateway started."""

    tenant: str
    model: str
    prompt_tokens_total: int
    completion_tokens_total: int


@dataclass(frozen=True, slots=True)
class TokenRate:
    """One tenant's tokens in the pool: totals and per-second rates (see the module docstring)."""

    prompt_tokens_total: int = 0
    completion_tokens_total: int = 0
    prompt_tokens_per_s: float = 0.0
    completion_tokens_per_s: float = 0.0


_Totals = dict[str, tuple[int, int]]
"""tenant -> (prompt, completion) tokens, summed over its models."""


@dataclass(slots=True)
class _Samples:
    newest_at_s: float
    newest: _Totals
    rate: dict[str, tuple[float, float]]
    """tenant -> (prompt, completion) tokens per second between the two newest samples."""


class TokenLedger:
    """The tokens of one pool's tenants, from its gateways' full reports."""

    def __init__(self) -> None:
        self._gateways: dict[str, _Samples] = {}

    def record(self, gateway_id: str, counts: Iterable[TokenCount], now_s: float) -> None:
        """A full report of `gateway_id`'s counters, received at `now_s` (monotonic seconds)."""
        newest: _Totals = {}
        for count in counts:
            prompt, completion = newest.get(count.tenant, (0, 0))
            newest[count.tenant] = (
                prompt + count.prompt_tokens_total,
                completion + count.completion_tokens_total,
            )
        before = self._gateways.get(gateway_id)
        rate: dict[str, tuple[float, float]] = {}
        if before is not None and now_s > before.newest_at_s:
            elapsed_s = now_s - before.newest_at_s
            for tenant, (prompt, completion) in newest.items():
                was_prompt, was_completion = before.newest.get(tenant, (0, 0))
                rate[tenant] = (
                    _increase(was_prompt, prompt) / elapsed_s,
                    _increase(was_completion, completion) / elapsed_s,
                )
        elif before is not None:
            rate = before.rate
        self._gateways[gateway_id] = _Samples(now_s, newest, rate)

    def forget(self, gateway_id: str) -> None:
        """The gateway's lease ended: its tokens no longer count."""
        self._gateways.pop(gateway_id, None)

    def rates(self) -> dict[str, TokenRate]:
        """tenant -> its tokens over the gateways counted now (tenants no gateway named: none)."""
        sums: dict[str, list[float]] = {}
        for samples in self._gateways.values():
            for tenant, (prompt, completion) in samples.newest.items():
                row = sums.setdefault(tenant, [0, 0, 0.0, 0.0])
                row[0] += prompt
                row[1] += completion
            for tenant, (prompt_per_s, completion_per_s) in samples.rate.items():
                row = sums.setdefault(tenant, [0, 0, 0.0, 0.0])
                row[2] += prompt_per_s
                row[3] += completion_per_s
        return {
            tenant: TokenRate(int(row[0]), int(row[1]), row[2], row[3])
            for tenant, row in sums.items()
        }


def _increase(before: int, after: int) -> int:
    """How much a counter rose; one that fell was reset (its gateway restarted)."""
    return after - before if after >= before else after
