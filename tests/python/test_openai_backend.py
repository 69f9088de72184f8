"""The openai backend through a real MCP client, shim and core, against a scripted
OpenAI-compatible server (openai_stub.py): what it sends, streaming, overflow in each
server's dialect, errors, cancellation. Fast and deterministic; the real model is in
test_real_model.py."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from harness import error_text, ok, shim_env, wait_for, wisp
from openai_stub import OpenAIStub, StubConfig, closed_port


def openai(stub_or_endpoint, *args: str, **env: str):
    endpoint = stub_or_endpoint if isinstance(stub_or_endpoint, str) else stub_or_endpoint.endpoint
    return wisp("--endpoint", endpoint, *args, backend="openai", env=shim_env(**env))


async def test_second_call_carries_first_turn_and_settings():
    with OpenAIStub() as stub:
        async with openai(stub) as c:
            s1 = ok(await c.call_tool("respond", {"prompt": "My name is Alice.", "instructions": "Be brief.",
                                                  "temperature": 0, "max_output_tokens": 16}))
            assert s1["text"] == "reply 1: My name is Alice." and s1["created"]
            s2 = ok(await c.call_tool("respond", {"prompt": "What is my name?", "thread_id": s1["thread_id"]}))
            assert s2["text"] == "reply 2: What is my name?" and s2["turns"] == 2
            assert s2["usage"]["output_tokens"] == 5 and s2["usage"]["input_tokens"] > 0  # from the server's usage
        first, second = stub.chats()
        system = {"role": "system", "content": "Be brief."}
        assert first["messages"] == [system, {"role": "user", "content": "My name is Alice."}]
        assert second["messages"] == [
            system,
            {"role": "user", "content": "My name is Alice."},
            {"role": "assistant", "content": "reply 1: My name is Alice."},
            {"role": "user", "content": "What is my name?"},
        ]
        assert first["temperature"] == 0 and first["max_tokens"] == 16
        assert first["stream"] is True and first["model"] == "stub-model"  # learnt from /v1/models
        assert "temperature" not in second and "max_tokens" not in second  # per call, not sticky


async def test_context_size_from_server_else_flag():
    with OpenAIStub(StubConfig(n_ctx=2048)) as stub:
        async with openai(stub, "--context-size", "999") as c:
            st = ok(await c.call_tool("list_threads", {}))
            assert (st["backend"], st["available"], st["context_size"]) == ("openai", True, 2048)
    with OpenAIStub(StubConfig(n_ctx=None)) as stub:
        async with openai(stub, "--context-size", "999") as c:
            assert ok(await c.call_tool("list_threads", {}))["context_size"] == 999
        async with openai(stub) as c:
            assert ok(await c.call_tool("list_threads", {}))["context_size"] == 4096


async def test_streaming_gives_progress():
    seen: list[tuple[float, str | None]] = []
    # The stub streams nothing until the client has heard what the call waits for: newer text
    # would otherwise rightly replace it before it was sent (the latest progress wins).
    stage_heard = threading.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, message))
        if message and message.startswith("reading the prompt"):
            stage_heard.set()

    def hold_until_heard(_index: int) -> None:
        stage_heard.wait(30)  # bounded: never heard, the assertion below says so

    with OpenAIStub(StubConfig(chunk_delay_s=0.05, words=12, on_chat=hold_until_heard)) as stub:
        async with openai(stub) as c:
            r = ok(await c.call_tool("respond", {"prompt": "stream please"}, progress_callback=on_progress))
    assert r["text"].startswith("reply 1: stream please filler")
    assert len(seen) >= 2, seen
    assert [p for p, _ in seen] == sorted({p for p, _ in seen})  # strictly increasing
    # First what it waits for, then the tokens written so far and the partial text.
    assert seen[0][1] == "reading the prompt: about 3 tokens", seen
    writing = [m for _, m in seen[1:]]
    counts = [int(m.split()[1]) for m in writing]
    assert counts == sorted(set(counts)), seen
    assert all(m and m.startswith(f"writing: {n} tokens, ") and r["text"].startswith(m.split(" characters: ", 1)[1])
               for n, m in zip(counts, writing)), seen


@pytest.mark.parametrize("style", ["llama.cpp", "llama-cpp-python", "openai", "vllm"])
async def test_overflow_in_each_dialect_condenses(style):
    # The stub overflows past 120 message characters: the third call must drop the first turn.
    with OpenAIStub(StubConfig(overflow_chars=120, overflow_style=style)) as stub:
        async with openai(stub) as c:
            tid = None
            results = []
            for word in ("alpha", "bravo", "charlie"):
                args = {"prompt": f"{word} " * 4}
                if tid:
                    args["thread_id"] = tid
                s = ok(await c.call_tool("respond", args))
                tid = s["thread_id"]
                results.append(s)
            assert [s["condensed"] for s in results[:2]] == [False, False]
            assert results[2]["condensed"] is True and results[2]["dropped"] >= 1
            assert results[2]["text"].startswith("reply ")
            # What finally went out fits: the server shifts no cache (no slots), so condensing keeps
            # the first turn (a cached prefix) and drops the one after it.
            last = stub.chats()[-1]["messages"]
            assert all("bravo" not in m["content"] for m in last) and last[0]["content"].startswith("alpha")
            # A prompt that can never fit is a clear tool error, not a loop.
            msg = error_text(await c.call_tool("respond", {"prompt": "x" * 400, "thread_id": tid}))
            assert msg.startswith("context_overflow:"), msg


async def test_endpoint_down_is_a_clear_error_naming_it():
    port = closed_port()
    endpoint = f"http://127.0.0.1:{port}/v1"
    async with openai(endpoint) as c:
        t0 = time.monotonic()
        msg = error_text(await c.call_tool("respond", {"prompt": "hello"}))
        assert time.monotonic() - t0 < 10
        assert msg.startswith("model_unavailable:") and f"127.0.0.1:{port}" in msg, msg
        st = ok(await c.call_tool("list_threads", {}))
        assert st["available"] is False and f"127.0.0.1:{port}" in st["reason"]


async def test_server_error_names_the_endpoint():
    with OpenAIStub(StubConfig(status=500)) as stub:
        async with openai(stub) as c:
            msg = error_text(await c.call_tool("respond", {"prompt": "hello"}))
    assert msg.startswith("generation_failed:") and stub.endpoint in msg and "HTTP 500" in msg, msg


async def test_api_key_is_sent_and_never_logged():
    secret = "sk-wisp-test-0123456789"
    with OpenAIStub() as stub:
        async with openai(stub, "--log-level", "debug", WISP_API_KEY=secret) as c:
            ok(await c.call_tool("respond", {"prompt": "hello"}))
            c.errlog.seek(0)
            log = c.errlog.read()
        chat = [r for r in stub.requests if r.path == "/v1/chat/completions"][0]
        assert chat.headers["authorization"] == f"Bearer {secret}"
        assert secret not in log


async def test_cancel_mid_generation_closes_the_request_and_frees_the_thread():
    cfg = StubConfig()
    with OpenAIStub(cfg) as stub:
        async with openai(stub) as c:
            tid = ok(await c.call_tool("respond", {"prompt": "first"}))["thread_id"]
            cfg.words, cfg.chunk_delay_s = 200, 0.1  # about 20 s if not cancelled
            streaming = threading.Event()
            cfg.on_chat = lambda n: streaming.set()
            long_one = asyncio.create_task(c.call_tool("respond", {"prompt": "long one", "thread_id": tid}))
            await wait_for(streaming.is_set, 30, "the stub was never asked")  # the stub streams it now
            long_one.cancel()
            with pytest.raises(asyncio.CancelledError):
                await long_one
            cfg.on_chat = None
            # The HTTP request is closed promptly: the stub's next write fails.
            await wait_for(lambda: stub.disconnects >= 1, 5, "the request to the stub was not closed")
            assert stub.disconnects == 1
            # The thread is free at once, and the cancelled turn did not join its history.
            cfg.words, cfg.chunk_delay_s = 0, 0.0
            t0 = time.monotonic()
            s = ok(await c.call_tool("respond", {"prompt": "after", "thread_id": tid}))
            assert time.monotonic() - t0 < 5
            assert s["text"] == "reply 2: after" and s["turns"] == 2
            assert [m["content"] for m in stub.chats()[-1]["messages"]] == ["first", "reply 1: first", "after"]


async def test_bare_host_endpoint_gets_v1():
    with OpenAIStub() as stub:
        async with openai(f"http://127.0.0.1:{stub.port}") as c:
            assert ok(await c.call_tool("respond", {"prompt": "hi"}))["text"] == "reply 1: hi"


async def test_function_calling_round_trip(tmp_path):
    (tmp_path / "hello.txt").write_text("hi there\n")
    cfg = StubConfig(tool_call={"name": "read_file", "arguments": {"path": "hello.txt"}})
    with OpenAIStub(cfg) as stub:
        async with openai(stub, "--root", str(tmp_path)) as c:
            s = ok(await c.call_tool("respond", {"prompt": "read hello.txt", "tools": ["read_file"]}))
            assert s["text"].startswith("reply 1: tool said") and "hi there" in s["text"]
            cfg.tool_call = None
            ok(await c.call_tool("respond", {"prompt": "thanks", "thread_id": s["thread_id"]}))
        first, second, third = stub.chats()
        assert [t["function"]["name"] for t in first["tools"]] == ["read_file"]
        assert first["tools"][0]["function"]["parameters"]["type"] == "object"
        call_msg, tool_msg = second["messages"][-2:]
        assert call_msg["role"] == "assistant" and call_msg["tool_calls"][0]["function"]["name"] == "read_file"
        assert tool_msg["role"] == "tool" and tool_msg["tool_call_id"] == call_msg["tool_calls"][0]["id"]
        assert "hi there" in tool_msg["content"]
        # The next call carries the whole turn: prompt, tool call, tool result, reply.
        assert [m["role"] for m in third["messages"]] == ["user", "assistant", "tool", "assistant", "user"]


async def test_server_that_ignores_stream_still_answers():
    with OpenAIStub(StubConfig(ignore_stream=True)) as stub:
        async with openai(stub) as c:
            s = ok(await c.call_tool("respond", {"prompt": "hello there"}))
    assert s["text"] == "reply 1: hello there" and s["usage"]["output_tokens"] == 3
