"""An asyncio event loop whose clock is virtual: with nothing ready, it jumps to its next timer.

The production asyncio code (the gateways' admission, the load's clients) runs on it unchanged:
`asyncio.sleep`, `call_later` and `wait_for` read the loop's time, which here is a VirtualClock
that only the loop advances. The selector never waits: asked to wait `timeout` seconds for I/O,
it moves the clock that far and reports nothing, so a run takes as long as its callbacks' CPU.
Nothing in the twin does I/O; a loop with nothing scheduled would wait forever, and says so.
"""

from __future__ import annotations

import asyncio
import contextvars
import selectors
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar, TypeVarTuple

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

WALL_ORIGIN_S = 1_750_000_000.0
"""The wall clock's reading at virtual time 0 (any fixed value: runs must be reproducible)."""


class VirtualDeadlock(RuntimeError):
    """The loop has nothing ready and no timer: in virtual time it would wait forever."""


class VirtualClock:
    """slotshift.clock.Clock over virtual seconds; only its event loop advances it."""

    def __init__(self, wall_origin_s: float = WALL_ORIGIN_S) -> None:
        self.now_s = 0.0
        self._wall_origin_s = wall_origin_s

    def monotonic(self) -> float:
        return self.now_s

    def wall(self) -> float:
        return self._wall_origin_s + self.now_s


class _VirtualSelector(selectors.BaseSelector):
    """Keeps registrations (the loop's self-pipe) and never reports an event; a wait advances
    the clock instead."""

    def __init__(self, clock: VirtualClock, on_idle: Callable[[], bool]) -> None:
        """on_idle: called when the loop would wait; True when it made something ready (the
        clock then stays where it is)."""
        self._clock = clock
        self._on_idle = on_idle
        self._keys: dict[int, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys.pop(fd)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if (timeout is None or timeout > 0) and self._on_idle():
            return []
        if timeout is None:
            raise VirtualDeadlock("nothing is ready and no timer is set: the run cannot go on")
        if timeout > 0:
            self._clock.now_s += timeout
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._keys

    def close(self) -> None:
        self._keys.clear()


class VirtualEventLoop(asyncio.SelectorEventLoop):
    """A selector event loop on a VirtualClock (see the module docstring)."""

    def __init__(self, clock: VirtualClock) -> None:
        self._settling: list[asyncio.Future[None]] = []
        super().__init__(selector=_VirtualSelector(clock, self._settle))
        self.clock = clock

    async def settled(self) -> None:
        """Return once everything due at this instant has run: nothing is ready and the next
        timer is later (the loop would move the clock). Every process waiting here resumes at
        that same instant, in the order they began to wait: several engines can each wait for
        the others' callbacks without yielding to one another forever."""
        future = self.create_future()
        self._settling.append(future)
        await future

    def _settle(self) -> bool:
        waiting, self._settling = self._settling, []
        woken = False
        for future in waiting:
            if not future.done():
                future.set_result(None)
                woken = True
        return woken

    def time(self) -> float:
        return self.clock.now_s

    def call_at(
        self,
        when: float,
        callback: Callable[[*_Ts], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        """Schedule `callback(*args)` at `when`; the clock reads at least `when` as it runs.

        asyncio runs a timer up to its clock's resolution early when other callbacks are ready
        (it does not wait for them); on a real clock the next look at the time has moved on,
        on this one it has not. Code that waits until a deadline in a loop (the gateway
        stream's push slots: `while now < slot: wait(slot - now)`) would then wait 1 ns again
        and again without the clock ever moving."""
        return super().call_at(when, self._at, when, callback, args, context=context)

    def _at(self, when: float, callback: Callable[[*_Ts], object], args: tuple[*_Ts]) -> None:
        self.clock.now_s = max(self.clock.now_s, when)
        callback(*args)

    def next_event_s(self) -> float:
        """A time before which the loop runs nothing: now while callbacks are ready, else its
        first timer's time (infinity without one). A process that knows nothing can happen
        before then may jump its own state there (the engine's decode runs)."""
        # asyncio keeps these in two attributes of BaseEventLoop; a subclass reads them. The
        # heap's head may be a cancelled timer, which is earlier than any live one: a bound
        # that is never late, found at once (the loop drops the head when it comes due).
        if self._ready:  # type: ignore[attr-defined]
            return self.clock.now_s
        scheduled = self._scheduled  # type: ignore[attr-defined]
        return scheduled[0].when() if scheduled else float("inf")


def run_virtual(main: Coroutine[Any, Any, _T], clock: VirtualClock) -> _T:
    """Run `main` to its end on a new VirtualEventLoop over `clock`, then close the loop."""
    loop = VirtualEventLoop(clock)
    try:
        return loop.run_until_complete(main)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
