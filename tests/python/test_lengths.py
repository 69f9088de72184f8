"""A length wisp bounds is judged once, in one unit: list_threads' query is the core's to refuse,
in bytes of UTF-8 (its facts state the number); the shim checks no length of its own."""

from __future__ import annotations

from harness import error_text, ok, wisp
from wisp_shim.facts import MAX_QUERY_BYTES

KANA = "あ"  # one character, three bytes of UTF-8


async def test_a_query_is_judged_by_the_core_in_bytes_and_one_at_the_limit_works():
    assert len(KANA.encode()) == 3 and MAX_QUERY_BYTES % 3 == 1  # the word below is the limit exactly
    word = KANA * (MAX_QUERY_BYTES // 3) + "x"
    assert len(word.encode()) == MAX_QUERY_BYTES
    async with wisp() as c:
        query = next(t for t in (await c.list_tools()).tools if t.name == "list_threads").input_schema
        query = query["properties"]["query"]
        assert "maxLength" not in query and f"{MAX_QUERY_BYTES} bytes" in query["description"]
        ok(await c.call_tool("respond", {"prompt": f"find {word} here", "thread_id": "kana"}))
        ok(await c.call_tool("respond", {"prompt": "something else", "thread_id": "other"}))
        found = ok(await c.call_tool("list_threads", {"query": word}))["threads"]
        assert [t["thread_id"] for t in found] == ["kana"]
        # 999 characters: under a character limit of 1000, but 2997 bytes; the core's error, not the shim's.
        refused = error_text(await c.call_tool("list_threads", {"query": KANA * 999}))
        assert refused.startswith("invalid_argument: ")
        assert f"query is 2997 bytes of UTF-8; at most {MAX_QUERY_BYTES} bytes" in refused, refused
        over = error_text(await c.call_tool("list_threads", {"query": word + "y"}))
        assert f"query is {MAX_QUERY_BYTES + 1} bytes of UTF-8" in over, over
        assert "no words" in error_text(await c.call_tool("list_threads", {"query": ""}))
