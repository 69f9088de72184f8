"""JSON-RPC envelopes and request ids over stdio, as a hostile client writes them: raw lines
to `python -m wisp_shim` with the echo backend, judged by transport/request_ids.py as over HTTP
(test_http_ids.py). test_hostile.py has the older shapes (1.5, true, null, ...) in its table."""

from __future__ import annotations

import json

import pytest

from harness import jsonrpc
from harness.raw import RawChannel


@pytest.fixture(scope="module")
def raw():
    ch = RawChannel()
    yield ch
    ch.close()


def _turn_prompts(raw: RawChannel, thread_id: str) -> list[str]:
    read = raw.call("read_thread", {"thread_id": thread_id})["result"]["structuredContent"]
    return [t["prompt"] for t in read["items"]]


def test_an_id_reused_in_flight_is_refused_and_the_first_keeps_one_reply_and_one_turn(raw):
    call = lambda rid, prompt, tid: jsonrpc("tools/call", {"name": "respond", "arguments": {"prompt": prompt, "thread_id": tid}}, id=rid)  # noqa: E731
    raw.send(call(4242, "!hold first first", "s-first") + call(" 4242", "second", "s-second"))
    refused = raw.wait(" 4242")
    assert refused["error"]["code"] == -32600 and "already in flight" in refused["error"]["message"], refused
    raw.held("first")  # in flight until released, whatever the machine's speed
    assert raw.release("first") == 1
    first = raw.wait(4242)
    assert first["result"]["structuredContent"]["text"] == "echo 1: !hold first first", first
    assert raw.quiet() == []  # no second reply under either spelling
    assert _turn_prompts(raw, "s-first") == ["!hold first first"]
    listed = raw.call("list_threads", {})["result"]["structuredContent"]["threads"]
    assert "s-second" not in {t["thread_id"] for t in listed}
    # Answered, the id may be used again.
    again = raw.call("respond", {"prompt": "reuse", "thread_id": "s-first"}, rid=4242)
    assert again["result"]["structuredContent"]["text"] == "echo 2: reuse"


NEW_INVALID_IDS = {
    "2^63": b"9223372036854775808", "-2^63-1": b"-9223372036854775809", "40 digits": b"9" * 40,
    "false": b"false", "-0.0": b"-0.0", "an unpaired surrogate": b'"a\\ud800"',
}


@pytest.mark.parametrize("what", NEW_INVALID_IDS)
def test_an_id_past_int64_or_not_text_is_invalid_with_id_null(raw, what):
    raw.send(b'{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":"respond","arguments":{"prompt":"p","thread_id":"s-bad"}}}\n'
             % NEW_INVALID_IDS[what])
    msg = raw.wait(None, timeout=10)
    assert msg["error"]["code"] == -32600 and "string or an integer" in msg["error"]["message"], msg
    assert raw.quiet() == []


@pytest.mark.parametrize("line, says", [
    (b'[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]\n', "batch"),
    (b'{"jsonrpc":"2.0","id":5,"id":6,"method":"tools/list"}\n', '"id" more than once'),
    (b'{"jsonrpc":"2.0","method":"notifications/initialized","method":"tools/list","id":8}\n', '"method" more than once'),
], ids=["a batch", "the id twice", "method twice"])
def test_a_batch_or_an_envelope_member_twice_is_refused_with_id_null(raw, line, says):
    raw.send(line)
    msg = raw.wait(None, timeout=10)
    assert msg["error"]["code"] == -32600 and says in msg["error"]["message"], msg
    assert raw.quiet() == []


@pytest.mark.parametrize("rid", [2**63 - 1, -(2**63), "", "🙂", "x" * 10_000])
def test_ids_at_the_edges_of_what_is_allowed_are_answered_under_themselves(raw, rid):
    raw.send((json.dumps({"jsonrpc": "2.0", "id": rid, "method": "ping"}) + "\n").encode())
    assert raw.wait(rid)["result"] == {}
