"""The SQLite store beside other holders of its locks: another process's write transaction
(python's sqlite3), a second wisp on the same --state-dir, and the way wisp stops.

- A reader never waits for a writer: read_thread, list_threads (with and without a query) and
  fork_from read committed turns without the thread's lease, beside another connection's write.
- A read shows what the store holds, also when another wisp wrote or closed the thread since.
- The time limit covers the commit: a turn whose commit waits on another process's lock past
  the limit is reported `timeout` and is kept nowhere.
- After a clean stop, threads.db alone (without -wal and -shm) holds every answered turn.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from harness import (
    echo_n,
    INITIALIZE, INITIALIZED, REPO, call, close_shim, core_path, error_text, held, ok, read_until, release, shim_env, spawn,
    wisp,
)

sys.path.insert(0, str(REPO / "python"))
from wisp_shim.core import protocol  # noqa: E402


async def say(c, tid: str, prompt: str) -> dict:
    return ok(await c.call_tool("respond", {"prompt": prompt, "thread_id": tid}))


def turns_in(db_file: Path) -> dict[str, list[str]]:
    db = sqlite3.connect(db_file)
    try:
        out: dict[str, list[str]] = {}
        for tid, prompt in db.execute("SELECT thread_id, prompt FROM turns WHERE thread_id NOT LIKE '!%' ORDER BY thread_id, seq"):
            out.setdefault(tid, []).append(prompt)
        return out
    finally:
        db.close()


class WriteLock:
    """Another process's write transaction on threads.db, held until `release`."""

    def __init__(self, state: Path):
        self.db = sqlite3.connect(state / "threads.db", isolation_level=None, check_same_thread=False)
        self.db.execute("BEGIN IMMEDIATE")

    def release(self) -> None:
        self.db.execute("ROLLBACK")
        self.db.close()


async def test_reads_answer_beside_a_write_another_process_holds(tmp_path):
    state = tmp_path / "state"
    async with wisp("--state-dir", str(state)) as c:
        await say(c, "kept", "zebra one")
        await say(c, "kept", "zebra two")
    async with wisp("--state-dir", str(state)) as c:
        await say(c, "mine", "first")
        lock = WriteLock(state)
        try:
            # This call's commit waits for the lock (its turn is answered at once by echo): it
            # cannot end while the lock is held, so every read below that answered while it was
            # outstanding did not queue behind it.
            waiting = asyncio.create_task(c.call_tool("respond", {"prompt": "second", "thread_id": "mine"}))
            for _ in range(5):
                read = ok(await c.call_tool("read_thread", {"thread_id": "kept"}))
                assert read["turns"] == 2, read
                listed = ok(await c.call_tool("list_threads", {}))["threads"]
                assert "kept" in {t["thread_id"] for t in listed}
                found = ok(await c.call_tool("list_threads", {"query": "zebra"}))["threads"]
                assert [t["thread_id"] for t in found] == ["kept"], found
            assert not waiting.done(), "the write lock was held: that call's commit cannot have ended"
        finally:
            lock.release()
        r = ok(await waiting)
        assert r["turns"] == 2 and not r.get("store_error"), r
        assert turns_in(state / "threads.db")["mine"] == ["first", "second"]


async def test_a_thread_busy_in_another_wisp_is_read_listed_searched_and_forked_at_once(tmp_path):
    state = tmp_path / "state"
    async with wisp("--state-dir", str(state)) as one, wisp("--state-dir", str(state)) as two:
        await say(two, "held", "walrus one")
        # The running call holds the thread's lease in the other process until it is released.
        running = asyncio.create_task(two.call_tool("respond", {"prompt": "!hold lease walrus", "thread_id": "held"}))
        try:
            await held(two, "lease")  # it has its turn, so its lease: the reads below must not need it
            read = ok(await one.call_tool("read_thread", {"thread_id": "held"}))
            assert read["turns"] == 1, read
            found = ok(await one.call_tool("list_threads", {"query": "walrus"}))["threads"]
            assert [t["thread_id"] for t in found] == ["held"], found
            fork = ok(await one.call_tool("respond", {"prompt": "copy", "fork_from": "held", "thread_id": "copy"}))
            assert (fork["created"], echo_n(fork)) == (True, 2), fork
            assert not running.done()
            assert await release(two, "lease") == 1
            assert echo_n(ok(await running)) == 2
        finally:
            running.cancel()


async def test_a_read_shows_what_another_wisp_wrote_or_closed_since(tmp_path):
    state = tmp_path / "state"
    async with wisp("--state-dir", str(state)) as one, wisp("--state-dir", str(state)) as two:
        await say(one, "a", "one")
        await say(one, "b", "one")
        assert ok(await one.call_tool("read_thread", {"thread_id": "a"}))["turns"] == 1
        await say(two, "a", "two")
        await say(two, "a", "three")
        ok(await two.call_tool("close_thread", {"thread_id": "b"}))
        read = ok(await one.call_tool("read_thread", {"thread_id": "a"}))
        assert read["turns"] == 3 and read["items"][-1]["prompt"] == "three", read
        listed = {t["thread_id"]: t for t in ok(await one.call_tool("list_threads", {}))["threads"]}
        assert listed["a"]["turns"] == 3, listed
        gone = await one.call_tool("read_thread", {"thread_id": "b"})
        assert gone.is_error and "no thread 'b'" in error_text(gone), error_text(gone)


async def test_a_commit_that_waits_on_another_process_past_the_time_limit_keeps_no_turn(tmp_path):
    state = tmp_path / "state"
    async with wisp("--state-dir", str(state), "--timeout", "1.5") as c:
        await say(c, "t", "one")
        lock = WriteLock(state)
        try:
            # Shorter than the store's own wait for a lock (5 s): the time limit ends the commit.
            r = await c.call_tool("respond", {"prompt": "late", "thread_id": "t"})
            assert r.is_error and error_text(r).startswith("timeout"), error_text(r)
        finally:
            lock.release()
        assert turns_in(state / "threads.db")["t"] == ["one"]
        # Nor in memory: the next call sees one earlier turn, and the store agrees.
        after = await say(c, "t", "two")
        assert (echo_n(after), after["turns"]) == (2, 2), after
    assert turns_in(state / "threads.db")["t"] == ["one", "two"]


def _stop(proc, how: str) -> None:
    if how == "stdin":
        close_shim(proc, 20)
        return
    proc.send_signal(signal.SIGTERM if how == "SIGTERM" else signal.SIGINT)
    proc.wait(20)


@pytest.mark.parametrize("how", ["stdin", "SIGTERM", "SIGINT"])
def test_after_a_clean_stop_the_database_file_alone_holds_every_answered_turn(tmp_path, how):
    state = tmp_path / "state"
    proc = spawn("--state-dir", str(state))
    lines: list[bytes] = []
    try:
        proc.stdin.write(INITIALIZE)
        proc.stdin.flush()
        read_until(proc, 1, lines)
        proc.stdin.write(INITIALIZED)
        answered = []
        for i in range(12):
            tid = f"t{i % 3}"
            proc.stdin.write(call("respond", {"prompt": f"p{i}", "thread_id": tid}, 10 + i))
            proc.stdin.flush()
            reply = read_until(proc, 10 + i, lines)
            assert "error" not in reply and not reply["result"].get("isError"), reply
            answered.append((tid, f"p{i}"))
        ok_close = call("close_thread", {"thread_id": "t2"}, 99)
        proc.stdin.write(ok_close)
        proc.stdin.flush()
        read_until(proc, 99, lines)
        _stop(proc, how)
    finally:
        _reap(proc)
    want: dict[str, list[str]] = {}
    for tid, prompt in answered:
        if tid != "t2":
            want.setdefault(tid, []).append(prompt)
    assert _turns_in_db_alone(tmp_path, state) == want
    wal = state / "threads.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0, wal.stat().st_size


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_core_signalled_to_stop_folds_its_log_into_the_database_first(tmp_path, sig):
    """The shim's last resort (or a terminal's ^C reaching the core): the core ends as at stdin's end."""
    state = tmp_path / "state"
    proc = subprocess.Popen([core_path(), "--backend", "echo", "--state-dir", str(state)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=shim_env())
    try:
        assert read_frame(proc)["event"] == "ready"
        for i in range(6):
            proc.stdin.write(protocol.encode(protocol.Respond(id=i + 1, prompt=f"p{i}", thread_id=f"t{i % 2}")))
            proc.stdin.flush()
            assert read_frame(proc)["ok"]
        proc.send_signal(sig)
        assert proc.wait(10) == 0
    finally:
        _reap(proc)
    assert _turns_in_db_alone(tmp_path, state) == {"t0": ["p0", "p2", "p4"], "t1": ["p1", "p3", "p5"]}


def _reap(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _turns_in_db_alone(tmp_path, state) -> dict:
    """The turns threads.db holds copied without its -wal and -shm files."""
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(state / "threads.db", alone / "threads.db")
    return turns_in(alone / "threads.db")


def read_frame(proc: subprocess.Popen) -> dict:
    (n,) = protocol._HEADER.unpack(proc.stdout.read(4))
    return json.loads(proc.stdout.read(n))
