"""The shared server (`--http HOST:PORT`): MCP's streamable HTTP through the SDK's own client,
in both protocol generations it speaks (2025-11-25 with sessions, 2026-07-28 without), and raw
HTTP (httpx2, the SDK's HTTP client) for what a hostile or broken client sends: a connection
dropped mid-call, malformed requests. Who may reach it (token, Host, Origin) is test_http_access.py.

Every server here listens on 127.0.0.1 on a port the OS picks (`:0`, read back from the log
line that says where it serves), with the echo backend."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from pathlib import Path

import anyio
import httpx2
import psutil
import pytest

from harness import error_text, held, install_fake, ok, release, running, text_of, wait_for
from harness.http import (MODERN_HEADERS, MODES, client, events, http_wisp, legacy_session, modern_call, threads_of)

# --- 1. one server, many clients ----------------------------------------------------------------


@pytest.mark.parametrize("first, second", [("legacy", "2026-07-28"), ("2026-07-28", "legacy")])
async def test_two_clients_share_a_thread(first, second):
    async with http_wisp() as server:
        async with client(server, first) as a, client(server, second) as b:
            made = ok(await a.call_tool("respond", {"prompt": "from a"}))
            assert made["created"] is True
            went_on = ok(await b.call_tool("respond", {"prompt": "from b", "thread_id": made["thread_id"]}))
            assert (went_on["created"], went_on["turns"], went_on["text"]) == (False, 2, "echo 2: from b")
            # Both see the one registry.
            for c in (a, b):
                listing = ok(await c.call_tool("list_threads", {}))
                assert [(t["thread_id"], t["turns"]) for t in listing["threads"]] == [(made["thread_id"], 2)]
        assert len(server.core_pids()) == 1  # one core for every client


@pytest.mark.parametrize("mode", MODES)
async def test_progress_reaches_the_calling_client_only(mode):
    async with http_wisp() as server:
        async with client(server, mode) as a, client(server, mode) as b:
            seen: dict[str, list] = {"a": [], "b": []}

            def recorder(who):
                async def record(progress, total, message):
                    seen[who].append((progress, message))
                return record

            async with anyio.create_task_group() as tg:
                # Kept: echo spreads its partials over the sleep, which is what makes progress here.
                async def call(c, who):
                    r = ok(await c.call_tool("respond", {"prompt": f"!sleep 300 from-{who} " + "word " * 8, "thread_id": who},
                                             progress_callback=recorder(who)))
                    assert r["text"].startswith(f"echo 1: !sleep 300 from-{who}")
                tg.start_soon(call, a, "a")
                tg.start_soon(call, b, "b")
        for who, other in (("a", "b"), ("b", "a")):
            assert seen[who], f"client {who} got no progress"
            assert all(f"from-{who}" in m and f"from-{other}" not in m for _, m in seen[who]), seen[who]


# --- 4. roots are the calling session's ------------------------------------------------------------


async def test_each_call_uses_the_roots_of_the_session_that_made_it(tmp_path):
    from mcp.types import ListRootsResult, Root

    dirs = {}
    for who in ("a", "b", "own"):
        d = tmp_path / who
        d.mkdir()
        (d / "note.txt").write_text(f"note of {who}\n")
        dirs[who] = d

    def offering(d: Path):
        async def list_roots(context) -> ListRootsResult:
            return ListRootsResult(roots=[Root(uri=d.as_uri(), name=d.name)])
        return list_roots

    def read(path: Path) -> str:
        return "!tool read_file " + json.dumps({"path": str(path)})

    async with http_wisp("--root", str(dirs["own"])) as server:
        async with client(server, list_roots_callback=offering(dirs["a"])) as a, \
                client(server, list_roots_callback=offering(dirs["b"])) as b, client(server, "2026-07-28") as modern:
            for c, who in ((a, "a"), (b, "b"), (modern, "m")):
                ok(await c.call_tool("respond", {"prompt": "hi", "thread_id": who, "tools": ["read_file"]}))
            assert ok(await a.call_tool("respond", {"prompt": read(dirs["a"] / "note.txt"), "thread_id": "a"}))["text"].endswith("note of a\n")
            assert "outside the readable roots" in ok(await a.call_tool("respond", {"prompt": read(dirs["b"] / "note.txt"), "thread_id": "a"}))["text"]
            assert ok(await b.call_tool("respond", {"prompt": read(dirs["b"] / "note.txt"), "thread_id": "b"}))["text"].endswith("note of b\n")
            assert "outside the readable roots" in ok(await b.call_tool("respond", {"prompt": read(dirs["a"] / "note.txt"), "thread_id": "b"}))["text"]
            # A 2026-07-28 client has no roots to offer (no server-to-client requests): wisp's own --root.
            assert ok(await modern.call_tool("respond", {"prompt": read(dirs["own"] / "note.txt"), "thread_id": "m"}))["text"].endswith("note of own\n")
            assert "outside the readable roots" in ok(await modern.call_tool("respond", {"prompt": read(dirs["a"] / "note.txt"), "thread_id": "m"}))["text"]


@pytest.mark.parametrize("answer, why", [
    ({"roots": [{"uri": 5}]}, "roots.0.uri"),
    ({"roots": "file:///tmp"}, "roots"),
], ids=["uri not a string", "roots not a list"])
async def test_a_hostile_answer_to_roots_list_fails_that_call_with_invalid_argument(answer, why):
    async with http_wisp() as server, httpx2.AsyncClient(timeout=30) as hc:
        headers = await legacy_session(hc, server, {"roots": {"listChanged": False}})
        body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                "params": {"name": "respond", "arguments": {"prompt": "p", "thread_id": "r", "tools": ["read_file"]}}}
        async with hc.stream("POST", server.url, json=body, headers=headers) as r:
            lines = r.aiter_lines()
            ask = await events(lines)
            assert ask.get("method") == "roots/list", ask  # asked on the call's own stream
            posted = await hc.post(server.url, json={"jsonrpc": "2.0", "id": ask["id"], "result": answer}, headers=headers)
            assert posted.status_code == 202
            reply = await events(lines)
        assert reply["id"] == 7 and reply["result"]["isError"], reply
        text = reply["result"]["content"][0]["text"]
        assert text.startswith("invalid_argument:") and "roots/list" in text and why in text, text
        assert await threads_of(server) == {}


# --- 5. calls as over stdio ------------------------------------------------------------------------


async def test_eight_clients_fifty_calls_each_on_their_own_threads_at_once():
    errors: list[str] = []
    async with http_wisp() as server:
        async with contextlib.AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(client(server, MODES[i % 2])) for i in range(8)]

            async def run(i: int, c) -> None:
                for n in range(1, 51):
                    try:
                        r = await c.call_tool("respond", {"prompt": f"c{i} n{n}", "thread_id": f"client-{i}"})
                        if r.is_error or r.structured_content["text"] != f"echo {n}: c{i} n{n}":
                            errors.append(f"client {i} call {n}: {text_of(r)}")
                    except Exception as exc:
                        errors.append(f"client {i} call {n}: {exc!r}")

            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:
                    for i, c in enumerate(clients):
                        tg.start_soon(run, i, c)
        assert errors == []
        assert await threads_of(server) == {f"client-{i}": 50 for i in range(8)}


@pytest.mark.parametrize("mode", MODES)
async def test_a_clients_cancel_stops_its_call_only_and_leaves_the_thread_unchanged(mode):
    async with http_wisp() as server:
        async with client(server, mode) as a, client(server, mode) as b:
            ok(await a.call_tool("respond", {"prompt": "one", "thread_id": "t"}))
            other = asyncio.create_task(b.call_tool("respond", {"prompt": "!hold other other", "thread_id": "u"}))
            doomed = asyncio.create_task(a.call_tool("respond", {"prompt": "!hold cancelled x", "thread_id": "t"}))
            await held(a, "cancelled")
            doomed.cancel()
            with pytest.raises(asyncio.CancelledError):
                await doomed
            # The other client's call on another thread was not touched by the cancel: still parked.
            await held(b, "other")
            assert await release(b, "other") == 1
            assert ok(await other)["text"] == "echo 1: !hold other other"
            with anyio.fail_after(30):  # behind the cancelled call, parked for ever, it would never come
                after = ok(await a.call_tool("respond", {"prompt": "after", "thread_id": "t"}))
            # Not queued behind the cancelled call, whose turn was not kept.
            assert (after["text"], after["turns"]) == ("echo 2: after", 2)


@pytest.mark.parametrize("mode", MODES)
async def test_a_client_that_drops_its_connection_mid_call_leaves_the_thread_unchanged(mode):
    async with http_wisp() as server:
        async with client(server) as a:
            ok(await a.call_tool("respond", {"prompt": "one", "thread_id": "t"}))
            async with httpx2.AsyncClient(timeout=30) as hc:
                if mode == "legacy":
                    headers = await legacy_session(hc, server)
                    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                            "params": {"name": "respond", "arguments": {"prompt": "!hold dropped x", "thread_id": "t"}}}
                else:
                    headers, body = server.headers(**MODERN_HEADERS), modern_call("respond", {"prompt": "!hold dropped x", "thread_id": "t"})
                # The connection is closed while the call is parked in the core, and never released.
                async with anyio.create_task_group() as tg:
                    async def post() -> None:
                        async with hc.stream("POST", server.url, json=body, headers=headers) as r:
                            assert r.status_code == 200
                            await anyio.sleep_forever()  # holds the stream open till cancelled

                    tg.start_soon(post)
                    await held(a, "dropped")
                    tg.cancel_scope.cancel()
            with anyio.fail_after(30):  # behind the dropped call, parked for ever, it would never come
                after = ok(await a.call_tool("respond", {"prompt": "after", "thread_id": "t"}))
            assert (after["text"], after["turns"]) == ("echo 2: after", 2)


async def test_one_session_over_the_cap_gets_a_clear_error_and_idle_sessions_expire():
    async with http_wisp("--max-sessions", "2", "--session-idle-timeout", "1.5") as server:
        async with httpx2.AsyncClient(timeout=30) as hc:
            first = await legacy_session(hc, server)
            await legacy_session(hc, server)
            init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "third", "version": "0"}}}
            r = await hc.post(server.url, json=init, headers=server.headers())
            assert r.status_code == 503 and "mcp-session-id" not in r.headers
            message = r.json()["error"]["message"]
            assert "at most 2" in message and "--max-sessions" in message, message
            # 2026-07-28 requests open no session: still served.
            r = await hc.post(server.url, json=modern_call("list_threads", {}), headers=server.headers(**{**MODERN_HEADERS, "Mcp-Name": "list_threads"}))
            assert r.status_code == 200, r.text
            # Idle past the timeout, a session is gone (404, as the transport spec says), and its slot is free.
            await anyio.sleep(2.5)  # kept: idle past the 1.5 s timeout is the thing tested
            r = await hc.post(server.url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=first)
            assert r.status_code == 404, r.text
            await legacy_session(hc, server)


# --- 6. lifecycle -------------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"])
async def test_a_stop_signal_during_calls_exits_within_3_s_with_no_orphan(sig):
    async with http_wisp() as server:
        async with contextlib.AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(client(server, MODES[i % 2])) for i in range(4)]
            ok(await clients[0].call_tool("respond", {"prompt": "start the core"}))
            [core] = server.core_pids()
            kids = psutil.Process(server.proc.pid).children(recursive=True)
            assert core in [k.pid for k in kids]
            ended: list[str] = []

            async def hang(c) -> None:
                try:
                    r = await c.call_tool("respond", {"prompt": "!hold never long"})
                    ended.append(text_of(r))
                except Exception as exc:
                    ended.append(repr(exc))

            async with anyio.create_task_group() as tg:
                for c in clients:
                    tg.start_soon(hang, c)
                async with client(server) as watcher:
                    await held(watcher, "never", calls=len(clients))
                start = time.monotonic()
                server.proc.send_signal(sig)
                await wait_for(lambda: server.proc.poll() is not None, 3, f"wisp --http did not exit within 3 s of {sig.name}")
                took = time.monotonic() - start
                # Every client's call ends: none waits on a dead server.
                await wait_for(lambda: len(ended) == len(clients), 10, f"calls left waiting: {ended}")
                tg.cancel_scope.cancel()
            print(f"{sig.name} with 4 calls running: exited in {took:.2f} s; the calls ended with {ended}")
            # Cancelled as over stdio: each caller is told, none is left waiting.
            assert all(e.startswith("shutting_down:") for e in ended), ended
            assert server.proc.returncode == 0
            assert not [k.pid for k in kids if running(k.pid)], "a child outlived wisp --http"


async def test_a_stop_signal_stops_the_local_model_too(tmp_path):
    binary = install_fake(tmp_path / "bin")
    model = tmp_path / "any.gguf"
    model.write_bytes(b"GGUF")
    env = {"WISP_LLAMA_SERVER": str(binary), "WISP_MODEL_PATH": str(model), "WISP_LOCAL_MODEL": "1", "FAKE_LLAMA_MODE": "decode"}
    async with http_wisp("--eager", env=env, backend=None) as server:
        await wait_for(server.core_pids, 30, "no core started")
        kids = psutil.Process(server.proc.pid).children(recursive=True)
        assert any(str(binary) in " ".join(k.cmdline()) for k in kids), [k.cmdline() for k in kids]
        start = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(5)
        assert time.monotonic() - start < 3
        assert not [k.cmdline() for k in kids if running(k.pid)], "the local model or the core outlived wisp --http"


async def test_the_core_starts_with_the_first_request_or_at_once_with_eager():
    async with http_wisp() as lazy, http_wisp("--eager") as eager:
        await wait_for(eager.core_pids, 15, "--eager started no core")
        assert not lazy.core_pids()  # nothing has asked it anything yet
        async with client(lazy) as c:
            ok(await c.call_tool("list_threads", {}))
        assert len(lazy.core_pids()) == 1


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "state-dir"])
async def test_a_core_killed_mid_call_loses_its_threads_or_nothing_with_a_state_dir(durable, tmp_path):
    args = ("--state-dir", str(tmp_path / "state")) if durable else ()
    async with http_wisp(*args) as server:
        async with client(server, "legacy") as a, client(server, "2026-07-28") as b:
            ok(await a.call_tool("respond", {"prompt": "keep me", "thread_id": "kept"}))
            [core] = server.core_pids()
            crashed = None

            async def running_call() -> None:
                nonlocal crashed
                crashed = await b.call_tool("respond", {"prompt": "!hold never running", "thread_id": "running"})

            async with anyio.create_task_group() as tg:
                tg.start_soon(running_call)
                await held(b, "never")
                os.kill(core, signal.SIGKILL)
            assert error_text(crashed).startswith("core_crashed:")
            later = await a.call_tool("respond", {"prompt": "still there?", "thread_id": "kept"})
            if durable:
                assert (ok(later)["created"], ok(later)["text"]) == (False, "echo 2: still there?")
            else:
                assert error_text(later).startswith("thread_lost:") and "kept" in error_text(later)
            await wait_for(lambda: len(server.core_pids()) >= 2, 5, "not restarted")  # once, for every client
            ok(await b.call_tool("respond", {"prompt": "on the new core", "thread_id": "running"}))
            assert len(server.core_pids()) == 2


# --- hostile clients with the token -------------------------------------------------------------------


async def test_malformed_requests_with_the_token_are_refused_and_take_nothing_down():
    async with http_wisp() as server:
        async with client(server) as c:
            ok(await c.call_tool("respond", {"prompt": "before", "thread_id": "steady"}))
            async with httpx2.AsyncClient(timeout=30) as hc:
                session = await legacy_session(hc, server)
                json_type = {"Content-Type": "application/json"}
                bad = [
                    ("POST", b"not json", server.headers(**json_type)),
                    ("POST", b"[]", server.headers(**json_type)),
                    ("POST", b'[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]', server.headers(**json_type, **MODERN_HEADERS)),
                    ("POST", b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}', server.headers(**{"Content-Type": "text/plain"})),
                    ("POST", b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}', {**server.headers(**json_type), "Accept": "text/html"}),
                    ("POST", b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}', server.headers(**json_type, **{"Mcp-Session-Id": "no-such-session"})),
                    ("POST", b'{"jsonrpc":"2.0","id":' + b"9" * 5000 + b',"method":"tools/list"}', server.headers(**json_type, **MODERN_HEADERS)),
                    ("POST", b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"respond","arguments":{"prompt":5}}}', {**session, **json_type}),
                    ("POST", b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"respond","arguments":{"prompt":"x"}}}', server.headers(**json_type, **{"MCP-Protocol-Version": "1999-01-01"})),
                    ("PUT", b"{}", server.headers(**json_type)),
                    ("DELETE", b"", server.headers(**{"Mcp-Session-Id": "no-such-session"})),
                    ("GET", b"", server.headers()),
                ]
                for method, body, headers in bad:
                    r = await hc.request(method, server.url, content=body, headers=headers)
                    # An error the request's own fault (4xx), or a tool error for bad arguments: never a 5xx.
                    assert r.status_code < 500, (method, body[:80], r.status_code, r.text[:200])
                    if r.status_code == 200:
                        assert '"isError":true' in r.text.replace(" ", ""), (body[:80], r.text[:300])
                r = await hc.get(server.url.replace("/mcp", "/elsewhere"), headers=server.headers())
                assert r.status_code == 404
            # The server, its core and the other client's thread are as they were.
            again = ok(await c.call_tool("respond", {"prompt": "after", "thread_id": "steady"}))
            assert (again["text"], again["turns"]) == ("echo 2: after", 2)
        assert len(server.core_pids()) == 1


async def test_one_clients_slow_calls_do_not_hold_up_another_clients_calls():
    async with http_wisp() as server:
        async with client(server) as slow, client(server, "2026-07-28") as quick:
            ok(await quick.call_tool("respond", {"prompt": "warm", "thread_id": "q"}))
            async with anyio.create_task_group() as tg:
                for i in range(6):
                    tg.start_soon(slow.call_tool, "respond", {"prompt": "!hold never slow", "thread_id": f"slow-{i}"})
                await held(quick, "never", calls=6)
                # Parked for ever, the slow calls would hold up for ever any call that waited on them.
                with anyio.fail_after(30):
                    for n in range(2, 12):
                        assert ok(await quick.call_tool("respond", {"prompt": "quick", "thread_id": "q"}))["text"] == f"echo {n}: quick"
                tg.cancel_scope.cancel()
