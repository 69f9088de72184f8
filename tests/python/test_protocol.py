"""The frame codec and message types, on their own (no core needed)."""

from __future__ import annotations

import json
import struct

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wisp_shim.core import protocol


def test_respond_omits_absent_optionals():
    payload = protocol.encode_payload(protocol.Respond(id=7, prompt="hi"))
    assert json.loads(payload) == {"op": "respond", "id": 7, "prompt": "hi"}


def test_respond_carries_every_field_with_swift_names():
    msg = protocol.Respond(
        id=3, prompt="p", thread_id="t-1", instructions="be brief", tools=["read_file"],
        options=protocol.RespondOptions(temperature=0.5, max_output_tokens=64, timeout_s=300.0, deadline=1234.5), progress=True,
    )
    assert json.loads(protocol.encode_payload(msg)) == {
        "op": "respond", "id": 3, "prompt": "p", "thread_id": "t-1", "instructions": "be brief",
        "tools": ["read_file"], "options": {"temperature": 0.5, "max_output_tokens": 64, "timeout_s": 300.0, "deadline": 1234.5},
        "progress": True,
    }


@pytest.mark.parametrize(
    "msg, expected",
    [
        (protocol.CloseThread(id=2, thread_id="x"), {"op": "close_thread", "id": 2, "thread_id": "x"}),
        (protocol.Cancel(id=4, request=3), {"op": "cancel", "id": 4, "request": 3}),
        (protocol.Status(id=5), {"op": "status", "id": 5}),
    ],
)
def test_other_requests(msg, expected):
    assert json.loads(protocol.encode_payload(msg)) == expected


def test_frame_is_big_endian_length_then_payload():
    data = protocol.encode(protocol.Status(id=1))
    (n,) = struct.unpack(">I", data[:4])
    assert n == len(data) - 4 and json.loads(data[4:]) == {"op": "status", "id": 1}


def test_frame_refuses_over_limit_payload():
    with pytest.raises(ValueError, match="limit"):
        protocol.frame(b"x" * (protocol.MAX_FRAME_BYTES + 1))


def test_decode_core_messages():
    ready = protocol.decode_message(b'{"id":0,"event":"ready","protocol":2,"backend":"echo","model":"echo","pid":42,'
                                    b'"version":"1.2.3"}')
    assert ready == protocol.Ready(id=0, protocol=2, backend="echo", model="echo", pid=42, version="1.2.3")
    prog = protocol.decode_message(b'{"id":3,"event":"progress","text":"ec","tokens":1}')
    assert prog == protocol.Progress(id=3, text="ec", tokens=1)
    evicted = protocol.decode_message(b'{"id":0,"event":"evicted","thread_id":"old"}')
    assert evicted == protocol.Evicted(id=0, thread_id="old")
    ok = protocol.decode_message(
        b'{"id":3,"event":"reply","ok":true,"result":{"op":"respond","thread_id":"a","created":true,"text":"echo 1: x",'
        b'"condensed":false,"turns":1,"dropped":0}}'
    )
    assert isinstance(ok, protocol.Reply) and ok.ok
    assert ok.result == protocol.RespondResult(thread_id="a", created=True, text="echo 1: x", condensed=False, turns=1, dropped=0)
    err = protocol.decode_message(b'{"id":4,"event":"reply","ok":false,"error":{"code":"busy","message":"queue full"}}')
    assert isinstance(err, protocol.Reply) and not err.ok and err.error == protocol.ErrorBody(code="busy", message="queue full")
    assert err.result is None
    status = protocol.decode_message(
        b'{"id":5,"event":"reply","ok":true,"result":{"op":"status","backend":"echo","model":"echo","available":true,'
        b'"context_size":4096,"max_threads":32,"max_queue":64,"threads":[{"thread_id":"a","turns":2,"pending":0}]}}'
    )
    assert isinstance(status, protocol.Reply) and isinstance(status.result, protocol.StatusResult)
    assert status.result.threads == [protocol.ThreadInfo(thread_id="a", turns=2, pending=0)] and status.result.reason is None
    for op, result_type in (("close_thread", protocol.CloseThreadResult), ("cancel", protocol.CancelResult), ("ping", protocol.PingResult)):
        fields = {"close_thread": b',"thread_id":"a","closed":true', "cancel": b',"cancelled":false', "ping": b""}[op]
        reply = protocol.decode_message(b'{"id":6,"event":"reply","ok":true,"result":{"op":"%s"%s}}' % (op.encode(), fields))
        assert isinstance(reply, protocol.Reply) and type(reply.result) is result_type, op


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b"[1,2]",
        b'{"event":"ready"}',  # no id
        b'{"id":1}',  # no event
        b'{"id":1,"ok":true,"result":{"op":"ping"}}',  # a reply without its tag
        b'{"id":1,"event":"mystery"}',
        b'{"id":1,"event":"reply","ok":true}',  # ok without result
        b'{"id":1,"event":"reply","ok":false}',  # failure without error
        b'{"id":1,"event":"reply","ok":true,"result":{}}',  # a result without its op
        b'{"id":1,"event":"reply","ok":true,"result":{"op":"mystery"}}',
        b'{"id":"1","event":"reply","ok":true,"result":{"op":"ping"}}',  # id of the wrong type
        b'{"id":0,"event":"ready","protocol":2}',  # ready without its fields
        b'{"id":1,"event":"progress","text":5,"tokens":1}',
    ],
)
def test_malformed_messages_raise(payload):
    with pytest.raises(protocol.ProtocolError):
        protocol.decode_message(payload)


def test_malformed_result_raises_naming_the_result():
    with pytest.raises(protocol.ProtocolError, match="RespondResult"):
        protocol.decode_message(b'{"id":1,"event":"reply","ok":true,"result":{"op":"respond","thread_id":"a"}}')


def test_over_limit_frame_header_raises():
    dec = protocol.FrameDecoder(max_bytes=10)
    with pytest.raises(protocol.ProtocolError, match="limit"):
        dec.feed(struct.pack(">I", 11))


def test_truncated_stream_raises_at_finish():
    dec = protocol.FrameDecoder()
    assert dec.feed(protocol.encode(protocol.Status(id=1))[:-1]) == []
    with pytest.raises(protocol.ProtocolError, match="inside a frame"):
        dec.finish()
    dec2 = protocol.FrameDecoder()
    dec2.feed(b"\x00\x00")
    with pytest.raises(protocol.ProtocolError):
        dec2.finish()


def test_empty_stream_finishes_cleanly():
    dec = protocol.FrameDecoder()
    assert dec.feed(b"") == []
    dec.finish()


def _core_message(draw_id, text):
    return msgspec.json.encode({"id": draw_id, "event": "progress", "text": text, "tokens": draw_id + 1})


messages = st.lists(
    st.one_of(
        st.builds(lambda i, t: msgspec.json.encode({"id": i, "event": "progress", "text": t, "tokens": i + 1}),
                  st.integers(1, 2**31), st.text(max_size=300)),
        st.builds(lambda i, c, m: msgspec.json.encode({"id": i, "event": "reply", "ok": False, "error": {"code": c, "message": m}}),
                  st.integers(1, 2**31), st.sampled_from(sorted(protocol.ERROR_CODES)), st.text(max_size=100)),
        st.builds(lambda t, n: msgspec.json.encode({"id": 1, "event": "reply", "ok": True, "result": {
            "op": "respond", "thread_id": t, "created": n % 2 == 0, "text": "echo", "condensed": False, "turns": n, "dropped": 0}}),
            st.from_regex(r"[A-Za-z0-9._-]{1,64}", fullmatch=True), st.integers(0, 1000)),
        st.just(b""),  # an empty payload is a valid frame, even if not a valid message
    ),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(payloads=messages, data=st.data())
def test_any_split_decodes_to_the_same_frames(payloads, data):
    stream = b"".join(protocol.frame(x) for x in payloads)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20)))
    dec = protocol.FrameDecoder()
    got: list[bytes] = []
    prev = 0
    for cut in [*cuts, len(stream)]:
        got += dec.feed(stream[prev:cut])
        prev = cut
    dec.finish()
    assert got == payloads
    # And each decodes the same whichever way the bytes arrived.
    assert [protocol.decode_message(x) for x in got if x] == [protocol.decode_message(x) for x in payloads if x]


@settings(max_examples=100, deadline=None)
@given(payloads=messages, extra=st.binary(min_size=1, max_size=3))
def test_a_stream_cut_inside_a_frame_is_an_error(payloads, extra):
    stream = b"".join(protocol.frame(x) for x in payloads) + protocol.frame(b"{}" * 4)[: len(extra)]
    dec = protocol.FrameDecoder()
    dec.feed(stream)
    with pytest.raises(protocol.ProtocolError):
        dec.finish()


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_garbage_never_escapes_as_another_exception(blob):
    try:
        protocol.decode_message(blob)
    except protocol.ProtocolError:
        pass


# --- request ids as the MCP layer reads them (transport/request_ids.py, transport/guard.py) -----------------


@pytest.mark.parametrize("line, invalid", [
    ('{"jsonrpc":"2.0","id":1.5,"method":"ping"}', True),
    ('{"jsonrpc":"2.0","id":2.0,"method":"ping"}', True),
    ('{"jsonrpc":"2.0","id":1e3,"method":"ping"}', True),
    ('{"jsonrpc":"2.0","id":true,"method":"ping"}', True),
    ('{"jsonrpc":"2.0","id":null,"method":"ping"}', True),
    ('{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}', True),
    ('{"jsonrpc":"2.0","id":[1],"method":"ping"}', True),
    ('{"jsonrpc":"2.0","id":-7,"method":"ping"}', False),
    ('{"jsonrpc":"2.0","id":"05","method":"ping"}', False),
    ('{"jsonrpc":"2.0","method":"notifications/initialized"}', False),  # a notification: no id member
    ('{"jsonrpc":"2.0","id":1.5,"result":{}}', False),  # a response: never answered
    ('{"jsonrpc":"2.0","id":9223372036854775807,"method":"ping"}', False),
    ('{"jsonrpc":"2.0","id":9223372036854775808,"method":"ping"}', True),
    ('{"jsonrpc":"2.0","id":-9223372036854775809,"method":"ping"}', True),
    ('{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}', True),  # an unpaired surrogate cannot be written back
    ('{"jsonrpc":"2.0","id":"\\ud83d\\ude00","method":"ping"}', False),  # a pair is one character
    ('{"jsonrpc":"2.0","id":"","method":"ping"}', False),
    ('not json', False),
])
def test_a_request_id_must_be_a_string_or_an_int64_integer(line, invalid):
    from wisp_shim.transport.request_ids import Refusal, Request, judge

    verdict = judge(line)
    assert isinstance(verdict, Refusal if invalid else (Request, type(None))), (line, verdict)
    if invalid:
        assert verdict.id is None and "string or an integer" in verdict.message


@pytest.mark.parametrize("body, says", [
    ('[{"jsonrpc":"2.0","id":1,"method":"ping"}]', "batch"),
    (' [] ', "batch"),
    ('{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}', '"id" more than once'),
    ('{"jsonrpc":"2.0","jsonrpc":"2.0","method":"notifications/initialized"}', '"jsonrpc" more than once'),
])
def test_a_batch_or_an_envelope_member_twice_is_refused(body, says):
    from wisp_shim.transport.request_ids import Refusal, judge

    verdict = judge(body)
    assert isinstance(verdict, Refusal) and says in verdict.message and verdict.id is None, verdict


@pytest.mark.parametrize("body", [
    "[1,", "not json", '{"id":1,"method":"x"} trailing', b"\xff\xfe", '{"id":' + "9" * 5000 + ',"method":"x"}',
    '{"a":' + "[" * 100_000 + "]" * 100_000 + ',"id":1.5,"method":"x"}',
])
def test_what_the_judge_cannot_read_is_left_to_the_sdks_parser(body):
    """Not JSON as Python reads it (broken, not UTF-8, a number past Python's digit limit,
    nesting past its stack): no verdict here, so the SDK answers its parse error."""
    from wisp_shim.transport.request_ids import judge

    assert judge(body) is None


def test_claims_on_ids_are_keyed_as_the_sdk_correlates_them():
    from wisp_shim.transport.request_ids import IdsInFlight

    ids = IdsInFlight()
    first = ids.claim(5)
    assert first is not None and [ids.claim(s) for s in ("05", "5", " 5", 5)] == [None] * 4
    assert ids.release("05", object()) is None  # another claim's token ends nothing
    assert ids.release("5", first) is first and len(ids) == 0 and ids.claim(5) is not None


def test_the_budget_keys_ids_as_the_sdk_correlates_them():
    from mcp.shared.dispatcher import coerce_request_id

    from wisp_shim.transport.sdk_seams import request_key

    for spelling in ("05", "5", " 5", 5):
        assert request_key(spelling) == coerce_request_id(spelling) == 5
    assert request_key("abc") == "abc"


@pytest.mark.parametrize("value", [
    {"prompt": "p", "files": ["sub/a.txt"] * 1000},
    {"prompt": "p", "schema": {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer", "minimum": 1}}}}},
    {"prompt": "p", "instructions": "be brief", "tools": ["read_file", "search_text"], "temperature": 0.5, "max_output_tokens": 64},
    [[[[]]], {}, None, True, 10**30, "é" * 50],
])
def test_the_in_flight_budget_weighs_a_request_about_as_its_json(value):
    """Every argument counts, nested ones included, at about its JSON length."""
    from wisp_shim.transport.guard import json_size

    written = len(json.dumps(value, ensure_ascii=False))
    assert 0.8 * written <= json_size(value) <= 1.5 * written + 16, (json_size(value), written)


def test_the_budget_walk_takes_any_depth_the_parser_took():
    from wisp_shim.transport.guard import json_size

    deep: list = []
    for _ in range(200_000):
        deep = [deep]
    assert json_size({"x": deep}) > 200_000


def test_what_a_handler_fetches_is_charged_to_its_request_until_it_ends():
    from wisp_shim.transport.guard import InFlight, _Budget, charge

    budget = _Budget()
    token = budget.add("r1", 100)
    charge(InFlight(budget, token), 5000)
    charge(object(), 7)  # another transport's request context: left alone
    assert budget.bytes == 5100
    assert budget.add("r1", 1) is None  # in flight: refused, nothing counted
    budget.release("r1", token)
    assert budget.bytes == 0 and not budget.ids and not budget.weights
    # A stale entry (the same id reused since) is not charged.
    fresh = budget.add("r1", 10)
    charge(InFlight(budget, token), 99)
    assert budget.bytes == 10 and budget.weights == {fresh: 10}
