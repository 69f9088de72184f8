"""A crafted `files` path: 540 KB of `sub/..` then `/.` is refused at once, as the
OS refuses a path over PATH_MAX, quoting only a short prefix of it; while two such calls run a
plain `files` call on another thread is answered, and the core is idle once they are done."""

from __future__ import annotations

import asyncio
import time

import anyio
import psutil
import pytest

from harness import core_pids, cpu_s, error_text, ok, wisp

pytestmark = pytest.mark.anyio

CRAFTED = "/".join(["sub/.."] * 60_000) + "/." * 60_000


async def test_crafted_paths_are_refused_at_once_and_starve_no_one(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "plain.txt").write_text("plain text\n")
    async with wisp("--root", str(tmp_path), "--timeout", "4") as client:
        ok(await client.call_tool("respond", {"prompt": "warm up", "thread_id": "plain"}))
        results: dict[str, object] = {}

        async def crafted(n: int) -> None:
            results[f"crafted{n}"] = await client.call_tool("respond", {"prompt": "read", "thread_id": f"c{n}", "files": [CRAFTED]})

        async def plain() -> None:  # sent right behind the crafted calls, while they are read
            start = time.monotonic()
            results["plain"] = await client.call_tool("respond", {"prompt": "read", "thread_id": "plain", "files": ["plain.txt"]})
            results["plain_s"] = time.monotonic() - start

        async with anyio.create_task_group() as tg:
            tg.start_soon(crafted, 1)
            tg.start_soon(crafted, 2)
            tg.start_soon(plain)
        reply = ok(results["plain"])
        assert reply["text"] == "echo 2: read\nfile plain.txt: plain text", reply
        # Answered well inside its own time limit (4 s), not after the crafted calls' limits.
        assert results["plain_s"] < 3.0, results["plain_s"]
        for n in (1, 2):
            text = error_text(results[f"crafted{n}"])
            assert text.startswith("invalid_argument: files: ") and "PATH_MAX" in text, text[:300]
            # A short prefix of the path, never the 540 KB of it.
            assert len(text) < 600, len(text)
        # Nothing of the crafted calls runs on: the core's CPU over the next second is idle.
        core = psutil.Process(core_pids(client)[-1])
        await asyncio.sleep(0.5)  # kept, as the next: the core's CPU over a second is the thing tested
        before = cpu_s(core)
        await asyncio.sleep(1.0)
        assert cpu_s(core) - before < 0.2


def test_a_hostile_client_gets_short_errors_for_crafted_and_unicode_paths(tmp_path):
    """Raw JSON-RPC, as a hostile client sends it: the crafted path, and the NFD sibling of an
    NFC root, each refused with a short error naming the path's start; the next call is served."""
    from harness import call, read_until, spawn_initialized

    root = tmp_path / "caf\u00e9"
    root.mkdir()
    (root / "ok.txt").write_text("fine\n")
    try:
        (tmp_path / "cafe\u0301").mkdir()
        (tmp_path / "cafe\u0301" / "secret.txt").write_text("the nfd secret\n")
        sibling = ["../cafe\u0301/secret.txt"]
    except FileExistsError:  # a file system that takes the two names for one (macOS)
        sibling = []
    proc = spawn_initialized("--root", str(root))
    try:
        lines: list[bytes] = []
        for n, path in enumerate([CRAFTED, *sibling], start=10):
            proc.stdin.write(call("respond", {"prompt": "read", "files": [path]}, n))
            proc.stdin.flush()
            reply = read_until(proc, n, lines)
            text = reply["result"]["content"][0]["text"]
            assert reply["result"]["isError"] and text.startswith("invalid_argument: files: "), text[:300]
            assert len(text) < 600 and "secret" not in text.replace("secret.txt", ""), text[:300]
        proc.stdin.write(call("respond", {"prompt": "read", "files": ["ok.txt"]}, 20))
        proc.stdin.flush()
        served = read_until(proc, 20, lines)["result"]
        assert not served["isError"] and served["structuredContent"]["text"] == "echo 1: read\nfile ok.txt: fine"
    finally:
        proc.stdin.close()
        proc.wait(10)
