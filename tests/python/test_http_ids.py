"""JSON-RPC envelopes and request ids over the shared server, as a hostile client sends them
(raw HTTP, httpx2): every request gets exactly one reply or runs nothing (transport/request_ids.py
judges, http/server.py refuses at the door).

- a request id reused while the first request under it is in flight (also spelled "07" for 7):
  400, -32600 under that id, nothing run; the first gets its one reply and its thread one turn;
- the id reused once the first has been answered, or once its connection dropped: served;
- ids JSON-RPC or wisp does not allow (fractions, exponents, true, null, objects, arrays,
  integers past int64, unpaired surrogates), a member twice, a batch: 400, -32600, id null,
  in both protocol generations; ids at the edges of what is allowed are answered under
  themselves."""

from __future__ import annotations

import json

import anyio
import httpx2
import pytest

from harness import held, ok, release, wait_for
from harness.http import MODERN_HEADERS, MODES, client, events, http_wisp, legacy_session, modern_call, threads_of


def _legacy_call(rid: object, name: str, arguments: dict) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


async def _post_raw(hc: httpx2.AsyncClient, server, mode: str, body: bytes, session: dict | None) -> httpx2.Response:
    headers = {**session, "Content-Type": "application/json"} if mode == "legacy" else \
        server.headers(**MODERN_HEADERS, **{"Content-Type": "application/json"})
    return await hc.post(server.url, content=body, headers=headers)


def _refused(r: httpx2.Response, rid: object, *words: str) -> dict:
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json")
    msg = r.json()
    assert msg["id"] == rid and msg["error"]["code"] == -32600, msg
    for w in words:
        assert w in msg["error"]["message"], (w, msg)
    return msg


async def _reply(stream) -> dict:
    """The JSON-RPC reply a POST got, as JSON or as the next message on its SSE stream."""
    if stream.headers["content-type"].startswith("application/json"):
        return json.loads(await stream.aread())
    return await events(stream.aiter_lines())


async def _turns(server, thread_id: str) -> list[dict]:
    async with client(server) as c:
        return ok(await c.call_tool("read_thread", {"thread_id": thread_id}))["items"]


async def test_an_id_reused_while_the_first_is_in_flight_is_refused_and_the_first_gets_its_one_reply():
    async with http_wisp() as server, client(server) as watcher, httpx2.AsyncClient(timeout=30) as hc:
        session = await legacy_session(hc, server)
        first = _legacy_call(7, "respond", {"prompt": "!hold first first", "thread_id": "first"})
        async with hc.stream("POST", server.url, json=first, headers=session) as stream:
            assert stream.status_code == 200
            await held(watcher, "first")  # the first call is running, parked till released
            for spelling in (7, "7", "07"):  # one id as the SDK correlates ids
                again = _legacy_call(spelling, "respond", {"prompt": "second", "thread_id": "second"})
                r = await hc.post(server.url, json=again, headers=session)
                msg = _refused(r, spelling, "already in flight", json.dumps(spelling))
                assert "Nothing was done" in msg["error"]["message"]
            assert await release(watcher, "first") == 1
            replies = []
            async for line in stream.aiter_lines():
                if line.startswith("data:") and (m := json.loads(line[5:])).get("id") == 7:
                    replies.append(m)
        # Exactly one reply under id 7 on its stream, the first call's, and its thread holds one turn.
        assert [m["result"]["structuredContent"]["text"] for m in replies] == ["echo 1: !hold first first"]
        assert [t["prompt"] for t in await _turns(server, "first")] == ["!hold first first"]
        assert "second" not in await threads_of(server)  # the refused call ran nowhere
        # Answered, the id is free again in its session.
        async with hc.stream("POST", server.url, json=_legacy_call(7, "respond", {"prompt": "reuse", "thread_id": "first"}),
                             headers=session) as stream:
            reply = await events(stream.aiter_lines())
        assert reply["id"] == 7 and reply["result"]["structuredContent"]["text"] == "echo 2: reuse", reply


async def test_ids_in_flight_are_per_session_and_a_2026_client_has_none_to_collide_with():
    async with http_wisp() as server, client(server) as watcher, httpx2.AsyncClient(timeout=30) as hc:
        a, b = await legacy_session(hc, server), await legacy_session(hc, server)
        async with anyio.create_task_group() as tg:
            results: dict[str, dict] = {}

            async def run(name: str, headers: dict, body: dict) -> None:
                async with hc.stream("POST", server.url, json=body, headers=headers) as stream:
                    results[name] = await _reply(stream)

            tg.start_soon(run, "a", a, _legacy_call(3, "respond", {"prompt": "!hold a a", "thread_id": "a"}))
            await held(watcher, "a")
            # The same id in another session, and twice at once from 2026-07-28 clients: all served.
            tg.start_soon(run, "b", b, _legacy_call(3, "respond", {"prompt": "b", "thread_id": "b"}))
            tg.start_soon(run, "m1", server.headers(**MODERN_HEADERS), modern_call("respond", {"prompt": "m1", "thread_id": "m1"}, id=3))
            tg.start_soon(run, "m2", server.headers(**MODERN_HEADERS), modern_call("respond", {"prompt": "m2", "thread_id": "m2"}, id=3))
            await wait_for(lambda: {"b", "m1", "m2"} <= set(results), 30, f"served only {sorted(results)}")
            assert await release(watcher, "a") == 1  # in flight till all three were served
        for name in ("a", "b", "m1", "m2"):
            assert results[name]["id"] == 3 and not results[name]["result"]["isError"], (name, results[name])
        assert await threads_of(server) == {"a": 1, "b": 1, "m1": 1, "m2": 1}


async def test_an_id_whose_connection_dropped_is_free_again_once_its_call_is_cancelled():
    async with http_wisp() as server, client(server) as watcher, httpx2.AsyncClient(timeout=30) as hc:
        session = await legacy_session(hc, server)
        dropped = _legacy_call(9, "respond", {"prompt": "!hold never dropped", "thread_id": "d"})
        async with hc.stream("POST", server.url, json=dropped, headers=session) as stream:
            assert stream.status_code == 200
            await held(watcher, "never")  # running, and only the cancel of the drop can end it
        # The id is held until wisp has handed the SDK the cancel for it; then it is served.
        with anyio.fail_after(10):
            while True:
                async with hc.stream("POST", server.url, json=_legacy_call(9, "respond", {"prompt": "after", "thread_id": "d"}),
                                     headers=session) as stream:
                    if stream.status_code == 200:
                        reply = await events(stream.aiter_lines())
                        break
                    _refused(httpx2.Response(stream.status_code, headers=stream.headers, content=await stream.aread()), 9, "already in flight")
                await anyio.sleep(0.05)  # the poll's interval
        assert reply["id"] == 9 and reply["result"]["structuredContent"]["text"] == "echo 1: after", reply
        assert [t["prompt"] for t in await _turns(server, "d")] == ["after"]  # the dropped call kept no turn


INVALID_IDS = {
    "1.5": b"1.5", "2.0": b"2.0", "1e3": b"1e3", "-0.0": b"-0.0", "true": b"true", "false": b"false", "null": b"null",
    "an object": b'{"n":1}', "an array": b"[7]", "2^63": b"9223372036854775808", "-2^63-1": b"-9223372036854775809",
    "40 digits": b"9" * 40, "an unpaired surrogate": b'"\\udc00x"',
}


@pytest.mark.parametrize("mode", MODES)
async def test_an_id_json_rpc_does_not_allow_is_an_error_never_202_and_silence(mode):
    async with http_wisp() as server, httpx2.AsyncClient(timeout=30) as hc:
        session = await legacy_session(hc, server) if mode == "legacy" else None
        for i, (what, spelling) in enumerate(INVALID_IDS.items()):
            body = b'{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":"respond","arguments":{"prompt":"p","thread_id":"bad%d"}%s}}' % (
                spelling, i, b',"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}'
                if mode != "legacy" else b"")
            _refused(await _post_raw(hc, server, mode, body, session), None, "string or an integer", "Nothing was done")
        assert await threads_of(server) == {}  # no call ran


EDGE_IDS = [2**63 - 1, -(2**63), 0, "", "🙂", "x" * 100_000, "05"]


@pytest.mark.parametrize("mode", MODES)
async def test_ids_at_the_edges_of_what_is_allowed_are_answered_under_themselves(mode):
    async with http_wisp() as server, httpx2.AsyncClient(timeout=30) as hc:
        session = await legacy_session(hc, server) if mode == "legacy" else None
        for rid in EDGE_IDS:
            call = _legacy_call(rid, "list_threads", {}) if mode == "legacy" else modern_call("list_threads", {}, id=rid)
            headers = session if mode == "legacy" else server.headers(**{**MODERN_HEADERS, "Mcp-Name": "list_threads"})
            async with hc.stream("POST", server.url, json=call, headers=headers) as stream:
                assert stream.status_code == 200, (rid, await stream.aread())
                reply = await _reply(stream)
            assert reply["id"] == rid and "result" in reply, reply


REFUSED_BODIES = {
    "a batch of one request": (b'[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"respond","arguments":{"prompt":"p","thread_id":"batched"}}}]', "batch"),
    "an empty batch": (b" [ ] ", "batch"),
    "a batch of a notification": (b'[{"jsonrpc":"2.0","method":"notifications/initialized"}]', "batch"),
    "the id twice": (b'{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/call","params":{"name":"respond","arguments":{"prompt":"p","thread_id":"twice"}}}', '"id" more than once'),
    "method twice": (b'{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call","params":{"name":"respond","arguments":{"prompt":"p","thread_id":"twice"}}}', '"method" more than once'),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("what", REFUSED_BODIES)
async def test_a_batch_or_an_envelope_member_twice_is_refused_whole(mode, what):
    body, says = REFUSED_BODIES[what]
    async with http_wisp() as server, httpx2.AsyncClient(timeout=30) as hc:
        session = await legacy_session(hc, server) if mode == "legacy" else None
        _refused(await _post_raw(hc, server, mode, body, session), None, says)
        assert await threads_of(server) == {}


@pytest.mark.parametrize("mode", MODES)
async def test_what_is_no_request_passes_the_door_and_unreadable_json_is_a_parse_error(mode):
    async with http_wisp() as server, httpx2.AsyncClient(timeout=30) as hc:
        session = await legacy_session(hc, server) if mode == "legacy" else None
        # A notification owes no reply: 202 as before.
        r = await _post_raw(hc, server, mode, b'{"jsonrpc":"2.0","method":"notifications/initialized"}', session)
        assert r.status_code == 202, r.text
        # An id of 5,000 digits is past what either JSON parser takes: the SDK's parse error.
        r = await _post_raw(hc, server, mode, b'{"jsonrpc":"2.0","id":%s,"method":"tools/list"}' % (b"9" * 5000), session)
        assert r.status_code == 400 and r.json()["error"]["code"] == -32700 and r.json()["id"] is None, r.text
        # The session and the server are as they were.
        async with client(server) as c:
            assert ok(await c.call_tool("respond", {"prompt": "after", "thread_id": "after"}))["turns"] == 1
