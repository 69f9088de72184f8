"""The state dir failing under a running wisp, for real: a tmpfs mounted for the test and
filled, so that every write fails as on a full disk (a remount read-only, as ext4's
errors=remount-ro makes one, is refused by the kernel while the database is open for writing;
the store treats both alike). Needs Linux and the right to mount (root with CAP_SYS_ADMIN);
skipped otherwise, since chmod does not stop root and nothing else makes a directory refuse
root's writes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness import ok, text_of, wisp

pytestmark = pytest.mark.anyio


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


@pytest.fixture
def tmpfs(tmp_path):
    if not sys.platform.startswith("linux"):
        pytest.skip("a tmpfs remounted read-only is a Linux test")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if not _mount("-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(mnt)):
        pytest.skip("cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


async def say(c, thread: str, prompt: str) -> dict:
    return ok(await c.call_tool("respond", {"prompt": prompt, "thread_id": thread}))


def _fill(mnt) -> None:
    """Fills the tmpfs: every write to it fails from now on (ENOSPC), as on a full disk."""
    fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * (1 << 16))
    except OSError:
        pass
    finally:
        os.close(fd)


BIG = "x" * 300_000  # a turn larger than any space the database's files hold already


async def test_a_full_state_dir_serves_in_memory_says_so_and_recovers(tmpfs):
    import anyio

    state = tmpfs / "state"
    async with wisp("--state-dir", str(state), "--context-size", "100000000") as c:
        assert (await say(c, "s", "1")).get("store_error") is None
    async with wisp("--state-dir", str(state), "--context-size", "100000000") as c:
        assert (await say(c, "t", "1")).get("store_error") is None
        _fill(tmpfs)
        # A stored thread not in memory is still read from the full directory.
        r = await say(c, "s", "resumed " + BIG)
        assert r["text"].startswith("echo 2: resumed") and not r["created"] and "full" in r["store_error"], r
        # Closed meanwhile, it does not come back, and it is deleted once the dir can be written.
        assert ok(await c.call_tool("close_thread", {"thread_id": "s"}))["closed"]
        assert (await say(c, "s", "anew"))["created"]
        # Answered and kept in memory, and the caller is told: on the stored thread and on a new one.
        for thread, n in (("t", 2), ("new", 1)):
            r = await c.call_tool("respond", {"prompt": "ro " + BIG, "thread_id": thread})
            body = ok(r)
            assert body["text"].startswith(f"echo {n}: ro"), body
            assert "full" in body["store_error"] and "memory" in body["store_error"], body
            assert "not stored" in text_of(r)
        listed = text_of(await c.call_tool("list_threads", {}))
        assert "threads are not stored" in listed and "full" in listed, listed
        # Writable again: the store is tried again (every 5 s) and the thread stored whole.
        (tmpfs / "filler").unlink()
        await anyio.sleep(5.5)  # kept: the store's retry every 5 s is the thing tested
        r = await say(c, "t", "3")
        assert r["text"] == "echo 3: 3" and r.get("store_error") is None, r
        assert "threads are not stored" not in text_of(await c.call_tool("list_threads", {}))
    async with wisp("--state-dir", str(state), "--context-size", "100000000") as c:
        r = await say(c, "t", "4")
        assert (r["created"], r["turns"]) == (False, 4), r
        assert (await say(c, "s", "again"))["created"]


async def test_a_thread_evicted_while_the_state_dir_fails_loses_no_answered_turn(tmpfs):
    """--max-threads 2 and a state dir that cannot be written: a thread holding answered turns
    the store could not take is kept live past the capacity, never evicted without them; once
    the store works again they are stored."""
    import anyio

    state = tmpfs / "state"
    async with wisp("--state-dir", str(state), "--context-size", "100000000", "--max-threads", "2") as c:
        await say(c, "t", "1")
        _fill(tmpfs)
        for i in range(2, 6):
            r = await say(c, "t", f"{i} {BIG}")
            assert r["text"].startswith(f"echo {i}:") and r.get("store_error"), r
        for other in ("a", "b", "c"):
            await say(c, other, "x")
        r = await say(c, "t", "after")
        assert (r["created"], r["text"]) == (False, "echo 6: after"), r
        (tmpfs / "filler").unlink()
        await anyio.sleep(5.5)  # kept: the store's retry every 5 s is the thing tested
        await say(c, "d", "x")  # a new thread: wisp stores the waiting ones meanwhile
        for _ in range(100):
            listed = ok(await c.call_tool("list_threads", {}))
            if "not_stored" not in listed:  # the store is written again
                break
            await anyio.sleep(0.1)  # the poll's interval
    async with wisp("--state-dir", str(state), "--context-size", "100000000") as c:
        r = await say(c, "t", "resumed")
        assert (r["created"], r["text"]) == (False, "echo 7: resumed"), r
