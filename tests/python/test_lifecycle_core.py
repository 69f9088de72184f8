"""The core's side of a call's lifecycle, end to end: eviction notices keep the shim's view of
live threads exact across a crash, and a call past its time limit never keeps its turn, even
when the core was stopped past the deadline and the model's answer was ready when it resumed.

The same rules are tested race by race against the core alone in
tests/swift/WispCoreTests/LifecycleTests.swift."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time

import pytest

from harness import error_text, errlog_text, held, ok, release, wisp


def _core_pid(client) -> int:
    pids = [int(m) for m in re.findall(r"wisp-core ready: pid (\d+)", errlog_text(client.errlog))]
    assert pids, "the core never said it was ready"
    return pids[-1]


async def test_a_thread_evicted_before_a_crash_is_not_reported_lost():
    async with wisp("--max-threads", "1") as c:
        assert ok(await c.call_tool("respond", {"prompt": "hi", "thread_id": "old"}))["created"]
        assert ok(await c.call_tool("respond", {"prompt": "hi", "thread_id": "new"}))["created"]  # evicts "old"
        assert error_text(await c.call_tool("respond", {"prompt": "!crash", "thread_id": "new"})).startswith("core_crashed:")
        # "old" was gone before the crash: the ordinary evicted behaviour, not thread_lost.
        back = ok(await c.call_tool("respond", {"prompt": "again", "thread_id": "old"}))
        assert (back["created"], back["text"]) == (True, "echo 1: again")


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs POSIX job-control signals (SIGSTOP/SIGCONT)")
async def test_a_turn_past_its_time_limit_is_not_kept_when_a_stopped_core_resumes():
    async with wisp("--timeout", "1") as c:
        assert ok(await c.call_tool("respond", {"prompt": "one", "thread_id": "t"}))["text"] == "echo 1: one"
        core = _core_pid(c)
        slow = asyncio.create_task(c.call_tool("respond", {"prompt": "!hold two two", "thread_id": "t"}))
        await held(c, "two")  # the core has the call and is in it, parked
        os.kill(core, signal.SIGSTOP)
        try:
            # Kept: the time passing while the core is stopped is the thing tested (past the 1 s limit).
            await asyncio.sleep(1.6)
        finally:
            os.kill(core, signal.SIGCONT)
        # The answer ready on resume (or the deadline first): either way the deadline is long gone.
        await release(c, "two")
        start = time.monotonic()
        msg = error_text(await asyncio.wait_for(slow, 10))
        assert msg.startswith("timeout:"), msg
        assert time.monotonic() - start < 5
        # The timed-out call left the thread as it was.
        s = ok(await c.call_tool("respond", {"prompt": "three", "thread_id": "t"}))
        assert s["text"] == "echo 2: three", s["text"]
        assert _core_pid(c) == core, "the core was restarted, which would hide a kept turn"
