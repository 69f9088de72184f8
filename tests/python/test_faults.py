"""Faults at the edges that do not end the core: a client that disconnects mid-call or stops
reading, a time limit of centuries, a reply over the frame limit.

Elsewhere: the core dying or wedging (test_crashes), the core writing what cannot be trusted
(test_core_garbage), the shim SIGKILLed / SIGTERMed / stdin closed with a call running and a
core that ignores EOF and SIGTERM (test_process).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

from harness import call, children, error_text, ok, rss_kib as _rss_kib, running, spawn_initialized, wait_gone, wisp


@pytest.mark.parametrize("how", ["closes both pipes", "closes stdout, keeps writing"])
def test_client_disconnecting_mid_call(how):
    proc = spawn_initialized()
    core = children(proc.pid)
    try:
        assert len(core) == 1
        proc.stdin.write(call("respond", {"prompt": "!sleep 800 mid-call"}, 3))
        proc.stdin.flush()
        time.sleep(0.2)
        start = time.monotonic()
        proc.stdout.close()
        if how == "closes both pipes":
            proc.stdin.close()
        else:
            # The reply to call 3 and to these meets a closed pipe: nobody can hear wisp any more.
            for i in range(4, 8):
                proc.stdin.write(call("respond", {"prompt": f"into the void {i}"}, i))
                proc.stdin.flush()
        proc.wait(timeout=5)
        assert time.monotonic() - start < 4.0
        assert wait_gone(core[0], 3), "wisp-core outlived the shim"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in core:
            if running(pid):
                os.kill(pid, signal.SIGKILL)


def flood_without_reading(seconds: float, prompt_bytes: int = 1024, argv: list[str] | None = None) -> dict:
    """Sends respond calls as fast as the shim takes them and never reads its stdout.
    Returns what was sent and the peak RSS of the shim and the core."""
    proc = spawn_initialized(argv=argv)  # from here on, stdout is never read
    core = children(proc.pid)[0]
    base = {"shim": _rss_kib(proc.pid), "core": _rss_kib(core)}
    sent = [0]
    stop = threading.Event()
    filler = "f" * prompt_bytes

    def writer():
        i = 3
        try:
            while not stop.is_set():
                proc.stdin.write(call("respond", {"prompt": f"{filler} {i}", "thread_id": f"t{i % 64}"}, i))
                proc.stdin.flush()
                sent[0] += 1
                i += 1
        except (BrokenPipeError, ValueError, OSError):
            pass

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    peak = dict(base)
    sent_at: list[tuple[float, int]] = []
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        time.sleep(0.1)
        peak["shim"] = max(peak["shim"], _rss_kib(proc.pid))
        peak["core"] = max(peak["core"], _rss_kib(core))
        sent_at.append((time.monotonic() - start, sent[0]))
    stop.set()
    proc.kill()
    proc.wait()
    os.kill(core, signal.SIGKILL) if running(core) else None
    t.join(5)
    # Calls accepted in the last second: 0 once backpressure holds the client.
    last_second = sent[0] - next(n for at, n in sent_at if at >= seconds - 1.0)
    line_bytes = len(call("respond", {"prompt": f"{filler} {sent[0]}", "thread_id": "t00"}, sent[0]))
    return {"sent": sent[0], "line_bytes": line_bytes, "sent_last_second": last_second, "base_kib": base, "peak_kib": peak}


def test_a_client_that_stops_reading_meets_backpressure_not_unbounded_memory():
    r = flood_without_reading(3.0)
    grew = {k: (r["peak_kib"][k] - r["base_kib"][k]) // 1024 for k in ("shim", "core")}
    print(f"flood without reading: {r}; growth MiB {grew}")
    assert r["sent_last_second"] == 0, f"the shim still took calls from a client that reads nothing: {r}"
    # 128 calls in flight (transport.MAX_IN_FLIGHT), about 1 MiB read ahead and the pipe's
    # buffer: a few MiB of calls, never an ever-growing pile.
    assert r["sent"] * r["line_bytes"] < 4 * 1024 * 1024, r
    assert grew["shim"] < 64 and grew["core"] < 64, r


def test_files_lists_count_in_the_in_flight_budget():
    """Every argument byte counts in the 64 MiB in-flight budget, not only `prompt`: 128 calls
    with 750 KB of `files` paths each, all waiting in one thread's queue, used to be taken in
    whole (the budget saw two one-letter strings per call) and grew the shim by over 300 MiB.
    Now the shim stops reading once about 64 MiB of them are in flight, as it does for prompts."""
    from wisp_shim.transport import MAX_IN_FLIGHT_BYTES

    proc = spawn_initialized("--max-queue", "256")
    core = children(proc.pid)[0]
    base = _rss_kib(proc.pid)
    paths = [f"sub/dir-{i:05d}/{'x' * 82}.txt" for i in range(7_500)]
    per_call = sum(len(x) for x in paths)
    assert 740_000 < per_call < 760_000
    calls = 128
    sent = [0]

    def writer():
        try:
            # The first call holds the thread, so every later one waits in its queue, in flight.
            proc.stdin.write(call("respond", {"prompt": "!sleep 60000 hold", "thread_id": "q"}, 3))
            proc.stdin.flush()
            for i in range(calls):
                proc.stdin.write(call("respond", {"prompt": "p", "thread_id": "q", "files": paths}, 4 + i))
                proc.stdin.flush()
                sent[0] += 1
        except (BrokenPipeError, ValueError, OSError):
            pass

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    peak = base
    last, still = -1, time.monotonic()
    try:
        # Until every call is written or the writes have been blocked for 3 s.
        while t.is_alive() and time.monotonic() - still < 3.0:
            time.sleep(0.1)
            peak = max(peak, _rss_kib(proc.pid))
            if sent[0] != last:
                last, still = sent[0], time.monotonic()
        peak = max(peak, _rss_kib(proc.pid))
    finally:
        proc.kill()
        proc.wait()
        os.kill(core, signal.SIGKILL) if running(core) else None
        t.join(5)
    grew = (peak - base) // 1024
    print(f"files flood: {sent[0]} of {calls} calls of {per_call} bytes of paths taken; shim RSS {base // 1024} -> {peak // 1024} MiB (+{grew} MiB)")
    # What the budget holds, plus a line read ahead and one in the pipe's buffer.
    most = MAX_IN_FLIGHT_BYTES // per_call + 3
    assert sent[0] <= most, f"{sent[0]} calls with {per_call} bytes of files each were taken (at most {most} fit the budget)"


async def test_a_time_limit_of_centuries_does_not_crash_the_core():
    limit = "1e300"
    # --timeout 1e300 reached the core as timeout_s and trapped Swift's Duration: every call crashed it.
    async with wisp("--timeout", limit) as c:
        r = ok(await asyncio.wait_for(c.call_tool("respond", {"prompt": "!sleep 50 patient", "thread_id": "p"}), 20))
        assert r["text"] == "echo 1: !sleep 50 patient"
        assert ok(await c.call_tool("respond", {"prompt": "again", "thread_id": "p"}))["text"] == "echo 2: again"


async def test_a_reply_over_the_frame_limit_fails_that_call_not_the_pipe():
    # 9 MB of "/" is a 9 MB request, but Swift's JSONEncoder writes "/" as "\/": the echo
    # reply came to 18 MB, over the shim's 16 MiB frame limit, and the shim had to kill
    # the core as broken, losing every thread.
    async with wisp("--context-size", "100000000") as c:
        assert ok(await c.call_tool("respond", {"prompt": "keep", "thread_id": "keep"}))["text"] == "echo 1: keep"
        msg = error_text(await asyncio.wait_for(c.call_tool("respond", {"prompt": "/" * 9_000_000, "thread_id": "big"}), 60))
        assert msg.startswith("internal:") and "MiB limit" in msg, msg[:300]
        assert ok(await c.call_tool("respond", {"prompt": "again", "thread_id": "keep"}))["text"] == "echo 2: again"


