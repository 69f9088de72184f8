"""The shared server's guards, as a hostile peer meets them: connections that never finish their
headers or body, peers without the token filling the server, one client's stalled uploads, a
request with two Authorization headers. The real server (`--http`) over raw sockets and httpx2,
and the guard's own connection class in a small uvicorn server with short deadlines."""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import socket
import sys
import time

import anyio
import httpx2
import pytest

from harness import ok, wait_for
from harness.http import MODERN_HEADERS, client, http_wisp, legacy_session, modern_call, threads_of

MIB = 1024 * 1024


def _raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"this test opens {needed} sockets; the hard open-file limit here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def _closed(sock: socket.socket) -> bool:
    """The peer closed (EOF or reset), without waiting."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


# --- 1. peers without the token ----------------------------------------------------------------


async def test_a_thousand_connections_that_never_finish_their_headers_leave_the_token_holder_served():
    from wisp_shim.http.guards import MAX_UNPROVEN_CONNECTIONS

    slow = 1030
    _raise_fd_limit(slow + 512)
    async with http_wisp() as server:
        async with client(server, "2026-07-28") as c:
            ok(await c.call_tool("respond", {"prompt": "before", "thread_id": "t"}))
        socks = []
        try:
            for _ in range(slow):
                s = socket.create_connection(("127.0.0.1", server.port))
                s.sendall(b"POST /mcp HTTP/1.1\r\nHo")  # and never the rest
                socks.append(s)
            # The server has them all: it closed every one past its cap of unproven connections.
            await wait_for(lambda: sum(_closed(s) for s in socks) >= slow - MAX_UNPROVEN_CONNECTIONS, 30,
                           "the server did not close the connections past its cap")
            # One more header byte on each that is still open, as a slow peer sends them.
            for s in socks:
                with contextlib.suppress(OSError):
                    s.send(b"s")
            start = time.monotonic()
            async with client(server, "2026-07-28") as c:
                r = ok(await c.call_tool("respond", {"prompt": "during", "thread_id": "t"}))
            took = time.monotonic() - start
            print(f"\nthe token holder's call under {slow} header-less connections: {took * 1000:.0f} ms",
                  file=sys.stderr)
            assert (r["text"], r["turns"]) == ("echo 2: during", 2)
            # Only the newest unproven connections are kept; the rest were closed, not left to wait.
            await wait_for(lambda: sum(not _closed(s) for s in socks) <= MAX_UNPROVEN_CONNECTIONS, 10,
                           f"more than {MAX_UNPROVEN_CONNECTIONS} unproven connections left open")
        finally:
            for s in socks:
                s.close()
        assert await threads_of(server) == {"t": 2}


# --- 1. deadlines, on the guard's own connection class ---------------------------------------------


@contextlib.asynccontextmanager
async def _guarded_server(**limits):
    """A uvicorn server on a free port with wisp's connection class (token "t" * 16) in front of
    an app that reads the whole body and answers its length."""
    import uvicorn

    from wisp_shim.http.guards import ConnectionGuard
    from wisp_shim.http.token import Credentials

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        size = 0
        while True:
            m = await receive()
            size += len(m.get("body", b""))
            if not m.get("more_body"):
                break
        body = str(size).encode()
        headers = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    guard = ConnectionGuard(Credentials(b"t" * 16), **limits)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    config = uvicorn.Config(app, http=guard.protocol(), lifespan="off", log_config=None, access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        await wait_for(lambda: server.started, 30, "the guarded server did not start")
        yield sock.getsockname()[1], guard
    finally:
        server.should_exit = True
        await task


AUTH = b"Authorization: Bearer " + b"t" * 16 + b"\r\n"


async def _response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One whole response: its status line and its body (by Content-Length)."""
    status, length = await reader.readline(), 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, await reader.readexactly(length)


async def _eof_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    with anyio.fail_after(seconds):
        return await reader.read()


async def test_headers_and_body_each_have_their_deadline():
    async with _guarded_server(header_s=0.6, body_s=0.6) as (port, _):
        # Headers, trickled a byte at a time past the deadline: closed, unanswered.
        r, w = await asyncio.open_connection("127.0.0.1", port)
        start = time.monotonic()
        for b in b"POST / HTTP/1.1\r\nHost: x\r\n":
            if r.at_eof() or w.is_closing():
                break
            with contextlib.suppress(OSError):
                w.write(bytes([b]))
            await asyncio.sleep(0.05)  # kept: a peer that trickles its headers is the thing tested
        assert await _eof_within(r, 3) == b""
        assert 0.5 < time.monotonic() - start < 2.5
        w.close()
        # A body that stops half way: closed 0.6 s after its headers, however the headers came.
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"POST / HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Content-Length: 100\r\n\r\n" + b"x" * 50)
        start = time.monotonic()
        assert await _eof_within(r, 3) == b""
        assert 0.5 < time.monotonic() - start < 2.5
        w.close()
        # Requests that finish in time are served, one after another on one connection: each
        # new request gets its own header deadline.
        r, w = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(3):
            w.write(b"POST / HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Content-Length: 3\r\n\r\nabc")
            assert await _response(r) == (b"HTTP/1.1 200 OK\r\n", b"3")
            await asyncio.sleep(0.4)  # kept: 1.2 s in all on this connection: each request's clock is its own
        w.close()


async def test_unproven_connections_are_capped_apart_and_the_oldest_makes_room():
    async with _guarded_server(max_unproven=4, max_proven=2) as (port, guard):
        proven = []
        for _ in range(2):
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET / HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n")
            assert (await _response(r))[0].startswith(b"HTTP/1.1 200")
            proven.append((r, w))
        idle = []
        for _ in range(6):
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET / HTT")
            idle.append((r, w))
        # All six arrived once the fifth and the sixth have made room: the two oldest closed.
        await wait_for(lambda: idle[0][0].at_eof() and idle[1][0].at_eof(), 10, "the oldest were not closed")
        # The two oldest of six were closed to keep four; the proven ones were not touched.
        assert [k for k, (r, _) in enumerate(idle) if await _peek_eof(r)] == [0, 1]
        assert len(guard.unproven) == 4 and len(guard.proven) == 2
        for r, w in proven:
            w.write(b"GET / HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n")
            assert (await _response(r))[0].startswith(b"HTTP/1.1 200")
        # A third connection with the token is past the proven room: 503, closed.
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET / HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n")
        assert (await r.readline()).startswith(b"HTTP/1.1 503")
        for r, w in proven + idle:
            w.close()


async def _peek_eof(reader: asyncio.StreamReader) -> bool:
    with anyio.move_on_after(0.3):
        return await reader.read(1) == b""
    return False


# --- 2. one client's stalled uploads -----------------------------------------------------------------


def _upload_head(server, declared: int, session: dict[str, str] | None = None) -> bytes:
    extra = "".join(f"{k}: {v}\r\n" for k, v in (session or {}).items() if k.lower() == "mcp-session-id")
    return (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAuthorization: Bearer {server.token}\r\n"
            f"Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {declared}\r\n\r\n").encode()


async def _stall(server, sent: int, session: dict[str, str] | None = None):
    r, w = await asyncio.open_connection("127.0.0.1", server.port)
    w.write(_upload_head(server, 17 * MIB, session) + b" " * sent)
    await w.drain()
    return r, w


async def test_one_clients_four_stalled_16_mib_uploads_leave_other_clients_served():
    async with http_wisp() as server:
        stalled = []
        try:
            for _ in range(4):
                stalled.append(await _stall(server, 16 * MIB))
            # Kept: drain() waited for the kernel to take the bytes, and nothing outside the server
            # shows when it has read the rest; the calls below must be served either way.
            await anyio.sleep(1.0)
            # Another client's calls, at once and a few seconds on, in either protocol generation.
            async with client(server, "2026-07-28") as modern, client(server) as legacy:
                for name, c in (("modern", modern), ("legacy", legacy)):
                    start = time.monotonic()
                    r = ok(await c.call_tool("respond", {"prompt": "x", "thread_id": name}))
                    took = time.monotonic() - start
                    print(f"\nanother client's call under four stalled 16 MiB uploads: {took * 1000:.0f} ms",
                          file=sys.stderr)
                    assert r["text"] == "echo 1: x", r
                    await anyio.sleep(3.0)  # kept: still served seconds on, the uploads still stalled, is the thing tested
        finally:
            for _, w in stalled:
                w.close()
        assert await threads_of(server) == {"modern": 1, "legacy": 1}


async def test_a_sessions_stalled_uploads_exhaust_only_that_sessions_share():
    from wisp_shim.http.guards import SESSION_BODY_BYTES

    async with http_wisp() as server:
        async with httpx2.AsyncClient(timeout=30) as hc:
            session = await legacy_session(hc, server)
            stalled = []
            try:
                for _ in range(SESSION_BODY_BYTES // (16 * MIB)):
                    stalled.append(await _stall(server, 16 * MIB, session))
                # Kept: drain() waited for the kernel to take the bytes; nothing outside the server
                # shows when it has counted the rest against the session's share.
                await anyio.sleep(1.0)
                # The session's next request is refused while its body is still arriving ...
                r, w = await _stall(server, 200_000, session)
                with anyio.fail_after(10):
                    status = await r.readline()
                assert status.startswith(b"HTTP/1.1 503"), status
                w.close()
                body = {"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                        "params": {"name": "respond", "arguments": {"prompt": "x", "thread_id": "refused"}}}
                r = await hc.post(server.url, json=body, headers=session)
                assert r.status_code == 503 and "session" in r.json()["error"]["message"], r.text
                # ... while another client is served.
                r = await hc.post(server.url, json=modern_call("respond", {"prompt": "x", "thread_id": "other"}),
                                  headers=server.headers(**MODERN_HEADERS))
                assert r.status_code == 200, r.text
                for _, w in stalled:
                    w.close()
                stalled = []
                # Their bytes are let go with their connections, once the server has seen them close.
                with anyio.fail_after(10):
                    while (r := await hc.post(server.url, json=body, headers=session)).status_code == 503:
                        await anyio.sleep(0.05)  # the poll's interval
                assert r.status_code == 200 and "echo 1: x" in r.text, r.text
            finally:
                for _, w in stalled:
                    w.close()
        assert await threads_of(server) == {"other": 1, "refused": 1}


def test_the_body_budgets_bound_each_session_and_the_total():
    from wisp_shim.http.guards import SMALL_BODY_BYTES as S, BodyBudgets

    b = BodyBudgets(per_session=10 * S, total=25 * S)
    assert b.take("a", 6 * S) is None and b.take("a", 4 * S, request=6 * S) is None
    assert "session" in b.take("a", 1)  # a's share is used up ...
    assert b.take("b", 10 * S) is None and b.take(None, 4 * S) is None  # ... not b's, nor a connection's
    assert "MiB" in b.take(None, 2 * S)  # the total is
    # A small body is taken however full the total is; a large one's later chunks are not.
    assert b.take("c", S // 2) is None and b.take(None, S) is None
    assert b.take(None, 1, request=S) is not None
    b.give_back("a", 10 * S)
    assert b.sessions == {"b": 10 * S, "c": S // 2} and b.held == 15 * S + S // 2
    b.give_back("c", S // 2)
    assert "c" not in b.sessions and b.take("a", 9 * S) is None


# --- 3. the token is one header, exactly once ----------------------------------------------------------


@pytest.mark.parametrize("order", ["right-first", "wrong-first", "both-right"])
async def test_two_authorization_headers_are_refused(order):
    async with http_wisp() as server:
        right, wrong = f"Bearer {server.token}", "Bearer not-the-token-0123456789"
        pair = {"right-first": (right, wrong), "wrong-first": (wrong, right), "both-right": (right, right)}[order]
        headers = [("Accept", "application/json, text/event-stream"), ("Content-Type", "application/json"),
                   *MODERN_HEADERS.items(), *(("Authorization", v) for v in pair)]
        async with httpx2.AsyncClient(timeout=30) as hc:
            call = modern_call("respond", {"prompt": "x", "thread_id": "two"})
            r = await hc.post(server.url, content=json.dumps(call), headers=headers)
            assert r.status_code == 400 and "exactly one Authorization" in r.text, (r.status_code, r.text)
        assert await threads_of(server) == {}
