"""The leader election (controlplane/leadership.py) over an in-memory lease on a manual clock:
two replicas stepped in time order, as their sleeps would wake them."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from controlplane.leadership import CLOCK_RATE_MARGIN, EXPIRY_SLACK_S, LeaderElection
from controlplane.store.base import Lease, StoreError
from slotshift.clock import ManualClock

TTL_S = 3.0


@dataclass
class MemoryLeases:
    """The store's lease methods, on the test's clock (as the store's own clock)."""

    clock: ManualClock
    holder: str = ""
    epoch: int = 0
    expires_s: float = 0.0
    failing: bool = False

    def _check(self) -> None:
        if self.failing:
            raise StoreError("the store is down")

    async def acquire_lease(self, name: str, holder: str, ttl_s: float) -> Lease:
        self._check()
        now = self.clock.monotonic()
        if self.expires_s <= now or self.holder == holder:
            self.holder, self.epoch, self.expires_s = holder, self.epoch + 1, now + ttl_s
        return Lease(self.holder, self.epoch, self.expires_s - now)

    async def renew_lease(self, name: str, holder: str, epoch: int, ttl_s: float) -> bool:
        self._check()
        now = self.clock.monotonic()
        if (self.holder, self.epoch) != (holder, epoch) or self.expires_s <= now:
            return False
        self.expires_s = now + ttl_s
        return True

    async def release_lease(self, name: str, holder: str, epoch: int) -> None:
        self._check()
        if (self.holder, self.epoch) == (holder, epoch):
            self.expires_s = 0.0


@dataclass
class Replica:
    election: LeaderElection
    elected: list[tuple[float, int]] = field(default_factory=list)
    deposed: list[tuple[float, str]] = field(default_factory=list)
    next_step_s: float = 0.0
    alive: bool = True


@dataclass
class Cluster:
    clock: ManualClock
    leases: MemoryLeases
    replicas: dict[str, Replica] = field(default_factory=dict)

    def add(self, name: str) -> Replica:
        replica: Replica

        async def elected(epoch: int) -> None:
            replica.elected.append((self.clock.monotonic(), epoch))

        def deposed(reason: str) -> None:
            replica.deposed.append((self.clock.monotonic(), reason))

        replica = Replica(
            LeaderElection(
                self.leases,
                holder=name,
                ttl_s=TTL_S,
                clock=self.clock,
                on_elected=elected,
                on_deposed=deposed,
            ),
            next_step_s=self.clock.monotonic(),
        )
        self.replicas[name] = replica
        return replica

    async def run_until(self, end_s: float) -> None:
        """Step the live replicas in the order their waits end, until `end_s`."""
        while True:
            live = [r for r in self.replicas.values() if r.alive and not r.election.deposed]
            if not live:
                break
            replica = min(live, key=lambda r: r.next_step_s)
            if replica.next_step_s > end_s:
                break
            self.clock.advance(max(0.0, replica.next_step_s - self.clock.monotonic()))
            replica.next_step_s = self.clock.monotonic() + await replica.election.step()
        self.clock.advance(max(0.0, end_s - self.clock.monotonic()))

    def leaders(self) -> list[str]:
        return [n for n, r in self.replicas.items() if r.alive and r.election.leading]


@pytest.fixture
def cluster() -> Cluster:
    clock = ManualClock()
    return Cluster(clock, MemoryLeases(clock))


async def test_one_leads_while_it_renews_and_the_other_follows(cluster: Cluster) -> None:
    a = cluster.add("a")
    b = cluster.add("b")
    await cluster.run_until(cluster.clock.monotonic() + 60 * TTL_S)
    assert cluster.leaders() == ["a"]
    assert [epoch for _, epoch in a.elected] == [1]
    assert b.elected == [] and a.deposed == []


async def test_a_follower_takes_over_within_one_ttl_of_the_leaders_death(
    cluster: Cluster,
) -> None:
    a = cluster.add("a")
    b = cluster.add("b")
    start = cluster.clock.monotonic()
    await cluster.run_until(start + 10.0)
    a.alive = False  # kill -9: it renews no more
    died_s = cluster.clock.monotonic()
    await cluster.run_until(died_s + 2 * TTL_S)
    assert cluster.leaders() == ["b"]
    (taken_s, epoch), *_ = b.elected
    assert epoch == 2
    assert taken_s - died_s <= TTL_S + EXPIRY_SLACK_S + 1e-9
    assert a.deposed == []


async def test_a_leader_cut_off_from_the_store_stops_before_anyone_may_take_over(
    cluster: Cluster,
) -> None:
    a = cluster.add("a")
    await cluster.run_until(cluster.clock.monotonic() + 5.0)
    renewed_s = cluster.leases.expires_s - TTL_S
    cluster.leases.failing = True
    await cluster.run_until(cluster.clock.monotonic() + 2 * TTL_S)
    assert a.election.deposed and not a.election.leading
    ((deposed_s, reason),) = a.deposed
    assert "could not renew" in reason or "not renewed" in reason
    # Deposed on its own clock no later than the margin before the store would free the lease.
    assert deposed_s <= renewed_s + TTL_S * (1 - CLOCK_RATE_MARGIN) + 1e-9
    assert deposed_s < cluster.leases.expires_s


async def test_a_leader_whose_lease_was_taken_is_deposed_at_its_next_renewal(
    cluster: Cluster,
) -> None:
    a = cluster.add("a")
    await cluster.run_until(cluster.clock.monotonic() + 1.0)
    # Another replica under a new epoch (as a partition healing would show it).
    cluster.leases.holder, cluster.leases.epoch = "b", cluster.leases.epoch + 1
    await cluster.run_until(cluster.clock.monotonic() + TTL_S)
    ((_, reason),) = a.deposed
    assert "another replica" in reason
    assert cluster.leaders() == []


async def test_a_resigning_leader_hands_over_at_once(cluster: Cluster) -> None:
    a = cluster.add("a")
    b = cluster.add("b")
    await cluster.run_until(cluster.clock.monotonic() + 4.0)
    await a.election.resign()
    resigned_s = cluster.clock.monotonic()
    await cluster.run_until(resigned_s + TTL_S)
    assert cluster.leaders() == ["b"]
    (taken_s, epoch), *_ = b.elected
    # At b's next attempt, a period at most: not a TTL.
    assert epoch == 2 and taken_s - resigned_s <= TTL_S / 3 + 1e-9


async def test_a_restarted_replica_takes_its_own_lease_back_at_once(cluster: Cluster) -> None:
    a = cluster.add("a")
    cluster.add("b")
    await cluster.run_until(cluster.clock.monotonic() + 2.0)
    a.alive = False
    restarted = cluster.add("a")
    await cluster.run_until(cluster.clock.monotonic() + 0.001)
    assert restarted.elected and restarted.elected[0][1] == 2
    assert cluster.leaders() == ["a"]


async def test_a_follower_keeps_trying_while_the_store_is_down(cluster: Cluster) -> None:
    cluster.leases.failing = True
    a = cluster.add("a")
    await cluster.run_until(cluster.clock.monotonic() + 2 * TTL_S)
    assert a.elected == []
    cluster.leases.failing = False
    await cluster.run_until(cluster.clock.monotonic() + TTL_S / 3)
    assert cluster.leaders() == ["a"]


def test_the_ttl_must_be_positive(cluster: Cluster) -> None:
    async def elected(_: int) -> None:
        return None

    with pytest.raises(ValueError, match="ttl_s"):
        LeaderElection(
            cluster.leases,
            holder="a",
            ttl_s=0,
            clock=cluster.clock,
            on_elected=elected,
            on_deposed=lambda _: None,
        )
