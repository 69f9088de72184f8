"""What a call cost and how hard the model thinks: `usage` in every respond result and
each live thread's total in list_threads, the `reasoning` argument, reasoning kept out of the
reply, and the exact pre-count on an OpenAI-compatible server, through a real MCP client, shim and
core: the echo backend by its contract, the openai backend against a scripted server
(openai_stub.py) that records each request body."""

from __future__ import annotations

import pytest

from harness import error_text, ok, shim_env, wisp
from openai_stub import OpenAIStub, StubConfig


def est(text: str) -> int:
    """Echo's token count: ceil(UTF-8 bytes / 4)."""
    return (len(text.encode()) + 3) // 4


def openai(stub: OpenAIStub, *args: str):
    return wisp("--endpoint", stub.endpoint, *args, backend="openai", env=shim_env())


def stub_chars(body: dict) -> int:
    return sum(len(m.get("content") or "") for m in body["messages"])


# --- echo: its contract --------------------------------------------------------------------


async def test_echo_usage_is_its_own_count_of_what_it_read_and_wrote():
    async with wisp() as c:
        s1 = ok(await c.call_tool("respond", {"prompt": "hello there", "instructions": "Be brief."}))
        assert s1["usage"] == {"input_tokens": est("Be brief.") + est("hello there"), "output_tokens": est("echo 1: hello there")}
        s2 = ok(await c.call_tool("respond", {"prompt": "and again", "thread_id": s1["thread_id"]}))
        earlier = est("hello there") + est("echo 1: hello there")
        assert s2["usage"] == {"input_tokens": est("Be brief.") + earlier + est("and again"), "output_tokens": est("echo 2: and again")}
        assert "reasoning_tokens" not in s2["usage"] and "reasoning" not in s2
        threads = {t["thread_id"]: t for t in ok(await c.call_tool("list_threads", {}))["threads"]}
        total = threads[s1["thread_id"]]["usage"]
        assert total == {key: s1["usage"][key] + s2["usage"][key] for key in ("input_tokens", "output_tokens")}
        listing = await c.call_tool("list_threads", {})
        assert f"tokens {total['input_tokens']} in / {total['output_tokens']} out" in listing.content[0].text


async def test_echo_usage_counts_attached_files_as_sent(tmp_path):
    (tmp_path / "a.txt").write_text("first line\nsecond line\n")
    async with wisp("--root", str(tmp_path)) as c:
        plain = ok(await c.call_tool("respond", {"prompt": "look"}))
        with_file = ok(await c.call_tool("respond", {"prompt": "look", "files": ["a.txt"]}))
    assert with_file["usage"]["input_tokens"] > plain["usage"]["input_tokens"] + est("first line\nsecond line\n") - 1
    assert with_file["usage"]["output_tokens"] == est(with_file["text"])


@pytest.mark.parametrize("level", ["light", "moderate", "deep"])
async def test_echo_answers_a_reasoning_level_as_without_it_and_reports_it(level):
    async with wisp() as c:
        plain = ok(await c.call_tool("respond", {"prompt": "think"}))
        s = ok(await c.call_tool("respond", {"prompt": "think", "reasoning": level}))
    assert s["text"] == plain["text"] == "echo 1: think"
    assert s["reasoning"] == level and s["usage"] == plain["usage"]


@pytest.mark.parametrize("value", ["fast", "LIGHT", 1, True, ["light"]])
async def test_any_other_reasoning_value_is_invalid_argument(value):
    async with wisp() as c:
        e = error_text(await c.call_tool("respond", {"prompt": "think", "reasoning": value}))
        assert e.startswith("invalid_argument: `reasoning` must be one of \"light\", \"moderate\", \"deep\""), e
        assert ok(await c.call_tool("list_threads", {}))["threads"] == []  # refused before any thread


# --- openai: what is sent, what the server reported ------------------------------------------


async def test_reasoning_maps_to_reasoning_effort_and_is_absent_when_not_given():
    with OpenAIStub() as stub:
        async with openai(stub) as c:
            for level in ("light", "moderate", "deep"):
                assert ok(await c.call_tool("respond", {"prompt": "hi", "reasoning": level}))["reasoning"] == level
            plain = ok(await c.call_tool("respond", {"prompt": "hi"}))
        assert "reasoning" not in plain
        efforts = [b.get("reasoning_effort") for b in stub.chats()]
    assert efforts == ["low", "medium", "high", None]
    assert "reasoning_effort" not in stub.chats()[-1]


def counts(usage: dict) -> dict:
    """A usage's token counts, without the call's timing (wisp's own measure)."""
    return {k: v for k, v in usage.items() if k not in ("first_token_ms", "output_tokens_per_s")}


async def test_usage_is_what_the_server_reported_summed_over_tool_rounds(tmp_path):
    (tmp_path / "hello.txt").write_text("hi there\n")
    cfg = StubConfig(tool_call={"name": "read_file", "arguments": {"path": "hello.txt"}})
    with OpenAIStub(cfg) as stub:
        async with openai(stub, "--root", str(tmp_path)) as c:
            s = ok(await c.call_tool("respond", {"prompt": "read hello.txt", "tools": ["read_file"]}))
            cfg.tool_call = None
            plain = ok(await c.call_tool("respond", {"prompt": "thanks", "thread_id": s["thread_id"]}))
            threads = ok(await c.call_tool("list_threads", {}))["threads"]
        call_round, answer_round, third = stub.chats()
    # The stub reports prompt_tokens = characters // 4 and one completion token per streamed piece
    # (the tool call is one): each request's report, added up.
    answered = answer_round["messages"][-1]["content"]
    assert counts(s["usage"]) == {
        "input_tokens": stub_chars(call_round) // 4 + stub_chars(answer_round) // 4,
        "output_tokens": 1 + 1 + len(f"tool said {answered}".split(" ")),
    }
    assert counts(plain["usage"]) == {"input_tokens": stub_chars(third) // 4, "output_tokens": 1 + len("thanks".split(" "))}
    assert threads[0]["usage"] == {k: s["usage"][k] + plain["usage"][k] for k in ("input_tokens", "output_tokens")}


async def test_a_stream_without_usage_gives_no_usage_fields():
    with OpenAIStub(StubConfig(usage=False)) as stub:
        async with openai(stub) as c:
            s = ok(await c.call_tool("respond", {"prompt": "hi"}))
            threads = ok(await c.call_tool("list_threads", {}))["threads"]
        assert stub.chats()[0]["stream_options"] == {"include_usage": True}  # asked for, not sent
    assert counts(s["usage"]) == {} and "prompt_tokens" not in s
    assert s["usage"]["first_token_ms"] >= 0  # wisp's own measure, not the server's
    assert threads[0]["usage"] == {}


async def test_a_server_that_refuses_reasoning_effort_is_an_error_naming_it():
    with OpenAIStub(StubConfig(reject_reasoning=True)) as stub:
        async with openai(stub) as c:
            e = error_text(await c.call_tool("respond", {"prompt": "hi", "reasoning": "deep"}))
            assert ok(await c.call_tool("respond", {"prompt": "hi"}))["text"] == "reply 1: hi"
        assert len(stub.chats()) == 2  # not retried without the field
    assert e.startswith("invalid_argument: reasoning:"), e
    assert "reasoning_effort" in e and '"high"' in e and "Unrecognized request argument supplied: reasoning_effort" in e


async def test_reasoning_is_kept_out_of_the_reply_and_counted_as_reported():
    thought = "Let me think about this step by step."
    with OpenAIStub(StubConfig(reasoning=thought)) as stub:
        async with openai(stub) as c:
            s1 = ok(await c.call_tool("respond", {"prompt": "hi"}))
            s2 = ok(await c.call_tool("respond", {"prompt": "again", "thread_id": s1["thread_id"]}))
        first, second = stub.chats()
    assert s1["text"] == "reply 1: hi" and thought not in s1["text"]
    assert s1["usage"]["reasoning_tokens"] == -(-len(thought) // 4)
    assert s1["usage"]["output_tokens"] == s1["usage"]["reasoning_tokens"] + 2
    assert s2["turns"] == 2
    # Reasoning is not sent back with the turn (templates of reasoning models drop it).
    assert second["messages"][1] == {"role": "assistant", "content": "reply 1: hi"}


# --- the exact pre-count -----------------------------------------------------------------------


async def test_preflight_condensing_counts_the_whole_request_with_the_servers_template():
    # /tokenize counts words here and the chat's prompt_tokens characters // 4 (more): a
    # pre-flight that added up /tokenize counts would let requests run past the context.
    # Counted whole by /v1/chat/completions/input_tokens, every request fits with its reserve.
    n_ctx = 400
    with OpenAIStub(StubConfig(n_ctx=n_ctx, input_tokens=True)) as stub:
        async with openai(stub) as c:
            tid, condensed = None, False
            for i in range(10):
                args = {"prompt": f"turn {i} " + "abcdefghij " * 20, "max_output_tokens": 20}
                if tid:
                    args["thread_id"] = tid
                s = ok(await c.call_tool("respond", args))
                tid, condensed = s["thread_id"], condensed or s["condensed"]
        counted = [r.body for r in stub.requests if r.path == "/v1/chat/completions/input_tokens"]
        chats = stub.chats()
    assert condensed
    # Each chat was counted whole as it was sent (after condensing, counted again).
    assert all(any(body["messages"] == chat["messages"] for body in counted) for chat in chats)
    assert len(chats) < len(counted)  # some calls dropped turns and counted again
    for chat in chats:
        assert stub_chars(chat) // 4 + 20 <= n_ctx, stub_chars(chat) // 4


async def test_the_overflow_error_names_the_servers_count():
    # The stub refuses past 300 characters; the prompt alone is 1000 characters, 250 tokens by
    # the server's count (its /tokenize says 200 words).
    with OpenAIStub(StubConfig(n_ctx=200, input_tokens=True, overflow_chars=300)) as stub:
        async with openai(stub) as c:
            e = error_text(await c.call_tool("respond", {"prompt": "word " * 200}))
    assert e.startswith("context_overflow:"), e
    assert "with the instructions it takes 250 tokens" in e, e
