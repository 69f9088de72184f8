"""The model servers people run, as wisp meets them: against a stub that plays each one as its
source and documentation describe it (openai_stub.py, `dialect`): Ollama's silent fitting of a
conversation to its window, `/api/ps`, `/api/show` and `keep_alive`; LM Studio's model list;
vLLM's `max_model_len` and overflow error. Also condensing in steps on a server that cannot
shift its cache, what a call costs as the server says it, and progress while a call waits."""

from __future__ import annotations

import asyncio

import pytest

from harness import error_text, held, ok, release, shim_env, until_pending, wait_for, wisp
from openai_stub import OpenAIStub, StubConfig


def served(stub: OpenAIStub, *args: str, **env: str):
    return wisp("--endpoint", stub.endpoint, *args, backend="openai", env=shim_env(**env))


def note(i: int, words: int = 30) -> str:
    """A turn's prompt of about `words` * 6 characters, its number first."""
    return f"turn{i} " + " ".join(f"w{i}x{k}" for k in range(words))


async def test_ollama_cut_prompt_is_caught_condensed_and_the_window_learnt():
    # wisp is told 4096 (nothing reports OLLAMA_CONTEXT_LENGTH before the model loads); the
    # server runs 300 tokens and fits longer conversations to them without a word.
    cfg = StubConfig(dialect="ollama", window=300, loaded=False, fit_silently=True)
    with OpenAIStub(cfg) as stub:
        async with served(stub, "--context-size", "4096") as c:
            tid = None
            results = []
            for i in range(8):  # ~200 characters a turn and its reply: 50 tokens
                args = {"prompt": note(i), **({"thread_id": tid} if tid else {})}
                s = ok(await c.call_tool("respond", args))
                tid = s["thread_id"]
                results.append(s)
                cfg.loaded = True  # the first request loaded it
            st = ok(await c.call_tool("list_threads", {}))
    # Three turns fit in 300 tokens, the fourth does not.
    assert not any(s["condensed"] for s in results[:3]) and results[3]["condensed"]
    # Every answer came from a request the server read whole: the stub's reply counts the user
    # messages it kept, which are all the turns the thread sent.
    for s in results:
        assert s["text"].startswith(f"reply {s['turns']}: turn"), (s["turns"], s["text"][:20])
    # Some request was cut, and its answer was not the one returned.
    assert len(stub.chats()) > len(results)
    # The window came from /api/ps once the model ran, and list_threads says why it is smaller.
    assert st["context_size"] == 300
    assert "read" in st["context_note"] and "300" in st["context_note"], st
    # Never a field Ollama's /v1 ignores, nor one that would reload the model.
    for chat in stub.chats():
        assert not {"num_ctx", "options", "keep_alive", "id_slot", "cache_prompt"} & chat.keys()


async def test_ollama_window_is_the_loaded_models_and_keep_alive_is_set_natively():
    cfg = StubConfig(dialect="ollama", window=2048, shown_num_ctx=8192)
    with OpenAIStub(cfg) as stub:
        async with served(stub, WISP_KEEP_ALIVE="45m") as c:
            assert ok(await c.call_tool("list_threads", {}))["context_size"] == 2048  # /api/ps, not /api/show
            tid = ok(await c.call_tool("respond", {"prompt": "one"}))["thread_id"]
            ok(await c.call_tool("respond", {"prompt": "two", "thread_id": tid}))
        loads = [r for r in stub.requests if r.path == "/api/generate"]
        # Once before the first chat, not again while the server is busy with wisp's turns.
        assert len(loads) == 1 and loads[0].body == {"model": "stub-model", "keep_alive": "45m"}
        order = [r.path for r in stub.requests if r.path in ("/api/generate", "/v1/chat/completions")]
        assert order == ["/api/generate", "/v1/chat/completions", "/v1/chat/completions"]
    cfg = StubConfig(dialect="ollama", window=None, shown_num_ctx=8192, loaded=False)
    with OpenAIStub(cfg) as stub:
        async with served(stub) as c:
            # Not loaded: what the Modelfile says, asked again once the model runs.
            assert ok(await c.call_tool("list_threads", {}))["context_size"] == 8192
            cfg.window, cfg.loaded = 1024, True
            assert ok(await c.call_tool("list_threads", {}))["context_size"] == 1024
        assert [r.body["keep_alive"] for r in stub.requests if r.path == "/api/generate"] == []  # no call, no load


async def test_ollama_prompt_that_cannot_fit_alone_is_context_overflow_not_an_answer():
    cfg = StubConfig(dialect="ollama", window=100, fit_silently=True)
    with OpenAIStub(cfg) as stub:
        async with served(stub) as c:
            msg = error_text(await c.call_tool("respond", {"prompt": "x" * 2000}))
            assert msg.startswith("context_overflow:") and "100-token" in msg, msg
            assert ok(await c.call_tool("list_threads", {}))["threads"] == []


async def test_lm_studio_window_is_the_loaded_context_and_its_overflow_condenses():
    cfg = StubConfig(dialect="lmstudio", window=3000)
    with OpenAIStub(cfg) as stub:
        async with served(stub) as c:
            st = ok(await c.call_tool("list_threads", {}))
            assert st["context_size"] == 3000 and st["available"]
            cfg.overflow_chars, cfg.overflow_style = 150, "lmstudio"
            tid = None
            for word in ("alpha", "bravo", "charlie", "delta"):
                s = ok(await c.call_tool("respond", {"prompt": f"{word} " * 4, **({"thread_id": tid} if tid else {})}))
                tid = s["thread_id"]
            assert s["condensed"] and s["text"].startswith("reply ")
        # Its unknown paths answer 200 with an error: none was taken for llama.cpp's.
        assert all("id_slot" not in chat and "n_cache_reuse" not in chat for chat in stub.chats())


async def test_vllm_window_from_its_model_list():
    with OpenAIStub(StubConfig(dialect="vllm", window=32768)) as stub:
        async with served(stub, "--context-size", "999") as c:
            assert ok(await c.call_tool("list_threads", {}))["context_size"] == 32768


async def test_condensing_in_steps_keeps_the_first_turn_and_extends_one_prefix():
    # vLLM's window of 400 tokens: ~50 tokens a turn; condensing goes down to half the window.
    cfg = StubConfig(dialect="vllm", window=400, overflow_chars=1600, overflow_style="vllm")
    with OpenAIStub(cfg) as stub:
        async with served(stub, WISP_CONDENSE_TO="0.5") as c:
            tid = ok(await c.call_tool("respond", {"prompt": note(0), "instructions": "Be brief."}))["thread_id"]
            results = [ok(await c.call_tool("respond", {"prompt": note(i), "thread_id": tid})) for i in range(1, 20)]
    steps = [i for i, s in enumerate(results) if s["condensed"]]
    assert len(steps) >= 2, [s["turns"] for s in results]
    # Each step drops several turns, so that turns follow it without condensing.
    assert all(results[i]["dropped"] >= 2 for i in steps)
    assert all(b - a >= 2 for a, b in zip(steps, steps[1:]))
    for chat in stub.chats():
        messages = chat["messages"]
        # The instructions and the first turn stay in every request.
        assert messages[0]["content"] == "Be brief." and messages[1]["content"] == note(0)
    # Between steps, each request starts with the whole of the one before (one cached prefix).
    chats = stub.chats()
    extended = sum(1 for a, b in zip(chats, chats[1:]) if b["messages"][: len(a["messages"])] == a["messages"])
    assert extended == len(chats) - 1 - len(steps)


async def test_condensing_just_enough_where_the_server_shifts_its_cache():
    # llama.cpp with slots: n_cache_reuse keeps the rest cached, so only what must go goes.
    cfg = StubConfig(slots=2, n_ctx=4096, overflow_chars=900)
    with OpenAIStub(cfg) as stub:
        async with served(stub) as c:
            tid = ok(await c.call_tool("respond", {"prompt": note(0)}))["thread_id"]
            results = [ok(await c.call_tool("respond", {"prompt": note(i), "thread_id": tid})) for i in range(1, 8)]
    condensed = [s for s in results if s["condensed"]]
    assert condensed and all(s["dropped"] == 1 for s in condensed)
    assert stub.chats()[-1]["messages"][0]["content"] != note(0)


async def test_usage_has_cached_tokens_timing_and_totals():
    with OpenAIStub(StubConfig(dialect="vllm", window=8192, cache=True, chunk_delay_s=0.01, words=5)) as stub:
        async with served(stub) as c:
            first = ok(await c.call_tool("respond", {"prompt": "hello there"}))
            second = ok(await c.call_tool("respond", {"prompt": "again", "thread_id": first["thread_id"]}))
            st = ok(await c.call_tool("list_threads", {}))
    # vLLM leaves cached_tokens out when none were: absent, never 0 made up.
    assert "cached_tokens" not in first["usage"]
    assert second["usage"]["cached_tokens"] > 0
    for s in (first, second):
        assert s["usage"]["first_token_ms"] >= 0 and s["usage"]["output_tokens_per_s"] > 0
    thread = st["threads"][0]["usage"]
    assert thread["input_tokens"] == first["usage"]["input_tokens"] + second["usage"]["input_tokens"]
    assert "first_token_ms" not in thread  # a call's own, not summed
    assert st["usage"]["output_tokens"] == first["usage"]["output_tokens"] + second["usage"]["output_tokens"]


async def test_no_cached_count_when_the_server_reports_none():
    with OpenAIStub(StubConfig(usage=False)) as stub:
        async with served(stub) as c:
            s = ok(await c.call_tool("respond", {"prompt": "hello"}))
    assert "cached_tokens" not in s["usage"] and "input_tokens" not in s["usage"]


async def test_progress_says_what_a_slow_prompt_waits_for_and_keeps_coming():
    seen: list[tuple[float, str]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, message or ""))

    # A prompt read for 1.5 s, with a notification at least every 0.2 s asked for.
    with OpenAIStub(StubConfig(first_byte_delay_s=1.5, words=3)) as stub:
        async with served(stub, WISP_PROGRESS_EVERY_S="0.2") as c:
            ok(await c.call_tool("respond", {"prompt": "slow one"}, progress_callback=on_progress))
    messages = [m for _, m in seen]
    assert [p for p, _ in seen] == sorted({p for p, _ in seen}), seen  # strictly increasing
    reading = [m for m in messages if m.startswith("reading the prompt: about")]
    # Said once, then repeated with the time waited while nothing else comes.
    assert len(reading) >= 3 and any(m.endswith(" s)") for m in reading), messages
    assert messages[-1].startswith("writing: ") and "slow one" in messages[-1], messages
    assert messages.index(reading[0]) < messages.index(messages[-1])


async def test_progress_names_the_calls_ahead_in_the_threads_queue():
    seen: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(message or "")

    async with wisp(env=shim_env(WISP_PROGRESS_EVERY_S="0.2")) as c:
        tid = ok(await c.call_tool("respond", {"prompt": "first"}))["thread_id"]
        running = [asyncio.create_task(c.call_tool("respond", {"prompt": f"!hold ahead{k} hold {k}", "thread_id": tid}))
                   for k in range(2)]
        await until_pending(c, tid, calls=2)
        last = asyncio.create_task(c.call_tool("respond", {"prompt": "third", "thread_id": tid}, progress_callback=on_progress))
        for k, behind in enumerate(("queued behind 2 calls on this thread", "queued behind 1 call on this thread")):
            await wait_for(lambda behind=behind: any(m.startswith(behind) for m in seen), 30)
            await held(c, f"ahead{k}")
            assert await release(c, f"ahead{k}") == 1
        ok(await last)
        for t in running:
            ok(await t)
    queued = [m for m in seen if m.startswith("queued behind")]
    assert queued and queued[0].startswith("queued behind 2 calls on this thread"), seen
    assert any(m.startswith("queued behind 1 call on this thread") for m in queued), seen


@pytest.mark.parametrize("style", ["vllm", "lmstudio"])
async def test_overflow_text_of_each_server_is_recognised(style):
    with OpenAIStub(StubConfig(overflow_chars=10, overflow_style=style)) as stub:
        async with served(stub) as c:
            msg = error_text(await c.call_tool("respond", {"prompt": "y" * 200}))
    assert msg.startswith("context_overflow:"), msg
