"""Each live thread keeps its own llama.cpp slot (Backends/OpenAI/OpenAISlots.swift), seen
from outside: the slot in every chat request the core sends to a fake llama-server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import install_fake, ok, shim_env, wisp
from harness.fake_llama import flag_value, shim_env_with
from wisp_shim.localmodel import local_model as lm


def openai_on(stub, *args: str, **env: str):
    return wisp("--endpoint", stub.endpoint, *args, backend="openai", env=shim_env(**env))


async def _turn(c, thread: str, prompt: str = "hello") -> dict:
    return ok(await c.call_tool("respond", {"prompt": prompt, "thread_id": thread}))


def _slots_by_thread(stub, threads: list[str]) -> list[tuple[str, object]]:
    """(thread, id_slot) per chat request; the thread is read from the first user message, which
    _turn's callers make start with the thread id."""
    out = []
    for body in stub.chats():
        first = next(m["content"] for m in body["messages"] if m["role"] == "user")
        out.append((next(t for t in threads if first.startswith(t)), body.get("id_slot")))
    return out


async def test_each_live_thread_keeps_its_own_slot_on_llama_server():
    from openai_stub import OpenAIStub, StubConfig
    threads = ["a", "b", "c"]
    with OpenAIStub(StubConfig(slots=4)) as stub:
        async with openai_on(stub) as c:
            for _ in range(3):
                for t in threads:  # interleaved, as concurrent agents use their threads
                    await _turn(c, t, f"{t} says hello")
        assert all(b.get("cache_prompt") is True for b in stub.chats())
        seen = _slots_by_thread(stub, threads)
        by_thread = {t: {s for u, s in seen if u == t} for t in threads}
        assert all(len(s) == 1 and None not in s for s in by_thread.values()), seen
        assert len(set().union(*by_thread.values())) == 3, by_thread  # one slot each
        assert set().union(*by_thread.values()) <= set(range(4))


async def test_a_condensed_thread_keeps_its_slot():
    from openai_stub import OpenAIStub, StubConfig
    # No /tokenize: the server's own overflow error starts the condensing, and the retry (a rebuilt
    # session with fewer turns) must go to the same slot as the turns before it.
    with OpenAIStub(StubConfig(slots=2, tokenize=False, overflow_chars=300)) as stub:
        async with openai_on(stub) as c:
            await _turn(c, "other", "other says hello")
            condensed = False
            for i in range(8):
                s = await _turn(c, "t", f"t turn {i} " + "padding " * 8)
                condensed = condensed or s["condensed"]
        assert condensed
        slots = {b.get("id_slot") for b in stub.chats() if b["messages"][0]["content"].startswith("t ")}
        other = {b.get("id_slot") for b in stub.chats() if b["messages"][0]["content"].startswith("other")}
        assert len(slots) == 1 and slots != other and None not in slots, (slots, other)


async def test_the_least_recently_used_thread_gives_up_its_slot_first():
    from openai_stub import OpenAIStub, StubConfig
    threads = ["a", "b", "c", "d"]
    with OpenAIStub(StubConfig(slots=2)) as stub:
        async with openai_on(stub) as c:
            for t in ("a", "b", "a", "c", "b", "a"):
                await _turn(c, t, f"{t} says hello")
        seen = _slots_by_thread(stub, threads)
    a, b = seen[0][1], seen[1][1]
    assert a != b and None not in (a, b), seen
    # a was used after b, so c takes b's slot; then b (slot-less) takes a's, the least recent
    # of a (turn 3) and c (turn 4); then a takes c's.
    assert [s for _, s in seen] == [a, b, a, b, a, b], seen


async def test_a_closed_thread_frees_its_slot_before_any_live_one_gives_up_its_own():
    from openai_stub import OpenAIStub, StubConfig
    threads = ["a", "b", "c"]
    with OpenAIStub(StubConfig(slots=2)) as stub:
        async with openai_on(stub) as c:
            for t in ("a", "b", "a"):
                await _turn(c, t, f"{t} says hello")
            ok(await c.call_tool("close_thread", {"thread_id": "a"}))
            await _turn(c, "c", "c says hello")  # b is the least recently used, but a's slot is free
            await _turn(c, "b", "b says hello")
        seen = _slots_by_thread(stub, threads)
    a, b = seen[0][1], seen[1][1]
    assert a != b and None not in (a, b), seen
    assert [s for _, s in seen] == [a, b, a, a, b], seen


async def test_a_thread_resumed_from_the_store_finds_its_old_slot(tmp_path):
    from openai_stub import OpenAIStub, StubConfig
    threads = ["a", "b"]
    with OpenAIStub(StubConfig(slots=3)) as stub:
        # One live thread at a time: each new one evicts the other from memory (not from the store).
        async with openai_on(stub, "--max-threads", "1", "--state-dir", str(tmp_path / "state")) as c:
            await _turn(c, "a", "a says hello")
            await _turn(c, "b", "b says hello")
            s = await _turn(c, "a", "a again")
            assert s["turns"] == 2  # resumed, not started afresh
        seen = _slots_by_thread(stub, threads)
    # Back on its own slot, though the never-used one was the least recently used.
    assert seen[0][0] == seen[2][0] == "a" and seen[2][1] == seen[0][1] != seen[1][1], seen


@pytest.mark.parametrize("props", [None, 4096], ids=["no /props (vLLM, Ollama, OpenAI)", "/props without total_slots"])
async def test_servers_other_than_llama_cpp_get_no_slot_fields(props):
    from openai_stub import OpenAIStub, StubConfig
    with OpenAIStub(StubConfig(n_ctx=props)) as stub:
        async with openai_on(stub) as c:
            for t in ("a", "b", "a"):
                await _turn(c, t)
        assert len(stub.chats()) == 3
        for body in stub.chats():
            assert not {"id_slot", "cache_prompt", "n_cache_reuse"} & set(body), body


async def test_slots_flag_names_slots_without_asking_and_zero_names_none():
    from openai_stub import OpenAIStub, StubConfig
    with OpenAIStub(StubConfig(slots=None)) as stub:
        # The core's --slots (the shim passes its own server's), here through its environment.
        async with openai_on(stub, WISP_SLOTS="2") as c:  # a llama-server that does not say
            await _turn(c, "a")
        async with openai_on(stub, WISP_SLOTS="0") as c:
            await _turn(c, "b")
    with OpenAIStub(StubConfig(slots=8)) as said:
        async with openai_on(said, WISP_SLOTS="0") as c:
            await _turn(c, "c")
    (pinned, off), (off_too,) = stub.chats(), said.chats()
    assert pinned.get("id_slot") in (0, 1) and pinned.get("cache_prompt") is True
    assert "id_slot" not in off and "cache_prompt" not in off
    assert "id_slot" not in off_too and "cache_prompt" not in off_too


def test_the_core_is_told_the_slots(model_file):
    m = lm.LocalModel(binary=Path("/x/llama-server"), model=model_file, context_size=4096, slots=6, port=1)
    assert flag_value(m.core_args(), "--slots") == "6"


async def test_the_shims_own_local_model_gets_slot_pinned_requests(tmp_path, model_file):
    binary = install_fake(tmp_path / "bin")
    record = tmp_path / "requests.jsonl"
    env = {**shim_env_with(binary, model_file, "decode"), "FAKE_LLAMA_RECORD": str(record)}
    async with wisp(backend=None, env=env) as c:
        s = ok(await c.call_tool("respond", {"prompt": "hello", "max_output_tokens": 4}))
        ok(await c.call_tool("respond", {"prompt": "again", "thread_id": s["thread_id"], "max_output_tokens": 4}))
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    argv = next(x["argv"] for x in lines if "argv" in x)
    chats = [x["body"] for x in lines if x.get("path", "").endswith("/chat/completions")]
    assert len(chats) == 2
    slots = int(flag_value(argv, "-np"))
    assert {b.get("id_slot") for b in chats} == {chats[0]["id_slot"]} and 0 <= chats[0]["id_slot"] < slots
    assert all(b.get("cache_prompt") is True for b in chats)
    # After condensing, the turns that remain are shifted into place rather than evaluated again.
    assert all(b.get("n_cache_reuse", 0) > 0 for b in chats)
