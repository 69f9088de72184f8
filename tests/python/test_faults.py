"""Faults at the edges that do not end the core: a client that disconnects mid-call or stops
reading, a time limit of centuries, a reply over the frame limit.

Elsewhere: the core dying or wedging (test_crashes), the core writing what cannot be trusted
(test_core_garbage), the shim SIGKILLed / SIGTERMed / stdin closed with a call running and a
core that ignores EOF and SIGTERM (test_process).
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import signal
import threading
import time

import pytest

import subprocess

from harness import (
    INITIALIZE, INITIALIZED, REPO, call, children, core_exchange, ok, read_until, rss_kib as _rss_kib, running,
    shim_command, shim_env,
    spawn_initialized, held_args, wait_gone, wait_until, wisp,
)


@pytest.mark.parametrize("how", ["closes both pipes", "closes stdout, keeps writing"])
def test_client_disconnecting_mid_call(how):
    proc = spawn_initialized()
    core = children(proc.pid)
    try:
        assert len(core) == 1
        proc.stdin.write(call("respond", {"prompt": "!hold never mid-call"}, 3))
        proc.stdin.write(call("respond", held_args("never"), 4))
        proc.stdin.flush()
        read_until(proc, 4, [])  # call 3 is in the core, parked, when the client goes
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
        time.sleep(0.1)  # kept: the sampling interval of a flood that lasts `seconds`, the thing tested
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


def test_a_client_that_never_reads_stderr_stalls_nothing(tmp_path):
    """Logs never block: with stderr a pipe nobody drains, --max-stored-threads 1 and 760 new
    durable threads (the core logs a line for each stored thread it deletes, about 90 bytes: the
    pipe's buffer filled after 686 of them), every call is still answered in time, and a thread
    any timeout said is unchanged really is. The lines the buffer held reach stderr once it is read."""
    proc = subprocess.Popen(
        shim_command("--backend", "echo", "--state-dir", str(tmp_path / "state"), "--max-stored-threads", "1",
                     "--timeout", "5"),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=shim_env(), cwd=REPO,
    )
    lines: list[bytes] = []
    unchanged: list[str] = []
    try:
        proc.stdin.write(INITIALIZE)
        proc.stdin.flush()
        read_until(proc, 1, lines)
        proc.stdin.write(INITIALIZED)
        for i in range(760):
            proc.stdin.write(call("respond", {"prompt": "hi", "thread_id": f"n{i}"}, 10 + i))
            proc.stdin.flush()
            reply = read_until(proc, 10 + i, lines, timeout=15)["result"]
            if reply.get("isError"):
                text = reply["content"][0]["text"]
                assert "is unchanged" in text, text
                unchanged.append(f"n{i}")
                break  # the test fails below; the thread is checked once stderr is drained
        err: list[bytes] = []
        drained = threading.Thread(target=lambda: err.extend(iter(lambda: os.read(proc.stderr.fileno(), 65536), b"")), daemon=True)
        drained.start()
        for k, tid in enumerate(unchanged):
            proc.stdin.write(call("respond", {"prompt": "again", "thread_id": tid}, 5000 + k))
            proc.stdin.flush()
            again = read_until(proc, 5000 + k, lines, timeout=15)["result"]
            assert again["structuredContent"]["text"] == "echo 1: again", f"{tid} was said to be unchanged: {again}"
        assert not unchanged, f"a call timed out with stderr full: {unchanged}"
        # What the pipe and the core's buffer held is written once stderr is read again: this many
        # lines fit, so none was dropped (LogTests and test_logs check the dropping and its count).
        want = [f"stored thread 'n{i}' deleted" for i in range(759)]
        wait_until(lambda: want[-1] in b"".join(err).decode(errors="replace"), 5)
        text = b"".join(err).decode(errors="replace")
        missing = [w for w in want if w not in text]
        assert not missing and "dropped" not in text, (missing[:3], text[-1000:])
    finally:
        proc.kill()
        proc.wait()


def test_the_shims_own_warnings_never_wait_on_stderr():
    """The shim logs a warning for each line it cannot read; with stderr a pipe nobody drains,
    3000 such lines (about 750 KB of warnings) used to block the shim in its log write, and no
    call was answered again. Now each gets its parse error, the next call is answered, and once
    stderr is read the shim says how many of its lines it dropped."""
    proc = subprocess.Popen(shim_command("--backend", "echo"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=shim_env(), cwd=REPO)
    lines: list[bytes] = []
    got: queue.Queue[bytes] = queue.Queue()
    # stdout is read by a thread, so that a shim that stops answering fails the test instead of hanging it.
    threading.Thread(target=lambda: [got.put(line) for line in iter(proc.stdout.readline, b"")], daemon=True).start()

    def read_until(_proc, want: int, lines: list[bytes], timeout: float = 15) -> dict:
        end = time.monotonic() + timeout
        while True:
            try:
                line = got.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no response {want} within {timeout} s") from None
            lines.append(line)
            if json.loads(line).get("id") == want:
                return json.loads(line)

    try:
        proc.stdin.write(INITIALIZE)
        proc.stdin.flush()
        read_until(proc, 1, lines)
        proc.stdin.write(INITIALIZED)

        def garbage():
            for i in range(3000):
                proc.stdin.write(b'{"jsonrpc": "2.0", "id": %d, "method": "tools/call", "params": ' % (100_000 + i) + b"x" * 60 + b"\n")
            proc.stdin.write(call("respond", {"prompt": "still here?"}, 2))
            proc.stdin.flush()

        writer = threading.Thread(target=garbage, daemon=True)
        writer.start()
        answer = read_until(proc, 2, lines, timeout=30)
        writer.join(5)
        assert answer["result"]["structuredContent"]["text"] == "echo 1: still here?", answer
        parse_errors = sum(1 for x in lines if b'"code":-32700' in x.replace(b" ", b""))
        assert parse_errors == 3000, parse_errors
        err = bytearray()

        def drain():
            while chunk := os.read(proc.stderr.fileno(), 65536):
                err.extend(chunk)

        threading.Thread(target=drain, daemon=True).start()
        # The first warning that fits once the buffer has drained follows the note of what was dropped.
        note = re.compile(rb"wisp WARNING wisp\.logs: [1-9]\d* log line\(s\) dropped: stderr was not being read")
        deadline = time.monotonic() + 10
        while not note.search(err) and time.monotonic() < deadline:
            proc.stdin.write(b"not json again\n")
            proc.stdin.flush()
            time.sleep(0.1)  # the poll's interval: each round writes one more line to be warned of
        assert note.search(err), bytes(err[-1000:])
    finally:
        proc.kill()
        proc.wait()


def test_files_lists_count_in_the_in_flight_budget():
    """Every argument byte counts in the 64 MiB in-flight budget, not only `prompt`: 128 calls
    with 750 KB of `files` paths each, all waiting in one thread's queue, used to be taken in
    whole (the budget saw two one-letter strings per call) and grew the shim by over 300 MiB.
    Now the shim stops reading once about 64 MiB of them are in flight, as it does for prompts."""
    from wisp_shim.transport.guard import MAX_IN_FLIGHT_BYTES

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
            proc.stdin.write(call("respond", {"prompt": "!hold never hold", "thread_id": "q"}, 3))
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
            time.sleep(0.1)  # kept: the sampling interval; writes blocked for 3 s is the thing tested
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


def test_a_time_limit_of_centuries_on_the_pipe_does_not_crash_the_core():
    # --timeout 1e300 reached the core as timeout_s and trapped Swift's Duration: every call
    # crashed it. The shim now takes at most MAX_SECONDS; the core, sent such a limit on the
    # pipe all the same, must still answer.
    from wisp_shim.core import protocol

    centuries = protocol.RespondOptions(timeout_s=1e300, deadline=1e300)
    # Kept: a call that sleeps under that limit is the thing tested.
    first = protocol.Respond(id=1, prompt="!sleep 50 patient", thread_id="p", options=centuries)
    again = protocol.Respond(id=2, prompt="again", thread_id="p", options=centuries)
    frames = core_exchange(["--backend", "echo"], protocol.encode(first) + protocol.encode(again), want=(1, 2))
    by_id = {f["id"]: f for f in frames if "ok" in f}
    assert by_id[1]["ok"] and by_id[1]["result"]["text"] == "echo 1: !sleep 50 patient", by_id[1]
    assert by_id[2]["ok"] and by_id[2]["result"]["text"] == "echo 2: again", by_id[2]


async def test_a_time_limit_of_centuries_does_not_crash_the_core():
    # --timeout 1e300 reached the core as timeout_s and trapped Swift's Duration: every call crashed it.
    # The shim now refuses it where it enters; the longest it takes reaches the core unharmed.
    refused = subprocess.run(shim_command("--timeout", "1e300", "--check"), capture_output=True, text=True,
                             env=shim_env(), timeout=60)
    assert refused.returncode != 0 and "at most" in refused.stderr, refused.stderr
    limit = "1000000"
    async with wisp("--timeout", limit) as c:
        # Kept: a call that sleeps under that limit is the thing tested.
        r = ok(await asyncio.wait_for(c.call_tool("respond", {"prompt": "!sleep 50 patient", "thread_id": "p"}), 20))
        assert r["text"] == "echo 1: !sleep 50 patient"
        assert ok(await c.call_tool("respond", {"prompt": "again", "thread_id": "p"}))["text"] == "echo 2: again"


async def test_a_reply_of_slashes_is_not_doubled_and_the_pipe_survives():
    # 9 MB of "/" is a 9 MB request, but Swift's JSONEncoder wrote "/" as "\/": the echo
    # reply came to 18 MB, over the shim's 16 MiB frame limit, and the shim had to kill
    # the core as broken, losing every thread. The core's writer no longer escapes "/"; a
    # reply that is over the limit once encoded is reply_too_large before its turn is kept
    # (tests/python/test_one_verdict.py).
    async with wisp("--context-size", "100000000") as c:
        assert ok(await c.call_tool("respond", {"prompt": "keep", "thread_id": "keep"}))["text"] == "echo 1: keep"
        r = ok(await asyncio.wait_for(c.call_tool("respond", {"prompt": "/" * 9_000_000, "thread_id": "big"}), 60))
        assert r["text"] == "echo 1: " + "/" * 9_000_000
        assert ok(await c.call_tool("respond", {"prompt": "again", "thread_id": "keep"}))["text"] == "echo 2: again"


