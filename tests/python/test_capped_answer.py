"""A capped answer says so (issue 45.10): when the model server ends a reply with
`finish_reason: "length"`, respond's structuredContent carries `finish_reason: "length"` and its
text a note that the reply was cut at the output cap and how to raise it; a reply that ended on
its own carries neither. Scripted servers: openai_stub.py (cuts at the request's max_tokens) and
unruly_server.py (stops at a cap of its own, as llama-server's -n does). The real local model:
test_real_model_borders.py."""

from __future__ import annotations

from harness import ok, text_of, wisp
from openai_stub import OpenAIStub, StubConfig
from unruly_server import Unruly
from wisp_shim.mcp.tools.respond import CUT_AT_CAP_NOTE

STORY = "Once upon a time a dragon met a knight, and they talked for a very long while. " * 10


async def test_a_reply_cut_at_max_output_tokens_says_so_and_how_to_raise_it():
    with OpenAIStub(StubConfig(reply=STORY)) as stub:
        async with wisp("--endpoint", stub.endpoint, backend="openai") as c:
            r = await c.call_tool("respond", {"prompt": "a story", "max_output_tokens": 10})
            whole = await c.call_tool("respond", {"prompt": "a story", "max_output_tokens": 1000})
    s = ok(r)
    assert s["text"] == STORY[:40] and s["finish_reason"] == "length", s
    assert CUT_AT_CAP_NOTE in text_of(r) and "max_output_tokens" in CUT_AT_CAP_NOTE
    # The same reply, ended by the model itself: no finish_reason, no note.
    w = ok(whole)
    assert w["text"] == STORY and "finish_reason" not in w, w
    assert "output cap" not in text_of(whole)


async def test_a_reply_the_server_stopped_at_its_own_cap_says_so():
    # No max_output_tokens asked: the server's own limit (llama-server's -n) stopped it.
    with Unruly(pieces=["Once", " upon", " a", " time"], finish="length") as server:
        async with wisp("--endpoint", server.endpoint, backend="openai") as c:
            r = await c.call_tool("respond", {"prompt": "a story"})
    s = ok(r)
    assert s["text"] == "Once upon a time" and s["finish_reason"] == "length", s
    assert text_of(r).splitlines()[-2] == CUT_AT_CAP_NOTE, text_of(r)


async def test_a_reply_that_ended_on_its_own_carries_no_finish_reason():
    with Unruly() as server:
        async with wisp("--endpoint", server.endpoint, backend="openai") as c:
            r = await c.call_tool("respond", {"prompt": "hello"})
        async with wisp() as echo:  # a backend with no cap to report
            e = await echo.call_tool("respond", {"prompt": "hello", "max_output_tokens": 1})
    for result in (r, e):
        assert "finish_reason" not in ok(result) and CUT_AT_CAP_NOTE not in text_of(result)
