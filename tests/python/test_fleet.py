"""Several model servers (`--endpoint` repeated) through a real MCP client, shim and core,
against scripted OpenAI-compatible servers (openai_stub.py, unruly_server.py): every endpoint
is checked at start, a thread stays on one, the load bound holds, a server that goes away,
never answers or cuts a stream mid-conversation has its threads answered elsewhere, the thread
id reaches a router in a header, no credential shows, and a thread read back from the store
(after a restart, or evicted and back) is pinned again by the same rule."""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import time

import anyio
import pytest
from harness import core_path, error_text, ok, shim_env, wisp
from openai_stub import OpenAIStub, StubConfig, closed_port
from unruly_server import Silent, Unruly

# docs/backends.md: an endpoint's check has 3 s in all; the waits below leave room for a loaded machine.
CHECK_BOUND_S = 3
ROOM_S = 20


def fleet(stubs, *args: str, **env: str):
    flags = [x for s in stubs for x in ("--endpoint", s if isinstance(s, str) else s.endpoint)]
    return wisp(*flags, *args, backend="openai", env=shim_env(**env))


def host_port(stub) -> str:
    return f"127.0.0.1:{stub.port}"


def chats_by_thread(stub: OpenAIStub) -> dict[str, int]:
    seen: dict[str, int] = {}
    for r in stub.requests:
        if r.path == "/v1/chat/completions":
            key = r.headers.get("x-session-id", "")
            seen[key] = seen.get(key, 0) + 1
    return seen


async def test_threads_stay_on_one_endpoint_and_name_it():
    with OpenAIStub() as a, OpenAIStub() as b:
        async with fleet([a, b]) as c:
            threads = []
            for i in range(6):
                threads.append(ok(await c.call_tool("respond", {"prompt": f"thread {i}"})))
            for turn in range(3):
                for t in threads:
                    r = ok(await c.call_tool("respond", {"prompt": f"turn {turn}", "thread_id": t["thread_id"]}))
                    assert r["usage"]["endpoint"] == t["usage"]["endpoint"]
        by_a, by_b = chats_by_thread(a), chats_by_thread(b)
        ids = {t["thread_id"] for t in threads}
        assert set(by_a) | set(by_b) == ids and not set(by_a) & set(by_b)  # every request named its thread
        for t in threads:
            home = a if t["usage"]["endpoint"] == host_port(a) else b
            assert (by_a if home is a else by_b)[t["thread_id"]] == 4


async def test_load_bound_over_32_threads_and_3_endpoints():
    with OpenAIStub() as a, OpenAIStub() as b, OpenAIStub() as d:
        async with fleet([a, b, d], "--max-threads", "64") as c:
            for i in range(32):
                ok(await c.call_tool("respond", {"prompt": f"t{i}"}))
        loads = [len(chats_by_thread(s)) for s in (a, b, d)]
        assert sum(loads) == 32 and max(loads) <= math.ceil(1.25 * 32 / 3), loads


def rendezvous_first(key: str, endpoints: list[str]) -> str:
    """The endpoint the hash alone picks for `key` (the core's Rendezvous.weight, ported)."""
    mask = (1 << 64) - 1

    def weight(endpoint: str) -> int:
        h = 0xCBF29CE484222325
        for byte in [*key.encode(), 0xFF, *endpoint.encode()]:
            h = ((h ^ byte) * 0x100000001B3) & mask
        h ^= h >> 30
        h = (h * 0xBF58476D1CE4E5B9) & mask
        h ^= h >> 27
        h = (h * 0x94D049BB133111EB) & mask
        return h ^ (h >> 31)

    return max(endpoints, key=lambda e: (weight(e), -endpoints.index(e)))


async def test_a_fork_starts_on_its_sources_endpoint():
    """Its source's server holds the context the two share, so the fork's first turn reads only
    what is new there, even where the hash alone would send the fork to the other endpoint."""
    with OpenAIStub(StubConfig(cache=True)) as a, OpenAIStub(StubConfig(cache=True)) as b:
        names = [host_port(a), host_port(b)]
        async with fleet([a, b]) as c:
            source = ok(await c.call_tool("respond", {"prompt": "My name is Alice.", "thread_id": "source"}))
            home = source["usage"]["endpoint"]
            fork_id = next(f"fork-{i}" for i in range(64) if rendezvous_first(f"fork-{i}", names) != home)
            fork = ok(await c.call_tool("respond", {"prompt": "And mine?", "fork_from": "source",
                                                    "thread_id": fork_id}))
            assert fork["thread_id"] == fork_id and fork["usage"]["endpoint"] == home, fork
            assert rendezvous_first("source", names) == home  # the port agrees with the core's hash


async def test_failover_mid_conversation_rereads_the_thread_once():
    with contextlib.ExitStack() as stack:
        a = stack.enter_context(OpenAIStub(StubConfig(cache=True)))
        b = stack.enter_context(OpenAIStub(StubConfig(cache=True)))
        async with fleet([a, b]) as c:
            first = ok(await c.call_tool("respond", {"prompt": "My name is Alice."}))
            tid = first["thread_id"]
            ok(await c.call_tool("respond", {"prompt": "Second.", "thread_id": tid}))
            home, other = (a, b) if first["usage"]["endpoint"] == host_port(a) else (b, a)
            home.__exit__(None, None, None)  # refused from now on
            moved = ok(await c.call_tool("respond", {"prompt": "What is my name?", "thread_id": tid}))
            assert moved["usage"]["endpoint"] == host_port(other) and moved["turns"] == 3
            assert moved["usage"].get("cached_tokens", 0) == 0
            again = ok(await c.call_tool("respond", {"prompt": "And now?", "thread_id": tid}))
            assert again["usage"]["endpoint"] == host_port(other)
        assert chats_by_thread(home) == {tid: 2}  # the moved turn never ran there
        reread = other.chats()[0]["messages"]
        assert [m["content"] for m in reread if m["role"] == "user"] == ["My name is Alice.", "Second.",
                                                                        "What is my name?"]


async def test_every_endpoint_down_names_each_and_keeps_the_thread():
    with contextlib.ExitStack() as stack:
        a = stack.enter_context(OpenAIStub())
        b = stack.enter_context(OpenAIStub())
        async with fleet([a, b]) as c:
            t = ok(await c.call_tool("respond", {"prompt": "hello"}))
            a.__exit__(None, None, None)
            b.__exit__(None, None, None)
            r = await c.call_tool("respond", {"prompt": "anyone?", "thread_id": t["thread_id"]})
            text = error_text(r)
            assert "model_unavailable" in text and host_port(a) in text and host_port(b) in text, text
            listed = ok(await c.call_tool("list_threads", {}))
            assert [x["turns"] for x in listed["threads"] if x["thread_id"] == t["thread_id"]] == [1]


async def test_an_endpoint_back_takes_new_threads_and_moved_ones_stay():
    with OpenAIStub() as a, OpenAIStub() as b:
        a.config.status = 503  # every chat on a fails: the first thread hashed there moves to b
        async with fleet([a, b], "--max-threads", "64") as c:
            moved = None
            for _ in range(32):  # a thread hashed to a, among 32 on two endpoints, but for 2**-32
                t = ok(await c.call_tool("respond", {"prompt": "who takes me?"}))
                assert t["usage"]["endpoint"] == host_port(b)
                if chats_by_thread(a):
                    moved = t
                    break
            assert moved is not None and list(chats_by_thread(a)) == [moved["thread_id"]]
            a.config.status = 200
            # docs/backends.md promises a recheck after 5 s; 30 s leaves room on a loaded machine.
            back = None
            with anyio.fail_after(30):
                while back is None:
                    t = ok(await c.call_tool("respond", {"prompt": "a new thread"}))
                    back = t if t["usage"]["endpoint"] == host_port(a) else None
                    await anyio.sleep(0.25)
            r = ok(await c.call_tool("respond", {"prompt": "still here?", "thread_id": moved["thread_id"]}))
            assert r["usage"]["endpoint"] == host_port(b)  # no second re-read


async def test_session_header_renamed_or_off():
    with OpenAIStub() as a, OpenAIStub() as b:
        async with fleet([a, b], "--session-header", "X-Conversation") as c:
            t = ok(await c.call_tool("respond", {"prompt": "hi"}))
        async with fleet([a, b], "--session-header", "") as c:
            ok(await c.call_tool("respond", {"prompt": "hi"}))
        chats = [r for s in (a, b) for r in s.requests if r.path == "/v1/chat/completions"]
        assert [r.headers.get("x-conversation") for r in chats if "x-conversation" in r.headers] == [t["thread_id"]]
        assert sum("x-session-id" in r.headers or "x-conversation" in r.headers for r in chats) == 1


async def test_one_endpoint_carries_the_header_too():
    with OpenAIStub() as a:
        async with fleet([a]) as c:
            t = ok(await c.call_tool("respond", {"prompt": "hi"}))
        assert chats_by_thread(a) == {t["thread_id"]: 1}


async def test_no_credentials_anywhere():
    with contextlib.ExitStack() as stack:
        a = stack.enter_context(OpenAIStub())
        b = stack.enter_context(OpenAIStub())
        secret_url = f"http://wispuser:hunter2pass@127.0.0.1:{a.port}/v1"
        outputs = []
        async with fleet([secret_url, b], WISP_API_KEY="sk-topsecret", WISP_LOG_LEVEL="debug") as c:
            for i in range(4):
                outputs.append(await c.call_tool("respond", {"prompt": f"q{i}"}))
            outputs.append(await c.call_tool("list_threads", {}))
            b.__exit__(None, None, None)
            a.__exit__(None, None, None)
            outputs.append(await c.call_tool("respond", {"prompt": "down"}))
        said = json.dumps([o.model_dump(mode="json") for o in outputs])
        for secret in ("hunter2pass", "wispuser", "sk-topsecret"):
            assert secret not in said
        assert host_port(a) in said  # the endpoint is named, its credentials are not


def check(*endpoints: str, **env: str) -> subprocess.CompletedProcess:
    """`wisp --check` over `endpoints`, with `--model stub-model`."""
    flags = [x for e in endpoints for x in ("--endpoint", e)]
    return subprocess.run([sys.executable, "-m", "wisp_shim", "--check", "--backend", "openai", "--model", "stub-model",
                           *flags], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, WISP_CORE=core_path(), **env))


def test_check_lists_every_endpoint_and_no_credentials():
    with OpenAIStub() as a, OpenAIStub(StubConfig(model="other-model")) as b:
        down = closed_port()
        r = check(a.endpoint, b.endpoint, f"http://wispuser:hunter2pass@127.0.0.1:{down}/v1",
                  WISP_API_KEY="sk-topsecret", WISP_LOG_LEVEL="debug")
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stdout.splitlines() if x.startswith("endpoint:")]
    assert len(lines) == 3
    assert f"{host_port(a)}: up, model stub-model" in lines[0]
    assert f"127.0.0.1:{b.port}: down (it does not serve --model 'stub-model'" in lines[1]
    assert f"127.0.0.1:{down}: down (" in lines[2]
    for secret in ("hunter2pass", "wispuser", "sk-topsecret"):
        assert secret not in r.stdout + r.stderr


async def test_every_endpoint_is_checked_at_start_and_one_without_the_model_takes_no_thread():
    with OpenAIStub() as a, OpenAIStub(StubConfig(model="other-model")) as b:
        async with fleet([a, b], "--model", "stub-model") as c:
            await c.list_tools()  # the core starts after this, no call made
            with anyio.fail_after(ROOM_S):
                while not all(any(r.path == "/v1/models" for r in s.requests) for s in (a, b)):
                    await anyio.sleep(0.05)
            for i in range(8):  # about half of them the hash alone would send to b
                r = ok(await c.call_tool("respond", {"prompt": "hi", "thread_id": f"t{i}"}))
                assert r["usage"]["endpoint"] == host_port(a), r
        assert not [r for r in b.requests if r.path == "/v1/chat/completions"]


def thread_hashed_to(stub, other) -> str:
    names = [host_port(stub), host_port(other)]
    return next(f"t{i}" for i in range(64) if rendezvous_first(f"t{i}", names) == host_port(stub))


async def test_no_call_waits_on_an_endpoint_that_never_answers():
    """It takes connections and never answers: its check (at start) gives up at its bound, and
    a thread the hash sends there is answered by the other endpoint."""
    with Silent() as wedged, OpenAIStub() as a:
        async with fleet([wedged.endpoint, a]) as c:
            tid = thread_hashed_to(wedged, a)
            start = time.monotonic()
            with anyio.fail_after(ROOM_S):  # without the bound: the chat's 600 s idle time-out
                r = ok(await c.call_tool("respond", {"prompt": "hi", "thread_id": tid}))
            assert r["usage"]["endpoint"] == host_port(a) and time.monotonic() - start < ROOM_S
            again = ok(await c.call_tool("respond", {"prompt": "and again", "thread_id": tid}))
            assert again["usage"]["endpoint"] == host_port(a) and again["turns"] == 2
        assert [m["content"] for m in a.chats()[-1]["messages"] if m["role"] == "user"] == ["hi", "and again"]


def test_check_names_an_endpoint_that_never_answers_within_the_bound():
    with Silent() as wedged, OpenAIStub() as a:
        start = time.monotonic()
        r = check(wedged.endpoint, a.endpoint)
        took = time.monotonic() - start
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stdout.splitlines() if x.startswith("endpoint:")]
    assert f"{host_port(wedged)}: down (no answer within {CHECK_BOUND_S} s)" in lines[0], lines
    assert f"{host_port(a)}: up, model stub-model" in lines[1], lines
    assert took < ROOM_S, took  # over 30 s before: each probe's 5 s idle wait, one after another


@pytest.mark.parametrize("cut_after", [0, 2])
async def test_a_stream_cut_cleanly_is_a_failure(cut_after):
    """The server closes the stream mid-answer with no finish_reason and no [DONE]: before the
    caller saw any of it the turn goes to the next endpoint, which reads the thread again; after,
    the call fails naming the cut, and the thread is as it was."""
    with Unruly() as u, OpenAIStub() as a:
        async with fleet([u.endpoint, a]) as c:
            tid = thread_hashed_to(u, a)
            first = ok(await c.call_tool("respond", {"prompt": "one", "thread_id": tid}))
            assert first["usage"]["endpoint"] == host_port(u) and first["text"] == "Hello there, friend"
            u.chat, u.cut_after = "cut_close", cut_after
            r = await c.call_tool("respond", {"prompt": "two", "thread_id": tid})
            listed = ok(await c.call_tool("list_threads", {}))
        turns = [x["turns"] for x in listed["threads"] if x["thread_id"] == tid]
        assert u.paths().count("/v1/chat/completions") == 2  # the cut turn was not sent there again
        if cut_after == 0:
            moved = ok(r)
            assert moved["usage"]["endpoint"] == host_port(a) and turns == [2], (moved, turns)
            assert [m["content"] for m in a.chats()[0]["messages"] if m["role"] == "user"] == ["one", "two"]
        else:
            text = error_text(r)
            assert "ended its answer unfinished (no finish_reason and no [DONE]" in text and u.endpoint in text, text
            assert turns == [1] and not a.chats()


def homes(stubs, thread_id: str) -> list[str]:
    """The endpoints whose request logs hold chats of `thread_id`."""
    return [host_port(s) for s in stubs if thread_id in chats_by_thread(s)]


async def test_a_thread_resumed_after_a_restart_is_pinned_again_where_it_was(tmp_path):
    with OpenAIStub() as a, OpenAIStub() as b, OpenAIStub() as d:
        stubs, ids = [a, b, d], [f"resume-{i}" for i in range(6)]
        async with fleet(stubs, "--state-dir", str(tmp_path)) as c:
            before = {t: ok(await c.call_tool("respond", {"prompt": "one", "thread_id": t}))["usage"]["endpoint"]
                      for t in ids}
        assert len(set(before.values())) >= 2, before  # the bound spreads them: a pin by anything else shows
        async with fleet(stubs, "--state-dir", str(tmp_path)) as c:
            # In the order they were made: the rule (the hash, and the bound over the live pins)
            # then sees what it saw when each was first placed.
            for t in ids:
                r = ok(await c.call_tool("respond", {"prompt": "two", "thread_id": t}))
                assert (r["turns"], r["usage"]["endpoint"]) == (2, before[t]), (t, r, before)
        for t in ids:
            assert homes(stubs, t) == [before[t]] and sum(chats_by_thread(s).get(t, 0) for s in stubs) == 2


async def test_a_thread_evicted_and_back_is_pinned_by_the_hash_again(tmp_path):
    """One live thread at a time (`--max-threads 1`), so the bound never binds: each thread's every
    turn, before its eviction and after it is read back from the store, goes where the hash alone
    sends it."""
    with OpenAIStub() as a, OpenAIStub() as b, OpenAIStub() as d:
        stubs = [a, b, d]
        names = [host_port(s) for s in stubs]
        pool = [f"evicted-{i}" for i in range(64)]
        ids = [t for e in names for t in [t for t in pool if rendezvous_first(t, names) == e][:2]]
        assert len(ids) == 6, ids  # two for each endpoint, but for a chance of 3 * (2/3)**63
        async with fleet(stubs, "--state-dir", str(tmp_path), "--max-threads", "1") as c:
            for turn in (1, 2, 3):
                for t in ids:  # each evicts the one before it
                    r = ok(await c.call_tool("respond", {"prompt": f"turn {turn}", "thread_id": t}))
                    assert (r["turns"], r["usage"]["endpoint"]) == (turn, rendezvous_first(t, names)), (t, r)
        for t in ids:
            assert homes(stubs, t) == [rendezvous_first(t, names)]
