"""Hostile MCP input: a table of bad inputs, each answered with a clear error (a
tool error with isError: true, or a JSON-RPC error where the spec says so), the server alive
afterwards, and another thread's state untouched.

Two channels, one long-lived wisp each (module scope, so the table stays fast):
- CLIENT cases go through the `mcp` SDK's own client over stdio;
- RAW cases are JSON-RPC lines written to the shim's stdin, for what the SDK client cannot
  send (bad JSON, invalid UTF-8, deep nesting, bad envelopes).
After every case a sentinel thread made at the start is called again: its echo N must be
exactly one more than before, so no case touched it. The table itself is printed by
`python tests/python/test_hostile.py` (the same rows, as documentation).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from harness import INITIALIZE, INITIALIZED, REPO, jsonrpc, shim_command, shim_env, text_of, wisp
from harness.raw import RawChannel, raw_roots_session

MB = 1024 * 1024
SENTINEL = "sentinel"


# --- the channels -------------------------------------------------------------------------


class ClientChannel:
    """An SDK client connected to one wisp, driven from a loop on its own thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.client = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()
        if not self._ready.wait(60) or self.client is None:
            raise RuntimeError(f"wisp did not start: {self.error!r}")

    def _main(self) -> None:
        async def body() -> None:
            self._stop = asyncio.Event()
            try:
                async with wisp() as client:
                    self.client = client
                    self._ready.set()
                    await self._stop.wait()
            except BaseException as exc:  # shown by the test that needed the client
                self.error = exc
                self._ready.set()

        self.loop.run_until_complete(body())

    def run(self, fn: Callable[[Any], Any], timeout: float = 60) -> Any:
        async def call():
            return await fn(self.client)

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout)

    def respond(self, args: dict) -> Any:
        return self.run(lambda c: c.call_tool("respond", args))

    def close(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(30)


class Sentinel:
    """A thread whose echo N must advance by exactly one per check."""

    def __init__(self, respond: Callable[[dict], dict]) -> None:
        self.respond = respond
        self.n = 0
        self.check("made before the hostile cases")

    def check(self, after: str) -> None:
        s = self.respond({"prompt": "still here?", "thread_id": SENTINEL})
        self.n += 1
        assert s == {"created": self.n == 1, "text": f"echo {self.n}: still here?"}, f"sentinel thread disturbed after {after}: {s}"


@pytest.fixture(scope="module")
def client():
    ch = ClientChannel()

    def respond(args):
        r = ch.respond(args)
        assert not r.is_error, text_of(r)
        return {"created": r.structured_content["created"], "text": r.structured_content["text"]}

    ch.sentinel = Sentinel(respond)  # type: ignore[attr-defined]
    yield ch
    ch.close()


@pytest.fixture(scope="module")
def raw():
    ch = RawChannel()

    def respond(args):
        r = ch.call("respond", args)
        assert "result" in r and not r["result"].get("isError"), r
        return {"created": r["result"]["structuredContent"]["created"], "text": r["result"]["structuredContent"]["text"]}

    ch.sentinel = Sentinel(respond)  # type: ignore[attr-defined]
    yield ch
    ch.close()


# --- expectations -------------------------------------------------------------------------


def tool_error(code: str, *words: str, max_len: int = 2000):
    """A tool error `code: …` whose message names `words` and stays short."""

    def check(r) -> str:
        assert r.is_error, f"expected a tool error, got {r.structured_content}"
        t = text_of(r)
        assert t.startswith(f"{code}:"), t[:300]
        for w in words:
            assert w in t, (w, t[:300])
        assert len(t) <= max_len, f"message of {len(t)} chars"
        return f"tool error `{code}`: {t[:120]}"

    return check


def served(expected_text: str | None = None, created: bool | None = True):
    def check(r) -> str:
        assert not r.is_error, text_of(r)[:300]
        s = r.structured_content
        if expected_text is not None:
            assert s["text"] == expected_text, (s["text"][:100], expected_text[:100])
        if created is not None:
            assert s["created"] is created
        return f"served: {s['text'][:60]!r}"

    return check


def rpc_error(code: int, *words: str, same_id: bool = True, max_len: int = 2000):
    def check(msg: dict, rid: Any) -> str:
        assert "error" in msg, msg
        assert msg["error"]["code"] == code, msg
        for w in words:
            assert w in msg["error"]["message"], (w, msg)
        if same_id:
            assert msg["id"] == rid, msg
        assert len(json.dumps(msg)) <= max_len + 200
        return f"JSON-RPC error {code}: {msg['error']['message'][:100]}"

    check.same_id = same_id  # type: ignore[attr-defined]
    return check


def raw_tool_error(code: str, *words: str):
    def check(msg: dict, rid: Any) -> str:
        assert msg["id"] == rid and msg["result"]["isError"] is True, msg
        t = msg["result"]["content"][0]["text"]
        assert t.startswith(f"{code}:") and all(w in t for w in words), t[:300]
        return f"tool error `{code}`: {t[:120]}"

    return check


def raw_served(text: str):
    def check(msg: dict, rid: Any) -> str:
        assert msg["id"] == rid and not msg["result"].get("isError"), msg
        assert msg["result"]["structuredContent"]["text"] == text, msg["result"]["structuredContent"]["text"][:200]
        return f"served: {text[:60]!r}"

    return check


# --- the table: SDK client ----------------------------------------------------------------


@dataclass
class ClientCase:
    name: str
    tool: str
    args: Any
    expect: Callable


def _many_unknown_args(n: int) -> dict:
    d = {f"x{i}": i for i in range(n)}
    d["prompt"] = "p"
    return d


CLIENT_CASES = [
    ClientCase("prompt is an object", "respond", {"prompt": {"text": "hi"}}, tool_error("invalid_argument", "prompt", "string")),
    ClientCase("prompt is a boolean", "respond", {"prompt": True}, tool_error("invalid_argument", "prompt")),
    ClientCase("prompt missing, other fields given", "respond", {"thread_id": "t-missing"}, tool_error("invalid_argument", "prompt", "required")),
    ClientCase("prompt empty", "respond", {"prompt": ""}, tool_error("invalid_argument", "prompt", "empty")),
    ClientCase("prompt of 20 MB", "respond", {"prompt": "x" * (20 * MB)}, tool_error("invalid_argument", "MiB", "shorter")),
    ClientCase("prompt of 8 MB (fits the pipe, not the context)", "respond", {"prompt": "y" * (8 * MB)}, tool_error("context_overflow", "Shorten the prompt")),
    ClientCase("prompt with NUL, ESC, BEL and other control characters", "respond", {"prompt": "a\x00b\x1b[31mc\x07d\x7f"}, served("echo 1: a\x00b\x1b[31mc\x07d\x7f")),
    ClientCase("prompt with CR LF, U+2028/U+2029 line separators", "respond", {"prompt": "l1\r\nl2\u2028l3\u2029l4\n"}, served("echo 1: l1\r\nl2\u2028l3\u2029l4\n")),
    ClientCase("prompt with emoji, RTL override, BOM, combining marks", "respond", {"prompt": "\U0001F600\u202Eevil\uFEFFe\u0301"}, served("echo 1: \U0001F600\u202Eevil\uFEFFe\u0301")),
    ClientCase("thread_id of 1 MB", "respond", {"prompt": "p", "thread_id": "a" * MB}, tool_error("invalid_argument", "thread_id", max_len=400)),
    ClientCase("thread_id with NUL and newline", "respond", {"prompt": "p", "thread_id": "ab\x00c\n"}, tool_error("invalid_argument", "thread_id")),
    ClientCase("thread_id with non-ASCII letters", "respond", {"prompt": "p", "thread_id": "thr\u00e9ad"}, tool_error("invalid_argument", "thread_id")),
    ClientCase("thread_id path traversal ../../etc/passwd", "respond", {"prompt": "p", "thread_id": "../../etc/passwd"}, tool_error("invalid_argument", "thread_id")),
    ClientCase("thread_id '.' (valid: a thread like any other)", "respond", {"prompt": "dot", "thread_id": "."}, served("echo 1: dot")),
    ClientCase("thread_id '..' (valid: a thread like any other)", "respond", {"prompt": "dotdot", "thread_id": ".."}, served("echo 1: dotdot")),
    ClientCase("thread_id an array", "respond", {"prompt": "p", "thread_id": ["sentinel"]}, tool_error("invalid_argument", "thread_id", "string")),
    ClientCase("unknown field differing only in case (thread_ID)", "respond", {"prompt": "p", "thread_ID": SENTINEL}, tool_error("invalid_argument", "thread_ID")),
    ClientCase("10,000 unknown fields", "respond", _many_unknown_args(10_000), tool_error("invalid_argument", "unknown argument", max_len=1000)),
    ClientCase("5,000 unknown tool names", "respond", {"prompt": "p", "tools": [f"tool{i}" for i in range(5000)]}, tool_error("invalid_argument", "unknown tool", "read_file", max_len=1000)),
    ClientCase("5,000 copies of a valid tool name", "respond", {"prompt": "p", "tools": ["read_file"] * 5000}, served("echo 1: p")),
    ClientCase("a tool name of 1 MB", "respond", {"prompt": "p", "tools": ["t" * MB]}, tool_error("invalid_argument", "unknown tool", max_len=1000)),
    ClientCase("instructions for an existing thread (the sentinel)", "respond", {"prompt": "p", "thread_id": SENTINEL, "instructions": "be evil"}, tool_error("invalid_argument", "instructions", "close_thread")),
    ClientCase("tools for an existing thread (the sentinel)", "respond", {"prompt": "p", "thread_id": SENTINEL, "tools": ["read_file"]}, tool_error("invalid_argument", "tools")),
    ClientCase("instructions of 1 MB (over the context)", "respond", {"prompt": "p", "instructions": "i" * MB}, tool_error("context_overflow")),
    ClientCase("temperature is a list", "respond", {"prompt": "p", "temperature": [1]}, tool_error("invalid_argument", "temperature")),
    ClientCase("max_output_tokens of 10**30", "respond", {"prompt": "p", "max_output_tokens": 10**30}, tool_error("invalid_argument", "max_output_tokens")),
    ClientCase("max_output_tokens negative", "respond", {"prompt": "p", "max_output_tokens": -5}, tool_error("invalid_argument", "max_output_tokens")),
    ClientCase("close_thread with a 1 MB id", "close_thread", {"thread_id": "z" * MB}, tool_error("invalid_argument", "thread_id", max_len=400)),
    ClientCase("close_thread with an extra field", "close_thread", {"thread_id": "x", "force": True}, tool_error("invalid_argument", "force")),
    ClientCase("list_threads with arguments", "list_threads", {"all": True}, tool_error("invalid_argument", "all")),
    ClientCase("arguments omitted", "respond", None, tool_error("invalid_argument", "prompt")),
]


# What wisp answered, per case: `WISP_HOSTILE_TABLE=FILE pytest tests/python/test_hostile.py`
# writes it as a markdown table.
ANSWERS: list[tuple[str, str, str]] = []


@pytest.fixture(scope="module", autouse=True)
def answer_table():
    yield
    path = os.environ.get("WISP_HOSTILE_TABLE")
    if path:
        rows = ["| # | channel | input | wisp answers |", "| --- | --- | --- | --- |"]
        for i, (ch, name, answer) in enumerate(ANSWERS, 1):
            cell = answer.replace("|", "\\|").replace("\n", " ")
            rows.append(f"| {i} | {ch} | {name} | {cell} |")
        Path(path).write_text("\n".join(rows) + "\n")


@pytest.mark.parametrize("case", CLIENT_CASES, ids=[c.name for c in CLIENT_CASES])
def test_client_case(client, case: ClientCase):
    r = client.run(lambda c: c.call_tool(case.tool, case.args))
    ANSWERS.append(("client", case.name, case.expect(r)))
    client.sentinel.check(case.name)


@pytest.mark.parametrize("name", ["respond2", "n" * 100_000, "../respond"], ids=["unknown tool", "unknown tool with a 100 KB name", "tool name with a path"])
def test_client_unknown_tool_is_a_json_rpc_error(client, name):
    from mcp import MCPError

    with pytest.raises(MCPError) as info:
        client.run(lambda c: c.call_tool(name, {"prompt": "p"}))
    assert "Unknown tool" in str(info.value) and len(str(info.value)) < 1000, str(info.value)[:300]
    ANSWERS.append(("client", f"unknown tool {name[:20]!r}" + (f" ({len(name)} chars)" if len(name) > 20 else ""), f"JSON-RPC error -32602: {str(info.value)[:100]}"))
    client.sentinel.check(f"unknown tool {name[:20]}")


# --- the table: raw JSON-RPC lines --------------------------------------------------------


def _call(rid: Any, arguments: Any, name: str = "respond") -> bytes:
    return jsonrpc("tools/call", {"name": name, "arguments": arguments}, id=rid)


def _raw_call_line(rid: int, arguments_json: bytes) -> bytes:
    return b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"respond","arguments":%s}}\n' % (rid, arguments_json)


@dataclass
class RawCase:
    name: str
    line: Callable[[int], bytes]
    expect: Callable | None  # None: no answer may come (a notification or a response)


RAW_CASES = [
    RawCase("not JSON at all", lambda i: b"hello wisp\n", rpc_error(-32700, "Parse error", same_id=False)),
    RawCase("truncated JSON with a readable id", lambda i: b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"resp\n' % i, rpc_error(-32700, "not valid JSON")),
    RawCase("invalid UTF-8 bytes inside a prompt", lambda i: _raw_call_line(i, b'{"prompt":"bad \xff\xfe\xc3 bytes"}'), raw_served("echo 1: bad \ufffd\ufffd\ufffd bytes")),
    RawCase("invalid UTF-8 bytes as the whole line", lambda i: b"\xff\xfe\xfd\x80\n", rpc_error(-32700, same_id=False)),
    RawCase("lone UTF-16 surrogate escape in a prompt", lambda i: _raw_call_line(i, b'{"prompt":"half \\ud800 a char"}'), rpc_error(-32700, "not valid JSON")),
    RawCase("raw control characters (unescaped) inside a JSON string", lambda i: _raw_call_line(i, b'{"prompt":"tab\tand\x01"}'), rpc_error(-32700, "not valid JSON")),
    RawCase("escaped NUL in a thread id", lambda i: _raw_call_line(i, b'{"prompt":"p","thread_id":"a\\u0000b"}'), raw_tool_error("invalid_argument", "thread_id")),
    RawCase("10,000 levels of nested arrays as params", lambda i: b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":%s}\n' % (i, b"[" * 10_000 + b"]" * 10_000), rpc_error(-32700, "not valid JSON")),
    RawCase("10,000 levels of nested objects in an argument", lambda i: _raw_call_line(i, b'{"prompt":"p","x":' + b'{"a":' * 10_000 + b"1" + b"}" * 10_000 + b"}"), rpc_error(-32700, "not valid JSON")),
    RawCase("100 levels of nesting in an unknown argument", lambda i: _raw_call_line(i, b'{"prompt":"p","deep":' + b"[" * 100 + b"]" * 100 + b"}"), raw_tool_error("invalid_argument", "deep")),
    RawCase("method is a number", lambda i: b'{"jsonrpc":"2.0","id":%d,"method":123}\n' % i, rpc_error(-32600, "Invalid Request")),
    RawCase("jsonrpc version 1.0", lambda i: b'{"jsonrpc":"1.0","id":%d,"method":"tools/list"}\n' % i, rpc_error(-32600, "Invalid Request")),
    RawCase("a batch (JSON array) of requests", lambda i: b'[{"jsonrpc":"2.0","id":%d,"method":"ping"}]\n' % i, rpc_error(-32600, "Invalid Request", same_id=False)),
    RawCase("unknown method", lambda i: jsonrpc("threads/delete_all", {}, id=i), rpc_error(-32601, "Method not found")),
    RawCase("tools/call with arguments a string", lambda i: _call(i, "prompt=hi"), rpc_error(-32602)),
    RawCase("tools/call without a tool name", lambda i: jsonrpc("tools/call", {"arguments": {"prompt": "p"}}, id=i), rpc_error(-32602)),
    RawCase("tools/call with a progress token that is an object", lambda i: jsonrpc("tools/call", {"name": "respond", "arguments": {"prompt": "p"}, "_meta": {"progressToken": {"a": 1}}}, id=i), rpc_error(-32602)),
    RawCase("max_output_tokens beyond 64 bits", lambda i: _raw_call_line(i, b'{"prompt":"p","max_output_tokens":123456789012345678901234567890}'), raw_tool_error("invalid_argument", "max_output_tokens")),
    RawCase("temperature NaN and Infinity literals", lambda i: _raw_call_line(i, b'{"prompt":"p","temperature":NaN}'), raw_tool_error("invalid_argument", "temperature")),
    # Huge numbers: valid JSON that no float holds. Each names the field and its range, never `internal`.
    RawCase("temperature as 1 followed by 400 zeros", lambda i: _raw_call_line(i, b'{"prompt":"p","temperature":1' + b"0" * 400 + b"}"), raw_tool_error("invalid_argument", "temperature", "from 0 to 2", "401 digits")),
    RawCase("temperature as 1 followed by 5,000 zeros", lambda i: _raw_call_line(i, b'{"prompt":"p","temperature":1' + b"0" * 5000 + b"}"), rpc_error(-32700, "number out of range")),  # the SDK's JSON parser stops there
    RawCase("temperature 1e400 (a float overflowing to infinity)", lambda i: _raw_call_line(i, b'{"prompt":"p","temperature":1e400}'), raw_tool_error("invalid_argument", "temperature", "from 0 to 2")),
    RawCase("temperature -Infinity", lambda i: _raw_call_line(i, b'{"prompt":"p","temperature":-Infinity}'), raw_tool_error("invalid_argument", "temperature", "from 0 to 2")),
    RawCase("temperature 2.5 (over the range)", lambda i: _raw_call_line(i, b'{"prompt":"p","temperature":2.5}'), raw_tool_error("invalid_argument", "temperature", "from 0 to 2", "2.5")),
    RawCase("temperature 1e-400 (underflows to 0: valid)", lambda i: _raw_call_line(i, b'{"prompt":"tiny","temperature":1e-400}'), raw_served("echo 1: tiny")),
    RawCase("max_output_tokens as 1 followed by 400 zeros", lambda i: _raw_call_line(i, b'{"prompt":"p","max_output_tokens":1' + b"0" * 400 + b"}"), raw_tool_error("invalid_argument", "max_output_tokens", "from 1 to 2147483647")),
    RawCase("max_output_tokens 1e400", lambda i: _raw_call_line(i, b'{"prompt":"p","max_output_tokens":1e400}'), raw_tool_error("invalid_argument", "max_output_tokens", "from 1 to 2147483647")),
    RawCase("max_output_tokens NaN", lambda i: _raw_call_line(i, b'{"prompt":"p","max_output_tokens":NaN}'), raw_tool_error("invalid_argument", "max_output_tokens", "from 1 to 2147483647")),
    RawCase("max_output_tokens 2**31 (one over)", lambda i: _raw_call_line(i, b'{"prompt":"p","max_output_tokens":2147483648}'), raw_tool_error("invalid_argument", "max_output_tokens", "from 1 to 2147483647")),
    RawCase("timeout_s as an argument (wisp has none) of 1e400", lambda i: _raw_call_line(i, b'{"prompt":"p","timeout_s":1e400}'), raw_tool_error("invalid_argument", "timeout_s")),
    RawCase("a string id of 1 MB", lambda i: jsonrpc("ping", None, id="i" * MB), None),  # answered with its id: checked below
    RawCase("a response to a request the server never made", lambda i: b'{"jsonrpc":"2.0","id":%d,"result":{}}\n' % i, None),
    RawCase("cancellation of a request that does not exist", lambda i: jsonrpc("notifications/cancelled", {"requestId": i}), None),
    RawCase("a blank line", lambda i: b"\n", None),
]


@pytest.mark.parametrize("case", RAW_CASES, ids=[c.name for c in RAW_CASES])
def test_raw_case(raw, case: RawCase):
    raw.next_id += 1
    rid = raw.next_id
    line = case.line(rid)
    raw.send(line)
    if case.name == "a string id of 1 MB":
        msg = raw.wait("i" * MB)
        assert msg["result"] == {}
        answer = "answered (ping result) under its 1 MB id"
    elif case.expect is None:
        assert raw.quiet() == []
        answer = "nothing (not a request: no reply is due), server carries on"
    else:
        # Errors for lines whose id cannot be read come back with id null.
        msg = raw.wait(rid if getattr(case.expect, "same_id", True) else None, timeout=20)
        answer = case.expect(msg, rid)
        if "error" in msg and msg["id"] is None:
            answer += " (id null)"
    ANSWERS.append(("raw", case.name, answer))
    raw.sentinel.check(case.name)


def test_raw_a_request_id_already_in_flight_is_refused(raw):
    # Two calls in flight under one id (or one the SDK reads as the same id, "7777"): the
    # second is refused, so one reply per id, and the first is served normally.
    raw.send(_call(7777, {"prompt": "!hold dup first", "thread_id": "dup-a"}) + _call(7777, {"prompt": "second", "thread_id": "dup-b"})
             + _call("7777", {"prompt": "third", "thread_id": "dup-c"}))
    refused = [raw.wait(7777), raw.wait("7777")]
    for m in refused:
        assert m["error"]["code"] == -32600 and "already in flight" in m["error"]["message"], m
    raw.held("dup")  # in flight until released, whatever the machine's speed
    assert raw.release("dup") == 1
    first = raw.wait(7777)
    assert first["result"]["structuredContent"]["text"] == "echo 1: !hold dup first", first
    assert raw.quiet() == []
    # Refused calls ran nowhere: neither thread exists.
    for tid in ("dup-b", "dup-c"):
        assert raw.call("respond", {"prompt": "p", "thread_id": tid})["result"]["structuredContent"]["created"] is True
    # Once answered, the id may be used again.
    assert raw.call("respond", {"prompt": "reuse", "thread_id": "dup-a"}, rid=7777)["result"]["structuredContent"]["text"] == "echo 2: reuse"
    ANSWERS.append(("raw", "a request whose id is already in flight (also as \"7777\" for 7777)", "JSON-RPC error -32600 under that id; the first call is served, once"))
    raw.sentinel.check("duplicate request ids")


INVALID_IDS = {"1.5": b"1.5", "2.0": b"2.0", "an object": b'{"n":1}', "an array": b"[1]", "true": b"true", "null": b"null", "1e3": b"1e3"}


@pytest.mark.parametrize("spelling", INVALID_IDS, ids=list(INVALID_IDS))
def test_raw_a_request_whose_id_is_not_a_string_or_integer_is_invalid(raw, spelling):
    raw.send(b'{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":"respond","arguments":{"prompt":"p","thread_id":"bad-id"}}}\n' % INVALID_IDS[spelling])
    msg = raw.wait(None, timeout=10)
    assert msg["id"] is None and msg["error"]["code"] == -32600 and "string or an integer" in msg["error"]["message"], msg
    assert raw.quiet() == []
    ANSWERS.append(("raw", f"a request whose id is {spelling}", f"JSON-RPC error -32600 (id null): {msg['error']['message'][:80]}"))
    raw.sentinel.check(f"id {spelling}")


def test_raw_a_notification_and_a_response_with_odd_ids_stay_unanswered(raw):
    raw.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n' + b'{"jsonrpc":"2.0","id":1.5,"result":{}}\n')
    assert raw.quiet() == []
    raw.sentinel.check("odd-id response")


def test_cancels_that_spell_the_id_loosely_free_the_budget():
    """notifications/cancelled with requestId "05" for request 5: the SDK cancels request 5
    (it coerces "05" to 5), so wisp's in-flight budget must free that slot too. 140 such calls
    are more than the 128 slots: a leak would leave the next call unanswered."""
    ch = RawChannel()
    try:
        for i in range(140):
            rid = 1000 + i
            ch.send(_call(rid, {"prompt": f"!hold c{i} call {i}", "thread_id": f"c{i % 8}"}))
            ch.held(f"c{i}")  # its handler has started: the call is parked in the core
            ch.send(jsonrpc("notifications/cancelled", {"requestId": f"0{rid}", "reason": "loose spelling"}))
        start = time.monotonic()
        msg = ch.call("respond", {"prompt": "prompt", "thread_id": "after"})
        took = time.monotonic() - start
        assert msg["result"]["structuredContent"]["text"] == "echo 1: prompt", msg
        assert took < 5.0, took
        # Cancelled requests get no reply.
        assert not any(1000 <= k < 1140 for k in ch.by_id if isinstance(k, int) and ch.by_id[k])
        ANSWERS.append(("raw", "140 calls, each cancelled with a requestId spelled \"0<id>\"", f"budget freed: the next call answered in {took:.2f} s"))
    finally:
        ch.close()


def _reused_ids_growth(n: int) -> tuple[float, float]:
    """RSS growth (MiB) of the shim and its core over `n` requests of 100 KB reusing the id
    of a call still in flight; each must be refused."""
    import psutil

    from harness import children

    ch = RawChannel("--context-size", "1000000")  # the held 100 KB call must fit
    try:
        ch.call("respond", {"prompt": "warm", "thread_id": "w"})
        shim = psutil.Process(ch.proc.pid)
        core = psutil.Process(children(ch.proc.pid)[0])
        big = "z" * 100_000
        ch.send(_call(42, {"prompt": f"!hold never {big}", "thread_id": "held"}))
        ch.held("never")  # id 42 stays in flight
        base = (shim.memory_info().rss, core.memory_info().rss)
        line = _call(42, {"prompt": big, "thread_id": "dup"})
        batch = 50
        for sent in range(0, n, batch):
            ch.send(line * batch)
            for _ in range(batch):
                m = ch.wait(42)
                assert m.get("error", {}).get("code") == -32600, str(m)[:500]
        grew = ((shim.memory_info().rss - base[0]) / 2**20, (core.memory_info().rss - base[1]) / 2**20)
        assert ch.call("respond", {"prompt": "alive"})["result"]["structuredContent"]["text"] == "echo 1: alive"
        return grew
    finally:
        ch.close()


def test_reused_ids_do_not_grow_the_shim():
    n = int(os.environ.get("WISP_REUSED_IDS", "2000"))
    shim, core = _reused_ids_growth(n)
    print(f"{n} reused ids of 100 KB: shim +{shim:.1f} MiB, core +{core:.1f} MiB")
    # Refused before the SDK starts a handler: nothing of them is kept (~710 MiB before).
    assert shim < 8 and core < 8, (shim, core)
    ANSWERS.append(("raw", f"{n} requests of 100 KB reusing an id in flight", f"each refused -32600; shim +{shim:.1f} MiB, core +{core:.1f} MiB"))


def test_a_call_before_initialize_is_refused_and_the_session_still_starts():
    from harness import read_until

    proc = subprocess.Popen(shim_command("--backend", "echo"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=shim_env(), cwd=REPO)
    lines: list[bytes] = []
    try:
        proc.stdin.write(_call(1, {"prompt": "too early"}))
        proc.stdin.flush()
        early = read_until(proc, 1, lines)
        assert early["error"]["code"] == -32602, early
        proc.stdin.write(INITIALIZE.replace(b'"id": 1', b'"id": 2') + INITIALIZED + _call(3, {"prompt": "now"}))
        proc.stdin.flush()
        assert "result" in read_until(proc, 2, lines)
        assert read_until(proc, 3, lines)["result"]["structuredContent"]["text"] == "echo 1: now"
        ANSWERS.append(("raw", "tools/call before initialize (no protocol era yet)", "JSON-RPC error -32602; initialize afterwards works and calls are served"))
    finally:
        proc.stdin.close()
        proc.wait(10)


# --- shutdown -----------------------------------------------------------------------------


def test_requests_after_shutdown_starts_get_no_torn_output_and_no_orphan():
    """SIGTERM while calls run, then more requests: wisp exits at once with status 0, stdout
    stays whole JSON-RPC lines, and any answer to those calls says wisp is shutting down."""
    from harness import children, wait_gone

    ch = RawChannel()
    try:
        ch.call("respond", {"prompt": "warm", "thread_id": "w"})
        core = children(ch.proc.pid)
        assert len(core) == 1
        ch.send(_call(501, {"prompt": "!hold never running"}))
        ch.held("never")
        start = time.monotonic()
        ch.proc.send_signal(signal.SIGTERM)
        try:
            for rid in range(502, 520):
                ch.send(_call(rid, {"prompt": f"after {rid}"}))
        except (BrokenPipeError, ValueError):
            pass  # the shim is already gone: that is allowed
        assert ch.proc.wait(5) == 0
        assert time.monotonic() - start < 3.0
        ch.reader.join(5)
        for msgs in ch.by_id.values():
            for m in msgs:
                if m.get("result", {}).get("isError"):
                    assert "shutting down" in m["result"]["content"][0]["text"], m
        assert wait_gone(core[0], 3), "wisp-core outlived the shim"
        ANSWERS.append(("raw", "SIGTERM with a call running, then 18 more requests", "exits 0 within 3 s; answers (if any) are `shutting_down` tool errors; stdout stays whole JSON-RPC lines; no orphaned core"))
    finally:
        if ch.proc.poll() is None:
            ch.proc.kill()


def table() -> str:
    rows = [("client", c.name) for c in CLIENT_CASES] + [("raw", c.name) for c in RAW_CASES]
    return "\n".join(f"{i:2d}. [{ch}] {name}" for i, (ch, name) in enumerate(rows, 1))


if __name__ == "__main__":
    print(table())


# --- the client's roots -------------------------------------------------------------------


async def _with_roots(uris: list[str], *calls: dict) -> list[tuple[Any, float]]:
    """Calls made by a client that offers `uris` as its roots; each result with its time."""
    from mcp import Client, StdioServerParameters, stdio_client
    from mcp.types import ListRootsResult, Root

    async def list_roots(context) -> ListRootsResult:
        return ListRootsResult(roots=[Root.model_construct(uri=u) for u in uris])

    argv = shim_command("--backend", "echo")
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=shim_env(), cwd=str(REPO))
    out = []
    async with Client(stdio_client(params), mode="legacy", list_roots_callback=list_roots) as client:
        await client.call_tool("respond", {"prompt": "warm"})
        for args in calls:
            start = time.monotonic()
            r = await client.call_tool("respond", args)
            out.append((r, time.monotonic() - start))
    return out


# The SDK client warns that a root it was handed unvalidated (model_construct) is not a FileUrl: that is the point.
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("uri, why", [
    ("file:///tmp/x%00y", "a NUL after decoding"),
    ("file://tmp/relative", "a host, not an absolute path"),
    ("file:relative/dir", "a relative path"),
    ("file:///tmp/%ff%fe", "percent-escapes that are not UTF-8"),
], ids=["NUL", "host", "relative", "not UTF-8"])
async def test_a_client_root_that_is_not_an_absolute_path_is_refused(uri, why):
    [(r, _)] = await _with_roots([f"file://{REPO}", uri], {"prompt": "p", "thread_id": "t", "tools": ["read_file"]})
    check = tool_error("invalid_argument", "root", "absolute local path")
    ANSWERS.append(("client", f"a client root with {why} ({uri})", check(r)))


def _raw_roots_call(uris: list[str]) -> tuple[dict, float]:
    """A raw client that offers roots: calls respond with tools, answers the shim's roots/list
    with `uris`, and returns the call's reply and the time from that answer to the reply."""
    reply, took, _ = raw_roots_session(uris)
    return reply, took


def test_too_many_client_roots_are_refused_at_once():
    reply, took = _raw_roots_call([f"file:///nonexistent/wisp-root-{i}" for i in range(20_000)])
    raw_tool_error("invalid_argument", "more than 256 roots")(reply, 2)
    print(f"20,000 roots refused {took * 1000:.0f} ms after the client's answer")
    assert took < 0.45, took  # 0.9 s on a quiet machine when the SDK validated every root's URL, twice
    # The limit counts what the client offered: duplicates count too.
    reply, _ = _raw_roots_call([f"file://{REPO}"] * 257)
    raw_tool_error("invalid_argument", "more than 256 roots")(reply, 2)
    reply, _ = _raw_roots_call([f"file://{REPO}"] * 256)
    assert reply["result"]["structuredContent"]["text"] == "echo 1: p", reply
    ANSWERS.append(("raw", "a client offering 20,000 roots", f"tool error `invalid_argument` {took * 1000:.0f} ms after its answer: over the limit of 256"))
