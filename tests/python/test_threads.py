"""The thread rules (ARCHITECTURE.md), through a real MCP client, shim and core (echo backend)."""

from __future__ import annotations

import asyncio
import re

from harness import error_text, held, ok, release, text_of, until_pending, wait_for, wisp

ID_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")


async def test_tools_are_described_and_declare_output_schemas():
    async with wisp() as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        assert {"respond", "close_thread"} <= set(tools)
        respond, close = tools["respond"], tools["close_thread"]
        for t in (respond, close):
            assert t.output_schema and t.output_schema["type"] == "object"
            assert len(t.description) < 2048
            for name, prop in t.input_schema["properties"].items():
                assert prop.get("description"), f"{t.name}.{name} has no description"
        assert respond.input_schema["required"] == ["prompt"]
        assert set(respond.input_schema["properties"]) == {
            "prompt", "thread_id", "fork_from", "rewind", "instructions", "tools", "files", "temperature", "max_output_tokens",
            "schema", "reasoning",
        }
        assert respond.input_schema["properties"]["reasoning"]["enum"] == ["light", "moderate", "deep"]
        assert {"thread_id", "created", "condensed", "usage"} <= set(respond.output_schema["required"])
        assert set(respond.output_schema["properties"]["usage"]["properties"]) == {
            "input_tokens", "output_tokens", "reasoning_tokens", "cached_tokens", "first_token_ms", "output_tokens_per_s", "endpoint"}
        desc = respond.description.lower()
        assert "least recently used" in desc and "memory" in desc and "restart" in desc
        a = respond.annotations
        assert (a.read_only_hint, a.destructive_hint, a.idempotent_hint, a.open_world_hint) == (False, False, False, False)
        a = close.annotations
        assert (a.destructive_hint, a.idempotent_hint, a.open_world_hint) == (True, True, False)
        # Server instructions exist, state the retention policy, and stay under clients' 2 KB truncation.
        assert c.instructions and 0 < len(c.instructions) < 2048 and "32" in c.instructions


async def test_legacy_handshake_gets_instructions():
    async with wisp(mode="legacy") as c:
        assert c.instructions and len(c.instructions) < 2048
        r = ok(await c.call_tool("respond", {"prompt": "hi"}))
        assert r["text"] == "echo 1: hi"


async def test_create_then_continue():
    async with wisp() as c:
        r1 = await c.call_tool("respond", {"prompt": "hello"})
        s1 = ok(r1)
        assert s1["created"] is True and s1["text"] == "echo 1: hello" and s1["condensed"] is False
        assert s1["turns"] == 1 and s1["dropped"] == 0
        tid = s1["thread_id"]
        assert ID_RE.fullmatch(tid) and len(tid) >= 24  # >= 96 random bits in hex
        # The text block carries the reply and, on its last line, the thread id.
        lines = text_of(r1).splitlines()
        assert lines[0] == "echo 1: hello" and lines[-1] == f"[thread_id: {tid}]"
        s2 = ok(await c.call_tool("respond", {"prompt": "again", "thread_id": tid}))
        assert (s2["created"], s2["text"], s2["turns"], s2["thread_id"]) == (False, "echo 2: again", 2, tid)
        s3 = ok(await c.call_tool("respond", {"prompt": "third", "thread_id": tid}))
        assert s3["text"] == "echo 3: third"
        # A call without an id starts another thread, not this one.
        other = ok(await c.call_tool("respond", {"prompt": "other"}))
        assert other["created"] and other["thread_id"] != tid and other["text"] == "echo 1: other"


async def test_unknown_supplied_id_creates_thread_under_that_id():
    async with wisp() as c:
        for tid in ("my-thread.1", ".", "..", "A" * 64):
            s = ok(await c.call_tool("respond", {"prompt": "x", "thread_id": tid}))
            assert (s["thread_id"], s["created"], s["text"]) == (tid, True, "echo 1: x")
        r = await c.call_tool("respond", {"prompt": "y", "thread_id": "my-thread.1"})
        assert ok(r)["created"] is False and ok(r)["text"] == "echo 2: y"


async def test_instructions_and_tools_bind_at_creation():
    async with wisp() as c:
        s = ok(await c.call_tool("respond", {"prompt": "hi", "thread_id": "bound", "instructions": "Be terse.", "tools": ["read_file"]}))
        assert s["created"] and s["text"] == "echo 1: hi"
        # Empty values too: `tools: []` on an existing thread is not "no tools now", silently ignored.
        extras = (
            {"instructions": "Be verbose."}, {"tools": ["read_file"]}, {"instructions": "x", "tools": ["read_file"]},
            {"instructions": ""}, {"tools": []}, {"instructions": "", "tools": []},
        )
        for extra in extras:
            msg = error_text(await c.call_tool("respond", {"prompt": "again", "thread_id": "bound", **extra}))
            assert msg.startswith("invalid_argument:"), (extra, msg)
            assert 'bound to instructions "Be terse." and tools [read_file]' in msg, (extra, msg)
            assert f"Omit {' and '.join(extra)} (even an empty value) to continue it" in msg, (extra, msg)
        # The failed calls left the thread as it was.
        assert ok(await c.call_tool("respond", {"prompt": "next", "thread_id": "bound"}))["text"] == "echo 2: next"
        # At creation, empty still means none.
        s = ok(await c.call_tool("respond", {"prompt": "hi", "thread_id": "plain", "instructions": "", "tools": []}))
        assert s["created"] and s["text"] == "echo 1: hi"


async def test_close_thread_known_and_unknown():
    async with wisp() as c:
        tid = ok(await c.call_tool("respond", {"prompt": "a"}))["thread_id"]
        assert ok(await c.call_tool("respond", {"prompt": "b", "thread_id": tid}))["text"] == "echo 2: b"
        closed = await c.call_tool("close_thread", {"thread_id": tid})
        assert ok(closed) == {"thread_id": tid, "closed": True}
        again = ok(await c.call_tool("close_thread", {"thread_id": tid}))
        assert again == {"thread_id": tid, "closed": False}
        assert ok(await c.call_tool("close_thread", {"thread_id": "never-seen"}))["closed"] is False
        # A closed id starts over, and says so.
        r = await c.call_tool("respond", {"prompt": "c", "thread_id": tid})
        s = ok(r)
        assert s["created"] is True and s["text"] == "echo 1: c"
        assert "new" in text_of(r).lower()


async def test_lru_eviction_at_max_threads():
    async with wisp("--max-threads", "2") as c:
        for tid in ("a", "b"):
            ok(await c.call_tool("respond", {"prompt": "1", "thread_id": tid}))
        assert ok(await c.call_tool("respond", {"prompt": "2", "thread_id": "a"}))["text"] == "echo 2: 2"
        # A third thread evicts the least recently used one: b.
        assert ok(await c.call_tool("respond", {"prompt": "1", "thread_id": "c"}))["created"]
        s = ok(await c.call_tool("respond", {"prompt": "3", "thread_id": "a"}))
        assert (s["created"], s["text"]) == (False, "echo 3: 3")
        s = ok(await c.call_tool("respond", {"prompt": "again", "thread_id": "b"}))
        assert (s["created"], s["text"]) == (True, "echo 1: again")  # b was evicted; recreating it evicts c
        s = ok(await c.call_tool("respond", {"prompt": "4", "thread_id": "a"}))
        assert (s["created"], s["text"]) == (False, "echo 4: 4")
        threads = ok(await c.call_tool("list_threads", {}))["threads"]
        assert sorted(t["thread_id"] for t in threads) == ["a", "b"]


async def test_different_threads_run_concurrently():
    async with wisp() as c:
        calls = [asyncio.create_task(c.call_tool("respond", {"prompt": "!hold par go", "thread_id": f"par-{i}"}))
                 for i in range(4)]
        await held(c, "par", calls=4)  # all four parked at once: they overlap, however slow the machine
        assert await release(c, "par") == 4
        assert [ok(r)["text"] for r in await asyncio.gather(*calls)] == ["echo 1: !hold par go"] * 4


async def test_one_thread_runs_calls_one_at_a_time_in_order():
    words = ("two", "three", "four")
    async with wisp() as c:
        ok(await c.call_tool("respond", {"prompt": "first", "thread_id": "serial"}))
        tasks = []
        for k, word in enumerate(words, 1):
            tasks.append(asyncio.create_task(c.call_tool("respond", {"prompt": f"!hold {word} {word}", "thread_id": "serial"})))
            await until_pending(c, "serial", calls=k)  # fixes the arrival order
        for k, word in enumerate(words):
            await held(c, word)
            # While it is parked, the calls behind it have not started: none waits at its hold.
            assert [await release(c, later) for later in words[k + 1:]] == [0] * (len(words) - k - 1)
            assert await release(c, word) == 1
        results = [ok(r)["text"] for r in await asyncio.gather(*tasks)]
        assert results == ["echo 2: !hold two two", "echo 3: !hold three three", "echo 4: !hold four four"]


async def test_queue_limit_gives_busy():
    async with wisp("--max-queue", "1") as c:
        ok(await c.call_tool("respond", {"prompt": "first", "thread_id": "q"}))
        calls = [asyncio.create_task(c.call_tool("respond", {"prompt": "!hold q x", "thread_id": "q"})) for _ in range(4)]
        await held(c, "q")  # one runs; one may wait behind it; the other two are refused at once
        await wait_for(lambda: sum(t.done() for t in calls) == 2, 30)
        for _ in range(2):  # the running call, then the one that waited
            await held(c, "q")
            assert await release(c, "q") == 1
        results = await asyncio.gather(*calls)
        errors = [text_of(r) for r in results if r.is_error]
        assert len(errors) == 2 and all(e.startswith("busy:") for e in errors), errors
        assert [ok(r)["text"] for r in results if not r.is_error] == ["echo 2: !hold q x", "echo 3: !hold q x"]


async def test_condensing_drops_oldest_turns():
    # Each exchange below is 10 + 12 = 22 tokens: two fit in 64, a third does not.
    prompt = "x" * 40
    async with wisp("--context-size", "64") as c:
        s1 = ok(await c.call_tool("respond", {"prompt": prompt, "thread_id": "small"}))
        s2 = ok(await c.call_tool("respond", {"prompt": prompt, "thread_id": "small"}))
        assert (s1["text"][:7], s2["text"][:7], s2["condensed"]) == ("echo 1:", "echo 2:", False)
        r3 = await c.call_tool("respond", {"prompt": prompt, "thread_id": "small"})
        s3 = ok(r3)
        assert s3["condensed"] is True and s3["dropped"] >= 1
        assert s3["text"].startswith("echo 2:"), s3["text"]  # N counts only the turns kept
        assert s3["turns"] == 2 and s3["created"] is False
        assert "dropped" in text_of(r3)


async def test_prompt_that_cannot_fit_is_an_error_that_says_what_to_do():
    async with wisp("--context-size", "64") as c:
        ok(await c.call_tool("respond", {"prompt": "short", "thread_id": "big"}))
        msg = error_text(await c.call_tool("respond", {"prompt": "y" * 400, "thread_id": "big"}))
        # The ADR's advice first; that a shorter prompt would fit only after it.
        assert msg.startswith("context_overflow: Close this thread (close_thread) and start another"), msg
        assert "Shorten the prompt (or the new thread's instructions)" in msg
        # The thread is still usable and unchanged.
        assert ok(await c.call_tool("respond", {"prompt": "ok", "thread_id": "big"}))["text"] == "echo 2: ok"


async def test_backend_failure_reaches_the_caller_verbatim():
    async with wisp() as c:
        msg = error_text(await c.call_tool("respond", {"prompt": "!fail generation_failed"}))
        assert msg.startswith("generation_failed:") and "on purpose" in msg


async def test_the_retention_the_caller_reads_follows_the_configuration(tmp_path):
    """The server's instructions and the respond tool's description say where threads live as
    configured: in memory only and lost on restart, or (--state-dir, or WISP_STATE_DIR) stored
    and kept across restarts. They said "memory only" with a state dir too."""
    from harness import shim_env

    async def told(*args: str, env: dict | None = None) -> tuple[str, str]:
        async with wisp(*args, env=env) as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            return c.instructions, tools["respond"].description

    for instructions, description in [await told()]:
        for text in (instructions, description):
            assert "in memory only" in text and "lost when wisp restarts" in text, text
            assert len(text) < 2048
    durable = [await told("--state-dir", str(tmp_path / "a")), await told(env=shim_env(WISP_STATE_DIR=str(tmp_path / "b")))]
    for instructions, description in durable:
        for text in (instructions, description):
            assert "stored on disk (--state-dir) and survive restarts" in text, text
            assert "lost when wisp restarts" not in text and "32" in text, text
            assert len(text) < 2048
    # An empty --state-dir means none, for the core as for what the caller is told.
    instructions, _ = await told("--state-dir", "", env=shim_env(WISP_STATE_DIR=str(tmp_path / "c")))
    assert "in memory only" in instructions, instructions


async def test_the_lost_thread_note_is_only_for_ids_this_wisp_held():
    """A brand-new caller-chosen id starts a thread with no note; an id this wisp held a thread
    under and then lost (closed here; evicted and crashed in test_crashes) gets the note."""
    note = "[note: no live thread had this id"
    async with wisp() as c:
        r = await c.call_tool("respond", {"prompt": "hi", "thread_id": "brand-new"})
        assert ok(r)["created"] is True and note not in text_of(r), text_of(r)
        r = await c.call_tool("respond", {"prompt": "again", "thread_id": "brand-new"})
        assert ok(r)["created"] is False and note not in text_of(r)
        assert ok(await c.call_tool("close_thread", {"thread_id": "brand-new"}))["closed"] is True
        r = await c.call_tool("respond", {"prompt": "back", "thread_id": "brand-new"})
        assert ok(r)["created"] is True and note in text_of(r), text_of(r)


async def test_overflow_advice_fits_the_case():
    """A prompt too big for a brand-new thread does not advise closing a thread that does not
    exist; a reply too long for the context is not called a prompt that does not fit."""
    async with wisp("--context-size", "100") as c:
        msg = error_text(await c.call_tool("respond", {"prompt": "y" * 800, "thread_id": "new"}))
        assert msg.startswith("context_overflow: the prompt does not fit in the model's 100-token context"), msg
        assert "close_thread" not in msg and "Shorten the prompt" in msg, msg
        # 75 of 100 tokens: the prompt fits, its echo does not fit beside it.
        for tid in ("new", "old"):
            if tid == "old":
                ok(await c.call_tool("respond", {"prompt": "small", "thread_id": "old"}))
            msg = error_text(await c.call_tool("respond", {"prompt": "y" * 300, "thread_id": tid}))
            assert msg.startswith("context_overflow: the reply did not fit in the model's 100-token context"), msg
            assert "prompt does not fit" not in msg and "close_thread" not in msg and "max_output_tokens" in msg, msg
        assert ok(await c.call_tool("respond", {"prompt": "fine", "thread_id": "old"}))["text"] == "echo 2: fine"
        listed = [t["thread_id"] for t in ok(await c.call_tool("list_threads", {}))["threads"]]
        assert listed == ["old"], listed


async def test_a_huge_number_is_described_by_its_exact_digits():
    # It read "got int an integer of about 401 digits" for a number of 400 digits.
    async with wisp() as c:
        msg = error_text(await c.call_tool("respond", {"prompt": int("9" * 400)}))
        assert msg == "invalid_argument: `prompt` must be a string, got an integer of 400 digits.", msg
        msg = error_text(await c.call_tool("respond", {"prompt": "p", "max_output_tokens": -int("1" + "0" * 399)}))
        assert msg == "invalid_argument: `max_output_tokens` must be an integer from 1 to 2147483647, got an integer of 400 digits.", msg
