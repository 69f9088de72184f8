"""The shared server (`--http HOST:PORT`): MCP's streamable HTTP through the SDK's own client,
in both protocol generations it speaks (2025-11-25 with sessions, 2026-07-28 without), and raw
HTTP (httpx2, the SDK's HTTP client) for what a hostile or broken client sends: no token, a
wrong one, a foreign Origin or Host, a body over the limit, a connection dropped mid-call.

Every server here listens on 127.0.0.1 on a port the OS picks (`:0`, read back from the log
line that says where it serves), with the echo backend."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import signal
import stat
import subprocess
import time
from pathlib import Path

import anyio
import httpx2
import psutil
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from harness import REPO, error_text, held, install_fake, ok, release, running, shim_command, shim_env, text_of, wait_for
from harness.http import (ACCEPT, MODERN_HEADERS, MODES, client, events, http_wisp, legacy_session, modern_call, start_http,
                          threads_of)

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


# --- 2. the token ---------------------------------------------------------------------------------


async def test_no_token_or_a_wrong_one_is_401_and_the_tool_never_runs():
    async with http_wisp() as server:
        wrong = [
            {},  # none
            {"Authorization": "Bearer " + server.token[:-1] + ("A" if server.token[-1] != "A" else "B")},
            {"Authorization": "Bearer " + server.token[:-1]},  # a prefix of it
            {"Authorization": "Bearer " + server.token + "x"},
            {"Authorization": "Basic " + server.token},
            {"Authorization": "Bearer"},
            {"Authorization": b"Bearer \xe9" + server.token.encode()},  # not ASCII
        ]
        async with httpx2.AsyncClient(timeout=30) as hc:
            for i, auth in enumerate(wrong):
                headers = {"Accept": ACCEPT, **MODERN_HEADERS, **auth}
                r = await hc.post(server.url, json=modern_call("respond", {"prompt": "x", "thread_id": f"probe{i}"}), headers=headers)
                assert r.status_code == 401, (auth, r.status_code, r.text)
                assert r.headers["www-authenticate"].startswith("Bearer"), r.headers
                # A 2025-11-25 initialize and a GET stream are refused the same way.
                init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
                r = await hc.post(server.url, json=init, headers={"Accept": ACCEPT, **auth})
                assert r.status_code == 401 and "mcp-session-id" not in r.headers
                r = await hc.get(server.url, headers={"Accept": "text/event-stream", **auth})
                assert r.status_code == 401
        # Through the SDK's own client with a wrong token: it fails to connect.
        with pytest.raises(Exception):  # noqa: B017 (the SDK names no type for a refused connection)
            async with client(server, "legacy", token="not-the-token-at-all-0123456789"):
                pass
        assert not server.core_pids(), "a request without the token started the core"
        assert await threads_of(server) == {}  # no probe thread was ever made


async def test_a_token_file_readable_by_others_or_not_a_regular_file_is_refused(tmp_path):
    good = tmp_path / "token"
    good.write_text(secrets.token_urlsafe(32) + "\n")
    good.chmod(0o644)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    short = tmp_path / "short"
    short.write_text("abc\n")
    short.chmod(0o600)
    for path, why in ((good, "0644"), (tmp_path, "not a regular file"), (fifo, "not a regular file"),
                      (tmp_path / "missing", "does not exist"), (short, "at least 16")):
        proc = start_http("--token-file", str(path))
        try:
            _, err = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode not in (0, None) and why in err.decode() and str(path) in err.decode(), (path, err)
    good.chmod(0o600)
    async with http_wisp("--token-file", str(good)) as server:  # WISP_HTTP_TOKEN wins over the file
        assert "WISP_HTTP_TOKEN" in server.log()


async def test_a_generated_token_is_kept_0600_in_a_0700_dir_and_check_says_where_not_what(tmp_path):
    env = shim_env(XDG_CONFIG_HOME=str(tmp_path / "config"))
    path = tmp_path / "config" / "wisp" / "http-token"
    check = subprocess.run(shim_command("--backend", "echo", "--http", "127.0.0.1:8765", "--check"), env=env,
                           capture_output=True, text=True, timeout=60, cwd=REPO)
    assert check.returncode == 0, check.stderr
    assert str(path) in check.stdout and "http://127.0.0.1:8765/mcp" in check.stdout
    assert not path.exists()  # --check looks; it writes nothing
    proc = subprocess.Popen(shim_command("--backend", "echo", "--http", "127.0.0.1:0"), env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        while "serving MCP at" not in line:
            assert line, "wisp exited before serving"
            line = proc.stderr.readline()
        url = re.search(r"(http://\S+/mcp)", line).group(1)
        token = path.read_text().strip()
        assert len(token) >= 43 and re.fullmatch(r"[A-Za-z0-9_-]+", token)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert token not in line
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as hc:
            async with Client(streamable_http_client(url, http_client=hc), mode="legacy") as c:
                ok(await c.call_tool("respond", {"prompt": "with the generated token"}))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
    check = subprocess.run(shim_command("--backend", "echo", "--http", "127.0.0.1:8765", "--check"), env=env,
                           capture_output=True, text=True, timeout=60, cwd=REPO)
    assert str(path) in check.stdout and token not in check.stdout + check.stderr
    # The next start reuses it.
    again = subprocess.Popen(shim_command("--backend", "echo", "--http", "127.0.0.1:0"), env=env, cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while "serving MCP at" not in (line := again.stderr.readline()):
            assert line
    finally:
        again.send_signal(signal.SIGTERM)
        again.wait(10)
    assert path.read_text().strip() == token


# --- 3. loopback, Host and Origin -------------------------------------------------------------------


@pytest.mark.parametrize("text, want", [
    ("127.0.0.1:8765", ("127.0.0.1", 8765, True)),
    ("localhost:0", ("localhost", 0, True)),
    ("[::1]:8765", ("::1", 8765, True)),
    ("127.3.4.5:1", ("127.3.4.5", 1, True)),
    ("0.0.0.0:8765", ("0.0.0.0", 8765, False)),
    ("[::]:8765", ("::", 8765, False)),
    ("example.com:80", ("example.com", 80, False)),
])
def test_the_address_is_parsed_and_judged_loopback_or_not(text, want):
    from wisp_shim.http.options import parse_bind

    b = parse_bind(text)
    assert (b.host, b.port, b.loopback) == want


@pytest.mark.parametrize("text, says", [
    ("8765", "HOST:PORT"), (":8765", "HOST:PORT"), ("::1:8765", "brackets"),
    ("127.0.0.1:65536", "0 to 65535"), ("127.0.0.1:-1", "0 to 65535"), ("127.0.0.1:http", "0 to 65535"),
])
def test_a_malformed_address_is_refused_with_what_to_write(text, says):
    from wisp_shim.http.options import HttpConfigError, parse_bind

    with pytest.raises(HttpConfigError, match=says):
        parse_bind(text)


def test_only_this_servers_own_host_and_origin_are_allowed():
    from wisp_shim.http.options import parse_bind, security_settings

    s = security_settings(parse_bind("127.0.0.1:0"), 4321)
    assert s.enable_dns_rebinding_protection
    assert sorted(s.allowed_hosts) == ["127.0.0.1:4321", "localhost:4321"]  # no wildcard port
    assert sorted(s.allowed_origins) == ["http://127.0.0.1:4321", "http://localhost:4321"]
    assert sorted(security_settings(parse_bind("[::1]:0"), 80).allowed_hosts) == ["[::1]", "[::1]:80", "localhost", "localhost:80"]


def test_a_non_loopback_bind_without_allow_remote_refuses_to_start():
    for where in ("0.0.0.0:0", "[::]:0", "192.0.2.1:0", "example.com:0"):
        r = subprocess.run(shim_command("--backend", "echo", "--http", where), env=shim_env(WISP_HTTP_TOKEN="x" * 32),
                           capture_output=True, text=True, timeout=30, cwd=REPO)
        assert r.returncode != 0 and "--allow-remote" in r.stderr and "loopback" in r.stderr, (where, r.stderr)
    # WISP_HTTP is the same setting.
    r = subprocess.run(shim_command("--backend", "echo"), env=shim_env(WISP_HTTP="0.0.0.0:0", WISP_HTTP_TOKEN="x" * 32),
                       capture_output=True, text=True, timeout=30, cwd=REPO)
    assert r.returncode != 0 and "--allow-remote" in r.stderr


def test_a_port_in_use_is_refused_at_start_with_the_reason():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run(shim_command("--backend", "echo", "--http", f"127.0.0.1:{port}"), env=shim_env(WISP_HTTP_TOKEN="x" * 32),
                           capture_output=True, text=True, timeout=30, cwd=REPO)
    assert r.returncode != 0 and f"cannot listen on 127.0.0.1:{port}" in r.stderr and "another port" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


async def test_a_foreign_origin_is_403_and_a_foreign_host_421_even_with_the_token():
    async with http_wisp() as server:
        async with httpx2.AsyncClient(timeout=30) as hc:
            cases = [
                ({"Origin": "http://evil.example"}, 403),
                ({"Origin": f"http://evil.example:{server.port}"}, 403),
                ({"Origin": "http://127.0.0.1:1"}, 403),  # loopback, but another server's origin
                ({"Origin": "null"}, 403),
                ({"Host": f"evil.example:{server.port}"}, 421),  # a rebound DNS name
                ({"Host": "127.0.0.1:1"}, 421),
            ]
            for i, (extra, status) in enumerate(cases):
                body = modern_call("respond", {"prompt": "x", "thread_id": f"foreign{i}"})
                r = await hc.post(server.url, json=body, headers=server.headers(**MODERN_HEADERS, **extra))
                assert r.status_code == status, (extra, r.status_code, r.text)
            # This server's own origin, and localhost for it, are served.
            for origin in (f"http://127.0.0.1:{server.port}", f"http://localhost:{server.port}"):
                r = await hc.post(server.url, json=modern_call("respond", {"prompt": "x", "thread_id": "mine"}),
                                  headers=server.headers(**MODERN_HEADERS, Origin=origin))
                assert r.status_code == 200, (origin, r.text)
        assert await threads_of(server) == {"mine": 2}


async def test_a_body_over_the_limit_is_413_before_anything_runs():
    from wisp_shim.http.server import MAX_BODY_BYTES

    async with http_wisp() as server:
        big = modern_call("respond", {"prompt": "x" * (MAX_BODY_BYTES + 1), "thread_id": "big"})
        async with httpx2.AsyncClient(timeout=60) as hc:
            r = await hc.post(server.url, content=json.dumps(big).encode(), headers=server.headers(**MODERN_HEADERS, **{"Content-Type": "application/json"}))
            assert r.status_code == 413, r.text
            # A prompt just under the frame limit is a tool error from wisp's own check, not a 413.
        assert await threads_of(server) == {}


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
