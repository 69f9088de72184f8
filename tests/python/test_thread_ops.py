"""Thread operations through a real MCP client, over stdio and over --http: fork (`fork_from`),
rewind, find (`list_threads` with `query`, `limit`, `cursor`) and reread (`read_thread`), for
live threads and, with --state-dir, stored ones (after a core crash, and with two wisps on one
state dir). The echo backend's replies say how many prompts the model saw: `echo N: …`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from contextlib import asynccontextmanager

import pytest

from harness import core_pids, error_text, held, ok, release, text_of, wait_for, wisp
from harness.http import client, http_wisp

TRANSPORTS = ("stdio", "http")


@asynccontextmanager
async def connected(transport: str, *args: str):
    """A client of a new wisp (echo backend) over `transport`; `.pids()` lists its cores' pids."""
    if transport == "stdio":
        async with wisp(*args) as c:
            c.pids = lambda: core_pids(c)  # type: ignore[attr-defined]
            yield c
    else:
        async with http_wisp(*args) as server, client(server) as c:
            c.pids = server.core_pids  # type: ignore[attr-defined]
            yield c


async def say(c, prompt: str, **args) -> dict:
    return ok(await c.call_tool("respond", {"prompt": prompt, **args}))


async def thread_of(c, tid: str, turns: int) -> None:
    for i in range(1, turns + 1):
        assert (await say(c, f"turn {i}", thread_id=tid))["text"] == f"echo {i}: turn {i}"


async def prompts(c, tid: str) -> list[str]:
    return [t["prompt"] for t in ok(await c.call_tool("read_thread", {"thread_id": tid}))["items"]]


# --- fork ---


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_fork_of_a_live_thread_copies_it_and_leaves_the_source_alone(transport):
    async with connected(transport) as c:
        await say(c, "one", thread_id="src", instructions="be brief")
        await say(c, "two", thread_id="src")
        await say(c, "three", thread_id="src")
        f = await say(c, "branch", fork_from="src")
        assert (f["text"], f["created"], f["turns"]) == ("echo 4: branch", True, 4) and f["thread_id"] != "src"
        named = await say(c, "other branch", fork_from="src", thread_id="b2")
        assert (named["text"], named["thread_id"], named["created"]) == ("echo 4: other branch", "b2", True)
        # The source did not take either turn; the fork kept the source's binding.
        assert (await say(c, "go on", thread_id="src"))["text"] == "echo 4: go on"
        assert await prompts(c, f["thread_id"]) == ["one", "two", "three", "branch"]
        read = ok(await c.call_tool("read_thread", {"thread_id": "b2"}))
        assert read["instructions"] == "be brief" and read["turns"] == 4
        refused = await c.call_tool("respond", {"prompt": "x", "thread_id": "b2", "instructions": "other"})
        assert "be brief" in error_text(refused)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_fork_of_a_busy_thread_copies_its_last_committed_turn(transport):
    async with connected(transport) as c:
        await thread_of(c, "busy", 3)
        slow = asyncio.create_task(c.call_tool("respond", {"prompt": "!hold busy slow", "thread_id": "busy"}))
        await held(c, "busy")
        f = await say(c, "while busy", fork_from="busy")
        assert (f["text"], f["turns"]) == ("echo 4: while busy", 4)
        assert not slow.done()  # the fork did not wait for the source's call, parked till released
        assert await release(c, "busy") == 1
        assert ok(await slow)["text"] == "echo 4: !hold busy slow"
        assert (await say(c, "after", thread_id=f["thread_id"]))["text"] == "echo 5: after"
        assert await prompts(c, f["thread_id"]) == ["turn 1", "turn 2", "turn 3", "while busy", "after"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_fork_refusals_change_nothing(transport):
    async with connected(transport) as c:
        await thread_of(c, "s", 2)
        await thread_of(c, "taken", 1)
        unknown = error_text(await c.call_tool("respond", {"prompt": "x", "fork_from": "nosuch"}))
        assert unknown.startswith("invalid_argument") and "nosuch" in unknown
        for binding in ({"instructions": "new"}, {"tools": []}):
            refused = error_text(await c.call_tool("respond", {"prompt": "x", "fork_from": "s", **binding}))
            assert refused.startswith("invalid_argument") and next(iter(binding)) in refused
        onto = error_text(await c.call_tool("respond", {"prompt": "x", "fork_from": "s", "thread_id": "taken"}))
        assert onto.startswith("invalid_argument") and "taken" in onto and "already exists" in onto
        listed = {t["thread_id"]: t["turns"] for t in ok(await c.call_tool("list_threads", {}))["threads"]}
        assert listed == {"s": 2, "taken": 1}


# --- rewind ---


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_rewind_then_continue(transport):
    async with connected(transport) as c:
        await thread_of(c, "r", 3)
        r = await say(c, "instead", thread_id="r", rewind=1)
        assert (r["text"], r["turns"], r["created"]) == ("echo 3: instead", 3, False)
        assert (await say(c, "next", thread_id="r"))["text"] == "echo 4: next"
        assert await prompts(c, "r") == ["turn 1", "turn 2", "instead", "next"]
        r = await say(c, "from the top", thread_id="r", rewind=4)
        assert (r["text"], r["turns"]) == ("echo 1: from the top", 1)
        # Fork and rewind together: a copy without the source's last turn.
        await thread_of(c, "s", 3)
        f = await say(c, "other way", fork_from="s", rewind=2)
        assert (f["text"], f["turns"]) == ("echo 2: other way", 2)
        assert await prompts(c, "s") == ["turn 1", "turn 2", "turn 3"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_rewind_refused_past_the_start_or_on_no_thread(transport):
    async with connected(transport) as c:
        await thread_of(c, "r", 2)
        past = error_text(await c.call_tool("respond", {"prompt": "x", "thread_id": "r", "rewind": 3}))
        assert past.startswith("invalid_argument") and "2 turns" in past
        assert error_text(await c.call_tool("respond", {"prompt": "x", "thread_id": "r", "rewind": 0})).startswith("invalid_argument")
        assert "thread_id" in error_text(await c.call_tool("respond", {"prompt": "x", "rewind": 1}))
        assert "nosuch" in error_text(await c.call_tool("respond", {"prompt": "x", "thread_id": "nosuch", "rewind": 1}))
        assert (await say(c, "still", thread_id="r"))["text"] == "echo 3: still"
        assert "nosuch" not in {t["thread_id"] for t in ok(await c.call_tool("list_threads", {}))["threads"]}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_rewind_that_times_out_or_is_cancelled_changes_nothing(transport):
    # A limit a loaded machine meets the cancel below well within.
    async with connected(transport, "--timeout", "3") as c:
        await thread_of(c, "r", 3)
        # Parked until the limit: never released.
        timed_out = error_text(await c.call_tool("respond", {"prompt": "!hold never late", "thread_id": "r", "rewind": 2}))
        assert timed_out.startswith("timeout") and "unchanged" in timed_out
        cancelled = asyncio.create_task(c.call_tool("respond", {"prompt": "!hold cancelled x", "thread_id": "r", "rewind": 1}))
        await held(c, "cancelled")  # running, its rewind applied to the history it answers from
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert await prompts(c, "r") == ["turn 1", "turn 2", "turn 3"]
        assert (await say(c, "next", thread_id="r"))["text"] == "echo 4: next"


# --- find ---


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_list_threads_previews_and_query_over_live_threads(transport):
    async with connected(transport) as c:
        await say(c, "the compiler says undefined symbol foo", thread_id="build", instructions="x" * 500)
        await say(c, "now the linker", thread_id="build")
        await say(c, "write a haiku", thread_id="poem")
        page = ok(await c.call_tool("list_threads", {}))
        first = page["threads"][0]
        assert first["thread_id"] == "poem"  # most recently used first
        build = page["threads"][1]
        assert build["first_prompt"] == "the compiler says undefined symbol foo"
        assert build["last_reply"] == "echo 2: now the linker"
        assert build["instructions"].startswith("xxx") and len(build["instructions"].encode()) <= 200
        assert build["created_at"].endswith("Z") and build["updated_at"] >= build["created_at"]
        assert build["usage"]["input_tokens"] > 0 and "next_cursor" not in page
        found = ok(await c.call_tool("list_threads", {"query": "Undefined SYMBOL"}))["threads"]
        assert [t["thread_id"] for t in found] == ["build"]
        assert ok(await c.call_tool("list_threads", {"query": "undefined haiku"}))["threads"] == []
        # Best match first: "haiku" is in both the prompt and the reply of poem, once in build.
        await say(c, "a haiku please", thread_id="build")
        ranked = ok(await c.call_tool("list_threads", {"query": "haiku"}))["threads"]
        assert [t["thread_id"] for t in ranked] == ["build", "poem"]
        assert "query" in error_text(await c.call_tool("list_threads", {"query": "   "}))


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_paging_through_100_threads_lists_each_once(transport):
    async with connected(transport, "--max-threads", "200") as c:
        await asyncio.gather(*(say(c, f"topic {i}", thread_id=f"t{i:03}") for i in range(100)))
        seen: list[str] = []
        cursor = None
        pages = 0
        while True:
            args = {"limit": 7} | ({"cursor": cursor} if cursor else {})
            page = ok(await c.call_tool("list_threads", args))
            pages += 1
            assert len(page["threads"]) <= 7
            seen += [t["thread_id"] for t in page["threads"]]
            cursor = page.get("next_cursor")
            if cursor is None:
                break
        assert pages == 15 and sorted(seen) == [f"t{i:03}" for i in range(100)] and len(set(seen)) == 100
        assert len(ok(await c.call_tool("list_threads", {}))["threads"]) == 20  # the default page
        bad = error_text(await c.call_tool("list_threads", {"cursor": "nonsense"}))
        assert bad.startswith("invalid_argument") and "cursor" in bad


# --- reread ---


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_read_thread_is_bounded_on_a_thread_of_200_turns(transport):
    async with connected(transport, "--context-size", "1000000") as c:
        big = "y" * 400
        for i in range(200):
            await say(c, f"{i} {big}", thread_id="long")
        r = ok(await c.call_tool("read_thread", {"thread_id": "long"}))
        size = sum(len(t["prompt"]) + len(t["reply"]) for t in r["items"])
        assert r["turns"] == 200 and 0 < len(r["items"]) < 200 and size <= 32 * 1024
        assert r["omitted"] == 200 - len(r["items"]) and r["dropped"] == 0
        assert r["items"][-1]["prompt"] == f"199 {big}" and "left out" in text_of(await c.call_tool("read_thread", {"thread_id": "long"}))
        last = ok(await c.call_tool("read_thread", {"thread_id": "long", "last": 3}))
        assert [t["prompt"].split()[0] for t in last["items"]] == ["197", "198", "199"] and last["omitted"] == 197
        # A turn larger than the bound is shortened, and says so.
        huge = await say(c, "z" * 100_000, thread_id="huge")
        h = ok(await c.call_tool("read_thread", {"thread_id": "huge"}))["items"]
        assert huge["turns"] == 1 and len(h) == 1 and h[0]["cut"] is True and len(h[0]["prompt"]) < 32 * 1024
        assert "nosuch" in error_text(await c.call_tool("read_thread", {"thread_id": "nosuch"}))


async def test_read_thread_gives_a_schema_turns_value():
    async with wisp() as c:
        s = ok(await c.call_tool("respond", {"prompt": "p", "thread_id": "j", "schema": {
            "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}))
        assert s["output"] == {"n": 1} and "text" not in s  # the value once, not again as text
        await say(c, "plain", thread_id="j")
        items = ok(await c.call_tool("read_thread", {"thread_id": "j"}))["items"]
        assert items[0] == {"prompt": "p", "output": {"n": 1}} and items[1]["reply"] == "echo 2: plain"


# --- stored threads ---


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_stored_threads_fork_rewind_find_and_read_after_a_core_crash(transport, tmp_path):
    state = tmp_path / "state"
    async with connected(transport, "--state-dir", str(state)) as c:
        await say(c, "remember the word zephyr", thread_id="old")
        await say(c, "two", thread_id="old")
        await say(c, "three", thread_id="old")
        os.kill(c.pids()[-1], signal.SIGKILL)
        await wait_for(lambda: len(c.pids()) == 2, 10)
        # The new core holds no live thread: every operation reads the stored one.
        found = ok(await c.call_tool("list_threads", {"query": "zephyr"}))["threads"]
        assert [(t["thread_id"], t["live"], t["stored"]) for t in found] == [("old", False, True)]
        assert found[0]["first_prompt"] == "remember the word zephyr" and found[0]["updated_at"].endswith("Z")
        assert await prompts(c, "old") == ["remember the word zephyr", "two", "three"]
        f = await say(c, "branch", fork_from="old", thread_id="fork")
        assert (f["text"], f["created"]) == ("echo 4: branch", True) and "store_error" not in f
        onto = error_text(await c.call_tool("respond", {"prompt": "x", "fork_from": "fork", "thread_id": "old"}))
        assert "already exists" in onto
        r = await say(c, "instead", thread_id="old", rewind=1)
        assert (r["text"], r["turns"]) == ("echo 3: instead", 3)
    # A new wisp on the same state dir: the fork was stored with its first turn, the rewind too.
    async with connected(transport, "--state-dir", str(state)) as c:
        assert (await say(c, "more", thread_id="fork"))["text"] == "echo 5: more"
        assert await prompts(c, "old") == ["remember the word zephyr", "two", "instead"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_two_wisps_on_one_state_dir_fork_and_find_each_others_threads(transport, tmp_path):
    state = tmp_path / "state"
    async with connected(transport, "--state-dir", str(state)) as a, connected(transport, "--state-dir", str(state)) as b:
        await say(a, "alpha quokka", thread_id="from-a")
        await say(a, "alpha two", thread_id="from-a")
        found = ok(await b.call_tool("list_threads", {"query": "quokka"}))["threads"]
        assert [t["thread_id"] for t in found] == ["from-a"]
        f = await say(b, "b's branch", fork_from="from-a", thread_id="b-fork")
        assert f["text"] == "echo 3: b's branch"
        assert await prompts(a, "b-fork") == ["alpha quokka", "alpha two", "b's branch"]
        # a's thread went on meanwhile; b's copy of it is read from the store, not b's memory.
        await say(a, "alpha three", thread_id="from-a")
        assert (await say(b, "again", fork_from="from-a"))["text"] == "echo 4: again"


async def test_paging_over_live_and_stored_threads(tmp_path):
    state = tmp_path / "state"
    async with wisp("--state-dir", str(state), "--max-threads", "5") as c:
        for i in range(30):
            await say(c, f"n{i}", thread_id=f"t{i:02}")
        seen = []
        cursor = None
        while True:
            page = ok(await c.call_tool("list_threads", {"limit": 8} | ({"cursor": cursor} if cursor else {})))
            seen += [(t["thread_id"], t["live"]) for t in page["threads"]]
            if (cursor := page.get("next_cursor")) is None:
                break
        assert sorted(t for t, _ in seen) == [f"t{i:02}" for i in range(30)]
        # Most recently used first, live or not: the five live ones are the five newest.
        assert [t for t, _ in seen] == [f"t{i:02}" for i in reversed(range(30))]
        assert sum(live for _, live in seen) == 5


async def test_tools_list_is_small_and_structured_content_says_each_fact_once(tmp_path):
    def size(tools) -> int:
        return len(json.dumps([t.model_dump(by_alias=True, exclude_none=True) for t in tools], separators=(",", ":")))

    async with wisp() as c:
        tools = (await c.list_tools()).tools
        assert [t.name for t in tools] == ["respond", "close_thread", "list_threads", "read_thread"]
        # Every client pays for tools/list in its context on every session: under 10 KB (11,790 bytes
        # before the descriptions were tightened), and with --state-dir's longer retention text below.
        assert size(tools) <= 10_000, size(tools)
        r = await say(c, "hi")
        assert "prompt_tokens" not in r and "output_tokens" not in r and r["usage"]["output_tokens"] > 0
    async with wisp("--state-dir", str(tmp_path / "state")) as c:
        tools = (await c.list_tools()).tools
        assert size(tools) <= 10_000, size(tools)
