"""The core dying or wedging under the shim: kill -9 mid-call and under load, a crash by
itself, a core that dies before it is ready, one that stops answering (the watchdog and the
time limit), and which threads are then reported lost."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
import time
from pathlib import Path

import anyio
import psutil
import pytest

from harness import (core_pids, error_text, fake_core_binary, fake_core_starts, held, ok, release, shim_env,
                     stub_core, wait_for, wisp)



async def test_crash_fails_pending_calls_restarts_and_reports_lost_threads():
    async with wisp() as c:
        alive = ok(await c.call_tool("respond", {"prompt": "keep me", "thread_id": "alive"}))
        assert alive["created"]
        slow = asyncio.create_task(c.call_tool("respond", {"prompt": "!hold never slow", "thread_id": "slow"}))
        await held(c, "never")
        crash = await c.call_tool("respond", {"prompt": "!crash", "thread_id": "doomed"})
        msg = error_text(crash)
        assert msg.startswith("core_crashed:") and "doomed" in msg and "restarted" in msg
        # The call that was running elsewhere, parked and never released, fails with the crash.
        slow_msg = error_text(await slow)
        assert slow_msg.startswith("core_crashed:") and "slow" in slow_msg
        # The next call naming a thread that was alive at the crash is told its history is gone...
        lost = error_text(await c.call_tool("respond", {"prompt": "still there?", "thread_id": "alive"}))
        assert lost.startswith("thread_lost:") and "alive" in lost and "lost" in lost
        # ...once: calling again starts a new thread under that id, on the restarted core.
        again = ok(await c.call_tool("respond", {"prompt": "again", "thread_id": "alive"}))
        assert (again["created"], again["text"]) == (True, "echo 1: again")
        # Other work is served normally.
        assert ok(await c.call_tool("respond", {"prompt": "fresh"}))["text"] == "echo 1: fresh"
        assert ok(await c.call_tool("respond", {"prompt": "back", "thread_id": "doomed"}))["created"] is True


async def test_core_that_dies_before_ready_is_a_tool_error_not_a_hang(tmp_path):
    broken = tmp_path / "wisp-core"
    broken.write_text("#!/bin/sh\necho 'broken core' >&2\nexit 3\n")
    broken.chmod(broken.stat().st_mode | stat.S_IXUSR)
    async with wisp(core=str(broken)) as c:
        with anyio.fail_after(10):
            msg = error_text(await c.call_tool("respond", {"prompt": "hi"}))
        assert msg.startswith("core_unavailable:") and "status 3" in msg


async def test_shim_time_limit_catches_a_core_that_stops_answering(tmp_path):
    # The core never replies: only the shim's own timer can end the call, and it fires at the
    # user's limit (plus the 0.25 s given to a reply racing the cancel), not at limit + 3 s.
    stub = stub_core(tmp_path, "sys.stdin.buffer.read()\n")
    async with wisp("--timeout", "0.5", core=stub) as c:
        start = time.monotonic()
        with anyio.fail_after(10):
            msg = error_text(await c.call_tool("respond", {"prompt": "anyone?", "thread_id": "t"}))
        took = time.monotonic() - start
        assert msg.startswith("timeout: no reply within 0.5 s; the call was stopped and thread 't' is unchanged"), msg
        assert 0.5 <= took < 1.5, took


async def test_a_core_killed_while_idle_loses_every_live_thread():
    from harness import children

    async with wisp() as c:
        for tid in ("a", "b"):
            ok(await c.call_tool("respond", {"prompt": "hello", "thread_id": tid}))
        ok(await c.call_tool("close_thread", {"thread_id": "b"}))
        cores = [k for shim in children(os.getpid()) for k in children(shim)]
        assert len(cores) == 1, cores
        os.kill(cores[0], signal.SIGKILL)
        await wait_for(lambda: len(core_pids(c)) == 2, 10)  # the shim saw it die and started another
        msg = error_text(await c.call_tool("respond", {"prompt": "still?", "thread_id": "a"}))
        assert msg.startswith("thread_lost:"), msg
        # b was closed before the crash: nothing was lost, it simply starts anew.
        s = ok(await c.call_tool("respond", {"prompt": "new", "thread_id": "b"}))
        assert (s["created"], s["text"]) == (True, "echo 1: new")
        assert ok(await c.call_tool("respond", {"prompt": "again", "thread_id": "a"}))["text"] == "echo 1: again"


async def test_a_thread_closed_while_a_call_runs_is_not_reported_lost_later():
    async with wisp() as c:
        ok(await c.call_tool("respond", {"prompt": "hello", "thread_id": "x"}))
        async with anyio.create_task_group() as tg:
            results = []

            async def slow() -> None:
                results.append(ok(await c.call_tool("respond", {"prompt": "!hold busy x", "thread_id": "x"})))

            tg.start_soon(slow)
            await held(c, "busy")
            assert ok(await c.call_tool("close_thread", {"thread_id": "x"}))["closed"] is True
            assert await release(c, "busy") == 1
        assert results[0]["text"] == "echo 2: !hold busy x"  # an accepted call still finishes
        error_text(await c.call_tool("respond", {"prompt": "!crash", "thread_id": "other"}))
        # x was closed before the crash, so nothing of it was lost: it simply starts anew.
        s = ok(await c.call_tool("respond", {"prompt": "new", "thread_id": "x"}))
        assert (s["created"], s["text"]) == (True, "echo 1: new")


async def test_the_time_limit_holds_while_the_core_is_stopped():
    """--timeout 2 with the core SIGSTOPped mid-call: the timeout arrives at the user's limit
    and names it; once the core runs again, the timed-out turn was not kept."""
    import psutil

    from harness import core_pids

    async with wisp("--timeout", "2") as c:
        assert ok(await c.call_tool("respond", {"prompt": "one", "thread_id": "t"}))["text"] == "echo 1: one"
        core = psutil.Process(core_pids(c)[-1])
        call = asyncio.create_task(c.call_tool("respond", {"prompt": "!hold slow slow", "thread_id": "t"}))
        start = time.monotonic()
        await held(c, "slow")
        core.suspend()
        try:
            msg = error_text(await asyncio.wait_for(call, 10))
            took = time.monotonic() - start
            # Kept: the core stopped past the deadline is the thing tested. Resumed and released
            # after it, only the core's deadline (timeout_s, which the shim always sends) keeps that turn out.
            await asyncio.sleep(max(0.0, 3.5 - (time.monotonic() - start)))
        finally:
            core.resume()
        await release(c, "slow")
        assert msg == (
            "timeout: no reply within 2 s; the call was stopped and thread 't' is unchanged. "
            "(--timeout / WISP_TIMEOUT sets the limit for respond.)"
        ), msg
        # The shim's timer fires at 2 s plus 0.25 s for a racing reply; the bound leaves a slow CI
        # machine room and still fails a timer a second late.
        assert 2.0 <= took < 3.0, took
        assert ok(await asyncio.wait_for(c.call_tool("respond", {"prompt": "two", "thread_id": "t"}), 10))["text"] == "echo 2: two"


async def test_calls_read_after_their_deadline_by_a_stopped_core_keep_no_turn():
    """The deadline is an instant both processes share, not a limit the core starts when it
    reads the request: with the core stopped while 4 calls (and 100 quick requests, which the
    cancels queue behind) are sent, every call is answered `timeout` at the user's limit, and
    once the core runs again none of the 4 turns is in its thread (the next call says echo 2,
    not echo 3, which it did for 4 of 4 threads when the core counted from its own read)."""
    async with wisp("--timeout", "2") as c:
        threads = [f"t{i}" for i in range(4)]
        for t in threads:
            assert ok(await c.call_tool("respond", {"prompt": "one", "thread_id": t}))["text"] == "echo 1: one"
        core = psutil.Process(core_pids(c)[-1])
        core.suspend()
        start = time.monotonic()
        try:
            calls = [asyncio.create_task(c.call_tool("respond", {"prompt": "late", "thread_id": t})) for t in threads]
            # Kept: gives the 4 calls a head start on the quick requests. Nothing can meet them
            # while the core is stopped (every listing is the core's); were they overtaken, the
            # cancels would queue behind fewer requests, a weaker test but not a wrong one.
            await asyncio.sleep(0.05)
            quick = [asyncio.create_task(c.call_tool("list_threads", {})) for _ in range(100)]
            results = await asyncio.wait_for(asyncio.gather(*calls), 10)
            took = time.monotonic() - start
            # Kept: stopped past the deadline is the thing tested; resumed before the watchdog (ping
            # after 2 s of silence, 3 s for its answer) would replace it.
            await asyncio.sleep(max(0.0, 3.0 - (time.monotonic() - start)))
        finally:
            core.resume()
        for t, r in zip(threads, results):
            msg = error_text(r)
            assert msg.startswith(f"timeout: no reply within 2 s; the call was stopped and thread '{t}' is unchanged"), msg
        assert took < 3.0, took
        for r in await asyncio.wait_for(asyncio.gather(*quick), 30):
            ok(r)
        assert core_pids(c)[-1] == core.pid  # the same core: nothing was restarted
        after = [ok(await asyncio.wait_for(c.call_tool("respond", {"prompt": "next", "thread_id": t}), 10))["text"] for t in threads]
        assert after == ["echo 2: next"] * 4, after


async def test_kill_9_of_the_core_mid_call():
    async with wisp() as c:
        assert ok(await c.call_tool("respond", {"prompt": "idle one", "thread_id": "idle"}))["created"]
        core = core_pids(c)[-1]
        done_at: dict[str, float] = {}

        async def slow(tid: str):
            r = await c.call_tool("respond", {"prompt": "!hold never slow", "thread_id": tid})
            done_at[tid] = time.monotonic()
            return r

        calls = [asyncio.create_task(slow(f"busy-{i}")) for i in range(3)]
        await held(c, "never", calls=3)
        os.kill(core, signal.SIGKILL)
        killed = time.monotonic()
        results = await asyncio.wait_for(asyncio.gather(*calls), 10)
        for i, r in enumerate(results):
            msg = error_text(r)
            assert msg.startswith("core_crashed:") and f"busy-{i}" in msg and "signal 9" in msg, msg
        late = {t: round(at - killed, 3) for t, at in done_at.items() if at - killed > 1.0}
        assert not late, f"pending calls answered more than 1 s after the kill: {late}"
        # The next call is served, by a new core.
        fresh = ok(await c.call_tool("respond", {"prompt": "next"}))
        assert fresh["text"] == "echo 1: next"
        assert core_pids(c)[-1] != core
        # The idle thread was lost with the core, and the next call naming it is told so, once.
        lost = error_text(await c.call_tool("respond", {"prompt": "you there?", "thread_id": "idle"}))
        assert lost.startswith("thread_lost:") and "idle" in lost, lost
        again = ok(await c.call_tool("respond", {"prompt": "again", "thread_id": "idle"}))
        assert (again["created"], again["text"]) == (True, "echo 1: again")
        # The killed core's busy threads were reported on their own calls, so not again.
        assert ok(await c.call_tool("respond", {"prompt": "b", "thread_id": "busy-0"}))["created"] is True


async def test_kill_9_of_the_core_under_load_loses_no_reply():
    # 50 calls in flight when the core dies, twice: each is answered exactly once, by its
    # reply or by core_crashed / thread_lost, and the threads after each restart are consistent.
    import stress

    fig = await stress.run(calls=400, thread_ids=64, capacity=32, in_flight=50, kill_core_at=(120, 260), timeout_s=60)
    print(fig.summary())
    assert fig.kills == 2 and fig.crash_errors > 0
    assert not fig.errors and not fig.problems, (fig.errors + fig.problems)[:5]


async def test_a_thread_evicted_before_a_crash_is_not_reported_lost(tmp_path):
    """Lost means lost: after a crash only the threads the core still had are thread_lost.
    One evicted by LRU before it was gone already, and its next call simply starts anew."""
    core, starts = fake_core_binary(tmp_path)
    async with wisp("--max-threads", "2", core=core, env=shim_env(WISP_FAKE_CORE_LOG=str(starts))) as c:
        for tid in ("old", "live", "newest"):  # "newest" evicts "old" (least recently used)
            assert ok(await c.call_tool("respond", {"prompt": "hi", "thread_id": tid}))["created"] is True
        # A reply and the eviction of its own thread in one read: the eviction came later, so it wins.
        assert ok(await c.call_tool("respond", {"prompt": "!evicted-at-once", "thread_id": "brief"}))["created"] is True
        os.kill(fake_core_starts(starts)[-1], signal.SIGKILL)
        await wait_for(lambda: len(fake_core_starts(starts)) == 2, 10)
        for tid in ("old", "brief"):
            r = await c.call_tool("respond", {"prompt": "back?", "thread_id": tid})
            assert (ok(r)["created"], ok(r)["text"]) == (True, "echo 1: back?"), tid
            assert "no live thread had this id (evicted, closed or lost)" in r.content[0].text
        # A thread that was alive at the crash is reported lost, once.
        assert error_text(await c.call_tool("respond", {"prompt": "back?", "thread_id": "live"})).startswith("thread_lost:")
        assert ok(await c.call_tool("respond", {"prompt": "again", "thread_id": "live"}))["text"] == "echo 1: again"


@pytest.mark.parametrize("how", ["SIGSTOP", "stops reading"])
async def test_a_core_that_stops_answering_is_restarted_by_the_watchdog(tmp_path, how):
    """While calls wait, a core that answers no ping within a few seconds is restarted like a
    crashed one: its calls fail saying so, its threads are reported lost, and other threads'
    calls and list_threads are answered by the new core."""
    import psutil

    if how == "SIGSTOP":
        core, starts, args = None, None, ()
    else:
        (core, starts), args = fake_core_binary(tmp_path), ()
    env = shim_env(WISP_FAKE_CORE_LOG=str(starts)) if starts else None
    async with wisp(*args, core=core, env=env) as c:
        assert ok(await c.call_tool("respond", {"prompt": "hello", "thread_id": "idle"}))["created"]
        pid = fake_core_starts(starts)[-1] if starts else core_pids(c)[-1]
        prompt = "!hold never slow" if how == "SIGSTOP" else "!stall"
        calls = [asyncio.create_task(c.call_tool("respond", {"prompt": prompt, "thread_id": f"busy-{i}"})) for i in range(2)]
        if how == "SIGSTOP":
            await held(c, "never", calls=2)
            os.kill(pid, signal.SIGSTOP)
        else:
            await wait_for(Path(f"{starts}.stalled").exists, 10)  # the fake core stopped reading
        start = time.monotonic()
        try:
            results = await asyncio.wait_for(asyncio.gather(*calls), 15)
        finally:
            if how == "SIGSTOP" and psutil.pid_exists(pid):
                with contextlib.suppress(psutil.NoSuchProcess):
                    psutil.Process(pid).resume()
        took = time.monotonic() - start
        for i, r in enumerate(results):
            msg = error_text(r)
            assert msg.startswith("core_crashed:") and "stopped answering" in msg and f"busy-{i}" in msg, msg
        # Ping after 2 s of silence, 3 s for its answer, two 0.5 s ticks: 6 s, plus TERM.
        assert took < 8.0, took
        await wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 5)
        listed = ok(await asyncio.wait_for(c.call_tool("list_threads", {}), 10))
        assert listed["threads"] == []
        assert ok(await asyncio.wait_for(c.call_tool("respond", {"prompt": "next", "thread_id": "other"}), 10))["text"] == "echo 1: next"
        assert error_text(await c.call_tool("respond", {"prompt": "there?", "thread_id": "idle"})).startswith("thread_lost:")


async def test_a_stopped_core_is_found_while_new_calls_keep_arriving():
    """The watchdog counts the core's silence from its last frame while calls wait, not from
    the shim's last write: with the core SIGSTOPped and a new call every 0.8 s (each write to
    the core used to reset the clock, so no ping was ever sent), the stopped core is still
    found and replaced within about 6 s."""
    async with wisp() as c:
        assert ok(await c.call_tool("respond", {"prompt": "hello", "thread_id": "idle"}))["created"]
        pid = core_pids(c)[-1]
        os.kill(pid, signal.SIGSTOP)
        start = time.monotonic()
        calls: list[asyncio.Task] = []
        try:
            first = asyncio.create_task(c.call_tool("respond", {"prompt": "first", "thread_id": "t0"}))
            calls.append(first)
            i = 1
            while not first.done() and time.monotonic() - start < 12:
                await asyncio.wait({first}, timeout=0.8)
                if not first.done():
                    calls.append(asyncio.create_task(c.call_tool("respond", {"prompt": f"call {i}", "thread_id": f"t{i}"})))
                    i += 1
            took = time.monotonic() - start
        finally:
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).resume()
        assert first.done(), f"the first call on the stopped core was unanswered after {took:.1f} s ({len(calls)} calls sent)"
        msg = error_text(first.result())
        assert msg.startswith("core_crashed:") and "stopped answering" in msg, msg
        # Ping after 2 s of silence, 3 s for its answer, two 0.5 s ticks: 6 s, plus TERM.
        assert took < 8.0, took
        results = await asyncio.wait_for(asyncio.gather(*calls), 15)
        for r in results:
            # Each later call was on the stopped core too (it failed with it) or was answered by its successor.
            if r.is_error:
                assert error_text(r).startswith("core_crashed:"), error_text(r)
            else:
                assert ok(r)["created"] is True
        assert ok(await asyncio.wait_for(c.call_tool("respond", {"prompt": "next"}), 10))["text"] == "echo 1: next"
        await wait_for(lambda: core_pids(c)[-1] != pid, 5)


async def test_a_slow_call_on_a_healthy_core_is_not_taken_for_a_wedged_one():
    # 7 s with no frame from the core: the watchdog's pings are answered, so nothing restarts.
    async with wisp() as c:
        ok(await c.call_tool("respond", {"prompt": "up"}))
        core = core_pids(c)
        assert len(core) == 1
        # Kept: 7 s of sleep in the core is the thing tested.
        r = ok(await asyncio.wait_for(c.call_tool("respond", {"prompt": "!sleep 7000 slow", "thread_id": "s"}), 20))
        assert r["text"] == "echo 1: !sleep 7000 slow"
        assert core_pids(c) == core
