"""Which control-plane replica leads: a lease row in the shared state store, with a TTL.

Every replica runs a LeaderElection on the same lease. The leader renews it every third of its
TTL; a follower tries to take it every third of the TTL, and just after the moment the store
says it expires. Taking it raises its epoch, which every allocation the leader publishes
carries: a gateway that has seen epoch N refuses updates of any epoch below N
(admission_gateway/control_session.py), so an old leader cut off from the store cannot hand out
budget once its successor has spoken.

Why a lease row rather than a PostgreSQL advisory lock held on a session: with a lock, the
server frees it when its TCP keepalives give up on the dead session, and the old holder learns
that its session is dead from its own keepalives; those are two timers on two machines, so for
a while both replicas may think they lead, and the takeover time is a sum of server and client
socket settings (and does not survive a connection pooler). A lease's expiry is one number on
the store's clock: a follower takes over exactly `ttl_s` after the last renewal, and the leader
stops on its own monotonic clock before that (`CLOCK_RATE_MARGIN` earlier, counted from when it
sent the renewal, which the store ran later), whether or not it can reach the store. The cost
is one small write every third of the TTL.

A leader that loses its lease (not renewed in time, or taken) is deposed: `on_deposed` is
called at once and the election ends; the control plane then stops publishing and drops its
streams (controlplane/server.py). It does not stand again in the same process: its pools'
state is that of a leader, so it exits and comes back as a fresh follower.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from controlplane.store.base import Lease, StoreError
from slotshift.clock import Clock

logger = logging.getLogger(__name__)

LEASE_NAME = "controlplane"
"""The one lease the replicas of a control plane share (every pool has the same leader)."""

CLOCK_RATE_MARGIN = 0.05
"""The leader gives its lease up this fraction of the TTL before the store would let it expire:
room for its clock running slower than the store's."""

RENEWALS_PER_TTL = 3
"""Renewal attempts within one TTL: two may fail before the leader steps down."""

EXPIRY_SLACK_S = 0.01
"""How long after a lease's expiry (by the store's word) a follower tries to take it."""


class LeaseStore(Protocol):
    """The state store's lease methods (controlplane/store/base.py)."""

    async def acquire_lease(self, name: str, holder: str, ttl_s: float) -> Lease: ...

    async def renew_lease(self, name: str, holder: str, epoch: int, ttl_s: float) -> bool: ...

    async def release_lease(self, name: str, holder: str, epoch: int) -> None: ...


Elected = Callable[[int], Awaitable[None]]
"""Awaited with the new epoch when this replica takes the lease; it readies the replica to lead
(the lease is renewed once it returns). What it raises ends the election (run() raises it)."""

Deposed = Callable[[str], None]
"""Called, with why, the moment this replica stops leading; it must not block or await."""

Sleep = Callable[[float], Coroutine[Any, Any, None]]
"""Waits the given seconds (asyncio.sleep; tests pass one that moves a manual clock)."""


class LeaderElection:
    """This replica's part in the election of `name` (module docstring). run() as a
    supervised task; `leading` and `epoch` say where it stands.

    holder: this replica's name, unique among the replicas (one taking its own name's lease
    takes it at once: it is a restart of the same replica).
    ttl_s: the lease's TTL (controlplane.leader_lease_ttl_s); ValueError unless positive.
    """

    def __init__(
        self,
        leases: LeaseStore,
        *,
        holder: str,
        ttl_s: float,
        clock: Clock,
        on_elected: Elected,
        on_deposed: Deposed,
        name: str = LEASE_NAME,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, not {ttl_s}")
        self._leases = leases
        self.holder = holder
        self.name = name
        self.ttl_s = ttl_s
        self._clock = clock
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        self._sleep = sleep
        self._interval_s = ttl_s / RENEWALS_PER_TTL
        self.leading = False
        self.deposed = False
        """Whether it led and stopped: the election is over for this replica."""
        self.epoch = 0
        """The epoch of the lease this replica holds or last held; 0: it never led."""
        self._deadline_s = 0.0
        """While leading: when it must stop (its monotonic clock), short of a renewal."""
        self._failing = False

    async def run(self) -> None:
        """Stand, lead while the lease is renewed, until deposed (returns) or cancelled (a
        leader resigns first: `resign`). Store errors are logged and retried."""
        try:
            while not self.deposed:
                await self._sleep(await self.step())
        except asyncio.CancelledError:
            await asyncio.shield(self.resign())
            raise

    async def step(self) -> float:
        """One attempt: renew the lease when leading, try to take it otherwise; the seconds to
        wait before the next. May call on_elected (awaited) or on_deposed."""
        if self.deposed:
            return self._interval_s
        if self.leading:
            return await self._renew()
        return await self._stand()

    def depose(self, reason: str) -> None:
        """Stop leading now (on_deposed is called) and end the election; nothing when not
        leading."""
        if not self.leading:
            return
        self.leading = False
        self.deposed = True
        logger.error("leader lease %s epoch %d lost: %s", self.name, self.epoch, reason)
        self._on_deposed(reason)

    async def resign(self) -> None:
        """Give the lease up (a follower may take it at once) and stop leading, when leading:
        a replica that stops in order. A store error is logged: the lease then expires."""
        if not self.leading:
            return
        self.depose("resigned")
        try:
            await self._leases.release_lease(self.name, self.holder, self.epoch)
        except StoreError as exc:
            logger.warning("leader lease %s: cannot release it (it expires): %s", self.name, exc)

    async def _stand(self) -> float:
        sent_s = self._clock.monotonic()
        try:
            async with asyncio.timeout(self._interval_s):
                lease = await self._leases.acquire_lease(self.name, self.holder, self.ttl_s)
        except (StoreError, TimeoutError) as exc:
            self._store_failed(exc)
            return self._interval_s
        self._store_works()
        if lease.holder != self.holder or lease.epoch <= self.epoch:
            # The store's word on when it expires: try just after, at most a period from now.
            return min(max(lease.remaining_s, 0.0) + EXPIRY_SLACK_S, self._interval_s)
        self.leading = True
        self.epoch = lease.epoch
        self._deadline_s = sent_s + self.ttl_s * (1 - CLOCK_RATE_MARGIN)
        logger.info("leader lease %s taken: %s leads, epoch %d", self.name, self.holder, self.epoch)
        await self._on_elected(self.epoch)
        return self._until_renewal()

    async def _renew(self) -> float:
        sent_s = self._clock.monotonic()
        left_s = self._deadline_s - sent_s
        if left_s <= 0:
            self.depose(f"not renewed within {self.ttl_s:.1f} s")
            return self._interval_s
        try:
            async with asyncio.timeout(left_s):
                renewed = await self._leases.renew_lease(
                    self.name, self.holder, self.epoch, self.ttl_s
                )
        except (StoreError, TimeoutError) as exc:
            self._store_failed(exc)
            if self._clock.monotonic() >= self._deadline_s:
                self.depose(f"the store could not renew it within {self.ttl_s:.1f} s")
            return self._until_renewal()
        self._store_works()
        if not renewed:
            self.depose("another replica holds it, or it expired")
            return self._interval_s
        self._deadline_s = sent_s + self.ttl_s * (1 - CLOCK_RATE_MARGIN)
        return self._until_renewal()

    def _until_renewal(self) -> float:
        """A renewal period from now, but never past the deadline (a last try comes then)."""
        left_s = self._deadline_s - self._clock.monotonic()
        return max(0.0, min(self._interval_s, left_s))

    def _store_failed(self, exc: Exception) -> None:
        if not self._failing:
            logger.error("leader lease %s: the store does not answer: %r", self.name, exc)
        self._failing = True

    def _store_works(self) -> None:
        if self._failing:
            logger.info("leader lease %s: the store answers again", self.name)
        self._failing = False
