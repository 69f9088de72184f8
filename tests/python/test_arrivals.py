"""The shim's half of arrival order on a thread (core/arrivals.py), by its own events: a call's
turn comes once every call that arrived before it on its thread has left, however they leave."""

from __future__ import annotations

import asyncio

from wisp_shim.core.arrivals import Arrivals


async def test_a_turn_waits_for_every_call_ahead_even_one_that_left_early():
    line = Arrivals()
    a, b, c = line.arrive("t"), line.arrive("t"), line.arrive("t")
    other = line.arrive("u")
    assert not a.behind and b.behind and c.behind and not other.behind
    b.leave()  # b gave up (refused, cancelled) while a is still on its way
    turn = asyncio.ensure_future(c.turn())
    await asyncio.sleep(0)  # one loop pass: c's turn would have come now if b's leaving freed it
    assert not turn.done() and c.behind
    a.leave()
    await asyncio.wait_for(turn, 5)
    assert not c.behind
    c.leave()
    c.leave()  # leaving twice is leaving once
    other.leave()
    await asyncio.sleep(0)
    assert len(line) == 0  # no line is kept for a thread with no call waiting


async def test_a_cancelled_wait_leaves_the_call_ahead_untouched():
    line = Arrivals()
    a, b = line.arrive("t"), line.arrive("t")
    waiting = asyncio.ensure_future(b.turn())
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    b.leave()
    assert not a.behind
    c = line.arrive("t")
    assert c.behind  # behind a, which has not left
    a.leave()
    await asyncio.wait_for(c.turn(), 5)


async def test_a_call_without_a_thread_waits_for_none():
    line = Arrivals()
    p = line.arrive(None)
    assert not p.behind
    await asyncio.wait_for(p.turn(), 5)
    p.leave()
    assert len(line) == 0
