"""The control loop of one pool: gather, compute, hold the reserves, validate, publish; every
period.

Every policy's limits are made to obey the reserve rule (controlplane/core/reserves.py) before
they are validated (controlplane/core/publishable.py), so reserves hold whatever the policy; an
invalid or failed decision keeps the last good allocation and is logged as rejected.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Protocol

from opentelemetry import trace
from opentelemetry.context import Context

from controlplane.core.pacing import paced_rest_s
from controlplane.core.policy import AllocationPolicy
from controlplane.core.publishable import holding_reserves
from controlplane.core.snapshot import Advice, PoolSnapshot
from controlplane.core.validation import InvalidAllocation
from controlplane.decision_log import DecisionOutcome, DecisionRecord
from controlplane.decision_trace import DECISION_SPAN, describe, telemetry_links
from controlplane.pool_state import PoolState
from slotshift.clock import Clock
from slotshift.trace_context import carrier_of

logger = logging.getLogger(__name__)

DecisionObserver = Callable[[DecisionRecord], None]
"""Called with every decision record (metrics hook it)."""


class Advisor(Protocol):
    """An outside decision function the loop asks before a policy that needs advice decides
    (controlplane/agent_advisor.py). It must answer within its own deadline and never raise."""

    async def advise(self, snapshot: PoolSnapshot) -> Advice: ...


class DecisionLoop:
    """Runs one pool's policy every `decision_period_s` against its PoolState.

    Each decision is traced as a root span ("decision", see decision_trace.py) linked to the
    telemetry report it used; the allocation it publishes is pushed under it.
    """

    def __init__(
        self,
        state: PoolState,
        policy: AllocationPolicy,
        *,
        clock: Clock,
        observers: list[DecisionObserver] | None = None,
        tracer: trace.Tracer | None = None,
        advisor: Advisor | None = None,
    ) -> None:
        if policy.needs_advice and advisor is None:
            raise ValueError(f"policy {policy.name} needs an advisor")
        self.state = state
        self.policy = policy
        self._advisor = advisor
        self._clock = clock
        self._observers = list(observers or [])
        self._tracer = tracer if tracer is not None else trace.NoOpTracer()

    def replace_policy(self, policy: AllocationPolicy, advisor: Advisor | None) -> None:
        """Decide with `policy` from the next decision on (the pool's policy changed)."""
        if policy.needs_advice and advisor is None:
            raise ValueError(f"policy {policy.name} needs an advisor")
        self.policy = policy
        self._advisor = advisor
        self.state.policy_state = None

    async def decide(self, *, trigger: str = "period") -> DecisionRecord:
        """Gather (the advisor's answer, when the policy needs one), then decide_once."""
        advice = None
        if self.policy.needs_advice and self._advisor is not None:
            advice = await self._advisor.advise(self.state.snapshot())
        return self.decide_once(trigger=trigger, advice=advice)

    def decide_once(
        self, *, trigger: str = "period", advice: Advice | None = None
    ) -> DecisionRecord:
        """One decision, synchronously: the whole control step, testable without a loop.

        trigger: why the decision runs now ("period", or the fast path's reason).
        advice: the advisor's answer, gathered before, for policies that need one.
        """
        state = self.state
        telemetry = state.telemetry
        with self._tracer.start_as_current_span(
            DECISION_SPAN,
            # An empty context: a decision is a trace of its own, whatever runs around it.
            context=Context(),
            links=telemetry_links(telemetry.trace_context if telemetry is not None else None),
        ) as span:
            limits_before = dict(state.allocation.tenant_limits)
            record = self._decide(trigger, span, advice)
            describe(span, record, state.pool, limits_before)
        for observer in self._observers:
            observer(record)
        return record

    def _decide(self, trigger: str, span: trace.Span, advice: Advice | None) -> DecisionRecord:
        state = self.state
        pool = state.policy_pool
        trace_context = carrier_of(span)
        # Every period the pool's limits are split anew by where the demand is; a decision the
        # fast path or a config change asks for moves only the tenants whose limit it moved.
        whole = trigger == "period"
        state.expire_leases()
        snapshot = state.snapshot()
        if advice is not None:
            snapshot = dataclasses.replace(snapshot, advice=advice)
        decision_id = state.decisions.next_id()
        # Policy cost is measured in real CPU time: it is a property of the code, not of the
        # injected clock.
        started = time.perf_counter()
        outcome = DecisionOutcome.HELD
        fallback: str | None = None
        try:
            decision = holding_reserves(
                self.policy.decide(snapshot, pool, state.policy_state), pool
            )
        except InvalidAllocation as exc:
            outcome = DecisionOutcome.REJECTED
            reason = f"invalid allocation: {exc}"
            logger.error(
                "pool %s: %s; keeping version %d", pool.name, reason, state.allocation.version
            )
        except Exception as exc:
            # A policy is a plug-in: whatever it raises, the loop keeps the last good allocation
            # and goes on; the traceback is logged for whoever wrote the policy.
            outcome = DecisionOutcome.REJECTED
            reason = f"policy {self.policy.name} failed: {type(exc).__name__}: {exc}"
            logger.exception(
                "pool %s: %s; keeping version %d", pool.name, reason, state.allocation.version
            )
        else:
            state.policy_state = decision.state
            reason = decision.reason
            fallback = decision.fallback
            if fallback is not None:
                logger.warning(
                    "pool %s: policy %s fell back: %s", pool.name, self.policy.name, fallback
                )
            if dict(decision.limits) != dict(state.allocation.tenant_limits):
                previous = dict(state.allocation.tenant_limits)
                state.apply_limits(
                    decision.limits,
                    decision_id,
                    self.policy.name,
                    trace_context=trace_context,
                    resplit=whole,
                )
                outcome = DecisionOutcome.PUBLISHED
                logger.info(
                    "pool %s v%d: %s -> %s (%s)",
                    pool.name,
                    state.allocation.version,
                    previous,
                    dict(decision.limits),
                    reason,
                )
            else:
                # The tenant limits hold, but where their demand is may have moved between
                # gateways (a gateway that uses all its part never looks stale to the others'
                # queues).
                state.reconcile(resplit=whole, trace_context=trace_context)
        duration_ms = (time.perf_counter() - started) * 1000
        record = DecisionRecord(
            id=decision_id,
            pool=pool.name,
            decided_at_wall_s=self._clock.wall(),
            policy=self.policy.name,
            trigger=trigger,
            outcome=outcome,
            reason=reason,
            version=state.allocation.version,
            budget_slots=pool.budget_slots,
            inputs=snapshot.tenants,
            telemetry=snapshot.telemetry,
            outputs=dict(state.allocation.tenant_limits),
            duration_ms=duration_ms,
            fallback=fallback,
        )
        state.decisions.append(record)
        return record

    async def run(self) -> None:
        """Decide now, then every period, or sooner when the fast path asks (at once, unless
        the last decision began less than fast_path_min_interval_s ago or the fast path would
        take more than fast_path_max_cores of a core: then when that is over), until
        cancelled."""
        wanted = self.state.decision_wanted
        trigger = "period"
        while True:
            pool = self.state.pool
            wanted.clear()
            began = self._clock.monotonic()
            await self.decide(trigger=trigger)
            ended = self._clock.monotonic()
            try:
                await asyncio.wait_for(wanted.wait(), timeout=pool.decision_period_s)
            except TimeoutError:
                trigger = "period"
            else:
                trigger = self.state.fast_path_reason
                # Rate limit: a burst of reports must not turn into a burst of decisions. A wish
                # after a quiet spell is served at once: a lender's first queued request must
                # not wait out an interval nobody used.
                delay_s = paced_rest_s(
                    began, ended, pool.fast_path_min_interval_s, pool.fast_path_max_cores
                ) - (self._clock.monotonic() - ended)
                if delay_s > 0:
                    await asyncio.sleep(delay_s)
