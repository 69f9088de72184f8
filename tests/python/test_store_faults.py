"""The state dir turning read-only under a running wisp, for real: a tmpfs mounted
for the test and remounted read-only, as ext4's errors=remount-ro would. Needs Linux and the
right to mount (root with CAP_SYS_ADMIN); skipped otherwise, since chmod does not stop root
and nothing else makes a directory refuse root's writes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness import REPO, core_path, ok, text_of, wisp

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


async def test_a_state_dir_turned_read_only_serves_in_memory_says_so_and_recovers(tmpfs):
    import anyio

    state = tmpfs / "state"
    async with wisp("--state-dir", str(state)) as c:
        assert (await say(c, "s", "1")).get("store_error") is None
    async with wisp("--state-dir", str(state)) as c:
        assert (await say(c, "t", "1")).get("store_error") is None
        assert _mount("-o", "remount,ro", str(tmpfs))
        # A stored thread not in memory is still read from the read-only directory.
        r = await say(c, "s", "resumed")
        assert r["text"] == "echo 2: resumed" and not r["created"] and "Read-only file system" in r["store_error"], r
        # Closed meanwhile, it does not come back from its file, which goes once the dir can be written.
        assert ok(await c.call_tool("close_thread", {"thread_id": "s"}))["closed"]
        assert (await say(c, "s", "anew"))["created"]
        # Answered and kept in memory, and the caller is told: on the stored thread and on a new one.
        for thread, n in (("t", 2), ("new", 1)):
            r = await c.call_tool("respond", {"prompt": "ro", "thread_id": thread})
            body = ok(r)
            assert body["text"] == f"echo {n}: ro", body
            assert "Read-only file system" in body["store_error"] and "memory" in body["store_error"], body
            assert "not stored" in text_of(r)
        listed = text_of(await c.call_tool("list_threads", {}))
        assert "threads are not stored" in listed and "Read-only file system" in listed, listed
        # --check, a wisp started now, says the directory is not in use and why.
        check = subprocess.run(
            [sys.executable, "-m", "wisp_shim", "--core", core_path(), "--backend", "echo", "--state-dir", str(state), "--check"],
            capture_output=True, text=True, cwd=REPO, timeout=60,
        )
        assert "not in use" in check.stdout and "Read-only file system" in check.stdout, check.stdout + check.stderr
        # Writable again: the directory is tried again (every 5 s) and the thread stored whole.
        assert _mount("-o", "remount,rw", str(tmpfs))
        await anyio.sleep(5.5)
        r = await say(c, "t", "3")
        assert r["text"] == "echo 3: 3" and r.get("store_error") is None, r
        assert not (state / "thread-s.json").exists()
        # Written whole (a header and three records of two lines), not appended to the older file.
        lines = (state / "thread-t.json").read_text().splitlines()
        assert json.loads(lines[0])["format"] == 2 and len(lines) == 7 and json.loads(lines[-1])["turns"] == 3
        assert "threads are not stored" not in text_of(await c.call_tool("list_threads", {}))
