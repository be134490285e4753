"""The newest-wins box: a newer value replaces an untaken one; wake and close answer None."""

from __future__ import annotations

import asyncio

from slotshift.newest import NewestBox


def test_a_newer_value_replaces_one_never_taken() -> None:
    box: NewestBox[int] = NewestBox()
    assert box.put(1) is False
    assert box.put(2) is True
    assert box.take_nowait() == 2
    assert box.take_nowait() is None


def test_a_value_put_back_loses_to_a_newer_one() -> None:
    box: NewestBox[int] = NewestBox()
    box.put_back(1)
    assert box.take_nowait() == 1
    box.put(2)
    box.put_back(1)
    assert box.take_nowait() == 2


async def test_take_waits_for_a_value_and_wake_answers_none() -> None:
    box: NewestBox[int] = NewestBox()
    taking = asyncio.create_task(box.take(), name="take")
    await asyncio.sleep(0)
    assert not taking.done()
    box.put(7)
    assert await taking == 7
    woken = asyncio.create_task(box.take(), name="take")
    await asyncio.sleep(0)
    box.wake()
    assert await woken is None


async def test_a_closed_box_answers_none_and_drops_its_value() -> None:
    box: NewestBox[int] = NewestBox()
    box.put(1)
    box.close()
    assert box.take_nowait() is None
    assert await box.take() is None
    box.put(2)
    assert await box.take() is None


async def test_wait_ready_returns_on_a_put_before_its_timeout_and_takes_nothing() -> None:
    box: NewestBox[int] = NewestBox()
    box.put_back(1)
    assert box.take_nowait() == 1
    waiting = asyncio.create_task(box.wait_ready(60.0), name="wait-ready")
    await asyncio.sleep(0)
    assert not waiting.done()
    box.put(2)
    await asyncio.wait_for(waiting, 5.0)
    assert box.take_nowait() == 2, "waiting took nothing"


async def test_wait_ready_gives_up_after_its_timeout() -> None:
    box: NewestBox[int] = NewestBox()
    await box.wait_ready(0.001)
    assert box.take_nowait() is None
    box.close()
    assert box.closed
    await box.wait_ready(60.0)  # a closed box is ready at once
