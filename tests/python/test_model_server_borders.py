"""The model server's borders, against scripted servers: what a server says it read is judged
without crying wolf (a chat template's fixed tokens are not a cut) and a real cut is still
caught (openai_stub.py's Ollama fitting); an answer is one only when it ends as one, and a
refusal fails the call at once (unruly_server.py)."""

from __future__ import annotations

import pytest

from harness import error_text, errlog_text, ok, shim_env, wisp
from openai_stub import OpenAIStub, StubConfig
from unruly_server import Unruly
from wisp_shim.localmodel import llama_server, xllamacpp_server
from wisp_shim.localmodel.llama_server import LocalModel

SHORT = ["Hi.", "What is two plus two?", "Name a colour.", "Say yes.", "Name a fruit.",
         "What day follows Monday?", "Say hello.", "Name an animal.", "Count to three.", "Bye."]


def served(stub: OpenAIStub, *args: str, **env: str):
    return wisp("--endpoint", stub.endpoint, *args, backend="openai", env=shim_env(**env))


async def converse(c, prompts: list[str]) -> list[dict]:
    tid, results = None, []
    for prompt in prompts:
        s = ok(await c.call_tool("respond", {"prompt": prompt, **({"thread_id": tid} if tid else {})}))
        tid = s["thread_id"]
        results.append(s)
    return results


async def test_a_templates_fixed_tokens_in_short_turns_are_not_taken_for_a_cut():
    # 40 tokens of template in every count: most of what a short first request reads.
    with OpenAIStub(StubConfig(template_tokens=40, tokenize=False)) as stub:
        async with served(stub) as c:
            results = await converse(c, SHORT)
            listing = ok(await c.call_tool("list_threads", {}))
    assert [s["turns"] for s in results] == list(range(1, 11))
    assert not any(s["condensed"] for s in results)
    assert listing["context_size"] == 4096 and not listing.get("context_note"), listing
    assert len(stub.chats()) == 10  # no request was sent again after a "cut"


def note(i: int, words: int = 30) -> str:
    return f"turn{i} " + " ".join(f"w{i}x{k}" for k in range(words))


async def test_a_silent_cut_behind_a_templates_fixed_tokens_is_still_caught():
    cfg = StubConfig(dialect="ollama", window=330, loaded=False, fit_silently=True, template_tokens=30)
    with OpenAIStub(cfg) as stub:
        async with served(stub, "--context-size", "4096") as c:
            results = []
            tid = None
            for i in range(8):
                args = {"prompt": note(i), **({"thread_id": tid} if tid else {})}
                s = ok(await c.call_tool("respond", args))
                tid = s["thread_id"]
                results.append(s)
                cfg.loaded = True
            listing = ok(await c.call_tool("list_threads", {}))
    # Three turns fit in 300 tokens beside the template's 30, the fourth does not.
    assert not any(s["condensed"] for s in results[:3]) and results[3]["condensed"], [s["turns"] for s in results]
    # No answer returned came from a cut request: each counts every user message the thread sent.
    for s in results:
        assert s["text"].startswith(f"reply {s['turns']}: turn"), (s["turns"], s["text"][:20])
    assert len(stub.chats()) > len(results)
    assert listing["context_size"] == 330 and "read" in listing["context_note"], listing


# What each way of ending short must be called, in the call's error.
UNFINISHED = {
    "no_done": "no [DONE]",
    "cut_chunked": "no finish_reason and no [DONE]",
    "cut_close": "no finish_reason and no [DONE]",
    "short_length": "bytes into its Content-Length",
}


@pytest.mark.parametrize("mode", sorted(UNFINISHED))
async def test_an_answer_that_stops_short_of_its_end_is_an_error_and_not_kept(mode):
    with Unruly() as server:
        async with wisp("--endpoint", server.endpoint, backend="openai", env=shim_env()) as c:
            first = ok(await c.call_tool("respond", {"prompt": "one"}))
            assert first["text"] == "Hello there, friend"
            server.chat = mode
            message = error_text(await c.call_tool("respond", {"prompt": "two", "thread_id": first["thread_id"]}))
            server.chat = "whole"
            again = ok(await c.call_tool("respond", {"prompt": "three", "thread_id": first["thread_id"]}))
    assert UNFINISHED[mode] in message and server.endpoint in message, message
    assert again["turns"] == 2  # the cut turn was not kept


@pytest.mark.parametrize("status", [429, 503])
async def test_a_server_refusing_every_chat_fails_the_call_at_once_naming_the_status(status):
    with Unruly(chat=status) as server:
        async with wisp("--endpoint", server.endpoint, backend="openai", env=shim_env()) as c:
            message = error_text(await c.call_tool("respond", {"prompt": "one"}))
    assert f"HTTP {status}" in message and server.endpoint in message, message
    assert server.paths().count("/v1/chat/completions") == 1  # asked once, not again and again


def test_the_local_server_caps_an_answer_at_a_share_of_a_threads_context(tmp_path):
    argv = LocalModel(binary=tmp_path / "x", model=tmp_path / "m", context_size=4096, slots=3, port=1).argv()
    assert argv[argv.index("-n") + 1] == str(4096 // llama_server.OUTPUT_SHARE)  # per thread, whatever the slots
    # The wheel's server takes the flag as llama-server does.
    assert xllamacpp_server.parse(["-m", "m", "--port", "1", "-n", "7"]).n_predict == 7


def stderr_of(c) -> str:
    return errlog_text(c.errlog)


async def test_a_probe_trickled_a_byte_at_a_time_fails_on_its_own_and_holds_no_later_call():
    # /props a byte every 0.2 s: never idle for the probe's 5 s, and about half a minute long.
    with Unruly(trickle={"/props"}) as server:
        async with wisp("--endpoint", server.endpoint, backend="openai", env=shim_env()) as c:
            first = ok(await c.call_tool("respond", {"prompt": "one"}))
            second = ok(await c.call_tool("respond", {"prompt": "two"}))  # a thread of its own
            listing = ok(await c.call_tool("list_threads", {}))
            log = stderr_of(c)
    assert first["text"] == second["text"] == "Hello there, friend"
    # The probe was given up at its deadline and not sent again for the next call.
    assert server.paths().count("/props") == 1, server.paths()
    assert "did not answer GET /props whole within 10 s" in log, log[-2000:]
    assert listing["context_size"] == 4096  # not said: the default


async def test_a_chat_trickled_a_byte_at_a_time_ends_at_the_calls_own_limit():
    with Unruly(trickle={"/v1/chat/completions"}, trickle_s=0.5) as server:
        async with wisp("--endpoint", server.endpoint, backend="openai", env=shim_env(WISP_TIMEOUT="3")) as c:
            message = error_text(await c.call_tool("respond", {"prompt": "one"}))
            server.trickle = set()
            again = ok(await c.call_tool("respond", {"prompt": "two"}))
    assert "timeout" in message and "3" in message, message
    assert again["text"] == "Hello there, friend"  # nothing of the stalled call held the next
